"""semantic_vad's judgement: do the user's words so far sound finished?

The LLM already resident in the engine answers it: the probability that the user's turn ends
(the chat template's end-of-turn token) right after the transcript, in the conversation so
far: one pass over a prompt whose head the prefix cache usually holds. SmolLM2 reads the
punctuation Whisper writes, so "What is the capital of France?" scores ~0.6 and "What is the
capital of" ~0.0. Without a verdict in time (a busy engine) the turn ends at server_vad's
silence window.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

from voice_app.core.models import Engine
from voice_app.core.offload import submit_off_loop

log = logging.getLogger(__name__)

VERDICT_TIMEOUT_S = 1.0  # a verdict later than this is not worth waiting for


class EndOfTurnJudge:
    def __init__(self, engine: Engine, conversation_with: Callable[[str], list[dict[str, str]]],
                 threshold: float, fit: Callable[[list[dict[str, str]]], list[dict[str, str]]] | None = None):
        self._engine = engine
        self._conversation_with = conversation_with  # the transcript as the pending user message
        self._fit = fit or (lambda messages: messages)  # trims the prompt to the context (blocking)
        self.threshold = threshold
        self._cache: dict[str, float] = {}

    def forget(self) -> None:
        """A new turn: earlier verdicts were about another context."""
        self._cache.clear()

    async def sounds_finished(self, transcript: str) -> bool | None:
        """True or False, or None when the engine could not say in time."""
        probability = await self.probability(transcript)
        return None if probability is None else probability >= self.threshold

    async def probability(self, transcript: str) -> float | None:
        """p(end of turn | conversation, transcript); None when the engine cannot say in time."""
        text = transcript.strip()
        if not text:
            return None
        if text in self._cache:
            return self._cache[text]
        messages = self._conversation_with(text)
        try:  # the chat template and the tokenizer run on a worker thread, not the event loop
            handle = await submit_off_loop(
                lambda: self._engine.end_of_turn_probability(self._fit(messages), background=False))
        except Exception as exc:  # an overloaded or failed engine: the silence rule decides alone
            log.info("no end-of-turn verdict for %r: %s", text, exc)
            return None
        try:
            final = await asyncio.wait_for(_final_update(handle), VERDICT_TIMEOUT_S)
        except asyncio.TimeoutError:
            handle.cancel()
            log.info("end-of-turn verdict for %r took over %.0f ms", text, VERDICT_TIMEOUT_S * 1000)
            return None
        if not final.token_probs:
            return None
        self._cache[text] = final.token_probs[0]
        log.debug("p(end of turn | %r) = %.3f", text, final.token_probs[0])
        return final.token_probs[0]


async def _final_update(handle):
    final = None
    async for update in handle:
        final = update
    return final
