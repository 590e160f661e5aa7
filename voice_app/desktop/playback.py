"""Reply audio on the speaker, and how much of each reply the speaker really played.

`Speaker` holds the queue the output stream's callback pulls from (on PortAudio's thread) and
opens one `DeviceAudioSink` per response. Each queued chunk is tagged with its sink, so `pull`
counts the samples actually handed to the device per response: a barge-in truncates the reply
to what was played, not to an estimate.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import Any

import numpy as np

from voice_app.audio.pcm import WIRE_RATE, StreamResampler, float_to_int16, int16_to_float


class PlaybackQueue:
    """Audio waiting for the output stream (int16 at the device rate), each chunk with its owner,
    whose `played_samples` the queue raises as the chunk is played. Thread-safe: the loop pushes
    and clears, the output callback pulls."""

    def __init__(self) -> None:
        self._chunks: deque[tuple[Any, np.ndarray]] = deque()
        self._lock = threading.Lock()

    def push(self, owner: Any, samples: np.ndarray) -> None:
        with self._lock:
            self._chunks.append((owner, samples))

    def pull(self, count: int) -> np.ndarray:
        """The next `count` samples (silence where the queue runs dry)."""
        out = np.zeros(count, dtype=np.int16)
        filled = 0
        with self._lock:
            while filled < count and self._chunks:
                owner, chunk = self._chunks[0]
                take = min(count - filled, len(chunk))
                out[filled:filled + take] = chunk[:take]
                filled += take
                owner.played_samples += take
                if take == len(chunk):
                    self._chunks.popleft()
                else:
                    self._chunks[0] = (owner, chunk[take:])
        return out

    def played(self, owner: Any) -> int:
        with self._lock:
            return owner.played_samples

    def queued(self, owner: Any) -> int:
        with self._lock:
            return sum(len(chunk) for who, chunk in self._chunks if who is owner)

    def clear(self) -> None:
        with self._lock:
            self._chunks.clear()


class DeviceAudioSink:
    """One response's audio on the sound card (core.audio_sink.AudioSink)."""

    def __init__(self, speaker: "Speaker"):
        self._speaker = speaker
        self.epoch = 0  # advanced by clear() and close(): see core/audio_sink.py
        self.played_samples = 0  # at the device rate; raised by the output stream's callback

    async def push(self, chunk: np.ndarray, epoch: int) -> bool:
        # no await between the check and the queueing, and clear() runs on the same loop: a
        # chunk decided before a clear can never be queued after it
        if epoch != self.epoch:
            return False
        self._speaker.queue.push(self, self._speaker.to_device_rate(chunk))
        return True

    def heard_ms(self) -> float:
        return self._speaker.queue.played(self) * 1000.0 / self._speaker.rate

    def left_ms(self) -> float:
        return self._speaker.queue.queued(self) * 1000.0 / self._speaker.rate

    def clear(self) -> float:
        """Empties the speaker's queue (a barge-in silences whatever is queued, not just this reply)."""
        self.epoch += 1
        self._speaker.queue.clear()
        return self.heard_ms()

    def close(self) -> None:
        self.epoch += 1


class Speaker:
    """The output stream's side of desktop mode: one queue, one resampler for every reply."""

    def __init__(self, rate: int):
        self.rate = rate
        self.queue = PlaybackQueue()
        self._resampler = StreamResampler(WIRE_RATE, rate)  # one stream: no clicks between replies

    def open_sink(self, ids: dict[str, Any]) -> DeviceAudioSink:
        """A sink for the next response (core.audio_sink.OpenSink); the ids are the wire's, unused here."""
        return DeviceAudioSink(self)

    def to_device_rate(self, chunk_24k: np.ndarray) -> np.ndarray:
        return float_to_int16(self._resampler.process(int16_to_float(chunk_24k)))

    def pull(self, frames: int) -> np.ndarray:
        return self.queue.pull(frames)
