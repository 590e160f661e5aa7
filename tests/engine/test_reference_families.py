"""Every family, loaded from a tiny checkpoint in its real on-disk format, gives the logits of
the transformers reference model holding the same weights, under the family's attention."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from dllm_engine.loading import load_model
from dllm_engine.models.kv_pool import BlockTable
from dllm_engine.models.transformer import Segment
from tiny_checkpoints import (
    FAMILY_SPECS,
    TINY_VOCAB,
    FamilySpec,
    build_reference_model,
    write_hf_checkpoint,
    write_tokenizer_files,
)

TOLERANCE = 1e-4  # fp32 max abs logit difference
SEQ_LEN = 24  # a multiple of every tiny block size (4 and 8)


def family_mask(spec: FamilySpec, length: int) -> torch.Tensor:
    """The family's attention as a bool [1, 1, T, T] mask (True = may attend)."""
    query = torch.arange(length).unsqueeze(1)
    key = torch.arange(length).unsqueeze(0)
    if spec.attention == "causal":
        allowed = key <= query
    elif spec.attention == "block_causal":
        allowed = key // spec.block_size <= query // spec.block_size
    else:
        allowed = torch.ones(length, length, dtype=torch.bool)
    return allowed[None, None]


def chunk_mask(chunks: list[tuple[int, int, str]], length: int) -> torch.Tensor:
    """Dense mask equal to running (start, end, visibility) chunks one after another over a cache:
    a chunk sees everything before it, and itself causally or fully."""
    allowed = torch.zeros(length, length, dtype=torch.bool)
    for start, end, visibility in chunks:
        for query in range(start, end):
            allowed[query, : (query + 1 if visibility == "causal" else end)] = True
    return allowed[None, None]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, tiny_tokenizer):
    """family name -> (checkpoint dir, weights in transformers names); written once."""
    root = tmp_path_factory.mktemp("families")
    written = {}
    for name, spec in FAMILY_SPECS.items():
        written[name] = (root / name, write_hf_checkpoint(root / name, spec, tiny_tokenizer, seed=len(written)))
    return written


def random_tokens(batch: int, length: int, seed: int) -> torch.Tensor:
    return torch.randint(0, TINY_VOCAB, (batch, length), generator=torch.Generator().manual_seed(seed))


def max_logit_diff(spec: FamilySpec, directory, weights, tokens: torch.Tensor) -> tuple[float, float]:
    loaded = load_model(str(directory), dtype=torch.float32)
    reference = build_reference_model(spec, weights)
    mask = family_mask(spec, tokens.shape[1])
    with torch.inference_mode():
        ours = loaded.model.logits(loaded.model.forward_dense(tokens, mask))
        theirs = reference(input_ids=tokens, attention_mask=mask.expand(tokens.shape[0], -1, -1, -1)).logits
    return float((ours - theirs).abs().max()), float(theirs.abs().max())


@pytest.mark.parametrize("family", list(FAMILY_SPECS))
def test_dense_logits_match_transformers(family, checkpoints):
    directory, weights = checkpoints[family]
    diff, scale = max_logit_diff(FAMILY_SPECS[family], directory, weights, random_tokens(2, SEQ_LEN, seed=1))
    assert scale > 1.0, "logits this small would hide a wrong layer under the tolerance"
    assert diff < TOLERANCE, f"{family}: max abs logit difference {diff:.2e} (logits up to {scale:.1f})"


@pytest.mark.parametrize("family", ["llama", "llada"])
def test_sharded_checkpoint_loads_the_same_weights(family, tmp_path, tiny_tokenizer):
    spec = FAMILY_SPECS[family]
    weights = write_hf_checkpoint(tmp_path, spec, tiny_tokenizer, shards=3, seed=7)
    assert (tmp_path / "model.safetensors.index.json").is_file() and not (tmp_path / "model.safetensors").exists()
    diff, _ = max_logit_diff(spec, tmp_path, weights, random_tokens(1, SEQ_LEN, seed=2))
    assert diff < TOLERANCE


