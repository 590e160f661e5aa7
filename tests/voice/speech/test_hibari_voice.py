"""The second voice (`--tts hibari`): real speech at the wire's rate, the same audio every time
when variation is off, nothing for text with nothing to say, and Whisper understands it."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from voice_app.audio.pcm import ASR_RATE, WIRE_RATE, int16_to_float, resample

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def hibari():
    from voice_app.speech.tts import HibariSynthesizer

    synthesizer = HibariSynthesizer()
    yield synthesizer
    synthesizer.close()


def test_hibari_speaks_at_the_wire_rate_and_repeats_itself_when_asked(hibari):
    first = hibari.synthesize_blocking("The capital of France is Paris.", varied=False)
    again = hibari.synthesize_blocking("The capital of France is Paris.", varied=False)
    assert first.dtype == np.int16 and 1.0 < len(first) / WIRE_RATE < 5.0
    assert np.array_equal(first, again)
    assert len(hibari.synthesize_blocking("...")) == 0
    faster = hibari.synthesize_blocking("The capital of France is Paris.", speed=1.5, varied=False)
    assert len(faster) < 0.85 * len(first)


def test_hibari_through_the_pool_and_whisper_hears_it(hibari, speech_models):
    samples = asyncio.run(hibari.synthesize("How many legs does a spider have?"))
    assert hibari.live_jobs == 0
    heard = speech_models["transcriber"].transcribe_blocking(resample(int16_to_float(samples), WIRE_RATE, ASR_RATE),
                                                             final=True)
    assert "spider" in heard.lower() and "legs" in heard.lower()
