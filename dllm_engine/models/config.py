"""ModelConfig: every shape and switch the decoder stack needs, read from a checkpoint."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

# How tokens attend:
#   causal       plain autoregressive
#   block_causal causal across blocks, bidirectional inside the block being denoised
#   bidirectional every position sees every position (LLaDA, Dream)
AttentionKind = Literal["causal", "block_causal", "bidirectional"]


@dataclass
class ModelConfig:
    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int
    attention: AttentionKind = "causal"
    tie_embeddings: bool = False
    qkv_bias: bool = False
    qk_norm: bool = False
    # logits at position i predict token i+1 (AR models, Dream, Fast-dLLM v2, our default)
    logits_shift: bool = True
    mask_token_id: int | None = None
    # True when the mask token has no row in the vocabulary: a learned embedding stands in
    learned_mask_embedding: bool = False
    block_size: int = 1
    default_threshold: float = 0.9
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    pad_token_id: int | None = None

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers",
                     "num_heads", "num_kv_heads", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"config field {name} must be a positive integer, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})"
            )

    @property
    def is_diffusion(self) -> bool:
        return self.mask_token_id is not None

    @classmethod
    def from_hf(cls, hf: dict, family: str, **overrides) -> "ModelConfig":
        """Build from a Hugging Face config.json dict; every shape comes from the file."""

        def need(*keys):
            for key in keys:
                if key in hf:
                    return hf[key]
            raise ValueError(f"config.json lacks {' / '.join(keys)}")

        hidden = need("hidden_size", "d_model")
        heads = need("num_attention_heads", "n_heads")
        kv_heads = hf.get("num_key_value_heads") or hf.get("n_kv_heads") or heads
        head_dim = hf.get("head_dim") or hidden // heads
        intermediate = need("intermediate_size", "mlp_hidden_size")
        if family == "llada" and "mlp_hidden_size" in hf and "intermediate_size" not in hf:
            intermediate = hf["mlp_hidden_size"]  # OLMo config: already the per-branch width
        rope_theta = _rope_theta(hf)
        eos = hf.get("eos_token_id")
        eos_ids = eos if isinstance(eos, list) else ([eos] if eos is not None else [])
        values = dict(
            family=family,
            vocab_size=need("vocab_size", "embedding_size"),
            hidden_size=hidden,
            intermediate_size=intermediate,
            num_layers=need("num_hidden_layers", "n_layers"),
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            rope_theta=rope_theta,
            rms_norm_eps=float(hf.get("rms_norm_eps", hf.get("layer_norm_eps", 1e-6))),
            max_position_embeddings=int(hf.get("max_position_embeddings", hf.get("max_sequence_length", 4096))),
            tie_embeddings=bool(hf.get("tie_word_embeddings", hf.get("weight_tying", False))),
            bos_token_id=hf.get("bos_token_id"),
            eos_token_ids=[int(e) for e in eos_ids],
            pad_token_id=hf.get("pad_token_id"),
        )
        values.update(overrides)
        return cls(**values)


def _rope_theta(hf: dict) -> float:
    """rope_theta at the top level (transformers 4) or in `rope_parameters` (transformers 5
    writes it there); a scaled rope (llama3, yarn, ...) is refused, not run as plain rope."""
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind != "default":
        raise ValueError(f"config.json asks for rope scaling {kind!r}; only plain rotary embeddings are supported")
    return float(hf.get("rope_theta", rope.get("rope_theta", 10000.0)))
