"""Attention of one query block per request in block diffusion.

Request r's query block sits at positions prefix_lens[r] .. prefix_lens[r] + Bq - 1, and the
block's own keys and values are already written into the cache there. A query sees every
cache position before its block (causal across blocks) and its whole block (bidirectional
inside it), nothing at or after prefix_lens[r] + Bq. So for every query of row r the visible
keys are exactly cache positions [0, prefix_lens[r] + Bq). Query head h reads key/value head
h // (Hq / Hkv) (grouped-query attention).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from kernels.dispatch import Backend, resolve_backend


def check_inputs(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, prefix_lens: torch.Tensor) -> None:
    """Raise ValueError naming the bad argument (shapes, dtypes, devices; not the values)."""
    if q.dim() != 4:
        raise ValueError(f"block_attention: q must be [R, Hq, Bq, D], got shape {tuple(q.shape)}")
    if k_cache.dim() != 4:
        raise ValueError(f"block_attention: k_cache must be [R, Hkv, L, D], got shape {tuple(k_cache.shape)}")
    if v_cache.shape != k_cache.shape:
        raise ValueError(
            f"block_attention: v_cache shape {tuple(v_cache.shape)} differs from k_cache "
            f"shape {tuple(k_cache.shape)}"
        )
    rows, q_heads, _, head_dim = q.shape
    if k_cache.shape[0] != rows or k_cache.shape[3] != head_dim:
        raise ValueError(
            f"block_attention: k_cache {tuple(k_cache.shape)} must have R = {rows} and "
            f"D = {head_dim} like q {tuple(q.shape)}"
        )
    kv_heads = k_cache.shape[1]
    if kv_heads == 0 or q_heads % kv_heads != 0:
        raise ValueError(f"block_attention: Hq = {q_heads} must be a multiple of Hkv = {kv_heads}")
    if not q.dtype.is_floating_point or k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise ValueError(
            f"block_attention: q, k_cache, v_cache must share one floating dtype, got "
            f"{q.dtype}, {k_cache.dtype}, {v_cache.dtype}"
        )
    if k_cache.device != q.device or v_cache.device != q.device:
        raise ValueError(
            f"block_attention: devices differ, q {q.device}, k_cache {k_cache.device}, "
            f"v_cache {v_cache.device}"
        )
    if prefix_lens.shape != (rows,):
        raise ValueError(f"block_attention: prefix_lens must be [R] = [{rows}], got {tuple(prefix_lens.shape)}")
    if prefix_lens.dtype.is_floating_point or prefix_lens.dtype == torch.bool:
        raise ValueError(f"block_attention: prefix_lens must be integer, got {prefix_lens.dtype}")


def check_prefix_lens(prefix_lens: torch.Tensor, block_len: int, cache_len: int) -> None:
    """Every block must fit in the cache: 0 <= prefix_lens[r] and prefix_lens[r] + Bq <= L.
    Reads the values, so on a GPU tensor it waits for the device."""
    if prefix_lens.numel() == 0:
        return
    low, high = int(prefix_lens.min()), int(prefix_lens.max())
    if low < 0 or high + block_len > cache_len:
        raise ValueError(
            f"block_attention: prefix_lens must lie in [0, L - Bq] = [0, {cache_len - block_len}], "
            f"got values in [{low}, {high}]"
        )


def reference(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, prefix_lens: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """scaled_dot_product_attention per row over exactly its visible cache slice.

    Slicing instead of a padding mask: a mask still multiplies the hidden positions' values
    by zero, so stale NaN/inf left in an unused cache region would leak into the output;
    slices never touch that region, and each call runs without a mask (the fast path)."""
    check_inputs(q, k_cache, v_cache, prefix_lens)
    rows, q_heads, block_len, head_dim = q.shape
    check_prefix_lens(prefix_lens, block_len, k_cache.shape[2])
    out = torch.empty_like(q)
    if q.numel() == 0:
        return out
    scale = scale if scale is not None else 1.0 / math.sqrt(head_dim)
    grouped = k_cache.shape[1] != q_heads
    for row, prefix in enumerate(prefix_lens.tolist()):
        visible = prefix + block_len
        out[row] = F.scaled_dot_product_attention(
            q[row:row + 1], k_cache[row:row + 1, :, :visible], v_cache[row:row + 1, :, :visible],
            scale=scale, enable_gqa=grouped,
        )[0]
    return out


def block_attention(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, prefix_lens: torch.Tensor,
    scale: float | None = None, *, backend: Backend = "auto",
) -> torch.Tensor:
    """[R, Hq, Bq, D] attention output of each row's query block over cache positions
    [0, prefix_lens[r] + Bq). scale defaults to 1/sqrt(D).

    prefix_lens on the CPU is bounds-checked; on the GPU the Triton path skips the check (it
    would wait for the device every layer) and clamps the visible length to the cache."""
    check_inputs(q, k_cache, v_cache, prefix_lens)
    if resolve_backend(backend, q.device, "block_attention") == "reference":
        return reference(q, k_cache, v_cache, prefix_lens, scale)
    if prefix_lens.device.type == "cpu":
        check_prefix_lens(prefix_lens, q.shape[2], k_cache.shape[2])
    from kernels.triton_ops.block_attention import run_block_attention

    head_dim = q.shape[3]
    return run_block_attention(
        q, k_cache, v_cache, prefix_lens.to(q.device, non_blocking=True),
        scale if scale is not None else 1.0 / math.sqrt(head_dim),
    )
