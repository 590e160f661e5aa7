"""PriorityPool: the shared ASR/TTS workers take the most urgent job first."""

from __future__ import annotations

import threading

import pytest

from voice_app.speech.workers import PriorityPool


def test_queued_jobs_run_most_urgent_first_and_equal_keys_in_order():
    pool = PriorityPool(1, "test")
    gate = threading.Event()
    ran: list[str] = []
    try:
        blocker = pool.submit(0.0, gate.wait)  # holds the only worker while the others queue
        futures = [pool.submit(key, ran.append, name)
                   for key, name in [(5.0, "later sentence"), (1.0, "partial a"), (0.0, "final"), (1.0, "partial b")]]
        gate.set()
        for future in [blocker, *futures]:
            future.result(timeout=10)
    finally:
        pool.shutdown()
    assert ran == ["final", "partial a", "partial b", "later sentence"]


def test_a_failing_job_hands_its_error_to_the_caller_and_the_worker_lives_on():
    pool = PriorityPool(1, "test")
    try:
        with pytest.raises(ZeroDivisionError):
            pool.submit(0.0, lambda: 1 / 0).result(timeout=10)
        assert pool.submit(0.0, lambda: 42).result(timeout=10) == 42
    finally:
        pool.shutdown()


def test_a_cancelled_or_shut_down_job_never_runs():
    pool = PriorityPool(1, "test")
    gate = threading.Event()
    ran: list[str] = []
    started = threading.Event()

    def hold_the_worker() -> None:
        started.set()
        gate.wait()

    blocker = pool.submit(0.0, hold_the_worker)
    assert started.wait(timeout=10)
    cancelled = pool.submit(1.0, ran.append, "cancelled")
    dropped = pool.submit(2.0, ran.append, "dropped at shutdown")
    assert cancelled.cancel() and pool.live_jobs == 3  # the live-jobs gauge counts queued and running
    pool.shutdown()
    gate.set()
    blocker.result(timeout=10)  # the running job finishes
    assert dropped.cancelled() and ran == []
    for _ in range(100):
        if pool.live_jobs == 0:
            break
        threading.Event().wait(0.01)  # the worker drops its count right after setting the result
    assert pool.live_jobs == 0
    with pytest.raises(RuntimeError, match="shut down"):
        pool.submit(0.0, ran.append, "too late")
