"""Soak: scripted voice sessions with barge-ins against one server for 30-60 minutes, recording
the server's RSS, each turn's latency, the server's event-loop lag and its engine's KV pool.
Prints JSON (and a table on stderr); docs/benchmarks.md keeps the last run.

    .venv/bin/python scripts/soak.py --minutes 30 --sessions 2 --report soak.json

Starts `voice-app serve` on a free port (its RSS is sampled every --sample-s seconds), then runs
`voice-app loadtest`'s simulated users (the default script: questions, a long story talked
over 600 ms into its audio, a pause inside a turn, a backchannel) for the whole time.
`rss_growth_after_warmup` compares the median RSS of the minute after the warm-up with that of
the last minute; flat is under 5 %. `kv` summarises the KV pool's gauges over the samples taken
while the engine held blocks: its bytes, table entries per block held (above 1: shared prompt
heads) and positions held per position written (1.0: no copies and no unused room). A short run
with many sessions measures the pool under load:

    .venv/bin/python scripts/soak.py --minutes 3 --sessions 8 --sample-s 0.5 --warmup-s 60
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import urllib.request
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scripts.fuzz_realtime import against_a_server, emit, healthz  # noqa: E402
from voice_app.loadtest.command import run_level  # noqa: E402
from voice_app.loadtest.script import load_script, utterance_audio  # noqa: E402
from voice_app.loadtest.user import RunOptions  # noqa: E402
from voice_app.settings import default_piper_voice  # noqa: E402


class Sampler:
    """The server's RSS (its process and children), loop lag and engine state, every `every_s`."""

    def __init__(self, pid: int, base_url: str, every_s: float):
        self.process = psutil.Process(pid)
        self.base_url = base_url
        self.every_s = every_s
        self.started = time.monotonic()
        self.samples: list[dict] = []

    def rss_mb(self) -> float:
        processes = [self.process, *self.process.children(recursive=True)]
        return sum(p.memory_info().rss for p in processes) / 2**20

    async def run(self) -> None:
        while True:
            health = await asyncio.to_thread(healthz, self.base_url)
            self.samples.append({"t_s": round(time.monotonic() - self.started, 1), "rss_mb": round(self.rss_mb(), 1),
                                 "loop_lag_ms": health.get("event_loop_lag_ms"),
                                 "engine_alive": health["engine"]["alive"], "live_sessions": health["live_sessions"],
                                 **await asyncio.to_thread(kv_gauges, self.base_url)})
            await asyncio.sleep(self.every_s)


KV_GAUGES = {"voice_engine_kv_cache_bytes": "kv_bytes", "voice_engine_kv_promised_bytes": "kv_promised_bytes",
             "voice_engine_kv_shared_ratio": "kv_shared_ratio",
             "voice_engine_kv_held_per_written_ratio": "kv_held_per_written"}


def kv_gauges(base_url: str) -> dict:
    """The KV pool's gauges from the server's /metrics."""
    with urllib.request.urlopen(base_url + "/metrics", timeout=10) as reply:
        lines = reply.read().decode().splitlines()
    values = dict(line.split()[:2] for line in lines if line and not line.startswith("#"))
    return {key: float(values[name]) for name, key in KV_GAUGES.items() if name in values}


def kv_summary(samples: list[dict]) -> dict:
    held = [s for s in samples if s.get("kv_promised_bytes")]  # live requests held blocks
    mib = lambda values: percentiles([v / 2**20 for v in values])  # noqa: E731
    return {"samples": len(held),
            "bytes_mib": mib([s["kv_bytes"] for s in held]),
            "promised_mib": mib([s["kv_promised_bytes"] for s in held]),
            "shared_ratio": percentiles([s["kv_shared_ratio"] for s in held], digits=3),
            "held_per_written": percentiles([s["kv_held_per_written"] for s in held], digits=3)}


def median_rss(samples: list[dict], start_s: float, end_s: float) -> float | None:
    window = [s["rss_mb"] for s in samples if start_s <= s["t_s"] <= end_s]
    return round(statistics.median(window), 1) if window else None


def percentiles(values: list[float], digits: int = 1) -> dict:
    if not values:
        return {}
    ordered = sorted(values)
    pick = lambda q: round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], digits)  # noqa: E731
    return {"p50": pick(0.5), "p95": pick(0.95), "p99": pick(0.99), "max": round(ordered[-1], digits),
            "n": len(ordered)}


