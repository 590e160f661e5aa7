"""The checks a transcript passes before anyone acts on it."""

from __future__ import annotations

import pytest

from voice_app.speech.transcript_guard import collapse_repetitions, compression_ratio, looks_failed


@pytest.mark.parametrize("heard, kept", [
    ("What is the capital of Spain? Spain? Spain? Spain? Spain? Spain? Spain?", "What is the capital of Spain?"),
    ("Tell me more. Tell me more. Tell me more. Tell me more.", "Tell me more."),
    ("No, no, no.", "No, no, no."),  # people say that
    ("Okay, I got you. I got you. I got you.", "Okay, I got you."),  # three copies of a phrase: a loop
    ("Thanks, ma'am, ma'am, ma'am, ma'", "Thanks, ma'am,"),  # the loop's last copy cut off by the token limit
    ("I said yes, yes, yes", "I said yes, yes, yes"),  # no cut-off copy: three words are said
    ("Set a timer, a timer for ten minutes.", "Set a timer, a timer for ten minutes."),  # a restart, said
    ("Hello? How are you today? Hello? How are you today?", "Hello? How are you today?"),  # beam ran on
    ("Tell me more. Tell me more.", "Tell me more. Tell me more."),  # said twice: kept
    ("Stop, stop, stop, st", "stop,"),  # the last copy is kept, with its punctuation
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


def test_when_every_retry_of_a_failed_decode_fails_too_the_likeliest_is_kept():
    from voice_app.speech.asr import best_attempt

    beam = ("Never mind.", -1.2)  # unsure: retried at higher temperatures
    assert best_attempt([beam, ("Never mind.", -0.4)]) == "Never mind."  # a retry that passes is taken
    assert best_attempt([beam, ("There is an enemy there is a weapon", -1.9), ("name I mind", -1.5)]) == "Never mind."
    assert best_attempt([("What is the capital of France?", -0.3)]) == "What is the capital of France?"
    # a sampled loop may score likelier per token than the beam's words: it is never the transcript
    # (Whisper tiny's "... ... ..." for a Scots voice's "Who wrote Romeo and Juliet?" left it unanswered)
    unsure = ("The role to all and you're at...", -1.74)
    dots = ("... " * 16, -0.9)
    assert best_attempt([unsure, dots, ("... ... ... ... ... ... ... ...", -1.2)]) == unsure[0]
    assert best_attempt([("... " * 16, -1.5), dots]) == dots[0]  # nothing but loops: the likeliest
