#!/usr/bin/env python3
"""Build the reply corpus the default model drafts continuations from
(dllm_engine/decoding/suffix_drafts.py): the target's own greedy replies to the draft head's
training turns, each after the last `--prompt-tail` tokens of its prompt (the question a reply
echoes, the chat template's assistant header), with the suffix array that searches it.

    .venv/bin/python scripts/train_draft_head.py --stage distill   # the replies (runs/draft-head)
    .venv/bin/python scripts/build_reply_corpus.py

Only training turns go in: the held-out turns that scripts/eval_model.py measures stay out.
The calibration (how often a drafted token is kept, by source, match length, share and count)
is measured on every `--tune-every`-th training conversation against a corpus of the others,
drafting at each position of its reply as the decoder would; the shipped corpus then holds all.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dllm_engine.decoding.suffix_drafts import Calibration, DraftChooser, ReplyCorpus  # noqa: E402
from dllm_engine.loading.registry import ADAPTER_DIR  # noqa: E402

TRAIN_FILES = ["train.jsonl", "train-broad.jsonl", "train-wide.jsonl"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", type=Path, default=ROOT / "runs" / "draft-head")
    parser.add_argument("--prompt-tail", type=int, default=24)
    parser.add_argument("--tune-every", type=int, default=10)
    parser.add_argument("--tune-records", type=int, default=1500, help="tune conversations the calibration drafts on")
    parser.add_argument("--out", type=Path, default=ADAPTER_DIR / "smollm2-135m.replies.npz")
    args = parser.parse_args()
    records = []
    for name in TRAIN_FILES:
        path = args.run_dir / name
        if not path.exists():
            sys.exit(f"{path} is missing: run scripts/train_draft_head.py --stage distill first")
        records += [json.loads(line) for line in path.read_text().splitlines()]
    started = time.monotonic()
    written = [r["prompt_ids"][-args.prompt_tail:] + r["reply_ids"] for r in records]
    tune = records[::args.tune_every][:args.tune_records]
    calibration = calibrate(ReplyCorpus.build([w for i, w in enumerate(written) if i % args.tune_every]), tune)
    corpus = ReplyCorpus.build(written)
    corpus.calibration = calibration
    corpus.save(args.out)
    print(f"{len(records)} conversations, {len(corpus)} tokens, calibrated on {len(tune)} "
          f"({int(calibration.trials.sum())} drafted tokens) in {time.monotonic() - started:.1f} s: "
          f"{args.out} ({args.out.stat().st_size / 1e6:.1f} MB)")


def calibrate(corpus: ReplyCorpus, records: list[dict]) -> Calibration:
    """Every walk the decoder could draft at each reply position of `records`, counted
    against the target's reply."""
    chooser = DraftChooser(corpus, head_kept=[])
    for record in records:
        prompt, reply = record["prompt_ids"], record["reply_ids"]
        for i in range(1, len(reply) - 1):
            for source, order, steps in chooser.walks(prompt + reply[:i]):
                corpus.calibration.record(source, order, steps, reply[i:])
    return corpus.calibration


if __name__ == "__main__":
    main()
