"""Utterances that wait for the Whisper worker together are decoded together.

Whisper decodes a batch of utterances in one call for less than one call each (4 greedy
partials: 1.27x faster; 4 beam-3 finals: 1.34x), and under load the worker is the queue: with
eight sessions, finals arrived faster than one at a time could drain them. So a decode request
does not become a worker job of its own: it joins the batch waiting for the worker, and the
first to wait submits the one job that takes them all (up to `max_batch`; any left over get the
next job).
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from typing import Callable, Generic, Iterable, TypeVar

from voice_app.speech.workers import PriorityPool

log = logging.getLogger(__name__)


Item = TypeVar("Item")  # what one decode needs (the transcriber's: the audio and its context)


class WaitingBatch(Generic[Item]):
    """decode(items) -> (index, text) of each, as each is ready; key: the pool's urgency of
    this kind's jobs."""

    def __init__(self, pool: PriorityPool, key: float,
                 decode: Callable[[list[Item]], Iterable[tuple[int, str]]],
                 max_batch: int, kind: str):
        self._pool, self._key, self._decode = pool, key, decode
        self.max_batch, self.kind = max_batch, kind
        self._lock = threading.Lock()
        self._waiting: list[tuple[Item, Future, float]] = []  # no worker has taken them yet

    def add(self, item: Item) -> Future:
        """The utterance's text, once a worker has decoded it with those waiting beside it."""
        future: Future = Future()
        with self._lock:
            self._waiting.append((item, future, time.monotonic()))
            first = len(self._waiting) == 1
        if first:
            self._submit(future)
        return future

    def _submit(self, future: Future | None = None) -> None:
        try:
            self._pool.submit(self._key, self._decode_waiting)
        except RuntimeError:  # the pool is shut down: nobody will take it (cancel() drops the rest)
            if future is not None:
                future.cancel()

    def _decode_waiting(self) -> None:
        with self._lock:
            batch, self._waiting = self._waiting[:self.max_batch], self._waiting[self.max_batch:]
            more = bool(self._waiting)
        if more:  # those past the limit: the next job
            self._submit()
        batch = [item for item in batch if item[1].set_running_or_notify_cancel()]
        if not batch:
            return
        log.debug("asr queue wait %.0f ms (%d %s)", (time.monotonic() - batch[0][2]) * 1000, len(batch), self.kind)
        futures = [future for _, future, _ in batch]
        try:
            for index, text in self._decode([item for item, _, _ in batch]):
                futures[index].set_result(text)  # at once: the others' retries are not its wait
        except BaseException as exc:  # every waiter not answered yet hears it; the worker goes on
            for future in futures:
                if not future.done():
                    future.set_exception(exc)
            return
        for future in futures:
            if not future.done():
                future.set_exception(RuntimeError("the decode gave this utterance no transcript"))

    def cancel(self) -> None:
        """Cancels the decodes still waiting (the pool is being shut down)."""
        with self._lock:
            waiting, self._waiting = self._waiting, []
        for _, future, _ in waiting:
            future.cancel()
