"""Bench the kernels/ ops: correctness at real model sizes and kernel vs reference time.

    .venv/bin/python scripts/bench_kernels.py [--repeats 30] [--json out.json] [--all-sizes]

On a CUDA machine: each Triton kernel is checked against its torch reference at the sizes
of Dream-7B (vocab 152064, hidden 3584) and SmolLM2-135M (vocab 49152, hidden 576) and both
are timed with CUDA events. Without CUDA it says so and times only the CPU paths, including
the chunked confidence-head reference against a plain full softmax (the engine's CPU path
uses whichever is faster). Prints one JSON document, then a table; times are medians in ms.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels import block_attention, confidence_head, select_commits  # noqa: E402
from kernels.block_attention import reference as attention_reference  # noqa: E402
from kernels.commit_selection import reference as commits_reference  # noqa: E402
from kernels.head_confidence import reference as head_reference  # noqa: E402

# (model, vocab, hidden) of the output heads; (model, q heads, kv heads, head dim) of attention.
HEADS = [("dream-7b", 152064, 3584), ("smollm2-135m", 49152, 576)]
ATTENTION = [("dream-7b", 28, 4, 128), ("smollm2-135m", 9, 3, 64)]
HEAD_ROWS = (16, 32, 64)


def plain_softmax_head(hidden: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The unfused baseline: full [N, V] logits, softmax, max, entropy."""
    probs = torch.softmax((hidden @ weight.T).float(), dim=1)
    prob, token = probs.max(dim=1)
    entropy = -(probs * torch.log(probs.clamp_min(1e-30))).sum(dim=1)
    return token, prob, entropy


def median_ms(impls: dict[str, Callable[[], object]], repeats: int, device: torch.device) -> dict[str, float]:
    """Median wall time of each callable; runs are interleaved so background load hits all
    of them alike. CUDA: events around each call; CPU: perf_counter."""
    times: dict[str, list[float]] = {name: [] for name in impls}
    for fn in impls.values():  # warm-up: compilation, autotuning, allocator
        fn()
        fn()
    cuda = device.type == "cuda"
    for _ in range(repeats):
        for name, fn in impls.items():
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                torch.cuda.synchronize()
                times[name].append(start.elapsed_time(end))
            else:
                began = time.perf_counter()
                fn()
                times[name].append((time.perf_counter() - began) * 1e3)
    return {name: round(statistics.median(values), 4) for name, values in times.items()}


def add_triton(impls: dict[str, Callable[[], object]], run_triton: Callable[[], object],
               check: Callable[[object], dict], device: torch.device) -> dict:
    """On CUDA: run the Triton kernel once, check its output, and time it with the others.
    A kernel that fails to compile or run is reported in the record, not fatal, so one
    broken kernel still leaves the table of the rest."""
    if device.type != "cuda":
        return {}
    try:
        verdict = check(run_triton())
    except Exception as error:  # noqa: BLE001 - any failure is the finding
        return {"ok": False, "error": f"{type(error).__name__}: {error}"[:800]}
    impls["triton"] = run_triton
    return verdict


def bench_heads(device: torch.device, dtypes: list[torch.dtype], heads: list, repeats: int) -> list[dict]:
    records = []
    for model, vocab, hidden_size in heads:
        for dtype in dtypes:
            weight = (torch.randn(vocab, hidden_size, device=device) / hidden_size**0.5).to(dtype)
            for rows in HEAD_ROWS:
                hidden = (torch.randn(rows, hidden_size, device=device) * 2).to(dtype)
                impls: dict[str, Callable[[], object]] = {
                    "reference": partial(head_reference, hidden, weight),
                    "plain_softmax": partial(plain_softmax_head, hidden, weight),
                }
                check = add_triton(impls, partial(confidence_head, hidden, weight, backend="triton"),
                                   partial(check_head, hidden, weight), device)
                records.append({
                    "op": "confidence_head", "case": f"{model} N={rows} V={vocab} H={hidden_size}",
                    "dtype": str(dtype).removeprefix("torch."), "ms": median_ms(impls, repeats, device), **check,
                })
    return records


def check_head(hidden: torch.Tensor, weight: torch.Tensor, result: tuple[torch.Tensor, ...]) -> dict:
    """Triton on the native dtype against the reference on the same values in fp32."""
    token, prob, entropy = result
    ref_token, ref_prob, ref_entropy = head_reference(hidden.float(), weight.float())
    match = (token == ref_token).float().mean().item()
    prob_err = (prob - ref_prob).abs().max().item()
    entropy_err = (entropy - ref_entropy).abs().max().item()
    finite = bool(torch.isfinite(prob).all() and torch.isfinite(entropy).all())
    return {"token_match": match, "max_prob_err": prob_err, "max_entropy_err": entropy_err,
            "ok": finite and match >= 0.98 and prob_err < 1e-3 and entropy_err < 1e-2}


