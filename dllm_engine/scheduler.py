"""The scheduler: which live requests take part in the next pass, and what a pass's
predictions do to each of them (commits, finishing, the updates their handles get).

Used from the engine's scheduler thread only; `Engine` owns the thread and the lock that
`submit()` takes, and hands new requests over through `admit()`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable

import torch

from dllm_engine.decoding import BlockCausalDecoder, DeadlineController, FullAttentionDecoder, StepPlan, make_policy
from dllm_engine.decoding.batch_commit import Choice, choose_commits
from dllm_engine.detokenize import IncrementalText
from dllm_engine.models.families import FAMILIES
from dllm_engine.request import DraftUpdate, GenerationParams, RequestHandle, RequestStats

log = logging.getLogger(__name__)

BACKGROUND_EVERY = 4  # while foreground requests are live, background ones join one pass in this many


@dataclass
class LiveRequest:
    handle: RequestHandle
    params: GenerationParams
    decoder: BlockCausalDecoder | FullAttentionDecoder
    policy: object
    threshold: float
    submitted: float
    deadline: DeadlineController | None
    generator: torch.Generator | None
    stats: RequestStats = field(default_factory=RequestStats)
    committed_in_denoise: int = 0
    token_probs: list[float] | None = None  # GenerationParams.score_tokens, after the first pass
    text: IncrementalText | None = None  # the reply's text, decoded a tail at a time

    @property
    def sampling(self) -> tuple[float, torch.Generator | None]:
        return self.params.temperature, self.generator

    @classmethod
    def around(cls, decoder, config, params: GenerationParams, request_id: int,
               clock: Callable[[], float]) -> "LiveRequest":
        """A new request decoding with `decoder`: its commit policy, deadline and sampling."""
        family = FAMILIES.get(config.family)
        threshold = params.threshold if params.threshold is not None else config.default_threshold
        fallback = params.fallback or (family.commit_fallback if family else "most_confident")
        now = clock()
        generator = None
        if params.temperature > 0:
            generator = torch.Generator().manual_seed(params.seed if params.seed is not None else int(now * 1e6))
        policy = make_policy(params.policy, threshold, params.factor, params.steps_per_block, decoder.block_size,
                             fallback)
        return cls(handle=RequestHandle(request_id, background=params.background), params=params, decoder=decoder,
                   policy=policy, threshold=threshold, submitted=now,
                   deadline=DeadlineController(params.deadline_s, threshold, clock) if params.deadline_s else None,
                   generator=generator, stats=RequestStats(prompt_tokens=len(decoder.prompt_ids)))


@dataclass
class PendingStep:
    """A request between its step's predictions and its commits."""

    request: LiveRequest
    plan: StepPlan
    tokens: list[int]
    free: list[int]
    exact: int  # commits already made: forced AR tokens and verified drafts
    choice: Choice | None = None  # None: nothing left for the policy to decide


