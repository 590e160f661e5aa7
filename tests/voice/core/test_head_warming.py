"""HeadWarmer's ordering: a turn submitted while the next head is being worked out or submitted
leaves no prefill running beside it (core/head_warming.py)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from dllm_engine.request import RequestHandle
from voice_app.core.head_warming import HeadWarmer

HISTORY = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
           {"role": "assistant", "content": "Hello."}]


class Gate:
    """Holds a worker thread at one step until the test has done what it wants meanwhile."""

    def __init__(self) -> None:
        self.reached, self.opened = threading.Event(), threading.Event()

    def hold(self) -> None:
        self.reached.set()
        assert self.opened.wait(10), "the test never opened the gate"


class TrimmingFitter:
    def __init__(self, gate: Gate | None):
        self.gate = gate

    def trim_ahead(self, history, reply_tokens, next_message_tokens):
        if self.gate:
            self.gate.hold()
        return history[:1] + history[-2:]  # a trim: the head moves


class RecordingEngine:
    def __init__(self, gate: Gate | None):
        self.gate, self.handles = gate, []

    def prefill_head(self, messages, mode="auto"):
        if self.gate:
            self.gate.hold()
        self.handles.append(RequestHandle(len(self.handles) + 1, background=True))
        return self.handles[-1]


@pytest.mark.parametrize("held", ["working out the head", "submitting its prefill"])
async def test_a_turn_that_starts_meanwhile_leaves_no_prefill_running(held):
    gate = Gate()
    fitter, engine = TrimmingFitter(gate if held == "working out the head" else None), RecordingEngine(
        gate if held == "submitting its prefill" else None)
    warmer = HeadWarmer(engine, fitter, lambda: HISTORY, lambda: 16, lambda: "auto")
    warming = asyncio.ensure_future(warmer.after_reply())
    assert not warmer.idle.is_set()
    assert await asyncio.to_thread(gate.reached.wait, 10)
    warmer.cancel()  # the next turn's first request is submitted now
    gate.opened.set()
    await warming
    assert warmer.idle.is_set() and warmer.warmed == 0
    assert all(handle.cancelled for handle in engine.handles)


async def test_a_prefill_runs_until_the_next_turn_and_is_cancelled_then():
    engine = RecordingEngine(None)
    warmer = HeadWarmer(engine, TrimmingFitter(None), lambda: HISTORY, lambda: 16, lambda: "auto")
    await warmer.after_reply()
    assert warmer.warmed == 1 and not engine.handles[0].cancelled
    warmer.cancel()
    assert engine.handles[0].cancelled
