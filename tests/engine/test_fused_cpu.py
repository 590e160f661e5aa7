"""The fused CPU pass (kernels/cpu) computes what the torch pass computes: the same matmuls over
the checkpoint's quantized blocks, every family's attention, the adapter, the greedy head."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize

from dllm_engine.engine import Engine
from dllm_engine.loading import load_model
from dllm_engine.models.fused_cpu import FusedCpuModel, mirror_int8_activations
from dllm_engine.models.kv_pool import BlockTable
from dllm_engine.models.transformer import Segment
from dllm_engine.request import GenerationParams
from kernels import cpu, quantize_activations
from tiny_checkpoints import FAMILY_SPECS, GGUF_VARIANTS, write_hf_checkpoint, write_tiny_llama_gguf

pytestmark = pytest.mark.skipif(cpu.available() is not None, reason=f"CPU kernels unavailable: {cpu.available()}")

TOLERANCE = 1e-4  # fp32, different summation order


def _blocks(values: torch.Tensor, qtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(raw blocks as uint8, the values they dequantize to)"""
    blocks = quantize(values.numpy(), qtype)
    dense = np.array(dequantize(blocks, qtype), dtype=np.float32).reshape(values.shape)
    return torch.from_numpy(blocks.view(np.uint8).reshape(-1).copy()), torch.from_numpy(dense)


@pytest.mark.parametrize("kind", ["f32", "q8_0", "q4_1"])
@pytest.mark.parametrize("rows", [1, 3, 8, 9, 17])
@pytest.mark.parametrize("shape", [(960, 576), (37, 64), (5, 32)])
def test_matmul_equals_the_dequantized_weights(kind, rows, shape):
    """Every row count takes one of the kernel's paths (direct below 9 rows, panels above),
    and column counts that are no multiple of its tiles end right."""
    out_features, in_features = shape
    weight, x = torch.randn(out_features, in_features), torch.randn(rows, in_features)
    if kind == "f32":
        y = cpu.extension().linear(x, weight, cpu.F32, out_features, in_features)
        dense = weight
    else:
        raw, dense = _blocks(weight, Q.Q8_0 if kind == "q8_0" else Q.Q4_1)
        y = cpu.extension().linear(x, raw, cpu.Q8_0 if kind == "q8_0" else cpu.Q4_1, out_features, in_features)
    assert float((y - x @ dense.T).abs().max()) < 1e-3


def test_matmul_refuses_blocks_that_do_not_fit_the_shape():
    raw, _ = _blocks(torch.randn(8, 64), Q.Q4_1)
    with pytest.raises(RuntimeError, match="byte size does not match its shape"):
        cpu.extension().linear(torch.randn(1, 64), raw, cpu.Q4_1, 9, 64)
    with pytest.raises(RuntimeError, match="whole blocks of 32"):
        cpu.extension().linear(torch.randn(1, 48), torch.zeros(8 * 48, dtype=torch.uint8), cpu.Q4_1, 8, 48)


def _passes(model, steps, fused_cache=torch.float32, attention="auto", block_tokens=16):
    """The hidden states of every row of each pass in `steps` (lists of segment factories over
    fresh caches of `block_tokens` blocks), through the torch pass and the fused pass (its caches
    `fused_cache`, its attention kernels `attention`)."""
    fused = FusedCpuModel(model)
    fused.use_attention_kernels(attention)
    results = []
    for forward in ("torch", "fused"):
        dtype = torch.float32 if forward == "torch" else fused_cache
        caches = [BlockTable.standalone(model.config, 128, dtype, block_tokens=block_tokens) for _ in range(2)]
        outputs = []
        for make_segments in steps:
            segments = make_segments(caches)
            rows = list(range(sum(s.tokens.numel() for s in segments)))
            with torch.inference_mode():
                if forward == "torch":
                    outputs.append(model.forward_segments(segments))
                else:
                    outputs.append(fused.forward(segments, rows))
        results.append(torch.cat(outputs))
    return results


def _tokens(count: int, seed: int) -> torch.Tensor:
    return torch.randint(3, 200, (count,), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory, tiny_tokenizer):
    root = tmp_path_factory.mktemp("fused-families")
    for index, (name, spec) in enumerate(FAMILY_SPECS.items()):
        write_hf_checkpoint(root / name, spec, tiny_tokenizer, seed=index)
    return root


