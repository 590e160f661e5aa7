"""The block-diffusion objective, all blocks of a sequence in one pass.

Layout per example: the clean sequence (prompt + reply), then two noisy copies of the reply
with complementary masks (so every token is learned each step). The clean stream runs with
the base weights and causal attention, exactly as the engine writes its KV cache, and needs
no gradient; each noisy block attends to the clean tokens before it and bidirectionally to
itself, with the adapter on. With the kept token shift, noisy row j predicts block token
j+1; a block's first token is the base model's own AR prediction and is not trained.
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
    noisy: Tensor  # [B, N] tokens (mask id where masked)
    noisy_positions: Tensor  # [B, N]
    noisy_mask: Tensor  # [B, 1, N, L + N]
    targets: Tensor  # [B, N] token each noisy row predicts, IGNORE where none

    @property
    def tokens(self) -> int:
        return int(self.clean.numel() + self.noisy.numel())


def make_batch(records: list[dict], block_size: int, mask_id: int, eos_id: int, generator: torch.Generator,
               min_ratio: float = 0.15) -> Batch:
    examples = [_example(r, block_size, mask_id, eos_id, generator, min_ratio) for r in records]
    length = max(len(e["clean"]) for e in examples)
    width = max(len(e["noisy"]) for e in examples)
    count = len(examples)
    clean = torch.zeros(count, length, dtype=torch.long)
    noisy = torch.full((count, width), mask_id, dtype=torch.long)
    positions = torch.zeros(count, width, dtype=torch.long)
    targets = torch.full((count, width), IGNORE, dtype=torch.long)
    clean_mask = torch.zeros(count, 1, length, length, dtype=torch.bool)
    noisy_mask = torch.zeros(count, 1, width, length + width, dtype=torch.bool)
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    for i, e in enumerate(examples):
        n_clean, n_noisy = len(e["clean"]), len(e["noisy"])
        clean[i, :n_clean] = torch.tensor(e["clean"])
        clean_mask[i, 0] = causal
        clean_mask[i, 0, :, n_clean:] = False
        clean_mask[i, 0, n_clean:, 0] = True  # padding rows see one key, so no row is all -inf
        noisy[i, :n_noisy] = torch.tensor(e["noisy"])
        positions[i, :n_noisy] = torch.tensor(e["positions"])
        targets[i, :n_noisy] = torch.tensor(e["targets"])
        block_of = torch.tensor(e["block"])  # (copy, block) id per noisy row
        starts = torch.tensor(e["block_start"])  # first reply position of each row's block
        visible_clean = torch.arange(length).unsqueeze(0) < starts.unsqueeze(1)
        noisy_mask[i, 0, :n_noisy, :length] = visible_clean
        noisy_mask[i, 0, :n_noisy, length:length + n_noisy] = block_of.unsqueeze(1) == block_of.unsqueeze(0)
        noisy_mask[i, 0, n_noisy:, 0] = True
    return Batch(clean, clean_mask, noisy, positions, noisy_mask, targets)


def _example(record: dict, block_size: int, mask_id: int, eos_id: int, generator: torch.Generator,
             min_ratio: float) -> dict:
    prompt, reply = record["prompt_ids"], list(record["reply_ids"])
    if record.get("finished", True):
        reply.append(eos_id)
    blocks = max(1, math.ceil(len(reply) / block_size))
    padded = reply + [eos_id] * (blocks * block_size - len(reply))  # after EOS the tail is EOS
    has_target = [record.get("finished", True) or i < len(reply) for i in range(len(padded))]
    ratios = min_ratio + (1 - min_ratio) * torch.rand(blocks, generator=generator)
    first_mask = torch.rand(len(padded), generator=generator) < ratios.repeat_interleave(block_size)
    out = {"clean": prompt + reply, "noisy": [], "positions": [], "targets": [], "block": [], "block_start": []}
    start = len(prompt)
    for copy, masked in enumerate((first_mask, ~first_mask)):
        for b in range(blocks):
            for j in range(block_size):
                k = b * block_size + j
                out["noisy"].append(mask_id if masked[k] else padded[k])
                out["positions"].append(start + k)
                nxt = k + 1
                trained = j + 1 < block_size and bool(masked[nxt]) and has_target[nxt]
                out["targets"].append(padded[nxt] if trained else IGNORE)
                out["block"].append(copy * blocks + b)
                out["block_start"].append(start + b * block_size)
    return out


def loss_on(model: Transformer, batch: Batch) -> tuple[Tensor, int]:
    """Mean cross-entropy over the noisy rows that have a target; returns (loss, rows)."""
    hidden = noisy_hidden(model, batch)
    rows = batch.targets != IGNORE
    logits = model.logits(hidden[rows]).float()
    return F.cross_entropy(logits, batch.targets[rows]), int(rows.sum())


def noisy_hidden(model: Transformer, batch: Batch) -> Tensor:
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
    return model.final_norm(x)
