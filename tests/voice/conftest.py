"""Shared fixtures of the voice tests: models load once per test session."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from .utterances import spoken_utterances

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def test_audio() -> dict[str, np.ndarray]:
    """Piper-spoken test utterances, PCM16 mono 24 kHz, keyed by name (utterances.py)."""
    return spoken_utterances()


@pytest.fixture(scope="session")
def speech_models():
    """The real Whisper, Piper and Silero models (no engine)."""
    from voice_app.settings import Settings
    from voice_app.speech.asr import Transcriber
    from voice_app.speech.tts import PiperSynthesizer
    from voice_app.speech.vad import SileroVad

    settings = Settings()
    transcriber = Transcriber(settings.whisper_model, settings.whisper_compute_type, settings.whisper_cpu_threads)
    synthesizer = PiperSynthesizer(settings.piper_voice)
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
    from voice_app.realtime.server import BackgroundServer
    from voice_app.settings import Settings
    from voice_app.speech.loaded_models import LoadedModels

    models = LoadedModels(engine, speech_models["transcriber"], speech_models["synthesizer"], speech_models["vad"])
    server = BackgroundServer(Settings(port=0, max_sessions=3, web_dir=str(ROOT / "web")), models).start()
    yield server
    server.stop()


@pytest.fixture
def make_server(voice_server):
    """More real servers on free ports, sharing the session's models, each with its own settings
    (`make_server(send_timeout_s=2)`); stopped after the test."""
    from voice_app.realtime.server import BackgroundServer
    from voice_app.settings import Settings

    started = []

    def make(models=None, **settings):
        defaults = {"port": 0, "max_sessions": 3, "web_dir": str(ROOT / "web"), "turn_detection": "server_vad"}
        server = BackgroundServer(Settings(**{**defaults, **settings}), models or voice_server.voice_server.models)
        started.append(server.start())
        return server

    yield make
    for server in started:
        server.stop()
