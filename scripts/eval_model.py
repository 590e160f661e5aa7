#!/usr/bin/env python3
"""Evaluate a diffusion model against its own autoregressive mode, for docs/models.md.

    .venv/bin/python scripts/eval_model.py --model smollm2-135m-bd --thresholds 0.9,0.7,0.5

On the held-out prompts (drawn with the evaluation seed; training never sees them): tokens
committed per forward pass, exact-match rate and token agreement of the diffusion reply with the
greedy autoregressive reply; on the factual sanity set: accuracy in both modes. Prints JSON and
a markdown table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dllm_engine.engine import Engine  # noqa: E402
from dllm_engine.resolve import DTYPES  # noqa: E402
from dllm_engine.request import GenerationParams  # noqa: E402
from dllm_engine.training.prompts import SANITY_QUESTIONS, conversation, voice_prompts  # noqa: E402
from dllm_engine.training.prompts_wide import HELD_OUT_SEED, wide_prompts  # noqa: E402


def run_all(engine: Engine, conversations: list, params: GenerationParams, concurrency: int) -> list:
    finals = []
    for first in range(0, len(conversations), concurrency):
        handles = [engine.submit(c, params) for c in conversations[first:first + concurrency]]
        finals.extend(h.result() for h in handles)
    return finals


def agreement(a: list[int], b: list[int]) -> float:
    """Share of positions where both replies hold the same token (over the longer reply)."""
    if not a and not b:
        return 1.0
    return sum(x == y for x, y in zip(a, b)) / max(len(a), len(b))


def kept_by_offset(finals: list) -> list[float]:
    """Share of the passes that committed a token whose draft at offset j (1-based) was kept:
    those that committed more than j tokens (the prefill's pass counts, with no drafts)."""
    counts: list[int] = []
    for final in finals:
        for k, n in enumerate(final.stats.pass_commits):
            counts += [0] * (k + 1 - len(counts))
            counts[k] += n
    deciding = sum(counts[1:])
    return [round(sum(counts[j + 1:]) / max(1, deciding), 4) for j in range(1, len(counts) - 1)]


def diffusion_figures(ar_held: list, dif_held: list, dif_sanity: list) -> dict:
    """One diffusion configuration's replies against the AR replies to the same prompts."""
    passes = max(1, sum(f.stats.forward_passes for f in dif_held))
    return {
        "tokens_per_forward": sum(f.stats.committed_tokens for f in dif_held) / passes,
        "continued_share": sum(f.stats.continued_passes for f in dif_held) / passes,
        "exact_match": sum(a.token_ids == d.token_ids for a, d in zip(ar_held, dif_held)) / len(dif_held),
        "token_agreement": sum(agreement(a.token_ids, d.token_ids) for a, d in zip(ar_held, dif_held)) / len(dif_held),
        "sanity_accuracy": sum(correct(f.committed_text, k) for f, (_, k) in zip(dif_sanity, SANITY_QUESTIONS))
        / len(dif_sanity),
        "mean_reply_tokens": sum(f.stats.new_tokens for f in dif_held) / len(dif_held),
        "kept_by_offset": kept_by_offset(dif_held),
    }


def correct(answer: str, keywords: list[str]) -> bool:
    text = answer.lower()
    return any(k in text for k in keywords)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2-135m-bd")
    parser.add_argument("--dtype", default="auto", choices=["auto", *DTYPES])
    parser.add_argument("--eval-prompts", type=int, default=100)
    parser.add_argument("--prompt-set", choices=["base", "wide"], default="base",
                        help="base: the templated turns' held-out draw; wide: the wide draw's held-out part, "
                             "about words no training turn names (training/prompts_wide.py)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--thresholds", default="exact",
                        help="comma-separated thresholds, or `exact` (the engine's default: lossless); "
                             "the first is reported as the default")
    parser.add_argument("--block-size", type=int, default=None)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--verify-drafts", type=int, default=GenerationParams.verify_drafts,
                        help="drafts the cache write checks each step (0: off)")
    parser.add_argument("--activations", default="auto", choices=["auto", "int8", "fp32"],
                        help="the fused pass's activations (auto: int8)")
    parser.add_argument("--kv-cache", default="auto", choices=["auto", "fp16", "fp32"],
                        help="the fused pass's keys and values (auto: fp16 with int8 activations)")
    parser.add_argument("--drafts", default="head,continuations",
                        help="comma-separated: head (the draft head's drafts only), continuations (the head's, or "
                             "a continuation of earlier text where it promises more: the default decoding)")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON here too")
    args = parser.parse_args()

    # no recent replies to draft from: each prompt is decoded once per configuration
    engine = Engine.load(args.model, dtype=args.dtype, max_live_requests=64, share_prefixes=False, recent_replies=0,
                         activations=args.activations, kv_cache=args.kv_cache)
    if args.block_size is None:  # the head's block and the continuations' row costs, as the server times them
        engine.choose_block()
    prompts = (voice_prompts(args.eval_prompts, seed=1000) if args.prompt_set == "base"  # the held-out draws
               else wide_prompts(args.eval_prompts, seed=HELD_OUT_SEED, part="held_out"))
    held_out = [conversation(p, voice_system=i % 2 == 0) for i, p in enumerate(prompts)]
    sanity = [[{"role": "user", "content": q}] for q, _ in SANITY_QUESTIONS]

    def params(mode: str, threshold: float | None = None) -> GenerationParams:
        return GenerationParams(mode=mode, max_new_tokens=args.max_new_tokens, threshold=threshold,
                                block_size=args.block_size, verify_drafts=args.verify_drafts)

    t0 = time.monotonic()
    ar = run_all(engine, held_out + sanity, params("autoregressive"), args.concurrency)
    ar_held, ar_sanity = ar[:len(held_out)], ar[len(held_out):]
    report = {"model": args.model, "dtype": str(engine.cache_dtype).removeprefix("torch."),
              "activations": engine.activations, "kernel": engine.kernel,
              "verify_drafts": args.verify_drafts, "eval_prompts": len(held_out), "prompt_set": args.prompt_set,
              "block_size": args.block_size or engine.config.block_size, "max_new_tokens": args.max_new_tokens,
              "sanity_questions": len(sanity),
              "ar_sanity_accuracy": sum(correct(f.committed_text, k) for f, (_, k) in zip(ar_sanity, SANITY_QUESTIONS)) / len(sanity),
              "ar_tokens_per_forward": sum(f.stats.committed_tokens for f in ar_held) / sum(f.stats.forward_passes for f in ar_held),
              "by_threshold": {}, "examples": []}
    for drafts in args.drafts.split(","):
        if drafts not in ("head", "continuations"):
            sys.exit(f"--drafts takes head and continuations, not {drafts!r}")
        with engine.head_drafts_only() if drafts == "head" else contextlib.nullcontext():
            for threshold in [None if t == "exact" else float(t) for t in args.thresholds.split(",")]:
                dif = run_all(engine, held_out + sanity, params("diffusion", threshold), args.concurrency)
                dif_held, dif_sanity = dif[:len(held_out)], dif[len(held_out):]
                label = f"{'exact' if threshold is None else threshold}, {drafts}"
                report["by_threshold"][label] = diffusion_figures(ar_held, dif_held, dif_sanity)
                if not report["examples"]:
                    report["examples"] = [{"prompt": prompts[i], "autoregressive": ar_held[i].committed_text,
                                           "diffusion": dif_held[i].committed_text} for i in range(min(5, len(prompts)))]
    report["seconds"] = time.monotonic() - t0
    engine.close()
    print(json.dumps(report, indent=2))
    print(f"\nAR sanity accuracy: {report['ar_sanity_accuracy']:.0%}; AR tokens/forward {report['ar_tokens_per_forward']:.2f}\n")
    print("| threshold, drafts | tokens/forward | passes checking a continuation | exact match vs AR | token agreement | "
          "sanity accuracy | mean reply tokens | draft kept by offset |")
    print("|---|---|---|---|---|---|---|---|")
    for threshold, r in report["by_threshold"].items():
        print(f"| {threshold} | {r['tokens_per_forward']:.2f} | {r['continued_share']:.0%} | {r['exact_match']:.0%} | "
              f"{r['token_agreement']:.0%} | {r['sanity_accuracy']:.0%} | {r['mean_reply_tokens']:.1f} | "
              f"{' / '.join(f'{v:.2f}' for v in r['kept_by_offset'])} |")
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