@pytest.mark.parametrize("family", list(FAMILY_SPECS))
def test_every_family_gives_the_torch_pass_hidden_states(family, family_dirs):
    """Two requests packed together: a prefill, then a step whose second segment overwrites the
    cache slots the first one just wrote (a block over checked drafts), in each visibility."""
    model = load_model(str(family_dirs / family), dtype=torch.float32).model
    visibility = "blocks" if FAMILY_SPECS[family].attention == "block_causal" else "causal"
    steps = [
        lambda c: [Segment(_tokens(10, 1), 0, c[0], 10, visibility, block_size=4),
                   Segment(_tokens(7, 2), 0, c[1], 7, "full")],
        lambda c: [Segment(_tokens(4, 3), 10, c[0], 14, "causal"),  # 2 settled tokens + 2 drafts
                   Segment(_tokens(5, 4), 12, c[0], 17, "full"),  # the block, over the drafts' slots
                   Segment(_tokens(1, 5), 7, c[1], 8, "causal")],
    ]
    torch_hidden, fused_hidden = _passes(model, steps)
    assert float((torch_hidden - fused_hidden).abs().max()) < TOLERANCE


def test_the_adapter_acts_on_adapter_segments_only(make_tiny_bd):
    loaded = make_tiny_bd(seed=7)
    mask = loaded.config.mask_token_id
    steps = [
        lambda c: [Segment(_tokens(9, 1), 0, c[0], 9, "causal")],
        lambda c: [Segment(_tokens(3, 2), 9, c[0], 12, "causal"),
                   Segment(torch.tensor([mask, 7, mask, mask]), 10, c[0], 14, "full", adapter=True)],
    ]
    torch_hidden, fused_hidden = _passes(loaded.model, steps)
    assert float((torch_hidden - fused_hidden).abs().max()) < TOLERANCE


KERNELS = [("fp32", "auto")] + [("int8", variant) for variant in cpu.extension().int8_variants()]


@pytest.mark.parametrize("block_tokens", [16, 24])
@pytest.mark.parametrize("cache", [torch.float32, torch.float16])
def test_attention_over_many_key_blocks_gives_a_row_the_same_bits_alone_or_in_a_block(tmp_path, tiny_tokenizer,
                                                                                      cache, block_tokens):
    """Head dim 64 (the kernel's fast path), GQA, a cached prefix of 83 keys (several key blocks
    and a partial one; blocks of 16 keys, and of 24 where a block ends in half a vector of 16):
    six causal rows in one pass equal the same rows one pass each, bit for bit, whatever rows and
    heads share a work item, with every instruction set's attention kernels, which agree with each
    other bit for bit; and all equal the torch pass (over fp32 caches: to within fp32's summation
    order, or fp16's rounding of the keys and values)."""
    spec = FAMILY_SPECS["qwen3"]
    config = dict(spec.config, head_dim=64)
    write_hf_checkpoint(tmp_path, type(spec)(spec.name, config, spec.reference, spec.attention), tiny_tokenizer)
    model = load_model(str(tmp_path), dtype=torch.float32).model
    prefix, block = _tokens(83, 6), _tokens(6, 7)
    prefill = lambda c: [Segment(prefix, 0, c[0], 83, "causal")]
    together = [prefill, lambda c: [Segment(block, 83, c[0], 89, "causal")]]
    one_by_one = [prefill] + [lambda c, i=i: [Segment(block[i:i + 1], 83 + i, c[0], 84 + i, "causal")]
                              for i in range(6)]
    sets = cpu.attention_kernel_sets()
    assert "avx2" in sets
    fused_by_set = {}
    for name in sets:
        torch_rows, fused_rows = _passes(model, together, cache, name, block_tokens)
        _, fused_alone = _passes(model, one_by_one, cache, name, block_tokens)
        assert torch.equal(fused_rows[83:], fused_alone[83:])
        fused_by_set[name] = fused_rows
    assert all(torch.equal(rows, fused_by_set["avx2"]) for rows in fused_by_set.values())
    tolerance = TOLERANCE if cache == torch.float32 else 1e-3 * float(torch_rows.abs().max())
    assert float((torch_rows - fused_by_set["avx2"]).abs().max()) < tolerance


