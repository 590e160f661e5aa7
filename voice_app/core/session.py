"""One conversation: client events and the user's turns -> responses, with speculation and barge-in.

Transport-agnostic: a transport hands in client events (`handle_text` for wire text,
`handle_event` for validated models, `push_pcm16` for raw audio), receives server events through
the async `send` callback, and plays reply audio through the AudioSink that `open_sink` gives
each response (default: `response.output_audio.delta` events on `send`). The user's side (VAD,
partial and final transcripts) is core/turns.py's `Listener`, which calls this session's
TurnHooks. What each client event does is core/client_events.py; the replies' lifecycle
(start, adopt, pause, cut, end) is core/replies.py. Everything here runs on one asyncio loop;
model work runs in the models' own threads.

Barge-in decisions are made here: `on_user_speaking` picks the reply being talked over and
pauses or cuts it, `on_end_of_turn` resumes a paused one after a cough or a "mm-hmm" and cuts
it otherwise (Replies does the cutting: the sink cleared, the history kept to what was heard).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable

import numpy as np
from pydantic import BaseModel

from voice_app.audio.pcm import WIRE_RATE
from voice_app.core.audio_sink import OpenSink, Send, WireAudioSink
from voice_app.core.client_events import ClientEvents
from voice_app.core.conversation import ContextFitter, Conversation, new_id
from voice_app.core.end_of_turn import EndOfTurnJudge, is_false_interruption, is_stop_command
from voice_app.core.head_warming import HeadWarmer
from voice_app.core.metrics import VoiceMetrics
from voice_app.core.models import Models
from voice_app.core.options import SessionOptions
from voice_app.core.replies import Replies
from voice_app.core.response import Response
from voice_app.core.speculation import Speculation
from voice_app.core.turns import Listener
from voice_app.core.user_turn import TurnClock, UserTurn
from voice_app.events import protocol as p
from voice_app.settings import Settings

log = logging.getLogger(__name__)

LARGE_MESSAGE_CHARS = 1 << 20  # parsed on a worker thread, not the event loop (~1 ms a MiB)


class Session:
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
        self._tasks: set[asyncio.Task] = set()
        self.head_warmer = HeadWarmer(models.engine, self._fitter, lambda: self._conversation_with(""),
                                      lambda: self.options.max_output_tokens, lambda: self.options.engine_mode)
        self.replies = Replies(self.id, models, settings, self.options, self.conversation, self._fitter, self.send,
                               open_sink or (lambda ids: WireAudioSink(self.send, ids)), self.spawn, self.metrics,
                               head_warmer=self.head_warmer)
        self.speculation = Speculation(self.id, self._draft, self.replies.discard, self.spawn)
        judge = EndOfTurnJudge(models.engine, self._conversation_with, settings.end_of_turn_threshold,
                               fit=lambda messages: self._fitter.fit(messages, reply_tokens=1))
        self.listener = Listener(self.id, models, self.options.turn_detection, settings.partial_interval_ms,
                                 self.conversation, self.send, self.spawn, hooks=self, judge=judge)
        self._client_events = ClientEvents(self)

    @property
    def active_response_id(self) -> str | None:
        return self.replies.active.id if self.replies.active is not None else None

    # ---- transport entry points ------------------------------------------------------------

    async def start(self) -> None:
        await self.send(p.server_event("session.created", session=self.session_shape()))

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
        await self.send(p.error_event(error))

    async def handle_event(self, event: BaseModel) -> None:
        await self._client_events.handle(event)

    async def push_pcm16(self, samples: np.ndarray, rate: int = WIRE_RATE) -> None:
        """Raw PCM16 mono input at any rate (the desktop transport calls this directly)."""
        await self.listener.push_pcm16(samples, rate)

    async def close(self) -> None:
        """Stops everything this session started; returns when no engine or TTS work is left."""
        self.closed = True
        self.listener.close()
        self.head_warmer.cancel()
        responses = self.replies.cancel_all()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await asyncio.gather(*(r.wait_stopped() for r in responses), return_exceptions=True)
        log.info("session %s closed", self.id)

    # ---- sending ----------------------------------------------------------------------------

    async def send(self, event: dict[str, Any], still_current: Callable[[], bool] | None = None) -> bool:
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

    def spawn(self, coro: Awaitable[Any], name: str) -> asyncio.Task:
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
        replies, active = self.replies, self.replies.active
        if active is not None and active.paused and turn.barged_in and speech_ms >= self.settings.barge_in_sure_ms:
            await replies.interrupt(active, reason="turn_detected", send_cleared=False)  # talking on: no backchannel
            return
        if turn.barged_in or not self.options.turn_detection.interrupt_response:
            return
        target = active or replies.still_playing()
        if target is None or speech_ms < self.settings.barge_in_min_speech_ms:
            return
        turn.barged_in = True
        target.clock.speech_started_at = turn.started_at
        self.metrics.barge_ins_total.inc()
        if target is not active:
            await replies.cut_playback(target)
        elif self.settings.resume_false_interruptions:
            await replies.pause(target)
        else:
            await replies.interrupt(target, reason="turn_detected", send_cleared=True)

    def on_interim_transcript(self, text: str) -> None:
        self.speculation.redraft(text)

    def reply_paused(self) -> bool:
        return self.replies.paused is not None

    def last_reply_text(self) -> str:
        if not self.settings.whisper_reply_context:
            return ""
        last = next((item for item in reversed(self.conversation.items) if item.role == "assistant"), None)
        return "" if last is None else self.replies.item_text(last)

    async def on_end_of_turn(self, transcript: str, clock: TurnClock) -> None:
        paused = self.replies.paused
        if paused is not None and is_false_interruption(transcript, clock.speech_ms):
            log.info("session %s: %r over %s was no interruption: resuming it", self.id, transcript, paused.id)
            self.metrics.false_interruptions_total.inc()
            self.speculation.drop()
            self.replies.resume(paused)
            return
        if is_stop_command(transcript):
            await self._obey_stop(paused)
            return
        if paused is not None:
            await self.replies.interrupt(paused, reason="turn_detected", send_cleared=False)
        if not transcript.strip() or not self.options.turn_detection.create_response or self.replies.active is not None:
            self.speculation.drop()
            return
        await self._respond_to_turn(clock)

    async def _obey_stop(self, paused: Response | None) -> None:
        """"Stop.", "Never mind.": the reply is cut (paused, still being made, or still playing)
        and nothing answers the command; it and the cut reply leave the prompt."""
        self.speculation.drop()
        replies = self.replies
        if paused is not None:
            await replies.interrupt(paused, reason="turn_detected", send_cleared=False)
        elif replies.active is not None:  # barge-in off, or too short to pause it: the words decide
            await replies.interrupt(replies.active, reason="turn_detected", send_cleared=True)
        elif replies.still_playing() is not None:
            await replies.cut_playback(replies.playing)
        command = next((item for item in reversed(self.conversation.items) if item.role == "user"), None)
        if command is not None:
            self.conversation.dismiss(command)
        log.info("session %s: a stop command: the reply is cut and gets no answer", self.id)

    # ---- prompts and drafts (core/speculation.py decides which draft is the reply) ----------

    def system_prompt(self, instructions: str) -> str:
        """The session's instructions, after the server's spoken-style defaults unless they
        already begin with them, are empty (the client wants no system prompt) or the
        setting is off."""
        base = self.settings.instructions
        if not self.settings.keep_spoken_style or not instructions or instructions.startswith(base):
            return instructions
        return f"{base} {instructions}"

    def _conversation_with(self, pending_user_text: str) -> list[dict[str, str]]:
        """The messages the engine would answer if the user's turn ended with this text."""
        return self.conversation.messages(self.system_prompt(self.options.instructions),
                                          pending_user_text=pending_user_text)

    async def _draft(self, text: str) -> Response | None:
        messages = self._conversation_with(text)
        try:
            return await self.replies.start(messages, self.options.audio_out, self.options.max_output_tokens,
                                            None, text, background=True)
        except p.ProtocolError as error:  # it will fail again at end of turn, and be reported then
            log.info("session %s: no speculative draft: %s", self.id, error.message)
            return None

    async def _respond_to_turn(self, clock: TurnClock) -> None:
        async with self.replies.start_lock:
            if self.replies.active is not None:  # a client's response.create came first
                self.speculation.drop()
                return
            await self.speculation.settle()
            messages = self.conversation.messages(self.system_prompt(self.options.instructions))
            response = self.speculation.take(messages)
            if response is not None:
                log.info("session %s: reusing the speculative draft %s", self.id, response.id)
            else:
                try:
                    response = await self.replies.start(messages, self.options.audio_out,
                                                        self.options.max_output_tokens, None)
                except p.ProtocolError as error:
                    await self.send_error(error)
                    return
            await self.replies.activate(response, clock)

    def session_shape(self) -> dict[str, Any]:
        shape = self.options.shape(self.id, getattr(self.models.engine, "model_name", "unknown"),
                                   self.models.transcriber.model_name)
        if self.x_events:  # our extension, shown to the clients that asked for ours
            shape["x_engine"] = self.options.engine_shape()
        return shape

