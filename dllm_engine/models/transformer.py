"""The decoder stack every family shares, with two ways to run it:

- `forward_segments`: the engine's path. Tokens of many requests are packed into one
  [N, hidden] batch so every matmul is shared; attention reads and writes each request's
  blocks of the shared KV pool (a `Segment` says where its tokens sit and what they may see),
  every request in one batched call a layer (paged_attention.py).
- `forward_dense`: a padded [batch, seq] pass with an explicit 4D mask, for training and
  for comparing against reference implementations.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from dllm_engine.models.config import ModelConfig
from dllm_engine.models.kv_pool import BlockTable
from dllm_engine.models.layers import MLP, LoRA, Projection, RMSNorm, RotaryEmbedding, apply_rotary
from dllm_engine.models.paged_attention import PagedAttention
from kernels import quantize_activations


@dataclass
class Segment:
    """A run of one request's tokens in a packed forward pass.

    The tokens sit at positions start .. start+len-1; their keys and values are written to
    the request's block table there, and they attend to positions [0, attend_len) under `visibility`:
      full    every one of those positions (a bidirectional block, a dual cache)
      causal  only positions <= their own (prefill and cache writes of AR-style models)
      blocks  causal across blocks of `block_size` counted from `start`, bidirectional inside
    `adapter` turns the model's adapter on for these tokens.
    """

    tokens: Tensor
    start: int
    cache: BlockTable
    attend_len: int
    visibility: str = "causal"
    adapter: bool = False
    block_size: int = 1

    def __post_init__(self) -> None:
        end = self.start + self.tokens.numel()
        if end > self.cache.max_len or self.attend_len > self.cache.max_len:
            raise ValueError(f"segment ends at {max(end, self.attend_len)}, past its cache of {self.cache.max_len}")
        if self.visibility not in ("full", "causal", "blocks"):
            raise ValueError(f"visibility must be full|causal|blocks, got {self.visibility!r}")
        if self.attend_len < end:
            raise ValueError(f"a segment must see its own tokens: attend_len {self.attend_len} < end {end}")


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_heads, config.num_kv_heads, config.head_dim
        q_width, kv_width = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
        self.split = (q_width, kv_width, kv_width)
        self.attn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.qkv = Projection(config.hidden_size, sum(self.split), bias=config.qkv_bias)
        self.o_proj = Projection(q_width, config.hidden_size, bias=False)
        self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps) if config.qk_norm else None
        self.mlp_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config.hidden_size, config.intermediate_size)

    def project_qkv(self, x: Tensor, cos: Tensor, sin: Tensor, gate: Tensor | None):
        q, k, v = self.qkv(self.attn_norm(x), gate).split(self.split, dim=-1)
        q = q.unflatten(-1, (self.num_heads, self.head_dim))
        k = k.unflatten(-1, (self.num_kv_heads, self.head_dim))
        v = v.unflatten(-1, (self.num_kv_heads, self.head_dim))
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin), v

    def finish(self, x: Tensor, attn_out: Tensor, gate: Tensor | None) -> Tensor:
        x = x + self.o_proj(attn_out, gate)
        return x + self.mlp(self.mlp_norm(x), gate)


class Transformer(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Parameter(torch.empty(config.vocab_size, config.hidden_size))
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_layers))
        self.final_norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = None if config.tie_embeddings else nn.Parameter(torch.empty(config.vocab_size, config.hidden_size))
        self.mask_embedding = (
            nn.Parameter(torch.zeros(config.hidden_size)) if config.learned_mask_embedding else None
        )
        self.rope = RotaryEmbedding(config.head_dim, config.rope_theta, config.max_position_embeddings)
        self.has_adapter = False
        self.int8_head = False  # the output head reads 8-bit activations (see Projection.int8_input)

    # ---- pieces -------------------------------------------------------------------------
    @property
    def output_weight(self) -> Tensor:
        return self.embed_tokens if self.lm_head is None else self.lm_head

    def embed(self, tokens: Tensor) -> Tensor:
        if self.mask_embedding is None:
            return F.embedding(tokens, self.embed_tokens)
        is_mask = tokens == self.config.mask_token_id
        x = F.embedding(tokens.masked_fill(is_mask, 0), self.embed_tokens)
        return torch.where(is_mask.unsqueeze(-1), self.mask_embedding.to(x.dtype), x)

    def logits(self, hidden: Tensor) -> Tensor:
        """Output head on already-normed hidden states (only the rows the caller needs)."""
        return F.linear(self.head_input(hidden), self.output_weight)

    def head_input(self, hidden: Tensor) -> Tensor:
        return quantize_activations(hidden) if self.int8_head else hidden

    def add_adapter(self, rank: int, alpha: float, dtype: torch.dtype | None = None) -> None:
        """Attach zero-initialised LoRA modules to every projection (the base stays frozen)."""
        for layer in self.layers:
            for proj in (layer.qkv, layer.o_proj, layer.mlp.gate_up, layer.mlp.down):
                lora = LoRA(proj.weight.shape[1], proj.weight.shape[0], rank, alpha)
                proj.lora = lora.to(dtype or proj.weight.dtype)
        self.has_adapter = True

    # ---- the engine's packed pass -------------------------------------------------------
    def forward_segments(self, segments: list[Segment], tap_layers: list[int] | None = None):
        """Run packed segments; returns final-normed hidden states [N, hidden] in order (and,
        with tap_layers, the outputs of those layers [N, len(tap_layers) * hidden])."""
        # plans are built on the host; everything the pass needs moves to the weights' device once
        device = self.embed_tokens.device
        for segment in segments:
            segment.cache.ensure(segment.attend_len)
        tokens = torch.cat([s.tokens for s in segments]).to(device, non_blocking=True)
        positions = torch.cat([torch.arange(s.start, s.start + s.tokens.numel()) for s in segments]).to(device)
        gate = None  # the packed rows the adapter acts on, as indices
        if self.has_adapter and any(s.adapter for s in segments):
            offsets = itertools.accumulate((s.tokens.numel() for s in segments), initial=0)
            gate = torch.cat([torch.arange(o, o + s.tokens.numel()) for o, s in zip(offsets, segments) if s.adapter])
            gate = gate.to(device)
        x = self.embed(tokens)
        cos, sin = self.rope.tables(positions, x.dtype)
        attention = PagedAttention(segments, device)
        tapped: dict[int, Tensor] = {}
        for index, layer in enumerate(self.layers):
            q, k, v = layer.project_qkv(x, cos, sin, gate)
            x = layer.finish(x, attention(index, q, k, v), gate)
            if tap_layers and index in tap_layers:
                tapped[index] = x
        if tap_layers:
            return self.final_norm(x), torch.cat([tapped[i] for i in tap_layers], dim=-1)
        return self.final_norm(x)

    # ---- dense pass (training, reference checks) -----------------------------------------
    def forward_dense(
        self,
        tokens: Tensor,
        attn_mask: Tensor | None,
        positions: Tensor | None = None,
        adapter_gate: Tensor | None = None,
    ) -> Tensor:
        """tokens [B, T]; attn_mask bool [B or 1, 1, T, T] (True = may attend) or None for full
        attention; returns final-normed hidden [B, T, hidden]."""
        batch, length = tokens.shape
        if positions is None:
            positions = torch.arange(length).expand(batch, length)
        x = self.embed(tokens)
        cos, sin = self.rope.tables(positions, x.dtype)
        for layer in self.layers:
            q, k, v = layer.project_qkv(x, cos, sin, adapter_gate)
            out = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=attn_mask, enable_gqa=True
            )
            x = layer.finish(x, out.transpose(1, 2).flatten(2), adapter_gate)
        return self.final_norm(x)
