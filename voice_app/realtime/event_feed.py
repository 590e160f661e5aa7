"""A realtime client's view of the server's events: each kept in arrival order, and a wait for
the first one that matches. The load generator's connections and the tests' clients use it."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Generic, Iterable, TypeVar

T = TypeVar("T")


class EventFeed(Generic[T]):
    def __init__(self) -> None:
        self.items: list[T] = []
        self.ended: Exception | None = None  # why no more will come (the connection closed)
        self._arrived = asyncio.Event()

    def append(self, item: T) -> None:
        self.items.append(item)
        self._arrived.set()

    def end(self, reason: Exception) -> None:
        """No more items will come; a wait that runs out of them raises `reason`."""
        self.ended = reason
        self._arrived.set()

    async def wait_for(self, predicate: Callable[[T], bool], start: int = 0, timeout_s: float = 60.0,
                       what: str = "matching event") -> tuple[int, T]:
        """The first item at index >= start matching `predicate`, as (index, item); waits for it
        to arrive. TimeoutError after `timeout_s`; `ended` once the feed ended without one."""
        deadline = time.monotonic() + timeout_s
        index = start
        while True:
            while index < len(self.items):
                if predicate(self.items[index]):
                    return index, self.items[index]
                index += 1
            if self.ended is not None:
                raise self.ended
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no {what} within {timeout_s:.0f} s")
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), left)
            except asyncio.TimeoutError:
                pass


AUDIO_DELTAS = ("response.output_audio.delta", "response.output_audio_transcript.delta")


def audio_after_clear(events: Iterable[dict[str, Any]], response_id: str) -> int:
    """The response's audio and audio-transcript deltas that came while its output was cleared:
    after an `output_audio_buffer.cleared` for it and before the next `output_audio_buffer.started`
    (a paused reply resuming). The server guarantees there are none (docs/protocol.md)."""
    cleared, stale = False, 0
    for event in events:
        if event.get("response_id") != response_id:
            continue
        if event["type"] == "output_audio_buffer.cleared":
            cleared = True
        elif event["type"] == "output_audio_buffer.started":
            cleared = False
        elif cleared and event["type"] in AUDIO_DELTAS:
            stale += 1
    return stale
