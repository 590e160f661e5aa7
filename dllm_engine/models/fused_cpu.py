"""The packed forward pass on the CPU kernels (kernels/cpu): the same model, one C++ call a pass.

`Transformer.forward_segments` runs a pass as ~30 torch ops a layer; on a 2-core CPU their
dispatch costs more than their arithmetic (60 ms a pass whether it carries 1 token or 16).
`FusedCpuModel` hands the whole pass to one C++ call over the same weights: the checkpoint's
own quantized blocks when it has them (llama.cpp's Q4_1 / Q8_0: a pass then streams ~96 MB
instead of 268 MB in bf16), fp32 otherwise. Activations, attention and the KV cache are fp32,
so the output equals the fp32 torch path up to summation order (tests/engine/test_fused_cpu.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dllm_engine.models.transformer import Segment, Transformer

_VISIBILITY = {"full": 0, "causal": 1, "blocks": 2}


def split_head(hidden: Tensor, draft_rows: list[int], full, draft) -> tuple[Tensor, Tensor]:
    """A greedy head over hidden's rows: `draft` on draft_rows, `full` on the rest."""
    is_draft = torch.zeros(hidden.shape[0], dtype=torch.bool)
    is_draft[draft_rows] = True
    tokens = torch.empty(hidden.shape[0], dtype=torch.long)
    confidence = torch.empty(hidden.shape[0])
    for rows, head in ((~is_draft, full), (is_draft, draft)):
        if bool(rows.any()):
            tokens[rows], confidence[rows] = head(hidden[rows].contiguous())
    return tokens, confidence


