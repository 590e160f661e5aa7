"""Issue 17 over a real websocket on the real server and models: x_... events only for clients
that ask, a session.update with one bad setting, item retrieve / delete, and response.create's
metadata, out-of-band replies and usage."""

from __future__ import annotations

import asyncio
import json

import pytest
import websockets

pytestmark = pytest.mark.slow


async def until(ws, event_type: str, seen: list[dict], timeout_s: float = 120) -> dict:
    while True:
        event = json.loads(await asyncio.wait_for(ws.recv(), timeout_s))
        seen.append(event)
        if event["type"] == event_type:
            return event


def ask(text: str) -> str:
    return json.dumps({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}})


async def text_reply(ws, seen: list[dict], **response) -> dict:
    await ws.send(json.dumps({"type": "response.create", "response": {"output_modalities": ["text"],
                                                                      "max_output_tokens": 24, **response}}))
    return await until(ws, "response.done", seen)


@pytest.mark.parametrize("query, asked", [("", False), ("?x_events=1", True), ("?x_events=0", False)])
async def test_x_events_go_only_to_clients_that_ask(voice_server, query, asked):
    seen: list[dict] = []
    async with websockets.connect(voice_server.ws_url + "/realtime" + query) as ws:
        await until(ws, "session.created", seen)
        await ws.send(ask("Say hello."))
        done = await text_reply(ws, seen)
        if asked:
            await until(ws, "x_turn.metrics", seen)
    assert done["response"]["status"] == "completed"
    x_types = {e["type"] for e in seen if e["type"].startswith("x_")}
    assert x_types == ({"x_response.draft", "x_turn.metrics"} if asked else set()), x_types


async def test_a_bad_setting_items_and_response_options_over_the_wire(voice_server):
    seen: list[dict] = []
    async with websockets.connect(voice_server.ws_url + "/realtime") as ws:
        await until(ws, "session.created", seen)
        await ws.send(json.dumps({"type": "session.update", "event_id": "u1", "session": {
            "type": "realtime", "instructions": "Answer in one short sentence.", "tracing": "auto",
            "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}},
                      "output": {"voice": "marin"}}}}))
        error = await until(ws, "error", seen)
        updated = await until(ws, "session.updated", seen)
        assert error["error"]["param"] == "audio.input.format" and error["error"]["event_id"] == "u1"
        assert "applied: instructions, audio.output.voice" in error["error"]["message"]
        assert updated["session"]["instructions"] == "Answer in one short sentence."
        assert updated["session"]["audio"]["output"]["voice"] == "marin"

        await ws.send(ask("What is the capital of France?"))
        user = (await until(ws, "conversation.item.added", seen))["item"]
        done = await text_reply(ws, seen, metadata={"client_event_id": "gen_1"})
        created = [e for e in seen if e["type"] == "response.created"][-1]
        assert created["response"]["metadata"] == done["response"]["metadata"] == {"client_event_id": "gen_1"}
        usage = done["response"]["usage"]
        assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0
        reply = done["response"]["output"][0]

        await ws.send(json.dumps({"type": "conversation.item.retrieve", "item_id": reply["id"]}))
        retrieved = await until(ws, "conversation.item.retrieved", seen)
        assert retrieved["item"] == reply  # as the server holds it
        await ws.send(json.dumps({"type": "conversation.item.retrieve", "item_id": "item_missing"}))
        assert (await until(ws, "error", seen))["error"]["code"] == "item_not_found"

        # an out-of-band reply on its own input leaves the conversation as it was
        await text_reply(ws, seen, conversation="none", input=[
            {"type": "item_reference", "id": user["id"]},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Answer yes or no."}]}])
        await ws.send(json.dumps({"type": "conversation.item.delete", "item_id": user["id"]}))
        deleted = await until(ws, "conversation.item.deleted", seen)
        assert deleted["item_id"] == user["id"]
        await ws.send(json.dumps({"type": "conversation.item.retrieve", "item_id": user["id"]}))
        assert (await until(ws, "error", seen))["error"]["code"] == "item_not_found"
    added = [e["item"]["id"] for e in seen if e["type"] == "conversation.item.added"]
    assert added == [user["id"], reply["id"]], "the out-of-band reply was not added to the conversation"
    assert [e["error"]["code"] for e in seen if e["type"] == "error"] == ["invalid_value", "item_not_found",
                                                                          "item_not_found"]
