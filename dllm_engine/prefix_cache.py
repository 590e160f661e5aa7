"""Reuse of the keys and values of recently ended requests for a new prompt that starts the same.

A voice session submits many prompts that share a long head: every speculative redraft repeats
the system prompt, the history and most of the user's words, and the next turn repeats the last
one with the reply appended. Prefilling that head again costs a full forward pass over hundreds
of tokens, which stalls every other request in the batch. `PrefixStore` keeps the caches of
the last few ended requests and copies the longest matching head into a new request's cache.

Only caches written causally with the base weights are offered (`BlockCausalDecoder`'s cache
write): slot i of such a cache depends on tokens 0..i alone, so a copied head is exactly what
prefilling it would have written.
"""

from __future__ import annotations

from collections import deque

from torch import Tensor

from dllm_engine.models.transformer import KVCache


def common_prefix_len(a: list[int], b: list[int]) -> int:
    length = min(len(a), len(b))
    for i in range(length):
        if a[i] != b[i]:
            return i
    return length


class PrefixStore:
    """Keys and values of the last ended requests' written slots, with the tokens they hold, up
    to `max_entries` entries and `max_bytes` in all (copies: a request's own cache is
    preallocated to its longest possible reply and would pin far more memory).
    Used only from the engine's scheduler thread."""

    def __init__(self, max_entries: int = 16, min_tokens: int = 16, max_bytes: int = 256 << 20):
        self.max_entries = max_entries
        self.min_tokens = min_tokens  # shorter matches are not worth a copy
        self.max_bytes = max_bytes  # SmolLM2's fp16 cache: 23 KB a token, so ~11k tokens
        self._entries: deque[tuple[list[int], Tensor, Tensor]] = deque()

    @property
    def bytes(self) -> int:
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for _, k, v in self._entries)

    def offer(self, token_ids: list[int], cache: KVCache) -> None:
        """token_ids: what cache slots [0, len) hold (final keys and values)."""
        per_token = cache.bytes // cache.max_len
        length = min(len(token_ids), self.max_bytes // max(1, per_token))
        if self.max_entries <= 0 or length < self.min_tokens or cache.k is None:
            return
        token_ids = list(token_ids[:length])
        # an older entry that this one extends (or equals) only takes memory
        for old in [e for e in self._entries if common_prefix_len(e[0], token_ids) == len(e[0])]:
            self._entries.remove(old)
        self._entries.append((token_ids, cache.k[:, :, :length].clone(), cache.v[:, :, :length].clone()))
        while len(self._entries) > self.max_entries or self.bytes > self.max_bytes:
            self._entries.popleft()

    def take(self, token_ids: list[int], cache: KVCache, limit: int) -> int:
        """Copies the longest stored head of `token_ids` (at most `limit` tokens) into `cache`;
        returns its length (0: nothing worth copying)."""
        best, donor = 0, None
        for entry in self._entries:
            if entry[1].shape[0] < cache.k.shape[0]:
                continue  # it lacks layers this cache needs (a draft head's: an AR request's cache)
            length = min(common_prefix_len(entry[0], token_ids), limit)
            if length > best:
                best, donor = length, entry
        if donor is None or best < self.min_tokens:
            return 0
        layers = cache.k.shape[0]
        cache.k[:, :, :best].copy_(donor[1][:layers, :, :best])
        cache.v[:, :, :best].copy_(donor[2][:layers, :, :best])
        return best

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
