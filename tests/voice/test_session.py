"""Session logic against the real Whisper, Piper and Silero with a scripted engine."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from tests.voice.scripted_engine import ScriptedEngine
from tests.voice.session_driver import EventLog, silence, stream_audio
from voice_app.loaded_models import LoadedModels
from voice_app.session import Session
from voice_app.settings import DEFAULT_INSTRUCTIONS, Settings

pytestmark = pytest.mark.slow


def make_session(speech_models, engine: ScriptedEngine, **settings) -> tuple[Session, EventLog]:
    models = LoadedModels(engine, speech_models["transcriber"], speech_models["synthesizer"], speech_models["vad"])
    log = EventLog()
    return Session(models, Settings(**settings), log.send), log


async def test_spoken_question_gets_transcript_and_spoken_answer(speech_models, test_audio):
    engine = ScriptedEngine()
    session, log = make_session(speech_models, engine)
    await session.start()
    await stream_audio(session.push_pcm16, np.concatenate([silence(0.3), test_audio["question"], silence(1.0)]))
    done = await log.wait_for(lambda e: e["type"] == "response.done")

    transcript = log.of_type("conversation.item.input_audio_transcription.completed")[0]["transcript"]
    assert "capital of france" in transcript.lower()
    assert done["response"]["status"] == "completed"
    deltas = log.of_type("response.output_audio.delta")
    assert deltas and {d["response_id"] for d in deltas} == {done["response"]["id"]}
    spoken = log.of_type("response.output_audio_transcript.done")[0]["transcript"]
    assert spoken.startswith("You said") and "Goodbye now." in spoken
    assert log.of_type("x_input_audio_transcription.partial"), "partials while speaking"
    metrics = log.of_type("x_turn.metrics")[0]
    assert metrics["speech_stopped_to_first_audio_ms"] is not None
    assert metrics["barge_in_to_cleared_ms"] is None
    order = log.types()
    assert order.index("input_audio_buffer.speech_started") < order.index("input_audio_buffer.speech_stopped") \
        < order.index("response.created") < order.index("response.output_audio.delta") < order.index("response.done")
    assert [(i.role, i.text) for i in session.conversation.items] == [("user", transcript), ("assistant", spoken)]
    await session.close()


async def test_a_pause_starts_a_speculative_draft_before_the_turn_ends(speech_models, test_audio):
    engine = ScriptedEngine()
    # a long end-of-turn silence leaves the pause's decode ample time even on a loaded machine
    session, log = make_session(speech_models, engine, silence_duration_ms=1500)
    submitted_at_stop: list[int] = []
    original_send = log.send

    async def send(event):
        if event["type"] == "input_audio_buffer.speech_stopped":
            submitted_at_stop.append(len(engine.submitted))
        await original_send(event)

    session._send_raw = send
    await stream_audio(session.push_pcm16, np.concatenate([test_audio["question"], silence(2.0)]))
    await log.wait_for(lambda e: e["type"] == "response.done")
    assert submitted_at_stop[0] >= 1, "a draft was submitted while the user was still in the turn"
    transcript = log.of_type("conversation.item.input_audio_transcription.completed")[0]["transcript"]
    assert engine.submitted[-1][-1] == {"role": "user", "content": transcript}
    await session.close()


async def test_barge_in_clears_cancels_and_truncates(speech_models, test_audio):
    long_reply = lambda messages: " ".join(f"Sentence number {i} of a very long answer." for i in range(1, 30))
    engine = ScriptedEngine(reply=long_reply, step_s=0.15, words_per_step=3)
    session, log = make_session(speech_models, engine)
    await stream_audio(session.push_pcm16, np.concatenate([test_audio["question"], silence(0.8)]))
    first_delta = await log.wait_for(lambda e: e["type"] == "response.output_audio.delta")
    response_id = first_delta["response_id"]
    await asyncio.sleep(0.5)  # the listener hears some of it
    await stream_audio(session.push_pcm16, np.concatenate([test_audio["interrupt"], silence(1.0)]))
    done = await log.wait_for(lambda e: e["type"] == "response.done" and e["response"]["id"] == response_id)

    assert done["response"]["status"] == "cancelled"
    types = log.types()
    cleared_at = next(i for i, e in enumerate(log.events)
                      if e["type"] == "output_audio_buffer.cleared" and e["response_id"] == response_id)
    assert types.index("input_audio_buffer.speech_started", types.index("response.created")) < cleared_at
    assert not [e for e in log.events[cleared_at:]
                if e["type"] == "response.output_audio.delta" and e["response_id"] == response_id]
    assistant = session.conversation.items[1]
    assert assistant.role == "assistant" and assistant.status == "incomplete"
    assert 0 < len(assistant.text) < len(long_reply([])) // 2
    metrics = next(e for e in log.of_type("x_turn.metrics") if e["response_id"] == response_id)
    assert metrics["barge_in_to_cleared_ms"] is not None
    # the interruption is itself a turn, answered with the truncated history as context
    second = await log.wait_for(lambda e: e["type"] == "response.done" and e["response"]["id"] != response_id)
    assert second["response"]["status"] in ("completed", "cancelled")
    assert {"role": "assistant", "content": assistant.text} in engine.submitted[-1]
    await session.close()
    assert not [e for e in log.events[cleared_at:]
                if e["type"] == "response.output_audio.delta" and e["response_id"] == response_id]


async def test_text_turn_and_client_truncate(speech_models):
    engine = ScriptedEngine()
    session, log = make_session(speech_models, engine)
    await session.handle_text(json.dumps({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello there."}]}}))
    await session.handle_text(json.dumps({"type": "response.create"}))
    done = await log.wait_for(lambda e: e["type"] == "response.done")
    assert done["response"]["status"] == "completed"
    item_id = done["response"]["output"][0]["id"]
    await session.handle_text(json.dumps({"type": "conversation.item.truncate", "item_id": item_id,
                                          "content_index": 0, "audio_end_ms": 500}))
    truncated = await log.wait_for(lambda e: e["type"] == "conversation.item.truncated")
    assert truncated["audio_end_ms"] == 500
    item = session.conversation.find(item_id)
    assert item.status == "incomplete" and len(item.text.split()) < len(echo_words := engine.reply(
        [{"role": "user", "content": "Hello there."}]).split())
    await session.handle_text(json.dumps({"type": "response.create",
                                          "response": {"output_modalities": ["text"]}}))
    text_done = await log.wait_for(lambda e: e["type"] == "response.done", start=log.events.index(done) + 1)
    assert text_done["response"]["output_modalities"] == ["text"]
    assert log.of_type("response.output_text.delta")
    assert not [e for e in log.of_type("response.output_audio.delta")
                if e["response_id"] == text_done["response"]["id"]]
    assert echo_words
    await session.close()


async def test_close_mid_response_leaves_no_engine_or_tts_work(speech_models):
    engine = ScriptedEngine(reply=lambda m: "One two three four. " * 40, step_s=0.05, words_per_step=2)
    session, log = make_session(speech_models, engine)
    await session.handle_text(json.dumps({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Count."}]}}))
    await session.handle_text(json.dumps({"type": "response.create"}))
    await log.wait_for(lambda e: e["type"] == "response.output_audio.delta")
    await session.close()
    assert speech_models["synthesizer"].live_jobs == 0
    for _ in range(100):  # the engine thread notices the cancel flag at its next step
        if engine.live_requests == 0:
            break
        await asyncio.sleep(0.05)
    assert engine.live_requests == 0
    sent = len(log.events)
    await asyncio.sleep(0.3)
    assert len(log.events) == sent, "nothing is sent after close"


async def test_manual_turns_without_vad(speech_models, test_audio):
    engine = ScriptedEngine()
    session, log = make_session(speech_models, engine)
    await session.handle_text(json.dumps({"type": "session.update", "session": {
        "type": "realtime", "audio": {"input": {"turn_detection": None}}}}))
    updated = await log.wait_for(lambda e: e["type"] == "session.updated")
    assert updated["session"]["audio"]["input"]["turn_detection"] is None
    await session.handle_text(json.dumps({"type": "input_audio_buffer.commit"}))
    error = await log.wait_for(lambda e: e["type"] == "error")
    assert error["error"]["code"] == "input_audio_buffer_commit_empty"

    await stream_audio(session.push_pcm16, np.concatenate([test_audio["greeting"], silence(1.0)]), realtime=False)
    assert not log.of_type("input_audio_buffer.speech_started"), "no VAD turns when turned off"
    await session.handle_text(json.dumps({"type": "input_audio_buffer.commit"}))
    done = await log.wait_for(lambda e: e["type"] == "response.done")
    transcript = log.of_type("conversation.item.input_audio_transcription.completed")[0]["transcript"]
    assert "how are you" in transcript.lower() and done["response"]["status"] == "completed"

    await stream_audio(session.push_pcm16, test_audio["question"], realtime=False)
    await session.handle_text(json.dumps({"type": "input_audio_buffer.clear"}))
    await log.wait_for(lambda e: e["type"] == "input_audio_buffer.cleared")
    await session.handle_text(json.dumps({"type": "input_audio_buffer.commit"}))
    assert log.events[-1]["type"] == "error", "the cleared buffer holds nothing to commit"
    await session.close()


async def test_response_lifecycle_errors(speech_models):
    engine = ScriptedEngine(reply=lambda m: "Counting slowly now. " * 20, step_s=0.05)
    session, log = make_session(speech_models, engine)
    await session.handle_text(json.dumps({"type": "response.cancel"}))
    assert log.events[-1]["error"]["code"] == "response_cancel_not_active"
    await session.handle_text(json.dumps({"type": "conversation.item.truncate", "item_id": "nope",
                                          "content_index": 0, "audio_end_ms": 10}))
    assert log.events[-1]["error"]["param"] == "item_id"
    await session.handle_text(json.dumps({"type": "response.create"}))
    created = await log.wait_for(lambda e: e["type"] == "response.created")
    await session.handle_text(json.dumps({"type": "response.create", "event_id": "evt_7"}))
    error = log.of_type("error")[-1]
    assert error["error"]["code"] == "conversation_already_has_active_response"
    assert error["error"]["event_id"] == "evt_7"
    await session.handle_text(json.dumps({"type": "response.cancel", "response_id": created["response"]["id"]}))
    done = await log.wait_for(lambda e: e["type"] == "response.done")
    assert done["response"]["status"] == "cancelled"
    assert not log.of_type("output_audio_buffer.cleared"), "response.cancel alone does not clear"
    await session.close()


async def test_a_storm_of_mixed_events_never_breaks_the_session(speech_models, test_audio, caplog):
    """Seeded random interleaving of every client event, valid and not: each gets handled or an
    error event, no background task fails, and the session still answers at the end."""
    import base64
    import random

    engine = ScriptedEngine(step_s=0.01)
    session, log = make_session(speech_models, engine)
    rng = random.Random(7)
    speech = np.concatenate([test_audio["greeting"], silence(0.7)])
    audio_b64 = [base64.b64encode(speech[i:i + 2400].astype("<i2").tobytes()).decode()
                 for i in range(0, len(speech), 2400)]
    user_text = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi."}]}
    choices = [
        lambda: {"type": "input_audio_buffer.append", "audio": rng.choice(audio_b64)},
        lambda: {"type": "input_audio_buffer.commit"},
        lambda: {"type": "input_audio_buffer.clear"},
        lambda: {"type": "conversation.item.create", "item": user_text},
        lambda: {"type": "response.create", "response": {"output_modalities": rng.choice([["text"], ["audio"]])}},
        lambda: {"type": "response.cancel"},
        lambda: {"type": "output_audio_buffer.clear"},
        lambda: {"type": "conversation.item.truncate", "item_id": rng.choice(
            [i.id for i in session.conversation.items] or ["none"]), "content_index": 0,
            "audio_end_ms": rng.randint(0, 3000)},
        lambda: {"type": "session.update", "session": {"type": "realtime", "instructions": "Short."}},
        lambda: {"type": "no.such.event"},
        lambda: {"type": "input_audio_buffer.append", "audio": "A"},
    ]
    with caplog.at_level("ERROR"):
        for _ in range(300):
            await session.handle_text(json.dumps(rng.choice(choices)()))
            await asyncio.sleep(rng.choice([0, 0, 0.01, 0.03]))
        await asyncio.sleep(1.0)
        count = len(log.of_type("response.done"))
        if session._active is not None:
            await session.handle_text(json.dumps({"type": "response.cancel"}))
        await session.handle_text(json.dumps({"type": "conversation.item.create", "item": user_text}))
        await session.handle_text(json.dumps({"type": "response.create"}))
        await log.wait_for(lambda e: e["type"] == "response.done" and e["response"]["status"] == "completed",
                           start=len(log.events) - 1)
    assert not [r for r in caplog.records if r.name.startswith("voice_app")], "no task failed"
    assert count >= 1 and log.of_type("error")
    created = [e["response"]["id"] for e in log.of_type("response.created")]
    done = [e["response"]["id"] for e in log.of_type("response.done")]
    assert len(done) == len(set(done)) and set(done) <= set(created), "each response ends exactly once"
    await session.close()


def test_speech_speed_from_session_update_reaches_piper(speech_models):
    synthesizer = speech_models["synthesizer"]
    normal = len(synthesizer.synthesize_blocking("The capital of France is Paris."))
    fast = len(synthesizer.synthesize_blocking("The capital of France is Paris.", speed=2.0))
    assert fast < normal * 0.75
    synthesizer.synthesize_blocking("...")  # punctuation alone must not raise


@pytest.mark.parametrize("keep_spoken_style,instructions,expected", [
    (True, "You are Jarvis.", DEFAULT_INSTRUCTIONS + " You are Jarvis."),
    (True, DEFAULT_INSTRUCTIONS + " Be terse.", DEFAULT_INSTRUCTIONS + " Be terse."),  # not twice
    (True, "", None),  # the client asked for no system prompt
    (False, "You are Jarvis.", "You are Jarvis."),
])
async def test_client_instructions_follow_the_spoken_style_defaults(speech_models, keep_spoken_style, instructions,
                                                                    expected):
    engine = ScriptedEngine()
    session, log = make_session(speech_models, engine, keep_spoken_style=keep_spoken_style)
    await session.handle_text(json.dumps({"type": "session.update",
                                          "session": {"type": "realtime", "instructions": instructions}}))
    await session.handle_text(json.dumps({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello there."}]}}))
    await session.handle_text(json.dumps({"type": "response.create"}))
    await log.wait_for(lambda e: e["type"] == "response.done")
    system = [m["content"] for m in engine.submitted[-1] if m["role"] == "system"]
    assert system == ([expected] if expected is not None else [])
    assert log.of_type("session.updated")[0]["session"]["instructions"] == instructions  # echoed as given
    await session.close()
