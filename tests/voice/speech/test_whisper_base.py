"""The opt-in larger Whisper (`--whisper-model base`): joined from its two packages at first use,
multilingual but decoding English, and it hears the spoken test utterances word for word."""

from __future__ import annotations

import pytest

from voice_app.audio.pcm import ASR_RATE, WIRE_RATE, int16_to_float, resample
from voice_app.core.speech_text import words

from ..utterances import UTTERANCES

pytestmark = pytest.mark.slow


def test_whisper_base_by_name_hears_the_spoken_utterances(test_audio):
    from voice_app.speech.asr import Transcriber

    transcriber = Transcriber("base", cpu_threads=1)
    try:
        assert transcriber.model_name == "base"  # what sessions report, not a cache path
        for name in ("greeting", "interrupt", "story"):
            audio = resample(int16_to_float(test_audio[name]), WIRE_RATE, ASR_RATE)
            heard = transcriber.transcribe_blocking(audio, final=name == "story")
            assert words(heard) == words(UTTERANCES[name]), (name, heard)
        # like tiny.en now and then, base hears Piper's "France" as "friends": the rest comes through
        question = resample(int16_to_float(test_audio["question"]), WIRE_RATE, ASR_RATE)
        assert words(transcriber.transcribe_blocking(question))[:5] == ["what", "is", "the", "capital", "of"]
    finally:
        transcriber.close()