@pytest.mark.parametrize("activations, kernel", KERNELS)
def test_gguf_blocks_are_read_as_stored(tmp_path, tiny_tokenizer, activations, kernel):
    """SmolLM2's layout (Q4_1 projections, Q8_0 tied embeddings, permuted q/k rows): the fused
    pass streams the raw blocks and gives the dequantized torch model's hidden states, with 8-bit
    activations on both sides (every integer kernel this CPU runs) or fp32 on both."""
    path = tmp_path / "tiny.gguf"
    write_tiny_llama_gguf(path, tiny_tokenizer, GGUF_VARIANTS["smollm2"])
    loaded = load_model(str(path), dtype=torch.float32)
    assert {key for _, key in loaded.packed} == {"embed", "q", "k", "v", "o", "gate", "up", "down"}
    fused = FusedCpuModel(loaded.model, loaded.packed, activations=activations, kernel=kernel)
    assert fused.kernel == (kernel if activations == "int8" else "fp32")
    mirror_int8_activations(loaded.model, loaded.packed, on=activations == "int8")
    tokens = _tokens(12, 3)
    try:
        with torch.inference_mode():
            cache = BlockTable.standalone(loaded.config, 16, torch.float32)
            expected = loaded.model.forward_segments([Segment(tokens, 0, cache, 12)])
            got = fused.forward([Segment(tokens, 0, BlockTable.standalone(loaded.config, 16, torch.float32), 12)], list(range(12)))
            logits = loaded.model.logits(expected)
    finally:
        mirror_int8_activations(loaded.model, loaded.packed, on=False)
    assert float((expected - got).abs().max()) < TOLERANCE
    assert float((fused.logits(got) - logits).abs().max()) < TOLERANCE
    tokens_out, confidence = fused.greedy(got)
    assert tokens_out.tolist() == logits.argmax(-1).tolist()
    assert torch.allclose(confidence, torch.softmax(logits, -1).max(-1).values, atol=1e-5)


def test_the_torch_quantizer_gives_the_integer_kernels_activations_bit_for_bit():
    x = torch.randn(7, 96) * torch.logspace(-3, 3, 96)  # blocks of every magnitude
    x[2, 32:64] = 0.0  # an all-zero block
    x[3, :32] = torch.tensor([0.5, -0.5, 1.5, -1.5] * 8) * (127 / 1.5)  # ties round to even
    assert torch.equal(quantize_activations(x), cpu.extension().quantize_activations(x))
    assert (quantize_activations(x)[2, 32:64] == 0).all()


@pytest.mark.parametrize("kind", ["q8_0", "q4_1"])
@pytest.mark.parametrize("shape", [(960, 576), (37, 64), (5, 32)])
def test_the_integer_kernels_agree_with_each_other_and_keep_rows_independent(kind, shape):
    """Every variant this CPU runs gives the same bits; a row's output does not depend on the
    other rows of the pass (AR greedy equals exact diffusion because of it); and the result is
    the dequantized weights times the quantized activations."""
    out_features, in_features = shape
    raw, dense = _blocks(torch.randn(out_features, in_features), Q.Q8_0 if kind == "q8_0" else Q.Q4_1)
    code = cpu.Q8_0 if kind == "q8_0" else cpu.Q4_1
    x = torch.randn(13, in_features)
    outputs = {v: cpu.extension().linear_int8(x, raw, code, out_features, in_features, v)
               for v in cpu.extension().int8_variants()}
    first = next(iter(outputs.values()))
    assert all(torch.equal(first, y) for y in outputs.values())
    for rows in (1, 3, 8):
        alone = cpu.extension().linear_int8(x[:rows].contiguous(), raw, code, out_features, in_features)
        assert torch.equal(alone, first[:rows])
    expected = quantize_activations(x) @ dense.T
    assert float((first - expected).abs().max()) < 1e-3 * float(expected.abs().max())


def test_an_unknown_integer_kernel_is_refused_by_name():
    with pytest.raises(RuntimeError, match="no integer kernel 'avx9000'"):
        cpu.extension().linear_int8(torch.randn(1, 32), torch.zeros(20, dtype=torch.uint8), cpu.Q4_1, 1, 32, "avx9000")


