"""Streaming voice activity detection: Silero VAD (the ONNX file faster-whisper ships).

`SileroVad` holds the ONNX session (shared by all sessions; onnxruntime runs are thread-safe).
`VadStream` is one audio stream's recurrent state. core/turn_detector.py turns its per-window
speech probabilities into turns.
"""

from __future__ import annotations

import logging
import os

import numpy as np
import onnxruntime

from voice_app.audio.pcm import ASR_RATE
from voice_app.core.models import VAD_WINDOW

log = logging.getLogger(__name__)

WINDOW = VAD_WINDOW
CONTEXT = 64  # samples of the previous window the model sees in front of each window
STATE_RESET_WINDOWS = 30 * 60 * ASR_RATE // WINDOW  # reset the LSTM state every ~30 min of silence


def silero_model_path() -> str:
    import faster_whisper

    return os.path.join(os.path.dirname(faster_whisper.__file__), "assets", "silero_vad_v6.onnx")


class SileroVad:
    def __init__(self, path: str | None = None):
        opts = onnxruntime.SessionOptions()
        opts.inter_op_num_threads = 1
        opts.intra_op_num_threads = 1
        opts.log_severity_level = 3
        self.path = path or silero_model_path()
        self.session = onnxruntime.InferenceSession(
            self.path, providers=["CPUExecutionProvider"], sess_options=opts
        )

    def stream(self) -> "VadStream":
        return VadStream(self)


class VadStream:
    """Feeds 16 kHz float audio of any chunk size; yields one speech probability per window."""

    def __init__(self, vad: SileroVad):
        self._session = vad.session
        self._pending = np.zeros(0, dtype=np.float32)
        self.reset_state()

    def reset_state(self) -> None:
        self._h = np.zeros((1, 1, 128), dtype=np.float32)
        self._c = np.zeros((1, 1, 128), dtype=np.float32)
        self._context = np.zeros(CONTEXT, dtype=np.float32)
        self._windows_since_reset = 0

    def process(self, samples: np.ndarray) -> list[float]:
        self._pending = np.concatenate([self._pending, samples.astype(np.float32, copy=False)])
        probs: list[float] = []
        while len(self._pending) >= WINDOW:
            window, self._pending = self._pending[:WINDOW], self._pending[WINDOW:]
            probs.append(self._run_window(window))
        return probs

    def _run_window(self, window: np.ndarray) -> float:
        model_input = np.concatenate([self._context, window])[None, :]
        prob, self._h, self._c = self._session.run(
            None, {"input": model_input, "h": self._h, "c": self._c}
        )
        self._context = window[-CONTEXT:].copy()
        self._windows_since_reset += 1
        return float(prob[0])

    def reset_if_long_idle(self) -> None:
        """Silero's state drifts over very long streams; a reset in silence is harmless."""
        if self._windows_since_reset >= STATE_RESET_WINDOWS:
            self.reset_state()
