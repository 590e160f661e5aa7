"""PCM16 <-> float conversion and streaming resampling (soxr)."""

from __future__ import annotations

import base64
import binascii

import numpy as np
import soxr

WIRE_RATE = 24000  # the realtime protocol's PCM16 rate, both directions
ASR_RATE = 16000  # what Whisper and Silero want


class AudioFormatError(ValueError):
    """Audio bytes that are not valid PCM16 mono."""


def decode_base64_pcm16(data: str) -> np.ndarray:
    """base64 text -> int16 samples; names what was wrong when it is not PCM16."""
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise AudioFormatError(f"audio is not valid base64: {exc}") from exc
    return pcm16_bytes_to_int16(raw)


def pcm16_bytes_to_int16(raw: bytes) -> np.ndarray:
    if len(raw) % 2:
        raise AudioFormatError(
            f"audio must be PCM16 (2 bytes a sample); got {len(raw)} bytes, an odd length"
        )
    return np.frombuffer(raw, dtype="<i2").astype(np.int16)


def encode_base64_pcm16(samples: np.ndarray) -> str:
    return base64.b64encode(samples.astype("<i2").tobytes()).decode("ascii")


def int16_to_float(samples: np.ndarray) -> np.ndarray:
    return samples.astype(np.float32) / 32768.0


def float_to_int16(samples: np.ndarray) -> np.ndarray:
    return (np.clip(samples, -1.0, 1.0) * 32767.0).astype(np.int16)


class StreamResampler:
    """Resamples a stream chunk by chunk without clicks at chunk borders."""

    def __init__(self, in_rate: int, out_rate: int):
        self.in_rate = in_rate
        self.out_rate = out_rate
        self._stream = None if in_rate == out_rate else soxr.ResampleStream(
            in_rate, out_rate, 1, dtype="float32", quality="HQ"
        )

    def process(self, samples: np.ndarray, last: bool = False) -> np.ndarray:
        samples = samples.astype(np.float32, copy=False)
        if self._stream is None:
            return samples
        return self._stream.resample_chunk(samples, last=last)


def resample(samples: np.ndarray, in_rate: int, out_rate: int) -> np.ndarray:
    """One-shot resampling of a whole float32 signal."""
    if in_rate == out_rate:
        return samples.astype(np.float32, copy=False)
    return soxr.resample(samples.astype(np.float32, copy=False), in_rate, out_rate, quality="HQ")
