"""Turning logits into a candidate token and its confidence for each predicted position."""

from __future__ import annotations

import torch
from torch import Tensor


def pick_tokens(logits: Tensor, temperature: float, generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
    """Returns (token [N], confidence [N]): greedy argmax and its probability, or a sample
    at `temperature` and the sample's probability (Gumbel-max in float64, as LLaDA does)."""
    logits = logits.float()
    if temperature <= 0:
        probs = torch.softmax(logits, dim=-1)
        confidence, token = probs.max(dim=-1)
        return token, confidence
    scaled = logits.double() / temperature
    # drawn on the host: the same seed samples the same tokens on every device
    noise = torch.rand(scaled.shape, generator=generator, dtype=torch.float64).to(scaled.device)
    token = (scaled - torch.log(-torch.log(noise.clamp_min(1e-300)))).argmax(dim=-1)
    probs = torch.softmax(scaled, dim=-1)
    return token, probs.gather(-1, token.unsqueeze(-1)).squeeze(-1).float()
