"""One assistant reply: an engine request, its sentences through TTS, and the events and audio
that carry it to the client.

A response starts *speculative* (drafted from a partial transcript, nothing sent) and becomes
*active* when the session adopts it; a discarded speculation is cancelled unseen. One speaker
task sends everything the response produces, in order (events to `send`, audio to the
transport's AudioSink), and checks `cancelled` right before each send: once the session cancels
a response, not one more event or chunk of its audio goes out.

Audio and its transcript deltas carry the sink's epoch (core/audio_sink.py): the response reads
it when it is allowed to speak (adoption, a resume) and every chunk and transcript delta is sent
only if that epoch is still the sink's when it leaves. A clear (barge-in, pause) advances the
epoch, so nothing decided before it can follow it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable

import numpy as np

from voice_app.audio.pcm import WIRE_RATE
from voice_app.core.audio_sink import AudioSink, Send, ms_of
from voice_app.core.conversation import ConversationItem, SpokenPiece, new_id
from voice_app.core.models import Synthesizer
from voice_app.core.speech_text import SentenceSettler, clean_for_speech, words
from voice_app.core.user_turn import TurnClock
from voice_app.events.protocol import server_event

log = logging.getLogger(__name__)

AUDIO_CHUNK_SAMPLES = WIRE_RATE // 5  # 200 ms of audio per sink push (per response.output_audio.delta)
SPECULATIVE_SENTENCES = 1  # sentences a speculative response may synthesise before adoption
AUDIO_AHEAD_SENTENCES = 2  # synthesised sentences waiting to be sent: TTS pauses for a slow client
# Audio is sent at most this far ahead of what the listener has heard: a reply stays in
# progress while it plays, so talking over it can pause it and (a false interruption) resume
# it, and a barge-in has little queued audio to drop. 0: send as fast as it is made.
AUDIO_LEAD_MS = 1500


class EngineSilent(Exception):
    """The engine sent no update for the response's inactivity timeout."""


@dataclass
class SpokenSentence:
    """A synthesised sentence the speaker has started to send: kept for a resume."""

    text: str
    samples: np.ndarray
    start: int  # its first sample in the reply's audio
    pushed: int = 0  # samples of it handed to the sink so far (a clear may have dropped some)
    announced: bool = False  # its transcript delta reached the client


