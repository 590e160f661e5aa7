"""GGUF checkpoints (llama.cpp's format): metadata, dequantised tensors, tokenizer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader
from gguf.quants import dequantize

from dllm_engine.loading.assemble import CheckpointError
from dllm_engine.loading.tokenizer import TextTokenizer
from dllm_engine.models.config import ModelConfig
from dllm_engine.models.families import FAMILIES, canonical_name
from dllm_engine.models.fused_cpu import PackedWeight

SUPPORTED_TYPES = {Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q4_K, Q.Q5_K, Q.Q6_K}
_PACKED_KINDS = {Q.Q8_0: "q8_0", Q.Q4_1: "q4_1"}  # block formats kernels/cpu reads directly
_ARCH_FAMILY = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3"}


def read_fields(reader: GGUFReader) -> dict:
    fields = {}
    for key, field in reader.fields.items():
        try:
            fields[key] = field.contents()
        except Exception as exc:  # a field type the gguf package cannot decode: skip, but say which
            raise CheckpointError(f"cannot read GGUF metadata field {key}: {exc}") from exc
    return fields


def load_gguf(path: Path) -> tuple[ModelConfig, dict, TextTokenizer, dict]:
    """Returns (config, canonical tensors, tokenizer, packed): packed holds the Q8_0 / Q4_1
    tensors also as their raw blocks, which the CPU kernels read as they are."""
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {path}")
    reader = GGUFReader(str(path))
    fields = read_fields(reader)
    arch = fields.get("general.architecture")
    if arch not in _ARCH_FAMILY:
        raise CheckpointError(f"{path.name}: unsupported GGUF architecture {arch!r}; supported: {sorted(_ARCH_FAMILY)}")
    family = FAMILIES[_ARCH_FAMILY[arch]]
    tensors, packed, raw_names = {}, {}, set()
    for tensor in reader.tensors:
        raw_names.add(tensor.name)
        key = canonical_name("gguf", tensor.name)
        if key is not None:
            tensors[key] = _dequantize(tensor, path.name)
            if Q(tensor.tensor_type) in _PACKED_KINDS:
                packed[key] = _blocks(tensor, tensors[key].shape)
    config = _config_from_fields(fields, arch, family, tied="output.weight" not in raw_names, path=path)
    if arch == "llama":  # llama.cpp permutes Q/K rows per head for its rope layout: undo it
        for (layer, key), tensor in list(tensors.items()):
            if key in ("q", "k"):
                heads = config.num_heads if key == "q" else config.num_kv_heads
                tensors[(layer, key)] = _unpermute_rows(tensor, heads)
                if (layer, key) in packed:  # rows are whole blocks: the same permutation applies
                    blocks = packed[(layer, key)]
                    blocks.data = _unpermute_rows(blocks.data, heads)
    return config, tensors, TextTokenizer.from_gguf_fields(fields), packed


def _blocks(tensor, shape: tuple[int, ...]) -> PackedWeight:
    rows, cols = (1, shape[0]) if len(shape) == 1 else shape
    data = torch.from_numpy(np.array(tensor.data, dtype=np.uint8).reshape(rows, -1))  # a copy: the file is mapped read-only
    return PackedWeight(_PACKED_KINDS[Q(tensor.tensor_type)], data, rows, cols)


def _dequantize(tensor, filename: str) -> torch.Tensor:
    qtype = Q(tensor.tensor_type)
    if qtype not in SUPPORTED_TYPES:
        names = ", ".join(sorted(t.name for t in SUPPORTED_TYPES))
        raise CheckpointError(f"{filename}: tensor {tensor.name} has unsupported quant type {qtype.name}; supported: {names}")
    values = dequantize(tensor.data, qtype)
    shape = tuple(int(d) for d in reversed(tensor.shape))  # GGUF lists the fastest-moving dim first
    return torch.from_numpy(np.array(values, dtype=np.float32).reshape(shape))


def _unpermute_rows(weight: torch.Tensor, heads: int) -> torch.Tensor:
    rows, cols = weight.shape
    # llama.cpp stored reshape(heads, 2, half, cols).swapaxes(1, 2); this is its inverse
    return weight.reshape(heads, rows // heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def _config_from_fields(fields: dict, arch: str, family, tied: bool, path: Path) -> ModelConfig:
    def need(key: str):
        full = f"{arch}.{key}"
        if full not in fields:
            raise CheckpointError(f"{path.name}: GGUF metadata lacks {full}")
        return fields[full]

    hidden, heads = int(need("embedding_length")), int(need("attention.head_count"))
    eos = fields.get("tokenizer.ggml.eos_token_id")
    vocab = fields.get(f"{arch}.vocab_size") or len(fields["tokenizer.ggml.tokens"])
    return ModelConfig(
        family=family.name, vocab_size=int(vocab), hidden_size=hidden,
        intermediate_size=int(need("feed_forward_length")), num_layers=int(need("block_count")),
        num_heads=heads, num_kv_heads=int(fields.get(f"{arch}.attention.head_count_kv", heads)),
        head_dim=int(fields.get(f"{arch}.attention.key_length", hidden // heads)),
        rope_theta=float(fields.get(f"{arch}.rope.freq_base", 10000.0)),
        rms_norm_eps=float(need("attention.layer_norm_rms_epsilon")),
        max_position_embeddings=int(fields.get(f"{arch}.context_length", 4096)),
        attention=family.attention, tie_embeddings=tied, qkv_bias=family.qkv_bias, qk_norm=family.qk_norm,
        logits_shift=family.logits_shift, bos_token_id=fields.get("tokenizer.ggml.bos_token_id"),
        eos_token_ids=[int(eos)] if eos is not None else [], pad_token_id=fields.get("tokenizer.ggml.padding_token_id"),
    )
