"""semantic_vad's verdict on the words (core/end_of_turn.py), over a stand-in engine whose
score per transcript is given."""

from __future__ import annotations

import asyncio

import pytest

from dllm_engine.request import DraftUpdate
from voice_app.core.end_of_turn import HUM_MAX_SPEECH_MS, EndOfTurnJudge, is_false_interruption, last_word

from ..fakes import ScriptedHandle


class ScoringEngine:
    """end_of_turn_probability with a fixed score per transcript; counts the requests."""

    def __init__(self, scores: dict[str, float]):
        self.scores = scores
        self.asked: list[str] = []
        self._loop = asyncio.get_running_loop()  # the judge asks from a worker thread

    def end_of_turn_probability(self, messages, background=True):
        text = messages[-1]["content"]
        self.asked.append(text)
        handle = ScriptedHandle(len(self.asked), background)
        update = DraftUpdate(request_id=handle.request_id, committed_text="", draft_text="", token_ids=[], step=1,
                             final=True, finish_reason="length", token_probs=[self.scores[text]])
        self._loop.call_soon_threadsafe(handle.publish, update)
        return handle


def judge_with(scores: dict[str, float]) -> tuple[EndOfTurnJudge, ScoringEngine]:
    engine = ScoringEngine(scores)
    return EndOfTurnJudge(engine, lambda text: [{"role": "user", "content": text}], threshold=0.15), engine


@pytest.mark.parametrize("transcript, score, verdict", [
    ("What is the capital of France?", 0.60, True),  # finished: the short silence
    ("What is the capital of?", 0.51, False),  # Whisper's "?" at a thinking pause: still unfinished
    ("What is 2 plus?", 0.54, False),
    ("Wait, stop, what is 2 plus 2?", 0.56, True),  # Whisper writes numbers as digits
    ("Tell me a story about a dragon and", 0.0, False),
    ("Hello.", 0.006, None),  # ends a sentence but scores low: server_vad's window, not 1.6 s
    ("I want to know, um,", 0.0, False),
    ("Wait, stop,", 0.62, False),  # a pause's comma: mid-sentence whatever the score
    ("No wait,", 0.40, False),
    ("So the thing is...", 0.30, False),
    ("Wait, stop.", 0.62, True),
    ("who wrote Romeo and Juliet", 0.0, None),  # Whisper wrote no punctuation: the words say nothing
    ("how many days are there in a week", 0.185, True),
    ("how many", 0.0, False),  # too short to be more than a start
    ("who wrote Romeo and", 0.0, False),  # dangling, punctuated or not
    ("What is the capital of France", 0.003, False),  # punctuated style (capitalised) but no end mark
])
async def test_the_verdict_weighs_the_score_and_the_last_word(transcript, score, verdict):
    judge, _ = judge_with({transcript: score})
    assert await judge.sounds_finished(transcript) is verdict


async def test_a_prefetched_verdict_is_asked_once_and_ready_at_the_pause():
    judge, engine = judge_with({"What is the capital of France?": 0.6})
    judge.prefetch("What is the capital of France?")
    judge.prefetch("What is the capital of")  # dangling: not worth an engine pass
    judge.prefetch("What is the capital,")  # nor a pause's comma
    await asyncio.sleep(0.01)
    assert await judge.sounds_finished("What is the capital of France?") is True
    assert engine.asked == ["What is the capital of France?"]
    judge.forget()  # a new turn: the context changed
    assert await judge.sounds_finished("What is the capital of France?") is True
    assert len(engine.asked) == 2
    judge.close()


def test_last_word_ignores_punctuation_and_case():
    assert last_word("What is the capital OF?") == "of"
    assert last_word("What is 2 plus 2?") == "2"
    assert last_word("  ...  ") == ""


@pytest.mark.parametrize("transcript, speech_ms, false_interruption", [
    ("", None, True), ("Mm-hmm.", None, True), ("Okay, yeah.", 900, True),  # no words, backchannels
    ("M", 420, True), ("minimum", 450, True), ("an m m m", 500, True),  # hums misheard: short speech
    ("minimum", HUM_MAX_SPEECH_MS + 200, False), ("minimum", None, False),  # too long, or length unknown
    ("Stop.", 380, False), ("Wait, stop.", 560, False), ("What?", 300, False),  # a command, a question
])
def test_a_false_interruption_is_no_words_a_backchannel_or_a_short_hum(transcript, speech_ms, false_interruption):
    assert is_false_interruption(transcript, speech_ms) is false_interruption