class Response:
    def __init__(self, *, handle: Any, source_text: str, audio_out: bool, synthesizer: Synthesizer,
                 speculative_tts: bool, speed: float = 1.0, inactivity_timeout_s: float = 30.0,
                 audio_lead_ms: float = AUDIO_LEAD_MS):
        self.id = new_id("resp")
        self.item = ConversationItem(id=new_id("item"), role="assistant", audio=audio_out,
                                     status="in_progress")
        self.handle = handle
        self.source_text = source_text  # the user text this reply was drafted from
        self.prompt_messages: list[dict[str, str]] = []  # the context it was drafted for
        self.audio_out = audio_out
        self.clock = TurnClock()
        self.cancelled = False
        self.status = "in_progress"
        self.failure: str | None = None  # why it failed, for response.done's status_details
        self.last_update: Any = None
        self.spoken_text = ""  # text of every sentence handed to the client so far
        self._settled: set[tuple[str, ...]] = set()  # the words of each sentence settled so far
        self.metrics_reported = False
        self.metadata: dict[str, str] | None = None  # response.create's, echoed back
        self.out_of_band = False  # conversation "none": the conversation does not keep it
        self._draft_queued = False
        self.audio_sent_samples = 0
        self._synthesizer = synthesizer
        self._speculative_tts = speculative_tts
        self._speed = speed
        self._inactivity_timeout_s = inactivity_timeout_s  # no engine update this long: failed
        self._audio_ahead = asyncio.Semaphore(AUDIO_AHEAD_SENTENCES)
        self.audio_waiting = 0  # synthesised sentences the speaker has not taken yet (<= AUDIO_AHEAD_SENTENCES)
        self._audio_lead_ms = audio_lead_ms
        self._spoken: list[SpokenSentence] = []  # what a resume replays from
        self._epoch = 0  # the sink epoch this response may speak in (see the module docstring)
        self._unpaused = asyncio.Event()  # cleared while the user talks over the reply
        self._unpaused.set()
        self.sink: AudioSink | None = None  # the listener's player, set by the session on activation
        self.paused_at_ms = 0.0  # the heard position when the user last talked over it
        self._adopted = asyncio.Event()
        self._outbox: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        self._sentences: asyncio.Queue[str | None] = asyncio.Queue()
        self._tasks: list[asyncio.Task] = []
        self._send: Send | None = None
        self._on_finished: Callable[["Response"], Awaitable[None]] | None = None

    # ---- lifecycle -------------------------------------------------------------------

    def start(self) -> None:
        """Begins drafting (and, if allowed, speculative synthesis) without sending anything."""
        self._start_producer(self._follow_engine(), "engine")
        if self.audio_out:
            self._start_producer(self._synthesize_sentences(), "tts")

    def _start_producer(self, work: Awaitable[None], name: str) -> None:
        """A producer that fails ends the response `failed` instead of leaving the speaker
        waiting (and the session's active response set) forever."""
        task = asyncio.create_task(work, name=f"{self.id}-{name}")
        task.add_done_callback(self._producer_done)
        self._tasks.append(task)

    def _producer_done(self, task: asyncio.Task) -> None:
        if task.cancelled() or task.exception() is None:
            return
        log.error("response %s: %s failed", self.id, task.get_name(), exc_info=task.exception())
        self.handle.cancel()
        self._outbox.put_nowait(("failed", f"{type(task.exception()).__name__} in {task.get_name()}"))

    def adopt(self, send: Send, on_finished: Callable[["Response"], Awaitable[None]], clock: TurnClock) -> None:
        """Makes the response real: from now on its events go to `send`, its audio to `sink`."""
        assert self.sink is not None, "the session gives an adopted response its sink first"
        self._send, self._on_finished, self.clock = send, on_finished, clock
        self._epoch = self.sink.epoch
        self.handle.promote()  # a speculative draft now has a listener: full engine priority
        if self.last_update is not None and self.last_update.draft_text and clock.first_draft_at is None:
            clock.first_draft_at = time.monotonic()
        self._adopted.set()
        self._tasks.append(asyncio.create_task(self._speak(), name=f"{self.id}-speaker"))

    @property
    def adopted(self) -> bool:
        return self._adopted.is_set()

    def cancel(self) -> None:
        """Stops engine and TTS work at once; safe to call more than once."""
        if self.cancelled:
            return
        self.cancelled = True
        self.handle.cancel()
        if self.sink is not None:
            self.sink.close()  # a chunk already on its way to the sink is dropped there
        for task in self._tasks:
            if task is not asyncio.current_task():
                task.cancel()

    async def wait_stopped(self) -> None:
        """Waits until every task of this response has ended (after cancel or completion)."""
        others = [t for t in self._tasks if t is not asyncio.current_task()]
        if others:
            await asyncio.gather(*others, return_exceptions=True)

    # ---- producers --------------------------------------------------------------------

    async def _updates(self) -> AsyncIterator[Any]:
        """The handle's updates; an engine that sends nothing for the inactivity timeout (a hung
        scheduler) ends them with a failure."""
        updates = aiter(self.handle)
        while True:
            try:
                yield await asyncio.wait_for(anext(updates), self._inactivity_timeout_s)
            except StopAsyncIteration:
                return
            except asyncio.TimeoutError:
                self.handle.cancel()
                raise EngineSilent(f"the engine sent nothing for {self._inactivity_timeout_s:g} s") from None

    async def _follow_engine(self) -> None:
        settler = SentenceSettler()
        try:
            async for update in self._updates():
                if not self._on_update(update, settler):
                    break
        except EngineSilent as silent:
            self._outbox.put_nowait(("failed", str(silent)))
        self._sentences.put_nowait(None)
        if not self.audio_out:
            self._outbox.put_nowait(("end", None))

    def _on_update(self, update: Any, settler: SentenceSettler) -> bool:
        """One engine update: the newest draft for the client, settled sentences for TTS (or the
        client); False once there is nothing more to read: the request failed, or it loops."""
        self.last_update = update
        if update.draft_text and self.adopted and self.clock.first_draft_at is None:
            self.clock.first_draft_at = time.monotonic()
        if not self._draft_queued:  # a slow reader gets the newest draft, not every one
            self._draft_queued = True
            self._outbox.put_nowait(("draft", None))
        if update.finish_reason == "error":
            self._outbox.put_nowait(("failed", update.error or "engine error"))
            return False
        for sentence in settler.feed(update.committed_text, final=update.final):
            log.debug("response %s: sentence settled after %d passes: %r", self.id, update.stats.forward_passes,
                      sentence)
            sentence = clean_for_speech(sentence)
            if self._loops(sentence):
                return False
            if sentence and self.audio_out:
                self._sentences.put_nowait(sentence)
            elif sentence:
                self._outbox.put_nowait(("text", sentence))
        return True

    def _loops(self, sentence: str) -> bool:
        """A sentence this reply has said already, word for word: the model is looping (SmolLM2
        said "I'm sorry for any misunderstanding." nine times over to a misheard question). The
        reply ends before it, with what it has said, and the engine stops making it."""
        said = tuple(words(sentence))
        if said and said in self._settled:
            log.info("response %s: %r again: the model loops; the reply ends there", self.id, sentence)
            self.handle.cancel()
            return True
        self._settled.add(said)
        return False

    async def _synthesize_sentences(self) -> None:
        synthesized = 0
        audio_ahead_s = 0.0  # of this reply, synthesised before the sentence at hand
        while (sentence := await self._sentences.get()) is not None:
            if synthesized >= SPECULATIVE_SENTENCES or not self._speculative_tts:
                await self._adopted.wait()  # speculation stops short: CPU is better spent elsewhere
            await self._audio_ahead.acquire()  # released as the speaker sends it
            started = time.monotonic()
            # needed once the audio before it has played (now, if nothing plays yet): a first
            # sentence goes before another reply's later ones
            playing_since = self.clock.first_audio_at
            needed_at = started if playing_since is None else max(started, playing_since + audio_ahead_s)
            samples = await self._synthesizer.synthesize(sentence, self._speed, needed_at)
            audio_ahead_s += len(samples) / WIRE_RATE
            log.debug("response %s: synthesized %.1f s of speech in %.0f ms", self.id, len(samples) / WIRE_RATE,
                      (time.monotonic() - started) * 1000)
            synthesized += 1
            self.audio_waiting += 1
            self._outbox.put_nowait(("audio", (sentence, samples)))
        self._outbox.put_nowait(("end", None))

    # ---- the one sender -------------------------------------------------------------------

    async def _emit(self, event_type: str, **fields: Any) -> None:
        if self.cancelled:
            raise asyncio.CancelledError
        assert self._send is not None
        await self._send(server_event(event_type, **fields))

    async def _emit_in(self, epoch: int, event_type: str, **fields: Any) -> bool:
        """An audio-side event: sent only if `epoch` is still the sink's when it leaves."""
        if self.cancelled:
            raise asyncio.CancelledError
        assert self._send is not None and self.sink is not None
        sink = self.sink
        return await self._send(server_event(event_type, **fields),
                                lambda: not self.cancelled and sink.epoch == epoch)

    async def _speak(self) -> None:
        ids = self._ids()
        try:
            while True:
                kind, payload = await self._outbox.get()
                if kind == "draft":
                    self._draft_queued = False
                    await self._send_draft(self.last_update)
                elif kind == "audio":
                    self._audio_ahead.release()
                    self.audio_waiting -= 1
                    await self._send_sentence_audio(*payload)
                elif kind == "text":
                    self.spoken_text = f"{self.spoken_text} {payload}".strip()
                    await self._emit("response.output_text.delta", **ids, delta=payload + " ")
                elif kind == "failed":
                    self.status, self.failure = "failed", payload
                    log.error("response %s failed: %s", self.id, payload)
                    break
                elif kind == "end":
                    self.status = "completed"
                    break
        except asyncio.CancelledError:
            return  # cut off: the session ends the response itself
        except Exception:  # a failed send or sink: the response ends, the session goes on
            log.exception("response %s: sending failed", self.id)
            self.cancel()
            self.status, self.failure = "failed", "the server failed to send the response"
        if self._on_finished is not None:
            await self._on_finished(self)

    async def _send_draft(self, update: Any) -> None:
        await self._emit("x_response.draft", response_id=self.id, item_id=self.item.id,
                         committed_text=update.committed_text, draft_text=update.draft_text,
                         step=update.step, tokens_per_forward=round(update.stats.tokens_per_forward, 3))

    async def _send_sentence_audio(self, sentence: str, samples: np.ndarray) -> None:
        spoken = SpokenSentence(sentence, samples, self.audio_sent_samples)
        self._spoken.append(spoken)
        self.item.pieces.append(SpokenPiece(sentence, ms_of(spoken.start), ms_of(len(samples))))
        self.spoken_text = f"{self.spoken_text} {sentence}".strip()
        await self._announce(spoken, self._epoch)
        assert self.sink is not None
        for offset in range(0, len(samples), AUDIO_CHUNK_SAMPLES):
            chunk = samples[offset : offset + AUDIO_CHUNK_SAMPLES]
            await self._when_room_to_send()
            if self.clock.first_audio_at is None:
                self.clock.first_audio_at = time.monotonic()
            if self.cancelled:  # not one more chunk once cut off
                raise asyncio.CancelledError
            # counted as sent even when a clear drops it on the way: a resume replays it
            spoken.pushed = offset + len(chunk)
            self.audio_sent_samples = spoken.start + spoken.pushed
            await self.sink.push(chunk, self._epoch)

    async def _announce(self, spoken: SpokenSentence, epoch: int) -> bool:
        """The sentence's transcript delta, in `epoch` (a resume re-sends one a clear dropped)."""
        if not spoken.announced:
            spoken.announced = await self._emit_in(epoch, "response.output_audio_transcript.delta",
                                                   **self._ids(), delta=spoken.text + " ")
        return spoken.announced

    def _ids(self) -> dict[str, Any]:
        return {"response_id": self.id, "item_id": self.item.id, "output_index": 0, "content_index": 0}

    async def _when_room_to_send(self) -> None:
        """Not while paused, and no further than the lead ahead of what has been heard."""
        assert self.sink is not None
        while True:
            while self.paused:  # a loop: the reply may pause again between a resume and this task running
                await self._unpaused.wait()
            ahead = self.sink.left_ms()
            if self._audio_lead_ms <= 0 or ahead <= self._audio_lead_ms:
                return
            await asyncio.sleep(min(0.1, (ahead - self._audio_lead_ms) / 1000.0))

    # ---- pause and resume (a false interruption) ------------------------------------------

    @property
    def paused(self) -> bool:
        return not self._unpaused.is_set()

    def pause(self, heard_ms: float) -> None:
        """The user talks over it (the session has cleared its sink): nothing more is sent, but
        the reply goes on being made. `heard_ms`: where playback stopped."""
        self._unpaused.clear()
        self.paused_at_ms = heard_ms

    async def resume(self) -> None:
        """It was not a real interruption (no words, a backchannel): a new epoch begins, told to
        the client with `output_audio_buffer.started`, the audio sent but not heard goes out
        again from where playback stopped, and the reply carries on."""
        if not self.paused or self.cancelled or self.sink is None:
            return
        epoch = self._epoch = self.sink.epoch
        if not await self._emit_in(epoch, "output_audio_buffer.started", response_id=self.id):
            return  # paused or cut again already
        played = int(self.paused_at_ms * WIRE_RATE / 1000)
        for spoken in self._spoken:
            if not await self._replay(spoken, played, epoch):
                return  # paused or cut again: the next resume starts from there
        self._unpaused.set()

    async def _replay(self, spoken: SpokenSentence, played: int, epoch: int) -> bool:
        """The part of the sentence that was pushed but not heard, in `epoch`."""
        first = max(0, played - spoken.start)
        if first >= spoken.pushed and spoken.announced:
            return True
        if not await self._announce(spoken, epoch):
            return False
        for offset in range(first, spoken.pushed, AUDIO_CHUNK_SAMPLES):
            end = min(spoken.pushed, offset + AUDIO_CHUNK_SAMPLES)
            if self.cancelled or not await self.sink.push(spoken.samples[offset:end], epoch):
                return False
        return True
