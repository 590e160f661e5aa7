"""EngineStream ends a streamed reply's engine requests at the ASGI disconnect, under either
ASGI spec Starlette distinguishes (< 2.4: Starlette listens too; 2.4: only a failed send would
tell it), while the reply is waiting on the engine and sends nothing."""

from __future__ import annotations

import asyncio

import pytest

from dllm_engine.request import RequestHandle
from voice_app.realtime.chat_api import EngineStream, Submitted


@pytest.mark.parametrize("spec_version", ["2.3", "2.4"])
async def test_a_disconnect_while_the_reply_waits_on_the_engine_cancels_its_request(spec_version):
    handle = RequestHandle(1)
    submitted = Submitted(chat=None, prompt_tokens=3, handles=[handle])
    first_chunk_sent = asyncio.Event()
    engine_never_answers = asyncio.Event()

    async def body():
        yield "data: {}\n\n"
        await engine_never_answers.wait()  # the reply waits for the engine's next update
        yield "data: [DONE]\n\n"

    async def receive():
        await first_chunk_sent.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        if message["type"] == "http.response.body" and message.get("body"):
            first_chunk_sent.set()

    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": spec_version}, "method": "POST"}
    response = EngineStream(body(), submitted, media_type="text/event-stream")
    serving = asyncio.create_task(response(scope, receive, send))
    await first_chunk_sent.wait()
    for _ in range(100):
        if handle.cancelled:
            break
        await asyncio.sleep(0)
    assert handle.cancelled, "the client left, but its engine request lives on"
    serving.cancel()
    await asyncio.gather(serving, return_exceptions=True)
