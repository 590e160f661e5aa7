"""Streaming voice activity detection: Silero VAD (the ONNX file faster-whisper ships) + turn rules.

`SileroVad` holds the ONNX session (shared by all sessions; onnxruntime runs are thread-safe).
`VadStream` is one audio stream's recurrent state. `TurnDetector` turns per-window speech
probabilities into speech start / pause / stop events with server_vad semantics.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Literal

import numpy as np
import onnxruntime

from voice_app.audio.pcm import ASR_RATE

log = logging.getLogger(__name__)

WINDOW = 512  # samples at 16 kHz (32 ms): the window Silero is trained on
CONTEXT = 64  # samples of the previous window the model sees in front of each window
WINDOW_MS = WINDOW * 1000 // ASR_RATE
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


@dataclass(frozen=True)
class TurnEvent:
    kind: Literal["speech_started", "pause", "speech_stopped"]
    sample: int  # 16 kHz sample index in the stream where the event applies


@dataclass
class TurnRules:
    threshold: float = 0.5
    silence_duration_ms: int = 500
    pause_ms: int = 160  # shorter silence inside a turn: the moment to draft speculatively


class TurnDetector:
    """server_vad semantics: speech starts when a window's probability reaches the threshold,
    ends after `silence_duration_ms` below (threshold - 0.15) (hysteresis against flicker)."""

    def __init__(self, rules: TurnRules):
        self.rules = rules
        self.in_speech = False
        self.windows_seen = 0
        self.speech_start_sample = 0
        self.last_speech_sample = 0
        self._silent_windows = 0
        self._pause_sent = False

    def speech_ms(self) -> int:
        """How long the current turn's speech has lasted (0 when not in speech)."""
        if not self.in_speech:
            return 0
        return (self.windows_seen * WINDOW - self.speech_start_sample) * 1000 // ASR_RATE

    def feed(self, prob: float) -> list[TurnEvent]:
        start = self.windows_seen * WINDOW
        self.windows_seen += 1
        if not self.in_speech:
            if prob >= self.rules.threshold:
                self.in_speech = True
                self.speech_start_sample = start
                self.last_speech_sample = start + WINDOW
                self._silent_windows = 0
                self._pause_sent = False
                return [TurnEvent("speech_started", start)]
            return []
        if prob >= max(self.rules.threshold - 0.15, 0.01):
            self.last_speech_sample = start + WINDOW
            self._silent_windows = 0
            self._pause_sent = False
            return []
        self._silent_windows += 1
        silence_ms = self._silent_windows * WINDOW_MS
        if silence_ms >= self.rules.silence_duration_ms:
            self.in_speech = False
            return [TurnEvent("speech_stopped", self.last_speech_sample)]
        if silence_ms >= self.rules.pause_ms and not self._pause_sent:
            self._pause_sent = True
            return [TurnEvent("pause", self.last_speech_sample)]
        return []

    def force_stop(self) -> TurnEvent | None:
        if not self.in_speech:
            return None
        self.in_speech = False
        return TurnEvent("speech_stopped", self.last_speech_sample)
