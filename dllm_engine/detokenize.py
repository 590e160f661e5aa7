"""Text of a growing token sequence without decoding it whole at every step.

A reply's committed tokens only grow, so its text is kept as a stable part (the decode of a
prefix, final) plus the decode of the few tokens after it: each update decodes a short tail,
not the whole reply (which made publishing O(n^2) on the engine thread). The stable prefix
stops a few tokens short of the end and never inside a multi-byte character, so joining the
parts gives exactly what decoding the whole sequence gives (tests/engine/test_detokenize.py).
"""

from __future__ import annotations

from typing import Callable

TAIL_TOKENS = 6  # tokens kept out of the stable part (a character or a word may span several)


class IncrementalText:
    def __init__(self, decode: Callable[[list[int]], str]):
        self._decode = decode
        self._stable_ids: list[int] = []
        self._stable_text = ""

    def text(self, ids: list[int]) -> str:
        """The decode of `ids`, which must extend the ids of earlier calls' stable part."""
        stable = len(self._stable_ids)
        if ids[:stable] != self._stable_ids:  # not an extension (a different sequence): start over
            self._stable_ids, self._stable_text, stable = [], "", 0
        tail = self._decode(ids[stable:])
        if len(ids) - stable > 2 * TAIL_TOKENS:
            self._advance(ids, len(ids) - TAIL_TOKENS)
            tail = self._decode(ids[len(self._stable_ids):])
        return self._stable_text + tail

    def extended(self, ids: list[int], more: list[int]) -> str:
        """The decode of ids + more (a draft past the committed tokens), without moving the stable part."""
        stable = len(self._stable_ids)
        if ids[:stable] != self._stable_ids:
            return self._decode(ids + more)
        return self._stable_text + self._decode(ids[stable:] + more)

    def _advance(self, ids: list[int], until: int) -> None:
        stable = len(self._stable_ids)
        piece = self._decode(ids[stable:until])
        if "\ufffd" in piece[-1:]:  # the cut falls inside a character: keep it for later
            return
        rest, whole = self._decode(ids[until:until + TAIL_TOKENS]), self._decode(ids[stable:until + TAIL_TOKENS])
        if piece + rest != whole:  # the decoder joins across this cut (spaces, cleanup): not a safe cut
            return
        self._stable_ids = list(ids[:until])
        self._stable_text += piece
