"""Who may use the server (docs/security.md), against the real server: a page from another
origin cannot open a session, a rebinding name is refused, the page's own origin works under
either loopback name, the optional token guards /v1, a key-bearing subprotocol never comes back."""

from __future__ import annotations

import http.client
import json

import pytest
import websockets
from websockets.exceptions import InvalidStatus

pytestmark = pytest.mark.slow


def port_of(server) -> int:
    return server.settings.port


def get(server, path: str, **headers: str) -> tuple[int, dict]:
    connection = http.client.HTTPConnection("127.0.0.1", port_of(server), timeout=10)
    connection.request("GET", path, headers=headers)
    reply = connection.getresponse()
    body = reply.read()
    connection.close()
    return reply.status, json.loads(body) if body.startswith(b"{") else {}


async def refused(url: str, **options) -> InvalidStatus:
    with pytest.raises(InvalidStatus) as info:
        async with websockets.connect(url, open_timeout=10, **options):
            pass
    return info.value


async def opens_a_session(url: str, **options) -> websockets.ClientConnection:
    ws = await websockets.connect(url, open_timeout=10, **options)
    assert json.loads(await ws.recv())["type"] == "session.created"
    return ws


async def test_a_page_from_another_origin_cannot_open_a_session(voice_server):
    url = f"ws://127.0.0.1:{port_of(voice_server)}/v1/realtime"
    error = await refused(url, origin="https://evil.example")
    assert error.response.status_code == 403
    assert "https://evil.example" in json.loads(error.response.body)["error"]["message"]


async def test_the_servers_own_page_connects_under_either_loopback_name(voice_server):
    port = port_of(voice_server)
    for name in ("127.0.0.1", "localhost"):
        ws = await opens_a_session(f"ws://{name}:{port}/v1/realtime", origin=f"http://{name}:{port}")
        await ws.close()
    ws = await opens_a_session(f"ws://127.0.0.1:{port}/v1/realtime")  # no Origin: not a browser (SDK, loadtest)
    await ws.close()


def test_a_rebinding_host_name_is_refused_and_healthz_shows_no_paths(voice_server):
    status, body = get(voice_server, "/healthz", Host=f"attacker.example:{port_of(voice_server)}")
    assert status == 400 and body["error"]["code"] == "host_not_allowed"
    status, body = get(voice_server, "/healthz", Origin="https://evil.example")
    assert status == 403
    status, health = get(voice_server, "/healthz")
    assert status == 200 and health["ok"] and health["engine"]["alive"]
    assert not [name for name in health["models"].values() if "/" in name], health["models"]


async def test_a_key_bearing_subprotocol_is_never_echoed(voice_server):
    url = f"ws://127.0.0.1:{port_of(voice_server)}/v1/realtime"
    ws = await opens_a_session(url, subprotocols=["openai-insecure-api-key.sk-secret", "openai-beta.realtime-v1"])
    assert ws.subprotocol == "openai-beta.realtime-v1"
    await ws.close()


async def test_an_api_token_guards_v1_but_not_the_page(make_server):
    server = make_server(api_token="tok-123")
    url = f"ws://127.0.0.1:{port_of(server)}/v1/realtime"
    assert (await refused(url)).response.status_code == 401
    wrong = await refused(url, additional_headers={"Authorization": "Bearer nope"})
    assert json.loads(wrong.response.body)["error"]["code"] == "invalid_api_key"
    ws = await opens_a_session(url, additional_headers={"Authorization": "Bearer tok-123"})
    await ws.close()
    ws = await opens_a_session(url, subprotocols=["realtime", "openai-insecure-api-key.tok-123"])
    assert ws.subprotocol == "realtime"
    await ws.close()
    assert get(server, "/")[0] == 200 and get(server, "/healthz")[0] == 200
