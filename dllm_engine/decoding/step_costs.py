"""What a draft-head decoding step costs on this machine, by how many rows and requests share
its passes: the figures `DraftChooser` weighs drafts against (decoding/suffix_drafts.py).

A pass's rows are not free, and what one more row costs depends on the rows already there: on
two CPU cores a pass of 4 rows costs about what one row does, one of 32 several times more. So
a request's drafts are worth checking alone and not in a batch of eight, where every request's
drafts share one pass. `share()` is one request's part of a batch's step when every request in
it checks the same number of drafts; the chooser compares those parts. `SearchValue` weighs the
chooser's own search for continuations against what it saves, per batch size.
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
    """verify[b]: seconds of a verify pass of b requests by the rows each carries (its exact token
    and drafts), for the batch sizes timed; context: the head taking one request's verified rows
    (every step pays it, drafts or not); head: seconds of the head's block pass by the requests
    it drafts for. `timed` is False for the defaults, which only say rows are free and the
    head's pass costs a third of a verify pass (Engine.choose_block times them)."""

    verify: dict[int, list[tuple[int, float]]] = field(default_factory=lambda: {1: [(1, 1.0)]})
    context: float = 0.0
    head: list[tuple[int, float]] = field(default_factory=lambda: [(1, 0.33)])
    timed: bool = False
    _shares: dict = field(default_factory=dict, init=False, repr=False, compare=False)  # asked every step

    @classmethod
    def one_request(cls, verify_by_drafts: list[float], head: float, context: float = 0.0) -> "StepCosts":
        """Costs from one request's timings: verify_by_drafts[k] for the exact token and k drafts."""
        return cls({1: [(drafts + 1, s) for drafts, s in enumerate(verify_by_drafts)]}, context, [(1, head)], timed=True)

    def share(self, batch: int, drafts: int) -> float:
        """One request's part of its step's verify pass when each of the `batch` requests in the
        pass checks `drafts` drafts, and its context for the head: between the batch sizes
        timed, interpolated; past the largest, that size's part (a pass that large is bound by
        its arithmetic, a row costs the same whoever it belongs to)."""
        key = (batch, drafts)
        if key not in self._shares:
            sizes = sorted(self.verify)
            parts = [(size, interpolate(self.verify[size], 1 + drafts) / size) for size in sizes]
            self._shares[key] = interpolate(parts, min(max(batch, sizes[0]), sizes[-1])) + self.context
        return self._shares[key]

    def head_share(self, batch: int) -> float:
        """One request's part of the head's block pass that drafts for `batch` requests."""
        return interpolate(self.head, batch) / batch


LOOK_EVERY = 8  # where looking does not pay, one step in this many still looks (the odds move)
SMOOTHING = 0.05  # weight of each new look in the running averages


@dataclass
class SearchValue:
    """Whether looking for a continuation pays for the looking, by batch size. The search is
    Python over the request's tokens and the corpus (0.2-0.5 ms a request a step), paid by every
    request every step; in a large batch a continuation seldom beats checking no drafts by much
    (measured with four and eight requests: the search cost 12-15 % of a step and bought 0-3 %).
    Each look's cost and what it saved are averaged per batch size: the seconds the best other
    option would have needed for the tokens the continuation's verify pass kept, less the
    continuation's own share of that pass (0 where no continuation was chosen). Where the
    saving is below the cost, one step in LOOK_EVERY still looks."""

    spent: dict[int, float] = field(default_factory=dict)
    saved: dict[int, float] = field(default_factory=dict)
    passed: dict[int, int] = field(default_factory=dict)  # looks skipped since the last one

    def worth_looking(self, batch: int) -> bool:
        if batch not in self.spent or batch not in self.saved or self.saved[batch] >= self.spent[batch]:
            return True
        self.passed[batch] = self.passed.get(batch, 0) + 1
        if self.passed[batch] < LOOK_EVERY:
            return False
        self.passed[batch] = 0
        return True

    def record_spent(self, batch: int, seconds: float) -> None:
        _smooth(self.spent, batch, seconds)

    def record_saved(self, batch: int, seconds: float) -> None:
        _smooth(self.saved, batch, seconds)


def _smooth(averages: dict[int, float], key: int, value: float) -> None:
    averages[key] = value if key not in averages else averages[key] + SMOOTHING * (value - averages[key])
