"""The session on the real Whisper, Piper and Silero (a scripted engine, the default wire sink):
the paths test_session.py drives with scripted models, with the real ones."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from voice_app.core.session import Session
from voice_app.core.speculation import words
from voice_app.realtime.event_feed import audio_after_clear
from voice_app.settings import Settings
from voice_app.speech.loaded_models import LoadedModels

from ..clients import EventLog, silence, stream_audio
from ..fakes import ScriptedEngine

pytestmark = pytest.mark.slow


def make_session(speech_models, engine: ScriptedEngine, log: EventLog | None = None,
                 **settings) -> tuple[Session, EventLog]:
    models = LoadedModels(engine, speech_models["transcriber"], speech_models["synthesizer"], speech_models["vad"])
    log = log or EventLog()
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
    engine = ScriptedEngine(step_s=0.02)
    submitted_at_stop: list[int] = []
    log = EventLog(on_event=lambda e: submitted_at_stop.append(len(engine.submitted.items))
                   if e["type"] == "input_audio_buffer.speech_stopped" else None)
    # server_vad with a long end-of-turn silence leaves the pause's decode ample time even on a
    # loaded machine (semantic_vad may end a finished question as soon as the pause is judged)
    session, log = make_session(speech_models, engine, log, turn_detection="server_vad",
                                silence_duration_ms=1500)
    await stream_audio(session.push_pcm16, np.concatenate([test_audio["question"], silence(2.0)]))
    await log.wait_for(lambda e: e["type"] == "response.done")
    assert submitted_at_stop[0] >= 1, "a draft was submitted while the user was still in the turn"
    transcript = log.of_type("conversation.item.input_audio_transcription.completed")[0]["transcript"]
    last = engine.submitted.items[-1][-1]  # the draft's prompt: the same words (punctuation may differ)
    assert last["role"] == "user" and words(last["content"]) == words(transcript)
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
    assert audio_after_clear(log.events, response_id) == 0
    assistant = session.conversation.items[1]
    assert assistant.role == "assistant" and assistant.status == "incomplete"
    assert 0 < len(assistant.text) < len(long_reply([])) // 2
    metrics = next(e for e in log.of_type("x_turn.metrics") if e["response_id"] == response_id)
    assert metrics["barge_in_to_cleared_ms"] is not None
    # the interruption is itself a turn, answered from the history: the cut reply shows the
    # engine its whole sentences only, and the prompt ends with the new words
    second = await log.wait_for(lambda e: e["type"] == "response.done" and e["response"]["id"] != response_id)
    assert second["response"]["status"] in ("completed", "cancelled")
    prompt = engine.submitted.items[-1]
    assert prompt[-1]["role"] == "user" and "dogs" in prompt[-1]["content"].lower()
    assert all(m["content"] != assistant.text or assistant.text.endswith((".", "!", "?")) for m in prompt)
    await session.close()
    assert audio_after_clear(log.events, response_id) == 0


async def test_close_mid_response_leaves_no_engine_or_tts_work(speech_models):
    engine = ScriptedEngine(reply=lambda m: " ".join(f"Count {n} is here." for n in range(40)), step_s=0.05, words_per_step=2)
    session, log = make_session(speech_models, engine)
    await session.handle_text(json.dumps({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Count."}]}}))
    await session.handle_text(json.dumps({"type": "response.create"}))
    await log.wait_for(lambda e: e["type"] == "response.output_audio.delta")
    await session.close()
    assert speech_models["synthesizer"].live_jobs == 0  # the sentence Piper was on has finished
    await engine.wait_idle()
    assert all(handle.cancelled for handle in engine.handles) and engine.live_requests == 0
    sent = len(log.events)
    await session.handle_text(json.dumps({"type": "response.create"}))
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


def test_speech_speed_from_session_update_reaches_piper(speech_models):
    synthesizer = speech_models["synthesizer"]
    normal = len(synthesizer.synthesize_blocking("The capital of France is Paris."))
    fast = len(synthesizer.synthesize_blocking("The capital of France is Paris.", speed=2.0))
    assert fast < normal * 0.75
    synthesizer.synthesize_blocking("...")  # punctuation alone must not raise


def test_unvaried_synthesis_gives_the_same_audio_every_time(speech_models):
    # test and load-test utterances must not change from run to run (Piper's noise is random)
    synthesizer = speech_models["synthesizer"]
    takes = [synthesizer.synthesize_blocking("Tell me about dogs.", varied=False) for _ in range(2)]
    assert len(takes[0]) > 0 and np.array_equal(takes[0], takes[1])
