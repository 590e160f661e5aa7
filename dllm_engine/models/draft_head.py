"""A block-diffusion draft head on the target's own hidden states (DFlash, arXiv 2602.06036).

The target (the AR model) speaks; the head drafts the next block in one non-causal pass:

- context: the target's hidden states after a few of its layers (`taps`), concatenated,
  projected to the model width and normed (`fc`, `hidden_norm`), for every position the
  target has verified. In every head layer they are keys and values (that layer's k/v
  projections of the same context vector): the head's KV cache holds them.
- block: [the last exact token, mask, ..., mask] at the next positions. Its rows attend to the
  whole context and to each other (no causal mask), through `layers` decoder layers; row j
  (j >= 1) predicts the token at its own position, over the draft vocabulary, with the
  target's tied embeddings as the output head. Row 0 carries the exact token's embedding.

The target then checks the block in one causal pass and keeps the longest matching prefix plus
its own next token (dllm_engine/decoding/draft_head_decoder.py), so the reply is exactly the
target's greedy reply; the head only decides how many tokens a pass yields.

The head's keys and values live in the request's KV blocks as extra layers after the target's
(pool layer num_layers + i), so a shared prompt head shares them with the target's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dllm_engine.models.config import ModelConfig
from dllm_engine.models.layers import Projection, RMSNorm, apply_rotary
from dllm_engine.models.kv_pool import BlockTable
from dllm_engine.models.transformer import DecoderLayer
from kernels.block_attention import grouped_attention


@dataclass(frozen=True)
class DraftHeadSpec:
    taps: tuple[int, ...]  # target layers whose outputs feed the context (0-based)
    layers: int = 2
    block_size: int = 8  # rows of a drafted block: the exact token and block_size - 1 drafts

    def __post_init__(self) -> None:
        if not self.taps or self.layers < 1 or self.block_size < 2:
            raise ValueError(f"a draft head needs taps, >= 1 layer and a block of >= 2: {self}")


def even_taps(target_layers: int, count: int) -> tuple[int, ...]:
    """`count` target layers spread from the second to the fourth-last (DFlash's choice)."""
    first, last = 1, target_layers - 3
    if count == 1:
        return (target_layers // 2,)
    return tuple(int(round(first + i * (last - first) / (count - 1))) for i in range(count))


class DraftHead(nn.Module):
    def __init__(self, target: ModelConfig, spec: DraftHeadSpec):
        super().__init__()
        if max(spec.taps) >= target.num_layers or min(spec.taps) < 0:
            raise ValueError(f"taps {spec.taps} are not layers of a {target.num_layers}-layer target")
        self.spec = spec
        self.config = dataclasses.replace(target, num_layers=spec.layers, qk_norm=True, qkv_bias=False)
        self.target_layers = target.num_layers
        hidden = target.hidden_size
        self.fc = Projection(len(spec.taps) * hidden, hidden, bias=False)
        self.hidden_norm = RMSNorm(hidden, target.rms_norm_eps)
        self.layers = nn.ModuleList(DecoderLayer(self.config) for _ in range(spec.layers))
        self.norm = RMSNorm(hidden, target.rms_norm_eps)
        self.mask_embedding = nn.Parameter(torch.zeros(hidden))
        with torch.no_grad():  # the decoder layers' matrices are allocated, not initialised
            for parameter in self.parameters():
                if parameter.dim() == 2:
                    nn.init.normal_(parameter, std=0.02)

    @property
    def cache_layers(self) -> int:
        """Layers the head adds to a request's KV cache."""
        return self.spec.layers

    def context(self, features: Tensor) -> Tensor:
        """Target features [..., len(taps) * hidden] -> the context vectors [..., hidden]."""
        return self.hidden_norm(self.fc(features))

    def context_kv(self, layer: DecoderLayer, context: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """One head layer's keys (normed, rotated) and values of context vectors [..., hidden]."""
        _, k, v = layer.qkv(context).split(layer.split, dim=-1)
        k = layer.k_norm(k.unflatten(-1, (layer.num_kv_heads, layer.head_dim)))
        return apply_rotary(k, cos, sin), v.unflatten(-1, (layer.num_kv_heads, layer.head_dim))

    def block_input(self, first_tokens: Tensor, embed: Tensor, block_size: int) -> Tensor:
        """[..., block_size, hidden]: each block's exact first token, then mask embeddings."""
        first = F.embedding(first_tokens, embed).unsqueeze(-2)
        masks = self.mask_embedding.to(first.dtype).expand(*first_tokens.shape, block_size - 1, first.shape[-1])
        return torch.cat([first, masks], dim=-2)

    # ---- decoding: the torch twin of the fused pass's draft steps ----------------------------
    def write_context(self, features: Tensor, start: int, cache: BlockTable, rope) -> None:
        """The head's keys and values of verified positions start.. into `cache` (the head's
        own layers of a request's blocks: BlockTable.view)."""
        context = self.context(features)
        cos, sin = rope.tables(torch.arange(start, start + features.shape[0], device=features.device), context.dtype)
        for i, layer in enumerate(self.layers):
            k, v = self.context_kv(layer, context, cos, sin)
            cache.write(i, start, k, v)

    def draft_block(self, first_token: int, start: int, cache: BlockTable, embed: Tensor, rope) -> Tensor:
        """Final-normed hidden states [block, hidden] of the block [first_token, mask, ...] at
        positions start.., over the context before start (already in `cache`)."""
        block = self.spec.block_size
        x = self.block_input(torch.tensor([first_token], device=embed.device), embed, block)[0]
        cos, sin = rope.tables(torch.arange(start, start + block, device=embed.device), x.dtype)
        for i, layer in enumerate(self.layers):
            q, k, v = layer.project_qkv(x, cos, sin, None)
            cache.write(i, start, k, v)
            keys, values = cache.read(i, start + block)
            out = grouped_attention(q, keys, values, None)
            x = layer.finish(x, out, None)
        return self.norm(x)

    # ---- training: many anchored blocks per sequence, one dense pass ----------------------
    def forward_train(self, features: Tensor, tokens: Tensor, anchors: Tensor, embed: Tensor,
                      rope) -> Tensor:
        """Final-normed hidden states [batch, anchors, block, hidden] of blocks anchored at
        `anchors` [batch, A] (positions of their exact first token) in sequences whose target
        features are `features` [batch, T, len(taps) * hidden] and tokens `tokens` [batch, T].
        A block sees the context of the positions before its anchor, and itself: each block is
        attended as its own little sequence (its context keys, then its own), not as rows of one
        big masked pass whose mask would be almost all false."""
        batch, length = tokens.shape
        block, count = self.spec.block_size, anchors.shape[1]
        blocks = batch * count
        context = self.context(features)
        positions = anchors.unsqueeze(-1) + torch.arange(block, device=anchors.device)
        x = self.block_input(tokens.gather(1, anchors), embed, block).reshape(blocks, block, -1)
        ctx_cos, ctx_sin = rope.tables(torch.arange(length, device=tokens.device), x.dtype)
        cos, sin = rope.tables(positions.reshape(blocks, block), x.dtype)
        sees_context = torch.arange(length, device=tokens.device).view(1, length) < anchors.reshape(blocks, 1)
        mask = torch.cat([sees_context, sees_context.new_ones(blocks, block)], dim=-1).view(blocks, 1, 1, -1)
        owner = torch.arange(batch, device=tokens.device).repeat_interleave(count)
        for layer in self.layers:
            ctx_k, ctx_v = self.context_kv(layer, context, ctx_cos, ctx_sin)  # [batch, T, kv heads, d]
            q, k, v = layer.project_qkv(x, cos, sin, None)  # [blocks, block, heads, d]
            keys = torch.cat([ctx_k[owner], k], dim=1).transpose(1, 2)
            values = torch.cat([ctx_v[owner], v], dim=1).transpose(1, 2)
            out = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=mask, enable_gqa=True)
            x = layer.finish(x, out.transpose(1, 2).flatten(2), None)
        return self.norm(x).reshape(batch, count, block, -1)


def draft_loss(logits: Tensor, target_logits: Tensor, labels: Tensor, offset_decay: float,
               kl_weight: float) -> tuple[Tensor, dict[str, float]]:
    """DFlash's objective over the drafted rows: cross-entropy to the target's greedy token plus
    KL to the target's distribution, both over the draft vocabulary, each offset j (1-based)
    weighted exp(-(j - 1) / offset_decay): the first drafts decide how many tokens a pass keeps.

    logits, target_logits [..., B - 1, V]; labels [..., B - 1] indices into the draft vocabulary,
    -1 where the target's token is outside it or the row is past the sequence (ignored)."""
    offsets = torch.arange(logits.shape[-2], device=logits.device, dtype=logits.dtype)
    weights = torch.exp(-offsets / offset_decay)
    valid = labels >= 0
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    ce = -log_probs.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    target = torch.log_softmax(target_logits.float(), dim=-1)
    kl = (target.exp() * (target - log_probs)).sum(-1)
    per_row = (ce + kl_weight * kl) * weights
    total = (per_row * valid).sum() / (weights * valid).sum().clamp(min=1e-6)
    with torch.no_grad():
        hits = (logits.argmax(-1) == labels) & valid
        leading = torch.cumprod(hits.long(), dim=-1).sum(-1).float()  # drafts a check would keep
        stats = {"ce": float((ce * valid).sum() / valid.sum().clamp(min=1)),
                 "first_right": float(hits[..., 0].float().mean()), "accepted": float(leading.mean())}
    return total, stats
