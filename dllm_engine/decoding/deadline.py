"""Deadline-aware decoding: lower the commit threshold as a reply falls behind its budget.

The controller compares the steps the remaining time still affords with the steps the
remaining tokens need at the pace seen so far; when short, it lowers the threshold in
proportion, down to 0 (commit a whole block a step) once the time is spent.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable


@dataclass
class DeadlineController:
    deadline_s: float
    base_threshold: float
    clock: Callable[[], float] = time.monotonic
    started: float = field(default=0.0)
    step_time_s: float | None = None  # moving average of a step's wall time
    _last_step_at: float | None = None

    def __post_init__(self) -> None:
        self.started = self.clock()

    def elapsed(self) -> float:
        return self.clock() - self.started

    def record_step(self) -> None:
        now = self.clock()
        if self._last_step_at is not None:
            spent = now - self._last_step_at
            self.step_time_s = spent if self.step_time_s is None else 0.7 * self.step_time_s + 0.3 * spent
        self._last_step_at = now

    def threshold(self, tokens_left: int, tokens_per_step: float) -> float:
        """The threshold for the next step, given an upper bound on the tokens still to
        commit and the tokens a step has committed so far at the base threshold."""
        time_left = self.deadline_s - self.elapsed()
        if time_left <= 0:
            return 0.0
        if not self.step_time_s or tokens_left <= 0:  # no pace measured yet (or a stopped clock)
            return self.base_threshold
        steps_affordable = time_left / self.step_time_s
        steps_needed = tokens_left / max(tokens_per_step, 1e-6)
        if steps_affordable >= steps_needed:
            return self.base_threshold
        return self.base_threshold * max(0.0, steps_affordable / steps_needed)

    def met(self) -> bool:
        return self.elapsed() <= self.deadline_s
