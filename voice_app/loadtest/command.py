"""`voice-app loadtest`: flags, load levels one after another, the report."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from voice_app.loadtest.report import format_replicas, format_table, plot_levels, summarize_level
from voice_app.loadtest.script import DEFAULT_CACHE_DIR, Script, ScriptError, load_script, utterance_audio
from voice_app.loadtest.user import RunOptions, SimulatedUser

log = logging.getLogger(__name__)


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
    parser.add_argument("--api-key", default=os.environ.get("VOICE_APP_API_TOKEN"),
                        help="the server's API token, if it has one (default: $VOICE_APP_API_TOKEN)")
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
                         turns=args.turns, duration_s=args.duration, turn_timeout_s=args.turn_timeout,
                         api_key=args.api_key)
    levels = asyncio.run(run_ramp(args.ramp or [args.sessions], script, audio, options))
    print(format_table(levels))
    if format_replicas(levels):
        print(format_replicas(levels))
    for level in levels:
        for error in level["errors"]:
            print(f"  [{level['sessions']} sessions] {error}")
    shown = {k: v for k, v in asdict(options).items() if k != "api_key"}  # a report never holds the key
    report = {"url": args.url, "script": script.name, "options": shown, "levels": levels}
    if args.report is not None:
        args.report.write_text(json.dumps(report, indent=2))
    if args.plot is not None:
        plot_levels(levels, args.plot)
    failed = any(level["errors"] or level["dropped"] for level in levels)
    return 1 if failed else 0
