#!/usr/bin/env python3
"""Attention's kernel sets side by side on the fused CPU pass, in one process.

    .venv/bin/python scripts/bench_attention.py [--rounds 3] [--json out.json]

For each pass shape (rows over cached tokens), times a pass with each attention kernel set this
CPU runs (kernels.cpu.attention_kernel_sets(); they give the same bits), alternating the sets
within every round, and keeps each cell's best round: the pass's median ms and its attention
phase (the pass's own timers). Prints JSON, then a table (docs/kernels.md, "Attention").
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dllm_engine.bench import filled_cache, time_pass  # noqa: E402
from dllm_engine.engine import Engine  # noqa: E402
from dllm_engine.models.transformer import Segment  # noqa: E402
from kernels.cpu import attention_kernel_sets  # noqa: E402

SHAPES = [(1, 1700), (8, 1700), (16, 1700), (64, 1700), (64, 400)]  # (rows, cached tokens)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-bd")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    engine = Engine.load(args.model, share_prefixes=False, backend="fused")
    fused, sets = engine._runner.pass_, attention_kernel_sets()
    caches = {(rows, context): filled_cache(engine, context, rows + 1) for rows, context in SHAPES}
    best: dict[str, dict] = {name: {} for name in sets}
    for _ in range(args.rounds):
        for rows, context in SHAPES:
            segments = [Segment(torch.arange(rows) + 42, context, caches[rows, context], context + rows)]
            for name in sets:
                fused.use_attention_kernels(name)
                timed = time_pass(engine, segments, 10, head=False)
                cell = {"ms": round(timed["ms"], 2), "attention_ms": round(timed["phases_ms"]["attention"], 2)}
                key = f"{rows} rows over {context}"
                if key not in best[name] or cell["attention_ms"] < best[name][key]["attention_ms"]:
                    best[name][key] = cell
    report = {"model": args.model, "kernel": engine.kernel, "sets": best}
    print(json.dumps(report, indent=1))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    print(f"\n| pass | {' | '.join(f'{name}: pass / attention ms' for name in sets)} |")
    print(f"|---|{'---:|' * len(sets)}")
    for key in best[sets[0]]:
        cells = [f"{best[name][key]['ms']} / {best[name][key]['attention_ms']}" for name in sets]
        print(f"| {key} | {' | '.join(cells)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
