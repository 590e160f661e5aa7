"""The encoder window an utterance is decoded in: just long enough for it plus a margin, in
steps, never past Whisper's 30 s; partials in shorter windows than finals."""

from __future__ import annotations

from voice_app.speech.asr import FINAL_WINDOW, FULL_WINDOW_FRAMES, PARTIAL_WINDOW, WINDOW_MARGIN_FRAMES


def test_a_partial_window_holds_the_utterance_and_a_second_of_margin_in_one_second_steps():
    assert PARTIAL_WINDOW.frames(220) == 400  # 2.2 s + 1 s -> 4 s
    assert PARTIAL_WINDOW.frames(300) == 400
    assert PARTIAL_WINDOW.frames(301) == 500


def test_a_short_partial_still_gets_three_seconds():
    assert PARTIAL_WINDOW.frames(10) == 300


def test_a_final_window_is_at_least_ten_seconds_in_five_second_steps():
    assert FINAL_WINDOW.frames(220) == 1000
    assert FINAL_WINDOW.frames(950) == 1500


def test_no_window_passes_whispers_thirty_seconds_and_every_window_fits_its_utterance():
    for policy in (PARTIAL_WINDOW, FINAL_WINDOW):
        assert policy.frames(2900) == FULL_WINDOW_FRAMES
        for frames in range(1, FULL_WINDOW_FRAMES - WINDOW_MARGIN_FRAMES, 37):
            assert policy.frames(frames) >= frames + WINDOW_MARGIN_FRAMES
