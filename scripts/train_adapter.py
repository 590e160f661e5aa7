#!/usr/bin/env python3
"""Train smollm2-135m-bd: SmolLM2-135M-Instruct + a block-diffusion adapter, by self-distillation.

    .venv/bin/python scripts/train_adapter.py --minutes 60          # all stages, resumable
    .venv/bin/python scripts/train_adapter.py --stage distill        # only make the data

Stages: distill (the base model's greedy replies to templated voice-style prompts, made by
our engine), train (time-boxed; checkpoints in --run-dir, rerun to resume), export (the
adapter into dllm_engine/adapters/ and the loss curve into docs/).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dllm_engine.engine import Engine  # noqa: E402
from dllm_engine.resolve import resolve_dtype  # noqa: E402
from dllm_engine.loading import load_model  # noqa: E402
from dllm_engine.loading.registry import ADAPTER_DIR, load_adapter_weights, make_block_diffusion  # noqa: E402
from dllm_engine.training.distill import distill  # noqa: E402
from dllm_engine.training.prompts import voice_prompts  # noqa: E402
from dllm_engine.training.trainer import (  # noqa: E402
    DEFAULT_THRESHOLD, TrainConfig, draft_vocabulary, export_adapter, load_checkpoint, train,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stage", choices=["all", "distill", "train", "export"], default="all",
                        help="export: write the adapter from the last checkpoint without training further")
    parser.add_argument("--run-dir", type=Path, default=ROOT / "runs" / "smollm2-135m-bd")
    parser.add_argument("--train-prompts", type=int, default=6000, help="first turns")
    parser.add_argument("--second-turns", type=int, default=6000,
                        help="second turns (follow-ups, questions over a cut-off reply), built on the first ones")
    parser.add_argument("--eval-prompts", type=int, default=150)
    parser.add_argument("--max-new-tokens", type=int, default=80)
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--max-steps", type=int, default=3000)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--block-size", type=int, default=8, help="the decode block the drafter is trained for")
    parser.add_argument("--anchors", type=int, default=12, help="masked blocks per sequence per step")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--lr", type=float, default=5e-4)
    parser.add_argument("--init", type=Path, default=None,
                        help="start from this adapter (.safetensors of the same rank), e.g. the shipped one")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    args.run_dir.mkdir(parents=True, exist_ok=True)

    # Train and eval prompts come from differently seeded draws; any overlap is removed from train.
    eval_prompts = voice_prompts(args.eval_prompts, seed=args.seed + 1000)
    held_out = set(eval_prompts)
    train_prompts = [p for p in voice_prompts(args.train_prompts + len(held_out), seed=args.seed) if p not in held_out]
    train_prompts = train_prompts[:args.train_prompts]
    (args.run_dir / "eval_prompts.json").write_text(json.dumps(eval_prompts, indent=1))

    if args.stage == "export":  # the data training used is there already: read, not remade
        lines = (args.run_dir / "train.jsonl").read_text().splitlines()[:args.train_prompts + args.second_turns]
        records = [json.loads(line) for line in lines]
    else:
        engine = Engine.load("smollm2-135m", dtype="float32", max_live_requests=64)
        records = distill(engine, train_prompts, args.run_dir / "train.jsonl", args.max_new_tokens,
                          second_turns=args.second_turns, seed=args.seed)
        distill(engine, eval_prompts, args.run_dir / "eval.jsonl", args.max_new_tokens)
        engine.close()
    if args.stage == "distill":
        return

    config = TrainConfig(block_size=args.block_size, anchors=args.anchors, rank=args.rank, alpha=2.0 * args.rank,
                         batch_size=args.batch_size, lr=args.lr, max_steps=args.max_steps,
                         minutes=args.minutes, seed=args.seed)
    # fp32 base: bf16 matmuls are emulated (slow) on CPUs without avx512_bf16
    base_dtype = torch.bfloat16 if resolve_dtype("auto") == torch.bfloat16 else torch.float32
    loaded = load_model("smollm2-135m", dtype=base_dtype)
    make_block_diffusion(loaded, config.rank, config.alpha, config.block_size, DEFAULT_THRESHOLD,
                         adapter_dtype=torch.float32)
    if args.init and not (args.run_dir / "checkpoint.pt").exists():
        load_adapter_weights(loaded, args.init)
    if args.stage == "export":
        history = load_checkpoint(loaded, args.run_dir / "checkpoint.pt")
    else:
        history = train(loaded, records, config, args.run_dir)
    (args.run_dir / "history.json").write_text(json.dumps(history))
    size = export_adapter(loaded, config, ADAPTER_DIR / "smollm2-135m-bd.safetensors", {
        "train_examples": len(records), "eval_examples": len(eval_prompts), "steps": len(history),
        "train_seconds": history[-1]["elapsed"] if history else 0.0,
        "final_loss": sum(h["loss"] for h in history[-20:]) / max(1, len(history[-20:])),
        "hardware": "2 CPU cores (x86-64), no GPU",
    })
    vocab = draft_vocabulary(records, loaded.config.vocab_size, loaded.config.eos_token_ids)
    (ADAPTER_DIR / "smollm2-135m-bd.draft-vocab.json").write_text(json.dumps(vocab))
    plot_loss(history, ROOT / "docs" / "smollm2-135m-bd-loss.png")
    print(f"adapter written ({size / 1e6:.1f} MB) after {len(history)} steps")


def plot_loss(history: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [h["step"] for h in history]
    losses = [h["loss"] for h in history]
    window = 20
    smooth = [sum(losses[max(0, i - window + 1):i + 1]) / len(losses[max(0, i - window + 1):i + 1])
              for i in range(len(losses))]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, losses, alpha=0.3, label="loss per step")
    ax.plot(steps, smooth, label=f"mean of {window}")
    ax.set_xlabel("step")
    ax.set_ylabel("masked-token cross-entropy")
    ax.set_title("smollm2-135m-bd adapter training")
    ax.legend()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
