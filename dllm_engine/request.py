"""What a caller hands the engine and what it gets back: parameters, updates, handles.

This is the engine's public contract (voice_app knows the engine only through it):

    engine = Engine.load("smollm2-135m-bd")
    handle = engine.submit([{"role": "user", "content": "Hi!"}], GenerationParams())
    for update in handle:            # or: async for update in handle
        print(update.draft_text)     # whole reply as currently drafted (masks dropped)
    handle.cancel()                  # takes effect before the next denoising step
"""

from __future__ import annotations

import asyncio
import queue
import threading
from dataclasses import dataclass, field
from typing import AsyncIterator, Iterator, Literal

# "auto": whichever of the two this engine measured faster on its machine (Engine.choose_mode)
Mode = Literal["auto", "diffusion", "autoregressive"]


class EngineError(Exception):
    """A request the engine cannot take, with a message naming what was wrong."""


class EngineOverloaded(EngineError):
    """Too many live requests or cached tokens: the caller should back off and retry."""


@dataclass(frozen=True)
class GenerationParams:
    max_new_tokens: int = 128
    mode: Mode = "diffusion"
    block_size: int | None = None  # None: the model's own default
    # exact decoding: commit only tokens the base model's own greedy decoding would produce (the
    # AR token at the block's first open position and the drafts the cache write confirms), so
    # the reply is the AR reply, in fewer passes. None: exact where the model can (a sliding
    # block over a causal cache: our default model) unless a threshold or deadline is given.
    exact: bool | None = None
    threshold: float | None = None  # confidence needed to commit (lossy); None: the model's default
    policy: Literal["threshold", "factor", "fixed_steps"] = "threshold"
    factor: float = 1.0  # for policy="factor"
    # when no position reaches the threshold: commit the most confident one, or the leftmost
    # masked one; None: the model family's default
    fallback: Literal["most_confident", "leftmost"] | None = None
    # sliding-block models: feed this many of the block's current guesses through the causal
    # cache write, which checks them exactly (speculative verification); 0 turns it off
    verify_drafts: int = 3
    steps_per_block: int | None = None  # for policy="fixed_steps"
    temperature: float = 0.0  # 0: greedy
    seed: int | None = None
    deadline_s: float | None = None  # wall-clock budget for the whole reply
    stop_at_eos: bool = True
    raw: bool = False  # True: the prompt string is used as is, no chat template
    # best effort (a speculative draft): stepped only when no foreground request is live, or on
    # every BACKGROUND_EVERY-th pass; RequestHandle.promote() makes it foreground
    background: bool = False
    # the probabilities of these tokens at the first reply position, in the final update's
    # token_probs (e.g. the chat template's end-of-turn token: Engine.end_of_turn_probability)
    score_tokens: tuple[int, ...] = ()

    def validate(self) -> None:
        if self.max_new_tokens < 1 or self.max_new_tokens > 8192:
            raise EngineError(f"max_new_tokens must be in 1..8192, got {self.max_new_tokens}")
        if self.mode not in ("auto", "diffusion", "autoregressive"):
            raise EngineError(f"mode must be 'auto', 'diffusion' or 'autoregressive', got {self.mode!r}")
        if self.block_size is not None and not 1 <= self.block_size <= 256:
            raise EngineError(f"block_size must be in 1..256, got {self.block_size}")
        if self.threshold is not None and not 0.0 <= self.threshold <= 1.0:
            raise EngineError(f"threshold must be in 0..1, got {self.threshold}")
        if self.temperature < 0:
            raise EngineError(f"temperature must be >= 0, got {self.temperature}")
        if self.deadline_s is not None and self.deadline_s <= 0:
            raise EngineError(f"deadline_s must be > 0, got {self.deadline_s}")
        if not 0 <= self.verify_drafts <= 64:
            raise EngineError(f"verify_drafts must be in 0..64, got {self.verify_drafts}")
        if self.fallback not in (None, "most_confident", "leftmost"):
            raise EngineError(f"fallback must be most_confident|leftmost, got {self.fallback!r}")
        if self.policy not in ("threshold", "factor", "fixed_steps"):
            raise EngineError(f"policy must be threshold|factor|fixed_steps, got {self.policy!r}")
        if self.score_tokens and self.mode != "autoregressive":
            raise EngineError("score_tokens needs mode='autoregressive' (a probability of the next token)")


