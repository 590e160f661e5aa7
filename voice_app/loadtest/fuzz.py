"""Protocol fuzzing of a realtime server over real websockets, with a canary session.

Every client event type is sent mutated (fields missing, of the wrong type, unknown, nested
100,000 deep, 5,000-digit numbers) along with the edge cases a review found (empty and huge
instructions, odd, empty, 6 MiB and 16 MiB audio, a whole utterance in one append, 2,000
history items, back-to-back commits, 50 response.create in a row, malformed frames), in the GA
and the beta dialect, each on a connection of its own. A case **held** when the server answered
its bad frames with `error` events (code and message, never `server_error`), kept the connection
open, and still gave a completed reply to a probe question afterwards.

Meanwhile a canary session asks a spoken question every few seconds and records the gaps
between its reply's audio deltas: one session's garbage must not stall another's voice.
scripts/fuzz_realtime.py runs the whole corpus (JSON and a table); tests run a short subset.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import numpy as np

from voice_app.audio.pcm import WIRE_RATE

Frame = str | bytes
DEEP = 100_000  # nesting levels (json's C scanner recurses once per level)
HUGE_DIGITS = 5_000  # over Python's 4,300-digit int conversion limit
MIB = 1024 * 1024
BETA_HEADERS = {"OpenAI-Beta": "realtime=v1"}
TRANSCRIBED = "conversation.item.input_audio_transcription.completed"

TEMPLATES: dict[str, dict[str, Any]] = {  # one valid event of each client type
    "session.update": {"type": "session.update", "session": {"type": "realtime", "instructions": "Be brief."}},
    "input_audio_buffer.append": {"type": "input_audio_buffer.append", "audio": base64.b64encode(bytes(4800)).decode()},
    "input_audio_buffer.commit": {"type": "input_audio_buffer.commit"},
    "input_audio_buffer.clear": {"type": "input_audio_buffer.clear"},
    "conversation.item.create": {"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello."}]}},
    "conversation.item.truncate": {"type": "conversation.item.truncate", "item_id": "item_x", "content_index": 0,
                                   "audio_end_ms": 100},
    "response.create": {"type": "response.create", "response": {"output_modalities": ["text"], "max_output_tokens": 8}},
    "response.cancel": {"type": "response.cancel", "response_id": "resp_x"},
    "output_audio_buffer.clear": {"type": "output_audio_buffer.clear"},
    "conversation.item.retrieve": {"type": "conversation.item.retrieve", "item_id": "item_x"},
    "conversation.item.delete": {"type": "conversation.item.delete", "item_id": "item_x"},
}
TEMPLATES = {kind: {**event, "event_id": f"fuzz-{kind}"} for kind, event in TEMPLATES.items()}
REQUIRED = {"session.update": ["session"], "input_audio_buffer.append": ["audio"],
            "conversation.item.create": ["item"], "conversation.item.truncate": ["item_id", "audio_end_ms"],
            "conversation.item.retrieve": ["item_id"], "conversation.item.delete": ["item_id"]}
WRONG = {str: [12345, {"a": 1}], int: ["twelve", [1]], dict: ["x", []]}  # values no field of that type takes


@dataclass
class FuzzCase:
    name: str
    frames: Callable[[], list[Frame]]  # built when run: some are 16 MiB
    must_error: bool = False  # at least one of its frames must be answered by an error event
    check: Callable[[list[dict[str, Any]]], str | None] | None = None  # more to verify: why not, or None
    beta: bool = False
    timeout_s: float = 120.0
    settle_on: str | None = None  # an event type the case's own outcome ends with: awaited before the probe


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


def dumps(event: Any) -> str:
    return json.dumps(event)


def tagged(event: dict[str, Any], event_id: str) -> dict[str, Any]:
    return {**event, "event_id": event_id}


# ---- the corpus ----------------------------------------------------------------------------


def corpus(utterance: np.ndarray) -> list[FuzzCase]:
    """Every case in the GA dialect, then again as a beta client. `utterance`: PCM16 24 kHz speech."""
    ga = mutated_events() + edge_cases(utterance) + malformed_frames()
    beta = [dataclasses.replace(case, name=f"beta/{case.name}", beta=True) for case in ga]
    return ga + beta


def mutated_events() -> list[FuzzCase]:
    cases = []
    for kind, template in TEMPLATES.items():
        first = next((name for name in template if name != "type"), "event_id")
        cases += [
            FuzzCase(f"{kind}/unknown_field", lambda t=template: [dumps({**t, "x_unknown": {"a": [1, {"b": None}]}})]),
            FuzzCase(f"{kind}/deep_nesting", lambda k=kind, f=first: [
                f'{{"type": "{k}", "{f}": ' + "[" * DEEP + "]" * DEEP + "}"], must_error=True),
            FuzzCase(f"{kind}/huge_integer", lambda k=kind, f=first: [
                f'{{"type": "{k}", "{f}": {"9" * HUGE_DIGITS}}}'], must_error=True),
        ]
        for name in REQUIRED.get(kind, []):
            cases.append(FuzzCase(f"{kind}/missing_{name}", lambda t=template, n=name: [
                dumps({k: v for k, v in t.items() if k != n})], must_error=True))
        for name, value in template.items():
            if name == "type":
                continue
            for number, wrong in enumerate(WRONG[type(value)]):
                cases.append(FuzzCase(f"{kind}/wrong_type_{name}_{number}", lambda t=template, n=name, w=wrong: [
                    dumps({**t, n: w})], must_error=True))
    return cases


def edge_cases(utterance: np.ndarray) -> list[FuzzCase]:
    speech = np.concatenate([utterance, np.zeros(WIRE_RATE, dtype=np.int16)])  # then 1 s of silence
    create = TEMPLATES["conversation.item.create"]
    text_reply = TEMPLATES["response.create"]
    vad_off = {"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"turn_detection": None}}}}
    return [
        FuzzCase("instructions/empty_on_a_fresh_session", lambda: [
            dumps({"type": "response.create", "response": {"instructions": ""}})], must_error=True),
        FuzzCase("instructions/over_20000_chars", lambda: [
            dumps({"type": "response.create", "response": {"instructions": "x" * 20001}})], must_error=True),
        FuzzCase("instructions/15000_chars", lambda: [dumps(create), dumps(
            {"type": "response.create", "response": {"instructions": "Be brief. " * 1500, "output_modalities": ["text"],
                                                     "max_output_tokens": 8}})]),
        FuzzCase("audio/odd_length", lambda: [append_frame(b"\x00\x01\x02")], must_error=True),
        FuzzCase("audio/empty", lambda: [append_frame(b"")]),
        FuzzCase("audio/not_base64", lambda: [dumps({"type": "input_audio_buffer.append", "audio": "%%%"})],
                 must_error=True),
        FuzzCase("audio/6_MiB_append", lambda: [append_frame(np.concatenate(
            [np.zeros(int(6 * MIB * 3 / 8) - len(speech), dtype=np.int16), speech]).astype("<i2").tobytes())]),
        FuzzCase("audio/16_MiB_message", lambda: [dumps({"type": "input_audio_buffer.append",
                                                         "audio": "A" * (16 * MIB)})], must_error=True),
        FuzzCase("audio/whole_utterance_in_one_append", lambda: [append_frame(speech.astype("<i2").tobytes())],
                 check=heard_the_utterance, settle_on=TRANSCRIBED),
        FuzzCase("audio/two_commits_back_to_back", lambda: [
            dumps(vad_off), append_frame(speech.astype("<i2").tobytes()),
            dumps(TEMPLATES["input_audio_buffer.commit"]), dumps(TEMPLATES["input_audio_buffer.commit"])],
            must_error=True, check=one_item_committed, settle_on=TRANSCRIBED),
        FuzzCase("history/2000_items_of_8_KB", lambda: [
            dumps({**create, "item": {**create["item"], "content": [{"type": "input_text", "text": f"{i} " + "note " * 1600}]}})
            for i in range(2000)] + [dumps(text_reply)], timeout_s=300),
        FuzzCase("response/50_creates_in_a_row", lambda: [dumps(create)] + [dumps(text_reply)] * 50, must_error=True),
        FuzzCase("response/max_output_tokens_50_digits", lambda: [dumps(
            {"type": "response.create", "response": {"max_output_tokens": 10 ** 50}})], must_error=True),
        FuzzCase("session/rate_16000", lambda: [dumps({"type": "session.update", "session": {
            "type": "realtime", "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}}})],
            must_error=True),
        FuzzCase("session/speed_10", lambda: [dumps({"type": "session.update", "session": {
            "type": "realtime", "audio": {"output": {"speed": 10}}}})], must_error=True),
        FuzzCase("session/max_output_tokens_0", lambda: [dumps({"type": "session.update", "session": {
            "type": "realtime", "max_output_tokens": 0}})], must_error=True),
        FuzzCase("session/one_bad_setting_among_good_ones", lambda: [dumps({"type": "session.update", "session": {
            "type": "realtime", "instructions": "Be brief.", "tracing": "auto", "tools": [{"type": "function", "name": "f"}],
            "audio": {"output": {"speed": 10, "voice": "ash"}}}})], must_error=True, check=applied_the_good_settings,
            settle_on="session.updated"),
        FuzzCase("session/vad_off_then_commit_nothing", lambda: [
            dumps(vad_off), dumps(TEMPLATES["input_audio_buffer.commit"])], must_error=True),
        FuzzCase("truncate/unknown_item", lambda: [dumps(TEMPLATES["conversation.item.truncate"])], must_error=True),
        FuzzCase("truncate/negative_audio_end", lambda: [dumps({**TEMPLATES["conversation.item.truncate"],
                                                                "audio_end_ms": -1})], must_error=True),
    ]


def malformed_frames() -> list[FuzzCase]:
    raw = {"not_json": "{this is not json", "empty": "", "array": "[1, 2]", "string": '"hello"', "null": "null",
           "number": "42", "no_type": '{"event_id": "e"}', "unknown_type": '{"type": "response.dance"}'}
    cases = [FuzzCase(f"frame/{name}", lambda text=text: [text], must_error=True) for name, text in raw.items()]
    return cases + [FuzzCase("frame/binary", lambda: [b"\x00\x01\x02"], must_error=True)]


def append_frame(pcm: bytes) -> str:
    return dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()})


def heard_the_utterance(events: list[dict[str, Any]]) -> str | None:
    transcripts = [e["transcript"] for e in events
                   if e.get("type") == "conversation.item.input_audio_transcription.completed"]
    return None if any(t.strip() for t in transcripts) else f"no transcript of the utterance: {transcripts!r}"


def applied_the_good_settings(events: list[dict[str, Any]]) -> str | None:
    updated = [e for e in events if e.get("type") == "session.updated"]
    if not updated:
        return "no session.updated after a partly refused session.update"
    session = updated[-1]["session"]
    voice = (session.get("audio") or {}).get("output", {}).get("voice", session.get("voice"))
    return None if session.get("instructions") == "Be brief." and voice == "ash" else f"not applied: {session!r}"


def one_item_committed(events: list[dict[str, Any]]) -> str | None:
    committed = [e for e in events if e.get("type") == "input_audio_buffer.committed"]
    return None if len(committed) == 1 else f"{len(committed)} items committed for one buffer"


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
    results = [await run_case(url, case, headers) for case in cases]
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
