"""Drives a Session in-process the way a client would: real-time audio, recorded events."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable

import numpy as np

CHUNK = 2400  # 100 ms at 24 kHz


class EventLog:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self._changed = asyncio.Event()

    async def send(self, event: dict[str, Any]) -> None:
        event["_received_at"] = time.monotonic()
        self.events.append(event)
        self._changed.set()

    def of_type(self, event_type: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == event_type]

    def types(self) -> list[str]:
        return [e["type"] for e in self.events]

    async def wait_for(self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 30.0,
                       start: int = 0) -> dict[str, Any]:
        """The first event from index `start` on that matches; waits for it to arrive."""
        deadline = time.monotonic() + timeout
        while True:
            for event in self.events[start:]:
                if predicate(event):
                    return event
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no matching event within {timeout} s; got {self.types()}")
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except asyncio.TimeoutError:
                pass


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(24000 * seconds), dtype=np.int16)


async def stream_audio(push: Callable[[np.ndarray], Any], samples: np.ndarray, realtime: bool = True) -> None:
    """Feeds audio in 100 ms chunks, paced like a microphone when `realtime`."""
    for offset in range(0, len(samples), CHUNK):
        await push(samples[offset : offset + CHUNK])
        await asyncio.sleep(0.1 if realtime else 0)
