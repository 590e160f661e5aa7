"""Tiny random-weight checkpoints in the real on-disk formats, for the reference checks.

Every checkpoint is written the way its publisher writes it (config keys, tensor names,
tokenizer files), so the tests load it through the same code path a real download takes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a tiny test model.<|im_end|>\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_TRAINING_TEXT = [
    "The capital of France is Paris. The capital of Italy is Rome.",
    "What is the weather like today? It is sunny and warm, with a light breeze.",
    "Diffusion language models denoise a whole block of tokens in parallel.",
    "Numbers like 12345 and 2024 appear in text; so do emoji and accents: café, naïve.",
    "<|im_start|>user\nHello there!<|im_end|>\n<|im_start|>assistant\nHi! How can I help?<|im_end|>",
]
TINY_VOCAB = 320  # the embedding has more rows than the tokenizer has tokens, as real models pad


def train_tiny_tokenizer(vocab_size: int = 300) -> Tokenizer:
    """A byte-level BPE (GPT-2 style, as SmolLM and Qwen use) learned from a few sentences."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(_TRAINING_TEXT * 4, trainer)
    return tokenizer


@dataclass(frozen=True)
class FamilySpec:
    """How one family's checkpoint looks on disk, and which transformers class runs it."""

    name: str
    config: dict  # config.json as its publisher writes it (tiny shapes)
    reference: str  # transformers architecture holding the same weights
    attention: str  # causal | block_causal | bidirectional
    block_size: int = 1


def _hf_shapes(**extra) -> dict:
    base = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=TINY_VOCAB, max_position_embeddings=256, hidden_act="silu",
                bos_token_id=1, eos_token_id=2, pad_token_id=0, torch_dtype="float32")
    base.update(extra)
    return base


FAMILY_SPECS: dict[str, FamilySpec] = {
    spec.name: spec
    for spec in [
        FamilySpec("llama", _hf_shapes(model_type="llama", architectures=["LlamaForCausalLM"], rope_theta=100000.0,
                                       rms_norm_eps=1e-5, tie_word_embeddings=True, attention_bias=False,
                                       mlp_bias=False), "llama", "causal"),
        FamilySpec("qwen2", _hf_shapes(model_type="qwen2", architectures=["Qwen2ForCausalLM"], rope_theta=1000000.0,
                                       rms_norm_eps=1e-6, tie_word_embeddings=False, use_sliding_window=False),
                   "qwen2", "causal"),
        FamilySpec("qwen3", _hf_shapes(model_type="qwen3", architectures=["Qwen3ForCausalLM"], head_dim=32,
                                       rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
                                       attention_bias=False), "qwen3", "causal"),
        FamilySpec("sdar", _hf_shapes(model_type="sdar", architectures=["SDARForCausalLM"], head_dim=32,
                                      rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
                                      attention_bias=False, block_size=4), "qwen3", "block_causal", 4),
        FamilySpec("fast_dllm_v2", _hf_shapes(model_type="Fast_dLLM_QWen", architectures=["Fast_dLLM_QwenForCausalLM"],
                                              rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False,
                                              bd_size=8), "qwen2", "block_causal", 8),
        FamilySpec("dream", _hf_shapes(model_type="Dream", architectures=["DreamModel"], rope_theta=1000000.0,
                                       rms_norm_eps=1e-6, tie_word_embeddings=False, mask_token_id=TINY_VOCAB - 1),
                   "qwen2", "bidirectional"),
        FamilySpec("llada", dict(model_type="llada", architectures=["LLaDAModelLM"], d_model=64, n_heads=4,
                                 n_kv_heads=4, n_layers=2, mlp_ratio=1.5, mlp_hidden_size=96, max_sequence_length=256,
                                 vocab_size=TINY_VOCAB, embedding_size=TINY_VOCAB, mask_token_id=TINY_VOCAB - 1,
                                 eos_token_id=2, pad_token_id=0, layer_norm_type="rms", rms_norm_eps=1e-5,
                                 rope=True, rope_theta=500000.0, weight_tying=False, include_bias=False,
                                 activation_type="silu", block_type="llama"), "llama", "bidirectional"),
    ]
}


