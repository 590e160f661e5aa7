#!/usr/bin/env python3
"""Train the default model's draft head (dllm_engine/models/draft_head.py) on this machine.

    .venv/bin/python scripts/train_draft_head.py --minutes 80          # every stage, resumable
    .venv/bin/python scripts/train_draft_head.py --stage features      # only the target's features

Stages:
  distill   the base model's greedy replies to templated voice-style turns (first turns and
            second turns over a cut-off or finished reply), made by our engine
  features  each conversation through the target once: tapped features, final hidden states,
            greedy tokens (dllm_engine/training/draft_features.py), train and held-out
  train     time-boxed (--minutes is the run's whole budget), checkpoints in --run-dir
  export    the head into dllm_engine/adapters/ (Q8_0 blocks, < 16 MB) and the acceptance
            plot into docs/
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

from dllm_engine.loading import load_model  # noqa: E402
from dllm_engine.loading.registry import ADAPTER_DIR  # noqa: E402
from dllm_engine.models.draft_head import DraftHead, DraftHeadSpec, even_taps  # noqa: E402
from dllm_engine.training.draft_export import export_draft_head, plot_acceptance  # noqa: E402
from dllm_engine.training.draft_features import FeatureStore, extract  # noqa: E402
from dllm_engine.training.draft_trainer import Batches, DraftTrainConfig, train_draft_head  # noqa: E402
from dllm_engine.training.trainer import draft_vocabulary  # noqa: E402

NAME = "smollm2-135m-bd.draft-head"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stage", choices=["all", "distill", "features", "train", "export"], default="all")
    parser.add_argument("--run-dir", type=Path, default=ROOT / "runs" / "draft-head")
    parser.add_argument("--train-prompts", type=int, default=8000)
    parser.add_argument("--second-turns", type=int, default=4000)
    parser.add_argument("--eval-prompts", type=int, default=150)
    parser.add_argument("--max-new-tokens", type=int, default=80)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--taps", type=int, default=5)
    parser.add_argument("--block-size", type=int, default=8, help="the block the head drafts (its first row is exact)")
    parser.add_argument("--minutes", type=float, default=80.0)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--anchors", type=int, default=16)
    parser.add_argument("--lr", type=float, default=6e-4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args.run_dir.mkdir(parents=True, exist_ok=True)

    if args.stage in ("all", "distill"):
        distill_data(args)
        if args.stage == "distill":
            return
    records = read(args.run_dir / "train.jsonl")
    held_out = read(args.run_dir / "eval.jsonl")
    loaded = load_model("smollm2-135m", dtype=torch.float32)
    spec = DraftHeadSpec(taps=even_taps(loaded.config.num_layers, args.taps), layers=args.layers,
                         block_size=args.block_size)
    train_store = FeatureStore(args.run_dir / "features-train", spec.taps, loaded.config.hidden_size)
    eval_store = FeatureStore(args.run_dir / "features-eval", spec.taps, loaded.config.hidden_size)
    if args.stage in ("all", "features"):
        extract(loaded, held_out, eval_store)
        extract(loaded, records, train_store)
        if args.stage == "features":
            return

    vocab = draft_vocabulary(records, loaded.config.vocab_size, loaded.config.eos_token_ids)
    head = DraftHead(loaded.config, spec)
    init_head(head, loaded)
    embed = loaded.model.embed_tokens.detach()
    vocab_weight = embed[torch.tensor(vocab)]
    config = DraftTrainConfig(batch_size=args.batch_size, anchors=args.anchors, lr=args.lr, minutes=args.minutes,
                              seed=args.seed)
    train_batches = Batches(train_store, vocab, loaded.config.vocab_size, spec.block_size, args.anchors, args.seed)
    eval_batches = Batches(eval_store, vocab, loaded.config.vocab_size, spec.block_size, args.anchors, args.seed + 1)
    tokens_of = lambda i: records[i]["prompt_ids"] + records[i]["reply_ids"]  # noqa: E731
    held_tokens_of = lambda i: held_out[i]["prompt_ids"] + held_out[i]["reply_ids"]  # noqa: E731
    if args.stage == "export":
        state = torch.load(args.run_dir / "draft_head.pt", weights_only=False)
        head.load_state_dict(state["head"])
        history, evals = state["history"], state["evals"]
    else:
        history = train_draft_head(head, embed, vocab_weight, loaded.model.rope, train_batches,
                                   (eval_batches, eval_batches.records), tokens_of, held_tokens_of, config, args.run_dir)
        evals = json.loads((args.run_dir / "draft_evals.json").read_text())
    size = export_draft_head(head, vocab, ADAPTER_DIR / f"{NAME}.safetensors", {
        "train_records": len(records), "held_out_records": len(held_out), "steps": len(history),
        "train_seconds": history[-1]["elapsed"] if history else 0.0, "train_config": vars(config),
        "held_out": evals[-1] if evals else None, "hardware": "2 CPU cores (x86-64), no GPU",
    })
    plot_acceptance(evals, ROOT / "docs" / "draft-head-acceptance.png")
    print(f"draft head written ({size / 1e6:.1f} MB) after {len(history)} steps")


def init_head(head: DraftHead, loaded) -> None:
    """Each head layer starts as a copy of the target's last layer (a layer that already reads
    the target's late features), the mask embedding as the mean token embedding."""
    target = loaded.model.layers[-1]
    with torch.no_grad():
        for layer in head.layers:
            for name, value in target.state_dict().items():
                if name in layer.state_dict():
                    layer.state_dict()[name].copy_(value)
        head.mask_embedding.copy_(loaded.model.embed_tokens.mean(0))


def distill_data(args) -> None:
    from dllm_engine.engine import Engine
    from dllm_engine.training.distill import distill
    from dllm_engine.training.prompts import voice_prompts

    # train and held-out prompts come from differently seeded draws; any overlap is removed from train
    eval_prompts = voice_prompts(args.eval_prompts, seed=args.seed + 1000)
    train_prompts = [p for p in voice_prompts(args.train_prompts + len(eval_prompts), seed=args.seed)
                     if p not in set(eval_prompts)][:args.train_prompts]
    engine = Engine.load("smollm2-135m", max_live_requests=64)
    try:
        distill(engine, train_prompts, args.run_dir / "train.jsonl", args.max_new_tokens,
                second_turns=args.second_turns, seed=args.seed)
        distill(engine, eval_prompts, args.run_dir / "eval.jsonl", args.max_new_tokens)
    finally:
        engine.close()


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


if __name__ == "__main__":
    main()
