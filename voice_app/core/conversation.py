"""Conversation memory of one session: items as heard, and the messages the engine sees."""

from __future__ import annotations

import itertools
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Protocol

from voice_app.core.speech_text import whole_sentences
from voice_app.events.protocol import server_event

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
    in_prompt: bool = True  # False: kept for the client, but the engine no longer sees it

    @property
    def audio_ms(self) -> float:
        return self.pieces[-1].start_ms + self.pieces[-1].duration_ms if self.pieces else 0.0

    def truncate_to_heard(self, audio_end_ms: float) -> None:
        """What a cut-off reply keeps: the text of its audio up to where playback stopped."""
        self.text = self.text_heard_until(audio_end_ms)
        self.status = "incomplete"

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


class TokenCounter(Protocol):
    max_context_tokens: int

    def count_tokens(self, messages: list[dict[str, str]]) -> int: ...


class ContextTooLong(Exception):
    """Even the newest user turn alone does not fit the model's context."""


@dataclass
class Conversation:
    """A session's items, bounded: past `max_items` items or `max_chars` characters of text the
    oldest finished items are forgotten (long past the model's context by then); their ids wait
    in `evicted` for the session to announce (conversation.item.deleted)."""

    items: list[ConversationItem] = field(default_factory=list)
    max_items: int = 512
    max_chars: int = 1 << 20
    evicted: list[str] = field(default_factory=list)

    def add(self, item: ConversationItem) -> str | None:
        """Appends the item; returns the previous item's id (the wire's previous_item_id)."""
        previous = self.items[-1].id if self.items else None
        self.items.append(item)
        self._evict()
        return previous

    def find(self, item_id: str) -> ConversationItem | None:
        return next((item for item in self.items if item.id == item_id), None)

    def remove(self, item_id: str) -> bool:
        """conversation.item.delete: the item is forgotten (False: there was none)."""
        item = self.find(item_id)
        if item is not None:
            self.items.remove(item)
        return item is not None

    def dismiss(self, command: ConversationItem) -> None:
        """A stop command ("Stop.", "Never mind."): it and the reply it cut off stay in the
        conversation but leave the prompt, so the next question is answered on its own and
        the cut reply does not leak into it."""
        command.in_prompt = False
        index = self.items.index(command) if command in self.items else len(self.items)
        before = [item for item in self.items[:index] if item.role == "assistant"]
        if before and before[-1].status == "incomplete":
            before[-1].in_prompt = False

    def take_evicted(self) -> list[str]:
        evicted, self.evicted = self.evicted, []
        return evicted

    def _evict(self) -> None:
        chars = sum(len(item.text) for item in self.items)
        while len(self.items) > 1 and (len(self.items) > self.max_items or chars > self.max_chars):
            oldest = next((item for item in self.items[:-1] if item.status != "in_progress"), None)
            if oldest is None:
                return  # every older item is still being written: they go once finished
            self.items.remove(oldest)
            self.evicted.append(oldest.id)
            chars -= len(oldest.text)

    def messages(self, instructions: str, pending_user_text: str | None = None) -> list[dict[str, str]]:
        """What the engine sees. A reply the user cut off keeps only its whole sentences: one that
        ends mid-sentence invites the model to carry on with it instead of answering the words
        that cut it off (SmolLM2 did, with or without a marker saying it was interrupted)."""
        messages = [{"role": "system", "content": instructions}] if instructions else []
        for item in self.items:
            if not item.in_prompt:
                continue
            text = whole_sentences(item.text) if item.role == "assistant" and item.status == "incomplete" else item.text
            if text.strip():
                messages.append({"role": item.role, "content": text})
        if pending_user_text:
            messages.append({"role": "user", "content": pending_user_text})
        return messages


async def announce_evictions(conversation: Conversation, send: Callable[[dict[str, Any]], Awaitable[None]]) -> None:
    """Tells the client which items the history cap made the conversation forget."""
    for item_id in conversation.take_evicted():
        await send(server_event("conversation.item.deleted", item_id=item_id))


