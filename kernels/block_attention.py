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


def check_prefix_lens(prefix_lens: torch.Tensor | list[int], block_len: int, cache_len: int) -> None:
    """Every block must fit in the cache: 0 <= prefix_lens[r] and prefix_lens[r] + Bq <= L.
    Reads the values, so on a GPU tensor it waits for the device."""
    values = prefix_lens.tolist() if isinstance(prefix_lens, torch.Tensor) else prefix_lens
    if not values:
        return
    low, high = min(values), max(values)
    if low < 0 or high + block_len > cache_len:
        raise ValueError(
            f"block_attention: prefix_lens must lie in [0, L - Bq] = [0, {cache_len - block_len}], "
            f"got values in [{low}, {high}]"
        )


def grouped_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None,
                      scale: float | None = None) -> torch.Tensor:
    """One sequence's grouped-query attention: q [T, Hq, D] against keys/values [Hkv, L, D],
    mask [T, L] bool (True = may attend) or None -> [T, Hq*D]."""
    return batched_grouped_attention(q[None], keys[None], values[None], None if mask is None else mask[None], scale)[0]


def batched_grouped_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None,
                              scale: float | None = None) -> torch.Tensor:
    """Grouped-query attention of S sequences padded to one shape: q [S, T, Hq, D] against
    keys/values [S, Hkv, L, D], mask [S, T, L] bool (True = may attend; every row must see a
    key) or None -> [S, T, Hq*D].

    Batched matmuls with the query heads of a KV group stacked, because at the engine's sizes (a
    few to a few dozen queries) torch's CPU flash-attention kernel costs ~20 ms a call
    (measured), an order of magnitude more than this. Scores and softmax in float32."""
    seqs, tokens, q_heads, dim = q.shape
    kv_heads, length = keys.shape[1], keys.shape[2]
    group = q_heads // kv_heads
    scale = scale if scale is not None else dim**-0.5
    stacked = (q.reshape(seqs, tokens, kv_heads, group, dim).permute(0, 2, 3, 1, 4)
               .reshape(seqs * kv_heads, group * tokens, dim))
    # scores in float32 even for bf16 inputs: attention-sink logits are large, and a bf16
    # score (8 mantissa bits) rounded them enough to turn SmolLM2's answers to nonsense
    scores = torch.bmm(stacked.float(), keys.reshape(seqs * kv_heads, length, dim).float().transpose(1, 2)) * scale
    if mask is not None:
        hidden = ~mask[:, None, None].expand(seqs, kv_heads, group, tokens, length)
        scores = scores.masked_fill(hidden.reshape(seqs * kv_heads, group * tokens, length), float("-inf"))
    out = torch.bmm(torch.softmax(scores, dim=-1).to(values.dtype), values.reshape(seqs * kv_heads, length, dim))
    return out.reshape(seqs, kv_heads, group, tokens, dim).permute(0, 3, 1, 2, 4).reshape(seqs, tokens, q_heads * dim)


def reference(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, prefix_lens: torch.Tensor,
    scale: float | None = None,
) -> torch.Tensor:
    """`grouped_attention` per row over exactly its visible cache slice.

    Slicing instead of a padding mask: a mask still multiplies the hidden positions' values
    by zero, so stale NaN/inf left in an unused cache region would leak into the output;
    slices never touch that region, and no row needs a mask at all."""
    check_inputs(q, k_cache, v_cache, prefix_lens)
    return _reference_checked(q, k_cache, v_cache, prefix_lens, scale)


def _reference_checked(q, k_cache, v_cache, prefix_lens, scale):
    """`reference` on inputs check_inputs has passed (the engine calls this every layer)."""
    rows, q_heads, block_len, head_dim = q.shape
    prefixes = prefix_lens.tolist()
    check_prefix_lens(prefixes, block_len, k_cache.shape[2])
    if q.numel() == 0:
        return torch.empty_like(q)
    outputs = []
    for row, prefix in enumerate(prefixes):
        visible = prefix + block_len
        attended = grouped_attention(q[row].transpose(0, 1), k_cache[row, :, :visible], v_cache[row, :, :visible],
                                     None, scale)
        outputs.append(attended.view(block_len, q_heads, head_dim).transpose(0, 1))
    return torch.stack(outputs)


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
        return _reference_checked(q, k_cache, v_cache, prefix_lens, scale)
    if prefix_lens.device.type == "cpu":
        check_prefix_lens(prefix_lens, q.shape[2], k_cache.shape[2])
    from kernels.triton_ops.block_attention import run_block_attention

    head_dim = q.shape[3]
    return run_block_attention(
        q, k_cache, v_cache, prefix_lens.to(q.device, non_blocking=True),
        scale if scale is not None else 1.0 / math.sqrt(head_dim),
    )
