"""The packed forward pass on the CPU kernels (kernels/cpu): the same model, one C++ call a pass.

`Transformer.forward_segments` runs a pass as ~30 torch ops a layer; on a 2-core CPU their
dispatch costs more than their arithmetic (60 ms a pass whether it carries 1 token or 16).
`FusedCpuModel` hands the whole pass to one C++ call over the same weights: the checkpoint's
own quantized blocks when it has them (llama.cpp's Q4_1 / Q8_0: a pass then streams ~96 MB
instead of 268 MB in bf16), fp32 otherwise. With `activations="int8"` (the default) the
matmuls over quantized blocks take 8-bit activations and integer dot products (int8.h);
`"fp32"` dequantizes the blocks and multiplies in fp32. Attention is fp32, over keys and values
in fp32 or fp16 blocks of the shared pool (dllm_engine/models/kv_pool.py).
The torch pass computes the same when `mirror_int8_activations` gives it the same activation
quantization, up to summation order (tests/engine/test_fused_cpu.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dllm_engine.models.heads import split_head
from dllm_engine.models.transformer import Segment, Transformer

_VISIBILITY = {"full": 0, "causal": 1, "blocks": 2}
ACTIVATIONS = ("int8", "fp32")
# keys and values the pass reads: fp16 halves what attention streams from memory (resolve.resolve_kv_cache)
KV_CACHE_DTYPES = {"fp16": torch.float16, "fp32": torch.float32}


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


def quantized_parts(model: Transformer, packed: dict) -> tuple[list, bool]:
    """The projections the fused pass reads as quantized blocks, and whether the head is one."""
    projections = []
    for i, layer in enumerate(model.layers):
        groups = {"qkv": ("q", "k", "v"), "o": ("o",), "gate_up": ("gate", "up"), "down": ("down",)}
        modules = {"qkv": layer.qkv, "o": layer.o_proj, "gate_up": layer.mlp.gate_up, "down": layer.mlp.down}
        for name, keys in groups.items():
            parts = [packed.get((i, k)) for k in keys]
            if all(p is not None for p in parts) and PackedWeight.cat(parts) is not None:
                projections.append(modules[name])
    head = (None, "lm_head") if model.lm_head is not None else (None, "embed")
    return projections, head in packed


def mirror_int8_activations(model: Transformer, packed: dict | None, on: bool = True) -> None:
    """Makes the torch pass quantize activations exactly where the fused pass's integer matmuls
    do (the reference the fused pass is tested against)."""
    projections, head = quantized_parts(model, packed or {})
    for projection in projections:
        projection.int8_input = on
    model.int8_head = on and head


class FusedCpuModel:
    """forward / greedy / logits of a Transformer, computed by kernels.cpu.

    activations: "int8" (integer matmuls over 8-bit activations where the weights are quantized
    blocks) or "fp32". kernel: the integer kernel variant, "auto" (the best this CPU runs) or
    one of `kernels.cpu.int8_variants()`."""

    def __init__(self, model: Transformer, packed: dict | None = None, draft_vocab: list[int] | None = None,
                 activations: str = "int8", kernel: str = "auto"):
        from kernels import cpu

        if activations not in ACTIVATIONS:
            raise ValueError(f"activations must be one of {', '.join(ACTIVATIONS)}, got {activations!r}")
        self.cpu = cpu
        self.config = model.config
        self.has_adapter = model.has_adapter
        self._model = cpu.extension().Model()
        self._build(model, packed or {})
        self.has_draft_head = bool(draft_vocab)
        if draft_vocab:
            self._build_draft_head(model, packed or {}, draft_vocab)
        self._finish("the fused CPU model", activations, kernel)

    def _finish(self, what: str, activations: str, kernel: str) -> None:
        """Checks the assembled model and picks its arithmetic (repacking its blocks)."""
        problem = self._model.check()
        if problem:
            raise ValueError(f"{what} is inconsistent: {problem}")
        try:
            self._model.set_activations("fp32" if activations == "fp32" else kernel)
        except RuntimeError as exc:
            raise ValueError(str(exc)) from exc
        self.activations = activations
        self.kernel = self._model.activations()  # the variant that runs ("fp32" for fp32 activations)

    @property
    def attention_kernels(self) -> str:
        """The instruction set of attention's inner kernels (the integer kernels' own; every set
        gives the same bits)."""
        return self._model.attention_kernels()

    def use_attention_kernels(self, name: str) -> None:
        """Attention by one of `kernels.cpu.attention_kernel_sets()` (tests and benches)."""
        try:
            self._model.set_attention_kernels(name)
        except RuntimeError as exc:
            raise ValueError(str(exc)) from exc

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

        def blocks(i: int, name: str) -> PackedWeight | None:
            parts = [packed.get((i, k)) for k in {"qkv": ("q", "k", "v"), "o": ("o",), "gate_up": ("gate", "up"),
                                                  "down": ("down",)}[name]]
            return PackedWeight.cat(parts) if all(p is not None for p in parts) else None

        self._build_layers(model.layers, blocks)

    def _build_layers(self, layers, blocks) -> None:
        """Every decoder layer's weights; blocks(i, projection) gives the quantized blocks of a
        projection where there are some (None: its dense weight)."""
        for i, layer in enumerate(layers):
            projections = {"qkv": layer.qkv, "o": layer.o_proj, "gate_up": layer.mlp.gate_up, "down": layer.mlp.down}
            for name, projection in projections.items():
                self._weight(name, i, projection.weight, blocks(i, name))
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
        return self.forward_with_taps(segments, rows, [], [])[0]

    def forward_with_taps(self, segments: list[Segment], rows: list[int], tap_layers: list[int],
                          tap_rows: list[int]) -> tuple[Tensor, Tensor]:
        """forward, and the hidden states after each of `tap_layers` at `tap_rows`
        [len(tap_rows), len(tap_layers) * hidden] (a draft head's context)."""
        table, row0, adapter_rows = [], 0, []
        for s in segments:
            count = s.tokens.numel()
            if s.cache.dtype not in KV_CACHE_DTYPES.values():
                raise ValueError(f"the fused CPU model needs fp32 or fp16 KV caches, got {s.cache.dtype}")
            s.cache.ensure(s.attend_len)
            table.append((row0, count, s.start, s.attend_len, _VISIBILITY[s.visibility], s.block_size))
            if s.adapter and self.has_adapter:
                adapter_rows.extend(range(row0, row0 + count))
            row0 += count
        tokens = torch.cat([s.tokens for s in segments]).long()
        return self._model.forward(tokens, torch.tensor(adapter_rows, dtype=torch.long),
                                   torch.tensor(table, dtype=torch.long).reshape(-1, 6),
                                   *_blocks([s.cache for s in segments], 0),
                                   torch.tensor(rows, dtype=torch.long), torch.tensor(tap_layers, dtype=torch.long),
                                   torch.tensor(tap_rows, dtype=torch.long))

    def greedy(self, hidden: Tensor, draft_rows: list[int] | None = None) -> tuple[Tensor, Tensor]:
        """(argmax token, its softmax probability) per row; draft_rows over the draft vocabulary."""
        if not draft_rows or not self.has_draft_head:
            return self._model.greedy(hidden.contiguous())
        return split_head(hidden, draft_rows, self._model.greedy, lambda h: self._model.greedy(h, True))

    def logits(self, hidden: Tensor) -> Tensor:
        return self._model.logits(hidden.contiguous())


class FusedDraftHead(FusedCpuModel):
    """A draft head's two steps on kernels/cpu: `context` (verified positions' features into the
    head's layers of each request's cache) and `draft` (blocks through the head, greedy over the
    draft vocabulary). Shares the target's embedding blocks; the head's matrices are Q8_0."""

    def __init__(self, head, target: Transformer, target_packed: dict, head_blocks: dict, draft_vocab: list[int],
                 activations: str = "int8", kernel: str = "auto"):
        from kernels import cpu

        if activations not in ACTIVATIONS:
            raise ValueError(f"activations must be one of {', '.join(ACTIVATIONS)}, got {activations!r}")
        self.cpu = cpu
        self.config = head.config
        self.has_adapter = False
        self.first_layer = target.config.num_layers  # where the head's layers sit in a request's cache
        self.block_size = head.spec.block_size
        self._model = cpu.extension().Model()
        c = head.config
        self.mask_token = c.vocab_size  # a block's mask rows (the vocabulary has no mask token)
        self._model.configure(c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size,
                              c.vocab_size, c.max_position_embeddings, self.mask_token, c.rms_norm_eps, c.num_layers)
        embed_blocks = target_packed.get((None, "embed"))
        self._weight("embed", -1, target.embed_tokens, embed_blocks)
        self._weight("head", -1, target.embed_tokens, embed_blocks)
        self._vector("final_norm", -1, head.norm.weight)
        self._vector("mask_embedding", -1, head.mask_embedding)
        self._vector("rope_cos", -1, target.rope.cos)
        self._vector("rope_sin", -1, target.rope.sin)
        self._weight("context_fc", -1, head.fc.weight, head_blocks.get("fc.weight"))
        self._vector("context_norm", -1, head.hidden_norm.weight)
        names = {"qkv": "qkv.weight", "o": "o_proj.weight", "gate_up": "mlp.gate_up.weight", "down": "mlp.down.weight"}
        self._build_layers(head.layers, lambda i, name: head_blocks.get(f"layers.{i}.{names[name]}"))
        self.has_draft_head = True
        self._build_draft_head(target, target_packed, draft_vocab)
        self._finish("the fused draft head", activations, kernel)

    def write_context(self, runs: list[tuple[Tensor, int, object]]) -> None:
        """(features [n, context width], first position, request cache) per request, one pass."""
        table, row0 = [], 0
        for features, start, cache in runs:
            n = features.shape[0]
            cache.ensure(start + n)
            table.append((row0, n, start, start + n, _VISIBILITY["causal"], 1))
            row0 += n
        self._model.context(torch.cat([f for f, _, _ in runs]).float().contiguous(),
                            torch.tensor(table, dtype=torch.long).reshape(-1, 6),
                            *_blocks([cache for _, _, cache in runs], self.first_layer))

    def draft(self, blocks: list[tuple[int, int, object]]) -> list[list[int]]:
        """(exact first token, its position, request cache) per request: each block's drafts
        (block_size - 1 tokens), one pass for all of them."""
        size = self.block_size
        table, tokens, rows = [], [], []
        for index, (first, start, cache) in enumerate(blocks):
            cache.ensure(start + size)
            row0 = index * size
            table.append((row0, size, start, start + size, _VISIBILITY["full"], 1))
            tokens.extend([first] + [self.mask_token] * (size - 1))
            rows.extend(range(row0 + 1, row0 + size))
        hidden, _ = self._model.forward(torch.tensor(tokens, dtype=torch.long), torch.tensor([], dtype=torch.long),
                                        torch.tensor(table, dtype=torch.long).reshape(-1, 6),
                                        *_blocks([cache for _, _, cache in blocks], self.first_layer),
                                        torch.tensor(rows, dtype=torch.long),
                                        torch.tensor([], dtype=torch.long), torch.tensor([], dtype=torch.long))
        drafted, _ = self._model.greedy(hidden, True)
        return drafted.view(len(blocks), size - 1).tolist()


def _blocks(tables: list, layer0: int) -> tuple[list[Tensor], list[Tensor], list[Tensor], int]:
    """Each segment's keys and values as the C++ pass takes them: (block ids, key pools, value
    pools, the pool layer of the model's layer 0), from the segments' BlockTables."""
    return [t.ids() for t in tables], [t.pool.k for t in tables], [t.pool.v for t in tables], layer0
