"""The HTTP server: the web page at `/`, the realtime websocket at `/v1/realtime`, OpenAI's
text API (`/v1/chat/completions`, `/v1/models`: chat_api.py), `/healthz`, `/readyz`, `/metrics`.
Starlette on uvicorn (whose websockets run on the `websockets` package).

As one replica of many (docs/deploy.md): every reply names the replica (`x-voice-replica`),
`/readyz` says whether it takes a new session, and SIGTERM drains it (`DrainingServer`)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import signal
import socket
import threading
import time
from types import FrameType
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
from voice_app.events.protocol import CLOSE_TRY_AGAIN_LATER, X_EVENTS_PARAM, wants_x_events
from voice_app.realtime.websocket_transport import WebSocketTransport
from voice_app.settings import Settings
from voice_app.speech.loaded_models import LoadedModels

log = logging.getLogger(__name__)

REPLICA_HEADER = "x-voice-replica"
# a draining server's close code for its sessions: "service restart", reconnect (RFC 6455 / IANA)
CLOSE_SERVICE_RESTART = 1012


class VoiceServer:
    """Owns the shared models, the live sessions and the metrics; builds the ASGI app."""

    def __init__(self, settings: Settings, models: LoadedModels):
        self.settings = settings
        self.models = models
        self.metrics = VoiceMetrics()
        self.sessions: set[Session] = set()
        self.transports: dict[Session, WebSocketTransport] = {}
        self.replica = settings.replica_name or f"{socket.gethostname()}:{settings.port}"
        self.draining = False
        self.loop: asyncio.AbstractEventLoop | None = None
        self.metrics.add_gauge("voice_live_sessions", "Sessions connected now", lambda: len(self.sessions))
        self.metrics.add_gauge("voice_engine_live_requests", "Engine requests in flight",
                               lambda: getattr(models.engine, "live_requests", 0))
        self.metrics.add_gauge("voice_engine_kv_cache_bytes", "Bytes of the engine's KV pool blocks in use (listed "
                               "by live requests, or cached for later prompts)",
                               lambda: getattr(models.engine, "kv_cache_bytes", 0))
        self.metrics.add_gauge("voice_engine_kv_shared_ratio", "Block table entries per KV block live requests hold "
                               "(above 1: prompt heads shared, not copied)", lambda: _kv_shared_ratio(models.engine))
        self.metrics.add_gauge("voice_engine_kv_held_per_written_ratio", "Positions of the KV blocks live requests "
                               "hold per position written in them (1: no copies, no unused room)",
                               lambda: _kv_held_per_written(models.engine))
        self.metrics.add_gauge("voice_engine_kv_promised_bytes", "Bytes of KV blocks live requests may fill (their "
                               "longest replies; shared heads not counted)", lambda: _kv_promised_bytes(models.engine))
        self.metrics.add_gauge("voice_tts_live_jobs", "Sentences being synthesised",
                               lambda: models.tts_live_jobs)
        self.metrics.add_gauge("voice_asr_live_jobs", "Transcriptions queued or running",
                               lambda: getattr(models.transcriber, "live_jobs", 0))
        self.metrics.add_gauge("voice_engine_alive", "1 while the engine's scheduler runs",
                               lambda: float(self.engine_health()["alive"]))
        self.metrics.add_gauge("voice_draining", "1 while the server drains (refuses new sessions)",
                               lambda: float(self.draining))
        self.loop_lag = LoopLagMonitor()
        self.metrics.add_gauge("voice_event_loop_lag_max_ms", "Worst event-loop lag of the last 10 s (ms)",
                               self.loop_lag.recent_max_ms)
        self.access = AccessPolicy.from_settings(settings)  # who may connect: docs/security.md
        # OpenAI's text API on the same engine, so one batch serves voice and text
        self.chat_api = ChatApi(models.engine, settings, self.metrics)

    def app(self) -> Starlette:
        routes = [
            Route("/healthz", self.healthz),
            Route("/readyz", self.readyz),
            Route("/metrics", self.prometheus),
            WebSocketRoute("/v1/realtime", self.realtime),
            *self.chat_api.routes(),
            Mount("/", StaticFiles(directory=self.settings.web_dir, html=True, check_dir=False), name="web"),
        ]
        return Starlette(routes=routes, middleware=[Middleware(AccessMiddleware, policy=self.access)],
                         lifespan=self._lifespan)

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        self.loop = asyncio.get_running_loop()  # BackgroundServer.drain runs the drain on it
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
            "replica": self.replica,
            "draining": self.draining,
            "engine": engine,
            "models": self.models.describe(),
            "live_sessions": len(self.sessions),
            "max_sessions": self.settings.max_sessions,
            "engine_live_requests": getattr(self.models.engine, "live_requests", 0),
            "tts_live_jobs": self.models.tts_live_jobs,
            "asr_live_jobs": getattr(self.models.transcriber, "live_jobs", 0),
            "event_loop_lag_ms": round(self.loop_lag.recent_max_ms(), 1),
        }, status_code=200 if engine["alive"] else 503)

    def not_ready_reason(self) -> str | None:
        """Why a new session would be refused now, or None when one is welcome."""
        if self.draining:
            return "draining"
        if not self.engine_health()["alive"]:
            return "engine_dead"
        if len(self.sessions) >= self.settings.max_sessions:
            return "at_capacity"
        return None

    async def readyz(self, request: Request) -> JSONResponse:
        """200 while a new session would be taken (models loaded: the server listens only once
        they are; engine alive; below max_sessions; not draining), else 503 with the reason."""
        reason = self.not_ready_reason()
        return JSONResponse({"ready": reason is None, "reason": reason, "replica": self.replica,
                             "live_sessions": len(self.sessions), "max_sessions": self.settings.max_sessions},
                            status_code=200 if reason is None else 503)

    async def drain(self, grace_s: float | None = None) -> None:
        """Takes no new session; closes each live one with 1012 (service restart: reconnect) as
        soon as it is not busy (no reply in progress, no unanswered user turn), and every one
        left after `grace_s` (default: the drain_grace_s setting)."""
        grace_s = self.settings.drain_grace_s if grace_s is None else grace_s
        self.draining = True
        log.info("draining: %d live sessions, up to %.0f s for their replies to finish", len(self.sessions), grace_s)
        deadline = time.monotonic() + grace_s
        closing: dict[WebSocketTransport, asyncio.Future] = {}
        while True:
            overdue = time.monotonic() >= deadline
            for transport in list(self.transports.values()):
                if transport not in closing and (overdue or not transport.busy):
                    reason = "server restarting; reconnect" + (" (drain grace period over)" if overdue else "")
                    closing[transport] = asyncio.ensure_future(
                        transport.end_by_server(CLOSE_SERVICE_RESTART, reason))
            if overdue or not self.transports:
                break
            await asyncio.sleep(0.05)
        await asyncio.gather(*closing.values(), return_exceptions=True)
        log.info("drained")

    async def prometheus(self, request: Request) -> PlainTextResponse:
        return PlainTextResponse(self.metrics.render(), media_type="text/plain; version=0.0.4")

    async def realtime(self, websocket: WebSocket) -> None:
        # The openai SDK sends ?model= and an Authorization header; browsers send API keys as
        # subprotocols. AccessMiddleware has checked Host, Origin and (when set) the token.
        offered = websocket.scope.get("subprotocols") or []
        # Refusals are HTTP 503 handshake answers where the server can send them: nginx then
        # tries the next replica, and a client sees why in the JSON body and `retry-after`.
        if self.draining:
            await self._refuse(websocket, "draining", CLOSE_SERVICE_RESTART,
                               f"replica {self.replica} is shutting down; connect again (another replica will answer)")
            return
        if len(self.sessions) >= self.settings.max_sessions:
            await self._refuse(websocket, "at_capacity", CLOSE_TRY_AGAIN_LATER,
                               f"server is at capacity ({self.settings.max_sessions} sessions); retry later")
            return
        await websocket.accept(subprotocol=choose_subprotocol(offered))
        beta = is_beta_client(dict(websocket.headers), offered)  # the pre-GA event names and fields
        transport = WebSocketTransport(websocket, self.settings, beta)
        session = Session(self.models, self.settings, send=transport.send, metrics=self.metrics,
                          translate_in=client_event_to_ga if beta else None,
                          x_events=wants_x_events(websocket.query_params.get(X_EVENTS_PARAM)))
        self.sessions.add(session)
        self.transports[session] = transport
        self.metrics.sessions_total.inc()
        log.info("session %s opened (model=%r, %s dialect, %d live)", session.id,
                 websocket.query_params.get("model", "")[:100], "beta" if beta else "GA", len(self.sessions))
        try:
            await session.start()
            await transport.pump(session)
        finally:
            self.sessions.discard(session)
            self.transports.pop(session, None)
            await session.close()

    async def _refuse(self, websocket: WebSocket, code: str, close_code: int, message: str) -> None:
        self.metrics.sessions_rejected.inc()
        if "websocket.http.response" in websocket.scope.get("extensions", {}):
            await websocket.send_denial_response(JSONResponse(
                {"error": {"type": "server_error", "code": code, "message": message}},
                # uvicorn adds its default headers to accepted handshakes only: name the replica here
                status_code=503, headers={"retry-after": "1", REPLICA_HEADER: self.replica}))
        else:  # a server without the denial extension can only accept and close
            await websocket.accept()
            await websocket.close(code=close_code, reason=message[:120])


def _kv_stats(engine: Any) -> dict:
    return engine.kv_stats() if hasattr(engine, "kv_stats") else {}


def _kv_shared_ratio(engine: Any) -> float:
    stats = _kv_stats(engine)
    return stats["listed"] / stats["held"] if stats.get("held") else 1.0


def _kv_held_per_written(engine: Any) -> float:
    stats = _kv_stats(engine)
    return stats["held"] * stats["block_tokens"] / stats["held_positions"] if stats.get("held_positions") else 1.0


def _kv_promised_bytes(engine: Any) -> float:
    stats = _kv_stats(engine)
    return (stats["held"] + stats["reserved"]) * stats["block_bytes"] if stats else 0.0


def uvicorn_config(app: Any, settings: Settings, replica: str | None = None) -> uvicorn.Config:
    # Frames up to twice the event limit (bytes) reach the session, which answers with an
    # `error` event; only beyond that does the websocket layer close the connection (code 1009).
    # `replica`: sent as x-voice-replica on every HTTP reply and websocket handshake.
    headers = [(REPLICA_HEADER, replica)] if replica else []
    return uvicorn.Config(app, host=settings.host, port=settings.port, log_level="info",
                          ws_max_size=settings.max_message_bytes * 2 + 65536, ws_ping_interval=20,
                          lifespan="on", headers=headers, timeout_graceful_shutdown=10)


class DrainingServer(uvicorn.Server):
    """uvicorn, but SIGTERM / SIGINT drain first (VoiceServer.drain: /readyz 503, new sessions
    refused, live replies finish within drain_grace_s, sessions closed with 1012), then shut
    down as uvicorn does, and the process exits 0. A second signal skips what is left of the wait."""

    def __init__(self, config: uvicorn.Config, voice_server: VoiceServer):
        super().__init__(config)
        self.voice_server = voice_server
        self._drain_requested = False
        self._drain: asyncio.Task | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Not uvicorn's: it records the signal and raises it again once it has stopped, so a
        # drained server would still die of SIGTERM (exit 143) instead of exiting 0.
        if self._drain_requested:
            log.info("signal %d again: closing the sessions now", sig)
            self.should_exit = True
            if sig == signal.SIGINT:
                self.force_exit = True
        self._drain_requested = True  # acted on by on_tick, on the event loop

    async def on_tick(self, counter: int) -> bool:
        if self._drain_requested and self._drain is None:
            self._drain = asyncio.ensure_future(self.voice_server.drain())
            self._drain.add_done_callback(lambda _: setattr(self, "should_exit", True))
        return await super().on_tick(counter)

    async def shutdown(self, sockets: Any = None) -> None:
        if self._drain is not None and not self._drain.done():  # a second signal: no more waiting
            self._drain.cancel()
            await self.voice_server.drain(grace_s=0)
        await super().shutdown(sockets)


def serve(settings: Settings) -> None:
    if not os.path.isdir(settings.web_dir):
        log.warning("web directory %s not found: / will answer 404", settings.web_dir)
    models = LoadedModels.load(settings)
    try:
        voice_server = VoiceServer(settings, models)
        DrainingServer(uvicorn_config(voice_server.app(), settings, voice_server.replica), voice_server).run()
    finally:
        models.close()


class BackgroundServer:
    """Runs a VoiceServer on a free port in a thread (tests, the load generator)."""

    def __init__(self, settings: Settings, models: LoadedModels):
        if settings.port == 0:
            settings = settings.model_copy(update={"port": free_port(settings.host)})
        self.settings = settings
        self.voice_server = VoiceServer(settings, models)
        self._server = uvicorn.Server(uvicorn_config(self.voice_server.app(), settings, self.voice_server.replica))
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

    def drain(self, grace_s: float | None = None) -> "concurrent.futures.Future[None]":
        """Starts VoiceServer.drain on the server's loop (what SIGTERM does to `voice-app serve`);
        the server keeps running until stop()."""
        assert self.voice_server.loop is not None, "start() the server first"
        return asyncio.run_coroutine_threadsafe(self.voice_server.drain(grace_s), self.voice_server.loop)

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
