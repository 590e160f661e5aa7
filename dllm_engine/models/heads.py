"""Output-head helpers both passes share."""

from __future__ import annotations

import torch
from torch import Tensor


def split_head(hidden: Tensor, draft_rows: list[int], full, draft) -> tuple[Tensor, Tensor]:
    """A greedy head over hidden's rows: `draft` on draft_rows, `full` on the rest."""
    is_draft = torch.zeros(hidden.shape[0], dtype=torch.bool)
    is_draft[draft_rows] = True
    tokens = torch.empty(hidden.shape[0], dtype=torch.long)
    confidence = torch.empty(hidden.shape[0])
    for rows, head in ((~is_draft, full), (is_draft, draft)):
        if bool(rows.any()):
            tokens[rows], confidence[rows] = head(hidden[rows].contiguous())
    return tokens, confidence
