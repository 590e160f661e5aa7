"""Issue 17, on the session with scripted models: what voice-agent frameworks send by default
works, a refused setting never drops the rest of a session.update, items can be retrieved and
deleted, response.create's metadata / conversation / input, usage, and the x_... opt-in."""

from __future__ import annotations

import json

import numpy as np

from voice_app.core.session import Session
from voice_app.settings import Settings

from ..clients import EventLog, silence, stream_audio
from ..fakes import ScriptedEngine, ScriptedModels, ScriptedPlayer
from .test_session import END_OF_TURN, LONG_REPLY, QUESTION, is_done, make_session, text_turn

# what openai-agents 0.24 sends first (RealtimeRunner defaults), and LiveKit's RealtimeModel
AGENTS_SESSION = {
    "type": "realtime", "model": "gpt-realtime-2.1", "output_modalities": ["audio"], "tools": [],
    "instructions": "You are a helpful voice assistant.",
    "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000},
                        "transcription": {"model": "gpt-4o-mini-transcribe"},
                        "turn_detection": {"type": "semantic_vad", "interrupt_response": True}},
              "output": {"voice": "ash", "format": {"type": "audio/pcm", "rate": 24000}}}}
LIVEKIT_SESSION = {
    "type": "realtime", "model": "gpt-realtime", "output_modalities": ["audio"], "max_output_tokens": "inf",
    "tool_choice": "auto", "tracing": None, "truncation": "auto",
    "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000}, "noise_reduction": None,
                        "transcription": {"model": "gpt-4o-mini-transcribe"},
                        "turn_detection": {"type": "semantic_vad", "create_response": True, "eagerness": "auto",
                                           "interrupt_response": True}},
              "output": {"format": {"type": "audio/pcm", "rate": 24000}, "speed": 1.0, "voice": "marin"}}}


async def update(session: Session, log: EventLog, config: dict) -> list[dict]:
    start = len(log.events)
    await session.handle_text(json.dumps({"type": "session.update", "event_id": "upd_1", "session": config}))
    await log.wait_for(lambda e: e["type"] == "session.updated", start=start)
    return log.events[start:]


async def test_framework_default_session_updates_apply_whole_and_without_errors():
    for config, voice in ((AGENTS_SESSION, "ash"), (LIVEKIT_SESSION, "marin")):
        session, log, _ = make_session()
        events = await update(session, log, config)
        assert [e["type"] for e in events] == ["session.updated"], events
        shape = events[-1]["session"]
        assert shape["audio"]["output"]["voice"] == voice
        assert shape["audio"]["input"]["turn_detection"]["type"] == "semantic_vad"
        events = await update(session, log, {"type": "realtime", "tracing": "auto"})  # the agents SDK's second
        assert [e["type"] for e in events] == ["session.updated"]
        await session.close()


async def test_one_refused_setting_is_named_and_every_other_one_applies():
    session, log, _ = make_session()
    events = await update(session, log, {
        **AGENTS_SESSION, "instructions": "Be terse.", "max_output_tokens": 40,
        "tools": [{"type": "function", "name": "get_weather", "parameters": {}}],
        "audio": {"input": {"format": {"type": "audio/pcmu"}, "turn_detection": {"type": "server_vad",
                                                                                 "silence_duration_ms": 700}},
                  "output": {"voice": "ash", "speed": 9}}})
    error, updated = events
    assert error["type"] == "error" and error["error"]["event_id"] == "upd_1"
    assert error["error"]["param"] == "audio.input.format, audio.output.speed, tools"
    message = error["error"]["message"]
    assert "function calling is not supported" in message and "audio/pcmu" in message
    assert ("applied: instructions, output_modalities, max_output_tokens, audio.input.turn_detection, "
            "audio.output.voice") in message
    shape = updated["session"]
    assert shape["instructions"] == "Be terse." and shape["max_output_tokens"] == 40
    assert shape["audio"]["input"]["turn_detection"]["silence_duration_ms"] == 700
    assert shape["audio"]["output"]["speed"] == 1.0 and shape["audio"]["input"]["format"]["rate"] == 24000
    # only unsupported things refused: its own code
    events = await update(session, log, {"prompt": {"id": "pmpt_123"}})
    assert events[0]["error"]["code"] == "unsupported_value" and events[0]["error"]["param"] == "prompt"
    assert "nothing else was changed" in events[0]["error"]["message"]
    # and the session goes on
    await session.handle_text(text_turn("Hello."))
    await session.handle_text(json.dumps({"type": "response.create"}))
    assert (await log.wait_for(is_done()))["response"]["status"] == "completed"
    await session.close()


async def test_items_can_be_retrieved_and_deleted_and_unknown_ids_are_named():
    player = ScriptedPlayer(position_ms=0)
    session, log, models = make_session(player=player)
    await session.handle_text(text_turn("Hello there."))
    user_id = log.of_type("conversation.item.added")[0]["item"]["id"]
    await session.handle_text(json.dumps({"type": "response.create"}))
    done = await log.wait_for(is_done())
    reply_id = done["response"]["output"][0]["id"]
    await session.handle_text(json.dumps({"type": "conversation.item.truncate", "item_id": reply_id,
                                          "content_index": 0, "audio_end_ms": 500}))
    await session.handle_text(json.dumps({"type": "conversation.item.retrieve", "item_id": reply_id}))
    retrieved = await log.wait_for(lambda e: e["type"] == "conversation.item.retrieved")
    assert retrieved["item"]["id"] == reply_id and retrieved["item"]["status"] == "incomplete"
    assert retrieved["item"]["content"] == [{"type": "output_audio", "transcript": "You said"}]  # as truncated
    await session.handle_text(json.dumps({"type": "conversation.item.retrieve", "item_id": user_id}))
    user = (await log.wait_for(lambda e: e["type"] == "conversation.item.retrieved" and e["item"]["id"] == user_id))
    assert user["item"]["role"] == "user" and user["item"]["content"][0]["text"] == "Hello there."

    await session.handle_text(json.dumps({"type": "conversation.item.retrieve", "item_id": "item_nope",
                                          "event_id": "r9"}))
    error = log.events[-1]["error"]
    assert (error["code"], error["param"], error["event_id"]) == ("item_not_found", "item_id", "r9")
    assert "item_nope" in error["message"]

    await session.handle_text(json.dumps({"type": "conversation.item.delete", "item_id": user_id}))
    assert log.events[-1] == {**log.events[-1], "type": "conversation.item.deleted", "item_id": user_id}
    assert [item.id for item in session.conversation.items] == [reply_id]
    await session.handle_text(json.dumps({"type": "conversation.item.delete", "item_id": user_id}))
    assert log.events[-1]["error"]["code"] == "item_not_found"
    await session.close()


