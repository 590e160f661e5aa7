"""The models a voice server holds once and shares across sessions: core's model slots
(voice_app/core/models.py) filled with the real engine, Whisper, the voices (Piper, hibari) and Silero."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field

import numpy as np

from voice_app.core.models import Engine
from voice_app.settings import VOICES, Settings
from voice_app.speech.asr import Transcriber
from voice_app.speech.tts import HibariSynthesizer, PiperSynthesizer, PooledSynthesizer
from voice_app.speech.vad import SileroVad

log = logging.getLogger(__name__)


def make_voice(kind: str, settings: Settings) -> PooledSynthesizer:
    if kind == "hibari":
        return HibariSynthesizer(workers=settings.tts_workers)
    return PiperSynthesizer(settings.piper_voice, settings.piper_config, settings.tts_workers)


@dataclass
class LoadedModels:
    engine: Engine  # dllm_engine.engine.Engine
    transcriber: Transcriber
    synthesizer: PooledSynthesizer  # the default voice (settings.tts)
    vad: SileroVad
    voices: dict[str, PooledSynthesizer] = field(default_factory=dict)  # by name, the default's included

    def voice(self, name: str) -> PooledSynthesizer:
        return self.voices.get(name, self.synthesizer)

    @property
    def tts_live_jobs(self) -> int:
        return sum(v.live_jobs for v in self._all_voices())

    def _all_voices(self) -> list[PooledSynthesizer]:
        return list({id(v): v for v in [self.synthesizer, *self.voices.values()]}.values())

    @classmethod
    def load(cls, settings: Settings, engine: Engine | None = None) -> "LoadedModels":
        """Loads every model named in the settings (an already-loaded engine may be passed in)."""
        started = time.monotonic()
        if engine is None:
            from dllm_engine.engine import Engine as DiffusionEngine

            engine = DiffusionEngine.load(settings.engine_model, device=settings.engine_device)
        transcriber = Transcriber(settings.whisper_model, settings.whisper_compute_type,
                                  settings.whisper_cpu_threads, settings.asr_workers, settings.whisper_final_beam)
        voices = {name: make_voice(kind, settings) for name, kind in VOICES.items()}
        models = cls(engine, transcriber, voices[settings.default_voice], SileroVad(), voices)
        models.warm_up(settings)
        log.info("models loaded and warmed up in %.1f s: %s", time.monotonic() - started, models.describe())
        return models

    def warm_up(self, settings: Settings) -> None:
        """One tiny run of each model, so the first user's turn does not pay for lazy setup
        (ONNX / CTranslate2 first-run allocation, engine kernels)."""
        from dllm_engine.request import GenerationParams

        self.transcriber.transcribe_blocking(np.zeros(16000, dtype=np.float32))
        for voice in self._all_voices():
            voice.synthesize_blocking("Hello.")
        self.vad.stream().process(np.zeros(1024, dtype=np.float32))
        params = GenerationParams(max_new_tokens=2, mode=settings.engine_mode)
        self.engine.submit([{"role": "user", "content": "Hi."}], params).result()
        choose_mode = getattr(self.engine, "choose_mode", None)
        if settings.engine_mode == "auto" and choose_mode is not None:
            choose_mode(GenerationParams(deadline_s=settings.reply_deadline_s))  # as replies are asked for

    def describe(self) -> dict[str, str]:
        """The models by name: file names only, never where this machine keeps them (/healthz
        is readable by anyone who can reach the server)."""
        return {
            "engine": os.path.basename(str(getattr(self.engine, "model_name", type(self.engine).__name__))),
            "asr": os.path.basename(self.transcriber.model_name.rstrip("/")),
            "tts": os.path.basename(self.synthesizer.voice_path),
            "voices": ",".join(self.voices) or os.path.basename(self.synthesizer.voice_path),
            "vad": os.path.basename(self.vad.path),
        }

    def close(self) -> None:
        self.transcriber.close()
        for voice in self._all_voices():
            voice.close()
        close_engine = getattr(self.engine, "close", None)
        if close_engine is not None:
            close_engine()
