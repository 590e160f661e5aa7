"""The HTTP server: the web page at `/`, the realtime websocket at `/v1/realtime`, `/healthz`,
`/metrics`. Starlette on uvicorn (whose websockets run on the `websockets` package)."""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.websockets import WebSocket

from voice_app.core.metrics import VoiceMetrics
from voice_app.core.session import Session
from voice_app.realtime.beta_dialect import client_event_to_ga, is_beta_client, server_event_to_beta
from voice_app.realtime.protocol import CLOSE_TRY_AGAIN_LATER, ProtocolError
from voice_app.settings import Settings
from voice_app.speech.loaded_models import LoadedModels

log = logging.getLogger(__name__)


class VoiceServer:
    """Owns the shared models, the live sessions and the metrics; builds the ASGI app."""

    def __init__(self, settings: Settings, models: LoadedModels):
        self.settings = settings
        self.models = models
        self.metrics = VoiceMetrics()
        self.sessions: set[Session] = set()
        self.metrics.add_gauge("voice_live_sessions", "Sessions connected now", lambda: len(self.sessions))
        self.metrics.add_gauge("voice_engine_live_requests", "Engine requests in flight",
                               lambda: getattr(models.engine, "live_requests", 0))
        self.metrics.add_gauge("voice_tts_live_jobs", "Sentences being synthesised",
                               lambda: models.synthesizer.live_jobs)

    def app(self) -> Starlette:
        routes = [
            Route("/healthz", self.healthz),
            Route("/metrics", self.prometheus),
            WebSocketRoute("/v1/realtime", self.realtime),
            Mount("/", StaticFiles(directory=self.settings.web_dir, html=True, check_dir=False), name="web"),
        ]
        return Starlette(routes=routes)

    async def healthz(self, request: Request) -> JSONResponse:
        return JSONResponse({
            "ok": True,
            "models": self.models.describe(),
            "live_sessions": len(self.sessions),
            "max_sessions": self.settings.max_sessions,
            "engine_live_requests": getattr(self.models.engine, "live_requests", 0),
            "tts_live_jobs": self.models.synthesizer.live_jobs,
        })

    async def prometheus(self, request: Request) -> PlainTextResponse:
        return PlainTextResponse(self.metrics.render(), media_type="text/plain; version=0.0.4")

    async def realtime(self, websocket: WebSocket) -> None:
        # The openai SDK sends ?model= and an Authorization header; browsers send API keys as
        # subprotocols. No key is required here: the server is meant for a trusted network.
        offered = websocket.scope.get("subprotocols") or []
        subprotocol = "realtime" if "realtime" in offered else (offered[0] if offered else None)
        await websocket.accept(subprotocol=subprotocol)
        if len(self.sessions) >= self.settings.max_sessions:
            self.metrics.sessions_rejected.inc()
            await websocket.close(code=CLOSE_TRY_AGAIN_LATER,
                                  reason=f"server is at capacity ({self.settings.max_sessions} sessions); retry later")
            return
        beta = is_beta_client(dict(websocket.headers), offered)  # the pre-GA event names and fields

        async def send(event: dict[str, Any]) -> None:
            await websocket.send_text(json.dumps(server_event_to_beta(event) if beta else event))

        session = Session(self.models, self.settings, send=send, metrics=self.metrics,
                          translate_in=client_event_to_ga if beta else None)
        self.sessions.add(session)
        self.metrics.sessions_total.inc()
        log.info("session %s opened (model=%s, %s dialect, %d live)", session.id,
                 websocket.query_params.get("model"), "beta" if beta else "GA", len(self.sessions))
        try:
            await session.start()
            await self._pump(websocket, session)
        finally:
            self.sessions.discard(session)
            await session.close()

    async def _pump(self, websocket: WebSocket, session: Session) -> None:
        while not session.closed:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                return
            if message.get("text") is not None:
                await session.handle_text(message["text"])
            else:
                await session.send_error(ProtocolError(
                    "invalid_event", "binary frames are not accepted; send JSON events as text frames"))


def uvicorn_config(app: Any, settings: Settings) -> uvicorn.Config:
    # Frames up to 4x the event limit reach the session, which answers with an `error` event;
    # only beyond that does the websocket layer close the connection (code 1009).
    return uvicorn.Config(app, host=settings.host, port=settings.port, log_level="info",
                          ws_max_size=settings.max_message_bytes * 4 + 65536, ws_ping_interval=20,
                          lifespan="off")


def serve(settings: Settings) -> None:
    if not os.path.isdir(settings.web_dir):
        log.warning("web directory %s not found: / will answer 404", settings.web_dir)
    models = LoadedModels.load(settings)
    try:
        uvicorn.Server(uvicorn_config(VoiceServer(settings, models).app(), settings)).run()
    finally:
        models.close()


class BackgroundServer:
    """Runs a VoiceServer on a free port in a thread (tests, the load generator)."""

    def __init__(self, settings: Settings, models: LoadedModels):
        if settings.port == 0:
            settings = settings.model_copy(update={"port": free_port(settings.host)})
        self.settings = settings
        self.voice_server = VoiceServer(settings, models)
        self._server = uvicorn.Server(uvicorn_config(self.voice_server.app(), settings))
        self._thread = threading.Thread(target=self._server.run, name="voice-server", daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://{self.settings.host}:{self.settings.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://{self.settings.host}:{self.settings.port}/v1"

    def start(self, timeout_s: float = 30.0) -> "BackgroundServer":
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"voice server did not start on {self.base_url}")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
