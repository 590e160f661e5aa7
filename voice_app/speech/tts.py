"""Streaming speech synthesis, one sentence at a time, at the wire's 24 kHz: hibari (a Kokoro
voice distilled to 7.9 MB, the default, voice "heart") or Piper (the joe voice, `--tts piper`).

Synthesis runs on a few worker threads that take the most urgent sentence of all sessions first
(`PriorityPool`, keyed by when the listener will need the audio). `live_jobs` counts sentences
being synthesised, so tests and /healthz can see that nothing is left running after a session ends.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import numpy as np

from voice_app.audio.pcm import WIRE_RATE, float_to_int16, resample
from voice_app.speech.weights import verify_if_packaged
from voice_app.speech.workers import PriorityPool

log = logging.getLogger(__name__)


class PooledSynthesizer:
    """What every voice shares: the priority pool and the count of live jobs. A voice gives
    `synthesize_blocking` and `voice_path`."""

    voice_path = ""

    def __init__(self, workers: int = 1):
        self._pool = PriorityPool(workers, "tts")
        self._lock = threading.Lock()
        self._live_jobs = 0

    @property
    def live_jobs(self) -> int:
        with self._lock:
            return self._live_jobs

    def synthesize_blocking(self, sentence: str, speed: float = 1.0, varied: bool = True) -> np.ndarray:
        raise NotImplementedError

    async def synthesize(self, sentence: str, speed: float = 1.0, needed_at: float | None = None) -> np.ndarray:
        """needed_at: when the listener will need this audio (time.monotonic(); default now):
        the most urgent sentence of all sessions is synthesised first."""
        with self._lock:
            self._live_jobs += 1
        queued_at = time.monotonic()

        def job() -> np.ndarray:
            log.debug("tts queue wait %.0f ms", (time.monotonic() - queued_at) * 1000)
            return self.synthesize_blocking(sentence, speed)
        pending = self._pool.submit(needed_at if needed_at is not None else queued_at, job)
        future = asyncio.wrap_future(pending)
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            # not started: dropped; started: a cancelled caller must not leave the job counted,
            # so wait for the sentence in flight to finish (~0.1 s)
            if not pending.cancel():
                await asyncio.wait([future])
            raise
        finally:
            with self._lock:
                self._live_jobs -= 1

    def close(self) -> None:
        self._pool.shutdown()


class PiperSynthesizer(PooledSynthesizer):
    """Piper (the "joe" voice, `--tts piper`): an ONNX voice run by the piper package."""

    def __init__(self, voice_path: str, config_path: str | None = None, workers: int = 1):
        from piper import PiperVoice

        super().__init__(workers)
        verify_if_packaged(voice_path)
        self.voice_path = voice_path
        self._voice = PiperVoice.load(voice_path, config_path=config_path)
        self.voice_rate = self._voice.config.sample_rate

    def synthesize_blocking(self, sentence: str, speed: float = 1.0, varied: bool = True) -> np.ndarray:
        """One sentence -> PCM16 samples at 24 kHz (empty when nothing speakable).
        `speed` > 1 speaks faster (Piper's phoneme length scale is its inverse). Piper draws
        random noise for the voice and the phoneme lengths, so no two syntheses match; `varied`
        False turns that off: the same text gives the same audio on every machine (test and
        load-test utterances, where a random take once made Whisper hear "friends" for "France")."""
        from piper.config import SynthesisConfig

        config = SynthesisConfig(length_scale=None if speed == 1.0 else 1.0 / speed,
                                 **({} if varied else {"noise_scale": 0.0, "noise_w_scale": 0.0}))
        chunks = [chunk.audio_float_array for chunk in self._voice.synthesize(sentence, config)]
        if not chunks:
            return np.zeros(0, dtype=np.int16)
        audio = np.concatenate(chunks)
        return float_to_int16(resample(audio, self.voice_rate, WIRE_RATE))


class HibariSynthesizer(PooledSynthesizer):
    """hibari (PyPI hibari-tts, Apache-2.0): its default voice (heart), in the wheel."""

    def __init__(self, voice: str = "heart", workers: int = 1):
        from hibari import Hibari

        super().__init__(workers)
        self.voice_path = f"hibari:{voice}"
        self._tts = Hibari() if voice == "heart" else Hibari(voice=voice)
        self._lock_model = threading.Lock()  # one onnxruntime session: one synthesis at a time

    def synthesize_blocking(self, sentence: str, speed: float = 1.0, varied: bool = True) -> np.ndarray:
        """As Piper's: `varied` False fixes hibari's noise (seed 0), the same audio every time."""
        if not sentence.strip(" .,!?;:-"):
            return np.zeros(0, dtype=np.int16)
        with self._lock_model:
            audio = self._tts(sentence, speed=speed, **({} if varied else {"seed": 0}))
        return float_to_int16(np.asarray(audio, dtype=np.float32))  # already 24 kHz