class ContextFitter:
    """Trims a prompt to the context, oldest turns first, in time linear in the history: each
    message's token cost is counted once (by text, remembered) and the trim walks a running sum;
    one exact count of the kept prompt checks the estimate. Blocking (tokenizer work): sessions
    call `fit` on a worker thread, never on the event loop.

    One fitter per conversation: it keeps the prompt's head still. Once a trim is needed it cuts
    down to `low_water` of the budget and then keeps starting at that turn (the anchor) while
    the prompt fits. A head that moved by one turn every turn would defeat the engine's prefix
    cache: every draft, verdict and reply would prefill the whole history again (a 30-minute soak
    measured replies 20 s late once the history filled the context)."""

    def __init__(self, counter: TokenCounter, context_tokens: int | None = None, remembered: int = 4096,
                 low_water: float = 0.5):
        self._counter = counter
        self.context_tokens = min(context_tokens or counter.max_context_tokens, counter.max_context_tokens)
        self.low_water = low_water
        self._costs: dict[tuple[str, str], int] = {}
        self._remembered = remembered
        self._anchor: tuple[int, tuple[str, str]] | None = None  # (index in the turns, its message)
        self._lock = threading.Lock()

    def fit(self, messages: list[dict[str, str]], reply_tokens: int) -> list[dict[str, str]]:
        budget = self.context_tokens - reply_tokens
        system, turns = _system_and_turns(messages)
        first = self._first_to_keep(system, turns, budget)
        kept = system + turns[first:]
        needed = self._counter.count_tokens(kept) if kept else 0
        while needed > budget and len(kept) > len(system) + 1:
            kept.pop(len(system))  # the estimate was a few tokens short: one more turn goes
            needed = self._counter.count_tokens(kept)
        if needed > budget:
            raise ContextTooLong(f"the prompt needs {needed} tokens but only {budget} of the {self.context_tokens} "
                                 f"context tokens are left after {reply_tokens} for the reply")
        if len(kept) < len(messages):
            log.debug("dropped %d old turns to fit %d tokens", len(messages) - len(kept), budget)
        first = len(turns) - (len(kept) - len(system))
        with self._lock:
            self._anchor = (first, _key(turns[first])) if first < len(turns) else None
        return kept

    def trim_ahead(self, messages: list[dict[str, str]], reply_tokens: int,
                   next_message_tokens: int) -> list[dict[str, str]] | None:
        """Between turns: if a next user message of up to `next_message_tokens` would not fit
        behind `messages` (the history so far), trims now as that turn's `fit` would, and returns
        the kept messages, the head every request of the next turn starts with (for prefilling
        it before the turn ends: HeadWarmer); None while the head stays."""
        system, turns = _system_and_turns(messages)
        if not turns:
            return None
        budget = self.context_tokens - reply_tokens - next_message_tokens
        anchor = self._anchor_in(turns)
        first = self._first_to_keep(system, turns, budget)
        if first == anchor:
            return None
        with self._lock:
            self._anchor = (first, _key(turns[first]))
        return system + turns[first:]

    def _first_to_keep(self, system: list[dict[str, str]], turns: list[dict[str, str]], budget: int) -> int:
        """The oldest turn to keep: the anchor while the prompt fits, else the turn that brings
        the running sum of the turns' costs under the low-water mark."""
        if not turns:
            return 0
        costs = [self._cost(message) for message in turns]
        # the template's fixed part: the system prompt (or the one it supplies), the reply's header
        fixed = self._counter.count_tokens(system + turns[-1:]) - costs[-1]
        first = self._anchor_in(turns)
        total = fixed + sum(costs[first:])
        if total <= budget:
            return first
        target = min(budget, max(fixed + costs[-1], self.low_water * budget))
        while first < len(turns) - 1 and total > target:
            total -= costs[first]
            first += 1
        return first

    def _anchor_in(self, turns: list[dict[str, str]]) -> int:
        """Where the last kept head starts now: at its old index, or before it when the
        conversation forgot its oldest items since; 0 when it is gone."""
        with self._lock:
            anchor = self._anchor
        if anchor is None:
            return 0
        index, key = anchor
        for i in range(min(index, len(turns) - 1), -1, -1):
            if _key(turns[i]) == key:
                return i
        return 0

    def _cost(self, message: dict[str, str]) -> int:
        """What one more copy of the message adds to a prompt: template-agnostic (a default
        system prompt or a generation header the template adds appears in both counts)."""
        key = _key(message)
        with self._lock:
            cost = self._costs.get(key)
        if cost is None:
            cost = self._counter.count_tokens([message, message]) - self._counter.count_tokens([message])
            with self._lock:  # a session may fit a draft and a reply at once
                if len(self._costs) >= self._remembered:
                    self._costs.pop(next(iter(self._costs)))  # the oldest text first
                self._costs[key] = cost
        return cost


def _system_and_turns(messages: list[dict[str, str]]) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """The system message (a list of it, or empty) and the turns after it."""
    system = messages[:1] if messages and messages[0]["role"] == "system" else []
    return system, messages[len(system):]


def _key(message: dict[str, str]) -> tuple[str, str]:
    return message["role"], message["content"]
