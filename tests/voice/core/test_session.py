"""The session's logic, driven by scripted models and a scripted player (tests/voice/fakes.py):
turns, speculation, barge-in and history, in milliseconds. test_session_models.py runs the same
paths on the real Whisper, Piper and Silero."""

from __future__ import annotations

import asyncio
import base64
import json
import random

import numpy as np
import pytest

from voice_app.core.session import Session
from voice_app.settings import DEFAULT_INSTRUCTIONS, Settings

from ..clients import EventLog, silence, stream_audio
from ..fakes import SPOKEN_WORD_SAMPLES, ScriptedEngine, ScriptedModels, ScriptedPlayer

QUESTION = "What is the capital of France?"
INTERRUPT = "Wait, stop, tell me about dogs instead."
LONG_REPLY = "One two three four five. Six seven eight nine ten. Eleven twelve thirteen fourteen fifteen."
END_OF_TURN = silence(0.8)  # longer than the 500 ms of silence that ends a turn


def make_session(models: ScriptedModels | None = None, player: ScriptedPlayer | None = None,
                 log: EventLog | None = None, **settings) -> tuple[Session, EventLog, ScriptedModels]:
    """server_vad unless a test asks otherwise: most tests here are about what follows a turn"""
    models = models or ScriptedModels()
    log = log or EventLog()
    settings.setdefault("turn_detection", "server_vad")
    settings.setdefault("audio_lead_ms", 0)  # the scripted player's position moves only when a test says
    session = Session(models, Settings(partial_interval_ms=50, **settings), log.send,
                      open_sink=player.open_sink if player is not None else None)
    return session, log, models


async def say(session: Session, models: ScriptedModels, text: str, after: np.ndarray = END_OF_TURN) -> None:
    await stream_audio(session.push_pcm16, np.concatenate([models.speech.say(text), after]), realtime=False)


def is_done(response_id: str | None = None):
    return lambda e: e["type"] == "response.done" and response_id in (None, e["response"]["id"])


def text_turn(text: str) -> str:
    return json.dumps({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}})