@dataclass
class RequestStats:
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0  # of them, copied from an earlier request's cache (not prefilled)
    new_tokens: int = 0
    committed_tokens: int = 0  # tokens the passes committed: new_tokens and an ending EOS
    forward_passes: int = 0  # passes this request took part in (prefill and cache writes included)
    prefill_passes: int = 0  # of them, chunks of a long prompt: they predict nothing
    denoise_steps: int = 0
    # pass_commits[k]: passes that committed k tokens (a tuple: every update gets its own copy);
    # with drafts checked, passes committing >= j + 1 tokens kept the draft at offset j
    pass_commits: tuple[int, ...] = ()
    continued_passes: int = 0  # passes that checked a continuation of earlier text, not the head's drafts
    elapsed_s: float = 0.0
    first_token_s: float | None = None  # submit -> first committed token
    deadline_met: bool | None = None  # None when no deadline was given

    @property
    def tokens_per_forward(self) -> float:
        """Tokens a decoding pass committed, on average: the EOS that ends a reply counts, the
        chunks of a long prompt do not (they predict nothing), so an AR reply is exactly 1.0
        whatever its prompt's length."""
        decoding = self.forward_passes - self.prefill_passes
        return self.committed_tokens / decoding if decoding > 0 else 0.0

    def count_pass(self, committed: int) -> None:
        counts = list(self.pass_commits) + [0] * max(0, committed + 1 - len(self.pass_commits))
        counts[committed] += 1
        self.pass_commits = tuple(counts)


@dataclass
class DraftUpdate:
    """One snapshot of a request, sent after every step that changed it."""

    request_id: int
    committed_text: str  # settled text: every token up to it is committed and final
    draft_text: str  # the whole reply as drafted now (committed + best guesses, masks dropped)
    token_ids: list[int]  # committed new token ids, in order (a prefix of the final reply)
    step: int
    final: bool
    finish_reason: Literal["stop", "length", "cancelled", "error"] | None = None
    stats: RequestStats = field(default_factory=RequestStats)
    error: str | None = None
    token_probs: list[float] | None = None  # for GenerationParams.score_tokens, once known


_DONE = object()


class RequestHandle:
    """A live request: iterate it (sync or async) for updates; cancel() stops it."""

    def __init__(self, request_id: int, max_buffered: int = 1024, background: bool = False):
        self.request_id = request_id
        self.background = background  # read by the scheduler before each pass
        self._updates: queue.Queue = queue.Queue(maxsize=max_buffered)
        self._cancelled = threading.Event()
        self._finished = threading.Event()
        self.last: DraftUpdate | None = None
        self._wake_async_reader = None  # set by __aiter__: wakes the event loop on publish

    # called by the scheduler thread: never blocks, whoever reads (or does not)
    def _publish(self, update: DraftUpdate) -> None:
        self.last = update
        self._put_dropping_oldest(update)  # a slow reader only ever needs the newest snapshot
        if update.final:
            self._finished.set()
            self._put_dropping_oldest(_DONE)
        wake = self._wake_async_reader
        if wake is not None:
            try:
                wake()
            except RuntimeError:  # the reader's event loop is closed: nobody is listening any more
                self._wake_async_reader = None

    def _put_dropping_oldest(self, item) -> None:
        while True:
            try:
                self._updates.put_nowait(item)
                return
            except queue.Full:
                try:
                    self._updates.get_nowait()
                except queue.Empty:
                    pass

    def cancel(self) -> None:
        self._cancelled.set()

    def promote(self) -> None:
        """A background request becomes foreground (from its next pass on)."""
        self.background = False

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    @property
    def done(self) -> bool:
        return self._finished.is_set()

    def result(self, timeout: float | None = None) -> DraftUpdate:
        """Block until the request ends; its final update (every call, not just the first)."""
        if not self._finished.wait(timeout):
            raise TimeoutError(f"request {self.request_id} did not finish within {timeout} s")
        assert self.last is not None and self.last.final
        return self.last

    def __iter__(self) -> Iterator[DraftUpdate]:
        while True:
            item = self._updates.get()
            if item is _DONE:
                return
            yield item

    async def __aiter__(self) -> AsyncIterator[DraftUpdate]:
        # No thread parked per reader: the scheduler wakes this loop with call_soon_threadsafe.
        loop = asyncio.get_running_loop()
        ready = asyncio.Event()
        self._wake_async_reader = lambda: loop.call_soon_threadsafe(ready.set)
        while True:
            try:
                item = self._updates.get_nowait()
            except queue.Empty:
                ready.clear()
                if self._updates.empty():
                    await ready.wait()
                continue
            if item is _DONE:
                return
            yield item
            await asyncio.sleep(0)  # a reader with a backlog lets the loop's other readers take a turn
