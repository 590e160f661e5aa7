"""Triton kernels for `kernels.head_confidence`: split-vocabulary online softmax.

A step's handful of masked positions (N ~ 16-64) against a 49k-152k vocabulary is bound by
reading the weight once, so the vocabulary is split across many programs: each program
reduces its slice to partial (max, sum, weighted sum, argmax) per row, and a second tiny
kernel merges the slices. Neither writes the [N, V] logits.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from kernels.triton_ops import dot_options

BLOCK_V = 128  # vocabulary rows per tile
BLOCK_H = 64  # hidden features per dot-product step
INTERPRETER_SPLITS = 4  # enough to exercise the merge without slowing the interpreter


@triton.jit
def _slice_stats_kernel(
    hidden_ptr, weight_ptr, max_ptr, sum_ptr, wsum_ptr, arg_ptr,
    rows, vocab, hidden_size, split_cols, num_splits, temperature,
    stride_hn, stride_hh, stride_wv, stride_wh,
    BLOCK_N: tl.constexpr, BLOCK_V: tl.constexpr, BLOCK_H: tl.constexpr,
    DOT_PRECISION: tl.constexpr, UPCAST_DOT: tl.constexpr,
):
    pid_n = tl.program_id(0)
    split = tl.program_id(1)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = offs_n < rows
    run_max = tl.full([BLOCK_N], float("-inf"), tl.float32)
    run_sum = tl.zeros([BLOCK_N], tl.float32)
    run_wsum = tl.zeros([BLOCK_N], tl.float32)
    run_arg = tl.zeros([BLOCK_N], tl.int64)
    v_begin = split * split_cols
    v_end = tl.minimum(v_begin + split_cols, vocab)
    for v0 in range(v_begin, v_end, BLOCK_V):
        offs_v = v0 + tl.arange(0, BLOCK_V)
        col_ok = offs_v < v_end
        acc = tl.zeros([BLOCK_N, BLOCK_V], tl.float32)
        for h0 in range(0, hidden_size, BLOCK_H):
            offs_h = h0 + tl.arange(0, BLOCK_H)
            h_ok = offs_h < hidden_size
            x = tl.load(hidden_ptr + offs_n[:, None] * stride_hn + offs_h[None, :] * stride_hh,
                        mask=row_ok[:, None] & h_ok[None, :], other=0.0)
            # int64 row offsets: a 256k x 8192 head has more elements than int32 counts.
            w = tl.load(weight_ptr + offs_v[None, :].to(tl.int64) * stride_wv + offs_h[:, None] * stride_wh,
                        mask=col_ok[None, :] & h_ok[:, None], other=0.0)
            if UPCAST_DOT:
                x = x.to(tl.float32)
                w = w.to(tl.float32)
            acc = tl.dot(x, w, acc, input_precision=DOT_PRECISION)
        logits = tl.where(col_ok[None, :], acc / temperature, float("-inf"))
        tile_max = tl.max(logits, axis=1)
        tile_arg = tl.argmax(logits, axis=1, tie_break_left=True).to(tl.int64) + v0
        new_max = tl.maximum(run_max, tile_max)
        # Strictly greater: an earlier tile (lower token id) keeps the argmax on ties.
        run_arg = tl.where(tile_max > run_max, tile_arg, run_arg)
        # Rescale the running sums to the new max (Z' = e^shift * (Z + S * shift)); before
        # the first tile S = 0 and run_max = -inf, kept out of the arithmetic.
        started = run_sum > 0
        shift = tl.where(started, run_max - new_max, 0.0)
        rescale = tl.where(started, tl.exp(shift), 0.0)
        run_wsum = rescale * (run_wsum + run_sum * shift)
        run_sum = run_sum * rescale
        centred = tl.where(col_ok[None, :], logits - new_max[:, None], 0.0)
        probs = tl.where(col_ok[None, :], tl.exp(centred), 0.0)
        run_sum += tl.sum(probs, axis=1)
        run_wsum += tl.sum(probs * centred, axis=1)
        run_max = new_max
    out = offs_n * num_splits + split
    tl.store(max_ptr + out, run_max, mask=row_ok)
    tl.store(sum_ptr + out, run_sum, mask=row_ok)
    tl.store(wsum_ptr + out, run_wsum, mask=row_ok)
    tl.store(arg_ptr + out, run_arg, mask=row_ok)


@triton.jit
def _merge_slices_kernel(
    max_ptr, sum_ptr, wsum_ptr, arg_ptr, token_ptr, prob_ptr, entropy_ptr, num_splits,
    BLOCK_S: tl.constexpr,
):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK_S)
    ok = offs < num_splits
    base = row * num_splits + offs
    part_max = tl.load(max_ptr + base, mask=ok, other=float("-inf"))
    part_sum = tl.load(sum_ptr + base, mask=ok, other=0.0)
    part_wsum = tl.load(wsum_ptr + base, mask=ok, other=0.0)
    part_arg = tl.load(arg_ptr + base, mask=ok, other=0)
    row_max = tl.max(part_max, axis=0)
    shift = tl.where(ok, part_max - row_max, 0.0)
    rescale = tl.where(ok, tl.exp(shift), 0.0)
    total = tl.sum(part_sum * rescale, axis=0)
    wsum = tl.sum(rescale * (part_wsum + part_sum * shift), axis=0)
    # Slices are in vocabulary order: the first slice reaching the max has the lowest id.
    first = tl.min(tl.where(ok & (part_max == row_max), offs, BLOCK_S), axis=0)
    token = tl.sum(tl.where(offs == first, part_arg, 0), axis=0)
    tl.store(token_ptr + row, token)
    tl.store(prob_ptr + row, 1.0 / total)
    tl.store(entropy_ptr + row, tl.log(total) - wsum / total)


@functools.cache
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def _split_count(device: torch.device, n_blocks: int, tiles: int) -> int:
    """Enough vocabulary slices that all SMs have about two programs."""
    if device.type == "cuda":
        wanted = max(1, (2 * _sm_count(device)) // n_blocks)
    else:
        wanted = INTERPRETER_SPLITS
    return max(1, min(wanted, tiles))


def run_confidence_head(
    hidden: torch.Tensor, weight: torch.Tensor, temperature: float, num_splits: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the two kernels; inputs are already checked by the caller."""
    rows, hidden_size = hidden.shape
    vocab = weight.shape[0]
    device = hidden.device
    token = torch.empty(rows, dtype=torch.int64, device=device)
    prob = torch.empty(rows, dtype=torch.float32, device=device)
    entropy = torch.empty(rows, dtype=torch.float32, device=device)
    if rows == 0:
        return token, prob, entropy
    block_n = min(64, max(16, triton.next_power_of_2(rows)))
    n_blocks = triton.cdiv(rows, block_n)
    tiles = triton.cdiv(vocab, BLOCK_V)
    wanted = num_splits if num_splits is not None else _split_count(device, n_blocks, tiles)
    split_cols = triton.cdiv(tiles, max(1, min(wanted, tiles))) * BLOCK_V
    splits = triton.cdiv(vocab, split_cols)  # every slice has at least one column
    part_max = torch.empty(rows, splits, dtype=torch.float32, device=device)
    part_sum = torch.empty_like(part_max)
    part_wsum = torch.empty_like(part_max)
    part_arg = torch.empty(rows, splits, dtype=torch.int64, device=device)
    _slice_stats_kernel[(n_blocks, splits)](
        hidden, weight, part_max, part_sum, part_wsum, part_arg,
        rows, vocab, hidden_size, split_cols, splits, float(temperature),
        hidden.stride(0), hidden.stride(1), weight.stride(0), weight.stride(1),
        BLOCK_N=block_n, BLOCK_V=BLOCK_V, BLOCK_H=BLOCK_H, **dot_options(hidden.dtype),
    )
    _merge_slices_kernel[(rows,)](
        part_max, part_sum, part_wsum, part_arg, token, prob, entropy, splits,
        BLOCK_S=max(16, triton.next_power_of_2(splits)),
    )
    return token, prob, entropy
