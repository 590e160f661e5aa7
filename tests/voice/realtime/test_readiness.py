"""/readyz and the replica's name on a real server (draining: tests/deploy/test_cluster.py, which
sends the real SIGTERM)."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request

import pytest
import websockets

pytestmark = pytest.mark.slow


def get(url: str) -> tuple[int, dict, dict]:
    """(status, JSON body, headers) of a GET, whatever the status."""
    try:
        with urllib.request.urlopen(url, timeout=10) as reply:
            return reply.status, json.loads(reply.read()), dict(reply.headers)
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read()), dict(error.headers)


async def test_readyz_is_503_at_max_sessions_and_200_again_when_a_slot_frees(make_server):
    server = make_server(max_sessions=1, replica_name="replica-under-test")
    status, body, headers = get(server.base_url + "/readyz")
    assert status == 200 and body["ready"] is True and body["reason"] is None
    assert headers["x-voice-replica"] == body["replica"] == "replica-under-test"

    async with websockets.connect(server.ws_url + "/realtime") as ws:
        assert ws.response.headers["x-voice-replica"] == "replica-under-test"  # the handshake names it too
        assert json.loads(await ws.recv())["type"] == "session.created"
        status, body, _ = get(server.base_url + "/readyz")
        assert (status, body["ready"], body["reason"]) == (503, False, "at_capacity")
        assert (body["live_sessions"], body["max_sessions"]) == (1, 1)
        # alive all the same: liveness and readiness are different questions
        status, health, _ = get(server.base_url + "/healthz")
        assert status == 200 and health["ok"] is True and health["draining"] is False
        assert health["replica"] == "replica-under-test"

    for _ in range(100):  # the server notices the close within a moment
        status, body, _ = get(server.base_url + "/readyz")
        if status == 200:
            break
        await asyncio.sleep(0.05)
    assert (status, body["ready"], body["live_sessions"]) == (200, True, 0)


def test_the_replica_name_defaults_to_host_and_port(make_server):
    import socket

    server = make_server()
    status, body, headers = get(server.base_url + "/readyz")
    assert status == 200
    assert headers["x-voice-replica"] == body["replica"] == f"{socket.gethostname()}:{server.settings.port}"


async def ask(ws, text: str, max_tokens: int) -> None:
    await ws.send(json.dumps({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}}))
    await ws.send(json.dumps({"type": "response.create",
                              "response": {"output_modalities": ["audio"], "max_output_tokens": max_tokens}}))


async def events_until_closed(ws, timeout_s: float) -> list[dict]:
    events = []

    async def read() -> None:
        async for message in ws:
            events.append(json.loads(message))

    with pytest.raises(websockets.ConnectionClosed):
        await asyncio.wait_for(read(), timeout_s)
    return events


async def test_draining_closes_an_idle_session_at_once_and_a_busy_one_when_the_grace_runs_out(make_server):
    server = make_server(replica_name="draining-replica")
    async with websockets.connect(server.ws_url + "/realtime") as idle, \
            websockets.connect(server.ws_url + "/realtime") as busy:
        for ws in (idle, busy):
            assert json.loads(await ws.recv())["type"] == "session.created"
        await ask(busy, "Tell me a very long story about a dragon and a knight.", 1000)
        while json.loads(await busy.recv())["type"] != "response.created":
            pass
        drained = server.drain(grace_s=2.0)
        started = asyncio.get_running_loop().time()

        idle_events = await events_until_closed(idle, 5)
        assert idle.close_code == 1012 and idle.close_reason == "server restarting; reconnect"
        assert asyncio.get_running_loop().time() - started < 1.5 and idle_events == []

        status, body, _ = get(server.base_url + "/readyz")
        assert (status, body["reason"]) == (503, "draining")
        status, health, _ = get(server.base_url + "/healthz")
        assert status == 200 and health["draining"] is True
        with pytest.raises(websockets.InvalidStatus) as refused:
            async with websockets.connect(server.ws_url + "/realtime"):
                pass
        assert refused.value.response.status_code == 503
        assert json.loads(refused.value.response.body)["error"]["code"] == "draining"
        assert refused.value.response.headers["x-voice-replica"] == "draining-replica"

        # a spoken reply is sent at the pace it is heard: a story outlasts a 2 s grace (as text,
        # the diffusion head makes 1000 tokens in 1.4 s, and SmolLM2's story repeats a sentence
        # a quarter of the way in, which ends the reply there)
        busy_events = await events_until_closed(busy, 10)
        assert busy.close_code == 1012 and busy.close_reason.endswith("(drain grace period over)")
        assert asyncio.get_running_loop().time() - started >= 1.9
        assert "response.done" not in {e["type"] for e in busy_events}
    await asyncio.wrap_future(drained)
    for _ in range(100):  # the closed session leaves, and its reply stops with it
        _, state, _ = get(server.base_url + "/healthz")
        if (state["live_sessions"], state["engine_live_requests"]) == (0, 0):
            break
        await asyncio.sleep(0.05)
    assert (state["live_sessions"], state["engine_live_requests"]) == (0, 0)
