"""What the engine times on its machine to choose how it decodes: the mode `auto` runs
(Engine.choose_mode) and the draft head's block (Engine.choose_block). Every timing runs its
candidates in interleaved rounds and keeps each one's best, so a burst of another process's
load slows one round, not one candidate.

The functions that touch the runner run on the engine's scheduler thread (Engine._on_scheduler).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from dllm_engine.decoding import StepPlan, Target
from dllm_engine.decoding.step_costs import StepCosts
from dllm_engine.decoding.suffix_drafts import RecentReplies
from dllm_engine.models.kv_pool import BlockTable
from dllm_engine.models.transformer import Segment
from dllm_engine.request import GenerationParams

if TYPE_CHECKING:
    from dllm_engine.engine import Engine

MODES = ("autoregressive", "diffusion")
MODE_PROMPT = [{"role": "user", "content": "Tell me a short story about a lighthouse keeper."}]
FIRST_TOKEN = 42  # the exact token a timed block starts with (any id: timing only)
# the batches choose_block times besides one request alone: verify passes of that many requests
# with that many rows each, and the head drafting for that many at once (what drafting costs
# when a batch's requests share a pass: a row of another request costs more than one more row
# of the same, its attention reading another cache)
BATCH_REQUESTS = [2, 4, 8]
BATCH_ROWS_EACH = [1, 2, 4, 8]


def reply_speeds(engine: "Engine", template: GenerationParams, new_tokens: int, rounds: int) -> dict[str, float]:
    """Tokens/s of a greedy reply in each mode (`template`'s other settings), the best of `rounds`.
    Continuation drafts see no recent replies meanwhile: each round asks the same question, and
    diffusion would draft the reply AR had just said."""
    chooser = engine.draft_chooser
    kept = chooser.recent if chooser is not None else None
    if chooser is not None:
        chooser.recent = RecentReplies(0)
    try:
        for mode in MODES:  # warm, and cache the prompt
            engine.generate(MODE_PROMPT, dataclasses.replace(template, mode=mode, max_new_tokens=4))
        speeds = {mode: 0.0 for mode in MODES}
        for _ in range(rounds):
            for mode in MODES:
                started = time.perf_counter()
                update = engine.generate(MODE_PROMPT, dataclasses.replace(template, mode=mode, max_new_tokens=new_tokens))
                speeds[mode] = max(speeds[mode], update.stats.new_tokens / max(time.perf_counter() - started, 1e-9))
    finally:
        if chooser is not None:
            chooser.recent = kept
    return speeds


def filled_cache(engine: "Engine", context: int, rows: int) -> BlockTable:
    """A request cache (the head's layers included) whose first `context` positions hold a
    prefilled filler prompt, with room for a verify pass of `rows` and the head's block."""
    head = engine.loaded.draft_head
    cache = BlockTable.standalone(engine.config, context + rows + head.spec.block_size + 1, engine.cache_dtype,
                                  engine.device, extra_layers=head.cache_layers)
    filler = ((torch.arange(context) % 1000 + 100) % engine.config.vocab_size).tolist()
    engine._runner.run([StepPlan([Segment(torch.tensor(filler), 0, cache, context, "causal")],
                                 [Target(0, context - 1, 0)], tap_rows=list(range(context)))], [(0.0, None)])
    return cache


def verify_plan(cache: BlockTable, context: int, rows: int) -> StepPlan:
    """A draft-head step's target pass: `rows` causal rows after the context, every row tapped."""
    return StepPlan([Segment(torch.arange(rows) + FIRST_TOKEN, context, cache, context + rows, "causal")],
                    [Target(0, r, r) for r in range(rows)], tap_rows=list(range(rows)))


def timed_shapes(most_rows: int, batched: bool) -> tuple[list[tuple[int, int]], list[int]]:
    """What Engine.choose_block times: verify passes as (requests, rows each), one request with
    1..most_rows rows, and where drafts are chosen for the batch (`batched`) those of
    BATCH_REQUESTS requests too; and the head's block pass for that many requests."""
    shapes = [(1, rows) for rows in range(1, most_rows + 1)]
    if batched:
        shapes += [(requests, rows) for requests in BATCH_REQUESTS for rows in BATCH_ROWS_EACH]
    return shapes, [1] + (BATCH_REQUESTS if batched else [])


@dataclass
class StepTimes:
    """A draft-head decoding step's parts, in seconds, each the fastest of its rounds."""

    verify: list[float]  # the verify pass, by shape (requests, rows each) as asked
    context: float  # the head takes the verified rows' features (every step)
    blocks: list[float]  # the head drafts a block for each of n requests, by n (as asked)

    def costs(self, shapes: list[tuple[int, int]], batches: list[int]) -> StepCosts:
        verify: dict[int, list[tuple[int, float]]] = {}
        for (requests, rows), seconds in zip(shapes, self.verify):
            verify.setdefault(requests, []).append((rows, seconds))
        return StepCosts(verify, self.context, list(zip(batches, self.blocks)), timed=True)

    def report(self, shapes: list[tuple[int, int]], batches: list[int]) -> dict:
        return {"verify_ms": {f"{n}x{rows}": round(1000 * v, 2) for (n, rows), v in zip(shapes, self.verify)},
                "head_context_ms": round(1000 * self.context, 2),
                "head_block_ms": {n: round(1000 * b, 2) for n, b in zip(batches, self.blocks)}}


def draft_step_seconds(engine: "Engine", shapes: list[tuple[int, int]], batches: list[int], context: int,
                       repeats: int) -> StepTimes:
    """Times a draft-head decoding step's parts: the verify pass of each shape (that many
    requests, each with that many rows), and the head's block pass for each count of requests;
    the fastest of `repeats` rounds (after a warm-up)."""
    runner = engine._runner
    most_rows = max(rows for _, rows in shapes)
    caches = [filled_cache(engine, context, most_rows) for _ in range(max(max(n for n, _ in shapes), max(batches)))]
    times = StepTimes([float("inf")] * len(shapes), float("inf"), [float("inf")] * len(batches))
    for round_ in range(repeats + 1):
        for index, (requests, rows) in enumerate(shapes):
            plans = [verify_plan(cache, context, rows) for cache in caches[:requests]]
            started = time.perf_counter()
            runner.run(plans, [(0.0, None)] * requests)
            if round_:
                times.verify[index] = min(times.verify[index], time.perf_counter() - started)
        started = time.perf_counter()
        runner.draft([([(plans[0].taps[:1], context)], caches[0], None, None)])
        if round_:
            times.context = min(times.context, time.perf_counter() - started)
        for index, count in enumerate(batches):
            started = time.perf_counter()
            runner.draft([([], cache, FIRST_TOKEN, context) for cache in caches[:count]])
            if round_:
                times.blocks[index] = min(times.blocks[index], time.perf_counter() - started)
    return times


def block_table(step_seconds: list[float], kept_by_offset: list[float]) -> list[dict]:
    """Per block (the exact token + k drafts, k from 1): the step's cost, the tokens a pass
    the head's held-out acceptance gives it, and the tokens a second that follow."""
    table = []
    for drafts, seconds in enumerate(step_seconds, start=1):
        tokens = 1 + sum(kept_by_offset[:drafts])
        table.append({"block": drafts + 1, "ms": round(1000 * seconds, 2), "tokens_per_pass": round(tokens, 3),
                      "tokens_per_s": round(tokens / seconds, 1)})
    return table
