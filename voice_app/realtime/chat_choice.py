"""One choice of a chat completion: follows its engine request and turns the settled text into
append-only deltas, applying stop sequences to the text as OpenAI does (the reply ends right
before the first stop string, which is not returned)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, AsyncIterator

REPLACEMENT_CHAR = "\ufffd"  # what a token ending inside a UTF-8 character decodes to, until the next one


class ChoiceFailed(Exception):
    """The engine ended a request with an error (or cancelled it for its own reasons)."""


@dataclass
class ChoiceEvent:
    index: int
    delta: str  # text new since the previous event ("" when only the finish is new)
    finish_reason: str | None = None  # stop | length, on the choice's last event
    stats: Any = None  # the engine's RequestStats, on the last event
    passes_to_first_token: int | None = None  # forward passes until the engine's first committed token


def cut_at_stop(text: str, stops: tuple[str, ...]) -> tuple[str, bool]:
    """The text up to the earliest stop string, and whether one was found."""
    found = [at for at in (text.find(stop) for stop in stops) if at >= 0]
    return (text[: min(found)], True) if found else (text, False)


def undecided_tail(text: str, stops: tuple[str, ...]) -> int:
    """How many trailing characters could still grow into a stop string (held back while streaming)."""
    longest = 0
    for stop in stops:
        for length in range(min(len(stop) - 1, len(text)), longest, -1):
            if text.endswith(stop[:length]):
                longest = length
                break
    return longest


class VisibleText:
    """What the client may see of the engine's committed text, and how much of it was sent."""

    def __init__(self, stops: tuple[str, ...]):
        self.stops = stops
        self.sent = ""
        self.stopped = False

    def advance(self, committed: str, final: bool) -> str:
        """The next delta for this committed text (every call's text extends the previous one's)."""
        if self.stopped:
            return ""
        text, self.stopped = cut_at_stop(committed, self.stops)
        if not (final or self.stopped):
            text = text.rstrip(REPLACEMENT_CHAR)
            text = text[: len(text) - undecided_tail(text, self.stops)]
        if not text.startswith(self.sent):
            return ""  # never un-send text: a decode that changed behind the sent part waits for more
        delta, self.sent = text[len(self.sent):], text
        return delta


async def follow_choice(index: int, handle: Any, stops: tuple[str, ...],
                        inactivity_timeout_s: float) -> AsyncIterator[ChoiceEvent]:
    """Events of one engine request; once a stop string has settled, the request is cancelled
    (the engine stops before its next step) and its final update still brings the stats."""
    text = VisibleText(stops)
    first_token_passes = None
    async for update in updates_within(handle, inactivity_timeout_s):
        if first_token_passes is None and update.token_ids:
            first_token_passes = update.stats.forward_passes
        delta = text.advance(update.committed_text, update.final)
        if text.stopped and not update.final:
            handle.cancel()
        if update.final:
            yield ChoiceEvent(index, delta, finish_reason(update, text.stopped), update.stats, first_token_passes)
            return
        if delta:
            yield ChoiceEvent(index, delta)


async def updates_within(handle: Any, timeout_s: float) -> AsyncIterator[Any]:
    """The handle's updates; none for timeout_s (a hung scheduler) cancels it and fails the choice."""
    pending = aiter(handle)
    while True:
        try:
            update = await asyncio.wait_for(anext(pending), timeout_s)
        except StopAsyncIteration:
            return
        except asyncio.TimeoutError:
            handle.cancel()
            raise ChoiceFailed(f"the engine sent no update for {timeout_s:g} s") from None
        yield update


def finish_reason(update: Any, stopped_by_us: bool) -> str:
    if stopped_by_us or update.finish_reason == "stop":
        return "stop"
    if update.finish_reason == "length":
        return "length"
    raise ChoiceFailed(update.error or f"the engine ended the request ({update.finish_reason})")
