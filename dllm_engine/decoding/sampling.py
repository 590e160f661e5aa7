"""Turning logits into a candidate token and its confidence for each predicted position."""

from __future__ import annotations

import torch
from torch import Tensor


_MIX = 0x9E3779B97F4A7C15  # an odd 64-bit constant: each position's seed far from its neighbours'


def pick_tokens(logits: Tensor, temperature: float, generator: torch.Generator | None,
                positions: list[int | None] | None = None) -> tuple[Tensor, Tensor]:
    """Returns (token [N], confidence [N]): greedy argmax and its probability, or a sample
    at `temperature` and the sample's probability (Gumbel-max in float64, as LLaDA does).

    positions[i], where given and not None: row i predicts the next token after that position
    of its request, and its noise is drawn for that position alone (from the generator's seed
    and the position), so the token sampled there is the same however many rows the pass had
    and whichever drafts came before: a seeded exact-diffusion reply is the seeded AR reply,
    alone or batched. Other rows (a masked block's) draw from the generator in turn."""
    logits = logits.float()
    if temperature <= 0:
        probs = torch.softmax(logits, dim=-1)
        confidence, token = probs.max(dim=-1)
        return token, confidence
    scaled = logits.double() / temperature
    # drawn on the host: the same seed samples the same tokens on every device
    noise = torch.rand(scaled.shape, generator=generator, dtype=torch.float64)
    seed = generator.initial_seed() if generator is not None else torch.initial_seed()
    for row, position in enumerate(positions or []):
        if position is not None:
            keyed = torch.Generator().manual_seed((seed ^ ((position + 1) * _MIX)) % 2**64)
            noise[row] = torch.rand(scaled.shape[-1], generator=keyed, dtype=torch.float64)
    noise = noise.to(scaled.device)
    token = (scaled - torch.log(-torch.log(noise.clamp_min(1e-300)))).argmax(dim=-1)
    probs = torch.softmax(scaled, dim=-1)
    return token, probs.gather(-1, token.unsqueeze(-1)).squeeze(-1).float()
