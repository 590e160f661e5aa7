"""The speculative reply: drafted from the user's words so far, while they are still in the turn.

At each pause (and each partial transcript that heard every word) the session asks for a
draft; a newer text replaces the old draft. When the turn ends, the draft is adopted only if it
answers the prompt the final transcript gives, word for word (Whisper's punctuation and case
may differ between a partial and the final decode: "France." / "France?"); otherwise it is
discarded and the reply is started afresh. Drafts are background engine requests (they yield the CPU to replies being
heard) and are promoted when adopted.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Awaitable, Callable

from voice_app.core.response import Response
from voice_app.core.speech_text import words

log = logging.getLogger(__name__)


def same_prompt(draft: list[dict[str, str]], final: list[dict[str, str]]) -> bool:
    """The same conversation, and the same words in its last (the user's) message."""
    if len(draft) != len(final) or not final or draft[:-1] != final[:-1]:
        return False
    return draft[-1]["role"] == final[-1]["role"] and words(draft[-1]["content"]) == words(final[-1]["content"])


class Speculation:
    """At most one draft at a time. `start_draft(text)`: submits a draft answering `text` as the
    user's turn (None when the engine refuses it); `discard(response)`: cancels one and forgets
    it once stopped; `spawn(coro, name)`: the session's supervised task starter."""

    def __init__(self, session_id: str, start_draft: Callable[[str], Awaitable[Response | None]],
                 discard: Callable[[Response], None], spawn: Callable[[Awaitable[None], str], asyncio.Task]):
        self._session_id = session_id
        self._start_draft = start_draft
        self._discard = discard
        self._spawn = spawn
        self._draft: Response | None = None
        self._submitting: asyncio.Task | None = None  # a draft being submitted
        self._text = ""  # the transcript the draft (live or being submitted) answers

    def redraft(self, text: str) -> None:
        """Drafts a reply to `text`, unless the current draft already answers its words."""
        if not text.strip() or words(text) == words(self._text):
            return
        self.drop()
        log.debug("session %s: speculative draft for %r", self._session_id, text)
        self._text = text
        self._submitting = self._spawn(self._submit(text), "draft")

    async def _submit(self, text: str) -> None:
        self._draft = await self._start_draft(text)

    def drop(self) -> None:
        """The context changed (or the turn went nowhere): no draft can be the reply."""
        if self._submitting is not None:
            self._submitting.cancel()  # a submit under way cancels its request once it returns
            self._submitting = None
        if self._draft is not None:
            self._discard(self._draft)
            self._draft = None
        self._text = ""

    async def settle(self) -> None:
        """Waits for a draft being submitted (its prompt is ready in milliseconds)."""
        submitting = self._submitting
        if submitting is not None and not submitting.done():
            await asyncio.wait([submitting])

    def take(self, messages: list[dict[str, str]]) -> Response | None:
        """Ends the speculation: the draft when it answers `messages` (same_prompt), else None
        (and any draft is discarded)."""
        draft, self._draft = self._draft, None
        if self._submitting is not None:
            self._submitting.cancel()  # a newer draft, begun while the caller waited
        self._submitting, self._text = None, ""
        if draft is None:
            return None
        if not draft.cancelled and same_prompt(draft.prompt_messages, messages):
            return draft
        log.debug("session %s: speculative draft %s was for %r; drafting again", self._session_id, draft.id,
                  draft.source_text)
        self._discard(draft)
        return None
