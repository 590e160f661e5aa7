"""Triton kernel for `kernels.commit_selection`: one program per request row, one launch
for the whole batch."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _select_commits_kernel(
    conf_ptr, masked_ptr, threshold_ptr, force_ptr, commit_ptr,
    block_len, stride_cr, stride_cb, stride_mr, stride_mb,
    BLOCK_B: tl.constexpr, HAS_FORCE: tl.constexpr,
):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK_B)
    in_block = offs < block_len
    conf = tl.load(conf_ptr + row * stride_cr + offs * stride_cb, mask=in_block, other=0.0).to(tl.float32)
    masked = tl.load(masked_ptr + row * stride_mr + offs * stride_mb, mask=in_block, other=0) != 0
    threshold = tl.load(threshold_ptr + row).to(tl.float32)
    best = tl.max(tl.where(masked, conf, float("-inf")), axis=0)
    first_best = tl.min(tl.where(masked & (conf == best), offs, BLOCK_B), axis=0)
    # first_best == BLOCK_B (matches no position) when the row has nothing masked.
    pick = first_best
    if HAS_FORCE:  # 0 none, 1 most confident, 2 first masked (kernels.commit_selection.FORCE_*)
        force = tl.load(force_ptr + row)
        first_masked = tl.min(tl.where(masked, offs, BLOCK_B), axis=0)
        pick = tl.where(force == 2, first_masked, tl.where(force == 1, first_best, BLOCK_B))
    commit = masked & ((conf >= threshold) | (offs == pick))
    tl.store(commit_ptr + row * block_len + offs, commit, mask=in_block)


def run_select_commits(
    confidence: torch.Tensor, masked: torch.Tensor, threshold: torch.Tensor, force: torch.Tensor | None,
) -> torch.Tensor:
    """Inputs are already checked by the caller."""
    rows, block_len = confidence.shape
    commit = torch.empty(rows, block_len, dtype=torch.bool, device=confidence.device)
    if commit.numel() == 0:
        return commit
    _select_commits_kernel[(rows,)](
        confidence, masked, threshold, force if force is not None else threshold, commit,
        block_len, confidence.stride(0), confidence.stride(1), masked.stride(0), masked.stride(1),
        BLOCK_B=max(16, triton.next_power_of_2(block_len)), HAS_FORCE=force is not None,
    )
    return commit