def summarize(level: dict, samples: list[dict], minutes: float, warmup_s: float) -> dict:
    turns = level["turns"]
    end_s = samples[-1]["t_s"] if samples else 0.0
    at_warmup = median_rss(samples, warmup_s, warmup_s + 60)
    at_end = median_rss(samples, end_s - 60, end_s)
    lags = [s["loop_lag_ms"] for s in samples if s["loop_lag_ms"] is not None]
    return {
        "minutes": minutes, "sessions": level["sessions"], "turns": level["turns_completed"],
        "errors": len(level["errors"]), "barge_ins": level["barge_ins"], "dropped": level["dropped"],
        "rss_mb": {"start": samples[0]["rss_mb"] if samples else None, "after_warmup": at_warmup, "end": at_end,
                   "max": max((s["rss_mb"] for s in samples), default=None)},
        "rss_growth_after_warmup": round(at_end / at_warmup - 1, 4) if at_warmup and at_end else None,
        "eos_to_first_audio_ms": percentiles([t["eos_to_first_audio_ms"] for t in turns if t.get("eos_to_first_audio_ms")]),
        "eos_to_done_ms": percentiles([t["eos_to_done_ms"] for t in turns if t.get("eos_to_done_ms")]),
        "barge_in_to_cleared_ms": percentiles([t["barge_in_to_cleared_ms"] for t in turns
                                               if t.get("barge_in_to_cleared_ms") is not None]),
        "loop_lag_ms_10s_max": percentiles(lags),
        "engine_alive_throughout": all(s["engine_alive"] for s in samples),
        "kv": kv_summary(samples),
    }


def table(summary: dict) -> str:
    rss, first, lag = summary["rss_mb"], summary["eos_to_first_audio_ms"], summary["loop_lag_ms_10s_max"]
    kv = summary["kv"]
    return "\n".join([
        "| minutes | sessions | turns | errors | RSS start / after warm-up / end MB | growth after warm-up "
        "| eos -> first audio p50 / p95 ms | loop lag p50 / p99 / max ms |",
        "|---:|---:|---:|---:|---|---:|---|---|",
        f"| {summary['minutes']} | {summary['sessions']} | {summary['turns']} | {summary['errors']} "
        f"| {rss['start']} / {rss['after_warmup']} / {rss['end']} | {summary['rss_growth_after_warmup']} "
        f"| {first.get('p50')} / {first.get('p95')} | {lag.get('p50')} / {lag.get('p99')} / {lag.get('max')} |",
        "",
        "| KV pool | p50 | p95 | max |",
        "|---|---:|---:|---:|",
        *(f"| {name} | {kv[key].get('p50')} | {kv[key].get('p95')} | {kv[key].get('max')} |"
          for name, key in [("blocks in use, MiB", "bytes_mib"), ("promised to live requests, MiB", "promised_mib"),
                            ("table entries per block held", "shared_ratio"),
                            ("positions held per position written", "held_per_written")])])


async def soak(args: argparse.Namespace, url: str, base_url: str, pid: int) -> dict:
    script = load_script(args.script)
    audio = utterance_audio(script, default_piper_voice())
    sampler = Sampler(pid, base_url, args.sample_s)
    sampling = asyncio.create_task(sampler.run())
    options = RunOptions(url=url, duration_s=args.minutes * 60, turn_timeout_s=180)
    level = await run_level(args.sessions, script, audio, options)
    await asyncio.sleep(args.sample_s)
    sampling.cancel()
    summary = summarize(level, sampler.samples, args.minutes, args.warmup_s)
    return {"summary": summary, "turns": [turn_row(t) for t in level["turns"]], "rss_samples": sampler.samples,
            "errors": level["errors"][:20]}


def turn_row(turn: dict) -> dict:
    """A turn's latencies and its prompt (how much of it the pool already held), for finding
    which turns are slow and why."""
    server = turn.get("server_metrics") or {}
    return {"session": turn["session"], "turn": turn["turn"], "first_audio_ms": turn.get("eos_to_first_audio_ms"),
            "prompt_tokens": server.get("prompt_tokens"), "cached_prompt_tokens": server.get("cached_prompt_tokens")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--sessions", type=int, default=2)
    parser.add_argument("--script", help="loadtest script (default: the built-in one, with barge-ins)")
    parser.add_argument("--sample-s", type=float, default=10.0, help="seconds between samples")
    parser.add_argument("--warmup-s", type=float, default=300.0, help="RSS growth is measured from here")
    parser.add_argument("--url", help="a running server's websocket; then --pid names its process")
    parser.add_argument("--pid", type=int)
    parser.add_argument("--report", type=Path)
    args = parser.parse_args()
    if args.url is not None and args.pid is None:
        parser.error("--url needs --pid (the server's process, for its RSS)")
    result = against_a_server(args.url, "soak", lambda url, base_url, pid: soak(args, url, base_url, args.pid or pid))
    emit(result, table(result["summary"]), args.report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