class Scheduler:
    def __init__(self, decode: Callable[[list[int]], str], clock: Callable[[], float], share_prefixes: bool = True,
                 on_greedy_reply: Callable[[list[int], list[int]], None] | None = None):
        self.decode = decode
        self.clock = clock
        # (prompt ids, reply ids) of each ended greedy reply, cut or whole: the target's own text
        self.on_greedy_reply = on_greedy_reply
        self.live: list[LiveRequest] = []
        self.passes = 0
        # whether a prompt lists the KV pool's published blocks of its head (kv_pool.py)
        self.share_prefixes = share_prefixes

    # ---- admission and batch choice ----------------------------------------------------------
    def admit(self, request: LiveRequest) -> None:
        """List the pool's blocks of the prompt's head in the request's table, make it live."""
        decoder = request.decoder
        if self.share_prefixes and decoder.reusable_cache:
            cache = decoder.cache
            reused = self._guarded(request, cache.pool.attach_prefix, cache, decoder.prompt_ids,
                                   len(decoder.prompt_ids) - 1, cache.has_head)
            if reused is None:
                return  # ended with an error
            if reused:
                decoder.reuse_prefix(reused)
                request.stats.cached_prompt_tokens = reused
        self.live.append(request)

    def publish_blocks(self, request: LiveRequest, ended: bool = False) -> None:
        """Offers the request's blocks whose keys and values became final to later prompts."""
        decoder, cache = request.decoder, request.decoder.cache
        final = decoder.final_len()
        if cache is not None and final and (final // cache.pool.block_tokens > len(cache.keys) or ended):
            cache.pool.publish(cache, decoder.cached_token_ids(), final, cache.has_head, ended=ended)

    def drop_cancelled(self) -> None:
        for request in [r for r in self.live if r.handle.cancelled]:
            self.finish(request, "cancelled")

    def schedule(self) -> list[LiveRequest]:
        """Every live request, except that background ones (speculative drafts) sit out while a
        foreground one is live, but for every BACKGROUND_EVERY-th pass: on a CPU each row costs
        about the same, so a draft that may be thrown away must not slow a reply being heard."""
        foreground = [r for r in self.live if not r.handle.background]
        if foreground and self.passes % BACKGROUND_EVERY:
            return foreground
        return list(self.live)

    def plan(self, batch: list[LiveRequest]) -> tuple[list[LiveRequest], list[StepPlan]]:
        """Each request's plan for this pass; a request whose plan fails ends alone. At most one
        long prompt's chunk joins a pass (a foreground request's first, then the oldest): a reply
        in the batch waits for one chunk of prefill a step, however many prompts arrive at once."""
        planned = []
        for request in batch:
            plan = self._guarded(request, request.decoder.plan)
            if plan is not None:
                planned.append((request, plan))
        chunks = [(r.handle.background, r.submitted, i) for i, (r, p) in enumerate(planned) if p.is_prefill_chunk]
        if len(chunks) > 1:  # plans are pure: the others make the same plan next pass
            kept = min(chunks)[2]
            waiting = {i for _, _, i in chunks} - {kept}
            planned = [step for i, step in enumerate(planned) if i not in waiting]
        return [r for r, _ in planned], [p for _, p in planned]

    # ---- after the pass ------------------------------------------------------------------------
    def postprocess(self, batch: list[LiveRequest], plans: list[StepPlan], tokens: list[int],
                    confidence: torch.Tensor) -> None:
        """Exact commits, one batched commit choice for the rest, then each request's commits."""
        self.passes += 1
        steps, offset = [], 0
        for request, plan in zip(batch, plans):
            rows = slice(offset, offset + len(plan.targets))
            offset = rows.stop
            step = self._guarded(request, self._take_predictions, request, plan, tokens[rows], confidence[rows])
            if step is not None:
                steps.append(step)
        try:
            chosen = choose_commits([step.choice for step in steps if step.choice is not None])
        except Exception as exc:
            log.exception("commit selection failed")
            for step in steps:
                self.finish(step.request, "error", error=f"{type(exc).__name__}: {exc}")
            return
        picks = iter(chosen)
        for step in steps:
            self._guarded(step.request, self._commit, step, next(picks) if step.choice is not None else [])

    def fail(self, batch: list[LiveRequest], exc: Exception) -> None:
        for request in batch:
            self.finish(request, "error", error=f"{type(exc).__name__}: {exc}")

    def _take_predictions(self, request: LiveRequest, plan: StepPlan, tokens: list[int],
                          confidence: torch.Tensor) -> PendingStep:
        decoder, stats = request.decoder, request.stats
        free, exact = decoder.take_predictions(plan, tokens)
        step = PendingStep(request, plan, tokens, free, exact)
        if request.deadline is not None:
            request.deadline.record_step()
        if decoder.wants_choice(free, exact):
            threshold = None
            if request.deadline is not None:
                pace = request.committed_in_denoise / max(1, stats.denoise_steps)
                threshold = request.deadline.threshold(decoder.tokens_left(), pace if stats.denoise_steps else 2.0)
            step.choice = Choice(request.policy, confidence[free], threshold, decoder.steps_left(request.policy),
                                 at_least_one=exact == 0)
        return step

    def _commit(self, step: PendingStep, chosen: list[bool]) -> None:
        request = step.request
        decoder, stats = request.decoder, request.stats
        committed = step.exact + decoder.commit_chosen(step.plan, step.tokens, step.free, chosen)
        stats.forward_passes += 1
        stats.prefill_passes += not step.plan.targets  # a long prompt's chunk
        stats.denoise_steps += 1
        stats.committed_tokens += committed
        stats.count_pass(committed)
        stats.continued_passes = decoder.continued_steps
        request.committed_in_denoise += committed
        if stats.first_token_s is None and decoder.settled_ids():
            stats.first_token_s = self.clock() - request.submitted
        if decoder.finished:
            self.finish(request, decoder.finish_reason)
        else:
            self.publish_blocks(request)
            self.publish(request, final=False)

    def _guarded(self, request: LiveRequest, function: Callable, *args):
        """function(*args), ending only this request if its bookkeeping fails."""
        try:
            return function(*args)
        except Exception as exc:
            log.exception("request %d failed", request.handle.request_id)
            self.finish(request, "error", error=f"{type(exc).__name__}: {exc}")
            return None

    # ---- ending and telling --------------------------------------------------------------------
    def finish(self, request: LiveRequest, reason: str, error: str | None = None) -> None:
        if request in self.live:
            self.live.remove(request)
        decoder = request.decoder
        if decoder.cache is not None:
            try:
                if reason != "error":
                    self.publish_blocks(request, ended=True)
            finally:  # its blocks go back now, not when the handle dies
                decoder.cache.release()
                decoder.cache = None
        if reason != "error" and request.params.temperature == 0 and self.on_greedy_reply is not None:
            try:  # a reply kept for later drafts: its failure must not touch this request
                self.on_greedy_reply(decoder.prompt_ids, decoder.settled_ids())
            except Exception:
                log.exception("request %d: its reply could not be kept for drafting", request.handle.request_id)
        if request.deadline is not None:
            request.stats.deadline_met = request.deadline.met()
        self.publish(request, final=True, reason=reason, error=error)

    def publish(self, request: LiveRequest, final: bool, reason: str | None = None, error: str | None = None) -> None:
        decoder, stats = request.decoder, request.stats
        settled, drafted = decoder.settled_ids(), decoder.draft_ids()
        stats.new_tokens = len(settled)
        stats.elapsed_s = self.clock() - request.submitted
        if request.text is None:
            request.text = IncrementalText(self.decode)
        committed_text = request.text.text(settled)
        draft_text = (request.text.extended(settled, drafted[len(settled):]) if drafted[:len(settled)] == settled
                      else self.decode(drafted))
        request.handle._publish(DraftUpdate(
            request_id=request.handle.request_id,
            committed_text=committed_text,
            draft_text=draft_text,
            token_ids=settled, step=stats.denoise_steps, final=final, finish_reason=reason,
            stats=RequestStats(**vars(stats)), error=error, token_probs=request.token_probs,
        ))

    def close(self, pending: list[LiveRequest], reason: str = "cancelled", error: str | None = None) -> None:
        """End every live and pending request (engine closing, or the scheduler failing)."""
        for request in self.live + pending:
            try:
                self.finish(request, reason, error=error)
            except Exception:  # one handle's failure must not keep the others waiting
                log.exception("could not end request %d", request.handle.request_id)
        self.live = []
