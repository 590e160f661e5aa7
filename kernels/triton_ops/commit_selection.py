"""Triton kernel for `kernels.commit_selection`: one program per request row, one launch
for the whole batch, optionally writing the committed tokens and clearing the mask."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _select_commits_kernel(
    conf_ptr, masked_ptr, threshold_ptr, force_ptr, commit_ptr, tokens_ptr, candidates_ptr,
    block_len, stride_cr, stride_cb, stride_mr, stride_mb, stride_tr, stride_tb,
    stride_kr, stride_kb,
    BLOCK_B: tl.constexpr, WRITE_TOKENS: tl.constexpr, HAS_FORCE: tl.constexpr,
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
    if WRITE_TOKENS:
        token_at = tokens_ptr + row * stride_tr + offs * stride_tb
        candidate = tl.load(candidates_ptr + row * stride_kr + offs * stride_kb, mask=in_block & commit)
        tl.store(token_at, candidate, mask=in_block & commit)
        tl.store(masked_ptr + row * stride_mr + offs * stride_mb, masked & ~commit, mask=in_block)


def _launch(
    confidence: torch.Tensor, masked: torch.Tensor, threshold: torch.Tensor, force: torch.Tensor | None,
    tokens: torch.Tensor | None, candidates: torch.Tensor | None,
) -> torch.Tensor:
    rows, block_len = confidence.shape
    commit = torch.empty(rows, block_len, dtype=torch.bool, device=confidence.device)
    if commit.numel() == 0:
        return commit
    write_tokens = tokens is not None
    token_args = (tokens, candidates) if write_tokens else (commit, commit)  # unused placeholders
    token_strides = (
        (tokens.stride(0), tokens.stride(1), candidates.stride(0), candidates.stride(1))
        if write_tokens else (0, 0, 0, 0)
    )
    _select_commits_kernel[(rows,)](
        confidence, masked, threshold, force if force is not None else threshold, commit, *token_args,
        block_len, confidence.stride(0), confidence.stride(1), masked.stride(0), masked.stride(1),
        *token_strides,
        BLOCK_B=max(16, triton.next_power_of_2(block_len)), WRITE_TOKENS=write_tokens,
        HAS_FORCE=force is not None,
    )
    return commit


def run_select_commits(
    confidence: torch.Tensor, masked: torch.Tensor, threshold: torch.Tensor, force: torch.Tensor | None,
) -> torch.Tensor:
    """Inputs are already checked by the caller."""
    return _launch(confidence, masked, threshold, force, None, None)


def run_commit_tokens_(
    tokens: torch.Tensor, masked: torch.Tensor, candidate_tokens: torch.Tensor,
    confidence: torch.Tensor, threshold: torch.Tensor,
) -> torch.Tensor:
    """Inputs are already checked by the caller; tokens and masked are updated in place."""
    return _launch(confidence, masked, threshold, None, tokens, candidate_tokens)
