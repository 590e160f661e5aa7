"""The user's side of a conversation: input audio -> turns -> transcripts.

`Listener` owns the utterance being spoken: it runs the VAD over the input audio, re-transcribes
the open utterance every ~250 ms (LocalAgreement-2 keeps the stable prefix), says when a draft
is worth starting (a pause, or a partial with nothing unstable left) and writes the final
transcript into the conversation. It sends the input side's events itself and calls the
session's `TurnHooks` for everything that concerns replies.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Callable, Protocol

import numpy as np

from voice_app.audio.buffer import InputBuffer
from voice_app.audio.pcm import ASR_RATE, StreamResampler, int16_to_float
from voice_app.core.conversation import Conversation, ConversationItem, announce_evictions, new_id
from voice_app.core.end_of_turn import EndOfTurnJudge, is_false_interruption
from voice_app.core.models import VAD_WINDOW, Models
from voice_app.core.options import TurnDetection
from voice_app.core.speech_text import words
from voice_app.core.turn_detector import TurnDetector, TurnEvent
from voice_app.core.user_turn import FINAL_TAIL_SAMPLES, TurnClock, UserTurn
from voice_app.events import protocol as p

log = logging.getLogger(__name__)

MAX_UTTERANCE_S = 30  # a turn this long is committed even if the speaker goes on
REUSE_MARGIN_SAMPLES = ASR_RATE // 10  # a partial reaching 100 ms past the last speech: nothing new to decode
QUIET_NO_PARTIAL_MS = 64  # quiet this long: no partial, which would queue before the pause's closing decode
MIN_COMMIT_SAMPLES = ASR_RATE // 10  # input_audio_buffer.commit needs at least 100 ms
INLINE_ANALYSIS_S = 0.25  # input up to this long is resampled and VAD-scored on the event loop
ANALYSIS_SLICE_S = 0.5  # longer input: in slices this long, each on a worker thread
TAIL_JITTER_S = 0.1  # how much later than real time the rest of a pause's tail may come
IDLE_GRACE_S = 0.3  # a live stream's jitter: audio later than this is missing, and counts as silence
# a turn spoken over a reply, this short and sounding finished, waits server_vad's window, not
# the short one: interruptions open with a phrase and a breath ("No wait, ..."), and the reply
# they talk over is paused meanwhile, so the wait costs nothing heard
OPENER_WORDS = 2
ASR_SLOTS = 3  # decodes one session may have in the shared Whisper queue (a partial, a pause, a final)

Send = Callable[[dict[str, Any]], Awaitable[None]]
Spawn = Callable[[Awaitable[Any], str], asyncio.Task]


class TurnHooks(Protocol):
    """What the session does when the user speaks (LiveKit's recognition hooks, in spirit)."""

    async def on_user_speaking(self, turn: UserTurn, speech_ms: int) -> None:
        """Every VAD window of an open turn: the moment to decide on a barge-in."""

    def on_interim_transcript(self, text: str) -> None:
        """What the user has said so far, worth drafting a reply to before the turn ends."""

    def reply_paused(self) -> bool:
        """A reply the user spoke over waits, paused, to learn whether it was interrupted."""

    def last_reply_text(self) -> str:
        """The assistant's last reply as said so far, which Whisper hears the user's words after
        (its prompt); "" for none (settings.whisper_reply_context)."""

    async def on_end_of_turn(self, transcript: str, clock: TurnClock) -> None:
        """The turn is in the conversation with its final transcript."""


class Listener:
    def __init__(self, session_id: str, models: Models, rules: TurnDetection, partial_interval_ms: int,
                 conversation: Conversation, send: Send, spawn: Spawn, hooks: TurnHooks,
                 judge: EndOfTurnJudge | None = None):
        self._session_id = session_id
        self._transcriber = models.transcriber
        self._rules = rules
        self._partial_interval_s = partial_interval_ms / 1000.0
        self._conversation = conversation
        self._send = send
        self._spawn = spawn
        self._hooks = hooks
        self._judge = judge  # semantic_vad's: do the words so far sound finished?
        self._resamplers: dict[int, StreamResampler] = {}
        self._vad = models.vad.stream()
        self._detector = TurnDetector(rules)
        self._buffer = InputBuffer(max_samples=ASR_RATE * (MAX_UTTERANCE_S + 5))
        self._input_lock = asyncio.Lock()  # input is analysed in arrival order, one slice at a time
        self._asr_slots = asyncio.Semaphore(ASR_SLOTS)
        self._decodes: set[asyncio.Task] = set()  # this session's Whisper jobs, cancelled on close
        self._audio_until = 0.0  # monotonic time when the audio received so far would end, played live
        self._input_arrived = asyncio.Event()  # set (and replaced) as each slice of input is buffered
        self.turn: UserTurn | None = None

    # ---- input ------------------------------------------------------------------------------

    async def push_pcm16(self, samples: np.ndarray, rate: int) -> None:
        """Input audio at any rate and of any length: a long chunk (one append may hold minutes)
        is resampled and VAD-scored on a worker thread in slices, so no session waits on it and
        each slice's turn events come in stream order."""
        self._audio_until = max(self._audio_until, time.monotonic()) + len(samples) / rate
        async with self._input_lock:
            if len(samples) <= rate * INLINE_ANALYSIS_S:
                await self._consume(*self._analyse(samples, rate))
                return
            step = int(rate * ANALYSIS_SLICE_S)
            for offset in range(0, len(samples), step):
                await self._consume(*await asyncio.to_thread(self._analyse, samples[offset:offset + step], rate))

    def _analyse(self, samples: np.ndarray, rate: int) -> tuple[np.ndarray, list[float]]:
        """16 kHz audio and its VAD probabilities (the resampler and VAD keep stream state)."""
        if rate not in self._resamplers:
            self._resamplers[rate] = StreamResampler(rate, ASR_RATE)
        audio = self._resamplers[rate].process(int16_to_float(samples))
        return audio, self._vad.process(audio)

    async def _consume(self, audio: np.ndarray, probs: list[float]) -> None:
        self._buffer.append(audio)
        arrived, self._input_arrived = self._input_arrived, asyncio.Event()
        arrived.set()
        for prob in probs:
            for turn_event in self._detector.feed(prob):
                if self._rules.enabled:
                    await self._on_turn_event(turn_event)
            if self._rules.enabled and self.turn is not None:
                self.turn.drop_closing_decodes(self._detector.last_speech_sample + FINAL_TAIL_SAMPLES)
                self.turn.speech_ms = self._detector.speech_ms()
                await self._hooks.on_user_speaking(self.turn, self.turn.speech_ms)
        if self.turn is None and self._rules.enabled:
            # the prefix padding is kept before the VAD's position, not the buffer's end: the
            # samples after it (a window not yet complete) are not judged yet, and a turn that
            # starts in them needs its whole prefix, whatever the size of the client's chunks
            self._buffer.drop_before(min(self._buffer.end, self._detector.windows_seen * VAD_WINDOW)
                                     - self._prefix_samples())
            self._vad.reset_if_long_idle()
        elif self.turn is not None and self._buffer.end - self.turn.start_sample > MAX_UTTERANCE_S * ASR_RATE:
            await self._stop_speech()

    async def commit(self, event_id: str | None) -> None:
        """input_audio_buffer.commit: ends the open turn, or makes one of the buffered audio."""
        if self.turn is not None:
            await self._stop_speech()
            return
        if self._buffer.end - self._buffer.start < MIN_COMMIT_SAMPLES:
            raise p.ProtocolError("input_audio_buffer_commit_empty",
                                  "the input audio buffer holds less than 100 ms of audio", None, event_id)
        turn = UserTurn(new_id("item"), self._buffer.start, time.monotonic(), context=self._hooks.last_reply_text())
        end = self._buffer.end
        audio = self._buffer.slice(turn.start_sample, end).copy()
        self._buffer.drop_before(end)  # committed: a second commit finds the buffer empty
        self._spawn(self._finish_turn(turn, end, audio, TurnClock(speech_stopped_at=time.monotonic())), "commit")

    def close(self) -> None:
        """The session ended: its queued Whisper jobs are dropped (a running one finishes unread)."""
        for decode in list(self._decodes):
            decode.cancel()
        if self._judge is not None:
            self._judge.close()

    def clear(self) -> None:
        """input_audio_buffer.clear: the buffered audio and the open turn are forgotten."""
        self._buffer.clear()
        self._detector.force_stop()
        self.turn = None

    def _prefix_samples(self) -> int:
        return self._rules.prefix_padding_ms * ASR_RATE // 1000

    async def _stop_speech(self) -> None:
        stop = self._detector.force_stop()
        if stop is not None:
            await self._on_turn_event(stop)

    # ---- turns ------------------------------------------------------------------------------

    async def _on_turn_event(self, turn_event: TurnEvent) -> None:
        log.debug("session %s: vad %s at %.2f s of input", self._session_id, turn_event.kind,
                  turn_event.sample / ASR_RATE)
        if turn_event.kind == "speech_started":
            wanted = turn_event.sample - self._prefix_samples()
            start = max(self._buffer.start, wanted)
            # Whisper always gets the whole prefix: tiny.en heard "the capital of friends" with
            # 100 ms of audio before "France" and "France" with 0, 50 or 300 ms
            self.turn = UserTurn(new_id("item"), start, time.monotonic(), lead_pad=start - wanted,
                                 context=self._hooks.last_reply_text())
            if self._judge is not None:
                self._judge.forget()
            await self._send(p.server_event("input_audio_buffer.speech_started", item_id=self.turn.item_id,
                                            audio_start_ms=start * 1000 // ASR_RATE))
            self._spawn(self._partials(self.turn), "partials")
            self._spawn(self._watch_idle_input(self.turn), "idle-input")
        elif turn_event.kind == "pause" and self.turn is not None:
            self._spawn(self._at_pause(self.turn), "pause")
        elif turn_event.kind == "speech_stopped" and self.turn is not None:
            turn, self.turn = self.turn, None
            clock = TurnClock(speech_stopped_at=time.monotonic(), speech_ms=turn.speech_ms)
            # copied now: the rest of this append, and later ones, trim the buffer before the
            # final transcript may need it
            audio = self._buffer.slice(turn.start_sample, turn_event.sample + FINAL_TAIL_SAMPLES).copy()
            await self._send(p.server_event("input_audio_buffer.speech_stopped", item_id=turn.item_id,
                                            audio_end_ms=turn_event.sample * 1000 // ASR_RATE))
            self._spawn(self._finish_turn(turn, turn_event.sample, audio, clock), "finish-turn")

    async def _watch_idle_input(self, turn: UserTurn) -> None:
        """A client that stops sending audio mid-turn (a microphone turned off, a recording sent
        whole and nothing after it) is silent from when its audio would have ended: without this
        its turn would wait for windows that never come."""
        while turn is self.turn:
            await asyncio.sleep(0.05)
            idle_s = time.monotonic() - self._audio_until - IDLE_GRACE_S
            if idle_s <= 0 or self._input_lock.locked():
                continue
            async with self._input_lock:
                if turn is not self.turn:
                    return
                for turn_event in self._detector.idle(int(idle_s * 1000)):
                    await self._on_turn_event(turn_event)

    async def _transcribe(self, turn: UserTurn, end: int, final: bool = False) -> str:
        """Transcribes the turn's audio up to `end`; remembered so the final transcript can
        reuse it. Shielded: a cancelled caller does not waste a decode another may need. Once the
        buffer no longer holds the turn's start (the turn ended and input went on), a decode
        would hear only part of it: none is made, so none can stand in for the final one."""
        if self._buffer.start > turn.start_sample:
            return ""
        end = min(end, self._buffer.end)
        same = turn.transcription_of(end) if final else None  # (a partial never awaits a decode that may be dropped)
        if same is not None:
            return await asyncio.shield(same)
        audio = self._buffer.slice(turn.start_sample, end)
        started = time.monotonic()
        task = self._start_decode(turn, turn.padded(audio, closing=final), final=final)
        turn.remember(end, task, closing=final)
        text = await asyncio.shield(task)
        log.debug("session %s: %.1f s of speech transcribed in %.0f ms: %r", self._session_id,
                  len(audio) / ASR_RATE, (time.monotonic() - started) * 1000, text)
        return text

    async def _partials(self, turn: UserTurn) -> None:
        last_decode = time.monotonic()
        while turn is self.turn:
            await asyncio.sleep(max(0.02, last_decode + self._partial_interval_s - time.monotonic()))  # a steady cadence
            if turn is not self.turn or self._transcriber.busy or self._detector.silence_ms() >= QUIET_NO_PARTIAL_MS:
                continue
            last_decode = time.monotonic()
            if turn.transcription_covering(self._detector.last_speech_sample + REUSE_MARGIN_SAMPLES):
                continue  # nothing said since the last decode (a pause): leave the CPU to drafting
            text = await self._transcribe(turn, self._buffer.end)
            if turn is not self.turn:
                return
            if self._judge is not None and self._rules.semantic and not self._backchannel(text):
                self._judge.prefetch(text)  # if these are the last words, the verdict is ready at the pause
            partial = turn.agreement.update(text)
            await self._send(p.server_event("x_input_audio_transcription.partial", item_id=turn.item_id,
                                            stable=partial.stable, unstable=partial.unstable))
            if len(partial.stable) > len(turn.stable_sent):
                delta = partial.stable[len(turn.stable_sent):]
                turn.stable_sent = partial.stable
                await self._send(p.server_event("conversation.item.input_audio_transcription.delta",
                                                item_id=turn.item_id, content_index=0, delta=delta))
            if partial.stable and not partial.unstable:
                self._hooks.on_interim_transcript(partial.stable)

    async def _at_pause(self, turn: UserTurn) -> None:
        """A short silence: draft a reply to the words so far and, for semantic_vad, ask whether
        they sound finished; if so (and nothing was said since) the turn ends after
        COMPLETE_SILENCE_MS instead of the eagerness's limit. A partial that heard every word
        gives the draft its text at once; the decode the final transcript reuses is made too."""
        if turn is not self.turn:
            return  # it ended while this task waited to run: the final transcript answers it
        speech_end = self._detector.last_speech_sample
        final_decode = self._spawn(self._decode_until_tail(turn, speech_end), "pause-decode")
        covering = turn.transcription_covering(speech_end + REUSE_MARGIN_SAMPLES)
        text = None
        if covering is not None:
            try:
                text = await asyncio.shield(covering)
            except Exception:
                text = None
        from_partial = text is not None
        if text is None:
            text = await asyncio.shield(final_decode)
        if turn is not self.turn or text is None:
            return
        self._hooks.on_interim_transcript(text)
        if self._judge is None or not self._rules.semantic:
            return
        if await self._judge_words(turn, speech_end, text) is not True and from_partial:
            # the partial may have missed the last word ("... 2 plus" for "... 2 plus 2?"): the
            # decode up to the tail hears it all; judged again if it heard more
            final_text = await asyncio.shield(final_decode)
            if final_text is not None and final_text != text and turn is self.turn:
                self._hooks.on_interim_transcript(final_text)
                await self._judge_words(turn, speech_end, final_text)

    async def _judge_words(self, turn: UserTurn, speech_end: int, text: str) -> bool | None:
        """semantic_vad's verdict on `text`, applied unless the user has spoken since."""
        if not text.strip():
            # no words (a cough, a door, or the first syllable of a word Whisper cannot make out
            # yet): server_vad's window, so speech that goes on still belongs to this turn
            finished: bool | None = None
        elif self._backchannel(text):
            finished = True  # a "mm-hmm" over a paused reply: end it soon, and the reply goes on
        else:
            finished = await self._judge.sounds_finished(text)
            if finished and turn.barged_in and len(words(text)) <= OPENER_WORDS:
                finished = None  # an opener over the reply ("No wait," heard as "No way."): more may come
        if turn is self.turn and self._detector.last_speech_sample == speech_end:  # no new words since
            stop = self._detector.words_sound_finished(finished)
            if stop is not None:
                await self._on_turn_event(stop)
        return finished

    def _backchannel(self, text: str) -> bool:
        """Words that only acknowledge a reply the user spoke over (which waits, paused)."""
        # the words alone: a short sound at a pause may be the start of a sentence ("So, ..."),
        # which the length rule would take for a hum; that rule waits for the turn's end
        return self._hooks.reply_paused() and is_false_interruption(text)

    async def _decode_until_tail(self, turn: UserTurn, speech_end: int) -> str | None:
        """The decode the final transcript reuses if the turn ends at this pause: exactly its
        audio, up to the final tail (a few ms of live input away), never up to wherever a chunk
        happened to end. Waits for that tail at most as long as it takes to come live, plus
        jitter: a client that stopped sending gets the decode of what it sent, which is then
        also the final transcript's audio."""
        final_end = speech_end + FINAL_TAIL_SAMPLES
        deadline = time.monotonic() + max(0, final_end - self._buffer.end) / ASR_RATE + TAIL_JITTER_S
        while (self._buffer.end < final_end and turn is self.turn and time.monotonic() < deadline
               and self._detector.last_speech_sample == speech_end):
            try:
                await asyncio.wait_for(self._input_arrived.wait(), max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                break
        if turn is not self.turn:
            return ""  # it ended meanwhile: the final transcript decodes its own audio
        if self._detector.last_speech_sample != speech_end:
            return None  # speech went on: this pause does not end the turn
        # the final transcript if the turn ends here (dropped, and this task cancelled, if speech goes on)
        return await self._transcribe(turn, final_end, final=True)

    def _start_decode(self, turn: UserTurn, audio: np.ndarray, final: bool = False) -> asyncio.Task:
        task = asyncio.ensure_future(self._decode(audio, final, turn.context))
        self._decodes.add(task)
        task.add_done_callback(self._decodes.discard)
        return task

    async def _decode(self, audio: np.ndarray, final: bool, context: str) -> str:
        async with self._asr_slots:  # one session cannot fill the queue every session shares
            return await self._transcriber.transcribe(audio, final=final, context=context)

    async def _final_transcript(self, turn: UserTurn, audio: np.ndarray) -> str:
        """The decode of the turn's audio: one made at the pause of exactly this audio if any
        (the transcript never depends on how far input had come when a decode was made)."""
        same = turn.transcription_of(turn.start_sample + len(audio))
        if same is not None:
            try:
                return await asyncio.shield(same)
            except Exception:
                log.exception("session %s: reusable transcription failed; decoding again", self._session_id)
        return await self._start_decode(turn, turn.padded(audio, closing=True), final=True)

    async def _finish_turn(self, turn: UserTurn, end: int, audio: np.ndarray, clock: TurnClock) -> None:
        """`audio`: the turn's samples (with a short tail of silence), copied when it ended."""
        user_item = ConversationItem(turn.item_id, "user", audio=True, status="in_progress")
        previous = self._conversation.add(user_item)
        await announce_evictions(self._conversation, self._send)
        await self._send(p.server_event("input_audio_buffer.committed", item_id=turn.item_id,
                                        previous_item_id=previous))
        await self._send(p.server_event("conversation.item.added", previous_item_id=previous,
                                        item=p.message_item(user_item.id, "user", "", "in_progress", True)))
        transcript = await self._final_transcript(turn, audio)
        clock.transcript_at = time.monotonic()
        user_item.text, user_item.status = transcript, "completed"
        await self._send(p.server_event(
            "conversation.item.input_audio_transcription.completed", item_id=turn.item_id, content_index=0,
            transcript=transcript, usage={"type": "duration", "seconds": round((end - turn.start_sample) / ASR_RATE, 3)}))
        await self._send(p.server_event("conversation.item.done", previous_item_id=previous,
                                        item=p.message_item(user_item.id, "user", transcript, "completed", True)))
        log.info("session %s: user said %r", self._session_id, transcript)
        await self._hooks.on_end_of_turn(transcript, clock)
