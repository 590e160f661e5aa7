"""Open turns of several sessions that wait for the Whisper worker together are decoded in one
call, and each hears what it would have alone (the real tiny.en)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from voice_app.audio.pcm import ASR_RATE, WIRE_RATE, int16_to_float, resample

pytestmark = pytest.mark.slow

NAMES = ("greeting", "question", "interrupt")


def test_partials_that_wait_together_are_decoded_in_one_call_with_the_words_of_each_alone(
        speech_models, test_audio, monkeypatch):
    transcriber = speech_models["transcriber"]
    clips = {name: resample(int16_to_float(test_audio[name]), WIRE_RATE, ASR_RATE) for name in NAMES}
    alone = {name: transcriber.transcribe_blocking(clip) for name, clip in clips.items()}
    batches: list[int] = []
    decode = transcriber.transcribe_partials
    monkeypatch.setattr(transcriber, "transcribe_partials", lambda audios: batches.append(len(audios)) or decode(audios))
    gate = threading.Event()

    async def scenario() -> dict[str, str]:
        blocker = transcriber._pool.submit(0.0, gate.wait)  # the only worker busy: the partials queue
        tasks = {name: asyncio.ensure_future(transcriber.transcribe(clip)) for name, clip in clips.items()}
        dropped = asyncio.ensure_future(transcriber.transcribe(clips["greeting"]))
        await asyncio.sleep(0.05)
        dropped.cancel()  # a session that went away meanwhile: its partial is not decoded
        await asyncio.gather(dropped, return_exceptions=True)  # its cancellation reached the queue
        gate.set()
        texts = {name: await task for name, task in tasks.items()}
        blocker.result(timeout=10)
        return texts

    assert asyncio.run(scenario()) == alone
    assert batches == [len(NAMES)]  # one call for the three that waited; none for the one cancelled


def test_closing_the_transcriber_cancels_the_partials_still_waiting(test_audio):
    from voice_app.speech.asr import Transcriber

    transcriber = Transcriber("tiny.en", cpu_threads=1)
    clip = resample(int16_to_float(test_audio["greeting"]), WIRE_RATE, ASR_RATE)
    gate = threading.Event()

    async def scenario() -> list:
        transcriber._pool.submit(0.0, gate.wait)  # the worker busy: the partials wait
        waiting = [asyncio.ensure_future(transcriber.transcribe(clip)) for _ in range(2)]
        await asyncio.sleep(0.05)
        transcriber.close()
        gate.set()
        late = asyncio.ensure_future(transcriber.transcribe(clip))  # after close: refused, not left hanging
        return await asyncio.wait_for(asyncio.gather(*waiting, late, return_exceptions=True), timeout=30)

    outcomes = asyncio.run(scenario())
    assert all(isinstance(outcome, asyncio.CancelledError) for outcome in outcomes)
