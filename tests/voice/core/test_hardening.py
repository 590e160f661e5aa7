"""The session's edges (issue 18): every client event gets a reply or an error event, one
append may hold a whole turn, a commit consumes the audio it commits, responses that fail or
go silent end `failed`, and nothing a session starts outlives it. Scripted models
(tests/voice/fakes.py); the real server's versions are in tests/voice/realtime."""

from __future__ import annotations

import asyncio
import base64
import json
import threading

import numpy as np

from voice_app.core.response import AUDIO_AHEAD_SENTENCES
from voice_app.core.session import Session
from voice_app.settings import Settings

from ..clients import EventLog, silence
from ..fakes import ScriptedEngine, ScriptedModels
from .test_session import QUESTION, is_done, make_session, text_turn


def append(samples: np.ndarray) -> str:
    return json.dumps({"type": "input_audio_buffer.append",
                       "audio": base64.b64encode(samples.astype("<i2").tobytes()).decode()})


async def test_one_append_holding_a_whole_utterance_gets_its_transcript_and_a_reply():
    for turn_detection in ("server_vad", "semantic_vad"):
        session, log, models = make_session(turn_detection=turn_detection)
        await session.handle_text(append(np.concatenate([models.speech.say(QUESTION), silence(1.0)])))
        done = await log.wait_for(is_done())
        transcript = log.of_type("conversation.item.input_audio_transcription.completed")[0]["transcript"]
        assert transcript == QUESTION, turn_detection
        assert done["response"]["status"] == "completed"
        await session.close()


async def test_two_commits_back_to_back_make_one_item():
    session, log, models = make_session()
    await session.handle_text(json.dumps({"type": "session.update", "session": {
        "type": "realtime", "audio": {"input": {"turn_detection": None}}}}))
    await session.handle_text(append(models.speech.say(QUESTION)))
    await session.handle_text(json.dumps({"type": "input_audio_buffer.commit", "event_id": "c1"}))
    await session.handle_text(json.dumps({"type": "input_audio_buffer.commit", "event_id": "c2"}))
    await log.wait_for(is_done())
    assert len(log.of_type("input_audio_buffer.committed")) == 1
    error = log.of_type("error")[0]["error"]
    assert (error["code"], error["event_id"]) == ("input_audio_buffer_commit_empty", "c2")
    await session.close()


async def test_every_bad_event_gets_an_error_and_the_session_goes_on():
    session, log, models = make_session()
    bad = {
        "deep_array": "[" * 100_000 + "]" * 100_000,
        "deep_object": '{"a":' * 100_000 + "1" + "}" * 100_000,
        "huge_integer": '{"type": "response.create", "n": ' + "9" * 5000 + "}",
        "huge_audio_end": json.dumps({"type": "conversation.item.truncate", "item_id": "x", "audio_end_ms": 10 ** 30}),
        "too_many_tokens": json.dumps({"type": "response.create", "response": {"max_output_tokens": 4000}}),
        "empty_prompt": json.dumps({"type": "response.create", "response": {"instructions": ""}}),
    }
    for name, raw in bad.items():
        await session.handle_text(raw)
        error = log.events[-1]
        assert error["type"] == "error" and error["error"]["message"], name
    codes = [e["error"]["code"] for e in log.of_type("error")]
    assert codes == ["invalid_json"] * 3 + ["invalid_value", "invalid_value", "response_failed"]
    assert "1..1024" in log.of_type("error")[4]["error"]["message"], "the operator's cap, named"
    assert models.engine.handles == [] and session.active_response_id is None, "no request nobody reads"
    await session.handle_text(text_turn("Hi."))
    await session.handle_text(json.dumps({"type": "response.create"}))
    assert (await log.wait_for(is_done()))["response"]["status"] == "completed"
    await session.close()


async def test_a_handler_that_fails_costs_its_event_only(caplog):
    session, log, _ = make_session()

    async def broken(event):
        raise IndexError("a bug")

    session._client_events._handlers["response.cancel"] = broken
    await session.handle_text(json.dumps({"type": "response.cancel", "event_id": "e9"}))
    error = log.events[-1]["error"]
    assert (error["type"], error["code"], error["event_id"]) == ("server_error", "server_error", "e9")
    assert "response.cancel" in error["message"] and "IndexError" in error["message"]
    await session.handle_text(text_turn("Hi."))
    await session.handle_text(json.dumps({"type": "response.create"}))
    assert (await log.wait_for(is_done()))["response"]["status"] == "completed"
    await session.close()


async def test_a_failing_synthesizer_fails_the_response_and_later_turns_still_work():
    session, log, models = make_session()
    real_synthesize = models.synthesizer.synthesize

    async def broken(sentence, speed=1.0, needed_at=None):
        raise RuntimeError("piper crashed")

    models.synthesizer.synthesize = broken
    await session.handle_text(text_turn("Hi."))
    await session.handle_text(json.dumps({"type": "response.create"}))
    failed = await log.wait_for(is_done())
    assert failed["response"]["status"] == "failed"
    assert "RuntimeError" in failed["response"]["status_details"]["error"]["message"]
    models.synthesizer.synthesize = real_synthesize
    await session.handle_text(json.dumps({"type": "response.create"}))
    done = await log.wait_for(is_done(), start=log.events.index(failed) + 1)
    assert done["response"]["status"] == "completed"
    await session.close()


