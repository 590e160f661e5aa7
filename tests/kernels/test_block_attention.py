"""block_attention: the reference against a per-head float64 loop, the Triton kernel (interpreted
on CPU) against the reference."""

import math

import pytest
import torch

from kernels import block_attention
from kernels.block_attention import reference


def looped_oracle(q, k_cache, v_cache, prefix_lens):
    """Per row and head: softmax over cache positions [0, prefix + Bq), in float64."""
    rows, q_heads, block_len, head_dim = q.shape
    group = q_heads // k_cache.shape[1]
    out = torch.empty(q.shape, dtype=torch.float64)
    for row in range(rows):
        visible = int(prefix_lens[row]) + block_len
        for head in range(q_heads):
            keys = k_cache[row, head // group, :visible].double()
            values = v_cache[row, head // group, :visible].double()
            scores = q[row, head].double() @ keys.T / math.sqrt(head_dim)
            out[row, head] = torch.softmax(scores, dim=-1) @ values
    return out


def random_case(rows, q_heads, kv_heads, block_len, cache_len, head_dim, dtype=torch.float32):
    q = torch.randn(rows, q_heads, block_len, head_dim, dtype=dtype)
    k_cache = torch.randn(rows, kv_heads, cache_len, head_dim, dtype=dtype)
    v_cache = torch.randn(rows, kv_heads, cache_len, head_dim, dtype=dtype)
    prefix_lens = torch.randint(0, cache_len - block_len + 1, (rows,))
    prefix_lens[0] = 0  # the first block: sees only itself
    prefix_lens[-1] = cache_len - block_len  # the block fills the cache to its end
    return q, k_cache, v_cache, prefix_lens


# (rows, Hq, Hkv, Bq, L, D): GQA groups of 1-4, blocks of 1-7, head dims off the powers of
# two, prefixes spanning several 64-key tiles.
CASES = [(3, 4, 2, 5, 70, 24), (2, 3, 3, 1, 20, 16), (3, 8, 2, 7, 150, 40), (2, 4, 1, 4, 9, 8)]


@pytest.mark.parametrize("case", CASES)
def test_reference_matches_looped_oracle(case):
    q, k_cache, v_cache, prefix_lens = random_case(*case)
    torch.testing.assert_close(
        reference(q, k_cache, v_cache, prefix_lens),
        looped_oracle(q, k_cache, v_cache, prefix_lens).float(), rtol=1e-4, atol=1e-5,
    )


@pytest.mark.parametrize("case", CASES)
def test_triton_matches_reference(poisoned_outputs, case):
    q, k_cache, v_cache, prefix_lens = random_case(*case)
    torch.testing.assert_close(
        block_attention(q, k_cache, v_cache, prefix_lens, backend="triton"),
        reference(q, k_cache, v_cache, prefix_lens),
    )


def test_triton_bf16(poisoned_outputs):
    q, k_cache, v_cache, prefix_lens = random_case(2, 6, 2, 7, 100, 40, torch.bfloat16)
    out = block_attention(q, k_cache, v_cache, prefix_lens, backend="triton")
    expected = reference(q.float(), k_cache.float(), v_cache.float(), prefix_lens)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), expected, rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_cache_beyond_the_block_is_never_read(backend):
    q, k_cache, v_cache, prefix_lens = random_case(3, 4, 2, 5, 60, 16)
    clean = block_attention(q, k_cache, v_cache, prefix_lens, backend=backend)
    for row, prefix in enumerate(prefix_lens.tolist()):
        k_cache[row, :, prefix + 5:] = float("nan")
        v_cache[row, :, prefix + 5:] = float("nan")
    torch.testing.assert_close(block_attention(q, k_cache, v_cache, prefix_lens, backend=backend), clean)


def test_strided_query_and_explicit_scale():
    q, k_cache, v_cache, prefix_lens = random_case(2, 4, 2, 6, 40, 16)
    q_strided = q.transpose(1, 2).contiguous().transpose(1, 2)  # [R, Bq, Hq, D] memory
    torch.testing.assert_close(
        block_attention(q_strided, k_cache, v_cache, prefix_lens, 0.3, backend="triton"),
        reference(q, k_cache, v_cache, prefix_lens, 0.3),
    )


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_prefix_out_of_range_is_rejected(backend):
    q, k_cache, v_cache, _ = random_case(2, 2, 2, 4, 10, 8)
    with pytest.raises(ValueError, match="prefix_lens must lie in"):
        block_attention(q, k_cache, v_cache, torch.tensor([0, 7]), backend=backend)
    with pytest.raises(ValueError, match="prefix_lens must lie in"):
        block_attention(q, k_cache, v_cache, torch.tensor([-1, 0]), backend=backend)


@pytest.mark.parametrize(
    "q_shape,kv_shape,message",
    [
        ((2, 4, 3), (2, 2, 10, 8), "q must be"),
        ((2, 3, 3, 8), (2, 2, 10, 8), "multiple of Hkv"),
        ((2, 4, 3, 8), (2, 2, 10, 4), "D = 8"),
        ((2, 4, 3, 8), (3, 2, 10, 8), "R = 2"),
    ],
)
def test_bad_shapes_name_the_problem(q_shape, kv_shape, message):
    with pytest.raises(ValueError, match=message):
        block_attention(torch.randn(q_shape), torch.randn(kv_shape), torch.randn(kv_shape), torch.zeros(2, dtype=torch.int64))


def test_empty_block_gives_empty_output():
    q = torch.randn(2, 4, 0, 8)
    kv = torch.randn(2, 2, 10, 8)
    out = block_attention(q, kv, kv, torch.tensor([3, 5]), backend="triton")
    assert out.shape == (2, 4, 0, 8)


def test_triton_fp16(poisoned_outputs):
    q, k_cache, v_cache, prefix_lens = random_case(2, 4, 2, 5, 80, 32, torch.float16)
    out = block_attention(q, k_cache, v_cache, prefix_lens, backend="triton")
    expected = reference(q.float(), k_cache.float(), v_cache.float(), prefix_lens)
    torch.testing.assert_close(out.float(), expected, rtol=1e-2, atol=1e-2)


def test_reference_bf16_keeps_large_scores_precise():
    """Keys and queries that share a large component (as real models' do) give raw scores in
    the thousands that differ by a few units; rounded to bf16 (steps of 16-32 there) those
    differences vanish. This broke the bf16 engine's answers until scores were kept in fp32."""
    q, k_cache, v_cache, prefix_lens = random_case(2, 6, 2, 5, 60, 64)
    shared = torch.randn(64)
    q, k_cache = q + 4 * shared, k_cache + 20 * shared
    q16, k16, v16 = q.bfloat16(), k_cache.bfloat16(), v_cache.bfloat16()
    expected = looped_oracle(q16.float(), k16.float(), v16.float(), prefix_lens).float()
    out = reference(q16, k16, v16, prefix_lens).float()
    torch.testing.assert_close(out, expected, rtol=3e-2, atol=3e-2)
