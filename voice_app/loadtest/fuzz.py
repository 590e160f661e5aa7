"""Protocol fuzzing of a realtime server over real websockets, with a canary session.

The corpus (fuzz_corpus.py: every client event type mutated, the edge cases a review found,
malformed frames) is sent in the GA and the beta dialect, each case on a connection of its own. A case **held** when the server answered
its bad frames with `error` events (code and message, never `server_error`), kept the connection
open, and still gave a completed reply to a probe question afterwards.

Meanwhile a canary session asks a spoken question every few seconds and records the gaps
between its reply's audio deltas: one session's garbage must not stall another's voice.
scripts/fuzz_realtime.py runs the whole corpus (JSON and a table); tests run a short subset.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import numpy as np

from voice_app.audio.pcm import WIRE_RATE
from voice_app.loadtest.fuzz_corpus import (BETA_HEADERS, TEMPLATES, FuzzCase, append_frame, corpus, dumps,
                                            tagged)

__all__ = ["CaseResult", "CanaryReport", "churn", "corpus", "format_table", "run_fuzz"]


@dataclass
class CaseResult:
    name: str
    held: bool
    detail: str
    errors: int
    seconds: float


@dataclass
class CanaryReport:
    replies: int = 0
    failed_replies: int = 0
    reconnects: int = 0
    baseline_max_gap_s: float | None = None  # before any case ran
    max_gap_s: float = 0.0  # the longest wait between two audio deltas of one reply, cases running
    first_audio_s: list[float] = field(default_factory=list)  # end of speech sent -> first audio


# ---- running cases -------------------------------------------------------------------------


class Client:
    """One websocket: every received event kept; sends frames as they are."""

    def __init__(self, websocket: Any):
        self.ws = websocket
        self.events: list[dict[str, Any]] = []
        self.closed: str | None = None
        self._arrived = asyncio.Event()
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def connect(cls, url: str, headers: dict[str, str] | None = None) -> "Client":
        from websockets.asyncio.client import connect

        websocket = await connect(url, max_size=None, open_timeout=60, ping_interval=None,
                                  additional_headers=headers, close_timeout=5)
        return cls(websocket)

    async def _read(self) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            async for message in self.ws:
                self.events.append(json.loads(message))
                self._arrived.set()
        except ConnectionClosed:
            pass
        self.closed = f"closed by the server (code {self.ws.close_code}: {self.ws.close_reason!r})"
        self._arrived.set()

    async def wait_for(self, predicate: Callable[[dict[str, Any]], bool], start: int, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        index = start
        while True:
            for index in range(index, len(self.events)):
                if predicate(self.events[index]):
                    return index
            index = len(self.events)
            if self.closed:
                raise ConnectionError(self.closed)
            if time.monotonic() > deadline:
                raise TimeoutError(f"nothing matching within {timeout_s:.0f} s")
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), max(0.01, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                pass

    async def close(self) -> None:
        await self.ws.close()
        await asyncio.gather(self._reader, return_exceptions=True)


async def run_case(url: str, case: FuzzCase, headers: dict[str, str] | None = None) -> CaseResult:
    started = time.monotonic()
    headers = {**(headers or {}), **(BETA_HEADERS if case.beta else {})}
    try:
        client = await Client.connect(url, headers)
    except Exception as exc:
        return CaseResult(case.name, False, f"could not connect: {exc}", 0, 0.0)
    try:
        detail = await _run_frames(client, case)
    finally:
        await client.close()
    errors = [e for e in client.events if e.get("type") == "error"]
    return CaseResult(case.name, detail is None, detail or "held", len(errors), round(time.monotonic() - started, 2))


async def _run_frames(client: Client, case: FuzzCase) -> str | None:
    """Why the case did not hold, or None."""
    try:
        await client.wait_for(lambda e: e.get("type") == "session.created", 0, 60)
        for frame in case.frames():
            await client.ws.send(frame)
        if case.settle_on is not None:
            await client.wait_for(lambda e: e.get("type") == case.settle_on, 0, case.timeout_s)
        await probe(client, case.timeout_s)
    except (ConnectionError, TimeoutError, OSError) as exc:
        return f"{type(exc).__name__}: {exc}"
    case_errors = [e["error"] for e in client.events if e.get("type") == "error"
                   and not str(e["error"].get("event_id") or "").startswith("probe")]
    if any(error.get("type") == "server_error" or not error.get("message") or not error.get("code")
           for error in case_errors):
        return f"a server error or an error without code/message: {case_errors[:3]}"
    if case.must_error and not case_errors:
        return "no error event for a bad frame"
    if case.check is not None:
        return case.check(client.events)
    return None


async def probe(client: Client, timeout_s: float) -> None:
    """Is the connection still usable? Whatever runs is cancelled, then a question must get a
    completed reply."""
    await client.ws.send(dumps(tagged({"type": "response.cancel"}, "probe-cancel")))
    await client.ws.send(dumps(tagged(TEMPLATES["conversation.item.create"], "probe-item")))
    mark = len(client.events)
    await client.ws.send(dumps(tagged({"type": "response.create", "response": {
        "output_modalities": ["text"], "max_output_tokens": 4}}, "probe-reply")))
    await client.wait_for(lambda e: e.get("type") == "response.done" and e["response"]["status"] == "completed",
                          mark, timeout_s)


# ---- the canary ----------------------------------------------------------------------------


class Canary:
    """A session that asks a spoken question every `pause_s` and times its replies' audio."""

    def __init__(self, url: str, utterance: np.ndarray, headers: dict[str, str] | None = None, pause_s: float = 2.0):
        self.url = url
        self.speech = utterance
        self.headers = headers
        self.pause_s = pause_s
        self.report = CanaryReport()
        self.first_reply = asyncio.Event()
        self.answered = asyncio.Event()  # set after each question's reply (or its failure)
        self.cases_running = False

    async def run(self, stop: asyncio.Event) -> CanaryReport:
        client: Client | None = None
        while not stop.is_set():
            if client is None or client.closed:
                self.report.reconnects += client is not None
                client = await TimedClient.connect(self.url, self.headers)
                await client.wait_for(lambda e: e.get("type") == "session.created", 0, 60)
            try:
                await self._ask(client)
            except (TimeoutError, ConnectionError):
                self.report.failed_replies += 1
            self.first_reply.set()
            self.answered.set()
            await asyncio.sleep(self.pause_s)
        if client is not None and not client.closed:
            await client.close()
        return self.report

    async def _ask(self, client: Client) -> None:
        mark = len(client.events)
        spoken = asyncio.get_running_loop().create_future()
        microphone = asyncio.create_task(self._talk(client, spoken))
        try:
            done = await client.wait_for(lambda e: e.get("type") == "response.done", mark, 120)
        finally:
            microphone.cancel()
        spoken_at = spoken.result() if spoken.done() else time.monotonic()
        response = client.events[done]["response"]
        if response["status"] != "completed":
            self.report.failed_replies += 1
            return
        self.report.replies += 1
        await self._time_audio(client, response["id"], mark, spoken_at)

    async def _talk(self, client: Client, spoken: asyncio.Future) -> None:
        """A microphone: the question, then silence, in 100 ms frames at real-time pace."""
        frame = WIRE_RATE // 10
        frames = [self.speech[i:i + frame] for i in range(0, len(self.speech), frame)]
        silence = np.zeros(frame, dtype=np.int16)
        while True:
            await client.ws.send(append_frame((frames.pop(0) if frames else silence).astype("<i2").tobytes()))
            if not frames and not spoken.done():
                spoken.set_result(time.monotonic())
            await asyncio.sleep(0.1)

    async def _time_audio(self, client: Client, response_id: str, mark: int, spoken_at: float) -> None:
        times = [e["_at"] for e in client.events[mark:]
                 if e.get("type") == "response.output_audio.delta" and e.get("response_id") == response_id]
        if not times:
            return
        self.report.first_audio_s.append(round(times[0] - spoken_at, 3))
        gap = max((b - a for a, b in zip(times, times[1:])), default=0.0)
        if self.cases_running:
            self.report.max_gap_s = max(self.report.max_gap_s, round(gap, 3))
        elif self.report.baseline_max_gap_s is None:
            self.report.baseline_max_gap_s = round(gap, 3)