def reference_config_dict(spec: FamilySpec) -> dict:
    """The transformers config (Llama/Qwen2/Qwen3) that runs this family's weights."""
    hf = spec.config
    if spec.name != "llada":
        keep = dict(hf)
        keep.pop("model_type"), keep.pop("architectures")
        return keep
    return dict(hidden_size=hf["d_model"], intermediate_size=hf["mlp_hidden_size"], num_hidden_layers=hf["n_layers"],
                num_attention_heads=hf["n_heads"], num_key_value_heads=hf["n_kv_heads"], vocab_size=hf["vocab_size"],
                max_position_embeddings=hf["max_sequence_length"], rope_theta=hf["rope_theta"],
                rms_norm_eps=hf["rms_norm_eps"], tie_word_embeddings=False, attention_bias=False, mlp_bias=False)


def random_hf_weights(spec: FamilySpec, seed: int = 0) -> dict[str, torch.Tensor]:
    """Weights in transformers' (Llama/Qwen) names, scaled so activations stay O(1) and
    logits spread over several units: differences show up instead of hiding under 1e-4."""
    cfg = reference_config_dict(spec)
    gen = torch.Generator().manual_seed(seed)
    hidden, inter, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg.get("head_dim") or hidden // heads

    def linear(out_f: int, in_f: int) -> torch.Tensor:
        return torch.randn(out_f, in_f, generator=gen) / in_f**0.5

    def norm(dim: int) -> torch.Tensor:
        return 1.0 + 0.2 * torch.randn(dim, generator=gen)

    weights = {"model.embed_tokens.weight": torch.randn(vocab, hidden, generator=gen),
               "model.norm.weight": norm(hidden)}
    if not cfg.get("tie_word_embeddings"):
        weights["lm_head.weight"] = linear(vocab, hidden) * 4
    qkv_bias = spec.reference == "qwen2"
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        weights[p + "input_layernorm.weight"] = norm(hidden)
        weights[p + "post_attention_layernorm.weight"] = norm(hidden)
        weights[p + "self_attn.q_proj.weight"] = linear(heads * head_dim, hidden) * 2
        weights[p + "self_attn.k_proj.weight"] = linear(kv_heads * head_dim, hidden) * 2
        weights[p + "self_attn.v_proj.weight"] = linear(kv_heads * head_dim, hidden)
        weights[p + "self_attn.o_proj.weight"] = linear(hidden, heads * head_dim)
        if qkv_bias:
            for name, width in (("q", heads), ("k", kv_heads), ("v", kv_heads)):
                weights[p + f"self_attn.{name}_proj.bias"] = 0.5 * torch.randn(width * head_dim, generator=gen)
        if spec.reference == "qwen3":
            weights[p + "self_attn.q_norm.weight"] = norm(head_dim)
            weights[p + "self_attn.k_norm.weight"] = norm(head_dim)
        weights[p + "mlp.gate_proj.weight"] = linear(inter, hidden)
        weights[p + "mlp.up_proj.weight"] = linear(inter, hidden)
        weights[p + "mlp.down_proj.weight"] = linear(hidden, inter)
    return weights


_LLADA_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight", "self_attn.q_proj.weight": "q_proj.weight",
    "self_attn.k_proj.weight": "k_proj.weight", "self_attn.v_proj.weight": "v_proj.weight",
    "self_attn.o_proj.weight": "attn_out.weight", "post_attention_layernorm.weight": "ff_norm.weight",
    "mlp.gate_proj.weight": "ff_proj.weight", "mlp.up_proj.weight": "up_proj.weight",
    "mlp.down_proj.weight": "ff_out.weight",
}


