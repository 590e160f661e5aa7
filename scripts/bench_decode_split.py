"""Where a decoding step's time goes, in real decoding: the target's pass (ModelRunner.run), the draft
head's step (ModelRunner.draft) and everything else (the scheduler, the decoder, Python), per pass,
for AR and for diffusion at each block asked for; then the head's step timed alone, back to back,
for contrast (its weights stay in the L3 cache when no target pass runs between).

    .venv/bin/python scripts/bench_decode_split.py --blocks 3,4 --max-new-tokens 160

Prints JSON and a markdown table. Run it on an idle machine: it is a timing.
"""

from __future__ import annotations

import argparse
import collections
import json
import time

from dllm_engine import calibration
from dllm_engine.engine import Engine
from dllm_engine.request import GenerationParams
from dllm_engine.runner import ModelRunner

PROMPT = [{"role": "user", "content": "Tell me a short story about a dragon."}]


class SplitTimer:
    """Adds the seconds spent in ModelRunner.run and ModelRunner.draft while installed."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = collections.defaultdict(float)
        self._originals = {name: getattr(ModelRunner, name) for name in ("run", "draft")}

    def __enter__(self) -> "SplitTimer":
        for name, original in self._originals.items():
            setattr(ModelRunner, name, self._timed(name, original))
        return self

    def __exit__(self, *exc) -> None:
        for name, original in self._originals.items():
            setattr(ModelRunner, name, original)

    def _timed(self, name, original):
        def timed(runner, *args, **kwargs):
            started = time.perf_counter()
            try:
                return original(runner, *args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - started
        return timed


def decode(engine: Engine, mode: str, block: int | None, max_new_tokens: int) -> dict:
    params = GenerationParams(mode=mode, max_new_tokens=max_new_tokens, stop_at_eos=False, block_size=block)
    with SplitTimer() as timer:
        started = time.perf_counter()
        stats = engine.generate(PROMPT, params).stats
        total = time.perf_counter() - started
    passes = stats.forward_passes
    run, draft = timer.seconds["run"], timer.seconds["draft"]
    return {"mode": mode, "block": block or 1, "tokens": stats.new_tokens, "passes": passes,
            "tokens_per_pass": round(stats.new_tokens / passes, 3), "tokens_per_s": round(stats.new_tokens / total, 1),
            "ms_per_pass": round(1000 * total / passes, 2), "target_ms": round(1000 * run / passes, 2),
            "head_ms": round(1000 * draft / passes, 2), "rest_ms": round(1000 * (total - run - draft) / passes, 2)}


def head_step_alone(engine: Engine, context: int = 128, rows: int = 3, repeats: int = 30) -> float:
    """Median ms of the head's step run back to back (no target pass between)."""
    runner = engine._runner
    cache = calibration.filled_cache(engine, context, rows)
    plan = calibration.verify_plan(cache, context, rows)
    runner.run([plan], [(0.0, None)])
    times = []
    for _ in range(repeats + 1):
        started = time.perf_counter()
        runner.draft([([(plan.taps, context)], cache, calibration.FIRST_TOKEN, context)])
        times.append(time.perf_counter() - started)
    return 1000 * sorted(times[1:])[repeats // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-bd")
    parser.add_argument("--blocks", default="3,4", help="comma-separated diffusion blocks")
    parser.add_argument("--max-new-tokens", type=int, default=160)
    parser.add_argument("--rounds", type=int, default=2, help="each configuration runs this many times, alternating")
    args = parser.parse_args()
    engine = Engine.load(args.model)
    try:
        if engine.loaded.draft_head is None:
            raise SystemExit(f"{args.model} has no draft head: nothing to split")
        configs = [("autoregressive", None)] + [("diffusion", int(b)) for b in args.blocks.split(",")]
        decode(engine, "autoregressive", None, 8)  # warm up, and cache the prompt
        rows = [decode(engine, mode, block, args.max_new_tokens) for _ in range(args.rounds) for mode, block in configs]
        alone = engine._on_scheduler(lambda: head_step_alone(engine))
    finally:
        engine.close()
    print(json.dumps({"runs": rows, "head_step_alone_ms": round(alone, 3)}, indent=2))
    print("\n| mode | block | tokens/pass | tok/s | ms/pass | target pass | head step | rest |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['mode']} | {r['block']} | {r['tokens_per_pass']} | {r['tokens_per_s']} | {r['ms_per_pass']} | "
              f"{r['target_ms']} | {r['head_ms']} | {r['rest_ms']} |")
    print(f"\nthe head's step alone, back to back: {alone:.2f} ms")


if __name__ == "__main__":
    main()