class TimedClient(Client):
    """A Client that stamps each event with its arrival time (`_at`, time.monotonic())."""

    async def _read(self) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            async for message in self.ws:
                self.events.append({**json.loads(message), "_at": time.monotonic()})
                self._arrived.set()
        except ConnectionClosed:
            pass
        self.closed = f"closed by the server (code {self.ws.close_code})"
        self._arrived.set()


# ---- a whole run ---------------------------------------------------------------------------


async def run_fuzz(url: str, cases: list[FuzzCase], utterance: np.ndarray, headers: dict[str, str] | None = None,
                   metrics_url: str | None = None) -> dict[str, Any]:
    """Runs the cases one after another while the canary talks; JSON-ready results."""
    canary = Canary(url, utterance, headers)
    stop = asyncio.Event()
    canary_task = asyncio.create_task(canary.run(stop))
    lag = LagSampler(metrics_url)
    lag_task = asyncio.create_task(lag.run())
    await asyncio.wait_for(canary.first_reply.wait(), 300)  # its normal gap, before any case
    canary.cases_running = True
    asked_before = canary.report.replies + canary.report.failed_replies
    results = [await run_case(url, case, headers) for case in cases]
    # the canary answers at least once more after the cases began, however fast they ran
    while canary.report.replies + canary.report.failed_replies == asked_before and not canary_task.done():
        canary.answered.clear()
        await asyncio.wait_for(canary.answered.wait(), 300)
    stop.set()
    report = await canary_task
    lag_task.cancel()
    held = [r for r in results if r.held]
    return {"cases": len(results), "held": len(held), "failed": [asdict(r) for r in results if not r.held],
            "results": [asdict(r) for r in results], "canary": asdict(report),
            "server_loop_lag_max_ms": lag.max_ms}


