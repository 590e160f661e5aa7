"""Triton flash-attention kernel for `kernels.block_attention`.

One program per (row, key/value head, tile of queries). The query heads that share a
key/value head are packed into the tile's rows together with the block positions, so a
small block (4-32 queries) still fills the tile and each key/value tile is read once per group.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels.triton_ops import dot_options

BLOCK_N = 64  # keys per tile
LOG2_E = 1.4426950408889634


@triton.jit
def _block_attention_kernel(
    q_ptr, k_ptr, v_ptr, prefix_ptr, out_ptr,
    kv_heads, group, block_len, cache_len, head_dim, scale_log2,
    sq_r, sq_h, sq_b, sq_d, sk_r, sk_h, sk_l, sk_d, sv_r, sv_h, sv_l, sv_d,
    so_r, so_h, so_b, so_d,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    DOT_PRECISION: tl.constexpr, UPCAST_DOT: tl.constexpr,
):
    tile = tl.program_id(0)
    # int64: row * row stride overflows int32 for large batched caches.
    row = (tl.program_id(1) // kv_heads).to(tl.int64)
    kv_head = (tl.program_id(1) % kv_heads).to(tl.int64)
    offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    m_ok = offs_m < group * block_len
    q_head = kv_head * group + offs_m // block_len
    q_pos = offs_m % block_len
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < head_dim
    q = tl.load(q_ptr + row * sq_r + q_head[:, None] * sq_h + q_pos[:, None] * sq_b + offs_d[None, :] * sq_d,
                mask=m_ok[:, None] & d_ok[None, :], other=0.0)
    if UPCAST_DOT:
        q = q.to(tl.float32)
    prefix = tl.maximum(tl.load(prefix_ptr + row), 0)
    visible_len = tl.minimum(prefix + block_len, cache_len)
    run_max = tl.full([BLOCK_M], float("-inf"), tl.float32)
    run_sum = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    k_base = k_ptr + row * sk_r + kv_head * sk_h
    v_base = v_ptr + row * sv_r + kv_head * sv_h
    for n0 in range(0, visible_len, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_ok = offs_n < visible_len
        k = tl.load(k_base + offs_n[None, :] * sk_l + offs_d[:, None] * sk_d,
                    mask=n_ok[None, :] & d_ok[:, None], other=0.0)
        v = tl.load(v_base + offs_n[:, None] * sv_l + offs_d[None, :] * sv_d,
                    mask=n_ok[:, None] & d_ok[None, :], other=0.0)
        if UPCAST_DOT:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        scores = tl.dot(q, k, input_precision=DOT_PRECISION) * scale_log2
        scores = tl.where(n_ok[None, :], scores, float("-inf"))
        new_max = tl.maximum(run_max, tl.max(scores, axis=1))
        rescale = tl.exp2(run_max - new_max)  # 0 on the first tile
        probs = tl.exp2(scores - new_max[:, None])
        run_sum = run_sum * rescale + tl.sum(probs, axis=1)
        acc = tl.dot(probs.to(v.dtype), v, acc * rescale[:, None], input_precision=DOT_PRECISION)
        run_max = new_max
    out = acc / run_sum[:, None]
    tl.store(out_ptr + row * so_r + q_head[:, None] * so_h + q_pos[:, None] * so_b + offs_d[None, :] * so_d,
             out.to(out_ptr.dtype.element_ty), mask=m_ok[:, None] & d_ok[None, :])


def run_block_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, prefix_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Inputs are already checked by the caller; prefix_lens is on q's device."""
    rows, q_heads, block_len, head_dim = q.shape
    kv_heads, cache_len = k_cache.shape[1], k_cache.shape[2]
    out = torch.empty_like(q)
    if out.numel() == 0:
        return out
    group = q_heads // kv_heads
    block_m = min(64, max(16, triton.next_power_of_2(group * block_len)))
    grid = (triton.cdiv(group * block_len, block_m), rows * kv_heads)
    _block_attention_kernel[grid](
        q, k_cache, v_cache, prefix_lens, out,
        kv_heads, group, block_len, cache_len, head_dim, scale * LOG2_E,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *out.stride(),
        BLOCK_M=block_m, BLOCK_N=BLOCK_N, BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        **dot_options(q.dtype),
        # fp32 tiles are twice the bytes: 3 pipeline stages at D = 128 need 180 KB of shared
        # memory (over an A100's 164 KB); 2 stages need 115 KB.
        num_stages=2 if q.dtype == torch.float32 else 3,
    )
    return out
