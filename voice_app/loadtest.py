"""`voice-app loadtest`: many concurrent realtime sessions speaking scripted audio; latency
percentiles per load level.

Each simulated user is a plain protocol client: a microphone task streams PCM16 at real-time
pace (20-40 ms frames, silence between utterances, like a real mic), and a script runner says
each turn's utterance and watches the server's events. All latencies are measured on the client
from *end of speech sent* (the last frame holding the utterance's audio):

- eos_to_transcript_ms: -> `conversation.item.input_audio_transcription.completed`
  (includes the server's end-of-turn silence wait, as a user would feel it)
- eos_to_first_audio_ms: -> the reply's first `response.output_audio.delta`
- eos_to_done_ms: -> the reply's `response.done`
- barge_in_to_cleared_ms: speech start sent -> `output_audio_buffer.cleared` for the reply
  talked over; stale_audio_deltas counts that reply's audio deltas arriving after the clear.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import logging
import re
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from voice_app.audio.pcm import WIRE_RATE
from voice_app.loadtest_script import DEFAULT_CACHE_DIR, Script, ScriptError, ScriptTurn, load_script, utterance_audio

log = logging.getLogger(__name__)

CLOSE_TRY_AGAIN_LATER = 1013
LATENCY_METRICS = ("eos_to_transcript_ms", "eos_to_first_audio_ms", "eos_to_done_ms", "barge_in_to_cleared_ms")
MAX_SUPERSEDED_RESPONSES = 3  # a VAD split of one utterance can cancel a reply or two before the real one


class SessionClosed(Exception):
    def __init__(self, code: int | None, reason: str):
        super().__init__(f"connection closed (code {code}: {reason or 'no reason'})")
        self.code, self.reason = code, reason


# ---- one protocol connection -----------------------------------------------------------------


@dataclass
class ReceivedEvent:
    at: float  # time.monotonic() on arrival
    event: dict[str, Any]


class RealtimeConnection:
    """A websocket to /v1/realtime; every received event is kept, in order, for the waiters."""

    def __init__(self, websocket: Any):
        self.ws = websocket
        self.events: list[ReceivedEvent] = []
        self._arrived = asyncio.Event()
        self.closed: SessionClosed | None = None
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            async for message in self.ws:
                self.events.append(ReceivedEvent(time.monotonic(), json.loads(message)))
                self._arrived.set()
        except ConnectionClosed:
            pass
        self.closed = SessionClosed(self.ws.close_code, self.ws.close_reason or "")
        self._arrived.set()

    async def send(self, event: dict[str, Any]) -> None:
        await self.ws.send(json.dumps(event))

    async def wait_for(self, predicate: Callable[[dict[str, Any]], bool], start: int, timeout_s: float,
                       what: str) -> tuple[int, ReceivedEvent]:
        """The first event at index >= start matching `predicate`, as (index, event)."""
        deadline = time.monotonic() + timeout_s
        index = start
        while True:
            while index < len(self.events):
                if predicate(self.events[index].event):
                    return index, self.events[index]
                index += 1
            if self.closed is not None:
                raise self.closed
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no {what} within {timeout_s:.0f} s")
            self._arrived.clear()
            try:
                await asyncio.wait_for(self._arrived.wait(), left)
            except asyncio.TimeoutError:
                pass

    def after(self, index: int, predicate: Callable[[dict[str, Any]], bool]) -> list[ReceivedEvent]:
        return [received for received in self.events[index + 1:] if predicate(received.event)]

    async def close(self) -> None:
        await self.ws.close()
        await self._reader


def of_type(event_type: str, response_id: str | None = None) -> Callable[[dict[str, Any]], bool]:
    def matches(event: dict[str, Any]) -> bool:
        if event.get("type") != event_type:
            return False
        if response_id is None:
            return True
        found = event.get("response_id") or (event.get("response") or {}).get("id")
        return found == response_id
    return matches


# ---- the simulated microphone ----------------------------------------------------------------


class Microphone:
    """Streams `input_audio_buffer.append` frames on an absolute schedule (sleep drift does not
    accumulate): queued speech when there is some, silence otherwise."""

    def __init__(self, connection: RealtimeConnection, frame_ms: int, speed: float):
        self.connection = connection
        self.frame = WIRE_RATE * frame_ms // 1000
        self.period_s = frame_ms / 1000.0 / speed
        self._speech: list[np.ndarray] = []
        self._spoken: asyncio.Future | None = None
        self._started_at: float | None = None
        self._task = asyncio.create_task(self._stream())

    async def say(self, samples: np.ndarray) -> tuple[float, float]:
        """Queues an utterance; returns (first frame sent, last frame sent) once it is out."""
        self._spoken = asyncio.get_running_loop().create_future()
        self._started_at = None
        self._speech = [samples[i:i + self.frame] for i in range(0, len(samples), self.frame)]
        return await self._spoken

    async def _stream(self) -> None:
        silence = np.zeros(self.frame, dtype=np.int16)
        next_at = time.monotonic()
        while self.connection.closed is None:
            frame = self._speech.pop(0) if self._speech else silence
            await self.connection.send({"type": "input_audio_buffer.append",
                                        "audio": base64.b64encode(frame.astype("<i2").tobytes()).decode()})
            now = time.monotonic()
            if frame is not silence:
                self._started_at = self._started_at or now
                if not self._speech and self._spoken is not None and not self._spoken.done():
                    self._spoken.set_result((self._started_at, now))
            next_at += self.period_s
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))

    async def stop(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


# ---- one simulated user ----------------------------------------------------------------------


@dataclass
class TurnResult:
    session: int
    turn: int
    script_turn: int
    expected: str | None
    transcript: str = ""
    wer: float | None = None
    reference_words: int = 0
    word_errors: int = 0
    response_id: str | None = None
    status: str | None = None
    eos_to_transcript_ms: float | None = None
    eos_to_first_audio_ms: float | None = None
    eos_to_done_ms: float | None = None
    barge_in_to_cleared_ms: float | None = None
    barge_in_missed: bool = False  # the reply talked over had already finished playing
    stale_audio_deltas: int = 0
    server_metrics: dict[str, Any] | None = None
    error: str | None = None


@dataclass
class SessionResult:
    index: int
    outcome: str = "completed"  # completed | refused | dropped | error
    detail: str = ""
    turns: list[TurnResult] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # `error` events from the server


@dataclass
class RunOptions:
    url: str
    frame_ms: int = 40
    speed: float = 1.0
    stagger_ms: int = 500
    turns: int | None = None
    duration_s: float | None = None
    turn_timeout_s: float = 120.0


def playback_end(events: list[ReceivedEvent], response_id: str, speed: float) -> float:
    """When a client playing each audio delta of the reply as it arrives, in real time, falls silent."""
    is_audio = of_type("response.output_audio.delta", response_id)
    end = 0.0
    for received in events:
        if is_audio(received.event):
            seconds = len(base64.b64decode(received.event["delta"])) / 2 / WIRE_RATE / speed
            end = max(end, received.at) + seconds
    return end


def ms_between(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else round((end - start) * 1000.0, 1)


class SimulatedUser:
    def __init__(self, index: int, script: Script, audio: list[np.ndarray], options: RunOptions):
        self.index = index
        self.script = script
        self.audio = audio
        self.options = options
        self.result = SessionResult(index)
        self.conn: RealtimeConnection | None = None
        self._pending_reply: PendingReply | None = None  # a reply left playing for the next turn's barge-in
        self._heard_reply_at = 0.0  # when a client playing the last reply in real time finishes it

    async def run(self) -> SessionResult:
        from websockets.asyncio.client import connect

        await asyncio.sleep(self.index * self.options.stagger_ms / 1000.0)
        try:
            async with connect(self.options.url, max_size=None, open_timeout=60, ping_interval=None) as websocket:
                self.conn = RealtimeConnection(websocket)
                await self.conn.wait_for(of_type("session.created"), 0, 60, "session.created")
                mic = Microphone(self.conn, self.options.frame_ms, self.options.speed)
                try:
                    await self._converse(mic)
                finally:
                    await mic.stop()
                    self.result.errors = [e.event["error"].get("message", "") for e in self.conn.events
                                          if e.event.get("type") == "error"]
                await self.conn.close()
        except SessionClosed as closed:
            refused = closed.code == CLOSE_TRY_AGAIN_LATER and not self.result.turns
            self.result.outcome = "refused" if refused else "dropped"
            self.result.detail = str(closed)
        except (OSError, TimeoutError, asyncio.TimeoutError) as exc:
            self.result.outcome, self.result.detail = "error", f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # websockets' handshake errors (InvalidStatus, InvalidURI, ...)
            self.result.outcome, self.result.detail = "error", f"{type(exc).__name__}: {exc}"
        return self.result

    def _wants_turn(self, number: int, started: float) -> bool:
        """--duration: keep talking until the time is up; else --turns, or the script once."""
        if self.options.duration_s is not None:
            return time.monotonic() - started < self.options.duration_s
        return number < (self.options.turns or len(self.script.turns))

    async def _converse(self, mic: Microphone) -> None:
        started = time.monotonic()
        turns = self.script.turns
        number = 0
        while self._wants_turn(number, started):
            script_index = number % len(turns)  # the script cycles
            # A barge-in comes next (if any turn does): leave this reply playing for it.
            next_barges_in = turns[(number + 1) % len(turns)].barge_in_after_ms is not None
            result = TurnResult(self.index, number, script_index, turns[script_index].transcript)
            self.result.turns.append(result)
            try:
                await self._play_turn(mic, turns[script_index], self.audio[script_index], result,
                                      leave_playing=next_barges_in)
            except TimeoutError as exc:
                result.error = str(exc)
            number += 1
        await self._finish_pending_reply()

    async def _play_turn(self, mic: Microphone, turn: ScriptTurn, samples: np.ndarray, result: TurnResult,
                         leave_playing: bool) -> None:
        talked_over, self._pending_reply = self._pending_reply, None
        if turn.barge_in_after_ms is not None and talked_over is not None:
            await asyncio.sleep(max(0.0, talked_over.first_audio_at + turn.barge_in_after_ms / 1000 / self.options.speed
                                    - time.monotonic()))
        else:
            if talked_over is not None:
                await self._wait_done(talked_over)
                talked_over = None
            # A person answers after hearing the reply out (the server streams it faster than it plays).
            heard_in_s = max(0.0, self._heard_reply_at - time.monotonic())
            await asyncio.sleep(heard_in_s + turn.pause_ms / 1000 / self.options.speed)
        mark = len(self.conn.events)
        speech_start, speech_end = await mic.say(samples)
        if talked_over is not None:
            await self._measure_barge_in(talked_over, mark, speech_start, result)
            await self._wait_done(talked_over, heard_out=False)
        await self._follow_reply(mark, speech_end, result, leave_playing)

    async def _measure_barge_in(self, talked_over: "PendingReply", mark: int, speech_start: float,
                                result: TurnResult) -> None:
        """speech start sent -> the talked-over reply's clear; a reply that had finished playing
        before the barge-in is counted as missed, not as an error."""
        cleared = of_type("output_audio_buffer.cleared", talked_over.response_id)
        try:
            index, event = await self.conn.wait_for(cleared, mark, self.options.turn_timeout_s / 4,
                                                    "output_audio_buffer.cleared")
        except TimeoutError:
            result.barge_in_missed = True
            return
        result.barge_in_to_cleared_ms = ms_between(speech_start, event.at)
        stale = of_type("response.output_audio.delta", talked_over.response_id)
        result.stale_audio_deltas = sum(1 for later in self.conn.events[index + 1:] if stale(later.event))

    async def _follow_reply(self, mark: int, speech_end: float, result: TurnResult, leave_playing: bool) -> None:
        conn, timeout = self.conn, self.options.turn_timeout_s
        search_from = mark
        for _ in range(MAX_SUPERSEDED_RESPONSES + 1):
            created_index, created = await conn.wait_for(of_type("response.created"), search_from, timeout,
                                                         "response.created after the utterance")
            response_id = created.event["response"]["id"]
            first_index, first = await conn.wait_for(
                lambda e: of_type("response.output_audio.delta", response_id)(e)
                or of_type("response.done", response_id)(e), created_index, timeout, "reply audio")
            if first.event["type"] == "response.output_audio.delta":
                break
            search_from = first_index + 1  # cancelled before speaking (a later VAD turn took over)
        transcripts = [e for e in conn.events[mark:created_index]
                       if e.event["type"] == "conversation.item.input_audio_transcription.completed"]
        result.transcript = " ".join(e.event["transcript"].strip() for e in transcripts).strip()
        result.response_id = response_id
        result.eos_to_transcript_ms = ms_between(speech_end, transcripts[-1].at if transcripts else None)
        result.eos_to_first_audio_ms = ms_between(speech_end, first.at)
        score_transcript(result)
        reply = PendingReply(result, response_id, created_index, first.at, speech_end)
        if leave_playing:
            self._pending_reply = reply  # the next turn talks over it
        else:
            await self._wait_done(reply)

    async def _wait_done(self, reply: "PendingReply", heard_out: bool = True) -> None:
        result, timeout = reply.result, self.options.turn_timeout_s
        _, done = await self.conn.wait_for(of_type("response.done", reply.response_id), reply.created_index,
                                           timeout, "response.done")
        result.status = done.event["response"]["status"]
        result.eos_to_done_ms = ms_between(reply.speech_end, done.at)
        if heard_out:
            self._heard_reply_at = playback_end(self.conn.events[reply.created_index:], reply.response_id,
                                                self.options.speed)
        try:
            _, metrics = await self.conn.wait_for(of_type("x_turn.metrics", reply.response_id), reply.created_index,
                                                  5, "x_turn.metrics")
            result.server_metrics = {k: v for k, v in metrics.event.items() if k not in ("type", "event_id")}
        except TimeoutError:
            pass

    async def _finish_pending_reply(self) -> None:
        """A reply left running for a barge-in that never came (end of the run): wait it out."""
        reply, self._pending_reply = self._pending_reply, None
        if reply is not None:
            await self._wait_done(reply)


@dataclass
class PendingReply:
    """A reply whose `response.done` is still to come (left playing for a barge-in)."""

    result: TurnResult
    response_id: str
    created_index: int
    first_audio_at: float
    speech_end: float


# ---- word error rate -------------------------------------------------------------------------


NUMBER_WORDS = dict(enumerate("zero one two three four five six seven eight nine ten eleven twelve thirteen "
                               "fourteen fifteen sixteen seventeen eighteen nineteen twenty".split()))


def normalized_words(text: str) -> list[str]:
    """Lower case, no punctuation, small numbers spelled out (Whisper writes '2' for 'two')."""
    words = re.sub(r"[^a-z0-9' ]+", " ", text.lower()).split()
    return [NUMBER_WORDS.get(int(word), word) if word.isdigit() else word for word in words]


def word_errors(reference: str, hypothesis: str) -> int:
    """Word-level Levenshtein distance (substitutions + deletions + insertions)."""
    ref, hyp = normalized_words(reference), normalized_words(hypothesis)
    row = list(range(len(hyp) + 1))
    for i, ref_word in enumerate(ref, start=1):
        previous_diagonal, row[0] = row[0], i
        for j, hyp_word in enumerate(hyp, start=1):
            substitution = previous_diagonal + (ref_word != hyp_word)
            previous_diagonal = row[j]
            row[j] = min(substitution, row[j] + 1, row[j - 1] + 1)
    return row[len(hyp)]


def score_transcript(result: TurnResult) -> None:
    if result.expected is None:
        return
    result.reference_words = len(normalized_words(result.expected))
    result.word_errors = word_errors(result.expected, result.transcript)
    result.wer = round(result.word_errors / max(1, result.reference_words), 4)


# ---- a load level and its summary ------------------------------------------------------------


def percentiles(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"count": 0, "p50": None, "p95": None, "p99": None, "mean": None, "max": None}
    array = np.asarray(values, dtype=float)
    p50, p95, p99 = np.percentile(array, [50, 95, 99])
    return {"count": len(values), "p50": round(float(p50), 1), "p95": round(float(p95), 1),
            "p99": round(float(p99), 1), "mean": round(float(array.mean()), 1), "max": round(float(array.max()), 1)}


def summarize_level(sessions: int, results: list[SessionResult], wall_s: float) -> dict[str, Any]:
    turns = [turn for result in results for turn in result.turns]
    scored = [turn for turn in turns if turn.wer is not None and turn.response_id is not None]
    errors = ([f"session {r.index}: {r.detail}" for r in results if r.outcome == "error"]
              + [f"session {t.session} turn {t.turn}: {t.error}" for t in turns if t.error]
              + [f"session {r.index}: server error: {message}" for r in results for message in r.errors])
    return {
        "sessions": sessions,
        "wall_s": round(wall_s, 1),
        "turns_completed": sum(1 for t in turns if t.error is None and t.response_id is not None),
        "latency_ms": {name: percentiles([getattr(t, name) for t in turns if getattr(t, name) is not None])
                       for name in LATENCY_METRICS},
        "wer": round(sum(t.word_errors for t in scored) / max(1, sum(t.reference_words for t in scored)), 4),
        "barge_ins": sum(1 for t in turns if t.barge_in_to_cleared_ms is not None),
        "barge_ins_missed": sum(1 for t in turns if t.barge_in_missed),
        "stale_audio_deltas": sum(t.stale_audio_deltas for t in turns),
        "errors": errors,
        "refused": sum(1 for r in results if r.outcome == "refused"),
        "dropped": sum(1 for r in results if r.outcome == "dropped"),
        "session_outcomes": [{"session": r.index, "outcome": r.outcome, "detail": r.detail} for r in results],
        "turns": [asdict(t) for t in turns],
    }


async def run_level(sessions: int, script: Script, audio: list[np.ndarray], options: RunOptions) -> dict[str, Any]:
    started = time.monotonic()
    users = [SimulatedUser(index, script, audio, options) for index in range(sessions)]
    results = await asyncio.gather(*(user.run() for user in users))
    level = summarize_level(sessions, list(results), time.monotonic() - started)
    log.info("level %d sessions: %d turns, %d errors, %d refused, %d dropped", sessions,
             level["turns_completed"], len(level["errors"]), level["refused"], level["dropped"])
    return level


async def run_ramp(levels: list[int], script: Script, audio: list[np.ndarray], options: RunOptions,
                   settle_s: float = 2.0) -> list[dict[str, Any]]:
    results = []
    for number, sessions in enumerate(levels):
        if number:
            await asyncio.sleep(settle_s)  # let the server finish the previous level's work
        results.append(await run_level(sessions, script, audio, options))
    return results


# ---- output ----------------------------------------------------------------------------------


TABLE_COLUMNS = (("eos_to_transcript_ms", "eos->transcript"), ("eos_to_first_audio_ms", "eos->first audio"),
                 ("eos_to_done_ms", "eos->done"), ("barge_in_to_cleared_ms", "barge-in->cleared"))


def format_table(levels: list[dict[str, Any]]) -> str:
    """One row a load level: p50/p95/p99 in ms of each latency, then WER and failures."""
    def cell(stats: dict[str, Any]) -> str:
        if not stats["count"]:
            return "-"
        return f"{stats['p50']:.0f}/{stats['p95']:.0f}/{stats['p99']:.0f}"

    header = ["sessions", "turns"] + [f"{label} p50/p95/p99" for _, label in TABLE_COLUMNS] + [
        "WER", "errors", "refused", "dropped"]
    rows = [[str(level["sessions"]), str(level["turns_completed"])]
            + [cell(level["latency_ms"][name]) for name, _ in TABLE_COLUMNS]
            + [f"{level['wer']:.3f}", str(len(level["errors"])), str(level["refused"]), str(level["dropped"])]
            for level in levels]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [" | ".join(text.rjust(width) for text, width in zip(row, widths)) for row in [header, *rows]]
    lines.insert(1, "-+-".join("-" * width for width in widths))
    return "\n".join(lines)


def plot_levels(levels: list[dict[str, Any]], path: Path) -> None:
    """Box plots of each latency's distribution, one box per load level."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(TABLE_COLUMNS), figsize=(4.2 * len(TABLE_COLUMNS), 4.2), squeeze=False)
    for axis, (name, label) in zip(axes[0], TABLE_COLUMNS):
        data = [[t[name] for t in level["turns"] if t[name] is not None] for level in levels]
        positions = [str(level["sessions"]) for level in levels]
        if any(data):
            axis.boxplot([values or [float("nan")] for values in data], tick_labels=positions, whis=(5, 95))
        axis.set_title(label)
        axis.set_xlabel("concurrent sessions")
        axis.set_ylabel("ms")
        axis.grid(axis="y", alpha=0.3)
    figure.suptitle("voice-app loadtest: latency per load level (whiskers p5-p95)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


# ---- command line ----------------------------------------------------------------------------


def parse_levels(text: str) -> list[int]:
    try:
        levels = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        levels = []
    if not levels or any(level < 1 for level in levels):
        raise argparse.ArgumentTypeError(f"expected comma-separated session counts >= 1, like 1,2,4,8; got {text!r}")
    return levels


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("loadtest", help="drive concurrent scripted sessions against a server; "
                                                    "report latency percentiles")
    parser.add_argument("--url", required=True, help="the realtime websocket, e.g. ws://127.0.0.1:8765/v1/realtime")
    parser.add_argument("--script", help="conversation script, YAML or JSON (default: a built-in one)")
    load = parser.add_mutually_exclusive_group()
    load.add_argument("--sessions", type=int, default=1, help="concurrent sessions (default 1)")
    load.add_argument("--ramp", type=parse_levels, help="load levels run one after another, e.g. 1,2,4,8")
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--turns", type=int, help="turns per session, cycling through the script "
                                                  "(default: the script once)")
    length.add_argument("--duration", type=positive_float, help="seconds each session keeps talking")
    parser.add_argument("--speed", type=positive_float, default=1.0,
                        help="audio pace factor; >1 streams faster than real time for quick runs")
    parser.add_argument("--frame-ms", type=int, default=40, choices=[20, 30, 40], help="audio frame length")
    parser.add_argument("--stagger-ms", type=int, default=500, help="delay between session starts")
    parser.add_argument("--turn-timeout", type=positive_float, default=120.0, help="seconds to wait for a reply")
    parser.add_argument("--report", type=Path, help="write the full report (every turn) as JSON here")
    parser.add_argument("--plot", type=Path, help="write latency distributions per load level as a PNG here")
    parser.add_argument("--piper-voice", help="Piper voice for `say` turns (default: the server's default voice)")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR, help="synthesised utterances")
    parser.add_argument("--log-level", default="WARNING")
    parser.set_defaults(run=run_loadtest)


