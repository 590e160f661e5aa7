"""`dllm bench`: the engine's speed, side by side in one run.

- the same fixed prompts in diffusion and autoregressive mode, alone and at several
  concurrency levels (tokens/s, tokens per pass, ms per pass, first sentence; the levels in
  interleaved rounds, each configuration keeping its best);
- with `--peer llama.cpp`, llama.cpp (llama-cpp-python, the `[peer]` extra) on the same GGUF,
  prompt tokens, threads and token budget, greedy;
- the cost of one pass by the tokens it carries, beside its floor: the bytes of weights a pass
  streams over the read bandwidth measured now, or its multiply-adds over the fp32 FMA rate
  measured now, whichever is larger.

Prints a table and JSON (`--json`), and rewrites its section of docs/benchmarks.md (the table and
that section: dllm_engine/bench_report.py).
"""

from __future__ import annotations

import contextlib
import json
import platform
import re
import statistics
import time
from pathlib import Path

import torch

from dllm_engine.bench_report import format_table, write_docs
from dllm_engine.models.kv_pool import BlockTable
from dllm_engine.models.transformer import Segment
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
PASS_SIZES = [1, 2, 4, 8, 16, 32, 64]
CONCURRENCY_ROUNDS = 3  # interleaved rounds of the concurrency levels; each keeps its best
HEAD_ONLY = "diffusion (head only)"  # the draft head's drafts without continuations of earlier text
_SENTENCE_END = re.compile(r"[.!?](\s|$)")


# ---- our engine -------------------------------------------------------------------------------
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
    return {"tokens": stats.new_tokens, "committed": stats.committed_tokens, "forward_passes": stats.forward_passes,
            "prefill_passes": stats.prefill_passes, "continued_passes": stats.continued_passes, "elapsed_s": elapsed,
            "first_sentence_s": first_sentence if first_sentence is not None else elapsed}


def concurrent(engine, prompts: list[str], params: GenerationParams, count: int) -> dict:
    before = engine.forward_passes
    started = time.monotonic()
    handles = [engine.submit(prompts[i % len(prompts)], params) for i in range(count)]
    finals = [h.result() for h in handles]
    elapsed = time.monotonic() - started
    tokens = sum(f.stats.new_tokens for f in finals)
    passes = engine.forward_passes - before
    return {"requests": count, "tokens": tokens, "elapsed_s": elapsed, "tokens_per_s": tokens / elapsed,
            "engine_forward_passes": passes, "ms_per_pass": 1000 * elapsed / max(1, passes)}


def measure(engine, mode: str, prompts: list[str], max_new_tokens: int, block_size, threshold) -> dict:
    params = GenerationParams(mode=mode, max_new_tokens=max_new_tokens, block_size=block_size, threshold=threshold)
    _one(engine, prompts[0], params)  # warm-up
    runs = [_one(engine, p, params) for p in prompts]
    tokens = sum(r["tokens"] for r in runs)
    total_time = sum(r["elapsed_s"] for r in runs)
    passes = sum(r["forward_passes"] for r in runs)
    decoding = passes - sum(r["prefill_passes"] for r in runs)
    return {
        "mode": mode, "tokens_per_s": tokens / total_time, "tokens": tokens,
        "median_tokens": statistics.median(r["tokens"] for r in runs),
        "forward_passes": passes, "tokens_per_forward": sum(r["committed"] for r in runs) / max(1, decoding),
        "continued_passes": sum(r["continued_passes"] for r in runs),
        "ms_per_pass": 1000 * total_time / max(1, passes),
        "median_first_sentence_s": statistics.median(r["first_sentence_s"] for r in runs),
        "median_full_reply_s": statistics.median(r["elapsed_s"] for r in runs),
    }


def concurrent_rounds(engine, configurations: dict[str, tuple[GenerationParams, bool]], prompts: list[str],
                      levels: list[int], rounds: int = CONCURRENCY_ROUNDS) -> dict[str, dict[int, dict]]:
    """Each configuration (its params, and whether it drafts with the head alone) at each count
    of concurrent requests, in interleaved rounds; each keeps its fastest round: on a shared
    host the neighbours' load moves a single run of a level by tens of percent."""
    best: dict[str, dict[int, dict]] = {name: {} for name in configurations}
    for _ in range(rounds):
        for count in levels:
            for name, (params, head_only) in configurations.items():
                with engine.head_drafts_only() if head_only else contextlib.nullcontext():
                    run = concurrent(engine, prompts, params, count)
                if count not in best[name] or run["tokens_per_s"] > best[name][count]["tokens_per_s"]:
                    best[name][count] = run
    return best


