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
