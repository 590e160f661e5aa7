"""The input audio buffer: 16 kHz samples addressed by their index in the whole stream."""

from __future__ import annotations

import numpy as np


class InputBuffer:
    """Keeps the stream's recent samples; old audio is dropped explicitly once it is no longer
    needed (after a commit, or beyond the prefix padding while nobody speaks)."""

    def __init__(self, max_samples: int):
        self.max_samples = max_samples
        self.start = 0  # stream index of the first kept sample
        self._chunks: list[np.ndarray] = []
        self._kept = 0

    @property
    def end(self) -> int:
        """Stream index one past the newest sample."""
        return self.start + self._kept

    def append(self, samples: np.ndarray) -> None:
        if len(samples):
            self._chunks.append(samples.astype(np.float32, copy=False))
            self._kept += len(samples)
        if self._kept > self.max_samples:
            self.drop_before(self.end - self.max_samples)

    def slice(self, begin: int, end: int | None = None) -> np.ndarray:
        """Samples [begin, end) of the stream, clipped to what is still kept."""
        audio = np.concatenate(self._chunks) if self._chunks else np.zeros(0, dtype=np.float32)
        self._chunks = [audio] if len(audio) else []
        lo = max(begin, self.start) - self.start
        hi = (self.end if end is None else min(end, self.end)) - self.start
        return audio[lo:max(lo, hi)]

    def drop_before(self, index: int) -> None:
        index = min(max(index, self.start), self.end)
        if index == self.start:
            return
        kept = self.slice(index)
        self._chunks = [kept] if len(kept) else []
        self._kept = len(kept)
        self.start = index

    def clear(self) -> None:
        self.drop_before(self.end)
