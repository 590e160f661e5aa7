"""The echo gate on real speech: the speaker's echo vs. a person talking over it."""

from __future__ import annotations

import numpy as np
import pytest

from voice_app.audio.pcm import resample
from voice_app.desktop.echo_gate import EchoGate, rms

MIC_RATE = 16000
FRAME = MIC_RATE // 50  # 20 ms mic frames


def words(text: str) -> set[str]:
    return {w.strip(".,!?;:'\"").lower() for w in text.split()} - {""}


@pytest.fixture(scope="module")
def speech_16k(test_audio) -> dict[str, np.ndarray]:
    return {name: resample(samples.astype(np.float32), 24000, MIC_RATE) for name, samples in test_audio.items()}


def run_gate(gate: EchoGate, played: np.ndarray, mic: np.ndarray, echo_delay_s: float) -> np.ndarray:
    """Plays `played` and captures `mic` frame by frame on a simulated clock; returns what the
    gate passed on."""
    passed = []
    for index in range(0, min(len(played), len(mic)) - FRAME + 1, FRAME):
        now = index / MIC_RATE
        gate.played(played[index:index + FRAME], at=now)
        passed.append(gate.filter(mic[index:index + FRAME], captured_at=now + echo_delay_s))
    return np.concatenate(passed)


def echo_of(played: np.ndarray, gain: float, delay_s: float) -> np.ndarray:
    delayed = np.concatenate([np.zeros(int(delay_s * MIC_RATE)), played])[: len(played)]
    noise = np.random.default_rng(0).normal(0, 20, len(played))  # a quiet room
    return gain * delayed + noise


def test_echo_gate_silences_the_assistants_own_voice(speech_16k):
    played = speech_16k["story"]
    # PulseAudio's speaker -> mic delay measured ~0.28 s; the echo reaches the mic 12 dB down
    passed = run_gate(EchoGate(), played, echo_of(played, 0.25, 0.28), echo_delay_s=0.0)
    frames = passed[: len(passed) // FRAME * FRAME].reshape(-1, FRAME)
    assert np.mean([rms(f) == 0 for f in frames]) > 0.9  # the echo barely reaches the VAD


def test_echo_gate_lets_a_person_talking_over_the_assistant_through(speech_16k):
    played = speech_16k["story"]
    user = np.zeros(len(played))
    start = int(1.5 * MIC_RATE)  # the person starts talking 1.5 s into the reply
    interrupt = speech_16k["interrupt"][: len(played) - start]
    user[start:start + len(interrupt)] = interrupt
    mic = echo_of(played, 0.25, 0.28) + user
    passed = run_gate(EchoGate(), played, mic, echo_delay_s=0.0)
    speaking = [i for i in range(start, start + len(interrupt) - FRAME, FRAME) if rms(user[i:i + FRAME]) > 1000]
    through = [i for i in speaking if rms(passed[i:i + FRAME]) > 0]
    assert len(through) >= 0.6 * len(speaking)  # enough of the speech for the VAD to call a barge-in


def test_a_person_who_talked_over_the_reply_before_is_still_heard_whole(speech_16k):
    """The CI failure of 2026-11-30: the person's own frames trained the echo gain, so after
    one overlap the gate shut on their next words and Whisper got scraps ("instead.")."""
    played = np.concatenate([speech_16k["story"]] * 4)  # a long reply that keeps playing
    user = np.zeros(len(played))
    first, second = int(1.0 * MIC_RATE), int(5.5 * MIC_RATE)
    user[first:first + len(speech_16k["story"])] = speech_16k["story"]
    interrupt = speech_16k["interrupt"]
    user[second:second + len(interrupt)] = interrupt
    passed = run_gate(EchoGate(), played, echo_of(played, 0.25, 0.28) + user, echo_delay_s=0.0)
    speaking = [i for i in range(second, second + len(interrupt) - FRAME, FRAME) if rms(user[i:i + FRAME]) > 300]
    through = [i for i in speaking if rms(passed[i:i + FRAME]) > 0]
    assert len(through) >= 0.8 * len(speaking), (len(through), len(speaking))

    from voice_app.settings import Settings
    from voice_app.speech.asr import Transcriber

    settings = Settings()
    transcriber = Transcriber(settings.whisper_model, settings.whisper_compute_type, 1)
    try:
        heard = transcriber.transcribe_blocking(
            passed[second - MIC_RATE // 4: second + len(interrupt) + MIC_RATE // 4].astype(np.float32) / 32768)
    finally:
        transcriber.close()
    assert {"tell", "dogs", "instead"} <= words(heard), heard


def test_echo_gate_passes_everything_while_nothing_plays(speech_16k):
    mic = speech_16k["question"]
    passed = run_gate(EchoGate(), np.zeros(len(mic)), mic, echo_delay_s=0.0)
    assert np.array_equal(passed, mic[: len(passed)])
