"""Which speculative draft becomes the reply (core/speculation.py), with stand-in responses."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from voice_app.core.speculation import Speculation


class Drafts:
    """Starts stand-in drafts whose prompt is the text itself; records what was discarded."""

    def __init__(self):
        self.started: list[str] = []
        self.discarded: list[str] = []
        self.tasks: list[asyncio.Task] = []

    async def start(self, text: str):
        self.started.append(text)
        await asyncio.sleep(0)
        return SimpleNamespace(id=f"draft-{len(self.started)}", prompt_messages=[{"role": "user", "content": text}],
                               cancelled=False, source_text=text)

    def speculation(self) -> Speculation:
        def spawn(coro, name):
            task = asyncio.ensure_future(coro)
            self.tasks.append(task)
            return task
        return Speculation("sess_test", self.start, lambda draft: self.discarded.append(draft.id), spawn)


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


async def test_the_draft_is_the_reply_when_it_answers_the_final_prompt():
    drafts = Drafts()
    speculation = drafts.speculation()
    speculation.redraft("What is the capital of France?")
    speculation.redraft("What is the capital of France?")  # the same words: no second draft
    speculation.redraft("what is the capital of France.")  # nor for other punctuation
    await speculation.settle()
    reply = speculation.take(user("What is the capital of France?"))
    assert drafts.started == ["What is the capital of France?"]
    assert reply is not None and reply.id == "draft-1" and drafts.discarded == []
    assert speculation.take(user("What is the capital of France?")) is None  # taken once


async def test_a_draft_whose_words_differ_only_in_punctuation_and_case_is_the_reply():
    drafts = Drafts()
    speculation = drafts.speculation()
    speculation.redraft("What is the capital of France.")  # a partial; the final decode says "France?"
    await speculation.settle()
    assert speculation.take(user("what is the capital of France?")).id == "draft-1"
    speculation.redraft("What is 2 plus 2?")
    await speculation.settle()
    assert speculation.take(user("What is 2 plus 3?")) is None  # a different word: a different question


async def test_a_draft_for_other_words_is_discarded_at_the_end_of_the_turn():
    drafts = Drafts()
    speculation = drafts.speculation()
    speculation.redraft("What is the capital of")
    await speculation.settle()
    assert speculation.take(user("What is the capital of Spain?")) is None
    assert drafts.discarded == ["draft-1"]


async def test_newer_words_replace_the_draft_and_drop_forgets_it():
    drafts = Drafts()
    speculation = drafts.speculation()
    speculation.redraft("Tell me")
    await speculation.settle()
    speculation.redraft("Tell me a story")
    assert drafts.discarded == ["draft-1"]
    await speculation.settle()
    speculation.drop()
    assert drafts.discarded == ["draft-1", "draft-2"]
    assert speculation.take(user("Tell me a story")) is None
    speculation.redraft("   ")  # no words: nothing to draft
    await asyncio.gather(*drafts.tasks, return_exceptions=True)
    assert drafts.started == ["Tell me", "Tell me a story"]
