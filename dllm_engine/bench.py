"""`dllm bench`: the same fixed prompts in diffusion and autoregressive mode, alone and at
several concurrency levels; prints a table and JSON, and rewrites its table in docs/benchmarks.md."""

from __future__ import annotations

import json
import platform
import re
import statistics
import time
from pathlib import Path

import torch

from dllm_engine.request import GenerationParams

BENCH_PROMPTS = [
    "Tell me a short story about a robot who learns to paint.",
    "Explain how a rainbow forms.",
    "What are some tips for sleeping better?",
    "Describe your ideal weekend.",
    "Why is the sky blue?",
    "How do I make a good cup of tea?",
    "What is the difference between weather and climate?",
    "Give me some advice for a job interview.",
]
_SENTENCE_END = re.compile(r"[.!?](\s|$)")
_START, _END = "<!-- dllm-bench:start -->", "<!-- dllm-bench:end -->"


def _one(engine, prompt: str, params: GenerationParams) -> dict:
    started = time.monotonic()
    first_sentence = None
    final = None
    for update in engine.submit(prompt, params):
        final = update
        if first_sentence is None and _SENTENCE_END.search(update.committed_text):
            first_sentence = time.monotonic() - started
    elapsed = time.monotonic() - started
    stats = final.stats
    return {"tokens": stats.new_tokens, "forward_passes": stats.forward_passes, "elapsed_s": elapsed,
            "first_sentence_s": first_sentence if first_sentence is not None else elapsed}


def _concurrent(engine, prompts: list[str], params: GenerationParams, count: int) -> dict:
    started = time.monotonic()
    handles = [engine.submit(prompts[i % len(prompts)], params) for i in range(count)]
    finals = [h.result() for h in handles]
    elapsed = time.monotonic() - started
    tokens = sum(f.stats.new_tokens for f in finals)
    return {"requests": count, "tokens": tokens, "elapsed_s": elapsed, "tokens_per_s": tokens / elapsed,
            "engine_forward_passes": None}


def measure(engine, mode: str, prompts: list[str], max_new_tokens: int, block_size, threshold,
            concurrency: list[int]) -> dict:
    params = GenerationParams(mode=mode, max_new_tokens=max_new_tokens, block_size=block_size, threshold=threshold)
    _one(engine, prompts[0], params)  # warm-up
    runs = [_one(engine, p, params) for p in prompts]
    tokens = sum(r["tokens"] for r in runs)
    total_time = sum(r["elapsed_s"] for r in runs)
    passes = sum(r["forward_passes"] for r in runs)
    result = {
        "mode": mode, "tokens_per_s": tokens / total_time, "tokens": tokens,
        "median_tokens": statistics.median(r["tokens"] for r in runs),
        "forward_passes": passes, "tokens_per_forward": tokens / max(1, passes),
        "median_first_sentence_s": statistics.median(r["first_sentence_s"] for r in runs),
        "median_full_reply_s": statistics.median(r["elapsed_s"] for r in runs),
        "concurrency": {},
    }
    for count in concurrency:
        before = engine.forward_passes
        point = _concurrent(engine, prompts, params, count)
        point["engine_forward_passes"] = engine.forward_passes - before
        result["concurrency"][count] = point
    return result


def run_bench(args) -> int:
    from dllm_engine.engine import Engine

    # no prefix cache: every run repeats the same prompts, and a copied prompt would time the
    # copy instead of the prefill a new conversation pays
    engine = Engine.load(args.model, dtype=args.dtype, download=args.download, device=args.device, backend=args.backend,
                         prefix_cache_entries=0)
    prompts = BENCH_PROMPTS[: max(1, args.prompts)]
    levels = [int(c) for c in str(args.concurrency).split(",") if c.strip()]
    modes = ["diffusion", "autoregressive"] if engine.config.is_diffusion else ["autoregressive"]
    try:
        results = {m: measure(engine, m, prompts, args.max_new_tokens, args.block_size, args.threshold, levels)
                   for m in modes}
    finally:
        engine.close()
    report = {
        "model": engine.model_name, "dtype": str(engine.cache_dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        "machine": (f"{platform.machine()}, {torch.get_num_threads()} threads" if engine.device.type == "cpu"
                    else torch.cuda.get_device_name(engine.device)), "max_new_tokens": args.max_new_tokens,
        "block_size": args.block_size or engine.config.block_size, "threshold": args.threshold or engine.config.default_threshold,
        "prompts": len(prompts), "results": results,
    }
    if "diffusion" in results:
        report["diffusion_vs_ar_speed"] = results["diffusion"]["tokens_per_s"] / results["autoregressive"]["tokens_per_s"]
    table = format_table(report)
    print(table)
    if args.json:
        print(json.dumps(report, indent=2))
    if args.write_docs:
        write_docs(Path(args.write_docs), table, report)
    return 0


def format_table(report: dict) -> str:
    lines = [
        f"model `{report['model']}` ({report['dtype']}, {report['machine']}), {report['prompts']} prompts, "
        f"max {report['max_new_tokens']} new tokens, block {report['block_size']}, threshold {report['threshold']}",
        "",
        "| mode | tok/s (1 req) | tokens/forward | median first sentence (s) | median full reply (s) | median tokens | "
        + " | ".join(f"tok/s @{c}" for c in next(iter(report["results"].values()))["concurrency"]) + " |",
        "|---" * (6 + len(next(iter(report["results"].values()))["concurrency"])) + "|",
    ]
    for mode, r in report["results"].items():
        conc = " | ".join(f"{p['tokens_per_s']:.1f}" for p in r["concurrency"].values())
        lines.append(f"| {mode} | {r['tokens_per_s']:.1f} | {r['tokens_per_forward']:.2f} | "
                     f"{r['median_first_sentence_s']:.2f} | {r['median_full_reply_s']:.2f} | {r['median_tokens']:.0f} | {conc} |")
    if "diffusion_vs_ar_speed" in report:
        lines += ["", f"diffusion / autoregressive wall-clock speed: **{report['diffusion_vs_ar_speed']:.2f}x**"]
    return "\n".join(lines)


def write_docs(path: Path, table: str, report: dict) -> None:
    block = (f"{_START}\n<!-- written by `dllm bench`; rerun it to refresh -->\n"
             f"Command: `dllm bench --model {report['model']} --dtype {report['dtype']} --prompts {report['prompts']} "
             f"--max-new-tokens {report['max_new_tokens']}`\n\n{table}\n{_END}")
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if _START in text and _END in text:
        text = text[:text.index(_START)] + block + text[text.index(_END) + len(_END):]
    else:
        text = text.rstrip() + "\n\n## Engine (`dllm bench`)\n\n" + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