def to_llada_names(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename Llama tensors to the names LLaDA's checkpoints use (OLMo's)."""
    renamed = {"model.transformer.wte.weight": weights["model.embed_tokens.weight"],
               "model.transformer.ln_f.weight": weights["model.norm.weight"],
               "model.transformer.ff_out.weight": weights["lm_head.weight"]}
    for name, tensor in weights.items():
        if name.startswith("model.layers."):
            _, _, index, rest = name.split(".", 3)
            renamed[f"model.transformer.blocks.{index}.{_LLADA_LAYER_NAMES[rest]}"] = tensor
    return renamed


def write_tokenizer_files(directory: Path, tokenizer: Tokenizer) -> None:
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>", "unk_token": "<|endoftext|>", "model_max_length": 256,
        "add_prefix_space": False, "chat_template": CHATML_TEMPLATE,
    }, indent=2))


def write_hf_checkpoint(directory: Path, spec: FamilySpec, tokenizer: Tokenizer, *, shards: int = 1,
                        seed: int = 0) -> dict[str, torch.Tensor]:
    """config.json + safetensors (one file or `shards` files with an index) + tokenizer files.
    Returns the weights in transformers' Llama/Qwen names (for the reference model)."""
    directory.mkdir(parents=True, exist_ok=True)
    weights = random_hf_weights(spec, seed)
    on_disk = to_llada_names(weights) if spec.name == "llada" else weights
    (directory / "config.json").write_text(json.dumps(spec.config, indent=2))
    if shards == 1:
        save_file(on_disk, str(directory / "model.safetensors"), metadata={"format": "pt"})
    else:
        names = list(on_disk)
        weight_map = {}
        for index in range(shards):
            filename = f"model-{index + 1:05d}-of-{shards:05d}.safetensors"
            part = {n: on_disk[n] for n in names[index::shards]}
            save_file(part, str(directory / filename), metadata={"format": "pt"})
            weight_map.update({n: filename for n in part})
        total = sum(t.numel() * t.element_size() for t in on_disk.values())
        (directory / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    write_tokenizer_files(directory, tokenizer)
    return weights


def build_reference_model(spec: FamilySpec, weights: dict[str, torch.Tensor]):
    """The transformers model for this family's layout, holding exactly `weights` (fp32, SDPA)."""
    import transformers

    classes = {"llama": ("LlamaConfig", "LlamaForCausalLM"), "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"),
               "qwen3": ("Qwen3Config", "Qwen3ForCausalLM")}
    config_cls, model_cls = (getattr(transformers, n) for n in classes[spec.reference])
    config = config_cls(**reference_config_dict(spec))
    config._attn_implementation = "sdpa"
    model = model_cls(config).float().eval()
    missing, unexpected = model.load_state_dict(weights, strict=False)
    allowed_missing = {"lm_head.weight"} if config.tie_word_embeddings else set()
    assert not unexpected and set(missing) <= allowed_missing, (missing, unexpected)
    if config.tie_word_embeddings:
        assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    return model


# ---- GGUF (llama.cpp's format) -------------------------------------------------------------------
@dataclass(frozen=True)
class GGUFVariant:
    """Which quant type each kind of tensor gets; SmolLM2's file is the `smollm2` variant."""

    name: str
    projections: str  # attn_q/k/v/output, ffn_gate/up
    ffn_down: str
    token_embd: str
    output: str | None = None  # None: tied embeddings (no output.weight), as in SmolLM2
    hidden: int = 64
    intermediate: int = 96


GGUF_VARIANTS = {
    v.name: v
    for v in [
        GGUFVariant("smollm2", "Q4_1", "Q4_1", "Q8_0"),
        GGUFVariant("f16_untied", "F16", "F16", "F16", output="F16"),
        GGUFVariant("q4_0", "Q4_0", "Q4_0", "Q8_0", output="Q8_0"),
        # K-quants work on 256-wide superblocks, so every row must be a multiple of 256 long
        GGUFVariant("k_quants", "Q4_K", "Q6_K", "Q6_K", hidden=256, intermediate=256),
    ]
}
# a file with a quant type the engine does not read (llama.cpp's IQ4_NL on ffn_down)
UNSUPPORTED_QUANT_VARIANT = GGUFVariant("iq4_nl_down", "Q4_1", "IQ4_NL", "Q8_0")


