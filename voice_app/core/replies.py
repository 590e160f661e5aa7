"""A session's replies from start to end: at most one is active (being produced), one may still be
playing at the client after it was all sent, and every one not yet stopped is tracked for close().

Starting one (the engine request, the Response that speaks it), adopting it as the active reply,
pausing it under the user's voice, cutting it (while produced or while still playing) and ending
it (the wire events and the turn's metrics) all happen here; the Session decides when.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from voice_app.core.audio_sink import OpenSink, Send
from voice_app.core.conversation import ContextFitter, ContextTooLong, Conversation, ConversationItem, \
    announce_evictions
from voice_app.core.head_warming import HeadWarmer
from voice_app.core.metrics import VoiceMetrics
from voice_app.core.models import Models
from voice_app.core.offload import submit_off_loop
from voice_app.core.options import SessionOptions
from voice_app.core.response import Response
from voice_app.core.response_events import response_ended, response_started, turn_report
from voice_app.core.user_turn import TurnClock
from voice_app.events import protocol as p
from voice_app.settings import Settings

log = logging.getLogger(__name__)


class Replies:
    def __init__(self, session_id: str, models: Models, settings: Settings, options: SessionOptions,
                 conversation: Conversation, fitter: ContextFitter, send: Send, open_sink: OpenSink, spawn,
                 metrics: VoiceMetrics, head_warmer: HeadWarmer | None = None):
        self.session_id = session_id
        self.models, self.settings, self.options = models, settings, options
        self.conversation, self._fitter = conversation, fitter
        self._send, self._open_sink, self._spawn, self.metrics = send, open_sink, spawn, metrics
        self.head_warmer = head_warmer  # prefills the next turn's head where it must be trimmed
        self.start_lock = asyncio.Lock()  # one reply starts at a time: at most one is active
        self.active: Response | None = None
        self.playing: Response | None = None  # finished sending, maybe still playing at the client
        self.live: set[Response] = set()  # every response not yet stopped, for close()

    @property
    def paused(self) -> Response | None:
        return self.active if self.active is not None and self.active.paused else None

    def still_playing(self) -> Response | None:
        """The reply sent in full whose audio the listener has not all heard yet."""
        return self.playing if self.playing is not None and self.playing.sink.left_ms() > 0 else None

    def forget_playback_of(self, item: ConversationItem) -> None:
        """The client stopped playing `item` or deleted it: no barge-in estimate overrides that."""
        if self.playing is not None and self.playing.item is item:
            self.playing = None

    def item_text(self, item: ConversationItem) -> str:
        """The item's text as the server holds it now (a reply being made: what was sent so far)."""
        active = self.active
        if active is not None and active.item is item and item.status == "in_progress":
            return active.spoken_text
        return item.text

    def cancel_all(self) -> list[Response]:
        """Cancels every reply not yet stopped (the session is closing); returns them to wait on."""
        responses = list(self.live)
        for response in responses:
            response.cancel()
        return responses

    # ---- starting and adopting ---------------------------------------------------------------

    async def start(self, messages: list[dict[str, str]], audio_out: bool, reply_tokens: int, event_id: str | None,
                    source_text: str = "", background: bool = False) -> Response:
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
            self.live.add(response)
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
        if self.head_warmer is not None:
            self.head_warmer.cancel()  # this turn's requests take the head over from here
        try:
            return await submit_off_loop(lambda: engine.submit(fit(messages, reply_tokens), params))
        except (EngineError, ContextTooLong) as exc:
            raise p.ProtocolError("response_failed", f"the engine refused the request: {exc}", None, event_id) from exc

    async def activate(self, response: Response, clock: TurnClock) -> None:
        log.debug("session %s: %s adopted", self.session_id, response.id)
        self.active = response
        response.sink = self._open_sink({"response_id": response.id, "output_index": 0, "item_id": response.item.id,
                                         "content_index": 0})
        previous = None
        if not response.out_of_band:
            previous = self.conversation.add(response.item)
            await announce_evictions(self.conversation, self._send)
        for event in response_started(response, previous):
            await self._send(event)
        response.adopt(self._send, self._on_finished, clock)

    def discard(self, response: Response) -> None:
        """A speculative draft nobody will hear."""
        response.cancel()
        self._spawn(self._forget_when_stopped(response), "forget")

    # ---- barge-in and cancellation ----------------------------------------------------------

    async def interrupt(self, response: Response, reason: str, send_cleared: bool) -> None:
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
                 self.session_id, response.id, reason, heard_ms, response.item.text)
        await self._end(response, "cancelled", reason)
        self._spawn(self._forget_when_stopped(response), "forget")  # once its TTS job has stopped

    async def pause(self, response: Response) -> None:
        heard_ms = response.sink.clear()
        response.pause(heard_ms)
        await self._send_cleared(response)
        log.info("session %s: %s paused after %.0f ms heard: the user talks over it", self.session_id, response.id,
                 heard_ms)

    def resume(self, response: Response) -> None:
        self._spawn(response.resume(), "resume")

    async def cut_playback(self, response: Response) -> None:
        """Barge-in after the response was fully sent but while it still plays: the queued
        audio is dropped, and the history keeps only what was heard."""
        self.playing = None
        heard_ms = response.sink.clear()
        await self._send_cleared(response)
        response.item.truncate_to_heard(heard_ms)
        log.info("session %s: playback of %s cut after %.0f ms: %r", self.session_id, response.id, heard_ms,
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
        self.live.discard(response)

    # ---- the end of a response --------------------------------------------------------------

    async def _on_finished(self, response: Response) -> None:
        if response.status == "completed":
            response.item.text, response.item.status = response.spoken_text, "completed"
            self.playing = response if response.audio_out else None
            if self.head_warmer is not None and not response.out_of_band:
                self._spawn(self.head_warmer.after_reply(), "prefill the next head")
        else:
            response.item.status = "incomplete"
        await self._end(response, response.status)
        self.live.discard(response)

    async def _end(self, response: Response, status: str, reason: str | None = None) -> None:
        if self.active is response:
            self.active = None
        response.clock.done_at = response.clock.done_at or time.monotonic()
        for event in response_ended(response, status, reason):
            await self._send(event)
        await self._report_turn_metrics(response)

    async def _report_turn_metrics(self, response: Response) -> None:
        report = turn_report(response)
        # a barge-in during playback reports the turn a second time: count its latencies once
        self.metrics.observe_turn(report, first_report=not response.metrics_reported)
        response.metrics_reported = True
        log.info("session %s turn metrics: %s", self.session_id, report)
        await self._send(p.server_event("x_turn.metrics", **report))
