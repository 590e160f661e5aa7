"""Model families: how each checkpoint's tensors are named and how its tokens attend.

Every family runs on the one decoder stack in transformer.py; a family only says which
switches to set and how to translate its weight names into ours.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dllm_engine.models.config import AttentionKind

# Our canonical names, per layer (the loader fuses q/k/v and gate/up afterwards).
LAYER_KEYS = ("attn_norm", "q", "k", "v", "q_bias", "k_bias", "v_bias", "o", "q_norm", "k_norm",
              "mlp_norm", "gate", "up", "down")
GLOBAL_KEYS = ("embed", "final_norm", "lm_head")

_HF_LAYER = {
    "input_layernorm.weight": "attn_norm",
    "self_attn.q_proj.weight": "q", "self_attn.k_proj.weight": "k", "self_attn.v_proj.weight": "v",
    "self_attn.q_proj.bias": "q_bias", "self_attn.k_proj.bias": "k_bias", "self_attn.v_proj.bias": "v_bias",
    "self_attn.o_proj.weight": "o",
    "self_attn.q_norm.weight": "q_norm", "self_attn.k_norm.weight": "k_norm",
    "post_attention_layernorm.weight": "mlp_norm",
    "mlp.gate_proj.weight": "gate", "mlp.up_proj.weight": "up", "mlp.down_proj.weight": "down",
}
_HF_GLOBAL = {"model.embed_tokens.weight": "embed", "model.norm.weight": "final_norm", "lm_head.weight": "lm_head"}

# LLaDA keeps OLMo's names; note ff_proj is the gate and ff_out the down projection.
_OLMO_LAYER = {
    "attn_norm.weight": "attn_norm", "q_proj.weight": "q", "k_proj.weight": "k", "v_proj.weight": "v",
    "attn_out.weight": "o", "ff_norm.weight": "mlp_norm",
    "ff_proj.weight": "gate", "up_proj.weight": "up", "ff_out.weight": "down",
}
_OLMO_GLOBAL = {"model.transformer.wte.weight": "embed", "model.transformer.ln_f.weight": "final_norm",
                "model.transformer.ff_out.weight": "lm_head"}

# llama.cpp's GGUF names.
_GGUF_LAYER = {
    "attn_norm.weight": "attn_norm", "attn_q.weight": "q", "attn_k.weight": "k", "attn_v.weight": "v",
    "attn_q.bias": "q_bias", "attn_k.bias": "k_bias", "attn_v.bias": "v_bias",
    "attn_output.weight": "o", "attn_q_norm.weight": "q_norm", "attn_k_norm.weight": "k_norm",
    "ffn_norm.weight": "mlp_norm", "ffn_gate.weight": "gate", "ffn_up.weight": "up", "ffn_down.weight": "down",
}
_GGUF_GLOBAL = {"token_embd.weight": "embed", "output_norm.weight": "final_norm", "output.weight": "lm_head"}

_LAYOUTS = {
    "hf": (re.compile(r"model\.layers\.(\d+)\.(.+)"), _HF_LAYER, _HF_GLOBAL),
    "olmo": (re.compile(r"model\.transformer\.blocks\.(\d+)\.(.+)"), _OLMO_LAYER, _OLMO_GLOBAL),
    "gguf": (re.compile(r"blk\.(\d+)\.(.+)"), _GGUF_LAYER, _GGUF_GLOBAL),
}


def canonical_name(layout: str, name: str) -> tuple[int | None, str] | None:
    """Map a checkpoint tensor name to (layer index or None, canonical key); None if unused."""
    pattern, layer_map, global_map = _LAYOUTS[layout]
    if name in global_map:
        return None, global_map[name]
    match = pattern.fullmatch(name)
    if match and match.group(2) in layer_map:
        return int(match.group(1)), layer_map[match.group(2)]
    return None


@dataclass(frozen=True)
class Family:
    name: str
    attention: AttentionKind
    logits_shift: bool
    qkv_bias: bool = False
    qk_norm: bool = False
    mask_token_id: int | None = None
    block_size: int = 1
    default_threshold: float = 0.9
    # block_causal families: True when a finished block's cache is written with attention
    # bidirectional inside the block (SDAR, Fast-dLLM v2); False when it is written causally,
    # token by token, exactly as the autoregressive base would (our adapter-made default).
    bidirectional_clean_blocks: bool = False
    # the threshold policy's pick when no position is confident enough (see ThresholdPolicy)
    commit_fallback: str = "most_confident"
    description: str = ""


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in [
        Family("llama", "causal", True, description="autoregressive LLaMA / SmolLM"),
        Family("qwen2", "causal", True, qkv_bias=True, description="autoregressive Qwen2 / Qwen2.5"),
        Family("qwen3", "causal", True, qk_norm=True, description="autoregressive Qwen3"),
        Family("sdar", "block_causal", False, qk_norm=True, mask_token_id=151669, block_size=4,
               bidirectional_clean_blocks=True, description="SDAR block diffusion (Qwen3 layout)"),
        Family("fast_dllm_v2", "block_causal", True, qkv_bias=True, mask_token_id=151665, block_size=32,
               bidirectional_clean_blocks=True, description="Fast-dLLM v2 block diffusion (Qwen2.5 layout)"),
        Family("llada", "bidirectional", False, mask_token_id=126336, block_size=32,
               description="LLaDA masked diffusion (OLMo names)"),
        Family("dream", "bidirectional", True, qkv_bias=True, mask_token_id=151666, block_size=32,
               description="Dream masked diffusion (Qwen2 layout)"),
        Family("llama_bd", "block_causal", True, block_size=16, default_threshold=0.9, commit_fallback="leftmost",
               description="LLaMA made block-diffusion by our adapter (causal cache, learned mask embedding)"),
    ]
}


def family_for_hf_config(hf: dict) -> Family:
    """Pick the family from config.json's model_type / architectures."""
    model_type = str(hf.get("model_type", "")).lower()
    architectures = " ".join(hf.get("architectures") or []).lower()
    if model_type == "llada" or "llada" in architectures:
        return FAMILIES["llada"]
    if model_type == "dream" or "dream" in architectures:
        return FAMILIES["dream"]
    if model_type == "sdar" or "sdar" in architectures:
        return FAMILIES["sdar"]
    if "fast_dllm" in model_type or "fast_dllm" in architectures or "bd_size" in hf:
        return FAMILIES["fast_dllm_v2"]
    if model_type in FAMILIES:
        return FAMILIES[model_type]
    known = "llama, qwen2, qwen3, llada, dream, sdar, fast_dllm_v2"
    raise ValueError(f"unsupported model_type {model_type!r} (architectures {architectures!r}); known: {known}")
