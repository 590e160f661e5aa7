"""With whisper_reply_context, Whisper hears the user's turn after the assistant's last reply
(its prompt): every decode of a turn, partial or final, carries the reply as it had been said
when the turn began. Off (the default), no decode has a context."""

from __future__ import annotations

from .test_session import QUESTION, is_done, make_session, say
from ..clients import silence, stream_audio

FOLLOW_UP = "And what is the capital of Spain?"


async def two_turns(**settings):
    session, log, models = make_session(**settings)
    await session.start()
    await stream_audio(session.push_pcm16, silence(0.3), realtime=False)
    await say(session, models, QUESTION)
    await log.wait_for(is_done())
    first_turn = len(models.transcriber.contexts)
    reply = log.of_type("response.output_audio_transcript.done")[0]["transcript"]

    await say(session, models, FOLLOW_UP)
    await log.wait_for(lambda e: e["type"] == "response.done" and len(log.of_type("response.done")) == 2)

    assert log.of_type("conversation.item.input_audio_transcription.completed")[1]["transcript"] == FOLLOW_UP
    await session.close()
    return models.transcriber.contexts[:first_turn], models.transcriber.contexts[first_turn:], reply


async def test_the_first_turn_has_no_context_and_the_next_is_heard_after_the_reply():
    first, second, reply = await two_turns(whisper_reply_context=True)
    assert first and set(first) == {""}
    assert set(second) == {reply}


async def test_by_default_no_turn_is_heard_after_a_context():
    first, second, _ = await two_turns()
    assert first and second and set(first + second) == {""}
