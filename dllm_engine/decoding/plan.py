"""A step plan: the segments one request adds to the next packed forward pass, and which
rows of them predict which positions of the block being drafted."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

from dllm_engine.models.transformer import Segment


@dataclass(frozen=True)
class Target:
    segment: int  # index into StepPlan.segments
    row: int  # row inside that segment whose logits predict...
    position: int  # ...this position of the current block
    forced: bool = False  # commit whatever the confidence (an exact autoregressive prediction)
    # a draft check: this row's input at position-1 was the draft token `given`; when the
    # tokens settled up to there match every draft fed so far, the prediction is exact
    given: int | None = None


@dataclass
class StepPlan:
    segments: list[Segment] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    # rows (of the plan's packed segments) whose tapped hidden states a draft head needs; the
    # runner fills `taps` [len(tap_rows), taps * hidden] after the pass
    tap_rows: list[int] = field(default_factory=list)
    taps: Tensor | None = None
    # how many of the decoder's unwritten tokens this pass writes (all, unless a long prompt
    # prefills in chunks: then a chunk, and nothing is predicted)
    writes: int = 0

    @property
    def is_prefill_chunk(self) -> bool:
        """A chunk of a long prompt: written, nothing predicted yet."""
        return self.writes > 0 and not self.targets
