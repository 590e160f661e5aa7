"""Conversation memory of one session: items as heard, and the messages the engine sees."""

from __future__ import annotations

import itertools
import logging
import re
from dataclasses import dataclass, field
from typing import Any, Protocol

log = logging.getLogger(__name__)

_ids = itertools.count(1)


def new_id(prefix: str) -> str:
    return f"{prefix}_{next(_ids):06d}"


@dataclass
class SpokenPiece:
    """One synthesised sentence of an assistant item: where it sits in the item's audio."""

    text: str
    start_ms: float
    duration_ms: float


@dataclass
class ConversationItem:
    id: str
    role: str  # user | assistant | system
    text: str = ""
    audio: bool = False  # user: came from speech; assistant: was spoken
    status: str = "completed"
    pieces: list[SpokenPiece] = field(default_factory=list)  # assistant audio, in order

    @property
    def audio_ms(self) -> float:
        return self.pieces[-1].start_ms + self.pieces[-1].duration_ms if self.pieces else 0.0

    def text_heard_until(self, audio_end_ms: float) -> str:
        """The text a listener heard if playback stopped at audio_end_ms; a sentence cut midway
        keeps the share of its words that was played."""
        heard: list[str] = []
        for piece in self.pieces:
            if piece.start_ms + piece.duration_ms <= audio_end_ms:
                heard.append(piece.text)
                continue
            played = max(0.0, audio_end_ms - piece.start_ms) / max(piece.duration_ms, 1.0)
            words = piece.text.split()
            if played > 0 and words:
                heard.append(" ".join(words[: int(len(words) * played)]))
            break
        return " ".join(h for h in heard if h).strip()


_SENTENCE_END = re.compile(r"[.!?…](?=\s|$)")


def whole_sentences(text: str) -> str:
    """The text up to its last sentence end ("" when it has none)."""
    ends = [m.end() for m in _SENTENCE_END.finditer(text)]
    return text[: ends[-1]].strip() if ends else ""


class TokenCounter(Protocol):
    max_context_tokens: int

    def count_tokens(self, messages: list[dict[str, str]]) -> int: ...


class ContextTooLong(Exception):
    """Even the newest user turn alone does not fit the model's context."""


@dataclass
class Conversation:
    items: list[ConversationItem] = field(default_factory=list)

    def add(self, item: ConversationItem) -> str | None:
        """Appends the item; returns the previous item's id (the wire's previous_item_id)."""
        previous = self.items[-1].id if self.items else None
        self.items.append(item)
        return previous

    def find(self, item_id: str) -> ConversationItem | None:
        return next((item for item in self.items if item.id == item_id), None)

    def messages(self, instructions: str, pending_user_text: str | None = None) -> list[dict[str, str]]:
        """What the engine sees. A reply the user cut off keeps only its whole sentences: one that
        ends mid-sentence invites the model to carry on with it instead of answering the words
        that cut it off (SmolLM2 did, with or without a marker saying it was interrupted)."""
        messages = [{"role": "system", "content": instructions}] if instructions else []
        for item in self.items:
            text = whole_sentences(item.text) if item.role == "assistant" and item.status == "incomplete" else item.text
            if text.strip():
                messages.append({"role": item.role, "content": text})
        if pending_user_text:
            messages.append({"role": "user", "content": pending_user_text})
        return messages


def fit_to_context(messages: list[dict[str, str]], counter: TokenCounter, reply_tokens: int) -> list[dict[str, Any]]:
    """Drops the oldest turns (never the system prompt or the newest message) until the prompt
    plus the reply budget fits the model's context."""
    budget = counter.max_context_tokens - reply_tokens
    system = messages[:1] if messages and messages[0]["role"] == "system" else []
    turns = messages[len(system):]
    while len(turns) > 1 and counter.count_tokens(system + turns) > budget:
        turns = turns[1:]
    if counter.count_tokens(system + turns) > budget:
        raise ContextTooLong(
            f"the prompt needs {counter.count_tokens(system + turns)} tokens but only {budget} of the "
            f"model's {counter.max_context_tokens} are left after {reply_tokens} for the reply")
    if len(turns) < len(messages) - len(system):
        log.info("dropped %d old turns to fit the context", len(messages) - len(system) - len(turns))
    return system + turns
