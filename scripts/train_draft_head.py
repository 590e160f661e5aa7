#!/usr/bin/env python3
"""Train the default model's draft head (dllm_engine/models/draft_head.py) on this machine.

    .venv/bin/python scripts/train_draft_head.py --stage all         # every stage, resumable
    .venv/bin/python scripts/train_draft_head.py --stage features      # only the target's features

Stages:
  distill   the base model's greedy replies to voice-style turns (first turns and second turns
            over a cut-off or finished reply), made by our engine: templated turns, a broader
            draw, and the wide draw (training/prompts_wide.py: its held-out words never trained)
  features  each conversation through the target once: tapped features, final hidden states,
            greedy tokens (dllm_engine/training/draft_features.py), train and held-out
  train     time-boxed (--minutes is the run's whole budget), checkpoints in --run-dir; SIGTERM
            or Ctrl-C pauses it (the checkpoint is saved; the same command resumes it)
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
from dllm_engine.training.draft_trainer import (Batches, DraftTrainConfig, MixedBatches,  # noqa: E402
                                               TrainingPaused, evaluate, train_draft_head)
from dllm_engine.training.trainer import draft_vocabulary  # noqa: E402

NAME = "smollm2-135m-bd.draft-head"


# (name, train file, held-out file): the templated voice turns, a broader draw of turns, and the
# wide draw (many question shapes over a large vocabulary; its held-out words are unseen)
DATASETS = [("base", "train.jsonl", "eval.jsonl"), ("broad", "train-broad.jsonl", "eval-broad.jsonl"),
            ("wide", "train-wide.jsonl", "eval-wide.jsonl")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stage", choices=["all", "distill", "features", "train", "export"], default="all")
    parser.add_argument("--run-dir", type=Path, default=ROOT / "runs" / "draft-head")
    parser.add_argument("--train-prompts", type=int, default=8000)
    parser.add_argument("--second-turns", type=int, default=4000)
    parser.add_argument("--broad-prompts", type=int, default=7500, help="first turns of the broader draw")
    parser.add_argument("--broad-follow-ups", type=int, default=5000)
    parser.add_argument("--eval-prompts", type=int, default=150)
    parser.add_argument("--broad-eval-prompts", type=int, default=100)
    parser.add_argument("--wide-prompts", type=int, default=5000, help="first turns of the wide draw")
    parser.add_argument("--wide-follow-ups", type=int, default=2000)
    parser.add_argument("--wide-eval-prompts", type=int, default=120)
    parser.add_argument("--max-new-tokens", type=int, default=80)
    parser.add_argument("--wide-max-new-tokens", type=int, default=96)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--taps", type=int, default=5)
    parser.add_argument("--block-size", type=int, default=4, help="the block the head drafts (its first row is exact)")
    parser.add_argument("--minutes", type=float, default=78.0)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--anchors", type=int, default=32)
    parser.add_argument("--lr", type=float, default=6e-4)
    parser.add_argument("--eval-every", type=float, default=600.0, help="seconds between held-out measurements")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args.run_dir.mkdir(parents=True, exist_ok=True)

    if args.stage in ("all", "distill"):
        distill_data(args)
        if args.stage == "distill":
            return
    data = {name: (read(args.run_dir / train), read(args.run_dir / held)) for name, train, held in DATASETS
            if (args.run_dir / train).exists() and (args.run_dir / held).exists()}
    loaded = load_model("smollm2-135m", dtype=torch.float32)
    spec = DraftHeadSpec(taps=even_taps(loaded.config.num_layers, args.taps), layers=args.layers,
                         block_size=args.block_size)
    hidden = loaded.config.hidden_size
    stores = {name: (FeatureStore(args.run_dir / f"features-train{suffix(name)}", spec.taps, hidden),
                     FeatureStore(args.run_dir / f"features-eval{suffix(name)}", spec.taps, hidden)) for name in data}
    if args.stage in ("all", "features"):
        for name, (records, held_out) in data.items():
            extract(loaded, held_out, stores[name][1])
            extract(loaded, records, stores[name][0])
        if args.stage == "features":
            return

    all_records = [r for records, _ in data.values() for r in records]
    vocab = draft_vocabulary(all_records, loaded.config.vocab_size, loaded.config.eos_token_ids)
    head = DraftHead(loaded.config, spec)
    init_head(head, loaded)
    embed = loaded.model.embed_tokens.detach()
    vocab_weight = embed[torch.tensor(vocab)]
    config = DraftTrainConfig(batch_size=args.batch_size, anchors=args.anchors, lr=args.lr, minutes=args.minutes,
                              seed=args.seed, eval_every_s=args.eval_every)
    size = loaded.config.vocab_size
    train = MixedBatches([(Batches(stores[name][0], vocab, size, spec.block_size, args.anchors, args.seed),
                           tokens_of(records)) for name, (records, _) in data.items()], args.seed)
    held = [(name, Batches(stores[name][1], vocab, size, spec.block_size, args.anchors, args.seed + 1),
             tokens_of(held_out)) for name, (_, held_out) in data.items()]
    if args.stage == "export":
        state = torch.load(args.run_dir / "draft_head.pt", weights_only=False)
        head.load_state_dict(state["head"])
        history, evals = state["history"], state["evals"]
        if not evals or evals[-1]["step"] < state["step"]:  # trained on after its last measurement
            evaluate(head, held, embed, vocab_weight, loaded.model.rope, config, evals, state["step"],
                     state["seconds"], args.run_dir)
    else:
        try:
            history = train_draft_head(head, embed, vocab_weight, loaded.model.rope, train, held, config, args.run_dir)
        except TrainingPaused as paused:
            print(paused)
            return
        evals = json.loads((args.run_dir / "draft_evals.json").read_text())
    size_bytes = export_draft_head(head, vocab, ADAPTER_DIR / f"{NAME}.safetensors", {
        "train_records": {name: len(records) for name, (records, _) in data.items()},
        "held_out_records": {name: len(held_out) for name, (_, held_out) in data.items()},
        "steps": len(history), "train_seconds": history[-1]["elapsed"] if history else 0.0,
        "train_config": vars(config), "held_out": evals[-1] if evals else None,
        "hardware": "2 CPU cores (x86-64), no GPU",
    })
    plot_acceptance(evals, ROOT / "docs" / "draft-head-acceptance.png")
    print(f"draft head written ({size_bytes / 1e6:.1f} MB) after {len(history)} steps")


def suffix(name: str) -> str:
    return "" if name == "base" else f"-{name}"


def tokens_of(records: list[dict]):
    return lambda i: records[i]["prompt_ids"] + records[i]["reply_ids"]


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
    from dllm_engine.training.distill import distill, distill_broad
    from dllm_engine.training.prompts import broad_voice_prompts, voice_prompts
    from dllm_engine.training.prompts_wide import HELD_OUT_SEED, wide_prompts

    # train and held-out prompts come from differently seeded draws; any overlap is removed from
    # train, and the broader draw leaves out both held-out sets
    eval_prompts = voice_prompts(args.eval_prompts, seed=args.seed + 1000)
    train_prompts = [p for p in voice_prompts(args.train_prompts + len(eval_prompts), seed=args.seed)
                     if p not in set(eval_prompts)][:args.train_prompts]
    broad_eval = broad_voice_prompts(args.broad_eval_prompts, seed=args.seed + 2000, exclude=set(train_prompts))
    held = set(eval_prompts) | set(broad_eval)
    broad_train = broad_voice_prompts(args.broad_prompts, seed=args.seed + 7, exclude=held | set(train_prompts))
    engine = Engine.load("smollm2-135m", max_live_requests=64)
    try:
        distill(engine, train_prompts, args.run_dir / "train.jsonl", args.max_new_tokens,
                second_turns=args.second_turns, seed=args.seed)
        distill(engine, eval_prompts, args.run_dir / "eval.jsonl", args.max_new_tokens)
        distill_broad(engine, broad_train, args.run_dir / "train-broad.jsonl", args.max_new_tokens,
                      follow_ups=args.broad_follow_ups, seed=args.seed)
        distill_broad(engine, broad_eval, args.run_dir / "eval-broad.jsonl", args.max_new_tokens, seed=args.seed + 1)
        distill_broad(engine, wide_prompts(args.wide_eval_prompts, args.seed + HELD_OUT_SEED, "held_out"),
                      args.run_dir / "eval-wide.jsonl", args.wide_max_new_tokens, seed=args.seed + 2)
        distill_broad(engine, wide_prompts(args.wide_prompts, args.seed + 11, "train"),
                      args.run_dir / "train-wide.jsonl", args.wide_max_new_tokens,
                      follow_ups=args.wide_follow_ups, seed=args.seed + 3)
    finally:
        engine.close()


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


if __name__ == "__main__":
    main()
