"""One user turn's record: `UserTurn` (its audio's place in the stream, its decodes, what was sent
of its transcript) and `TurnClock` (the wall-clock marks its latency metrics are read from)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import numpy as np

from voice_app.audio.pcm import ASR_RATE
from voice_app.core.local_agreement import LocalAgreement

# a turn's final transcript is the decode of [turn start, last speech + FINAL_TAIL_SAMPLES], then
# CLOSING_PAD_SAMPLES of digital silence, however the client chunked its audio: 200 ms of tail in
# all (tiny.en heard "France" as "friends" with 100 or 150 ms), of which only 50 ms are waited for
# (scripts/eval_asr.py --tail-ms 50 --pad-ms 150: the same WER as 100 + 100)
FINAL_TAIL_SAMPLES = ASR_RATE // 20
CLOSING_PAD_SAMPLES = ASR_RATE // 5 - FINAL_TAIL_SAMPLES


@dataclass
class TurnClock:
    """Wall-clock marks of one user turn (time.monotonic seconds) for the latency metrics."""

    speech_stopped_at: float | None = None
    transcript_at: float | None = None
    first_draft_at: float | None = None
    first_audio_at: float | None = None
    speech_started_at: float | None = None  # of the speech that barged in
    cleared_at: float | None = None
    done_at: float | None = None  # the reply's response.done
    speech_ms: int | None = None  # how long the turn's speech lasted (VAD), when turn detection ended it

    def ms(self, start: float | None, end: float | None) -> float | None:
        return None if start is None or end is None else round((end - start) * 1000.0, 1)


@dataclass
class UserTurn:
    """The utterance being spoken now (between speech_started and speech_stopped)."""

    item_id: str
    start_sample: int  # stream index where its audio begins (prefix padding included)
    started_at: float  # time.monotonic() when speech was detected
    agreement: LocalAgreement = field(default_factory=LocalAgreement)
    stable_sent: str = ""
    transcriptions: list[tuple[int, asyncio.Task]] = field(default_factory=list)  # (audio end, decode)
    closing_decodes: set[asyncio.Task] = field(default_factory=set)  # made at pauses, for the transcript
    barged_in: bool = False
    speech_ms: int = 0  # its speech so far, up to the last speech window
    # silence Whisper gets before the turn's audio: the part of the prefix padding the stream
    # did not hold (speech in its first 300 ms, or right after a clear or commit)
    lead_pad: int = 0
    context: str = ""  # the assistant's words before it, as said when it began: Whisper's prompt

    def padded(self, audio: np.ndarray, closing: bool = False) -> np.ndarray:
        """What Whisper gets: the lead pad, the audio and, for a closing decode, its silent pad."""
        if not self.lead_pad and not closing:
            return audio  # a partial's audio as it is: no copy
        tail = np.zeros(CLOSING_PAD_SAMPLES if closing else 0, dtype=np.float32)
        return np.concatenate([np.zeros(self.lead_pad, dtype=np.float32), audio, tail])

    def remember(self, end: int, decode: asyncio.Task, closing: bool) -> None:
        """Keeps the last four decodes for reuse; `closing`: made at a pause, for the transcript."""
        self.transcriptions = self.transcriptions[-3:] + [(end, decode)]
        kept = {task for _, task in self.transcriptions}
        self.closing_decodes = (self.closing_decodes & kept) | ({decode} if closing else set())

    def transcription_of(self, end: int) -> asyncio.Task | None:
        """A decode of exactly the turn's audio up to `end` (not failed)."""
        same = [task for until, task in self.transcriptions if until == end
                and not (task.done() and (task.cancelled() or task.exception() is not None))]
        return same[-1] if same else None

    def transcription_covering(self, sample: int) -> asyncio.Task | None:
        """A decode that heard the turn up to `sample`: a finished one if any, else one running."""
        covering = [task for end, task in self.transcriptions if end >= sample and not task.cancelled()]
        finished = [task for task in covering if task.done() and task.exception() is None]
        return (finished or covering or [None])[-1]

    def drop_closing_decodes(self, transcript_end: int) -> None:
        """Speech went on past a pause: the decode made there for the turn's transcript cannot be
        it any more (the transcript's audio now ends at `transcript_end` or later). It is a beam
        search, the costliest job in the Whisper queue every session shares: cancelled, so no
        worker takes it if none has yet, and forgotten, so no later caller awaits it."""
        stale = {task for end, task in self.transcriptions if end < transcript_end and task in self.closing_decodes}
        if not stale:
            return
        for task in stale:
            task.cancel()
        self.closing_decodes -= stale
        self.transcriptions = [(end, task) for end, task in self.transcriptions if task not in stale]
