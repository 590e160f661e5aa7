"""LocalAgreement-2: the stable prefix of a transcript that is re-decoded as the user speaks."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Partial:
    stable: str  # words two consecutive hypotheses agreed on; never shrinks within a turn
    unstable: str  # the rest of the newest hypothesis

    @property
    def text(self) -> str:
        return f"{self.stable} {self.unstable}".strip()


class LocalAgreement:
    """LocalAgreement-2: a word becomes stable once two consecutive hypotheses agree on it (and on
    every word before it). Stable words are never taken back within the utterance."""

    def __init__(self) -> None:
        self._stable: list[str] = []
        self._previous: list[str] = []

    def update(self, hypothesis: str) -> Partial:
        words = hypothesis.split()
        agreed = _common_prefix_len(self._previous, words)
        if agreed > len(self._stable) and _common_prefix_len(self._stable, words) == len(self._stable):
            self._stable = self._stable + words[len(self._stable) : agreed]  # keep settled spelling
        self._previous = words
        return Partial(" ".join(self._stable), " ".join(words[len(self._stable) :]))


def _normalise(word: str) -> str:
    return word.lower().strip(".,!?;:\"'")


def _common_prefix_len(a: list[str], b: list[str]) -> int:
    n = 0
    for x, y in zip(a, b):
        if _normalise(x) != _normalise(y):
            break
        n += 1
    return n
