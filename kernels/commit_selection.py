"""Which masked positions a denoising step commits, for a whole batch in one call.

Per request row r of a block: commit every masked position whose confidence reaches
threshold[r], and always one forced position, so each step makes progress: by default the
most confident masked position (ties: lowest position); `force[r]` can instead ask for the
first masked position (for models adapted from an AR model, the one predicted best) or none
(the row already made progress elsewhere). A row with no masked position commits nothing.
Confidences are probabilities; NaN is not a valid confidence.
"""

from __future__ import annotations

import torch

from kernels.dispatch import Backend, resolve_backend

# values of `force`, per row: which masked position is committed whatever its confidence
FORCE_NONE, FORCE_BEST, FORCE_LEFTMOST = 0, 1, 2


def check_inputs(confidence: torch.Tensor, masked: torch.Tensor, threshold: torch.Tensor,
                 force: torch.Tensor | None = None) -> None:
    """Raise ValueError naming the bad argument."""
    if confidence.dim() != 2:
        raise ValueError(f"select_commits: confidence must be [R, B], got shape {tuple(confidence.shape)}")
    if not confidence.dtype.is_floating_point:
        raise ValueError(f"select_commits: confidence must be floating point, got {confidence.dtype}")
    if masked.shape != confidence.shape:
        raise ValueError(
            f"select_commits: masked shape {tuple(masked.shape)} differs from confidence "
            f"shape {tuple(confidence.shape)}"
        )
    if masked.dtype != torch.bool:
        raise ValueError(f"select_commits: masked must be torch.bool, got {masked.dtype}")
    if threshold.shape != (confidence.shape[0],):
        raise ValueError(
            f"select_commits: threshold must be [R] = [{confidence.shape[0]}], got shape "
            f"{tuple(threshold.shape)}"
        )
    if not threshold.dtype.is_floating_point:
        raise ValueError(f"select_commits: threshold must be floating point, got {threshold.dtype}")
    if force is not None:
        if force.shape != (confidence.shape[0],):
            raise ValueError(
                f"select_commits: force must be [R] = [{confidence.shape[0]}], got shape {tuple(force.shape)}"
            )
        if force.dtype.is_floating_point or force.dtype == torch.bool:
            raise ValueError(f"select_commits: force must be integer (FORCE_NONE/BEST/LEFTMOST), got {force.dtype}")
    for name, tensor in (("masked", masked), ("threshold", threshold), ("force", force)):
        if tensor is not None and tensor.device != confidence.device:
            raise ValueError(
                f"select_commits: {name} is on {tensor.device}, confidence on {confidence.device}"
            )


def reference(confidence: torch.Tensor, masked: torch.Tensor, threshold: torch.Tensor,
              force: torch.Tensor | None = None) -> torch.Tensor:
    """Plain torch: bool [R, B] of the positions to commit."""
    check_inputs(confidence, masked, threshold, force)
    if confidence.numel() == 0:
        return torch.zeros_like(masked)
    conf = confidence.float()
    masked_conf = torch.where(masked, conf, float("-inf"))
    best = masked_conf.amax(dim=1, keepdim=True)
    # First masked position reaching the best confidence (argmax of 0/1 returns the first 1).
    first_best = (masked & (conf == best)).to(torch.uint8).argmax(dim=1, keepdim=True)
    commit = masked & (conf >= threshold.float()[:, None])
    has_masked = masked.any(dim=1, keepdim=True)
    if force is None:
        return commit | torch.zeros_like(masked).scatter_(1, first_best, has_masked)
    first_masked = masked.to(torch.uint8).argmax(dim=1, keepdim=True)
    pick = torch.where(force[:, None] == FORCE_LEFTMOST, first_masked, first_best)
    forced = torch.zeros_like(masked).scatter_(1, pick, has_masked & (force[:, None] != FORCE_NONE))
    return commit | forced


def select_commits(
    confidence: torch.Tensor, masked: torch.Tensor, threshold: torch.Tensor, force: torch.Tensor | None = None,
    *, backend: Backend = "auto",
) -> torch.Tensor:
    """bool [R, B]: masked positions with confidence >= threshold[r], plus each row's forced
    position (force[r], default FORCE_BEST: its most confident masked position); nothing for
    rows without masked positions."""
    check_inputs(confidence, masked, threshold, force)
    if resolve_backend(backend, confidence.device, "select_commits") == "reference":
        return reference(confidence, masked, threshold, force)
    from kernels.triton_ops.commit_selection import run_select_commits

    return run_select_commits(confidence, masked, threshold, force)