@pytest.mark.parametrize("family", list(FAMILY_SPECS))
def test_loaded_config_reflects_the_family(family, checkpoints):
    spec = FAMILY_SPECS[family]
    config = load_model(str(checkpoints[family][0])).config
    assert config.family == family
    assert config.attention == spec.attention
    assert config.vocab_size == TINY_VOCAB and config.num_layers == 2
    if spec.attention == "block_causal":
        assert config.block_size == spec.block_size
    if "mask_token_id" in spec.config:  # Dream and LLaDA name their mask id in config.json
        assert config.mask_token_id == spec.config["mask_token_id"]
    assert config.logits_shift == (family not in ("sdar", "llada"))  # SDAR and LLaDA predict in place
    assert config.qkv_bias == (spec.reference == "qwen2")
    assert config.qk_norm == (spec.reference == "qwen3")
    assert config.head_dim == spec.config.get("head_dim", 16)


def cached_chunks(spec: FamilySpec, length: int) -> list[tuple[int, int, str]]:
    """How the engine runs a sequence: a prefill, then block-sized steps over the KV cache."""
    step = spec.block_size if spec.attention == "block_causal" else 4
    prefill = 2 * step
    chunks = [(0, prefill, "prefill")]
    chunks += [(start, start + step, "step") for start in range(prefill, length, step)]
    visibility = {"causal": "causal", "block_causal": "full", "bidirectional": "full"}[spec.attention]
    return [(start, end, visibility) for start, end, _ in chunks]


@pytest.mark.parametrize("family", list(FAMILY_SPECS))
def test_cached_segments_match_dense_pass(family, checkpoints):
    """Prefill then block steps through forward_segments + BlockTable == one dense pass with
    the equivalent mask (block-causal prefill for the block families)."""
    spec = FAMILY_SPECS[family]
    model = load_model(str(checkpoints[family][0])).model
    tokens = random_tokens(1, SEQ_LEN, seed=3)[0]
    chunks = cached_chunks(spec, SEQ_LEN)
    cache = BlockTable.standalone(model.config, max_len=SEQ_LEN + 8, dtype=torch.float32)
    pieces = []
    with torch.inference_mode():
        for index, (start, end, visibility) in enumerate(chunks):
            if index == 0 and spec.attention == "block_causal":  # prefill whole blocks, block-causally
                segment = Segment(tokens[start:end], start, cache, attend_len=end, visibility="blocks",
                                  block_size=spec.block_size)
            else:
                segment = Segment(tokens[start:end], start, cache, attend_len=end, visibility=visibility)
            pieces.append(model.logits(model.forward_segments([segment])))
        cached = torch.cat(pieces)
        mask = family_mask(spec, SEQ_LEN) if spec.attention == "block_causal" else chunk_mask(chunks, SEQ_LEN)
        dense = model.logits(model.forward_dense(tokens[None], mask))[0]
    diff = float((cached - dense).abs().max())
    assert diff < TOLERANCE, f"{family}: cached segments differ from the dense pass by {diff:.2e}"


def test_packed_requests_match_separate_dense_passes(checkpoints):
    """Two requests packed into one forward_segments call (own caches, own visibility) give
    what each gives alone in a dense pass."""
    spec = FAMILY_SPECS["qwen3"]
    model = load_model(str(checkpoints["qwen3"][0])).model
    first, second = random_tokens(1, 12, seed=4)[0], random_tokens(1, 7, seed=5)[0]
    caches = [BlockTable.standalone(model.config, max_len=16, dtype=torch.float32) for _ in range(2)]
    with torch.inference_mode():
        hidden = model.forward_segments([Segment(first, 0, caches[0], attend_len=12, visibility="causal"),
                                         Segment(second, 0, caches[1], attend_len=7, visibility="full")])
        packed = model.logits(hidden)
        alone_first = model.logits(model.forward_dense(first[None], family_mask(spec, 12)))[0]
        alone_second = model.logits(model.forward_dense(second[None], None))[0]
    assert float((packed[:12] - alone_first).abs().max()) < TOLERANCE
    assert float((packed[12:] - alone_second).abs().max()) < TOLERANCE


# ---- the `dllm generate` contract ------------------------------------------------------------------
AR_CHECKPOINTS = {
    # untied, so a random model does not just repeat its input token (tied std-1 embeddings do)
    "llama": dataclasses.replace(FAMILY_SPECS["llama"], config={**FAMILY_SPECS["llama"].config,
                                                                  "tie_word_embeddings": False}),
    "qwen2": FAMILY_SPECS["qwen2"],
    "qwen3": FAMILY_SPECS["qwen3"],
}


