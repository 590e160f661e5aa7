"""Per-window speech probabilities -> speech start / pause / stop (server_vad and semantic_vad)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from voice_app.audio.pcm import ASR_RATE
from voice_app.core.models import VAD_WINDOW
from voice_app.core.options import COMPLETE_SILENCE_MS, TurnDetection

WINDOW_MS = VAD_WINDOW * 1000 // ASR_RATE


@dataclass(frozen=True)
class TurnEvent:
    kind: Literal["speech_started", "pause", "speech_stopped"]
    sample: int  # 16 kHz sample index in the stream where the event applies


class TurnDetector:
    """Speech starts when a window's probability reaches the threshold and ends after enough
    windows below (threshold - 0.15) (hysteresis against flicker): server_vad's
    `silence_duration_ms`; for semantic_vad, COMPLETE_SILENCE_MS once the words so far were
    judged finished (`words_sound_finished`), else the eagerness's limit. The rules are read
    live, so a session.update applies from the next window on."""

    def __init__(self, rules: TurnDetection):
        self.rules = rules
        self.in_speech = False
        self.windows_seen = 0
        self.speech_start_sample = 0
        self.last_speech_sample = 0
        self._silent_windows = 0
        self._pause_sent = False
        # semantic_vad's verdict on the words up to last_speech_sample: True (finished), False
        # (unfinished), None (not given yet, or the engine could not say)
        self.finished_words: bool | None = None
        self._verdict_given = False
        self._idle_ms = 0  # wall time the client sent nothing it should have: silence too

    def silence_ms(self) -> int:
        """How long the current turn has been silent (0 while speaking or outside a turn)."""
        return self._silent_windows * WINDOW_MS + self._idle_ms if self.in_speech else 0

    def words_sound_finished(self, finished: bool | None = True) -> TurnEvent | None:
        """The judge's verdict on the words up to last_speech_sample: finished ends the turn after
        the short silence, unfinished after the eagerness's limit, no verdict (the engine could not
        say) after server_vad's window; at once (the returned stop) when that has passed already."""
        if not self.in_speech:
            return None
        self.finished_words, self._verdict_given = finished, True
        return self.force_stop() if self.silence_ms() >= self._silence_needed() else None

    def _silence_needed(self) -> int:
        if not self.rules.semantic:
            return self.rules.silence_duration_ms
        if not self._verdict_given or self.finished_words is False:
            return self.rules.max_silence_ms()  # awaiting the verdict, or unfinished
        return COMPLETE_SILENCE_MS if self.finished_words else self.rules.silence_duration_ms

    def speech_ms(self) -> int:
        """How long the current turn's speech has lasted, up to its last speech window: the
        silence after a "mm-hmm" is no more of it (0 when not in speech)."""
        if not self.in_speech:
            return 0
        return (self.last_speech_sample - self.speech_start_sample) * 1000 // ASR_RATE

    def feed(self, prob: float) -> list[TurnEvent]:
        start = self.windows_seen * VAD_WINDOW
        self.windows_seen += 1
        self._idle_ms = 0  # audio came: its windows say what the idle time was
        if not self.in_speech:
            if prob >= self.rules.threshold:
                self.in_speech = True
                self.speech_start_sample = start
                self.last_speech_sample = start + VAD_WINDOW
                self._silent_windows = 0
                self._pause_sent = False
                self.finished_words, self._verdict_given = None, False
                return [TurnEvent("speech_started", start)]
            return []
        if prob >= max(self.rules.threshold - 0.15, 0.01):
            self.last_speech_sample = start + VAD_WINDOW
            self._silent_windows = 0
            self._pause_sent = False
            self.finished_words, self._verdict_given = None, False  # more words: the verdict was about fewer
            return []
        self._silent_windows += 1
        return self._silence_events()

    def idle(self, idle_ms: int) -> list[TurnEvent]:
        """The client has sent no audio for `idle_ms` past what it sent (a microphone turned off,
        a file sent whole): an open turn counts that as silence, or it would wait forever."""
        if not self.in_speech:
            return []
        self._idle_ms = idle_ms
        return self._silence_events()

    def _silence_events(self) -> list[TurnEvent]:
        silence_ms = self.silence_ms()
        if silence_ms >= self._silence_needed():
            self.in_speech = False
            return [TurnEvent("speech_stopped", self.last_speech_sample)]
        if silence_ms >= self.rules.pause_ms and not self._pause_sent:
            self._pause_sent = True
            return [TurnEvent("pause", self.last_speech_sample)]
        return []

    def force_stop(self) -> TurnEvent | None:
        if not self.in_speech:
            return None
        self.in_speech = False
        return TurnEvent("speech_stopped", self.last_speech_sample)