async def test_an_engine_that_goes_silent_fails_the_response():
    models = ScriptedModels(engine=ScriptedEngine(hold_after_words=2))  # never released
    session, log, _ = make_session(models, response_inactivity_timeout_s=0.3)
    await session.handle_text(text_turn("Hi."))
    await session.handle_text(json.dumps({"type": "response.create"}))
    done = await log.wait_for(is_done())
    assert done["response"]["status"] == "failed"
    assert "sent nothing for 0.3 s" in done["response"]["status_details"]["error"]["message"]
    assert models.engine.handles[-1].cancelled, "the silent request is cancelled, not left behind"
    assert session.active_response_id is None
    await session.close()


async def test_thousands_of_items_are_capped_and_the_reply_sees_a_prompt_that_fits():
    session, log, models = make_session(history_max_items=100)
    for i in range(2000):
        await session.handle_text(text_turn(f"note {i} " + "word " * 40))
    await session.handle_text(json.dumps({"type": "response.create"}))
    await log.wait_for(is_done())
    assert len(session.conversation.items) == 100
    deleted = log.of_type("conversation.item.deleted")
    assert len(deleted) == 2000 + 1 - 100 and deleted[0]["item_id"] != deleted[1]["item_id"]
    prompt = models.engine.submitted.items[-1]
    assert models.engine.count_tokens(prompt) <= models.engine.max_context_tokens - session.options.max_output_tokens
    assert prompt[-1]["content"].startswith("note 1999"), "the newest turns are the ones kept"
    await session.close()


async def test_a_long_append_is_analysed_off_the_event_loop_in_order():
    session, log, models = make_session(turn_detection="server_vad")
    vad_threads: set[int] = set()
    stream = session.listener._vad
    real_process = stream.process

    def recording(samples):
        vad_threads.add(threading.get_ident())
        return real_process(samples)

    stream.process = recording
    speech = np.concatenate([silence(0.5), models.speech.say(QUESTION), silence(1.0)])
    await session.handle_text(append(np.concatenate([speech] * 3)))  # three turns in one append
    completed = "conversation.item.input_audio_transcription.completed"
    start = 0
    for _ in range(3):  # each turn talks over the reply to the one before: a barge-in
        start = log.events.index(await log.wait_for(lambda e: e["type"] == completed, start=start)) + 1
    assert (await log.wait_for(is_done(), start=start))["response"]["status"] == "completed"
    assert threading.get_ident() not in vad_threads, "the VAD ran on worker threads"
    assert [e["transcript"] for e in log.of_type(completed)] == [QUESTION] * 3
    await session.close()


async def test_closing_a_session_cancels_its_queued_decodes():
    session, log, models = make_session(turn_detection="server_vad")
    started, cancelled = asyncio.Event(), []

    async def held(audio_16k, final=False, context=""):
        started.set()
        try:
            await asyncio.Event().wait()  # a Whisper queue that never gets to it
        except asyncio.CancelledError:
            cancelled.append(final)
            raise

    models.transcriber.transcribe = held
    await session.handle_text(append(np.concatenate([models.speech.say(QUESTION), silence(1.0)])))
    await started.wait()
    await session.close()
    await asyncio.sleep(0)
    assert cancelled and not session.listener._decodes


async def test_a_client_that_does_not_read_pauses_synthesis():
    """The speaker sends one sentence at a time; synthesis runs at most AUDIO_AHEAD_SENTENCES
    ahead of it, so a stalled client holds a few sentences of audio, not the whole reply."""
    models = ScriptedModels(engine=ScriptedEngine(reply=lambda m: " ".join(f"Sentence {n} ends." for n in range(20))))
    gate = asyncio.Event()

    class StalledSink:
        epoch = 0

        def __init__(self, ids):
            self.ids = ids

        async def push(self, chunk, epoch):
            await gate.wait()
            return True

        def heard_ms(self):
            return 0.0

        def left_ms(self):
            return 0.0

        def clear(self):
            return 0.0

        def close(self):
            pass

    log = EventLog()
    session = Session(models, Settings(), log.send, open_sink=StalledSink)
    await session.handle_text(text_turn("Count."))
    await session.handle_text(json.dumps({"type": "response.create"}))
    await log.wait_for(lambda e: e["type"] == "response.output_audio_transcript.delta")
    for _ in range(50):
        await asyncio.sleep(0)
    assert len(models.synthesizer.sentences) <= AUDIO_AHEAD_SENTENCES + 1
    gate.set()
    await log.wait_for(is_done())
    assert len(models.synthesizer.sentences) == 20
    await session.close()
