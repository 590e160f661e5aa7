"""One choice: the stop-sequence text filter and how it follows its engine request (scripted
handles replaying real DraftUpdates; the real engine's are in test_chat_api.py)."""

from __future__ import annotations

import asyncio

import pytest

from dllm_engine.request import DraftUpdate, RequestStats
from voice_app.realtime.chat_choice import ChoiceFailed, VisibleText, cut_at_stop, follow_choice, undecided_tail


def test_stop_cuts_before_the_earliest_stop_string():
    assert cut_at_stop("The capital is Paris. Yes.", ("Yes", "Paris")) == ("The capital is ", True)
    assert cut_at_stop("no stop here", ("Paris",)) == ("no stop here", False)


def test_a_tail_that_may_become_a_stop_is_held_back():
    assert undecided_tail("The capital is Pa", ("Paris",)) == 2
    assert undecided_tail("The capital is", ("Paris",)) == 0
    assert undecided_tail("ends with a", ("ab", "aab")) == 1


def test_visible_text_streams_append_only_deltas_and_stops():
    text = VisibleText(("Paris",))
    deltas = [text.advance(committed, final=False)
              for committed in ("The", "The capital is Pa", "The capital is Par\ufffd", "The capital is Paris. It")]
    assert deltas == ["The", " capital is ", "", ""]
    assert text.stopped and text.sent == "The capital is "
    assert text.advance("The capital is Paris. It is big.", final=True) == ""


def test_visible_text_holds_an_incomplete_character_until_the_end():
    text = VisibleText(())
    assert text.advance("Caf\ufffd", final=False) == "Caf"
    assert text.advance("Café", final=False) == "é"
    assert text.advance("Café!", final=True) == "!"


class ScriptedHandle:
    """A RequestHandle's async side, replaying updates (then staying silent when `hang`)."""

    def __init__(self, updates: list[DraftUpdate], hang: bool = False):
        self.updates, self.hang, self.cancelled = updates, hang, False

    def cancel(self) -> None:
        self.cancelled = True

    async def __aiter__(self):
        for update in self.updates:
            yield update
        if self.hang:
            await asyncio.Event().wait()


def update(text: str, final: bool = False, reason: str | None = None, error: str | None = None) -> DraftUpdate:
    ids = list(range(len(text.split())))
    return DraftUpdate(1, text, text, ids, len(ids), final, reason, RequestStats(new_tokens=len(ids)), error)


async def events_of(handle: ScriptedHandle, stops: tuple[str, ...] = (), timeout_s: float = 5.0) -> list:
    return [event async for event in follow_choice(0, handle, stops, timeout_s)]


async def test_a_settled_stop_string_cancels_the_request_and_finishes_with_stop():
    handle = ScriptedHandle([update("The capital"), update("The capital is Paris. It"),
                             update("The capital is Paris. It is", final=True, reason="cancelled")])
    events = await events_of(handle, ("Paris",))
    assert handle.cancelled
    assert [e.delta for e in events] == ["The capital", " is ", ""]
    assert events[-1].finish_reason == "stop" and events[-1].stats.new_tokens == 6


async def test_the_engine_end_maps_to_openai_finish_reasons():
    assert (await events_of(ScriptedHandle([update("One two", True, "length")])))[-1].finish_reason == "length"
    assert (await events_of(ScriptedHandle([update("Done.", True, "stop")])))[-1].finish_reason == "stop"


async def test_an_engine_error_fails_the_choice_with_its_message():
    with pytest.raises(ChoiceFailed, match="the engine failed: boom"):
        await events_of(ScriptedHandle([update("Half", True, "error", "the engine failed: boom")]))


async def test_an_engine_that_goes_silent_fails_the_choice_and_cancels_it():
    handle = ScriptedHandle([update("Half")], hang=True)
    with pytest.raises(ChoiceFailed, match="no update"):
        await events_of(handle, timeout_s=0.05)
    assert handle.cancelled
