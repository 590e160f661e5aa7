"""`dllm generate | chat | bench | inspect`: the engine from the command line."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time

from dllm_engine.resolve import DTYPES
from dllm_engine.loading import DEFAULT_MODEL, CheckpointError, UnknownModelError
from dllm_engine.request import EngineError, GenerationParams

log = logging.getLogger("dllm")


def _add_model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"registered name, .gguf file, HF dir or hub id (default {DEFAULT_MODEL})")
    parser.add_argument("--dtype", default="auto", choices=["auto", *DTYPES],
                        help="weights and cache dtype (auto: bfloat16 where the CPU/GPU has native bf16 matmuls)")
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:N (auto: cuda when there is one)")
    parser.add_argument("--backend", default="auto", choices=["auto", "fused", "torch"],
                        help="forward pass: fused (C++ CPU kernels over the checkpoint's quantized blocks), "
                             "torch, or auto (fused on a CPU with AVX2, torch otherwise)")
    parser.add_argument("--activations", default="auto", choices=["auto", "int8", "fp32"],
                        help="int8: the fused pass's integer kernels over 8-bit activations (auto's choice on "
                             "the fused pass); fp32: dequantized weights times fp32 activations")
    parser.add_argument("--kernel", default="auto",
                        help="the integer kernel variant: auto (the best this CPU runs), avx512_vnni or avx2")
    parser.add_argument("--kv-cache", default="auto", choices=["auto", "fp16", "fp32"],
                        help="the fused pass's keys and values: fp16 (half the bytes its attention reads; auto's "
                             "choice with int8 activations) or fp32 (auto's with fp32 activations)")
    parser.add_argument("--download", action="store_true", help="allow fetching a hub id that is not cached (online only)")


def _add_decoding_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--mode", choices=["diffusion", "autoregressive"], default=None,
                        help="default: diffusion for diffusion models, autoregressive otherwise")
    parser.add_argument("--block-size", type=int, default=None)
    parser.add_argument("--threshold", type=float, default=None, help="commit confidence (the latency/quality dial)")
    parser.add_argument("--policy", choices=["threshold", "factor", "fixed_steps"], default="threshold")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--deadline", type=float, default=None, help="seconds for the whole reply")
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=None)


def _params(args, engine, raw: bool = False) -> GenerationParams:
    mode = args.mode or ("diffusion" if engine.config.is_diffusion else "autoregressive")
    return GenerationParams(max_new_tokens=args.max_new_tokens, mode=mode, block_size=args.block_size,
                            threshold=args.threshold, policy=args.policy, deadline_s=args.deadline,
                            temperature=args.temperature, seed=args.seed, raw=raw)


def _stats_line(stats) -> str:
    return (f"[{stats.new_tokens} tokens, {stats.forward_passes} forward passes, "
            f"{stats.tokens_per_forward:.2f} tokens/forward, {stats.elapsed_s:.2f}s]")


def _load_engine(args):
    from dllm_engine.engine import Engine

    return Engine.load(args.model, dtype=args.dtype, download=args.download, device=args.device, backend=args.backend,
                       activations=args.activations, kernel=args.kernel, kv_cache=args.kv_cache)


def cmd_generate(args) -> int:
    engine = _load_engine(args)
    try:
        params = _params(args, engine, raw=args.raw)
        started = time.monotonic()
        handle = engine.submit(args.prompt, params)
        final = None
        for update in handle:
            final = update
            if not args.json and not update.final:
                print(f"\r\x1b[2K{update.draft_text[-200:]}", end="", file=sys.stderr, flush=True)
        if not args.json:
            print("\r\x1b[2K", end="", file=sys.stderr)
        if final.error:
            raise EngineError(final.error)
        stats = final.stats
        if args.json:
            print(json.dumps({
                "text": final.committed_text, "token_ids": final.token_ids, "new_tokens": stats.new_tokens,
                "forward_passes": stats.forward_passes, "tokens_per_forward": round(stats.tokens_per_forward, 3),
                "elapsed_s": round(time.monotonic() - started, 4), "first_token_s": stats.first_token_s,
                "deadline_met": stats.deadline_met, "finish_reason": final.finish_reason,
                "model": engine.model_name, "mode": params.mode,
            }))
        else:
            print(final.committed_text)
            print(_stats_line(stats), file=sys.stderr)
    finally:
        engine.close()
    return 0


def cmd_chat(args) -> int:
    engine = _load_engine(args)
    params = _params(args, engine)
    history: list[dict] = []
    print(f"chatting with {engine.model_name} ({params.mode}); empty line or Ctrl-D to quit", file=sys.stderr)
    try:
        while True:
            try:
                line = input("you> ").strip()
            except EOFError:
                break
            if not line:
                break
            history.append({"role": "user", "content": line})
            handle = engine.submit(history, params)
            final = None
            try:
                for update in handle:  # each settling draft redrawn in place
                    final = update
                    print(f"\r\x1b[2Kbot> {update.draft_text}", end="", flush=True)
            except KeyboardInterrupt:
                handle.cancel()
                final = handle.result()
            print()
            reply = final.committed_text if final else ""
            history.append({"role": "assistant", "content": reply})
            if final:
                print("     " + _stats_line(final.stats), file=sys.stderr)
    finally:
        engine.close()
    return 0


def cmd_inspect(args) -> int:
    from dllm_engine.loading import load_model

    loaded = load_model(args.model_name, download=args.download)
    config = loaded.config
    info = {
        "model": loaded.name, "family": config.family, "attention": config.attention,
        "parameters": loaded.parameter_count, "dtype": str(loaded.model.embed_tokens.dtype).removeprefix("torch."),
        "vocab_size": config.vocab_size, "hidden_size": config.hidden_size, "layers": config.num_layers,
        "heads": config.num_heads, "kv_heads": config.num_kv_heads, "context": config.max_position_embeddings,
        "mask_token_id": config.mask_token_id, "block_size": config.block_size,
        "eos_token_ids": config.eos_token_ids, "logits_shift": config.logits_shift,
        "adapter": loaded.model.has_adapter,
    }
    try:
        template = loaded.tokenizer.render_chat([{"role": "user", "content": "Hello!"}])
    except ValueError as exc:
        template = f"(no chat template: {exc})"
    if args.json:
        print(json.dumps({**info, "chat_template_example": template}))
        return 0
    width = max(len(k) for k in info)
    for key, value in info.items():
        print(f"{key:<{width}}  {value}")
    print("\nchat template, one user message:\n" + template)
    return 0


def cmd_bench(args) -> int:
    from dllm_engine.bench import run_bench

    return run_bench(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dllm", description="diffusion LLM inference engine")
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    gen = sub.add_parser("generate", help="one reply to one prompt")
    _add_model_args(gen)
    _add_decoding_args(gen)
    gen.add_argument("--raw", action="store_true", help="use the prompt as is, without the chat template")
    gen.add_argument("--json", action="store_true", help="print one JSON object")
    gen.add_argument("prompt")
    gen.set_defaults(func=cmd_generate)

    chat = sub.add_parser("chat", help="interactive chat showing each settling draft")
    _add_model_args(chat)
    _add_decoding_args(chat)
    chat.set_defaults(func=cmd_chat)

    bench = sub.add_parser("bench", help="diffusion vs autoregressive on a fixed prompt set")
    _add_model_args(bench)
    bench.add_argument("--block-size", type=int, default=None)
    bench.add_argument("--threshold", type=float, default=None)
    bench.add_argument("--max-new-tokens", type=int, default=128)
    bench.add_argument("--concurrency", default="1,4,8", help="comma-separated request counts")
    bench.add_argument("--prompts", type=int, default=8, help="how many of the fixed prompts to use")
    bench.add_argument("--json", action="store_true", help="print the results as JSON too")
    bench.add_argument("--peer", choices=["llama.cpp"], default=None,
                       help="also run llama.cpp (llama-cpp-python) on the same GGUF, prompts, threads and budget")
    bench.add_argument("--peer-gguf", default=None, help="the GGUF the peer runs (default: the SmolLM2 GGUF)")
    bench.add_argument("--write-docs", default="docs/benchmarks.md", help="file whose engine table is replaced ('' to skip)")
    bench.set_defaults(func=cmd_bench)

    inspect = sub.add_parser("inspect", help="describe a model")
    inspect.add_argument("model_name", metavar="MODEL")
    inspect.add_argument("--download", action="store_true")
    inspect.add_argument("--json", action="store_true")
    inspect.set_defaults(func=cmd_inspect)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except (UnknownModelError, CheckpointError, EngineError, FileNotFoundError, ValueError) as exc:
        print(f"dllm: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
