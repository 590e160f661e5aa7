"""Event-loop lag: how late a timer on the server's loop fires. Every session shares the loop,
so anything that holds it (a tokenizer, a VAD run, a huge JSON parse) shows here first:
`voice_event_loop_lag_ms` in /metrics (a histogram, and the worst of the last window), and
`event_loop_lag_ms` in /healthz."""

from __future__ import annotations

import asyncio
import time
from collections import deque

from voice_app.core.metrics import Histogram

TICK_S = 0.1
WINDOW_S = 10.0
LAG_BUCKETS_MS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000)


class LoopLagMonitor:
    def __init__(self) -> None:
        self.histogram = Histogram("voice_event_loop_lag_ms", "How late a 100 ms timer on the event loop fired (ms)",
                                   buckets=LAG_BUCKETS_MS)
        self._recent: deque[tuple[float, float]] = deque()  # (when, lag ms)
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="loop-lag")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    def recent_max_ms(self) -> float:
        """The worst lag of the last WINDOW_S seconds."""
        cutoff = time.monotonic() - WINDOW_S
        return max((lag for at, lag in self._recent if at >= cutoff), default=0.0)

    async def _run(self) -> None:
        while True:
            before = time.monotonic()
            await asyncio.sleep(TICK_S)
            now = time.monotonic()
            lag_ms = max(0.0, (now - before - TICK_S) * 1000.0)
            self.histogram.observe(lag_ms)
            self._recent.append((now, lag_ms))
            while self._recent and self._recent[0][0] < now - WINDOW_S:
                self._recent.popleft()