def test_a_malformed_pass_is_refused_with_what_was_wrong(make_tiny_bd):
    loaded = make_tiny_bd(seed=1)
    fused = FusedCpuModel(loaded.model)
    cache = BlockTable.standalone(loaded.config, 16, torch.float32)
    with pytest.raises(ValueError, match="fp32 or fp16 KV caches"):
        fused.forward([Segment(_tokens(3, 1), 0, BlockTable.standalone(loaded.config, 16, torch.bfloat16), 3)], [0])
    with pytest.raises(RuntimeError, match="output row out of range"):
        fused.forward([Segment(_tokens(3, 1), 0, cache, 3)], [3])
    with pytest.raises(RuntimeError, match="token id out of range"):
        fused.forward([Segment(torch.tensor([10**6]), 0, cache, 1)], [0])


@pytest.mark.parametrize("mode", ["diffusion", "autoregressive"])
def test_the_engine_gives_the_same_tokens_on_either_pass(make_tiny_bd, mode):
    loaded = make_tiny_bd(seed=2)
    params = GenerationParams(mode=mode, max_new_tokens=12, block_size=4, threshold=0.3, stop_at_eos=False)
    replies = {}
    for backend in ("torch", "fused"):  # the torch pass quantizes activations as the fused one does
        engine = Engine(loaded, backend=backend, activations="int8", kv_cache="fp32" if backend == "fused" else "auto")
        try:
            assert engine.backend == backend
            replies[backend] = [engine.generate(p, params).token_ids for p in ("Hello there!", "Tell me a story.")]
        finally:
            engine.close()
    assert replies["fused"] == replies["torch"]


def test_drafted_rows_choose_among_the_draft_vocabulary_on_either_pass(make_tiny_bd):
    from dllm_engine.runner import TorchPass

    loaded = make_tiny_bd(seed=4)
    vocab = list(range(40, 120))
    hidden = torch.randn(5, loaded.config.hidden_size)
    logits = loaded.model.logits(hidden)
    for head in (FusedCpuModel(loaded.model, draft_vocab=vocab), TorchPass(loaded.model, vocab)):
        tokens, confidence = head.greedy(hidden, draft_rows=[1, 3])
        assert tokens[[0, 2, 4]].tolist() == logits[[0, 2, 4]].argmax(-1).tolist()
        restricted = logits[[1, 3]][:, vocab]
        assert tokens[[1, 3]].tolist() == [vocab[i] for i in restricted.argmax(-1).tolist()]
        assert torch.allclose(confidence[[1, 3]], torch.softmax(restricted, -1).max(-1).values, atol=1e-5)


def test_a_draft_vocabulary_leaves_exact_replies_unchanged(make_tiny_bd):
    loaded = make_tiny_bd(seed=5)
    params = GenerationParams(max_new_tokens=12, block_size=4, stop_at_eos=False)
    ar = GenerationParams(mode="autoregressive", max_new_tokens=12, stop_at_eos=False)
    loaded.draft_vocab = list(range(0, 200, 3))
    engine = Engine(loaded)
    try:
        for prompt in ("Hello there!", "Tell me a story."):
            assert engine.generate(prompt, params).token_ids == engine.generate(prompt, ar).token_ids
    finally:
        engine.close()
        loaded.draft_vocab = None


def test_the_kv_cache_dtype_follows_the_activations_and_is_refused_where_it_does_not_apply():
    from dllm_engine.resolve import resolve_kv_cache

    assert resolve_kv_cache("auto", "fused", "int8", torch.float32) == torch.float16
    assert resolve_kv_cache("auto", "fused", "fp32", torch.float32) == torch.float32  # equals transformers
    assert resolve_kv_cache("fp32", "fused", "int8", torch.float32) == torch.float32
    assert resolve_kv_cache("fp16", "fused", "fp32", torch.float32) == torch.float16
    assert resolve_kv_cache("auto", "torch", "fp32", torch.bfloat16) == torch.bfloat16
    with pytest.raises(ValueError, match="fused CPU pass"):
        resolve_kv_cache("fp16", "torch", "fp32", torch.float32)
    with pytest.raises(ValueError, match="kv_cache must be one of auto, fp16, fp32, got 'int4'"):
        resolve_kv_cache("int4", "fused", "int8", torch.float32)
