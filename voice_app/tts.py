"""Streaming speech synthesis: Piper, one sentence at a time, resampled to the wire's 24 kHz.

Synthesis runs in a bounded thread pool. `live_jobs` counts sentences being synthesised, so
tests and /healthz can see that nothing is left running after a session ends.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from voice_app.audio.pcm import WIRE_RATE, float_to_int16, resample

log = logging.getLogger(__name__)


class Synthesizer:
    def __init__(self, voice_path: str, config_path: str | None = None, workers: int = 1):
        from piper import PiperVoice

        self.voice_path = voice_path
        self._voice = PiperVoice.load(voice_path, config_path=config_path)
        self.voice_rate = self._voice.config.sample_rate
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tts")
        self._lock = threading.Lock()
        self._live_jobs = 0

    @property
    def live_jobs(self) -> int:
        with self._lock:
            return self._live_jobs

    def synthesize_blocking(self, sentence: str, speed: float = 1.0) -> np.ndarray:
        """One sentence -> PCM16 samples at 24 kHz (empty when nothing speakable).
        `speed` > 1 speaks faster (Piper's phoneme length scale is its inverse)."""
        from piper.config import SynthesisConfig

        config = SynthesisConfig(length_scale=None if speed == 1.0 else 1.0 / speed)
        chunks = [chunk.audio_float_array for chunk in self._voice.synthesize(sentence, config)]
        if not chunks:
            return np.zeros(0, dtype=np.int16)
        audio = np.concatenate(chunks)
        return float_to_int16(resample(audio, self.voice_rate, WIRE_RATE))

    async def synthesize(self, sentence: str, speed: float = 1.0) -> np.ndarray:
        with self._lock:
            self._live_jobs += 1
        try:
            loop = asyncio.get_running_loop()
            queued_at = time.monotonic()

            def job() -> np.ndarray:
                log.debug("tts queue wait %.0f ms", (time.monotonic() - queued_at) * 1000)
                return self.synthesize_blocking(sentence, speed)
            future = loop.run_in_executor(self._pool, job)
            # A cancelled caller must not leave the job counted: wait for the thread to finish.
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            await asyncio.wait([future])  # the sentence in flight finishes (~0.1 s), then stops
            raise
        finally:
            with self._lock:
                self._live_jobs -= 1

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