async def test_a_reply_in_progress_can_be_retrieved_but_not_deleted():
    models = ScriptedModels(engine=ScriptedEngine(reply=lambda m: LONG_REPLY, hold_after_words=10))
    session, log, _ = make_session(models)
    await session.handle_text(text_turn("Count."))
    await session.handle_text(json.dumps({"type": "response.create"}))
    delta = await log.wait_for(lambda e: e["type"] == "response.output_audio_transcript.delta")
    await session.handle_text(json.dumps({"type": "conversation.item.retrieve", "item_id": delta["item_id"]}))
    retrieved = await log.wait_for(lambda e: e["type"] == "conversation.item.retrieved")
    assert retrieved["item"]["status"] == "in_progress"
    assert retrieved["item"]["content"][0]["transcript"].startswith("One two three four five.")
    await session.handle_text(json.dumps({"type": "conversation.item.delete", "item_id": delta["item_id"]}))
    assert "cancel it first" in log.events[-1]["error"]["message"]
    await session.close()


async def test_response_metadata_is_echoed_and_done_carries_usage():
    session, log, models = make_session()
    await session.handle_text(text_turn("Hello."))
    await session.handle_text(json.dumps({"type": "response.create", "event_id": "response_create_abc",
                                          "response": {"metadata": {"client_event_id": "response_create_abc"},
                                                       "output_modalities": ["text"]}}))
    created = await log.wait_for(lambda e: e["type"] == "response.created")
    done = await log.wait_for(is_done())
    assert created["response"]["metadata"] == {"client_event_id": "response_create_abc"}
    assert done["response"]["metadata"] == {"client_event_id": "response_create_abc"}
    usage = done["response"]["usage"]
    assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]
    assert usage["output_token_details"]["text_tokens"] == usage["output_tokens"]
    assert log.of_type("response.output_text.done") and not log.of_type("response.output_audio.delta")
    await session.handle_text(json.dumps({"type": "response.create", "response": {"metadata": {"k": 5}}}))
    assert log.events[-1]["error"]["param"] == "response.metadata.k"
    await session.close()


async def test_an_out_of_band_reply_with_its_own_input_stays_out_of_the_conversation():
    session, log, models = make_session()
    await session.handle_text(text_turn("Hello there."))
    user_id = log.of_type("conversation.item.added")[0]["item"]["id"]
    await session.handle_text(json.dumps({"type": "response.create", "response": {
        "conversation": "none", "output_modalities": ["text"], "metadata": {"topic": "classify"},
        "instructions": "Classify.",
        "input": [{"type": "item_reference", "id": user_id},
                  {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Is it a greeting?"}]}]}}))
    done = await log.wait_for(is_done())
    assert done["response"]["status"] == "completed" and done["response"]["metadata"] == {"topic": "classify"}
    prompt = models.engine.submitted.items[-1]
    assert [m["content"] for m in prompt[1:]] == ["Hello there.", "Is it a greeting?"]
    assert prompt[0]["role"] == "system" and prompt[0]["content"].endswith("Classify.")
    assert [item.id for item in session.conversation.items] == [user_id], "the conversation does not keep it"
    assert len(log.of_type("conversation.item.added")) == 1 and len(log.of_type("conversation.item.done")) == 1
    await session.handle_text(json.dumps({"type": "response.create", "response": {
        "conversation": "none", "input": [{"type": "item_reference", "id": "item_gone"}]}}))
    error = log.events[-1]["error"]
    assert error["code"] == "item_not_found" and error["param"] == "response.input.0.id"
    await session.close()


async def test_x_events_go_only_to_a_client_that_asks():
    models = ScriptedModels()
    for asked in (False, True):
        log = EventLog()
        session = Session(models, Settings(partial_interval_ms=50, turn_detection="server_vad", audio_lead_ms=0),
                          log.send, x_events=False)
        if asked:
            await session.handle_text(json.dumps({"type": "session.update", "session": {"x_events": True}}))
        await stream_audio(session.push_pcm16, np.concatenate([silence(0.2), models.speech.say(QUESTION),
                                                               END_OF_TURN]), realtime=False)
        await log.wait_for(is_done())
        await log.wait_for(lambda e: e["type"] == "x_turn.metrics", timeout=2) if asked else None
        x_types = {e["type"] for e in log.events if e["type"].startswith("x_")}
        if asked:  # a partial transcript comes only if a partial decode got its turn (busy cores)
            assert {"x_response.draft", "x_turn.metrics"} <= x_types <= {
                "x_response.draft", "x_turn.metrics", "x_input_audio_transcription.partial"}, x_types
        else:
            assert x_types == set(), x_types
        await session.close()
