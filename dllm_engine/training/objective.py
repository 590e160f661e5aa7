"""The drafter's objective: the shape the engine decodes, at many anchors of a sequence at once.

At decode time the block the adapter drafts is fully masked and starts at the first open
position a: every token before a is exact (written to the cache with the base weights), and
block row j, whose input is a mask, predicts token a + j + 1 (the AR token shift kept; the
token at a itself comes exactly from the cache write's last row). A draft is worth something
only if it equals the base model's greedy token, and the first few offsets are the ones the
cache write checks, so:

- every example is laid out as its clean sequence (prompt + reply), which runs causally with
  the base weights and no gradient (it is what the cache holds), followed by one fully masked
  block per anchor: a few reply positions drawn at random, each block attending to the clean
  tokens before its anchor and bidirectionally to itself (DFlash's many anchors in one pass;
  TiDAR's clean prefix + masked block);
- the loss is cross-entropy on the greedy token at each offset plus a KL term to the base
  model's own distribution there (the clean stream's logits: self-distillation), weighted
  exp(-j / gamma) by offset, so early offsets, which the engine checks, count most.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from dllm_engine.models.transformer import Transformer

IGNORE = -100


@dataclass
class Batch:
    clean: Tensor  # [B, L] tokens, right-padded
    clean_mask: Tensor  # [B, 1, L, L] causal + padding
    noisy: Tensor  # [B, N] mask tokens: one block per anchor
    noisy_positions: Tensor  # [B, N]
    noisy_mask: Tensor  # [B, 1, N, L + N]
    targets: Tensor  # [B, N] the greedy token each noisy row should draft, IGNORE where none
    weights: Tensor  # [B, N] the row's weight in the loss (0 where no target)
    teacher_rows: Tensor  # [B, N] clean row whose logits predict the same token (-1: none)

    @property
    def tokens(self) -> int:
        return int(self.clean.numel() + self.noisy.numel())


def make_batch(records: list[dict], block_size: int, anchors: int, mask_id: int, eos_id: int,
               generator: torch.Generator, gamma: float = 4.0) -> Batch:
    examples = [_example(r, block_size, anchors, eos_id, generator, gamma) for r in records]
    length = max(len(e["clean"]) for e in examples)
    width = max(len(e["positions"]) for e in examples)
    count = len(examples)
    clean = torch.zeros(count, length, dtype=torch.long)
    positions = torch.zeros(count, width, dtype=torch.long)
    targets = torch.full((count, width), IGNORE, dtype=torch.long)
    weights = torch.zeros(count, width)
    teacher_rows = torch.full((count, width), -1, dtype=torch.long)
    clean_mask = torch.zeros(count, 1, length, length, dtype=torch.bool)
    noisy_mask = torch.zeros(count, 1, width, length + width, dtype=torch.bool)
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    for i, e in enumerate(examples):
        n_clean, n_noisy = len(e["clean"]), len(e["positions"])
        clean[i, :n_clean] = torch.tensor(e["clean"])
        clean_mask[i, 0] = causal
        clean_mask[i, 0, :, n_clean:] = False
        clean_mask[i, 0, n_clean:, 0] = True  # padding rows see one key, so no row is all -inf
        positions[i, :n_noisy] = torch.tensor(e["positions"])
        targets[i, :n_noisy] = torch.tensor(e["targets"])
        weights[i, :n_noisy] = torch.tensor(e["weights"])
        teacher_rows[i, :n_noisy] = torch.tensor(e["teacher_rows"])
        block_of = torch.tensor(e["block"])
        anchor_of = torch.tensor(e["anchor"])  # the block's first position: it sees the clean tokens before
        noisy_mask[i, 0, :n_noisy, :length] = torch.arange(length).unsqueeze(0) < anchor_of.unsqueeze(1)
        noisy_mask[i, 0, :n_noisy, length:length + n_noisy] = block_of.unsqueeze(1) == block_of.unsqueeze(0)
        noisy_mask[i, 0, n_noisy:, 0] = True
    noisy = torch.full((count, width), mask_id, dtype=torch.long)
    return Batch(clean, clean_mask, noisy, positions, noisy_mask, targets, weights, teacher_rows)


def _example(record: dict, block_size: int, anchors: int, eos_id: int, generator: torch.Generator,
             gamma: float) -> dict:
    prompt, reply = record["prompt_ids"], list(record["reply_ids"])
    finished = record.get("finished", True)
    if finished:
        reply.append(eos_id)
    sequence = prompt + reply
    start = len(prompt)
    # anchors: first open positions of a block, anywhere in the reply (a = start: nothing drafted
    # yet) but EOS, after which nothing is drafted
    candidates = torch.arange(start, len(sequence) - 1 if finished else len(sequence))
    chosen = candidates[torch.randperm(len(candidates), generator=generator)[:anchors]].sort().values.tolist()
    out = {"clean": sequence, "positions": [], "targets": [], "weights": [], "teacher_rows": [], "block": [],
           "anchor": []}
    for block, anchor in enumerate(chosen):
        for j in range(block_size):
            target_at = anchor + j + 1
            out["positions"].append(anchor + j)
            out["block"].append(block)
            out["anchor"].append(anchor)
            if j == block_size - 1 or target_at >= len(sequence):
                target, teacher = IGNORE, -1  # the last row drafts past the block; nothing follows the end
            else:
                target, teacher = sequence[target_at], target_at - 1
            out["targets"].append(target)
            out["weights"].append(math.exp(-j / gamma) if target != IGNORE else 0.0)
            out["teacher_rows"].append(teacher)
    return out


def loss_on(model: Transformer, batch: Batch, distill_weight: float = 0.5) -> tuple[Tensor, dict]:
    """Weighted CE on the greedy tokens + distill_weight * KL(base || drafter); returns the loss
    and figures for the progress bar (rows, top-1 agreement with the greedy token)."""
    hidden, clean_hidden = noisy_hidden(model, batch)
    rows = batch.targets != IGNORE
    logits = model.logits(hidden[rows]).float()
    weights = batch.weights[rows]
    ce = F.cross_entropy(logits, batch.targets[rows], reduction="none")
    loss = (ce * weights).sum() / weights.sum()
    taught = batch.teacher_rows[rows] >= 0
    if distill_weight > 0 and bool(taught.any()):
        example = rows.nonzero()[:, 0][taught]
        with torch.no_grad():
            teacher = model.logits(clean_hidden[example, batch.teacher_rows[rows][taught]]).float()
        kl = F.kl_div(F.log_softmax(logits[taught], -1), F.log_softmax(teacher, -1), log_target=True,
                      reduction="none").sum(-1)
        loss = loss + distill_weight * (kl * weights[taught]).sum() / weights[taught].sum()
    with torch.no_grad():
        hits = logits.argmax(-1) == batch.targets[rows]
        first = (batch.weights[rows] == 1.0)  # offset 0: the first draft the cache write checks
    return loss, {"rows": int(rows.sum()), "top1": float(hits.float().mean()),
                  "top1_first": float(hits[first].float().mean()) if bool(first.any()) else 0.0}


def noisy_hidden(model: Transformer, batch: Batch) -> tuple[Tensor, Tensor]:
    """(noisy rows' final hidden states, the clean stream's) for a batch."""
    clean_positions = torch.arange(batch.clean.shape[1]).expand_as(batch.clean)
    with torch.no_grad():
        clean_x = model.embed(batch.clean)
        clean_cos, clean_sin = model.rope.tables(clean_positions, clean_x.dtype)
    x = model.embed(batch.noisy)
    cos, sin = model.rope.tables(batch.noisy_positions, x.dtype)
    gate = torch.ones(batch.noisy.shape, dtype=torch.bool)
    for layer in model.layers:
        with torch.no_grad():
            cq, ck, cv = layer.project_qkv(clean_x, clean_cos, clean_sin, None)
            ck, cv = ck.transpose(1, 2), cv.transpose(1, 2)
            attn = F.scaled_dot_product_attention(cq.transpose(1, 2), ck, cv, attn_mask=batch.clean_mask, enable_gqa=True)
            clean_x = layer.finish(clean_x, attn.transpose(1, 2).flatten(2), None)
        q, k, v = layer.project_qkv(x, cos, sin, gate)
        keys = torch.cat([ck, k.transpose(1, 2)], dim=2)
        values = torch.cat([cv, v.transpose(1, 2)], dim=2)
        attn = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=batch.noisy_mask, enable_gqa=True)
        x = layer.finish(x, attn.transpose(1, 2).flatten(2), gate)
    with torch.no_grad():
        clean_hidden = model.final_norm(clean_x)
    return model.final_norm(x), clean_hidden
