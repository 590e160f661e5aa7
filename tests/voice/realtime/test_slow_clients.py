"""Clients that read slowly, stop reading, idle, stay too long or come and go, against the real
server: the server drops the dead, serves the slow in bounded memory, ends sessions at their
limits with a reason, and churn leaves no engine, TTS or ASR work behind. The long churn run
(500 cycles) is scripts/fuzz_realtime.py --churn 500."""

from __future__ import annotations

import asyncio
import json

import pytest
import websockets

from voice_app.core.response import AUDIO_AHEAD_SENTENCES
from voice_app.loadtest.fuzz import churn

from ..clients import PacedClient
from .test_server import health, wait_until_idle

pytestmark = pytest.mark.slow

STORY = "Tell me a long story about a dragon and a knight."


def ws_url(server) -> str:
    return f"{server.ws_url}/realtime"


async def ask(client, text: str, max_output_tokens: int, modalities: list[str] | None = None) -> None:
    await client.send({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}})
    response = {"max_output_tokens": max_output_tokens}
    if modalities:
        response["output_modalities"] = modalities
    await client.send({"type": "response.create", "response": response})


async def test_a_client_that_stops_reading_is_dropped_and_leaves_nothing_running(make_server):
    server = make_server(send_timeout_s=2)
    client = await PacedClient(ws_url(server), receive_buffer=4096).open()
    await client.wait_for(lambda e: e["type"] == "session.created")
    await ask(client, STORY, max_output_tokens=200)
    await client.wait_for(lambda e: e["type"] == "response.output_audio.delta")
    client.stop_reading()  # the socket stays open: a frozen tab, not a closed one
    state = await wait_until_idle(server, timeout_s=90)
    assert (state["live_sessions"], state["engine_live_requests"], state["tts_live_jobs"], state["asr_live_jobs"]) \
        == (0, 0, 0, 0), state
    assert not [e for e in client.events if e["type"] == "response.done"], "dropped before the reply was taken"
    client.close()


async def test_a_slow_reader_gets_its_whole_reply_in_bounded_memory_and_others_are_served(make_server):
    server = make_server()
    slow = await PacedClient(ws_url(server), read_bytes_per_s=10_000).open()
    await slow.wait_for(lambda e: e["type"] == "session.created")
    await ask(slow, "What is the capital of France?", max_output_tokens=24)
    waiting: list[int] = []
    sampler = asyncio.create_task(sample_audio_waiting(server, waiting))
    async with websockets.connect(ws_url(server)) as other:  # a normal client meanwhile
        await other.recv()
        await other.send(json.dumps({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Say hello."}]}}))
        await other.send(json.dumps({"type": "response.create", "response": {"output_modalities": ["text"]}}))
        while (event := json.loads(await asyncio.wait_for(other.recv(), 120)))["type"] != "response.done":
            pass
        assert event["response"]["status"] == "completed"
    done = await slow.wait_for(lambda e: e["type"] == "response.done", timeout_s=240)
    sampler.cancel()
    assert done["response"]["status"] == "completed"
    audio = [e for e in slow.events if e["type"] == "response.output_audio.delta"]
    assert audio and slow.bytes_read > 50_000
    assert waiting and max(waiting) <= AUDIO_AHEAD_SENTENCES, "synthesis waits for the slow reader"
    slow.close()


async def sample_audio_waiting(server, samples: list[int]) -> None:
    while True:
        for session in list(server.voice_server.sessions):
            samples += [response.audio_waiting for response in list(session.replies.live)]
        await asyncio.sleep(0.05)


async def test_idle_and_overlong_sessions_end_with_a_reason(make_server):
    server = make_server(idle_timeout_s=1.0, max_session_s=3.0)
    async with websockets.connect(ws_url(server)) as idle:
        await idle.recv()
        error = json.loads(await asyncio.wait_for(idle.recv(), 30))
        assert error["error"]["code"] == "session_idle_timeout"
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await asyncio.wait_for(idle.recv(), 30)
        assert closed.value.rcvd.code == 1000
    async with websockets.connect(ws_url(server)) as busy:
        await busy.recv()
        quiet = json.dumps({"type": "input_audio_buffer.append", "audio": ""})
        while True:  # a client that keeps talking still meets the session's maximum length
            await busy.send(quiet)
            try:
                event = json.loads(await asyncio.wait_for(busy.recv(), 0.5))
            except asyncio.TimeoutError:
                continue
            if event["type"] == "error":
                break
        assert event["error"]["code"] == "session_expired" and "3 s" in event["error"]["message"]
    await wait_until_idle(server)


async def test_connect_speak_disconnect_churn_leaves_no_work_behind(make_server, test_audio):
    server = make_server(max_sessions=4)
    assert await churn(ws_url(server), test_audio["question"], cycles=12) == 0
    state = await wait_until_idle(server, timeout_s=90)
    assert (state["live_sessions"], state["engine_live_requests"], state["tts_live_jobs"], state["asr_live_jobs"]) \
        == (0, 0, 0, 0), state
    assert health(server)["engine"]["alive"]
