"""How often the target's token is among the draft head's top k candidates, by offset (held out).

The question it answers: would checking several candidates a position (a tree of drafts, as
Medusa and EAGLE-2 verify) raise the tokens a pass enough to pay for the extra rows? The head
drafts every offset of its block in one non-causal pass, so its candidates at offset 2 do not
depend on the choice at offset 1: a tree of k_1 x k_2 x ... paths costs k_1 + k_1 k_2 + ...
rows and keeps offset j when each of the target's tokens up to j is among its offset's top k.

Teacher-forced on the held-out records of scripts/train_draft_head.py (the target's own greedy
replies), the features taken by the fused int8 pass as decoding takes them:

    .venv/bin/python scripts/head_topk.py --json runs/head-topk.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from dllm_engine.loading import load_model  # noqa: E402
from dllm_engine.loading.registry import ADAPTER_DIR, attach_draft_head  # noqa: E402
from dllm_engine.training.draft_features import FeatureStore, extract  # noqa: E402
from dllm_engine.training.draft_trainer import Batches  # noqa: E402

SETS = {"base": "eval.jsonl", "broad": "eval-broad.jsonl", "wide": "eval-wide.jsonl"}
KS = (1, 2, 3, 4, 8)
# trees worth their rows on two cores: (k at offset 1, k at offset 2, k at offset 3)
TREES = [(1, 1, 1), (2, 1, 1), (3, 1, 1), (4, 1, 0), (2, 2, 0), (3, 2, 1), (4, 2, 1), (8, 0, 0)]


def ranks_of_labels(head, batches: Batches, records: list[dict], embed, vocab_weight, rope) -> torch.Tensor:
    """[blocks, offsets]: the rank of the target's token among the head's candidates (0 = its
    draft; a large number where the token is outside the draft vocabulary or the sequence)."""
    rng = random.Random(1234)
    ranks = []
    with torch.no_grad():
        for first in range(0, len(batches.records), 8):
            chosen = batches.records[first:first + 8]
            batch = batches.make(chosen, lambda i: records[i]["prompt_ids"] + records[i]["reply_ids"], rng)
            hidden = head.forward_train(batch["features"], batch["tokens"], batch["anchors"], embed, rope)
            logits = hidden[:, :, 1:].float() @ vocab_weight.T
            labels = batch["labels"]
            label_logit = logits.gather(-1, labels.clamp(min=0).unsqueeze(-1))
            rank = (logits > label_logit).sum(-1)
            ranks.append(torch.where(labels >= 0, rank, torch.full_like(rank, 1 << 20)).flatten(0, 1))
    return torch.cat(ranks)


def tree_tokens(ranks: torch.Tensor, tree: tuple[int, ...]) -> tuple[float, int]:
    """Tokens a pass (the target's own one included) and the rows of drafts a tree checks."""
    kept = torch.ones(ranks.shape[0], dtype=torch.bool)
    tokens, rows, width = 1.0, 0, 1
    for offset, k in enumerate(tree):
        if k == 0:
            break
        width *= k
        rows += width
        kept &= ranks[:, offset] < k
        tokens += kept.float().mean().item()
    return tokens, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run-dir", type=Path, default=ROOT / "runs" / "draft-head")
    parser.add_argument("--records", type=int, default=120, help="held-out records per set")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    loaded = load_model("smollm2-135m", dtype=torch.float32)
    attach_draft_head(loaded, ADAPTER_DIR / "smollm2-135m-bd.draft-head.safetensors")
    head, spec = loaded.draft_head.float(), loaded.draft_head.spec
    embed = loaded.model.embed_tokens.detach()
    vocab = torch.tensor(loaded.draft_vocab)
    report = {"sets": {}, "trees": {}}
    all_ranks = []
    with tempfile.TemporaryDirectory() as scratch:
        for name, file in SETS.items():
            records = [json.loads(line) for line in (args.run_dir / file).read_text().splitlines()][:args.records]
            store = FeatureStore(Path(scratch) / name, spec.taps, loaded.config.hidden_size)
            extract(loaded, records, store)
            batches = Batches(store, loaded.draft_vocab, loaded.config.vocab_size, spec.block_size, 32, seed=1)
            ranks = ranks_of_labels(head, batches, records, embed, embed[vocab], loaded.model.rope)
            all_ranks.append(ranks)
            report["sets"][name] = {f"top{k}": [round((ranks[:, j] < k).float().mean().item(), 3)
                                                for j in range(ranks.shape[1])] for k in KS}
    ranks = torch.cat(all_ranks)
    report["blocks"] = int(ranks.shape[0])
    report["all"] = {f"top{k}": [round((ranks[:, j] < k).float().mean().item(), 3) for j in range(ranks.shape[1])]
                     for k in KS}
    for tree in TREES:
        tokens, rows = tree_tokens(ranks, tree)
        report["trees"]["x".join(map(str, itertools.takewhile(bool, tree)))] = {"tokens_per_pass": round(tokens, 3),
                                                                              "draft_rows": rows}
    print("candidates | " + " | ".join(f"offset {j + 1}" for j in range(ranks.shape[1])))
    for k in KS:
        print(f"top {k:<6} | " + " | ".join(f"{v:.3f}" for v in report["all"][f"top{k}"]))
    print("\ntree (k by offset) | draft rows | tokens a pass")
    for name, row in report["trees"].items():
        print(f"{name:<18} | {row['draft_rows']:>10} | {row['tokens_per_pass']:.3f}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
