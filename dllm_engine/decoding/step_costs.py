"""What a draft-head decoding step costs on this machine, by how many rows and requests share
its passes: the figures `DraftChooser` weighs drafts against (decoding/suffix_drafts.py).

A pass's rows are not free, and what one more row costs depends on the rows already there: on
two CPU cores a pass of 4 rows costs about what one row does, one of 32 several times more. So
a request's drafts are worth checking alone and not in a batch of eight, where every request's
drafts share one pass. `share()` is one request's part of a batch's step when every request in
it checks the same number of drafts; the chooser compares those parts.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field


def interpolate(points: list[tuple[int, float]], x: int) -> float:
    """y at x on the polyline through points ((x, y), x ascending), extended at the ends by its
    first and last segments' slopes (a single point: flat)."""
    if len(points) == 1:
        return points[0][1]
    xs = [p[0] for p in points]
    i = min(max(bisect.bisect_left(xs, x), 1), len(points) - 1)
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    return max(0.0, y0 + (y1 - y0) * (x - x0) / (x1 - x0))


@dataclass
class StepCosts:
    """verify: seconds of a verify pass by the rows it carries (the exact tokens and drafts of
    every request in it); context: the head taking one request's verified rows (every step
    pays it, drafts or not); head: seconds of the head's block pass by the requests it drafts
    for. `timed` is False for the defaults, which only say rows are free and the head's pass
    costs a third of a verify pass (Engine.choose_block times them)."""

    verify: list[tuple[int, float]] = field(default_factory=lambda: [(1, 1.0)])
    context: float = 0.0
    head: list[tuple[int, float]] = field(default_factory=lambda: [(1, 0.33)])
    timed: bool = False
    _shares: dict = field(default_factory=dict, init=False, repr=False, compare=False)  # asked every step

    @classmethod
    def one_request(cls, verify_by_drafts: list[float], head: float, context: float = 0.0) -> "StepCosts":
        """Costs from one request's timings: verify_by_drafts[k] for the exact token and k drafts."""
        return cls([(drafts + 1, s) for drafts, s in enumerate(verify_by_drafts)], context, [(1, head)], timed=True)

    def share(self, batch: int, drafts: int) -> float:
        """One request's part of its step's verify pass when each of the `batch` requests in the
        pass checks `drafts` drafts, and its context for the head."""
        key = (batch, drafts)
        if key not in self._shares:
            self._shares[key] = interpolate(self.verify, batch * (1 + drafts)) / batch + self.context
        return self._shares[key]

    def head_share(self, batch: int) -> float:
        """One request's part of the head's block pass that drafts for `batch` requests."""
        return interpolate(self.head, batch) / batch
