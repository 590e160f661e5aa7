#!/usr/bin/env python3
"""fp16 against fp32 keys and values on the fused CPU pass, side by side in one process.

    .venv/bin/python scripts/bench_kv_cache.py [--rounds 3] [--json out.json]

Times a pass over a long cache (1 and 8 rows over 200 and 800 cached tokens, the pass's own
attention timer beside it) and eight concurrent AR replies of 200 tokens, for two engines that
differ only in `kv_cache`, alternating, each case's best round. Prints JSON, then a table
(docs/kernels.md, "fp16 keys and values").
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dllm_engine.bench import BENCH_PROMPTS, concurrent, filled_cache, time_pass  # noqa: E402
from dllm_engine.engine import Engine  # noqa: E402
from dllm_engine.models.transformer import Segment  # noqa: E402
from dllm_engine.request import GenerationParams  # noqa: E402

PASSES = [(200, 1), (800, 1), (800, 8)]  # (cached tokens, rows)


def pass_ms(engine: Engine, context: int, rows: int) -> dict:
    """The pass alone (no head), and its attention phase."""
    cache = filled_cache(engine, context, rows + 1)
    timed = time_pass(engine, [Segment(torch.arange(rows) + 42, context, cache, context + rows)], 40, head=False)
    return {"ms": timed["ms"], "attention_ms": timed["phases_ms"]["attention"]}


def concurrent_tokens_per_s(engine: Engine, count: int = 8, new_tokens: int = 200) -> float:
    params = GenerationParams(mode="autoregressive", max_new_tokens=new_tokens)
    return concurrent(engine, BENCH_PROMPTS, params, count)["tokens_per_s"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-bd")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    engines = {kv: Engine.load(args.model, share_prefixes=False, backend="fused", kv_cache=kv)
               for kv in ("fp32", "fp16")}
    best: dict[str, dict] = {kv: {} for kv in engines}
    try:
        for _ in range(args.rounds):
            for kv, engine in engines.items():
                for context, rows in PASSES:
                    key, timed = f"{rows} row(s) over {context} cached tokens", pass_ms(engine, context, rows)
                    if key not in best[kv] or timed["ms"] < best[kv][key]["ms"]:
                        best[kv][key] = timed
                rate = concurrent_tokens_per_s(engine)
                best[kv]["8 concurrent AR replies, tok/s"] = max(rate, best[kv].get("8 concurrent AR replies, tok/s", 0))
    finally:
        for engine in engines.values():
            engine.close()
    print(json.dumps(best, indent=2))
    if args.json:
        args.json.write_text(json.dumps(best, indent=2))
    print("\n| case | fp32 keys and values | fp16 |\n|---|---|---|")
    for key in best["fp32"]:
        cells = [best[kv][key] for kv in ("fp32", "fp16")]
        print(f"| {key} | " + " | ".join(f"{c:.0f}" if isinstance(c, float) else
                                          f"{c['ms']:.2f} ms (attention {c['attention_ms']:.2f})" for c in cells) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
