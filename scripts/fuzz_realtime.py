"""The realtime server's protocol fuzz, the whole corpus (voice_app/loadtest/fuzz_corpus.py: every client
event type mutated, the edge cases of issue 18, GA and beta dialects), with a canary session
asking a spoken question every few seconds; then, optionally, connect/speak/disconnect churn.
Prints JSON (and a markdown table on stderr).

    .venv/bin/python scripts/fuzz_realtime.py                      # starts `voice-app serve` itself
    .venv/bin/python scripts/fuzz_realtime.py --churn 500 --report fuzz.json
    .venv/bin/python scripts/fuzz_realtime.py --url ws://127.0.0.1:8765/v1/realtime --only audio/

A case holds when its bad frames got error events (never server_error), the connection stayed
open and a probe question afterwards got a completed reply. The canary's `max_gap_s` is the
longest wait between two audio deltas of one of its replies while cases ran (its
`baseline_max_gap_s` is the same before any case).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Awaitable, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from voice_app.loadtest.fuzz import churn, corpus, format_table, run_fuzz  # noqa: E402
from voice_app.loadtest.script import Script, ScriptTurn, utterance_audio  # noqa: E402
from voice_app.realtime.server import free_port  # noqa: E402
from voice_app.settings import default_piper_voice  # noqa: E402

QUESTION = "What is the capital of France?"


def start_server(port: int, log_path: Path) -> subprocess.Popen:
    command = [str(ROOT / ".venv" / "bin" / "voice-app"), "serve", "--host", "127.0.0.1", "--port", str(port)]
    with log_path.open("wb") as log:
        server = subprocess.Popen(command, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"voice-app serve exited ({server.returncode}); see {log_path}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2):
                return server
        except OSError:
            time.sleep(1)
    server.kill()
    raise SystemExit(f"voice-app serve did not come up; see {log_path}")


def healthz(base_url: str) -> dict:
    try:
        with urllib.request.urlopen(base_url + "/healthz", timeout=10) as reply:
            return json.loads(reply.read())
    except urllib.error.HTTPError as error:
        return json.loads(error.read())


async def wait_idle(base_url: str, timeout_s: float = 120) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        state = await asyncio.to_thread(healthz, base_url)
        work = (state["live_sessions"], state["engine_live_requests"], state["tts_live_jobs"], state["asr_live_jobs"])
        if work == (0, 0, 0, 0) or time.monotonic() > deadline:
            return state
        await asyncio.sleep(0.5)


async def main_async(args: argparse.Namespace, url: str, base_url: str) -> dict:
    utterance = utterance_audio(Script("fuzz", [ScriptTurn(say=QUESTION, wav=None, transcript=QUESTION)]),
                                default_piper_voice())[0]
    cases = [case for case in corpus(utterance) if args.only is None or args.only in case.name]
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else None
    started = time.monotonic()
    report = await run_fuzz(url, cases, utterance, headers, metrics_url=base_url + "/metrics")
    report["fuzz_seconds"] = round(time.monotonic() - started, 1)
    if args.churn:
        started = time.monotonic()
        refused = await churn(url, utterance, args.churn, headers)
        state = await wait_idle(base_url)
        report["churn"] = {"cycles": args.churn, "refused": refused, "seconds": round(time.monotonic() - started, 1),
                           "after": {key: state[key] for key in ("live_sessions", "engine_live_requests",
                                                                 "tts_live_jobs", "asr_live_jobs")},
                           "engine_alive": state["engine"]["alive"]}
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="a running server's websocket (default: start one on a free port)")
    parser.add_argument("--only", help="run the cases whose name contains this")
    parser.add_argument("--churn", type=int, default=0, help="connect/speak/disconnect cycles after the cases")
    parser.add_argument("--api-key", default=os.environ.get("VOICE_APP_API_TOKEN"))
    parser.add_argument("--report", type=Path, help="write the JSON here too")
    args = parser.parse_args()
    report = against_a_server(args.url, "fuzz_realtime", lambda url, base_url, pid: main_async(args, url, base_url))
    emit(report, format_table(report), args.report)
    return 0 if report["held"] == report["cases"] else 1


def against_a_server(url: str | None, name: str, run: Callable[[str, str, int | None], Awaitable[dict]]) -> dict:
    """run(websocket url, base url, server pid) against `url`, or a `voice-app serve` started on
    a free port for the run (its log in /tmp) and stopped after it."""
    server = None
    if url is None:
        port = free_port()
        server = start_server(port, Path("/tmp") / f"{name}_serve_{port}.log")
        url = f"ws://127.0.0.1:{port}/v1/realtime"
    base_url = url.replace("ws://", "http://").replace("wss://", "https://").split("/v1/")[0]
    try:
        return asyncio.run(run(url, base_url, server.pid if server is not None else None))
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=30)


def emit(result: dict, table: str, report: Path | None) -> None:
    """The JSON on stdout (and in `report`), the table on stderr."""
    text = json.dumps(result, indent=2)
    print(text)
    print(table, file=sys.stderr)
    if report is not None:
        report.write_text(text)


if __name__ == "__main__":
    sys.exit(main())
