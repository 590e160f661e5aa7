"""Checks on a Whisper transcript before anyone acts on it.

Whisper tiny loops: "What is the capital of Spain? Spain? Spain? Spain?" came out of a question
with a thinking pause. `collapse_repetitions` keeps one copy of a phrase repeated four or more
times in a row (what a person almost never says), and `looks_failed` is faster-whisper's test
for a decode to retry at a higher temperature: text that compresses too well (a loop) or a low
average log-probability.
"""

from __future__ import annotations

import re
import zlib

MAX_PHRASE_WORDS = 6
MIN_REPEATS = 4  # "no, no, no" is said; four and more in a row is a decoding loop
COMPRESSION_RATIO_LIMIT = 2.4  # faster-whisper's default
LOG_PROB_LIMIT = -1.0


def collapse_repetitions(text: str) -> str:
    words = text.split()
    bare = [_bare(w) for w in words]
    out: list[str] = []
    i = 0
    while i < len(words):
        size, repeats = _repetition_at(bare, i)
        if repeats >= MIN_REPEATS:
            out.extend(words[i + (repeats - 1) * size:i + repeats * size])  # the last copy keeps its punctuation
            i += repeats * size
        else:
            out.append(words[i])
            i += 1
    return " ".join(out)


def _repetition_at(bare: list[str], i: int) -> tuple[int, int]:
    """(phrase length, times it repeats in a row) of the shortest phrase at i that repeats
    MIN_REPEATS times or more; (1, 1) when none does."""
    for size in range(1, MAX_PHRASE_WORDS + 1):
        phrase = bare[i:i + size]
        if len(phrase) < size or not any(phrase):
            break
        repeats = 1
        while bare[i + repeats * size:i + (repeats + 1) * size] == phrase:
            repeats += 1
        if repeats >= MIN_REPEATS:
            return size, repeats
    return 1, 1


def compression_ratio(text: str) -> float:
    raw = text.encode()
    return len(raw) / max(1, len(zlib.compress(raw)))


def looks_failed(text: str, average_log_prob: float | None) -> bool:
    if len(text) > 20 and compression_ratio(text) > COMPRESSION_RATIO_LIMIT:
        return True
    return average_log_prob is not None and average_log_prob < LOG_PROB_LIMIT


def _bare(word: str) -> str:
    return re.sub(r"[^\w']", "", word.lower())