def llama_cpp_row_permutation(weight: np.ndarray, heads: int) -> np.ndarray:
    """What llama.cpp's converter does to Q/K rows: within each head, interleave the two
    rotary halves (rows [h0, h1] of a head become pairs) for its rope implementation."""
    rows = weight.shape[0]
    return weight.reshape(heads, 2, rows // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def _random_quant_blocks(qtype_name: str, n_values: int, rng: np.random.Generator) -> np.ndarray:
    """Blocks for the types gguf can read but not write. K-quants: random quants and
    sub-scales, with the fp16 super-scales set so values stay O(0.1). Other types: random
    bytes, only for files a loader must refuse."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    qtype = GGMLQuantizationType[qtype_name]
    block_values, block_bytes = GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(n_values // block_values, block_bytes), dtype=np.uint8)
    if qtype_name == "Q4_K":  # d, dmin (fp16) lead the block
        blocks[:, 0:2] = np.full((len(blocks), 1), 4e-4, dtype=np.float16).view(np.uint8)
        blocks[:, 2:4] = np.full((len(blocks), 1), 2e-4, dtype=np.float16).view(np.uint8)
    elif qtype_name == "Q6_K":  # d (fp16) ends the block
        blocks[:, -2:] = np.full((len(blocks), 1), 6e-5, dtype=np.float16).view(np.uint8)
    return blocks


def encode_gguf_tensor(values: np.ndarray, qtype_name: str, rng: np.random.Generator) -> tuple[np.ndarray, object]:
    """(array to write, raw dtype) for `values` stored as `qtype_name`."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    qtype = GGMLQuantizationType[qtype_name]
    if qtype_name == "F32":
        return values.astype(np.float32), None
    if qtype_name == "F16":
        return values.astype(np.float16), None
    if qtype_name in ("Q4_K", "Q6_K", "IQ4_NL", "Q2_K"):
        blocks = _random_quant_blocks(qtype_name, values.size, rng)
        return blocks.reshape(values.shape[0], -1), qtype
    return quantize(values.astype(np.float32), qtype), qtype


def gguf_vocabulary(tokenizer: Tokenizer) -> tuple[list[str], list[int], list[str]]:
    """(tokens by id, llama.cpp token types, merges) of a byte-level BPE tokenizer."""
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    tokens = [token for token, _ in sorted(vocab.items(), key=lambda item: item[1])]
    types = [3 if token in SPECIAL_TOKENS else 1 for token in tokens]  # 3 control, 1 normal
    merges = [" ".join(pair) if isinstance(pair, list) else pair
              for pair in json.loads(tokenizer.to_str())["model"]["merges"]]
    return tokens, types, merges


def write_tiny_llama_gguf(path: Path, tokenizer: Tokenizer, variant: GGUFVariant, seed: int = 0,
                          layers: int = 2, heads: int = 4, kv_heads: int = 2) -> dict[str, np.ndarray]:
    """A tiny random llama GGUF laid out as llama.cpp's converter writes one (SmolLM2-like
    metadata, permuted Q/K rows, tied embeddings unless the variant has an output tensor).
    Returns the Q/K matrices as they were before llama.cpp's permutation (and quantization)."""
    import gguf

    rng = np.random.default_rng(seed)
    tokens, types, merges = gguf_vocabulary(tokenizer)
    hidden, inter, vocab = variant.hidden, variant.intermediate, len(tokens)
    head_dim = hidden // heads
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-llama-" + variant.name)
    writer.add_block_count(layers)
    writer.add_context_length(256)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(inter)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(100000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(head_dim)
    writer.add_vocab_size(vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt2")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tokens.index("<|im_start|>"))
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_pad_token_id(tokens.index("<|endoftext|>"))
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHATML_TEMPLATE)

    def matrix(rows: int, cols: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * scale / cols**0.5).astype(np.float32)

    def put(name: str, values: np.ndarray, qtype_name: str) -> None:
        data, raw_dtype = encode_gguf_tensor(values, qtype_name, rng)
        writer.add_tensor(name, data, raw_dtype=raw_dtype)

    def norm(dim: int) -> np.ndarray:
        return (1.0 + 0.2 * rng.standard_normal(dim)).astype(np.float32)

    put("token_embd.weight", rng.standard_normal((vocab, hidden)).astype(np.float32), variant.token_embd)
    put("output_norm.weight", norm(hidden), "F32")
    if variant.output:
        put("output.weight", matrix(vocab, hidden, 4.0), variant.output)
    unpermuted = {}
    for i in range(layers):
        p = f"blk.{i}."
        put(p + "attn_norm.weight", norm(hidden), "F32")
        put(p + "ffn_norm.weight", norm(hidden), "F32")
        unpermuted[p + "attn_q.weight"] = matrix(heads * head_dim, hidden, 2.0)
        unpermuted[p + "attn_k.weight"] = matrix(kv_heads * head_dim, hidden, 2.0)
        put(p + "attn_q.weight", llama_cpp_row_permutation(unpermuted[p + "attn_q.weight"], heads), variant.projections)
        put(p + "attn_k.weight", llama_cpp_row_permutation(unpermuted[p + "attn_k.weight"], kv_heads),
            variant.projections)
        put(p + "attn_v.weight", matrix(kv_heads * head_dim, hidden), variant.projections)
        put(p + "attn_output.weight", matrix(hidden, heads * head_dim), variant.projections)
        put(p + "ffn_gate.weight", matrix(inter, hidden), variant.projections)
        put(p + "ffn_up.weight", matrix(inter, hidden), variant.projections)
        put(p + "ffn_down.weight", matrix(hidden, inter), variant.ffn_down)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return unpermuted
