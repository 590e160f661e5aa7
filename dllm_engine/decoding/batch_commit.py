"""One commit decision for a whole step's batch of requests.

After a packed forward pass every request whose block still has free (not forced) targets
needs its policy to pick which of them to commit. Threshold policies, the default, all go
through one `kernels.select_commits` call (one launch on a GPU, one host read of the result);
the other policies are rare and pick per request.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dllm_engine.decoding.policies import CommitPolicy, ThresholdPolicy
from kernels import FORCE_BEST, FORCE_LEFTMOST, FORCE_NONE, select_commits


@dataclass
class Choice:
    """One request's pending decision: confidences of its free targets, in block order."""

    policy: CommitPolicy
    confidence: Tensor
    threshold: float | None = None  # the deadline controller's override of the policy's own
    steps_left: int | None = None
    at_least_one: bool = True  # False when the step already committed a forced token


def choose_commits(choices: list[Choice]) -> list[list[bool]]:
    """For every choice, which of its free targets to commit."""
    chosen: list[list[bool] | None] = [None] * len(choices)
    batched = [i for i, c in enumerate(choices) if isinstance(c.policy, ThresholdPolicy) and c.confidence.numel()]
    for index, picks in zip(batched, _threshold_commits([choices[i] for i in batched])):
        chosen[index] = picks
    for index, choice in enumerate(choices):
        if not choice.confidence.numel():
            chosen[index] = []
        elif chosen[index] is None:
            chosen[index] = choice.policy.select(
                choice.confidence.clone(), choice.steps_left, choice.threshold, at_least_one=choice.at_least_one
            ).tolist()
    return chosen


def _threshold_commits(choices: list[Choice]) -> list[list[bool]]:
    if not choices:
        return []
    lengths = [c.confidence.numel() for c in choices]
    width = max(lengths)
    device = choices[0].confidence.device
    confidence = torch.zeros(len(choices), width, device=device)
    masked = torch.arange(width, device=device) < torch.tensor(lengths, device=device)[:, None]
    confidence[masked] = torch.cat([c.confidence.float() for c in choices])
    threshold = torch.tensor([c.policy.threshold if c.threshold is None else c.threshold for c in choices],
                             device=device)
    force = torch.tensor([_force(c) for c in choices], device=device)
    commits = select_commits(confidence, masked, threshold, force).tolist()
    return [row[:length] for row, length in zip(commits, lengths)]


def _force(choice: Choice) -> int:
    if not choice.at_least_one:
        return FORCE_NONE
    return FORCE_LEFTMOST if choice.policy.fallback == "leftmost" else FORCE_BEST
