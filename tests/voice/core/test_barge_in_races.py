"""The barge-in guarantee under the interleavings that break it: no audio or audio-transcript
delta of a response between its `output_audio_buffer.cleared` and its next
`output_audio_buffer.started` (a resume), and none at all after a cut. Each test forces its
interleaving with gates (a stalled transport write, a held engine, a held synthesis) instead of
timing, on the session's real wire sink."""

from __future__ import annotations

import asyncio
import time

import numpy as np

from voice_app.core.audio_sink import WireAudioSink
from voice_app.core.user_turn import UserTurn
from voice_app.realtime.event_feed import audio_after_clear
from voice_app.events.protocol import server_event

from ..clients import GatedLog
from ..fakes import ScriptedEngine, ScriptedModels
from .test_session import LONG_REPLY, QUESTION, is_done, make_session, say


def of_response(event_type: str, response_id: str):
    return lambda e: e["type"] == event_type and e.get("response_id") == response_id


def speech_over_the_reply() -> UserTurn:
    """The Listener's turn as it calls on_user_speaking for a sound over a reply."""
    return UserTurn("item_sound", 0, time.monotonic())


async def until(condition, turns: int = 10_000) -> None:
    """Lets the loop run until `condition()` holds (tasks step; no wall-clock wait)."""
    for _ in range(turns):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the condition never held")


async def reply_being_made(log: GatedLog, **settings):
    """A session whose reply has sent its first two sentences and waits for the engine (one
    word of the third settles the second)."""
    models = ScriptedModels(engine=ScriptedEngine(reply=lambda m: LONG_REPLY, words_per_step=1, hold_after_words=11))
    session, _, _ = make_session(models, log=log, **settings)
    await say(session, models, QUESTION)
    first = await log.wait_for(lambda e: e["type"] == "response.output_audio_transcript.delta")
    response = session.replies.active
    await until(lambda: len(response._spoken) == 2 and response.audio_waiting == 0)
    return session, models, response, first["response_id"]


async def test_a_chunk_waiting_for_the_transport_when_the_sink_clears_is_dropped():
    log = GatedLog()
    session, _, _ = make_session(log=log)
    sink = WireAudioSink(session.send, {"response_id": "resp_x", "item_id": "item_x", "output_index": 0,
                                          "content_index": 0})
    gate = log.hold(lambda e: e["type"] == "x_other")  # another event is being written, slowly
    writing = asyncio.create_task(session.send(server_event("x_other")))
    await log.stalled.wait()
    chunk = asyncio.create_task(sink.push(np.ones(4800, dtype=np.int16), sink.epoch))  # decided: waits to go
    await asyncio.sleep(0)
    sink.clear()
    cleared = asyncio.create_task(session.send(server_event("output_audio_buffer.cleared", response_id="resp_x")))
    gate.set()
    assert await chunk is False
    await asyncio.gather(writing, cleared)
    assert log.types() == ["x_other", "output_audio_buffer.cleared"]
    assert await sink.push(np.ones(4800, dtype=np.int16), sink.epoch)  # the new epoch plays (a resume)
    assert log.types()[-1] == "response.output_audio.delta"
    await session.close()


async def test_a_sentence_synthesised_during_a_pause_sends_nothing_and_a_cut_keeps_it_unsent():
    log = GatedLog()
    session, models, response, response_id = await reply_being_made(log)
    await session.on_user_speaking(speech_over_the_reply(), 100)  # paused: cleared
    assert response.paused
    models.engine.release.set()  # the third sentence is made and synthesised while paused
    await until(lambda: len(response._spoken) == 3)  # the speaker took it, and waits
    assert audio_after_clear(log.events, response_id) == 0
    assert not response._spoken[2].announced
    await session.on_end_of_turn("Tell me about dogs.", response.clock)  # real words: cut
    await log.wait_for(is_done(response_id))
    assert audio_after_clear(log.events, response_id) == 0
    assert not [e for e in log.events if e.get("delta") == "Eleven twelve thirteen fourteen fifteen. "]
    await session.close()


async def test_a_pause_during_a_resumes_replay_stops_the_replay_at_its_clear():
    log = GatedLog()
    session, models, response, response_id = await reply_being_made(log)
    await session.on_user_speaking(speech_over_the_reply(), 100)  # a cough: paused, cleared
    gate = log.hold(of_response("response.output_audio.delta", response_id))
    resume = asyncio.create_task(response.resume())  # the replay's first chunk is being written...
    await log.stalled.wait()
    epoch = response.sink.epoch
    talking = asyncio.create_task(session.on_user_speaking(speech_over_the_reply(), 100))  # ...when the
    await until(lambda: response.sink.epoch > epoch)  # user talks again: cleared, and its event waits to go
    gate.set()
    await asyncio.gather(resume, talking)
    assert response.paused
    types = [e["type"] for e in log.events if e.get("response_id") == response_id]
    assert types.count("output_audio_buffer.cleared") == 2 and types.count("output_audio_buffer.started") == 1
    assert audio_after_clear(log.events, response_id) == 0
    await session.close()


async def test_a_pause_right_after_a_resume_holds_the_speaker_it_woke():
    log = GatedLog()
    session, models, response, response_id = await reply_being_made(log)
    await session.on_user_speaking(speech_over_the_reply(), 100)
    models.engine.release.set()
    await until(lambda: len(response._spoken) == 3)  # the speaker took sentence three, and waits
    await response.resume()  # replays, announces sentence three, wakes the speaker...
    await session.on_user_speaking(speech_over_the_reply(), 100)  # ...paused again before it runs
    pushed = response.audio_sent_samples
    for _ in range(200):
        await asyncio.sleep(0)  # the woken speaker has every chance to send
    assert response.paused and response.audio_sent_samples == pushed
    assert audio_after_clear(log.events, response_id) == 0
    await response.resume()  # a second resume: the rest of the reply, in the newest epoch
    done = await log.wait_for(is_done(response_id))
    assert done["response"]["status"] == "completed"
    assert audio_after_clear(log.events, response_id) == 0
    spoken = [e["delta"] for e in log.events if of_response("response.output_audio_transcript.delta", response_id)(e)]
    assert "".join(spoken).split() == LONG_REPLY.split()  # every sentence's transcript exactly once
    await session.close()


async def test_a_cut_while_a_sentence_is_being_synthesised_sends_nothing_of_it():
    log = GatedLog()
    session, models, response, response_id = await reply_being_made(log, resume_false_interruptions=False)
    synthesizing = asyncio.Event()
    finish = asyncio.Event()
    real = models.synthesizer.synthesize

    async def held(sentence, speed=1.0, needed_at=None):
        synthesizing.set()
        await finish.wait()
        return await real(sentence, speed, needed_at)

    models.synthesizer.synthesize = held
    models.engine.release.set()
    await synthesizing.wait()
    await session.on_user_speaking(speech_over_the_reply(), 100)  # cut: cleared, cancelled
    finish.set()
    await log.wait_for(is_done(response_id))
    await response.wait_stopped()  # every task of the response has ended: the log is complete
    cleared = log.types().index("output_audio_buffer.cleared")
    assert not [e for e in log.events[cleared:] if e["type"] in ("response.output_audio.delta",
                                                                 "response.output_audio_transcript.delta")]
    await session.close()
