"""The engine's scheduler fails or hangs under a running server (the real model, on an engine
of its own so the shared one lives on): /healthz says so, live responses end `failed`, new
ones are refused with a reason, and the server itself goes on serving."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
import websockets

from voice_app.speech.loaded_models import LoadedModels

from .test_server import health

pytestmark = pytest.mark.slow

LONG_ASK = {"type": "conversation.item.create", "item": {"type": "message", "role": "user", "content": [
    {"type": "input_text", "text": "Tell me a long story about a dragon and a knight."}]}}
TEXT_REPLY = {"type": "response.create", "response": {"output_modalities": ["text"], "max_output_tokens": 200}}


@pytest.fixture
def own_engine(engine):
    """A second engine on the loaded model: its scheduler may be broken without harm."""
    from dllm_engine.engine import Engine

    spare = Engine(engine.loaded)
    yield spare
    spare.close()


def server_on(make_server, voice_server, engine, **settings):
    shared = voice_server.voice_server.models
    models = LoadedModels(engine, shared.transcriber, shared.synthesizer, shared.vad)
    return make_server(models=models, **settings)


async def start_a_long_reply(ws) -> None:
    await ws.recv()  # session.created
    await ws.send(json.dumps(LONG_ASK))
    await ws.send(json.dumps(TEXT_REPLY))
    await next_of(ws, "x_response.draft")  # the engine is stepping it


async def next_of(ws, event_type: str, timeout_s: float = 120) -> dict:
    while (event := json.loads(await asyncio.wait_for(ws.recv(), timeout_s)))["type"] != event_type:
        pass
    return event


async def test_a_scheduler_that_fails_fails_live_responses_and_healthz_says_so(make_server, voice_server, own_engine):
    server = server_on(make_server, voice_server, own_engine)
    async with websockets.connect(f"{server.ws_url}/realtime?x_events=1") as ws:
        await start_a_long_reply(ws)

        def broken_schedule():
            raise RuntimeError("injected fault")

        own_engine.scheduler.schedule = broken_schedule
        done = await next_of(ws, "response.done")
        assert done["response"]["status"] == "failed"
        assert "injected fault" in done["response"]["status_details"]["error"]["message"]
        state = health(server, expect_status=503)
        assert state["ok"] is False and state["engine"]["alive"] is False
        assert "injected fault" in state["engine"]["failure"]
        await ws.send(json.dumps(TEXT_REPLY))
        error = await next_of(ws, "error")
        assert error["error"]["code"] == "response_failed" and "the engine failed" in error["error"]["message"]
    assert health(voice_server)["ok"], "the shared engine is untouched"


async def test_a_scheduler_that_hangs_ends_live_responses_after_the_inactivity_timeout(
        make_server, voice_server, own_engine):
    server = server_on(make_server, voice_server, own_engine, response_inactivity_timeout_s=3)
    release = threading.Event()
    real_schedule = own_engine.scheduler.schedule
    async with websockets.connect(f"{server.ws_url}/realtime?x_events=1") as ws:
        await start_a_long_reply(ws)

        def hung_schedule():
            release.wait()  # a forward pass that never returns
            return real_schedule()

        own_engine.scheduler.schedule = hung_schedule
        try:
            done = await next_of(ws, "response.done")
            assert done["response"]["status"] == "failed"
            assert "sent nothing for 3 s" in done["response"]["status_details"]["error"]["message"]
            # healthz tells a hung scheduler from a dead one: alive, its last step ever further back
            # (the response's clock started at its last update, a moment before the step ended)
            state = health(server)
            assert state["engine"]["alive"] and state["engine"]["seconds_since_last_step"] >= 2.5
            await asyncio.sleep(0.6)
            later = health(server)["engine"]
            assert later["alive"] and later["seconds_since_last_step"] > state["engine"]["seconds_since_last_step"]
        finally:
            own_engine.scheduler.schedule = real_schedule
            release.set()
