"""Prefilling a conversation's trimmed head between turns.

Once the history fills the context, the next turn's prompt drops its oldest turns, and every
position after the system prompt moves: its keys and values must all be computed again (~1,000
tokens at the default context, seconds on two cores). Done when that turn ends, it is the
latency the listener hears; a 12-minute soak measured 3.4-5.2 s to first audio on exactly
those turns against 0.5-1.6 s on the others. The head is known as soon as the reply before
is complete, while its audio still plays and the user then speaks: the trim is made then, and
the kept head prefilled ahead of it, so the turn's drafts, verdicts and reply list its
blocks (dllm_engine/models/kv_pool.py) instead of computing them.

The prefill is a foreground request: it is the next turn's own work, done sooner. As a
background one (a pass in four while another session's reply is heard) a 30-minute soak saw it
finish before the turn began for 6 of 12 trims; the chunked prefill bounds what it costs the
other replies.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable

from voice_app.core.conversation import ContextFitter
from voice_app.core.offload import submit_off_loop

log = logging.getLogger(__name__)

NEXT_MESSAGE_TOKENS = 64  # room kept for the user's next message when deciding to trim now


class HeadWarmer:
    """One per session. `after_reply` after a reply completes (its coroutine, spawned); `cancel`
    when the next turn's own requests are submitted: they list what the prefill wrote so far and
    compute the rest, rather than both computing it. A prefill worked out after a cancel is not
    submitted (the epoch moved), whichever worker thread finishes first."""

    def __init__(self, engine: Any, fitter: ContextFitter, history: Callable[[], list[dict[str, str]]],
                 reply_tokens: Callable[[], int], mode: Callable[[], str]):
        self._engine, self._fitter = engine, fitter
        self._history, self._reply_tokens, self._mode = history, reply_tokens, mode
        self._handle: Any = None
        self._epoch = 0
        self.idle = asyncio.Event()  # no head being worked out (set again when `after_reply`'s work ends)
        self.idle.set()
        self.warmed = 0  # heads submitted for prefilling

    def after_reply(self) -> Awaitable[None]:
        self.idle.clear()  # now, not when the coroutine first runs
        return self._warm(self._epoch, self._history(), self._reply_tokens())

    async def _warm(self, epoch: int, history: list[dict[str, str]], reply_tokens: int) -> None:
        try:
            kept = await asyncio.to_thread(self._fitter.trim_ahead, history, reply_tokens, NEXT_MESSAGE_TOKENS)
            if kept is None or epoch != self._epoch:
                return
            handle = await submit_off_loop(lambda: self._engine.prefill_head(kept, mode=self._mode()))
            if epoch != self._epoch:  # the next turn was submitted meanwhile
                handle.cancel()
                return
            previous, self._handle = self._handle, handle
            if previous is not None:  # a reply completed twice with no turn between (text clients)
                previous.cancel()
            self.warmed += 1
            log.debug("prefilling the next turn's head (%d messages) ahead of it", len(kept))
        except Exception as exc:  # e.g. an engine at its limits: the turn prefills its head itself
            log.info("the next turn's head is not prefilled ahead: %s", exc)
        finally:
            self.idle.set()

    def cancel(self) -> None:
        self._epoch += 1
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
