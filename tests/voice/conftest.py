"""Shared fixtures of the voice tests: models load once per test session."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))  # make_test_audio
sys.path.insert(0, str(ROOT))  # `tests.voice.*` helpers, also when pytest runs without `python -m`

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


@pytest.fixture(scope="session")
def engine():
    """The real engine, the model and mode the settings name (VOICE_APP_ENGINE_MODEL / _MODE)."""
    from dllm_engine.engine import Engine
    from voice_app.settings import Settings

    loaded = Engine.load(Settings().engine_model)
    yield loaded
    loaded.close()


@pytest.fixture(scope="session")
def voice_server(engine, speech_models):
    """A real voice server on a free port, sharing the session's models."""
    from voice_app.loaded_models import LoadedModels
    from voice_app.server import BackgroundServer
    from voice_app.settings import Settings

    models = LoadedModels(engine, speech_models["transcriber"], speech_models["synthesizer"], speech_models["vad"])
    server = BackgroundServer(Settings(port=0, max_sessions=3, web_dir=str(ROOT / "web")), models).start()
    yield server
    server.stop()