async def churn(url: str, utterance: np.ndarray, cycles: int, headers: dict[str, str] | None = None) -> int:
    """Connect, speak part of a question (or all of it, and wait for a reply to start), leave
    (closing or just dropping the socket); returns the cycles that were refused a session."""
    pcm = np.concatenate([utterance, np.zeros(WIRE_RATE, dtype=np.int16)]).astype("<i2").tobytes()
    refused = 0
    for cycle in range(cycles):
        refused += not await _visit(url, pcm, cycle, headers)
    return refused


async def _visit(url: str, pcm: bytes, cycle: int, headers: dict[str, str] | None) -> bool:
    """One churn cycle; False when the server refused the session (at capacity)."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed, InvalidStatus

    chunk = WIRE_RATE // 5  # 100 ms of PCM16
    try:
        async with connect(url, max_size=None, additional_headers=headers, ping_interval=None) as ws:
            await ws.recv()  # session.created
            for offset in range(0, len(pcm) * (cycle % 4 + 1) // 4, chunk):
                await ws.send(append_frame(pcm[offset:offset + chunk]))
            if cycle % 3 == 0:
                await asyncio.sleep(1.5)  # a reply under way when it leaves
            if cycle % 2:
                ws.transport.abort()  # gone without a closing handshake
    except InvalidStatus as refusal:  # HTTP 503 at the handshake: at capacity
        if refusal.response.status_code != 503:
            raise
        return False
    except ConnectionClosed as closed:  # a server that accepts and then closes 1013
        if closed.rcvd is None or closed.rcvd.code != 1013:
            raise
        return False
    return True


class LagSampler:
    """The server's worst recent event-loop lag, from /metrics every 2 s (when given its URL)."""

    def __init__(self, metrics_url: str | None):
        self.metrics_url = metrics_url
        self.max_ms: float | None = None

    async def run(self) -> None:
        while self.metrics_url:
            try:
                text = await asyncio.to_thread(_fetch, self.metrics_url)
                for line in text.splitlines():
                    if line.startswith("voice_event_loop_lag_max_ms "):
                        self.max_ms = max(self.max_ms or 0.0, float(line.split()[1]))
            except OSError:
                pass
            await asyncio.sleep(2.0)


def _fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return reply.read().decode()


def format_table(report: dict[str, Any]) -> str:
    canary = report["canary"]
    lines = ["| cases | held | canary replies | canary failed | reconnects | baseline max gap s | max gap s "
             "| server loop lag max ms |", "|---:|---:|---:|---:|---:|---:|---:|---:|",
             f"| {report['cases']} | {report['held']} | {canary['replies']} | {canary['failed_replies']} "
             f"| {canary['reconnects']} | {canary['baseline_max_gap_s']} | {canary['max_gap_s']} "
             f"| {report['server_loop_lag_max_ms']} |"]
    lines += [f"  not held: {r['name']}: {r['detail']}" for r in report["failed"]]
    return "\n".join(lines)
