"""One client's websocket as a session's transport, with the limits that keep one client from
holding the server (docs/security.md):

- a send the client does not take within `send_timeout_s` (it stopped reading, and the socket's
  buffers are full) ends the session: its engine, TTS and ASR work stop, its slot frees;
- no client event for `idle_timeout_s`, or a session older than `max_session_s` (OpenAI's 60
  minutes), ends it with an `error` event naming why, then a normal close (1000).

It also watches the events it carries to tell whether the session is `busy` (a reply in
progress, or the user's turn not yet answered): a draining server (docs/deploy.md) closes a
session once it is not.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from starlette.websockets import WebSocket

from voice_app.core.session import Session
from voice_app.realtime.beta_dialect import server_event_to_beta
from voice_app.events.protocol import ProtocolError, error_event
from voice_app.settings import Settings

log = logging.getLogger(__name__)

CLOSE_NORMAL = 1000
# after the user stops speaking, the reply's response.created comes within this long, or the
# turn was nothing to answer (an empty transcript)
TURN_ANSWER_WAIT_S = 3.0


class ClientGone(Exception):
    """The client stopped taking events (or its connection broke)."""


class WebSocketTransport:
    def __init__(self, websocket: WebSocket, settings: Settings, beta: bool):
        self.websocket = websocket
        self.settings = settings
        self.beta = beta  # speaks the Realtime API's beta dialect
        self._gone = asyncio.Event()
        self._ended_by_server: tuple[int, str] | None = None
        self._open_responses: set[str] = set()
        self._user_speaking = False
        self._unanswered_since: float | None = None  # the user stopped speaking, no reply created yet

    @property
    def busy(self) -> bool:
        """A reply is in progress, the user is talking, or the user's last words are still to be answered."""
        if self._open_responses or self._user_speaking:
            return True
        return self._unanswered_since is not None and time.monotonic() - self._unanswered_since < TURN_ANSWER_WAIT_S

    def _watch(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "response.created":
            self._open_responses.add(event["response"]["id"])
            self._unanswered_since = None
        elif kind == "response.done":
            self._open_responses.discard(event["response"]["id"])
        elif kind == "input_audio_buffer.speech_started":
            self._user_speaking, self._unanswered_since = True, None
        elif kind == "input_audio_buffer.speech_stopped":
            self._user_speaking, self._unanswered_since = False, time.monotonic()

    async def end_by_server(self, code: int, reason: str) -> None:
        """Closes the websocket with `code` (e.g. 1012 when the server drains); `pump` returns."""
        if self._ended_by_server is not None:
            return
        self._ended_by_server = (code, reason)
        self._gone.set()
        try:
            await asyncio.wait_for(self.websocket.close(code, reason[:120]), self.settings.send_timeout_s)
        except Exception as exc:  # the client is gone already
            log.info("closing a websocket with %d failed (%s)", code, type(exc).__name__)

    async def send(self, event: dict[str, Any]) -> None:
        """One server event; ClientGone once the client has not taken one for send_timeout_s."""
        if self._gone.is_set():
            raise ClientGone("the client is gone")
        self._watch(event)
        text = json.dumps(server_event_to_beta(event) if self.beta else event)
        try:
            await asyncio.wait_for(self.websocket.send_text(text), self.settings.send_timeout_s)
        except asyncio.TimeoutError:
            self._gone.set()
            raise ClientGone(f"the client took no event for {self.settings.send_timeout_s:g} s") from None
        except Exception:
            self._gone.set()
            raise

    async def pump(self, session: Session) -> None:
        """Hands the client's messages to the session until the client leaves or a limit ends it."""
        expires_at = time.monotonic() + self.settings.max_session_s
        while not session.closed:
            message = await self._next_message(session, expires_at)
            if message is None or message["type"] == "websocket.disconnect":
                return
            if message.get("text") is not None:
                await session.handle_text(message["text"])
            else:
                await session.send_error(ProtocolError(
                    "invalid_event", "binary frames are not accepted; send JSON events as text frames"))

    async def _next_message(self, session: Session, expires_at: float) -> dict[str, Any] | None:
        """The next message; None when the client stopped reading, idled out or the session expired."""
        timeout = max(0.0, min(self.settings.idle_timeout_s, expires_at - time.monotonic()))
        receive = asyncio.ensure_future(self.websocket.receive())
        gone = asyncio.ensure_future(self._gone.wait())
        try:
            done, _ = await asyncio.wait({receive, gone}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            if not receive.done():
                receive.cancel()
        if receive in done:
            return receive.result()
        if gone in done and self._ended_by_server is not None:
            log.info("session %s closed by the server (%d: %s)", session.id, *self._ended_by_server)
            return None
        if gone in done:
            log.info("session %s: the client stopped taking events; dropped", session.id)
            return None
        if time.monotonic() >= expires_at:
            await self._end(session, "session_expired",
                            f"the session reached its maximum length of {self.settings.max_session_s:g} s")
        else:
            await self._end(session, "session_idle_timeout",
                            f"no client event for {self.settings.idle_timeout_s:g} s")
        return None

    async def _end(self, session: Session, code: str, message: str) -> None:
        log.info("session %s ended: %s", session.id, message)
        try:
            await self.send(error_event(ProtocolError(code, message + "; reconnect to start a new session")))
            await asyncio.wait_for(self.websocket.close(CLOSE_NORMAL, message[:120]), self.settings.send_timeout_s)
        except Exception as exc:  # a client that is gone as well: nothing more to tell it
            log.info("session %s: could not say goodbye (%s)", session.id, type(exc).__name__)
