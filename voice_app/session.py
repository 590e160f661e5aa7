"""One conversation: input audio -> turns -> responses, with speculation and barge-in.

Transport-agnostic: a transport hands in client events (`handle_text` for wire text,
`handle_event` for validated models, `push_pcm16` for raw audio) and receives server events
through the async `send` callback. Everything here runs on one asyncio loop; model work runs
in the models' own thread pools.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import numpy as np
from pydantic import BaseModel

from voice_app import protocol as p
from voice_app.asr import LocalAgreement
from voice_app.audio.buffer import InputBuffer
from voice_app.audio.pcm import (ASR_RATE, WIRE_RATE, AudioFormatError, StreamResampler,
                                 decode_base64_pcm16, int16_to_float)
from voice_app.audio.vad import TurnDetector, TurnEvent, TurnRules
from voice_app.conversation import ContextTooLong, Conversation, ConversationItem, fit_to_context, new_id
from voice_app.metrics import VoiceMetrics
from voice_app.response import Response, Send, TurnClock
from voice_app.settings import Settings

log = logging.getLogger(__name__)

MAX_UTTERANCE_S = 30  # a turn this long is committed even if the speaker goes on
REUSE_MARGIN_SAMPLES = ASR_RATE // 10  # a transcript reaches 100 ms past the last speech: reusable
FINAL_TAIL_SAMPLES = ASR_RATE // 5  # trailing silence Whisper gets after the last speech
MIN_COMMIT_SAMPLES = ASR_RATE // 10  # input_audio_buffer.commit needs at least 100 ms


@dataclass
class UserTurn:
    """The utterance being spoken now (between speech_started and speech_stopped)."""

    item_id: str
    start_sample: int  # stream index where its audio begins (prefix padding included)
    started_at: float  # time.monotonic() when speech was detected
    agreement: LocalAgreement = field(default_factory=LocalAgreement)
    stable_sent: str = ""
    transcriptions: list[tuple[int, asyncio.Task]] = field(default_factory=list)  # (audio end, decode)
    barged_in: bool = False

    def transcription_covering(self, sample: int) -> asyncio.Task | None:
        """A decode that heard the turn up to `sample`: a finished one if any, else one running."""
        covering = [task for end, task in self.transcriptions if end >= sample]
        finished = [task for task in covering if task.done() and task.exception() is None]
        return (finished or covering or [None])[-1]


class Session:
    """`models`: a LoadedModels (engine, transcriber, synthesizer, vad), shared by all sessions.
    `send`: awaited with each server event (a dict). `on_audio`: optional, called with each reply
    audio chunk (int16, 24 kHz) right before its delta is sent, for transports that play PCM."""

    def __init__(self, models: Any, settings: Settings, send: Send,
                 metrics: VoiceMetrics | None = None,
                 on_audio: Callable[[np.ndarray], None] | None = None,
                 translate_in: Callable[[Any], Any] | None = None):
        self.id = new_id("sess")
        self._translate_in = translate_in  # a client dialect's events -> ours, before validation
        self.models = models
        self.settings = settings
        self.metrics = metrics or VoiceMetrics()
        self.conversation = Conversation()
        self.instructions = settings.instructions
        self.voice = "joe"
        self.speed = 1.0
        self.audio_out = True
        self.max_output_tokens = settings.max_new_tokens
        self.vad_enabled = True
        self.create_response = True
        self.interrupt_response = True
        self.prefix_padding_ms = settings.prefix_padding_ms
        self.rules = TurnRules(settings.vad_threshold, settings.silence_duration_ms, settings.draft_pause_ms)
        self._send_raw = send
        self._send_lock = asyncio.Lock()
        self._on_audio = on_audio
        self._resamplers: dict[int, StreamResampler] = {}
        self._vad = models.vad.stream()
        self._detector = TurnDetector(self.rules)
        self._buffer = InputBuffer(max_samples=ASR_RATE * (MAX_UTTERANCE_S + 5))
        self._turn: UserTurn | None = None
        self._speculation: Response | None = None
        self._active: Response | None = None
        self._playing: Response | None = None  # finished sending, maybe still playing at the client
        self._responses: set[Response] = set()  # every response not yet stopped, for close()
        self._tasks: set[asyncio.Task] = set()
        self.closed = False

    # ---- transport entry points ------------------------------------------------------------

    async def start(self) -> None:
        await self._send(p.server_event("session.created", session=self.session_shape()))

    async def handle_text(self, raw: str | bytes) -> None:
        """One wire message: parsed, validated, dispatched; a bad one gets an `error` event."""
        try:
            event = p.parse_client_event(raw, self.settings.max_message_bytes, self._translate_in)
            await self.handle_event(event)
        except p.ProtocolError as error:
            await self.send_error(error)

    async def send_error(self, error: p.ProtocolError) -> None:
        log.info("session %s: client error %s: %s", self.id, error.code, error.message)
        self.metrics.client_errors_total.inc()
        await self._send(p.error_event(error))

    async def handle_event(self, event: BaseModel) -> None:
        handler = getattr(self, "_on_" + event.type.replace(".", "_"))  # type: ignore[attr-defined]
        await handler(event)

    async def push_pcm16(self, samples: np.ndarray, rate: int = WIRE_RATE) -> None:
        """Raw PCM16 mono input (the desktop transport calls this directly)."""
        if rate not in self._resamplers:
            self._resamplers[rate] = StreamResampler(rate, ASR_RATE)
        audio = self._resamplers[rate].process(int16_to_float(samples))
        self._buffer.append(audio)
        for prob in self._vad.process(audio):
            for turn_event in self._detector.feed(prob):
                if self.vad_enabled:
                    await self._on_turn_event(turn_event)
            if self.vad_enabled:
                await self._check_barge_in()
        if self._turn is None and self.vad_enabled:
            self._buffer.drop_before(self._buffer.end - self._prefix_samples())
            self._vad.reset_if_long_idle()
        elif self._turn is not None and self._buffer.end - self._turn.start_sample > MAX_UTTERANCE_S * ASR_RATE:
            stop = self._detector.force_stop()
            if stop is not None:
                await self._on_turn_event(stop)

    async def close(self) -> None:
        """Stops everything this session started; returns when no engine or TTS work is left."""
        self.closed = True
        responses = list(self._responses)
        for response in responses:
            response.cancel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*(r.wait_stopped() for r in responses), return_exceptions=True)
        log.info("session %s closed", self.id)

    # ---- sending ----------------------------------------------------------------------------

    async def _send(self, event: dict[str, Any]) -> None:
        if self.closed:
            return
        async with self._send_lock:
            try:
                await self._send_raw(event)
            except Exception as exc:  # the transport is gone; the transport's owner closes us
                log.info("session %s: send failed (%s); closing", self.id, exc)
                self.closed = True

    def _spawn(self, coro: Awaitable[Any], name: str) -> asyncio.Task:
        task = asyncio.ensure_future(coro)
        task.set_name(f"{self.id}-{name}")
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("session %s: task %s failed", self.id, task.get_name(), exc_info=task.exception())

    # ---- client events ----------------------------------------------------------------------

    async def _on_session_update(self, event: p.SessionUpdate) -> None:
        config = event.session
        if config.max_output_tokens is not None:  # checked first: a refused update changes nothing
            self.max_output_tokens = self._reply_tokens(config.max_output_tokens)
        if config.instructions is not None:
            self.instructions = config.instructions
        if config.output_modalities is not None:
            self.audio_out = "audio" in config.output_modalities
        audio = config.audio
        if audio is not None and audio.input is not None and "turn_detection" in audio.input.model_fields_set:
            self._apply_turn_detection(audio.input.turn_detection)
        if audio is not None and audio.output is not None:
            self.voice = audio.output.voice or self.voice
            self.speed = audio.output.speed or self.speed
        await self._send(p.server_event("session.updated", session=self.session_shape()))

    def _apply_turn_detection(self, vad: p.ServerVad | None) -> None:
        self.vad_enabled = vad is not None
        if vad is None:
            return
        if vad.threshold is not None:
            self.rules.threshold = vad.threshold
        if vad.silence_duration_ms is not None:
            self.rules.silence_duration_ms = vad.silence_duration_ms
        if vad.prefix_padding_ms is not None:
            self.prefix_padding_ms = vad.prefix_padding_ms
        if vad.create_response is not None:
            self.create_response = vad.create_response
        if vad.interrupt_response is not None:
            self.interrupt_response = vad.interrupt_response

    def _reply_tokens(self, requested: int | str) -> int:
        if requested == "inf":
            return self.settings.max_new_tokens
        if not 1 <= int(requested) <= 4096:
            raise p.ProtocolError("invalid_value", f"max_output_tokens must be in 1..4096 or 'inf', got {requested}",
                                  "max_output_tokens")
        return int(requested)

    async def _on_input_audio_buffer_append(self, event: p.InputAudioBufferAppend) -> None:
        try:
            samples = decode_base64_pcm16(event.audio)
        except AudioFormatError as exc:
            raise p.ProtocolError("invalid_audio", str(exc), "audio", event.event_id) from exc
        await self.push_pcm16(samples)

    async def _on_input_audio_buffer_commit(self, event: p.InputAudioBufferCommit) -> None:
        if self._turn is not None:
            stop = self._detector.force_stop()
            if stop is not None:
                await self._on_turn_event(stop)
            return
        if self._buffer.end - self._buffer.start < MIN_COMMIT_SAMPLES:
            raise p.ProtocolError("input_audio_buffer_commit_empty",
                                  "the input audio buffer holds less than 100 ms of audio", None, event.event_id)
        turn = UserTurn(new_id("item"), self._buffer.start, time.monotonic())
        end = self._buffer.end
        self._spawn(self._finish_turn(turn, end, TurnClock(speech_stopped_at=time.monotonic())), "commit")

    async def _on_input_audio_buffer_clear(self, event: p.InputAudioBufferClear) -> None:
        self._buffer.clear()
        self._detector.force_stop()
        self._turn = None
        self._drop_speculation()
        await self._send(p.server_event("input_audio_buffer.cleared"))

    async def _on_conversation_item_create(self, event: p.ConversationItemCreate) -> None:
        text = " ".join(part.text for part in event.item.content).strip()
        item = ConversationItem(event.item.id or new_id("item"), event.item.role, text)
        if self.conversation.find(item.id) is not None:
            raise p.ProtocolError("invalid_value", f"item id {item.id!r} is already in the conversation",
                                  "item.id", event.event_id)
        previous = self.conversation.add(item)
        self._drop_speculation()  # the context changed under it
        shape = p.message_item(item.id, item.role, item.text)
        await self._send(p.server_event("conversation.item.added", previous_item_id=previous, item=shape))
        await self._send(p.server_event("conversation.item.done", previous_item_id=previous, item=shape))

    async def _on_response_create(self, event: p.ResponseCreate) -> None:
        if self._active is not None:
            raise p.ProtocolError("conversation_already_has_active_response",
                                  f"response {self._active.id} is still in progress; cancel it first",
                                  None, event.event_id)
        options = event.response or p.ResponseOptions()
        instructions = options.instructions if options.instructions is not None else self.instructions
        audio_out = self.audio_out if options.output_modalities is None else "audio" in options.output_modalities
        reply_tokens = (self.max_output_tokens if options.max_output_tokens is None
                        else self._reply_tokens(options.max_output_tokens))
        self._drop_speculation()
        messages = self.conversation.messages(self._system_prompt(instructions))
        response = self._start_response(messages, audio_out, reply_tokens, event.event_id)
        await self._activate(response, TurnClock())

    async def _on_response_cancel(self, event: p.ResponseCancel) -> None:
        active = self._active
        if active is None or (event.response_id and event.response_id != active.id):
            raise p.ProtocolError("response_cancel_not_active",
                                  f"no active response{' ' + event.response_id if event.response_id else ''} to cancel",
                                  "response_id", event.event_id)
        await self._interrupt(active, reason="client_cancelled", send_cleared=False)

    async def _on_conversation_item_truncate(self, event: p.ConversationItemTruncate) -> None:
        item = self.conversation.find(event.item_id)
        if item is None or item.role != "assistant":
            raise p.ProtocolError("invalid_value", f"no assistant item {event.item_id!r} to truncate",
                                  "item_id", event.event_id)
        if event.audio_end_ms > item.audio_ms + 1:
            raise p.ProtocolError("invalid_value",
                                  f"audio_end_ms {event.audio_end_ms} is past the item's audio ({item.audio_ms:.0f} ms)",
                                  "audio_end_ms", event.event_id)
        if self._active is not None and self._active.item is item:
            await self._interrupt(self._active, reason="client_truncated", send_cleared=False)
        item.text = item.text_heard_until(event.audio_end_ms)
        item.status = "incomplete"
        await self._send(p.server_event("conversation.item.truncated", item_id=item.id,
                                        content_index=event.content_index, audio_end_ms=event.audio_end_ms))

    async def _on_output_audio_buffer_clear(self, event: p.OutputAudioBufferClear) -> None:
        if self._active is not None:
            await self._interrupt(self._active, reason="client_cleared", send_cleared=True)
        else:
            await self._send(p.server_event("output_audio_buffer.cleared", response_id=None))

    # ---- turns ------------------------------------------------------------------------------

    def _prefix_samples(self) -> int:
        return self.prefix_padding_ms * ASR_RATE // 1000

    async def _on_turn_event(self, turn_event: TurnEvent) -> None:
        log.debug("session %s: vad %s at %.2f s of input", self.id, turn_event.kind, turn_event.sample / ASR_RATE)
        if turn_event.kind == "speech_started":
            start = max(self._buffer.start, turn_event.sample - self._prefix_samples())
            self._turn = UserTurn(new_id("item"), start, time.monotonic())
            await self._send(p.server_event("input_audio_buffer.speech_started", item_id=self._turn.item_id,
                                            audio_start_ms=start * 1000 // ASR_RATE))
            self._spawn(self._partials(self._turn), "partials")
        elif turn_event.kind == "pause" and self._turn is not None:
            self._spawn(self._draft_at_pause(self._turn), "pause-draft")
        elif turn_event.kind == "speech_stopped" and self._turn is not None:
            turn, self._turn = self._turn, None
            clock = TurnClock(speech_stopped_at=time.monotonic())
            await self._send(p.server_event("input_audio_buffer.speech_stopped", item_id=turn.item_id,
                                            audio_end_ms=turn_event.sample * 1000 // ASR_RATE))
            self._spawn(self._finish_turn(turn, turn_event.sample, clock), "finish-turn")

    async def _transcribe(self, turn: UserTurn, end: int) -> str:
        """Transcribes the turn's audio up to `end`; remembered so the final transcript can
        reuse it. Shielded: a cancelled caller does not waste a decode another may need."""
        audio = self._buffer.slice(turn.start_sample, end)
        started = time.monotonic()
        task = asyncio.ensure_future(self.models.transcriber.transcribe(audio))
        turn.transcriptions = turn.transcriptions[-3:] + [(end, task)]
        text = await asyncio.shield(task)
        log.debug("session %s: %.1f s of speech transcribed in %.0f ms: %r", self.id, len(audio) / ASR_RATE,
                  (time.monotonic() - started) * 1000, text)
        return text

    async def _partials(self, turn: UserTurn) -> None:
        interval = self.settings.partial_interval_ms / 1000.0
        last_decode = time.monotonic()
        while turn is self._turn:
            await asyncio.sleep(max(0.02, last_decode + interval - time.monotonic()))  # a steady cadence
            if turn is not self._turn or self.models.transcriber.busy:
                continue
            last_decode = time.monotonic()
            if turn.transcription_covering(self._detector.last_speech_sample + REUSE_MARGIN_SAMPLES):
                continue  # nothing said since the last decode (a pause): leave the CPU to drafting
            partial = turn.agreement.update(await self._transcribe(turn, self._buffer.end))
            if turn is not self._turn:
                return
            await self._send(p.server_event("x_input_audio_transcription.partial", item_id=turn.item_id,
                                            stable=partial.stable, unstable=partial.unstable))
            if len(partial.stable) > len(turn.stable_sent):
                delta = partial.stable[len(turn.stable_sent):]
                turn.stable_sent = partial.stable
                await self._send(p.server_event("conversation.item.input_audio_transcription.delta",
                                                item_id=turn.item_id, content_index=0, delta=delta))
            if partial.stable and not partial.unstable:
                self._speculate(turn, partial.stable)

    async def _draft_at_pause(self, turn: UserTurn) -> None:
        text = await self._transcribe(turn, self._buffer.end)
        if turn is self._turn:
            self._speculate(turn, text)

    def _system_prompt(self, instructions: str) -> str:
        """The session's instructions, after the server's spoken-style defaults unless they
        already begin with them, are empty (the client wants no system prompt) or the
        setting is off."""
        base = self.settings.instructions
        if not self.settings.keep_spoken_style or not instructions or instructions.startswith(base):
            return instructions
        return f"{base} {instructions}"

    def _speculate(self, turn: UserTurn, text: str) -> None:
        """Drafts a reply to what the user has said so far; a newer transcript redrafts."""
        if not text.strip() or (self._speculation is not None and self._speculation.source_text == text):
            return
        self._drop_speculation()
        log.debug("session %s: speculative draft for %r", self.id, text)
        messages = self.conversation.messages(self._system_prompt(self.instructions), pending_user_text=text)
        try:
            self._speculation = self._start_response(messages, self.audio_out, self.max_output_tokens, None, text,
                                                     background=True)
        except p.ProtocolError as error:  # it will fail again at end of turn, and be reported then
            log.info("session %s: no speculative draft: %s", self.id, error.message)

    def _drop_speculation(self) -> None:
        if self._speculation is not None:
            self._discard(self._speculation)
            self._speculation = None

    def _discard(self, response: Response) -> None:
        response.cancel()
        self._spawn(self._forget_when_stopped(response), "forget")

    async def _final_transcript(self, turn: UserTurn, end: int) -> str:
        covering = turn.transcription_covering(end + REUSE_MARGIN_SAMPLES)
        if covering is not None:
            try:
                return await asyncio.shield(covering)  # it already heard all of the speech
            except Exception:
                log.exception("session %s: reusable transcription failed; decoding again", self.id)
        return await self.models.transcriber.transcribe(
            self._buffer.slice(turn.start_sample, end + FINAL_TAIL_SAMPLES), final=True)

    async def _finish_turn(self, turn: UserTurn, end: int, clock: TurnClock) -> None:
        user_item = ConversationItem(turn.item_id, "user", audio=True, status="in_progress")
        previous = self.conversation.add(user_item)
        await self._send(p.server_event("input_audio_buffer.committed", item_id=turn.item_id,
                                        previous_item_id=previous))
        await self._send(p.server_event("conversation.item.added", previous_item_id=previous,
                                        item=p.message_item(user_item.id, "user", "", "in_progress", True)))
        transcript = await self._final_transcript(turn, end)
        clock.transcript_at = time.monotonic()
        user_item.text, user_item.status = transcript, "completed"
        self._buffer.drop_before(min(end, self._turn.start_sample if self._turn else end))
        await self._send(p.server_event(
            "conversation.item.input_audio_transcription.completed", item_id=turn.item_id, content_index=0,
            transcript=transcript, usage={"type": "duration", "seconds": round((end - turn.start_sample) / ASR_RATE, 3)}))
        await self._send(p.server_event("conversation.item.done", previous_item_id=previous,
                                        item=p.message_item(user_item.id, "user", transcript, "completed", True)))
        log.info("session %s: user said %r", self.id, transcript)
        if not transcript.strip() or not self.create_response or self._active is not None:
            self._drop_speculation()
            return
        await self._respond_to_turn(clock)

    async def _respond_to_turn(self, clock: TurnClock) -> None:
        messages = self.conversation.messages(self._system_prompt(self.instructions))
        speculation, self._speculation = self._speculation, None
        if speculation is not None and not speculation.cancelled and speculation.prompt_messages == messages:
            log.info("session %s: reusing the speculative draft %s", self.id, speculation.id)
            response = speculation
        else:
            if speculation is not None:
                log.debug("session %s: speculative draft %s was for %r; drafting again", self.id, speculation.id,
                          speculation.source_text)
                self._discard(speculation)
            try:
                response = self._start_response(messages, self.audio_out, self.max_output_tokens, None)
            except p.ProtocolError as error:
                await self.send_error(error)
                return
        await self._activate(response, clock)

    # ---- responses --------------------------------------------------------------------------

    def _start_response(self, messages: list[dict[str, str]], audio_out: bool, reply_tokens: int,
                        event_id: str | None, source_text: str = "", background: bool = False) -> Response:
        """background: a speculative draft, which the engine steps only when no reply that is
        being heard needs the CPU (promoted when adopted)."""
        from dllm_engine.request import EngineError, GenerationParams

        engine = self.models.engine
        params = GenerationParams(max_new_tokens=reply_tokens, mode=self.settings.engine_mode,
                                  deadline_s=self.settings.reply_deadline_s, background=background)
        try:
            handle = engine.submit(fit_to_context(messages, engine, reply_tokens), params)
        except (EngineError, ContextTooLong) as exc:
            raise p.ProtocolError("response_failed", f"the engine refused the request: {exc}", None, event_id) from exc
        response = Response(handle=handle, source_text=source_text or messages[-1]["content"],
                            audio_out=audio_out, synthesizer=self.models.synthesizer,
                            speculative_tts=self.settings.speculative_tts, speed=self.speed,
                            on_audio=self._on_audio)
        response.prompt_messages = messages
        self._responses.add(response)
        response.start()
        return response

    async def _activate(self, response: Response, clock: TurnClock) -> None:
        log.debug("session %s: %s adopted", self.id, response.id)
        self._active = response
        previous = self.conversation.add(response.item)
        ids = {"response_id": response.id, "output_index": 0}
        await self._send(p.server_event("response.created", response=response.response_shape("in_progress")))
        await self._send(p.server_event("response.output_item.added", **ids, item=response.item_event_shape()))
        await self._send(p.server_event("conversation.item.added", previous_item_id=previous,
                                        item=response.item_event_shape()))
        part = {"type": "audio", "transcript": ""} if response.audio_out else {"type": "text", "text": ""}
        await self._send(p.server_event("response.content_part.added", **ids, item_id=response.item.id,
                                        content_index=0, part=part))
        response.adopt(self._send, self._on_response_finished, clock)

    async def _check_barge_in(self) -> None:
        turn = self._turn
        if turn is None or turn.barged_in or not self.interrupt_response:
            return
        playing = self._playing if self._playing is not None and self._playing.playback_left_ms() > 0 else None
        target = self._active or playing
        if target is None or self._detector.speech_ms() < self.settings.barge_in_min_speech_ms:
            return
        turn.barged_in = True
        target.clock.speech_started_at = turn.started_at
        self.metrics.barge_ins_total.inc()
        if target is self._active:
            await self._interrupt(target, reason="turn_detected", send_cleared=True)
        else:
            await self._cut_playback(target)

    async def _cut_playback(self, response: Response) -> None:
        """Barge-in after the response was fully sent but while the client still plays it: the
        client drops its queue, and the history keeps only what was heard."""
        self._playing = None
        await self._send(p.server_event("output_audio_buffer.cleared", response_id=response.id))
        response.clock.cleared_at = time.monotonic()
        heard_ms = response.heard_ms()
        response.item.text = response.item.text_heard_until(heard_ms)
        response.item.status = "incomplete"
        log.info("session %s: playback of %s cut after %.0f ms: %r", self.id, response.id, heard_ms,
                 response.item.text)
        await self._send(p.server_event("conversation.item.truncated", item_id=response.item.id,
                                        content_index=0, audio_end_ms=int(heard_ms)))
        await self._report_turn_metrics(response)

    async def _interrupt(self, response: Response, reason: str, send_cleared: bool) -> None:
        """Cuts a response off: tell the client to drop queued audio first, then stop the work,
        then keep in the history only what the listener heard."""
        response.cancel()
        if send_cleared:
            await self._send(p.server_event("output_audio_buffer.cleared", response_id=response.id))
            response.clock.cleared_at = time.monotonic()
        heard_ms = response.heard_ms()
        response.item.text = (response.item.text_heard_until(heard_ms) if response.audio_out
                              else response.spoken_text)
        response.item.status = "incomplete"
        log.info("session %s: response %s cut off (%s) after %.0f ms heard: %r",
                 self.id, response.id, reason, heard_ms, response.item.text)
        await self._end_response(response, "cancelled", reason)
        self._spawn(self._forget_when_stopped(response), "forget")  # once its TTS job has stopped

    async def _forget_when_stopped(self, response: Response) -> None:
        await response.wait_stopped()
        self._responses.discard(response)

    async def _on_response_finished(self, response: Response) -> None:
        if response.status == "completed":
            response.item.text, response.item.status = response.spoken_text, "completed"
            self._playing = response if response.audio_out else None
        else:
            response.item.status = "incomplete"
        await self._end_response(response, response.status)
        self._responses.discard(response)

    async def _end_response(self, response: Response, status: str, reason: str | None = None) -> None:
        if self._active is response:
            self._active = None
        ids = {"response_id": response.id, "item_id": response.item.id, "output_index": 0, "content_index": 0}
        if response.audio_out:
            await self._send(p.server_event("response.output_audio.done", **ids))
            await self._send(p.server_event("response.output_audio_transcript.done", **ids,
                                            transcript=response.item.text))
            part = {"type": "audio", "transcript": response.item.text}
        else:
            await self._send(p.server_event("response.output_text.done", **ids, text=response.item.text))
            part = {"type": "text", "text": response.item.text}
        await self._send(p.server_event("response.content_part.done", **ids, part=part))
        item_shape = response.item_event_shape()
        await self._send(p.server_event("response.output_item.done", response_id=response.id, output_index=0,
                                        item=item_shape))
        await self._send(p.server_event("conversation.item.done", item=item_shape))
        await self._send(p.server_event("response.done", response=response.response_shape(status, reason)))
        await self._report_turn_metrics(response)

    async def _report_turn_metrics(self, response: Response) -> None:
        report = response.turn_report()
        # a barge-in during playback reports the turn a second time: count its latencies once
        self.metrics.observe_turn(report, first_report=not response.metrics_reported)
        response.metrics_reported = True
        log.info("session %s turn metrics: %s", self.id, report)
        await self._send(p.server_event("x_turn.metrics", **report))

    # ---- wire shapes ------------------------------------------------------------------------

    def session_shape(self) -> dict[str, Any]:
        turn_detection = None
        if self.vad_enabled:
            turn_detection = {"type": "server_vad", "threshold": self.rules.threshold,
                              "prefix_padding_ms": self.prefix_padding_ms,
                              "silence_duration_ms": self.rules.silence_duration_ms,
                              "create_response": self.create_response,
                              "interrupt_response": self.interrupt_response}
        pcm = {"type": "audio/pcm", "rate": WIRE_RATE}
        return {
            "type": "realtime", "object": "realtime.session", "id": self.id,
            "model": getattr(self.models.engine, "model_name", "unknown"),
            "instructions": self.instructions,
            "output_modalities": ["audio"] if self.audio_out else ["text"],
            "max_output_tokens": self.max_output_tokens,
            "audio": {
                "input": {"format": pcm, "turn_detection": turn_detection,
                          "transcription": {"model": self.models.transcriber.model_name}},
                "output": {"format": pcm, "voice": self.voice, "speed": self.speed},
            },
        }
