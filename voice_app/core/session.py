"""One conversation: client events and the user's turns -> responses, with speculation and barge-in.

Transport-agnostic: a transport hands in client events (`handle_text` for wire text,
`handle_event` for validated models, `push_pcm16` for raw audio), receives server events through
the async `send` callback, and plays reply audio through the AudioSink that `open_sink` gives
each response (default: `response.output_audio.delta` events on `send`). The user's side (VAD,
partial and final transcripts) is core/turns.py's `Listener`, which calls this session's
TurnHooks. What each client event does is core/client_events.py (one of Session's bases).
Everything here runs on one asyncio loop; model work runs in the models' own threads.

Barge-in, all of it in this file: `on_user_speaking` picks the reply being talked over;
`_interrupt` cuts one still being produced, `_cut_playback` one sent but still playing; both
clear its sink and keep in the history only what the sink says was heard.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any, Awaitable, Callable

import numpy as np
from pydantic import BaseModel

from voice_app.audio.pcm import WIRE_RATE
from voice_app.core.audio_sink import OpenSink, Send, WireAudioSink
from voice_app.core.client_events import ClientEvents
from voice_app.core.conversation import ContextFitter, ContextTooLong, Conversation, announce_evictions, new_id
from voice_app.core.end_of_turn import EndOfTurnJudge, is_false_interruption, is_stop_command
from voice_app.core.metrics import VoiceMetrics
from voice_app.core.models import Models
from voice_app.core.offload import submit_off_loop
from voice_app.core.options import SessionOptions
from voice_app.core.response import Response
from voice_app.core.response_events import response_ended, response_started, turn_report
from voice_app.core.speculation import Speculation
from voice_app.core.turns import Listener, TurnClock, UserTurn
from voice_app.events import protocol as p
from voice_app.settings import Settings

log = logging.getLogger(__name__)

LARGE_MESSAGE_CHARS = 1 << 20  # parsed on a worker thread, not the event loop (~1 ms a MiB)


class Session(ClientEvents):
    """`models`: the engine, transcriber, synthesizer and VAD, shared by all sessions.
    `send`: awaited with each server event (a dict). `open_sink`: the transport's player for a
    response's audio (default: audio delta events on `send`). `translate_in`: a client
    dialect's events -> ours, before validation. `x_events`: whether this client gets our own
    `x_...` events (the server sends them only to clients that ask; in-process transports
    such as the desktop keep them)."""

    def __init__(self, models: Models, settings: Settings, send: Send, metrics: VoiceMetrics | None = None,
                 open_sink: OpenSink | None = None, translate_in: Callable[[Any], Any] | None = None,
                 x_events: bool = True):
        self.id = new_id("sess")
        self.x_events = x_events
        self.models = models
        self.settings = settings
        self.metrics = metrics or VoiceMetrics()
        self.options = SessionOptions.from_settings(settings, models.engine.takes_threshold)
        self.conversation = Conversation(max_items=settings.history_max_items, max_chars=settings.history_max_chars)
        self._fitter = ContextFitter(models.engine, settings.context_tokens)
        self.closed = False
        self._translate_in = translate_in
        self._send_raw = send
        self._send_lock = asyncio.Lock()
        self._open_sink = open_sink or (lambda ids: WireAudioSink(self._send, ids))
        self._speculation = Speculation(self.id, self._draft, self._discard, self._spawn)
        self._start_lock = asyncio.Lock()  # one response starts at a time: at most one is active
        self._active: Response | None = None
        self._playing: Response | None = None  # finished sending, maybe still playing at the client
        self._responses: set[Response] = set()  # every response not yet stopped, for close()
        self._tasks: set[asyncio.Task] = set()
        judge = EndOfTurnJudge(models.engine, self._conversation_with, settings.end_of_turn_threshold,
                               fit=lambda messages: self._fitter.fit(messages, reply_tokens=1))
        self.listener = Listener(self.id, models, self.options.turn_detection, settings.partial_interval_ms,
                                 self.conversation, self._send, self._spawn, hooks=self, judge=judge)
        self._handlers: dict[str, Callable[[Any], Awaitable[None]]] = {
            "session.update": self._on_session_update,
            "input_audio_buffer.append": self._on_input_audio_buffer_append,
            "input_audio_buffer.commit": self._on_input_audio_buffer_commit,
            "input_audio_buffer.clear": self._on_input_audio_buffer_clear,
            "conversation.item.create": self._on_conversation_item_create,
            "conversation.item.truncate": self._on_conversation_item_truncate,
            "response.create": self._on_response_create,
            "response.cancel": self._on_response_cancel,
            "output_audio_buffer.clear": self._on_output_audio_buffer_clear,
            "conversation.item.retrieve": self._on_conversation_item_retrieve,
            "conversation.item.delete": self._on_conversation_item_delete,
        }

    @property
    def active_response_id(self) -> str | None:
        return self._active.id if self._active is not None else None

    # ---- transport entry points ------------------------------------------------------------

    async def start(self) -> None:
        await self._send(p.server_event("session.created", session=self.session_shape()))

    async def handle_text(self, raw: str | bytes) -> None:
        """One wire message: parsed, validated, dispatched; a bad one gets an `error` event, and
        so does one the server fails on (a bug costs that event, never the session)."""
        event: BaseModel | None = None
        try:
            event = await self._parse(raw)
            await self.handle_event(event)
        except p.ProtocolError as error:
            await self.send_error(error)
        except Exception as exc:
            log.exception("session %s: handling a client event failed", self.id)
            name = getattr(event, "type", "the event")
            await self.send_error(p.ProtocolError(
                "server_error", f"the server failed to handle {name} ({type(exc).__name__}); the session goes on",
                None, getattr(event, "event_id", None), kind="server_error"))

    async def _parse(self, raw: str | bytes) -> BaseModel:
        args = (raw, self.settings.max_message_bytes, self._translate_in)
        if len(raw) > LARGE_MESSAGE_CHARS and len(raw) <= self.settings.max_message_bytes:
            return await asyncio.to_thread(p.parse_client_event, *args)
        return p.parse_client_event(*args)

    async def send_error(self, error: p.ProtocolError) -> None:
        log.info("session %s: client error %s: %r", self.id, error.code, error.message[:300])
        self.metrics.client_errors_total.inc()
        await self._send(p.error_event(error))

    async def handle_event(self, event: BaseModel) -> None:
        await self._handlers[event.type](event)  # type: ignore[attr-defined]

    async def push_pcm16(self, samples: np.ndarray, rate: int = WIRE_RATE) -> None:
        """Raw PCM16 mono input at any rate (the desktop transport calls this directly)."""
        await self.listener.push_pcm16(samples, rate)

    async def close(self) -> None:
        """Stops everything this session started; returns when no engine or TTS work is left."""
        self.closed = True
        self.listener.close()
        responses = list(self._responses)
        for response in responses:
            response.cancel()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*(r.wait_stopped() for r in responses), return_exceptions=True)
        log.info("session %s closed", self.id)

    # ---- sending ----------------------------------------------------------------------------

    async def _send(self, event: dict[str, Any], still_current: Callable[[], bool] | None = None) -> bool:
        """Sends one event; returns whether it went out. `still_current` (reply audio and its
        transcript: core/audio_sink.py) is asked under the send lock, right before the event is
        written: an event whose moment passed while it waited for the lock is dropped."""
        if self.closed or (not self.x_events and event["type"].startswith("x_")):
            return False
        async with self._send_lock:
            if still_current is not None and not still_current():
                return False
            try:
                await self._send_raw(event)
            except Exception as exc:  # the transport is gone; the transport's owner closes us
                log.info("session %s: send failed (%s); closing", self.id, exc)
                self.closed = True
                return False
        return True

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

    # ---- the user's turns (TurnHooks, called by the Listener) -------------------------------

    async def on_user_speaking(self, turn: UserTurn, speech_ms: int) -> None:
        """Barge-in: the user talks over a reply being produced or still playing. A reply still
        being produced pauses at once (its queued audio dropped) and waits for the words:
        `on_end_of_turn` resumes it after a cough or a "mm-hmm", cuts it otherwise."""
        active = self._active
        if active is not None and active.paused and turn.barged_in and speech_ms >= self.settings.barge_in_sure_ms:
            await self._interrupt(active, reason="turn_detected", send_cleared=False)  # talking on: no backchannel
            return
        if turn.barged_in or not self.options.turn_detection.interrupt_response:
            return
        playing = self._playing if self._playing is not None and self._playing.sink.left_ms() > 0 else None
        target = active or playing
        if target is None or speech_ms < self.settings.barge_in_min_speech_ms:
            return
        turn.barged_in = True
        target.clock.speech_started_at = turn.started_at
        self.metrics.barge_ins_total.inc()
        if target is not active:
            await self._cut_playback(target)
        elif self.settings.resume_false_interruptions:
            await self._pause(target)
        else:
            await self._interrupt(target, reason="turn_detected", send_cleared=True)

    def on_interim_transcript(self, text: str) -> None:
        self._speculation.redraft(text)

    def reply_paused(self) -> bool:
        return self._active is not None and self._active.paused

    async def on_end_of_turn(self, transcript: str, clock: TurnClock) -> None:
        paused = self._active if self._active is not None and self._active.paused else None
        if paused is not None and is_false_interruption(transcript, clock.speech_ms):
            log.info("session %s: %r over %s was no interruption: resuming it", self.id, transcript, paused.id)
            self.metrics.false_interruptions_total.inc()
            self._speculation.drop()
            self._spawn(paused.resume(), "resume")
            return
        if is_stop_command(transcript):
            await self._obey_stop(paused)
            return
        if paused is not None:
            await self._interrupt(paused, reason="turn_detected", send_cleared=False)
        if not transcript.strip() or not self.options.turn_detection.create_response or self._active is not None:
            self._speculation.drop()
            return
        await self._respond_to_turn(clock)

    async def _obey_stop(self, paused: Response | None) -> None:
        """"Stop.", "Never mind.": the reply is cut (paused, still being made, or still playing)
        and nothing answers the command; it and the cut reply leave the prompt."""
        self._speculation.drop()
        if paused is not None:
            await self._interrupt(paused, reason="turn_detected", send_cleared=False)
        elif self._active is not None:  # barge-in off, or too short to pause it: the words decide
            await self._interrupt(self._active, reason="turn_detected", send_cleared=True)
        elif self._playing is not None and self._playing.sink.left_ms() > 0:
            await self._cut_playback(self._playing)
        command = next((item for item in reversed(self.conversation.items) if item.role == "user"), None)
        if command is not None:
            self.conversation.dismiss(command)
        log.info("session %s: a stop command: the reply is cut and gets no answer", self.id)

    # ---- prompts and drafts (core/speculation.py decides which draft is the reply) ----------

    def _system_prompt(self, instructions: str) -> str:
        """The session's instructions, after the server's spoken-style defaults unless they
        already begin with them, are empty (the client wants no system prompt) or the
        setting is off."""
        base = self.settings.instructions
        if not self.settings.keep_spoken_style or not instructions or instructions.startswith(base):
            return instructions
        return f"{base} {instructions}"

    def _conversation_with(self, pending_user_text: str) -> list[dict[str, str]]:
        """The messages the engine would answer if the user's turn ended with this text."""
        return self.conversation.messages(self._system_prompt(self.options.instructions),
                                          pending_user_text=pending_user_text)

    async def _draft(self, text: str) -> Response | None:
        messages = self._conversation_with(text)
        try:
            return await self._start_response(messages, self.options.audio_out, self.options.max_output_tokens,
                                              None, text, background=True)
        except p.ProtocolError as error:  # it will fail again at end of turn, and be reported then
            log.info("session %s: no speculative draft: %s", self.id, error.message)
            return None

    def _discard(self, response: Response) -> None:
        response.cancel()
        self._spawn(self._forget_when_stopped(response), "forget")

    async def _respond_to_turn(self, clock: TurnClock) -> None:
        async with self._start_lock:
            if self._active is not None:  # a client's response.create came first
                self._speculation.drop()
                return
            await self._speculation.settle()
            messages = self.conversation.messages(self._system_prompt(self.options.instructions))
            response = self._speculation.take(messages)
            if response is not None:
                log.info("session %s: reusing the speculative draft %s", self.id, response.id)
            else:
                try:
                    response = await self._start_response(messages, self.options.audio_out,
                                                          self.options.max_output_tokens, None)
                except p.ProtocolError as error:
                    await self.send_error(error)
                    return
            await self._activate(response, clock)

    # ---- responses --------------------------------------------------------------------------

    async def _start_response(self, messages: list[dict[str, str]], audio_out: bool, reply_tokens: int,
                              event_id: str | None, source_text: str = "", background: bool = False) -> Response:
        """background: a speculative draft, which the engine steps only when no reply that is
        being heard needs the CPU (promoted when adopted)."""
        from dllm_engine.request import GenerationParams

        if not messages:
            raise p.ProtocolError("response_failed", "nothing to respond to: the conversation is empty and the "
                                  "instructions are empty", None, event_id)
        params = GenerationParams(max_new_tokens=reply_tokens, mode=self.options.engine_mode,
                                  threshold=self.options.engine_threshold,
                                  deadline_s=self.settings.reply_deadline_s, background=background)
        handle = await self._submit(messages, reply_tokens, params, event_id)
        try:
            response = Response(handle=handle, source_text=source_text or messages[-1]["content"],
                                audio_out=audio_out, synthesizer=self.models.voice(self.options.voice),
                                speculative_tts=self.settings.speculative_tts, speed=self.options.speed,
                                inactivity_timeout_s=self.settings.response_inactivity_timeout_s,
                                audio_lead_ms=self.settings.audio_lead_ms)
            response.prompt_messages = messages
            self._responses.add(response)
            response.start()
        except BaseException:
            handle.cancel()  # never leave an engine request that nobody reads
            raise
        return response

    async def _submit(self, messages: list[dict[str, str]], reply_tokens: int, params: Any,
                      event_id: str | None) -> Any:
        """Trims the prompt to the context and submits it on a worker thread: the chat template
        and the tokenizer never run on the event loop."""
        from dllm_engine.request import EngineError

        engine, fit = self.models.engine, self._fitter.fit
        try:
            return await submit_off_loop(lambda: engine.submit(fit(messages, reply_tokens), params))
        except (EngineError, ContextTooLong) as exc:
            raise p.ProtocolError("response_failed", f"the engine refused the request: {exc}", None, event_id) from exc

    async def _activate(self, response: Response, clock: TurnClock) -> None:
        log.debug("session %s: %s adopted", self.id, response.id)
        self._active = response
        response.sink = self._open_sink({"response_id": response.id, "output_index": 0, "item_id": response.item.id,
                                         "content_index": 0})
        previous = None
        if not response.out_of_band:
            previous = self.conversation.add(response.item)
            await announce_evictions(self.conversation, self._send)
        for event in response_started(response, previous):
            await self._send(event)
        response.adopt(self._send, self._on_response_finished, clock)

    # ---- barge-in and cancellation ----------------------------------------------------------

    async def _interrupt(self, response: Response, reason: str, send_cleared: bool) -> None:
        """Cuts a response off: stop the work, drop the queued audio (the client's too), then
        keep in the history only what the listener heard."""
        response.cancel()
        if send_cleared:
            heard_ms = response.sink.clear()
            await self._send_cleared(response)
        else:
            heard_ms = response.sink.heard_ms()
        if response.audio_out:
            response.item.truncate_to_heard(heard_ms)
        else:
            response.item.text, response.item.status = response.spoken_text, "incomplete"
        log.info("session %s: response %s cut off (%s) after %.0f ms heard: %r",
                 self.id, response.id, reason, heard_ms, response.item.text)
        await self._end_response(response, "cancelled", reason)
        self._spawn(self._forget_when_stopped(response), "forget")  # once its TTS job has stopped

    async def _pause(self, response: Response) -> None:
        heard_ms = response.sink.clear()
        response.pause(heard_ms)
        await self._send_cleared(response)
        log.info("session %s: %s paused after %.0f ms heard: the user talks over it", self.id, response.id, heard_ms)

    async def _cut_playback(self, response: Response) -> None:
        """Barge-in after the response was fully sent but while it still plays: the queued
        audio is dropped, and the history keeps only what was heard."""
        self._playing = None
        heard_ms = response.sink.clear()
        await self._send_cleared(response)
        response.item.truncate_to_heard(heard_ms)
        log.info("session %s: playback of %s cut after %.0f ms: %r", self.id, response.id, heard_ms,
                 response.item.text)
        await self._send(p.server_event("conversation.item.truncated", item_id=response.item.id,
                                        content_index=0, audio_end_ms=int(heard_ms)))
        await self._report_turn_metrics(response)

    async def _send_cleared(self, response: Response) -> None:
        """Tells the client to drop the response's queued audio; its sink was cleared just
        before, so no audio decided before this event can follow it."""
        response.clock.cleared_at = time.monotonic()
        await self._send(p.server_event("output_audio_buffer.cleared", response_id=response.id))

    async def _forget_when_stopped(self, response: Response) -> None:
        await response.wait_stopped()
        self._responses.discard(response)

    # ---- the end of a response --------------------------------------------------------------

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
        response.clock.done_at = response.clock.done_at or time.monotonic()
        for event in response_ended(response, status, reason):
            await self._send(event)
        await self._report_turn_metrics(response)

    async def _report_turn_metrics(self, response: Response) -> None:
        report = turn_report(response)
        # a barge-in during playback reports the turn a second time: count its latencies once
        self.metrics.observe_turn(report, first_report=not response.metrics_reported)
        response.metrics_reported = True
        log.info("session %s turn metrics: %s", self.id, report)
        await self._send(p.server_event("x_turn.metrics", **report))

    def session_shape(self) -> dict[str, Any]:
        shape = self.options.shape(self.id, getattr(self.models.engine, "model_name", "unknown"),
                                   self.models.transcriber.model_name)
        if self.x_events:  # our extension, shown to the clients that asked for ours
            shape["x_engine"] = self.options.engine_shape()
        return shape

