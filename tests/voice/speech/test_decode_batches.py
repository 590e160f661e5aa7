"""Utterances of several sessions that wait for the Whisper worker together (open turns'
partials, or turns' finals) are decoded in one call, and each hears what it would have alone
(the real tiny.en), whatever each was said after (its prompt)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from voice_app.audio.pcm import ASR_RATE, WIRE_RATE, int16_to_float, resample
from voice_app.speech.asr import CONTEXT_TOKENS

pytestmark = pytest.mark.slow

NAMES = ("greeting", "question", "interrupt")
# what each was said after (Whisper's prompt): none, a short reply, one longer than the prompt holds;
# prompts of different lengths cannot share one CTranslate2 call
CONTEXTS = {"greeting": "", "question": "Hello! Ask me anything.",
            "interrupt": "Once upon a time, in a land far away, there lived a small dragon who could not fly. "
                         "Every morning she climbed the tallest hill and spread her wings, and every morning she fell."}


@pytest.mark.parametrize("final", [False, True])
def test_decodes_that_wait_together_are_made_in_one_call_with_the_words_of_each_alone(
        speech_models, test_audio, monkeypatch, final):
    transcriber = speech_models["transcriber"]
    clips = {name: resample(int16_to_float(test_audio[name]), WIRE_RATE, ASR_RATE) for name in NAMES}
    alone = {name: transcriber.transcribe_blocking(clip, final, CONTEXTS[name]) for name, clip in clips.items()}
    batches: list[int] = []
    method = "finals_as_ready" if final else "transcribe_partials"
    decode = getattr(transcriber, method)
    monkeypatch.setattr(transcriber, method,
                        lambda audios, contexts: batches.append(len(audios)) or decode(audios, contexts))
    gate = threading.Event()

    async def scenario() -> dict[str, str]:
        blocker = transcriber._pool.submit(-1.0, gate.wait)  # the only worker busy: the decodes queue
        tasks = {name: asyncio.ensure_future(transcriber.transcribe(clip, final, CONTEXTS[name]))
                 for name, clip in clips.items()}
        dropped = asyncio.ensure_future(transcriber.transcribe(clips["greeting"], final))
        await asyncio.sleep(0.05)
        dropped.cancel()  # a session that went away meanwhile: its utterance is not decoded
        await asyncio.gather(dropped, return_exceptions=True)  # its cancellation reached the queue
        gate.set()
        texts = {name: await task for name, task in tasks.items()}
        blocker.result(timeout=10)
        return texts

    assert asyncio.run(scenario()) == alone
    assert batches == [len(NAMES)]  # one call for the three that waited; none for the one cancelled


def test_a_final_waiting_beside_partials_is_decoded_first(speech_models, test_audio):
    transcriber = speech_models["transcriber"]
    clip = resample(int16_to_float(test_audio["question"]), WIRE_RATE, ASR_RATE)
    finished: list[str] = []
    gate = threading.Event()

    async def scenario() -> None:
        blocker = transcriber._pool.submit(-1.0, gate.wait)
        partial = asyncio.ensure_future(transcriber.transcribe(clip))
        await asyncio.sleep(0.02)  # the partial waits first
        final = asyncio.ensure_future(transcriber.transcribe(clip, final=True))
        for name, task in (("partial", partial), ("final", final)):
            task.add_done_callback(lambda _, name=name: finished.append(name))
        await asyncio.sleep(0.02)
        gate.set()
        await asyncio.gather(partial, final)
        blocker.result(timeout=10)

    asyncio.run(scenario())
    assert finished == ["final", "partial"]


def test_closing_the_transcriber_cancels_the_decodes_still_waiting(test_audio):
    from voice_app.speech.asr import Transcriber

    transcriber = Transcriber("tiny.en", cpu_threads=1)
    clip = resample(int16_to_float(test_audio["greeting"]), WIRE_RATE, ASR_RATE)
    gate = threading.Event()

    async def scenario() -> list:
        transcriber._pool.submit(0.0, gate.wait)  # the worker busy: the decodes wait
        waiting = [asyncio.ensure_future(transcriber.transcribe(clip, final)) for final in (False, True, False)]
        await asyncio.sleep(0.05)
        transcriber.close()
        gate.set()
        late = asyncio.ensure_future(transcriber.transcribe(clip))  # after close: refused, not left hanging
        return await asyncio.wait_for(asyncio.gather(*waiting, late, return_exceptions=True), timeout=30)

    outcomes = asyncio.run(scenario())
    assert all(isinstance(outcome, asyncio.CancelledError) for outcome in outcomes)


def test_the_prompt_holds_the_last_tokens_of_the_context_and_none_without_one(speech_models):
    transcriber = speech_models["transcriber"]
    tokenizer = transcriber._tokenizer
    task = transcriber.context_prompt("")
    assert transcriber.context_prompt("   ") == task and tokenizer.sot_prev not in task

    short = transcriber.context_prompt(CONTEXTS["question"])
    assert short[0] == tokenizer.sot_prev and short[-len(task):] == task
    assert tokenizer.decode(short[1:-len(task)]).strip() == CONTEXTS["question"]

    long = transcriber.context_prompt(CONTEXTS["interrupt"])
    assert len(long) == 1 + CONTEXT_TOKENS + len(task)
    assert tokenizer.decode(long[1:-len(task)]).endswith("every morning she fell.")


@pytest.mark.parametrize("final", [False, True])
def test_a_short_utterance_after_a_long_reply_is_still_heard(speech_models, test_audio, final):
    transcriber = speech_models["transcriber"]
    greeting = resample(int16_to_float(test_audio["greeting"]), WIRE_RATE, ASR_RATE)
    short = greeting[: ASR_RATE * 3 // 4]  # its first word, shorter than the prompt in tokens
    assert transcriber.transcribe_blocking(short, final, CONTEXTS["interrupt"]).strip()
