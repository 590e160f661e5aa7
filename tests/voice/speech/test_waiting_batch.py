"""WaitingBatch: decodes that wait for the worker together go in one job, and each waiter is
answered as soon as its own text is ready."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import numpy as np
import pytest

from voice_app.speech.decode_batches import WaitingBatch
from voice_app.speech.workers import PriorityPool


@contextlib.contextmanager
def held_worker() -> Iterator[tuple[PriorityPool, threading.Event]]:
    """A one-worker pool whose worker is busy until the gate opens: what is added meanwhile waits."""
    pool = PriorityPool(1, "test")
    gate = threading.Event()
    blocker = pool.submit(0.0, gate.wait)
    try:
        yield pool, gate
        gate.set()
        blocker.result(timeout=10)
    finally:
        gate.set()
        pool.shutdown()


def test_waiters_share_one_job_and_each_is_answered_when_its_text_is_ready():
    retry_done = threading.Event()
    calls: list[int] = []

    def decode(audios):
        calls.append(len(audios))
        yield 1, "second, decoded well"
        retry_done.wait(10)  # the first one's retries take their time
        yield 0, "first, after a retry"

    with held_worker() as (pool, gate):
        batch = WaitingBatch(pool, 1.0, decode, max_batch=8, kind="test")
        first, second = batch.add(np.zeros(1)), batch.add(np.zeros(2))
        gate.set()
        assert second.result(timeout=10) == "second, decoded well"
        assert not first.done()  # not held back by it, nor holding it back
        retry_done.set()
        assert first.result(timeout=10) == "first, after a retry"
        assert calls == [2]


def test_a_failed_decode_reaches_every_waiter_not_answered_and_one_left_out_is_told():
    def decode(audios):
        yield 0, "fine"
        if len(audios) == 3:
            raise ValueError("the model broke")

    with held_worker() as (pool, gate):
        batch = WaitingBatch(pool, 1.0, decode, 8, "test")
        futures = [batch.add(np.zeros(1)) for _ in range(3)]
        gate.set()
        assert futures[0].result(timeout=10) == "fine"
        for future in futures[1:]:
            with pytest.raises(ValueError, match="the model broke"):
                future.result(timeout=10)
        short = WaitingBatch(pool, 1.0, decode, 8, "test")
        left_out = [short.add(np.zeros(1)) for _ in range(2)][1]  # the decode yields only index 0
        with pytest.raises(RuntimeError, match="no transcript"):
            left_out.result(timeout=10)


def test_more_waiters_than_a_batch_take_further_jobs():
    sizes: list[int] = []

    def decode(audios):
        sizes.append(len(audios))
        return enumerate(str(len(a)) for a in audios)

    with held_worker() as (pool, gate):
        batch = WaitingBatch(pool, 1.0, decode, max_batch=2, kind="test")
        futures = [batch.add(np.zeros(n)) for n in range(1, 6)]
        gate.set()
        assert [f.result(timeout=10) for f in futures] == ["1", "2", "3", "4", "5"]
        assert sizes == [2, 2, 1]


def test_a_waiter_cancelled_before_the_worker_takes_it_is_not_decoded():
    decoded: list[int] = []

    def decode(audios):
        decoded.extend(len(a) for a in audios)
        return enumerate(str(len(a)) for a in audios)

    with held_worker() as (pool, gate):
        batch = WaitingBatch(pool, 0.0, decode, max_batch=8, kind="test")
        stale, wanted = batch.add(np.zeros(1)), batch.add(np.zeros(2))
        assert stale.cancel()  # a pause the speaker talked through
        gate.set()
        assert wanted.result(timeout=10) == "2"
        assert decoded == [2]