@pytest.mark.parametrize("family", list(AR_CHECKPOINTS))
def test_dllm_generate_greedy_tokens_equal_transformers_generate(family, tmp_path, tiny_tokenizer, dllm_generate):
    """`dllm generate --mode autoregressive --raw --json` on an HF directory picks, token for
    token, what transformers' greedy generate picks on the same directory."""
    from transformers import AutoModelForCausalLM

    spec = AR_CHECKPOINTS[family]
    write_hf_checkpoint(tmp_path, spec, tiny_tokenizer, seed=21)
    prompt, max_new = "The capital of France is", 24
    result = dllm_generate(str(tmp_path), prompt, max_new)
    assert set(result) >= {"text", "token_ids", "new_tokens", "forward_passes", "elapsed_s", "model", "mode"}
    assert result["mode"] == "autoregressive" and result["model"] == tmp_path.name

    loaded = load_model(str(tmp_path))
    prompt_ids = loaded.tokenizer.encode(prompt)
    reference = AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=torch.float32).eval()
    with torch.inference_mode():
        output = reference.generate(torch.tensor([prompt_ids]), attention_mask=torch.ones(1, len(prompt_ids)),
                                    max_new_tokens=max_new, do_sample=False,
                                    eos_token_id=loaded.config.eos_token_ids, pad_token_id=0)
    expected = output[0, len(prompt_ids):].tolist()
    stop = next((i for i, t in enumerate(expected) if t in loaded.config.eos_token_ids), len(expected))
    assert result["token_ids"] == expected[:stop]
    assert result["new_tokens"] == len(result["token_ids"]) and len(set(expected)) > 3
    assert result["text"] == loaded.tokenizer.decode(result["token_ids"])
    assert result["forward_passes"] >= 1 and result["elapsed_s"] > 0


# ---- checkpoints written by transformers itself ---------------------------------------------------
def test_checkpoint_saved_by_transformers_5_loads_with_its_rope_theta(tmp_path, tiny_tokenizer):
    """transformers 5 writes rope_theta inside `rope_parameters`, not at the top level; a
    loader that missed it would silently run rope at 10000 and drift from the reference."""
    spec = FAMILY_SPECS["qwen2"]
    reference = build_reference_model(spec, write_hf_checkpoint(tmp_path / "source", spec, tiny_tokenizer, seed=5))
    reference.config.rope_parameters["rope_theta"] = 1234.0  # far from every default
    reference.save_pretrained(str(tmp_path / "saved"))
    write_tokenizer_files(tmp_path / "saved", tiny_tokenizer)
    saved_config = json.loads((tmp_path / "saved" / "config.json").read_text())
    assert "rope_theta" not in saved_config and saved_config["rope_parameters"]["rope_theta"] == 1234.0

    loaded = load_model(str(tmp_path / "saved"))
    assert loaded.config.rope_theta == 1234.0
    reloaded = type(reference).from_pretrained(str(tmp_path / "saved"), dtype=torch.float32).eval()
    tokens = random_tokens(1, SEQ_LEN, seed=6)
    mask = family_mask(spec, SEQ_LEN)
    with torch.inference_mode():
        ours = loaded.model.logits(loaded.model.forward_dense(tokens, mask))
        theirs = reloaded(input_ids=tokens).logits
    assert float((ours - theirs).abs().max()) < TOLERANCE


@pytest.mark.parametrize("rope_key", ["rope_scaling", "rope_parameters"])
def test_rope_scaling_we_do_not_implement_is_refused_by_name(rope_key, tmp_path, tiny_tokenizer):
    """LLaMA-3.1 style frequency scaling changes every position's rotation: refuse it clearly
    rather than run plain rope and give wrong logits."""
    spec = FAMILY_SPECS["llama"]
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 128, "rope_theta": 500000.0}
    write_hf_checkpoint(tmp_path, dataclasses.replace(spec, config={**spec.config, rope_key: scaling}), tiny_tokenizer)
    with pytest.raises(ValueError, match="llama3"):
        load_model(str(tmp_path))