# ---- the peer ----------------------------------------------------------------------------------
def measure_llama_cpp(engine, gguf_path: Path, prompts: list[str], max_new_tokens: int, threads: int) -> dict:
    """llama.cpp on the same GGUF: the same prompt token ids, greedy, the same token budget."""
    try:
        from llama_cpp import Llama
    except ImportError as exc:
        raise SystemExit("--peer llama.cpp needs llama-cpp-python: pip install -e '.[peer]' (see docs/benchmarks.md "
                         "for the build flags this CPU needs)") from exc
    llm = Llama(model_path=str(gguf_path), n_threads=threads, n_threads_batch=threads, n_ctx=2048, verbose=False)
    stop = set(engine.config.eos_token_ids)

    def one(prompt: str) -> dict:
        ids = engine.prompt_ids(prompt, raw=False)
        llm.reset()
        started, first_sentence, out = time.monotonic(), None, []
        for token in llm.generate(ids, top_k=1, temp=0.0, repeat_penalty=1.0, reset=True):
            if token in stop or len(out) == max_new_tokens:
                break
            out.append(token)
            if first_sentence is None and _SENTENCE_END.search(engine.tokenizer.decode(out)):
                first_sentence = time.monotonic() - started
        elapsed = time.monotonic() - started
        return {"tokens": len(out), "elapsed_s": elapsed, "first_sentence_s": first_sentence or elapsed,
                "token_ids": out}

    one(prompts[0])  # warm-up
    runs = [one(p) for p in prompts]
    tokens = sum(r["tokens"] for r in runs)
    return {"tokens_per_s": tokens / sum(r["elapsed_s"] for r in runs), "tokens": tokens,
            "median_first_sentence_s": statistics.median(r["first_sentence_s"] for r in runs),
            "median_full_reply_s": statistics.median(r["elapsed_s"] for r in runs),
            "token_ids": [r["token_ids"] for r in runs]}


# ---- one pass by its size, and its floor ---------------------------------------------------------
def read_bandwidth_gbs() -> float:
    """Bytes per second that summing a 512 MB array reads (the page cache and L3 are far smaller)."""
    data = torch.ones(128 * 1024 * 1024)
    data.sum()
    times = []
    for _ in range(5):
        started = time.perf_counter()
        data.sum()
        times.append(time.perf_counter() - started)
    return data.numel() * 4 / min(times) / 1e9


