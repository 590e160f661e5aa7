"""Put canonical tensors into a Transformer, checking every shape against the config."""

from __future__ import annotations

import torch
from torch import Tensor

from dllm_engine.models.config import ModelConfig
from dllm_engine.models.layers import RotaryEmbedding
from dllm_engine.models.transformer import Transformer


class CheckpointError(ValueError):
    """A checkpoint that does not match its config: names the tensor and the shapes."""


def build_model(config: ModelConfig, tensors: dict[tuple[int | None, str], Tensor], dtype: torch.dtype,
                source: str) -> Transformer:
    """tensors maps (layer or None, canonical key) -> tensor, as produced by the loaders."""
    with torch.device("meta"):
        model = Transformer(config)
    model = model.to_empty(device="cpu").to(dtype)
    model.rope = RotaryEmbedding(config.head_dim, config.rope_theta, config.max_position_embeddings)
    c = config
    q_w, kv_w = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    used: set[tuple[int | None, str]] = set()

    def take(layer: int | None, key: str, shape: tuple[int, ...]) -> Tensor:
        where = f"layer {layer} {key}" if layer is not None else key
        if (layer, key) not in tensors:
            raise CheckpointError(f"{source}: missing tensor {where} (expected shape {shape})")
        tensor = tensors[(layer, key)]
        used.add((layer, key))
        if tuple(tensor.shape) != shape:
            raise CheckpointError(f"{source}: tensor {where} has shape {tuple(tensor.shape)}, expected {shape}")
        return tensor.to(dtype)

    with torch.no_grad():
        model.embed_tokens.copy_(take(None, "embed", (c.vocab_size, c.hidden_size)))
        model.final_norm.weight.copy_(take(None, "final_norm", (c.hidden_size,)))
        if model.lm_head is not None:
            model.lm_head.copy_(take(None, "lm_head", (c.vocab_size, c.hidden_size)))
        for i, layer in enumerate(model.layers):
            layer.attn_norm.weight.copy_(take(i, "attn_norm", (c.hidden_size,)))
            layer.mlp_norm.weight.copy_(take(i, "mlp_norm", (c.hidden_size,)))
            layer.qkv.weight.copy_(torch.cat([take(i, "q", (q_w, c.hidden_size)), take(i, "k", (kv_w, c.hidden_size)),
                                              take(i, "v", (kv_w, c.hidden_size))]))
            if layer.qkv.bias is not None:
                layer.qkv.bias.copy_(torch.cat([take(i, "q_bias", (q_w,)), take(i, "k_bias", (kv_w,)),
                                                take(i, "v_bias", (kv_w,))]))
            if layer.q_norm is not None:
                layer.q_norm.weight.copy_(take(i, "q_norm", (c.head_dim,)))
                layer.k_norm.weight.copy_(take(i, "k_norm", (c.head_dim,)))
            layer.o_proj.weight.copy_(take(i, "o", (c.hidden_size, q_w)))
            layer.mlp.gate_up.weight.copy_(torch.cat([take(i, "gate", (c.intermediate_size, c.hidden_size)),
                                                      take(i, "up", (c.intermediate_size, c.hidden_size))]))
            layer.mlp.down.weight.copy_(take(i, "down", (c.hidden_size, c.intermediate_size)))
    _refuse_unused(tensors.keys() - used, config, source)
    model.requires_grad_(False)
    return model.eval()


def _refuse_unused(unused: set, config: ModelConfig, source: str) -> None:
    """Weights the model would silently drop mean config and checkpoint disagree."""
    if not unused:
        return
    names = [key if layer is None else f"layer {layer} {key}"
             for layer, key in sorted(unused, key=lambda k: (-1 if k[0] is None else k[0], k[1]))]
    raise CheckpointError(
        f"{source}: tensors the config has no place for: {', '.join(names[:8])}"
        f"{' ...' if len(names) > 8 else ''} (config: {config.num_layers} layers, qkv_bias={config.qkv_bias}, "
        f"qk_norm={config.qk_norm}, tied embeddings={config.tie_embeddings})"
    )
