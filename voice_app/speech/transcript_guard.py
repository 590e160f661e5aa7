"""Checks on a Whisper transcript before anyone acts on it.

Whisper tiny loops: "What is the capital of Spain? Spain? Spain? Spain?" came out of a question
with a thinking pause. `collapse_repetitions` keeps one copy of a word repeated four or more
times in a row, of a phrase of two or three words repeated three or more times, and of a longer
phrase said twice over ("Hello? How are you today? Hello? How are you today?" from one "Hello?
How are you today?"): what a person almost never says ("no, no, no" is said), and a repeat
loses nothing the assistant needs. A loop's cut-off last copy counts with it ("ma'am, ma'am,
ma'am, ma'" ends where the decode ran out of tokens). `looks_failed` is faster-whisper's test
for a decode to retry at a higher temperature: text that compresses too well (a loop) or a low
average log-probability.
"""

from __future__ import annotations

import re
import zlib

MAX_PHRASE_WORDS = 8
LONG_PHRASE_WORDS = 4  # a phrase this long, said twice in a row, is a decode that ran on


def min_repeats(size: int) -> int:
    """Copies in a row of a `size`-word phrase that make a loop: "no, no, no" is said; "I got
    you. I got you. I got you." and a whole question twice are not."""
    return 4 if size == 1 else 3 if size < LONG_PHRASE_WORDS else 2

COMPRESSION_RATIO_LIMIT = 2.4  # faster-whisper's default
LOG_PROB_LIMIT = -1.0


def collapse_repetitions(text: str) -> str:
    words = text.split()
    bare = [_bare(w) for w in words]
    out: list[str] = []
    i = 0
    while i < len(words):
        size, repeats, cut_off = _repetition_at(bare, i)
        if repeats > 1:
            out.extend(words[i + (repeats - 1) * size:i + repeats * size])  # the last copy keeps its punctuation
            i += repeats * size + cut_off
        else:
            out.append(words[i])
            i += 1
    return " ".join(out)


def _repetition_at(bare: list[str], i: int) -> tuple[int, int, int]:
    """(phrase length, times it repeats in a row, words of a cut-off copy after them) of the
    shortest phrase at i that loops; (1, 1, 0) when none does."""
    for size in range(1, MAX_PHRASE_WORDS + 1):
        phrase = bare[i:i + size]
        if len(phrase) < size or not any(phrase):
            break
        repeats = 1
        while bare[i + repeats * size:i + (repeats + 1) * size] == phrase:
            repeats += 1
        cut_off = _cut_off_copy(phrase, bare[i + repeats * size:])
        if repeats + (cut_off > 0) >= min_repeats(size):
            return size, repeats, cut_off
    return 1, 1, 0


def _cut_off_copy(phrase: list[str], rest: list[str]) -> int:
    """Words of `rest` that are the start of one more copy of `phrase` ending the transcript
    (its last word may be cut inside: "ma'" of "ma'am"), or 0."""
    if not rest or len(rest) > len(phrase) or not all(rest):
        return 0
    *whole, last = rest
    if whole != phrase[:len(whole)] or not phrase[len(whole)].startswith(last):
        return 0
    return len(rest)


def compression_ratio(text: str) -> float:
    raw = text.encode()
    return len(raw) / max(1, len(zlib.compress(raw)))


def is_loop(text: str) -> bool:
    """Text that compresses too well: the decoder went round in circles ("... ... ...")."""
    return len(text) > 20 and compression_ratio(text) > COMPRESSION_RATIO_LIMIT


def looks_failed(text: str, average_log_prob: float | None) -> bool:
    return is_loop(text) or (average_log_prob is not None and average_log_prob < LOG_PROB_LIMIT)


def _bare(word: str) -> str:
    return re.sub(r"[^\w']", "", word.lower())
