"""Speech recognition: faster-whisper decodes an utterance (the session re-decodes the open one;
core/local_agreement.py turns the changing hypotheses into a stable prefix and a tail).

Decoding runs in a bounded thread pool, never on the event loop.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time

import numpy as np

from voice_app.speech.transcript_guard import collapse_repetitions, looks_failed
from voice_app.speech.weights import verify_if_packaged, whisper_model_path
from voice_app.speech.workers import PriorityPool

log = logging.getLogger(__name__)


SAMPLE_RATE = 16000
FULL_WINDOW_FRAMES = 3000  # Whisper's native 30 s encoder window (100 mel frames a second)
MIN_WINDOW_FRAMES = 1000  # shorter windows than 10 s make tiny models loop; 10 s is safe
WINDOW_STEP_FRAMES = 500
NO_SPEECH_THRESHOLD = 0.6  # above this (and a low log-probability), the window is silence
SILENT_LOG_PROB = -1.0  # faster-whisper's pair: no_speech_prob > 0.6 and avg log-prob < -1.0
FALLBACK_TEMPERATURES = (0.4, 0.8)  # a final decode that looks failed is retried at these


def best_attempt(attempts: list[tuple[str, float | None]]) -> str:
    """The last decode, unless it too looks failed: then the likeliest of them all (faster-whisper's
    rule; a sampled retry of a failed decode is often worse than the beam's)."""
    text, log_prob = attempts[-1]
    if len(attempts) == 1 or not looks_failed(text, log_prob):
        return text
    return max(attempts, key=lambda attempt: -math.inf if attempt[1] is None else attempt[1])[0]


class Transcriber:
    """One faster-whisper model shared by all sessions, with a fixed number of decode workers.

    Utterances shorter than ~28 s are encoded in a window just long enough for them (at least
    10 s) instead of Whisper's padded 30 s: the encoder's cost scales with the window, so a
    short turn decodes several times faster with the same words.
    """

    def __init__(self, model: str, compute_type: str = "int8", cpu_threads: int = 2, workers: int = 1,
                 final_beam: int = 3):
        from faster_whisper import WhisperModel
        from faster_whisper.tokenizer import Tokenizer

        path = whisper_model_path(model)
        verify_if_packaged(path)
        self.model_name = model
        self._model = WhisperModel(
            path, device="cpu", compute_type=compute_type, cpu_threads=cpu_threads, num_workers=workers
        )
        multilingual = self._model.model.is_multilingual
        tokenizer = Tokenizer(self._model.hf_tokenizer, multilingual, task="transcribe",
                              language="en" if multilingual else None)
        self._tokenizer = tokenizer
        self._prompt = [*tokenizer.sot_sequence, tokenizer.no_timestamps]
        self.final_beam = final_beam  # beam search for a turn's final transcript; partials stay greedy
        self._pool = PriorityPool(workers, "asr")
        self._workers = workers
        self._lock = threading.Lock()
        self._queued = 0

    @property
    def live_jobs(self) -> int:
        """Decodes queued or running, for /healthz and /metrics (0 once every session is gone)."""
        return self._pool.live_jobs

    @property
    def busy(self) -> bool:
        """True when every worker has a job waiting: partials should skip a beat."""
        with self._lock:
            return self._queued >= self._workers

    def transcribe_blocking(self, audio_16k: np.ndarray, final: bool = False) -> str:
        """final: a turn's closing transcript: beam search, and faster-whisper's fallback to
        sampling when the decode looks failed; every transcript loses a decoding loop's repeats."""
        features = self._model.feature_extractor(audio_16k)
        frames = features.shape[-1]
        if frames < 10:
            return ""
        if frames > FULL_WINDOW_FRAMES - 200:
            return collapse_repetitions(self._transcribe_long(audio_16k))
        attempts = [self._decode_window(features, frames, self.final_beam if final else 1)]
        for temperature in FALLBACK_TEMPERATURES if final else ():
            if not looks_failed(*attempts[-1]):
                break
            attempts.append(self._decode_window(features, frames, 1, temperature))
        return collapse_repetitions(best_attempt(attempts))

    def _decode_window(self, features: np.ndarray, frames: int, beam: int = 1,
                       temperature: float = 0.0) -> tuple[str, float | None]:
        """One greedy decode of a window just long enough for the utterance.

        Not `WhisperModel.transcribe`: it pads every segment to Whisper's 30 s window
        (`pad_or_trim`), which costs a short turn several times the encoder time, and it judges
        silence by the no-speech probability together with the average log-probability. This
        path uses faster-whisper's internals instead (`WhisperModel.model`, the CTranslate2
        Whisper, and `.feature_extractor`, `.hf_tokenizer`, `faster_whisper.tokenizer.Tokenizer`),
        so pyproject.toml pins faster-whisper to the exact version it was written against; the
        slow speech tests run it on the real model.
        """
        import ctranslate2

        window = -(-(frames + 100) // WINDOW_STEP_FRAMES) * WINDOW_STEP_FRAMES
        window = min(FULL_WINDOW_FRAMES, max(MIN_WINDOW_FRAMES, window))
        padded = np.zeros((1, features.shape[0], window), dtype=np.float32)
        padded[0, :, :frames] = features[:, :frames]
        seconds = frames / 100.0
        sampling = {"sampling_temperature": temperature, "sampling_topk": 0} if temperature > 0 else {}
        result = self._model.model.generate(
            ctranslate2.StorageView.from_array(padded), [self._prompt], beam_size=beam,
            max_length=int(16 + 8 * seconds), return_no_speech_prob=True, return_scores=True, **sampling,
        )[0]
        tokens = result.sequences_ids[0]
        # ctranslate2's score: the sequence's log-probability normalised by its length
        log_prob = float(result.scores[0]) if result.scores else None
        if result.no_speech_prob > NO_SPEECH_THRESHOLD and (log_prob is None or log_prob < SILENT_LOG_PROB):
            return "", log_prob
        return self._tokenizer.decode(tokens).strip(), log_prob

    def _transcribe_long(self, audio_16k: np.ndarray) -> str:
        segments, _info = self._model.transcribe(
            audio_16k, language="en", beam_size=1, temperature=0.0,
            condition_on_previous_text=False, without_timestamps=True, vad_filter=False,
        )
        return " ".join(segment.text.strip() for segment in segments).strip()

    async def transcribe(self, audio_16k: np.ndarray, final: bool = False) -> str:
        """final: a turn's closing transcript, which someone waits on: it goes before every
        queued partial (of any session)."""
        with self._lock:
            self._queued += 1
        try:
            queued_at = time.monotonic()

            def job() -> str:
                log.debug("asr queue wait %.0f ms (%s)", (time.monotonic() - queued_at) * 1000,
                          "final" if final else "partial")
                return self.transcribe_blocking(audio_16k, final)
            return await asyncio.wrap_future(self._pool.submit(0.0 if final else 1.0, job))
        finally:
            with self._lock:
                self._queued -= 1

    def close(self) -> None:
        self._pool.shutdown()
