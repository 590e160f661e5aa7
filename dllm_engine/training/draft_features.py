"""The draft head's training data: each self-distilled conversation (prompt + the target's greedy
reply) run through the target once, keeping what the head learns from:

- the outputs of the tapped layers at every position (the head's context), fp16;
- the target's final-normed hidden state at every position (its distribution over the draft
  vocabulary is recomputed from it for the KL term), fp16;
- the target's greedy next token at every position (what a verify pass checks drafts against).

Computed by the engine's own fused pass when it can run, so the features are exactly the ones
the head sees when decoding; written as memory-mapped arrays in a run directory (resumable: a
rerun skips records already done).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from dllm_engine.loading.registry import LoadedModel
from dllm_engine.models.kv_pool import BlockTable
from dllm_engine.models.transformer import Segment

log = logging.getLogger(__name__)


@dataclass
class FeatureStore:
    """Records' tokens and per-position arrays, concatenated; offsets[i]..offsets[i + 1] is record i."""

    directory: Path
    taps: tuple[int, ...]
    hidden: int

    @property
    def index_path(self) -> Path:
        return self.directory / "features.json"

    def open(self, mode: str = "r") -> tuple[dict, np.memmap, np.memmap, np.memmap]:
        index = json.loads(self.index_path.read_text())
        total = index["offsets"][-1]
        shape = (max(1, total), len(self.taps) * self.hidden)
        features = np.memmap(self.directory / "taps.f16", np.float16, mode, shape=shape)
        final = np.memmap(self.directory / "final.f16", np.float16, mode, shape=(max(1, total), self.hidden))
        greedy = np.memmap(self.directory / "greedy.i32", np.int32, mode, shape=(max(1, total),))
        return index, features, final, greedy


def extract(loaded: LoadedModel, records: list[dict], store: FeatureStore, batch_tokens: int = 512,
            activations: str = "int8") -> None:
    """Runs every record's prompt + reply through the target and stores its features."""
    from dllm_engine.models.fused_cpu import FusedCpuModel

    lengths = [len(r["prompt_ids"]) + len(r["reply_ids"]) for r in records]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).tolist()
    store.directory.mkdir(parents=True, exist_ok=True)
    done = 0
    if store.index_path.exists():
        old = json.loads(store.index_path.read_text())
        if old["offsets"] == offsets and old["taps"] == list(store.taps):
            done = old["done"]
    index = {"offsets": offsets, "taps": list(store.taps), "done": done, "prompt_lengths":
             [len(r["prompt_ids"]) for r in records]}
    store.index_path.write_text(json.dumps(index))
    _, features, final, greedy = store.open("r+" if done else "w+")
    fused = FusedCpuModel(loaded.model, loaded.packed, activations=activations)
    started, first, reported = time.monotonic(), done, done
    while done < len(records):
        batch = [done]
        while batch[-1] + 1 < len(records) and sum(lengths[i] for i in batch) + lengths[batch[-1] + 1] <= batch_tokens:
            batch.append(batch[-1] + 1)
        segments, row0 = [], 0
        for i in batch:
            tokens = torch.tensor(records[i]["prompt_ids"] + records[i]["reply_ids"])
            cache = BlockTable.standalone(loaded.config, len(tokens), torch.float32)
            segments.append(Segment(tokens, 0, cache, len(tokens)))
            row0 += len(tokens)
        rows = list(range(row0))
        with torch.inference_mode():
            hidden, taps = fused.forward_with_taps(segments, rows, list(store.taps), rows)
            tokens, _ = fused.greedy(hidden)
        a, b = offsets[batch[0]], offsets[batch[-1] + 1]
        features[a:b] = taps.numpy().astype(np.float16)
        final[a:b] = hidden.numpy().astype(np.float16)
        greedy[a:b] = tokens.numpy().astype(np.int32)
        done = batch[-1] + 1
        if done - reported >= 200 or done == len(records):
            reported = done
            features.flush(), final.flush(), greedy.flush()
            index["done"] = done
            store.index_path.write_text(json.dumps(index))
            rate = (done - first) / (time.monotonic() - started)
            print(f"features: {done}/{len(records)} records ({rate:.1f}/s)", flush=True)
