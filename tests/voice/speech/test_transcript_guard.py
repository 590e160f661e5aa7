"""The checks a transcript passes before anyone acts on it."""

from __future__ import annotations

import pytest

from voice_app.speech.transcript_guard import collapse_repetitions, compression_ratio, looks_failed


@pytest.mark.parametrize("heard, kept", [
    ("What is the capital of Spain? Spain? Spain? Spain? Spain? Spain? Spain?", "What is the capital of Spain?"),
    ("Tell me more. Tell me more. Tell me more. Tell me more.", "Tell me more."),
    ("No, no, no.", "No, no, no."),  # people say that
    ("What is the capital of France?", "What is the capital of France?"),
    ("", ""),
])
def test_a_decoding_loop_keeps_one_copy_and_speech_keeps_its_words(heard, kept):
    assert collapse_repetitions(heard) == kept


def test_a_loop_compresses_too_well_and_counts_as_a_failed_decode():
    loop = "What is the capital of Spain? " + "Spain? " * 20
    assert compression_ratio(loop) > 2.4 and looks_failed(loop, -0.2)
    assert not looks_failed("What is the capital of France?", -0.2)
    assert looks_failed("What is the capital of France?", -1.5)  # the decoder was unsure of every token