def bench_commits(device: torch.device, repeats: int) -> list[dict]:
    rows, block_len = 64, 32
    confidence = torch.rand(rows, block_len, device=device)
    masked = torch.rand(rows, block_len, device=device) < 0.6
    threshold = torch.full((rows,), 0.9, device=device)
    expected = commits_reference(confidence, masked, threshold)
    impls: dict[str, Callable[[], object]] = {"reference": partial(commits_reference, confidence, masked, threshold)}
    check = add_triton(impls, partial(select_commits, confidence, masked, threshold, backend="triton"),
                       lambda committed: {"ok": bool(torch.equal(committed, expected))}, device)
    return [{"op": "select_commits", "case": f"R={rows} B={block_len}", "dtype": "float32",
             "ms": median_ms(impls, repeats, device), **check}]


def bench_attention(device: torch.device, dtype: torch.dtype, repeats: int) -> list[dict]:
    records = []
    rows, block_len, cache_len = 8, 32, 1024
    for model, q_heads, kv_heads, head_dim in ATTENTION:
        q = torch.randn(rows, q_heads, block_len, head_dim, device=device, dtype=dtype)
        k_cache = torch.randn(rows, kv_heads, cache_len, head_dim, device=device, dtype=dtype)
        v_cache = torch.randn_like(k_cache)
        prefix_lens = torch.randint(0, cache_len - block_len + 1, (rows,))
        impls: dict[str, Callable[[], object]] = {
            "reference": partial(attention_reference, q, k_cache, v_cache, prefix_lens)}
        check = add_triton(impls, partial(block_attention, q, k_cache, v_cache, prefix_lens, backend="triton"),
                           partial(check_attention, q, k_cache, v_cache, prefix_lens), device)
        records.append({
            "op": "block_attention",
            "case": f"{model} R={rows} Hq={q_heads} Hkv={kv_heads} Bq={block_len} L={cache_len} D={head_dim}",
            "dtype": str(dtype).removeprefix("torch."), "ms": median_ms(impls, repeats, device), **check,
        })
    return records


def check_attention(q, k_cache, v_cache, prefix_lens, out: torch.Tensor) -> dict:
    """Triton on the native dtype against the reference on the same values in fp32."""
    expected = attention_reference(q.float(), k_cache.float(), v_cache.float(), prefix_lens)
    err = (out.float() - expected).abs().max().item()
    return {"max_abs_err": err, "ok": bool(torch.isfinite(out).all()) and err < 2e-2}


def print_table(records: list[dict]) -> None:
    names = ["triton", "reference", "plain_softmax"]
    print(f"\n| op | case | dtype | {' | '.join(n + ' ms' for n in names)} | check |")
    print("|" + "---|" * (4 + len(names)))
    for record in records:
        times = " | ".join(f"{record['ms'][n]:.3f}" if n in record["ms"] else "-" for n in names)
        verdict = ("ERROR (see JSON)" if "error" in record else "-" if "ok" not in record
                   else "ok" if record["ok"] else "MISMATCH")
        print(f"| {record['op']} | {record['case']} | {record['dtype']} | {times} | {verdict} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=30, help="timed runs per implementation")
    parser.add_argument("--json", type=Path, help="also write the JSON document here")
    parser.add_argument("--all-sizes", action="store_true", help="on CPU also the 152k x 3584 head")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    if not cuda:
        print(f"no CUDA device: timing only the CPU reference paths ({torch.get_num_threads()} threads)",
              file=sys.stderr)
    heads = HEADS if cuda or args.all_sizes else HEADS[1:]
    head_dtypes = [torch.bfloat16] if cuda else [torch.float32, torch.bfloat16]
    attention_dtype = torch.bfloat16 if cuda else torch.float32
    records = (bench_heads(device, head_dtypes, heads, args.repeats) + bench_commits(device, args.repeats)
               + bench_attention(device, attention_dtype, args.repeats))
    document = {
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__, "threads": torch.get_num_threads(), "repeats": args.repeats,
        "records": records,
    }
    text = json.dumps(document, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text)
    print_table(records)
    return 0 if all(record.get("ok", True) for record in records) else 1


if __name__ == "__main__":
    raise SystemExit(main())
