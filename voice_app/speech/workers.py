"""Worker threads that take the most urgent job first, for the models every session shares.

With many sessions on one Whisper or one Piper, a plain FIFO pool makes a turn's final
transcript wait behind other sessions' partials, and a reply's first sentence wait behind the
fourth sentence of a reply that has seconds of audio still to play. Here each job carries a
deadline-like key (smaller = sooner; equal keys run in submission order) and an idle worker
takes the smallest.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from concurrent.futures import Future
from typing import Any, Callable


class PriorityPool:
    def __init__(self, workers: int, name: str):
        self._jobs: list[tuple[float, int, Future, Callable[..., Any], tuple]] = []
        self._order = itertools.count()
        self._ready = threading.Condition()
        self._closed = False
        self._live = 0  # jobs submitted and not yet finished or dropped
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True) for i in range(workers)]
        for thread in self._threads:
            thread.start()

    def submit(self, key: float, function: Callable[..., Any], *args: Any) -> Future:
        future: Future = Future()
        with self._ready:
            if self._closed:
                raise RuntimeError("the pool is shut down")
            heapq.heappush(self._jobs, (key, next(self._order), future, function, args))
            self._live += 1
            self._ready.notify()
        return future

    @property
    def live_jobs(self) -> int:
        """Queued and running jobs (a cancelled one counts until a worker drops it)."""
        with self._ready:
            return self._live

    def _work(self) -> None:
        while True:
            with self._ready:
                while not self._jobs and not self._closed:
                    self._ready.wait()
                if not self._jobs:  # closed and drained
                    return
                _key, _order, future, function, args = heapq.heappop(self._jobs)
            try:
                if future.set_running_or_notify_cancel():
                    self._run(future, function, args)
            finally:
                with self._ready:
                    self._live -= 1

    @staticmethod
    def _run(future: Future, function: Callable[..., Any], args: tuple) -> None:
        try:
            future.set_result(function(*args))
        except BaseException as exc:  # handed to the waiter, never kills the worker
            future.set_exception(exc)

    def shutdown(self) -> None:
        """Cancels the jobs not started; the running ones finish."""
        with self._ready:
            self._closed = True
            for _key, _order, future, _function, _args in self._jobs:
                future.cancel()
            self._live -= len(self._jobs)
            self._jobs.clear()
            self._ready.notify_all()
