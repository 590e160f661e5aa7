"""Who may use the server (docs/security.md): the Host header, the page's Origin, an API token.

A browser lets any web page open a websocket to ws://127.0.0.1:8765, and a DNS-rebinding page
can even send plain HTTP requests to it under its own name. So, by default:

- **Host** must name this server: the loopback names when it listens on loopback, or the names
  in `allowed_hosts` (a rebinding page's requests carry its own name);
- **Origin**, which browsers send with every websocket and every cross-site request, must be the
  server's own (the page it serves, under whatever name it was opened) or one of
  `allowed_origins`; clients that are not browsers send none and pass;
- with `api_token` set, every /v1 client must present it: `Authorization: Bearer <token>`, or the
  websocket subprotocol `openai-insecure-api-key.<token>` (how the openai SDK passes its key in
  a browser). The page and /healthz, /metrics need no token.

`AccessPolicy.refusal(scope)` is the check, for any ASGI scope; `AccessMiddleware` applies it to
every HTTP request and websocket of the app, so a route added later is covered too.
"""

from __future__ import annotations

import hmac
import json
import logging
from dataclasses import dataclass
from typing import Any, Awaitable, Callable
from urllib.parse import urlsplit

log = logging.getLogger(__name__)

KEY_SUBPROTOCOL_PREFIX = "openai-insecure-api-key."
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
WILDCARD_BINDS = ("0.0.0.0", "::", "")
PROTECTED_PREFIX = "/v1/"  # the API: needs the token when one is set

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass(frozen=True)
class Refusal:
    status: int  # HTTP status of the refusal (the websocket handshake's too)
    code: str
    message: str

    def body(self) -> bytes:
        return json.dumps({"error": {"type": "invalid_request_error", "code": self.code,
                                     "message": self.message}}).encode()


class AccessPolicy:
    def __init__(self, bind_host: str, allowed_hosts: list[str] | None = None,
                 allowed_origins: list[str] | None = None, api_token: str | None = None):
        self.allowed_hosts = [h.lower() for h in allowed_hosts] if allowed_hosts else default_allowed_hosts(bind_host)
        self.allowed_origins = {normalized_origin(o) for o in allowed_origins or []}
        self.api_token = api_token or None

    @classmethod
    def from_settings(cls, settings: Any) -> "AccessPolicy":
        policy = cls(settings.host, settings.allowed_hosts, settings.allowed_origins, settings.api_token)
        if "*" in policy.allowed_hosts:
            log.warning("listening on %s with any Host header accepted: a page on another site can reach this "
                        "server by DNS rebinding; set --allowed-hosts (and --api-token)", settings.host)
        return policy

    def refusal(self, scope: Scope) -> Refusal | None:
        """Why this request or websocket may not proceed, or None when it may."""
        headers = _headers(scope)
        host = headers.get("host", "")
        if not self._host_allowed(host):
            return Refusal(400, "host_not_allowed", f"Host {host!r} is not a name of this server; allowed: "
                           f"{', '.join(self.allowed_hosts)} (the server's allowed_hosts setting)")
        origin = headers.get("origin")
        if origin is not None and not self._origin_allowed(origin, host):
            return Refusal(403, "origin_not_allowed", f"pages from {origin!r} may not use this server; it accepts "
                           "its own pages and the origins in its allowed_origins setting")
        if self.api_token and scope.get("path", "").startswith(PROTECTED_PREFIX):
            offered = presented_token(headers, scope.get("subprotocols") or [])
            if offered is None:
                return Refusal(401, "missing_api_key", "this server requires an API token: send "
                               "'Authorization: Bearer <token>' or the subprotocol 'openai-insecure-api-key.<token>'")
            if not hmac.compare_digest(offered.encode(), self.api_token.encode()):
                return Refusal(401, "invalid_api_key", "the API token is not the one this server was given")
        return None

    def _host_allowed(self, host: str) -> bool:
        name = host_name(host)
        return any(_name_matches(name, allowed) for allowed in self.allowed_hosts)

    def _origin_allowed(self, origin: str, host: str) -> bool:
        if "*" in self.allowed_origins or normalized_origin(origin) in self.allowed_origins:
            return True
        netloc = urlsplit(origin).netloc.lower() if "://" in origin else None
        return netloc is not None and netloc == host.lower()  # same origin: the page this server served


class AccessMiddleware:
    """Refuses, before any route runs, what `policy.refusal` refuses: an HTTP error with a JSON
    body naming what was wrong; for a websocket, the same as the handshake's answer."""

    def __init__(self, app: Callable[[Scope, Receive, Send], Awaitable[None]], policy: AccessPolicy):
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        refusal = self.policy.refusal(scope)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        log.info("refused %s %r from %s: %s", scope["type"], scope.get("path"), scope.get("client"), refusal.code)
        if scope["type"] == "http":
            await _send_http_refusal(refusal, send, "http.")
        elif "websocket.http.response" in scope.get("extensions", {}):
            await _send_http_refusal(refusal, send, "websocket.http.")
        else:
            await send({"type": "websocket.close", "code": 1008, "reason": refusal.message[:120]})


async def _send_http_refusal(refusal: Refusal, send: Send, prefix: str) -> None:
    headers = [(b"content-type", b"application/json")]
    if refusal.status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    await send({"type": f"{prefix}response.start", "status": refusal.status, "headers": headers})
    await send({"type": f"{prefix}response.body", "body": refusal.body()})


def choose_subprotocol(offered: list[str]) -> str | None:
    """`realtime` when offered, else the first offered that carries no key: a key-bearing
    subprotocol is never echoed back (it would show the key to whatever logs the response)."""
    if "realtime" in offered:
        return "realtime"
    return next((name for name in offered if not name.startswith(KEY_SUBPROTOCOL_PREFIX)), None)


def presented_token(headers: dict[str, str], subprotocols: list[str]) -> str | None:
    scheme, _, token = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return next((name[len(KEY_SUBPROTOCOL_PREFIX):] for name in subprotocols
                 if name.startswith(KEY_SUBPROTOCOL_PREFIX)), None)


def default_allowed_hosts(bind_host: str) -> list[str]:
    """Loopback names (and the bound address); any name when bound to every interface, where
    the names people use are unknown (docs/security.md: set allowed_hosts there)."""
    if bind_host in WILDCARD_BINDS:
        return ["*"]
    return sorted({*LOOPBACK_NAMES, bind_host.lower().strip("[]")})


def host_name(host: str) -> str:
    """The Host header without its port ("[::1]:8765" -> "::1")."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def normalized_origin(origin: str) -> str:
    return origin.strip().rstrip("/").lower()


def _name_matches(name: str, allowed: str) -> bool:
    if allowed == "*":
        return True
    if allowed.startswith("*."):
        return name.endswith(allowed[1:])
    return name == allowed


def _headers(scope: Scope) -> dict[str, str]:
    return {key.decode("latin-1").lower(): value.decode("latin-1") for key, value in scope.get("headers", [])}
