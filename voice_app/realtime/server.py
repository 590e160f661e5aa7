"""The HTTP server: the web page at `/`, the realtime websocket at `/v1/realtime`, OpenAI's
text API (`/v1/chat/completions`, `/v1/models`: chat_api.py), `/healthz`, `/metrics`.
Starlette on uvicorn (whose websockets run on the `websockets` package)."""

from __future__ import annotations

import logging
import contextlib
import os
import socket
import threading
import time
from typing import Any, AsyncIterator

import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles
from starlette.websockets import WebSocket

from voice_app.core.metrics import VoiceMetrics
from voice_app.core.session import Session
from voice_app.realtime.access import AccessMiddleware, AccessPolicy, choose_subprotocol
from voice_app.realtime.beta_dialect import client_event_to_ga, is_beta_client
from voice_app.realtime.chat_api import ChatApi
from voice_app.realtime.loop_lag import LoopLagMonitor
from voice_app.realtime.protocol import CLOSE_TRY_AGAIN_LATER, X_EVENTS_PARAM, wants_x_events
from voice_app.realtime.websocket_transport import WebSocketTransport
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
        self.metrics.add_gauge("voice_asr_live_jobs", "Transcriptions queued or running",
                               lambda: getattr(models.transcriber, "live_jobs", 0))
        self.metrics.add_gauge("voice_engine_alive", "1 while the engine's scheduler runs",
                               lambda: float(self.engine_health()["alive"]))
        self.loop_lag = LoopLagMonitor()
        self.metrics.add_gauge("voice_event_loop_lag_max_ms", "Worst event-loop lag of the last 10 s (ms)",
                               self.loop_lag.recent_max_ms)
        self.access = AccessPolicy.from_settings(settings)  # who may connect: docs/security.md
        # OpenAI's text API on the same engine, so one batch serves voice and text
        self.chat_api = ChatApi(models.engine, settings, self.metrics)

    def app(self) -> Starlette:
        routes = [
            Route("/healthz", self.healthz),
            Route("/metrics", self.prometheus),
            WebSocketRoute("/v1/realtime", self.realtime),
            *self.chat_api.routes(),
            Mount("/", StaticFiles(directory=self.settings.web_dir, html=True, check_dir=False), name="web"),
        ]
        return Starlette(routes=routes, middleware=[Middleware(AccessMiddleware, policy=self.access)],
                         lifespan=self._lifespan)

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self.loop_lag.start()
        yield
        await self.loop_lag.stop()

    def engine_health(self) -> dict[str, Any]:
        """The engine's own report (alive, failure, seconds_since_last_step, ...) where it has one."""
        health = getattr(self.models.engine, "health", None)
        return health() if health is not None else {"alive": True}

    async def healthz(self, request: Request) -> JSONResponse:
        """200 while the engine's scheduler runs, 503 once it has died (`engine.failure` says why)."""
        engine = self.engine_health()
        return JSONResponse({
            "ok": bool(engine["alive"]),
            "engine": engine,
            "models": self.models.describe(),
            "live_sessions": len(self.sessions),
            "max_sessions": self.settings.max_sessions,
            "engine_live_requests": getattr(self.models.engine, "live_requests", 0),
            "tts_live_jobs": self.models.synthesizer.live_jobs,
            "asr_live_jobs": getattr(self.models.transcriber, "live_jobs", 0),
            "event_loop_lag_ms": round(self.loop_lag.recent_max_ms(), 1),
        }, status_code=200 if engine["alive"] else 503)

    async def prometheus(self, request: Request) -> PlainTextResponse:
        return PlainTextResponse(self.metrics.render(), media_type="text/plain; version=0.0.4")

    async def realtime(self, websocket: WebSocket) -> None:
        # The openai SDK sends ?model= and an Authorization header; browsers send API keys as
        # subprotocols. AccessMiddleware has checked Host, Origin and (when set) the token.
        offered = websocket.scope.get("subprotocols") or []
        await websocket.accept(subprotocol=choose_subprotocol(offered))
        if len(self.sessions) >= self.settings.max_sessions:
            self.metrics.sessions_rejected.inc()
            await websocket.close(code=CLOSE_TRY_AGAIN_LATER,
                                  reason=f"server is at capacity ({self.settings.max_sessions} sessions); retry later")
            return
        beta = is_beta_client(dict(websocket.headers), offered)  # the pre-GA event names and fields
        transport = WebSocketTransport(websocket, self.settings, beta)
        session = Session(self.models, self.settings, send=transport.send, metrics=self.metrics,
                          translate_in=client_event_to_ga if beta else None,
                          x_events=wants_x_events(websocket.query_params.get(X_EVENTS_PARAM)))
        self.sessions.add(session)
        self.metrics.sessions_total.inc()
        log.info("session %s opened (model=%r, %s dialect, %d live)", session.id,
                 websocket.query_params.get("model", "")[:100], "beta" if beta else "GA", len(self.sessions))
        try:
            await session.start()
            await transport.pump(session)
        finally:
            self.sessions.discard(session)
            await session.close()


def uvicorn_config(app: Any, settings: Settings) -> uvicorn.Config:
    # Frames up to twice the event limit (bytes) reach the session, which answers with an
    # `error` event; only beyond that does the websocket layer close the connection (code 1009).
    return uvicorn.Config(app, host=settings.host, port=settings.port, log_level="info",
                          ws_max_size=settings.max_message_bytes * 2 + 65536, ws_ping_interval=20,
                          lifespan="on")


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