async def test_a_spoken_question_gets_its_transcript_and_a_spoken_answer():
    session, log, models = make_session()  # the default sink: audio deltas on the wire
    await session.start()
    await stream_audio(session.push_pcm16, silence(0.3), realtime=False)
    await say(session, models, QUESTION)
    done = await log.wait_for(is_done())

    assert log.of_type("conversation.item.input_audio_transcription.completed")[0]["transcript"] == QUESTION
    assert done["response"]["status"] == "completed"
    spoken = log.of_type("response.output_audio_transcript.done")[0]["transcript"]
    assert spoken == "You said What is the capital of France. That is all I know. Goodbye now."
    deltas = log.of_type("response.output_audio.delta")
    assert {d["response_id"] for d in deltas} == {done["response"]["id"]}
    assert sum(len(base64.b64decode(d["delta"])) // 2 for d in deltas) == len(spoken.split()) * SPOKEN_WORD_SAMPLES
    order = log.types()
    assert order.index("input_audio_buffer.speech_started") < order.index("input_audio_buffer.speech_stopped") \
        < order.index("response.created") < order.index("response.output_audio.delta") < order.index("response.done")
    assert [(i.role, i.text) for i in session.conversation.items] == [("user", QUESTION), ("assistant", spoken)]
    metrics = log.of_type("x_turn.metrics")[0]
    assert metrics["speech_stopped_to_first_audio_ms"] is not None and metrics["barge_in_to_cleared_ms"] is None
    await session.close()


async def test_a_pause_drafts_the_reply_before_the_turn_ends_and_the_turn_adopts_that_draft():
    drafts_at_stop: list[int] = []
    models = ScriptedModels()
    log = EventLog(on_event=lambda e: drafts_at_stop.append(len(models.engine.submitted.items))
                   if e["type"] == "input_audio_buffer.speech_stopped" else None)
    session, log, _ = make_session(models, log=log)
    # a pause (64 ms), not yet the end (500 ms), and the whole final tail (50 ms) after the last
    # speech window, so the decode made at the pause is the final one
    await say(session, models, QUESTION, after=silence(0.3))
    await models.engine.submitted.wait_for(lambda prompt: prompt[-1]["content"] == QUESTION)
    assert not log.of_type("input_audio_buffer.speech_stopped"), "drafted while the turn was still open"

    await stream_audio(session.push_pcm16, silence(0.6), realtime=False)
    await log.wait_for(is_done())
    assert drafts_at_stop == [len(models.engine.submitted.items)], "the end of the turn drafted nothing new"
    assert models.engine.submitted.items[-1][-1] == {"role": "user", "content": QUESTION}
    assert models.transcriber.finals == 1, "the final transcript reused the (final-quality) decode made at the pause"
    await session.close()


async def test_talking_over_a_reply_being_produced_cuts_it_to_what_was_heard():
    models = ScriptedModels(engine=ScriptedEngine(reply=lambda m: LONG_REPLY, hold_after_words=10))
    player = ScriptedPlayer(position_ms=700)  # of the first sentence (5 words, 1250 ms), 700 ms were heard
    session, log, _ = make_session(models, player)
    await say(session, models, QUESTION)
    first = await log.wait_for(lambda e: e["type"] == "response.output_audio_transcript.delta")
    response_id = first["response_id"]
    sink = player.sink_of(response_id)
    assert sink.pushed_samples == 5 * SPOKEN_WORD_SAMPLES

    await say(session, models, INTERRUPT)
    done = await log.wait_for(is_done(response_id))
    assert done["response"]["status"] == "cancelled"
    cleared = next(i for i, e in enumerate(log.events) if e["type"] == "output_audio_buffer.cleared")
    assert log.events[cleared]["response_id"] == response_id and cleared < log.events.index(done)
    assert sink.cleared_at_ms == 700 and sink.pushed_after_clear == 0
    assistant = session.conversation.items[1]
    assert (assistant.role, assistant.text, assistant.status) == ("assistant", "One two", "incomplete")
    metrics = next(e for e in log.of_type("x_turn.metrics") if e["response_id"] == response_id)
    assert metrics["barge_in_to_cleared_ms"] is not None
    # the interruption is itself a turn, answered from the history; the cut reply shows the
    # engine only its whole sentences (none of "One two"), so the prompt ends with the new words
    await log.wait_for(lambda e: e["type"] == "response.created" and e["response"]["id"] != response_id)
    assert models.engine.submitted.items[-1][-2:] == [{"role": "user", "content": QUESTION},
                                                      {"role": "user", "content": INTERRUPT}]
    await session.close()


async def test_talking_over_a_reply_still_playing_truncates_it_to_what_the_player_played():
    player = ScriptedPlayer(position_ms=1000)
    session, log, models = make_session(player=player)
    await say(session, models, QUESTION)
    done = await log.wait_for(is_done())
    assert done["response"]["status"] == "completed"
    response_id = done["response"]["id"]
    assert player.sink_of(response_id).left_ms() > 0, "sent in full, but still playing"

    await say(session, models, INTERRUPT)
    truncated = await log.wait_for(lambda e: e["type"] == "conversation.item.truncated")
    cleared = log.of_type("output_audio_buffer.cleared")
    assert [e["response_id"] for e in cleared] == [response_id]
    # "You said What is the capital of France." is 8 words, 2000 ms: 1000 ms heard is 4 words
    assert truncated["audio_end_ms"] == 1000
    assert session.conversation.items[1].text == "You said What is"
    reports = [e for e in log.of_type("x_turn.metrics") if e["response_id"] == response_id]
    assert reports[-1]["barge_in_to_cleared_ms"] is not None
    await session.close()


async def test_a_client_truncate_is_final_and_text_replies_send_no_audio():
    player = ScriptedPlayer(position_ms=0)
    session, log, models = make_session(player=player)
    await session.handle_text(text_turn("Hello there."))
    await session.handle_text(json.dumps({"type": "response.create"}))
    done = await log.wait_for(is_done())
    item_id = done["response"]["output"][0]["id"]
    await session.handle_text(json.dumps({"type": "conversation.item.truncate", "item_id": item_id,
                                          "content_index": 0, "audio_end_ms": 500}))
    truncated = await log.wait_for(lambda e: e["type"] == "conversation.item.truncated")
    assert truncated["audio_end_ms"] == 500
    item = session.conversation.find(item_id)
    assert (item.status, item.text) == ("incomplete", "You said")  # 500 ms: the first 2 of 8 words

    # the client's account stands: talking now cuts nothing; the cut text ("You said", no
    # whole sentence) is the history, and the engine sees none of it
    await say(session, models, INTERRUPT)
    spoken_reply = await log.wait_for(is_done(), start=log.events.index(truncated))
    assert not log.of_type("output_audio_buffer.cleared") and item.text == "You said"
    assert [m["role"] for m in models.engine.submitted.items[-1]] == ["system", "user", "user"]

    await session.handle_text(json.dumps({"type": "response.create", "response": {"output_modalities": ["text"]}}))
    text_done = await log.wait_for(is_done(), start=log.events.index(spoken_reply) + 1)
    assert text_done["response"]["output_modalities"] == ["text"]
    text = "".join(e["delta"] for e in log.of_type("response.output_text.delta")).strip()
    assert text == log.of_type("response.output_text.done")[-1]["text"] and text.startswith("You said")
    assert player.sink_of(text_done["response"]["id"]).pushed_samples == 0
    await session.close()


@pytest.mark.parametrize("modality", ["audio", "text"])
async def test_a_reply_that_says_a_sentence_again_ends_before_it_and_stops_the_engine(modality):
    looping = "I am sorry for any misunderstanding. Let me help. I am sorry for any misunderstanding! More words."
    models = ScriptedModels(engine=ScriptedEngine(reply=lambda m: looping))
    session, log, _ = make_session(models)
    await session.handle_text(text_turn("Pull off from your hands to eat."))
    await session.handle_text(json.dumps({"type": "response.create", "response": {"output_modalities": [modality]}}))
    done = await log.wait_for(is_done())
    assert done["response"]["status"] == "completed"
    said = "I am sorry for any misunderstanding. Let me help."
    assert session.conversation.items[-1].text == said
    assert models.engine.handles[-1].cancelled, "the engine stopped making the loop"
    await session.close()


async def test_close_mid_response_cancels_the_engine_and_tts_work_and_sends_nothing_more():
    models = ScriptedModels(engine=ScriptedEngine(reply=lambda m: LONG_REPLY, hold_after_words=10))
    session, log, _ = make_session(models)
    await session.handle_text(text_turn("Count."))
    await session.handle_text(json.dumps({"type": "response.create"}))
    await log.wait_for(lambda e: e["type"] == "response.output_audio.delta")
    await session.close()
    await models.engine.wait_idle()
    assert all(handle.cancelled for handle in models.engine.handles)
    assert models.engine.live_requests == 0 and models.synthesizer.live_jobs == 0
    sent = len(log.events)
    await session.handle_text(text_turn("Still there?"))
    await say(session, models, QUESTION)
    assert len(log.events) == sent, "nothing is sent after close"


async def test_once_the_history_fills_the_context_the_next_head_is_prefilled_before_the_turn():
    """After a reply, a turn that would have to drop old turns has its head trimmed and
    prefilled then (core/head_warming.py); the turn's reply starts with that head and the
    prefill, no longer needed, is cancelled."""
    session, log, models = make_session(context_tokens=128, max_new_tokens=16, instructions="Be brief.")
    engine = models.engine
    await session.start()
    for i in range(10):
        await session.handle_text(text_turn(f"Question number {i} about things and stuff"))
        await session.handle_text(json.dumps({"type": "response.create", "response": {"output_modalities": ["text"]}}))
        await log.wait_for(lambda e: e["type"] == "response.done" and len(log.of_type("response.done")) > i)
        await session.head_warmer.idle.wait()  # the head is worked out on a worker thread after the reply
    assert session.head_warmer.warmed >= 2, "the history outgrew the context more than once"
    head = engine.prefilled[0]
    assert head[0] == {"role": "system", "content": "Be brief."} and head[-1]["role"] == "assistant"
    assert all(count_tokens <= 128 - 16 for count_tokens in map(engine.count_tokens, engine.prefilled))
    later = [prompt for prompt in engine.submitted.items if prompt[:len(head)] == head and len(prompt) > len(head)]
    assert later, "the next turn's prompt starts with the prefilled head"
    prefill_handles = [h for h in engine.handles if h.background and not h.cancelled]
    assert len(prefill_handles) <= 1, "each prefill is cancelled once the next turn submits"
    await session.close()


async def test_manual_turns_without_vad():
    session, log, models = make_session()
    await session.handle_text(json.dumps({"type": "session.update", "session": {
        "type": "realtime", "audio": {"input": {"turn_detection": None}}}}))
    updated = await log.wait_for(lambda e: e["type"] == "session.updated")
    assert updated["session"]["audio"]["input"]["turn_detection"] is None
    await session.handle_text(json.dumps({"type": "input_audio_buffer.commit"}))
    assert log.events[-1]["error"]["code"] == "input_audio_buffer_commit_empty"

    await say(session, models, QUESTION)
    assert not log.of_type("input_audio_buffer.speech_started"), "no VAD turns when turned off"
    await session.handle_text(json.dumps({"type": "input_audio_buffer.commit"}))
    done = await log.wait_for(is_done())
    transcript = log.of_type("conversation.item.input_audio_transcription.completed")[0]["transcript"]
    assert transcript == QUESTION and done["response"]["status"] == "completed"

    await say(session, models, INTERRUPT)
    await session.handle_text(json.dumps({"type": "input_audio_buffer.clear"}))
    await log.wait_for(lambda e: e["type"] == "input_audio_buffer.cleared")
    await session.handle_text(json.dumps({"type": "input_audio_buffer.commit"}))
    assert log.events[-1]["error"]["code"] == "input_audio_buffer_commit_empty", "the cleared buffer is empty"
    await session.close()


async def test_session_update_changes_only_what_it_names_and_a_refused_setting_only_itself():
    session, log, _ = make_session()
    vad = {"type": "server_vad", "threshold": 0.7, "silence_duration_ms": 400}
    for turn_detection in (vad, None, {"type": "server_vad"}):
        await session.handle_text(json.dumps({"type": "session.update", "session": {
            "type": "realtime", "audio": {"input": {"turn_detection": turn_detection}}}}))
    shape = log.of_type("session.updated")[-1]["session"]
    assert shape["audio"]["input"]["turn_detection"]["threshold"] == 0.7  # kept while it was off
    assert shape["audio"]["input"]["turn_detection"]["silence_duration_ms"] == 400
    await session.handle_text(json.dumps({"type": "session.update", "session": {
        "type": "realtime", "instructions": "Be terse.", "max_output_tokens": 5000}}))
    error, updated = log.events[-2:]
    assert error["error"]["param"] == "max_output_tokens" and "applied: instructions" in error["error"]["message"]
    assert updated["type"] == "session.updated" and updated["session"]["instructions"] == "Be terse."
    assert session.options.instructions == "Be terse." and session.options.max_output_tokens == 64
    await session.close()


async def test_the_voice_a_session_asks_for_speaks_its_replies_and_an_unknown_one_gets_the_default():
    from ..fakes import ScriptedSynthesizer

    joe = ScriptedSynthesizer()
    session, log, models = make_session(ScriptedModels(voices={"joe": joe}))
    await session.start()
    assert session.options.voice == "heart"  # settings.tts: hibari
    for voice, speaker in (("joe", joe), ("alloy", models.synthesizer)):
        await session.handle_text(json.dumps({"type": "session.update", "session": {
            "type": "realtime", "audio": {"output": {"voice": voice}}}}))
        assert log.of_type("session.updated")[-1]["session"]["audio"]["output"]["voice"] == voice
        spoken, mark = len(speaker.sentences), len(log.events)
        await session.handle_text(text_turn(QUESTION))
        await session.handle_text(json.dumps({"type": "response.create"}))
        await log.wait_for(is_done(), start=mark)
        assert len(speaker.sentences) > spoken
    assert joe.sentences and models.synthesizer.sentences
    await session.close()


async def test_response_lifecycle_errors():
    models = ScriptedModels(engine=ScriptedEngine(reply=lambda m: LONG_REPLY, hold_after_words=4))
    session, log, _ = make_session(models)
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
    done = await log.wait_for(is_done())
    assert done["response"]["status"] == "cancelled"
    assert not log.of_type("output_audio_buffer.cleared"), "response.cancel alone does not clear"
    await session.close()


async def test_a_storm_of_mixed_events_never_breaks_the_session(caplog):
    """Seeded random interleaving of every client event, valid and not: each gets handled or an
    error event, no background task fails, and the session still answers at the end."""
    session, log, models = make_session()
    rng = random.Random(7)
    speech = np.concatenate([models.speech.say("Hello, how are you today?"), silence(0.7)])
    audio_b64 = [base64.b64encode(speech[i:i + 2400].astype("<i2").tobytes()).decode()
                 for i in range(0, len(speech), 2400)]
    choices = [
        lambda: {"type": "input_audio_buffer.append", "audio": rng.choice(audio_b64)},
        lambda: {"type": "input_audio_buffer.commit"},
        lambda: {"type": "input_audio_buffer.clear"},
        lambda: json.loads(text_turn("Hi.")),
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
            for _ in range(rng.choice([0, 0, 1, 5])):  # let background work run a little, or not
                await asyncio.sleep(0)
        count = len(log.of_type("response.done"))
        if session.active_response_id is not None:
            await session.handle_text(json.dumps({"type": "response.cancel"}))
        await session.handle_text(text_turn("Hi."))
        await session.handle_text(json.dumps({"type": "response.create"}))
        await log.wait_for(lambda e: is_done()(e) and e["response"]["status"] == "completed",
                           start=len(log.events) - 1)
    assert not [r for r in caplog.records if r.name.startswith("voice_app")], "no task failed"
    assert count >= 1 and log.of_type("error")
    created = [e["response"]["id"] for e in log.of_type("response.created")]
    done = [e["response"]["id"] for e in log.of_type("response.done")]
    assert len(done) == len(set(done)) and set(done) <= set(created), "each response ends exactly once"
    await session.close()


@pytest.mark.parametrize("keep_spoken_style,instructions,expected", [
    (True, "You are Jarvis.", DEFAULT_INSTRUCTIONS + " You are Jarvis."),
    (True, DEFAULT_INSTRUCTIONS + " Be terse.", DEFAULT_INSTRUCTIONS + " Be terse."),  # not twice
    (True, "", None),  # the client asked for no system prompt
    (False, "You are Jarvis.", "You are Jarvis."),
])
async def test_client_instructions_follow_the_spoken_style_defaults(keep_spoken_style, instructions, expected):
    session, log, models = make_session(keep_spoken_style=keep_spoken_style)
    await session.handle_text(json.dumps({"type": "session.update",
                                          "session": {"type": "realtime", "instructions": instructions}}))
    await session.handle_text(text_turn("Hello there."))
    await session.handle_text(json.dumps({"type": "response.create"}))
    await log.wait_for(is_done())
    system = [m["content"] for m in models.engine.submitted.items[-1] if m["role"] == "system"]
    assert system == ([expected] if expected is not None else [])
    assert log.of_type("session.updated")[0]["session"]["instructions"] == instructions  # echoed as given
    await session.close()


@pytest.mark.parametrize("sound", ["", "Mm-hmm.", "Minimum."])  # the last: a hum as Whisper tiny once heard it
async def test_a_cough_or_a_backchannel_over_a_reply_pauses_it_and_it_goes_on(sound):
    """LiveKit's false interruption: the reply's queued audio is dropped at once, and when the
    sound turns out to hold no words (or just "mm-hmm", or one short misheard word) the reply
    resumes from where it was heard."""
    models = ScriptedModels(engine=ScriptedEngine(reply=lambda m: LONG_REPLY, hold_after_words=10))
    player = ScriptedPlayer(position_ms=700)
    session, log, _ = make_session(models, player)
    await say(session, models, QUESTION)
    first = await log.wait_for(lambda e: e["type"] == "response.output_audio_transcript.delta")
    response_id = first["response_id"]
    sink = player.sink_of(response_id)
    await sink.wait_pushed(5 * SPOKEN_WORD_SAMPLES)

    # a cough: a sound too short for a word (the scripted transcriber hears nothing in it)
    noise = models.speech.say(sound) if sound else models.speech.say("Achoo")[: SPOKEN_WORD_SAMPLES // 2]
    await stream_audio(session.push_pcm16, np.concatenate([noise, END_OF_TURN]), realtime=False)
    await log.wait_for(lambda e: e["type"] == "output_audio_buffer.cleared" and e["response_id"] == response_id)
    assert sink.cleared_at_ms == 700
    await sink.wait_pushed(5 * SPOKEN_WORD_SAMPLES + 550 * 24)  # the unheard 550 ms of sentence one, again
    models.engine.release.set()
    done = await log.wait_for(is_done(response_id))
    assert done["response"]["status"] == "completed"
    reply = [item for item in session.conversation.items if item.role == "assistant"][0]
    assert (reply.text, reply.status) == (LONG_REPLY, "completed")
    assert len(log.of_type("response.created")) == 1  # the sound got no answer of its own
    await session.close()


async def test_talking_on_over_a_paused_reply_cuts_it_before_the_turn_ends():
    models = ScriptedModels(engine=ScriptedEngine(reply=lambda m: LONG_REPLY, hold_after_words=10))
    session, log, _ = make_session(models, ScriptedPlayer(position_ms=700), barge_in_sure_ms=600)
    await say(session, models, QUESTION)
    first = await log.wait_for(lambda e: e["type"] == "response.output_audio_transcript.delta")
    await stream_audio(session.push_pcm16, models.speech.say(INTERRUPT), realtime=False)  # no silence yet
    done = await log.wait_for(is_done(first["response_id"]))
    assert done["response"]["status"] == "cancelled"
    assert len(log.of_type("input_audio_buffer.speech_stopped")) == 1  # the question's: the talking goes on
    await session.close()


async def test_under_semantic_vad_a_backchannel_over_a_paused_reply_ends_its_turn_without_the_judge():
    """Words that only acknowledge ("mm-hmm", no full stop: the judge would call them unfinished
    and wait the eagerness's limit) end their turn at the short silence, and the reply goes on."""
    models = ScriptedModels(engine=ScriptedEngine(reply=lambda m: LONG_REPLY, hold_after_words=10))
    session, log, _ = make_session(models, ScriptedPlayer(position_ms=700), turn_detection="semantic_vad",
                                   eagerness="low")
    await say(session, models, QUESTION)
    first = await log.wait_for(lambda e: e["type"] == "response.output_audio_transcript.delta")
    await stream_audio(session.push_pcm16, np.concatenate([models.speech.say("mm-hmm"), silence(1.0)]),
                       realtime=False)
    await log.wait_for(lambda e: e["type"] == "output_audio_buffer.cleared")
    first_stop = log.types().index("input_audio_buffer.speech_stopped")
    await log.wait_for(lambda e: e["type"] == "input_audio_buffer.speech_stopped", start=first_stop + 1)
    assert "mm-hmm" not in models.engine.judged  # no verdict needed: it only acknowledged
    models.engine.release.set()
    done = await log.wait_for(is_done(first["response_id"]))
    assert done["response"]["status"] == "completed" and len(log.of_type("response.created")) == 1
    await session.close()


@pytest.mark.parametrize("command", ["Stop.", "Never mind.", "Shh."])
async def test_a_stop_command_cuts_the_reply_gets_no_answer_and_the_next_question_stands_alone(command):
    models = ScriptedModels(engine=ScriptedEngine(reply=lambda m: LONG_REPLY, hold_after_words=10))
    session, log, _ = make_session(models, ScriptedPlayer(position_ms=700))
    await say(session, models, "Tell me a story about a dragon.")
    first = await log.wait_for(lambda e: e["type"] == "response.output_audio_transcript.delta")
    await say(session, models, command)
    done = await log.wait_for(is_done(first["response_id"]))
    assert done["response"]["status"] == "cancelled"
    await log.wait_for(lambda e: e["type"] == "conversation.item.input_audio_transcription.completed"
                       and e["transcript"] == command)
    assert len(log.of_type("response.created")) == 1, "the command got no reply of its own"
    assert [i.role for i in session.conversation.items] == ["user", "assistant", "user"]  # the client's history

    models.engine.hold_after_words = None
    await say(session, models, "What is two plus two?")
    second = await log.wait_for(lambda e: e["type"] == "response.done" and e["response"]["id"] != first["response_id"])
    assert second["response"]["status"] == "completed"
    prompt = models.engine.submitted.items[-1]
    assert [m["role"] for m in prompt] == ["system", "user", "user"]  # no cut story, no command
    assert prompt[-1]["content"] == "What is two plus two?"
    await session.close()


async def test_a_stop_command_over_a_reply_still_playing_cuts_its_playback():
    player = ScriptedPlayer(position_ms=1000)
    session, log, models = make_session(player=player)
    await say(session, models, QUESTION)
    done = await log.wait_for(is_done())
    assert player.sink_of(done["response"]["id"]).left_ms() > 0, "sent in full, but still playing"
    await say(session, models, "Wait.")
    await log.wait_for(lambda e: e["type"] == "conversation.item.truncated")
    await log.wait_for(lambda e: e["type"] == "conversation.item.input_audio_transcription.completed"
                       and e["transcript"] == "Wait.")
    assert len(log.of_type("response.created")) == 1
    assert session.conversation.messages("") == [{"role": "user", "content": QUESTION}]
    await session.close()


@pytest.mark.parametrize("transcript, command", [
    ("Stop.", True), ("Okay, stop.", True), ("Hold on.", True), ("Be quiet!", True), ("Shhh", True),
    ("Wait, stop.", True), ("Stop, stop!", True), ("Hold on, wait.", True), ("Wait, stop, tell me about dogs.", False),
    ("Stop. What is the capital of France?", False), ("Wait, what is two plus two?", False), ("Okay.", False),
    ("", False), ("Please.", False), ("Sure.", False),
])
def test_what_counts_as_a_bare_stop_command(transcript, command):
    from voice_app.core.end_of_turn import is_stop_command

    assert is_stop_command(transcript) is command
