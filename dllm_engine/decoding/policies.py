"""Commit policies: given the confidences of a block's still-masked positions, which to commit.

Every policy commits at least one position a step, so a block always finishes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class ThresholdPolicy:
    """Fast-dLLM: commit every masked position whose confidence reaches the threshold, and
    when none does, the single most confident one, or with fallback="leftmost" the first
    masked position: for models adapted from an AR model (ours) the position right after
    the committed text is the one predicted best, so that is where a slow step should go.
    Positions arrive in block order."""

    threshold: float
    fallback: str = "most_confident"

    def select(self, confidence: Tensor, steps_left: int | None = None, threshold: float | None = None,
               at_least_one: bool = True) -> Tensor:
        tau = self.threshold if threshold is None else threshold
        chosen = confidence >= tau
        if at_least_one:
            chosen[0 if self.fallback == "leftmost" else confidence.argmax()] = True
        return chosen


@dataclass
class FactorPolicy:
    """Fast-dLLM's factor rule: the k-th most confident (k from 1) is committed while
    its probability stays >= 1 - factor / (k + 1)."""

    factor: float

    def select(self, confidence: Tensor, steps_left: int | None = None, threshold: float | None = None,
               at_least_one: bool = True) -> Tensor:
        order = confidence.argsort(descending=True)
        ranks = torch.arange(1, confidence.numel() + 1, dtype=confidence.dtype)
        passes = confidence[order] >= 1.0 - self.factor / (ranks + 1)
        count = max(1, int(passes.int().cumprod(0).sum()))
        chosen = torch.zeros_like(confidence, dtype=torch.bool)
        chosen[order[:count]] = True
        return chosen


@dataclass
class FixedStepsPolicy:
    """LLaDA's schedule: a fixed number of steps per block, the most confident ones committed
    each step (an even share of what is left), the rest stay masked (low-confidence remasking)."""

    steps_per_block: int

    def select(self, confidence: Tensor, steps_left: int | None = None, threshold: float | None = None,
               at_least_one: bool = True) -> Tensor:
        steps_left = max(1, steps_left if steps_left is not None else 1)
        count = max(1, math.ceil(confidence.numel() / steps_left))
        chosen = torch.zeros_like(confidence, dtype=torch.bool)
        chosen[confidence.topk(min(count, confidence.numel())).indices] = True
        return chosen


CommitPolicy = ThresholdPolicy | FactorPolicy | FixedStepsPolicy


def make_policy(name: str, threshold: float, factor: float, steps_per_block: int | None, block_size: int,
                fallback: str = "most_confident") -> CommitPolicy:
    if name == "threshold":
        return ThresholdPolicy(threshold, fallback)
    if name == "factor":
        return FactorPolicy(factor)
    if name == "fixed_steps":
        return FixedStepsPolicy(steps_per_block or max(1, block_size // 2))
    raise ValueError(f"unknown commit policy {name!r}; known: threshold, factor, fixed_steps")