@dataclass
class PackedWeight:
    """A weight matrix as llama.cpp stores it: `data` is [rows, row_bytes] uint8 blocks of 32."""

    kind: str  # "q8_0" | "q4_1"
    data: Tensor
    rows: int
    cols: int

    def __post_init__(self) -> None:
        if self.kind not in ("q8_0", "q4_1"):
            raise ValueError(f"packed weights are q8_0 or q4_1, got {self.kind!r}")
        if self.cols % 32 or tuple(self.data.shape) != (self.rows, self.cols // 32 * self.block_bytes):
            raise ValueError(f"{self.kind} blocks of shape {tuple(self.data.shape)} do not hold a "
                             f"[{self.rows}, {self.cols}] matrix")

    @property
    def block_bytes(self) -> int:
        return 34 if self.kind == "q8_0" else 20

    @staticmethod
    def cat(parts: list["PackedWeight"]) -> "PackedWeight | None":
        """Row-wise concatenation (q|k|v, gate|up), or None when the parts differ in kind."""
        if len({p.kind for p in parts}) != 1 or len({p.cols for p in parts}) != 1:
            return None
        return PackedWeight(parts[0].kind, torch.cat([p.data for p in parts]), sum(p.rows for p in parts),
                            parts[0].cols)


class FusedCpuModel:
    """forward / greedy / logits of a Transformer, computed by kernels.cpu."""

    def __init__(self, model: Transformer, packed: dict | None = None, draft_vocab: list[int] | None = None):
        from kernels import cpu

        self.cpu = cpu
        self.config = model.config
        self.has_adapter = model.has_adapter
        self._model = cpu.extension().Model()
        self._build(model, packed or {})
        self.has_draft_head = bool(draft_vocab)
        if draft_vocab:
            self._build_draft_head(model, packed or {}, draft_vocab)
        problem = self._model.check()
        if problem:
            raise ValueError(f"the fused CPU model is inconsistent: {problem}")

    # ---- building -----------------------------------------------------------------------
    def _weight(self, name: str, layer: int, dense: Tensor, packed: PackedWeight | None) -> None:
        if packed is not None:
            kind = self.cpu.Q8_0 if packed.kind == "q8_0" else self.cpu.Q4_1
            self._model.set_weight(name, layer, packed.data.contiguous(), kind, packed.rows, packed.cols)
        else:
            weight = dense.detach().float().contiguous()
            self._model.set_weight(name, layer, weight, self.cpu.F32, weight.shape[0], weight.shape[1])

    def _vector(self, name: str, layer: int, value: Tensor) -> None:
        self._model.set_vector(name, layer, value.detach().float().contiguous())

    def _build(self, model: Transformer, packed: dict) -> None:
        c = self.config
        self._model.configure(c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size,
                              c.vocab_size, c.max_position_embeddings,
                              c.mask_token_id if c.mask_token_id is not None else -1, c.rms_norm_eps, c.num_layers)
        self._weight("embed", -1, model.embed_tokens, packed.get((None, "embed")))
        head = packed.get((None, "lm_head")) if model.lm_head is not None else packed.get((None, "embed"))
        self._weight("head", -1, model.output_weight, head)
        self._vector("final_norm", -1, model.final_norm.weight)
        self._vector("rope_cos", -1, model.rope.cos)
        self._vector("rope_sin", -1, model.rope.sin)
        if model.mask_embedding is not None:
            self._vector("mask_embedding", -1, model.mask_embedding)
        for i, layer in enumerate(model.layers):
            parts = {
                "qkv": [packed.get((i, k)) for k in ("q", "k", "v")],
                "o": [packed.get((i, "o"))],
                "gate_up": [packed.get((i, k)) for k in ("gate", "up")],
                "down": [packed.get((i, "down"))],
            }
            projections = {"qkv": layer.qkv, "o": layer.o_proj, "gate_up": layer.mlp.gate_up, "down": layer.mlp.down}
            for name, projection in projections.items():
                blocks = PackedWeight.cat(parts[name]) if all(p is not None for p in parts[name]) else None
                self._weight(name, i, projection.weight, blocks)
                if projection.lora is not None:
                    lora = projection.lora
                    self._weight(f"lora_down.{name}", i, lora.down, None)
                    self._weight(f"lora_up_scaled.{name}", i, (lora.up.detach().float() * lora.scale).t(), None)
            self._vector("attn_norm", i, layer.attn_norm.weight)
            self._vector("mlp_norm", i, layer.mlp_norm.weight)
            if layer.qkv.bias is not None:
                self._vector("qkv_bias", i, layer.qkv.bias)
            if layer.q_norm is not None:
                self._vector("q_norm", i, layer.q_norm.weight)
                self._vector("k_norm", i, layer.k_norm.weight)

    def _build_draft_head(self, model: Transformer, packed: dict, vocab: list[int]) -> None:
        ids = torch.tensor(vocab, dtype=torch.long)
        head = packed.get((None, "lm_head") if model.lm_head is not None else (None, "embed"))
        rows = PackedWeight(head.kind, head.data[ids].contiguous(), len(vocab), head.cols) if head else None
        self._weight("draft_head", -1, model.output_weight[ids], rows)
        self._model.set_draft_ids(ids)

    # ---- the pass -----------------------------------------------------------------------
    def forward(self, segments: list[Segment], rows: list[int]) -> Tensor:
        """Final-normed hidden states [len(rows), hidden] of a packed pass (its caches written)."""
        table, row0, adapter_rows = [], 0, []
        for s in segments:
            count = s.tokens.numel()
            if s.cache.k.dtype != torch.float32:
                raise ValueError(f"the fused CPU model needs fp32 KV caches, got {s.cache.k.dtype}")
            table.append((row0, count, s.start, s.attend_len, _VISIBILITY[s.visibility], s.block_size))
            if s.adapter and self.has_adapter:
                adapter_rows.extend(range(row0, row0 + count))
            row0 += count
        tokens = torch.cat([s.tokens for s in segments]).long()
        return self._model.forward(tokens, torch.tensor(adapter_rows, dtype=torch.long),
                                   torch.tensor(table, dtype=torch.long).reshape(-1, 6),
                                   [s.cache.k for s in segments], [s.cache.v for s in segments],
                                   torch.tensor(rows, dtype=torch.long))

    def greedy(self, hidden: Tensor, draft_rows: list[int] | None = None) -> tuple[Tensor, Tensor]:
        """(argmax token, its softmax probability) per row; draft_rows over the draft vocabulary."""
        if not draft_rows or not self.has_draft_head:
            return self._model.greedy(hidden.contiguous())
        return split_head(hidden, draft_rows, self._model.greedy, lambda h: self._model.greedy(h, True))

    def logits(self, hidden: Tensor) -> Tensor:
        return self._model.logits(hidden.contiguous())