def int8_rate_gmacs(kernel: str = "auto") -> float:
    """Multiply-adds per second of the integer kernel on a weight that stays in the caches
    (64 rows of a 1536 x 576 Q4_1 matrix): the compute side of the fused pass's floor."""
    from kernels import cpu

    ext = cpu.extension()
    rows, cols, m = 1536, 576, 64
    weight = torch.randint(0, 255, (rows, cols // 32 * 20), dtype=torch.uint8)
    weight.view(rows, cols // 32, 20)[:, :, :4] = torch.tensor([0, 60, 0, 0], dtype=torch.uint8)  # finite fp16 scales
    x = torch.randn(m, cols)
    ext.linear_int8(x, weight, cpu.Q4_1, rows, cols, kernel, 5)
    repeats = 200
    started = time.perf_counter()
    ext.linear_int8(x, weight, cpu.Q4_1, rows, cols, kernel, repeats)
    return repeats * m * rows * cols / (time.perf_counter() - started) / 1e9


def cpu_flags() -> list[str]:
    """The instruction sets the kernels care about, as /proc/cpuinfo names them."""
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return []
    wanted = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni", "avx512_bf16",
              "amx_int8", "amx_bf16")
    return [flag for flag in wanted if flag in flags]


def fma_rate_gmacs() -> float:
    """fp32 multiply-adds per second of a large matmul (MKL/oneDNN: the machine's practical peak)."""
    a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
    a @ b
    started = time.perf_counter()
    for _ in range(10):
        a @ b
    return 10 * 1024**3 / (time.perf_counter() - started) / 1e9


def pass_costs(engine, sizes=PASS_SIZES, context: int = 200, repeats: int = 10, rounds: int = 4) -> list[dict]:
    """Median ms of one pass of a request with `context` cached tokens carrying n tokens (a
    verify pass: n causal rows; with a LoRA drafter: one cache-write row and n - 1 drafted rows
    with the adapter on), and the head on every row. The sizes are timed in interleaved rounds
    and each keeps its best round (with its phases): on a shared host one timing per size
    measured the neighbours' load as much as the pass."""
    config = engine.config
    context = max(1, min(context, config.max_position_embeddings - max(sizes) - 1))  # a small model's context
    cache = filled_cache(engine, context, max(sizes) + 1)
    mask = config.mask_token_id if config.mask_token_id is not None else 0
    best: dict[int, dict] = {}
    for _ in range(rounds):
        for n in sizes:
            timed = time_pass(engine, _pass_segments(engine, cache, context, mask, n), repeats)
            if n not in best or timed["ms"] < best[n]["ms"]:
                best[n] = {"tokens": n, **timed}
    return [best[n] for n in sizes]


def _pass_segments(engine, cache, context: int, mask: int, n: int) -> list[Segment]:
    if engine.model.has_adapter:  # a LoRA drafter's step: the cache write, then the masked block
        segments = [Segment(torch.tensor([42]), context, cache, context + 1)]
        if n > 1:
            segments.append(Segment(torch.full((n - 1,), mask), context + 1, cache, context + n, "full",
                                    adapter=True))
        return segments
    return [Segment(torch.arange(n) + 42, context, cache, context + n)]  # a verify pass: causal


def filled_cache(engine, context: int, spare: int) -> BlockTable:
    """A cache holding `context` tokens of filler (written by one pass), with room for `spare` more."""
    config = engine.config
    cache = BlockTable.standalone(config, context + spare, engine.cache_dtype, engine.device)
    filler = (torch.arange(context) % 1000 + 100) % config.vocab_size
    with torch.inference_mode():
        engine._runner.pass_.forward([Segment(filler, 0, cache, context)], [context - 1])
    return cache


def time_pass(engine, segments: list[Segment], repeats: int, head: bool = True) -> dict:
    """Median ms of a pass over `segments` (every row out; the greedy head on them unless not
    `head`), after two warm-up passes, and its phases' mean ms (the fused pass's timers)."""
    pass_ = engine._runner.pass_
    rows = list(range(sum(s.tokens.numel() for s in segments)))
    times = []
    profiler = _PhaseProfile(engine)
    for i in range(repeats + 2):
        profiler.on(i == 2)  # the warm-up passes are not counted
        started = time.perf_counter()
        with torch.inference_mode():
            hidden = pass_.forward(segments, rows)
            if head:
                pass_.greedy(hidden)
        times.append(time.perf_counter() - started)
    return {"ms": 1000 * statistics.median(times[2:]), "phases_ms": profiler.read()}


class _PhaseProfile:
    """The fused pass's own phase timers (kernels/cpu/csrc/profile.h): mean ms per pass of each
    phase of the passes timed; empty for the torch pass, which has none."""

    def __init__(self, engine):
        self._ext = None
        if engine.backend == "fused":
            from kernels.cpu import extension

            self._ext = extension()

    def on(self, reset: bool) -> None:
        if self._ext is not None and reset:
            self._ext.profile_enable(True)

    def read(self) -> dict[str, float]:
        if self._ext is None:
            return {}
        totals = dict(self._ext.profile_read())
        self._ext.profile_enable(False)
        passes = max(1, totals.pop("passes"))
        return {phase: round(1000 * seconds / passes, 3) for phase, seconds in totals.items()}


def _streamed(engine) -> list[tuple[int, int]]:
    """(elements, bytes) of every matrix one pass streams: the projections and the output head,
    as the pass reads them (the fused pass: the checkpoint's blocks where it has them)."""
    model = engine.model
    packed = engine.loaded.packed if engine.backend == "fused" else {}
    size = 4 if engine.backend == "fused" else model.output_weight.element_size()
    matrices = []
    for i, layer in enumerate(model.layers):
        for keys, projection in ((("q", "k", "v"), layer.qkv), (("o",), layer.o_proj),
                                 (("gate", "up"), layer.mlp.gate_up), (("down",), layer.mlp.down)):
            blocks = [packed.get((i, k)) for k in keys]
            elements = projection.weight.numel()
            stored = sum(b.data.numel() for b in blocks) if all(blocks) else elements * size
            matrices.append((elements, stored))
    head = packed.get((None, "lm_head") if model.lm_head is not None else (None, "embed"))
    elements = model.output_weight.numel()
    matrices.append((elements, head.data.numel() if head is not None else elements * size))
    return matrices


def floors(engine, costs: list[dict], bandwidth: float, macs: float) -> list[dict]:
    """Each pass size's floor: the bytes it streams over the read bandwidth, or its
    multiply-adds over the rate of the arithmetic it runs (`macs`, G/s), whichever is larger."""
    matrices = _streamed(engine)
    stream_ms = 1000 * sum(b for _, b in matrices) / (bandwidth * 1e9)
    macs_per_row = sum(e for e, _ in matrices)
    for row in costs:
        compute_ms = 1000 * row["tokens"] * macs_per_row / (macs * 1e9)
        row["floor_ms"] = max(stream_ms, compute_ms)
        row["floor_bound"] = "bandwidth" if stream_ms >= compute_ms else "compute"
        row["vs_floor"] = row["ms"] / row["floor_ms"]
    return costs


# ---- the command -----------------------------------------------------------------------------
def run_bench(args) -> int:
    from dllm_engine.engine import Engine
    from dllm_engine.loading.registry import smollm2_gguf_path

    # no prefix cache and no recent replies to draft from: every run repeats the same prompts,
    # and a copied prompt (or reply) would time the copy instead of what a new conversation pays
    engine = Engine.load(args.model, dtype=args.dtype, download=args.download, device=args.device,
                         backend=args.backend, share_prefixes=False, recent_replies=0, activations=args.activations,
                         kernel=args.kernel, kv_cache=args.kv_cache)
    prompts = BENCH_PROMPTS[: max(1, args.prompts)]
    levels = [int(c) for c in str(args.concurrency).split(",") if c.strip()]
    modes = ["diffusion", "autoregressive"] if engine.config.is_diffusion else ["autoregressive"]
    threads = torch.get_num_threads()
    try:
        # a draft head's block, as the server chooses it: by the measured cost of each block
        blocks = engine.choose_block() if args.block_size is None else None
        results = {m: measure(engine, m, prompts, args.max_new_tokens, args.block_size, args.threshold)
                   for m in modes}
        configurations = {m: (GenerationParams(mode=m, max_new_tokens=args.max_new_tokens, block_size=args.block_size,
                                               threshold=args.threshold), False) for m in modes}
        if engine.draft_chooser is not None:  # the same head without continuation drafts, beside it
            with engine.head_drafts_only():
                results[HEAD_ONLY] = measure(engine, "diffusion", prompts, args.max_new_tokens, args.block_size,
                                             args.threshold)
            configurations[HEAD_ONLY] = (configurations["diffusion"][0], True)
        for name, levels_run in concurrent_rounds(engine, configurations, prompts, levels).items():
            results[name]["concurrency"] = levels_run
        costs = bandwidth = fma = int8 = None
        if engine.device.type == "cpu":
            bandwidth, fma = read_bandwidth_gbs(), fma_rate_gmacs()
            if engine.backend == "fused":
                from kernels.cpu import extension

                bandwidth = extension().read_bandwidth(256, 5)  # with the pass's own threads
                if engine.activations == "int8":
                    int8 = int8_rate_gmacs(engine.kernel)
            costs = floors(engine, pass_costs(engine), bandwidth, int8 or fma)
        peer = None
        if args.peer == "llama.cpp":
            peer = measure_llama_cpp(engine, Path(args.peer_gguf) if args.peer_gguf else smollm2_gguf_path(),
                                     prompts, args.max_new_tokens, threads)
    finally:
        engine.close()
    report = {
        "model": engine.model_name, "backend": engine.backend, "kernel": engine.kernel,
        "activations": engine.activations, "cpu_flags": cpu_flags(),
        "dtype": str(engine.cache_dtype).removeprefix("torch."), "threads": threads,
        "machine": (f"{platform.machine()}, {threads} threads" if engine.device.type == "cpu"
                    else torch.cuda.get_device_name(engine.device)), "max_new_tokens": args.max_new_tokens,
        "block_size": args.block_size or engine.config.block_size,
        "threshold": args.threshold if args.threshold is not None else "exact",
        "prompts": len(prompts), "results": results, "pass_costs": costs,
        "read_bandwidth_gbs": bandwidth if costs else None, "fma_gmacs": fma if costs else None,
        "int8_gmacs": int8, "draft_blocks": blocks,
    }
    if costs:
        # rows that ride free while the weights stream: multiply-adds a second times the bytes
        # a weight takes, over the bytes a second the memory reads
        matrices = _streamed(engine)
        bytes_per_weight = sum(b for _, b in matrices) / sum(e for e, _ in matrices)
        report["free_rows_estimate"] = (int8 or fma) * bytes_per_weight / bandwidth
    if "diffusion" in results:
        report["diffusion_vs_ar_speed"] = results["diffusion"]["tokens_per_s"] / results["autoregressive"]["tokens_per_s"]
        report["diffusion_vs_ar_pass"] = results["diffusion"]["ms_per_pass"] / results["autoregressive"]["ms_per_pass"]
    if HEAD_ONLY in results:
        report["head_only_vs_ar_speed"] = results[HEAD_ONLY]["tokens_per_s"] / results["autoregressive"]["tokens_per_s"]
    if peer is not None:
        ar = results["autoregressive"]
        report["llama_cpp"] = {k: v for k, v in peer.items() if k != "token_ids"}
        report["ar_vs_llamacpp_speed"] = ar["tokens_per_s"] / peer["tokens_per_s"]
        best = max(results.values(), key=lambda r: r["tokens_per_s"])
        report["best_vs_llamacpp_speed"] = best["tokens_per_s"] / peer["tokens_per_s"]
    table = format_table(report)
    print(table)
    if args.json:
        print(json.dumps(report, indent=2))
    if args.write_docs:
        write_docs(Path(args.write_docs), table, report, args)
    return 0