def validate_args(args: argparse.Namespace) -> str | None:
    if not re.match(r"^wss?://[^/]+", args.url):
        return f"--url must be a ws:// or wss:// URL like ws://127.0.0.1:8765/v1/realtime, got {args.url!r}"
    if args.sessions < 1:
        return f"--sessions must be >= 1, got {args.sessions}"
    if args.turns is not None and args.turns < 1:
        return f"--turns must be >= 1, got {args.turns}"
    if args.stagger_ms < 0:
        return f"--stagger-ms must be >= 0, got {args.stagger_ms}"
    return None


def run_loadtest(args: argparse.Namespace) -> int:
    problem = validate_args(args)
    if problem is None:
        try:
            script = load_script(args.script)
        except ScriptError as exc:
            problem = str(exc)
    if problem is not None:
        print(f"voice-app loadtest: {problem}", file=sys.stderr)
        return 2
    from voice_app.settings import default_piper_voice

    audio = utterance_audio(script, args.piper_voice or default_piper_voice(), args.cache_dir)
    options = RunOptions(url=args.url, frame_ms=args.frame_ms, speed=args.speed, stagger_ms=args.stagger_ms,
                         turns=args.turns, duration_s=args.duration, turn_timeout_s=args.turn_timeout)
    levels = asyncio.run(run_ramp(args.ramp or [args.sessions], script, audio, options))
    print(format_table(levels))
    for level in levels:
        for error in level["errors"]:
            print(f"  [{level['sessions']} sessions] {error}")
    report = {"url": args.url, "script": script.name, "options": asdict(options), "levels": levels}
    if args.report is not None:
        args.report.write_text(json.dumps(report, indent=2))
    if args.plot is not None:
        plot_levels(levels, args.plot)
    failed = any(level["errors"] or level["dropped"] for level in levels)
    return 1 if failed else 0
