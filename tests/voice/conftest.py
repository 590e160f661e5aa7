"""Shared fixtures of the voice tests: models load once per test session."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from make_test_audio import ensure_test_audio, read_wav  # noqa: E402


@pytest.fixture(scope="session")
def test_audio() -> dict[str, np.ndarray]:
    """Piper-spoken test utterances, PCM16 mono 24 kHz, keyed by name."""
    return {name: read_wav(path) for name, path in ensure_test_audio().items()}


@pytest.fixture(scope="session")
def speech_models():
    """The real Whisper, Piper and Silero models (no engine)."""
    from voice_app.asr import Transcriber
    from voice_app.audio.vad import SileroVad
    from voice_app.settings import Settings
    from voice_app.tts import Synthesizer

    settings = Settings()
    transcriber = Transcriber(settings.whisper_model, settings.whisper_compute_type, settings.whisper_cpu_threads)
    synthesizer = Synthesizer(settings.piper_voice)
    yield {"transcriber": transcriber, "synthesizer": synthesizer, "vad": SileroVad()}
    transcriber.close()
    synthesizer.close()
