"""Exact decoding with a draft head (dllm_engine/models/draft_head.py): the target verifies a
block the head drafted, the head drafts the next one from the target's features.

One step of a request:
1. the target's causal pass over [the last exact token, d_0 .. d_k-1] (the head's drafts for
   the next k positions): the last exact token's row gives the target's own next token t_0
   (always committed); draft d_j is right when it equals t_j, and then its row gives t_j+1
   exactly. The step commits t_0 .. t_a, where d_0 .. d_a-1 were right: what greedy AR
   decoding would have produced, in one pass. The rows of the right drafts have written
   exact keys and values (they stay in the cache); t_a is written by the next pass.
2. the head takes the tapped features of the pass's verified rows as context and drafts
   [t_a, mask, ...]: the next step's d_0 .. d_k-1 (the engine runs it right after the pass).
   Where a continuation of the request's tokens from text the target wrote before promises
   more tokens a second (decoding/suffix_drafts.py, `DraftChooser`), the next pass checks that
   continuation instead (up to `chooser.max_drafts` tokens) and the head's block pass is spared;
   where a pass's rows cost more than drafts keep (a large batch), it checks fewer of the head's
   drafts or none. The head still takes the verified rows' features, for the steps after.

The first step is the prompt's prefill, with no drafts. The reply equals greedy AR decoding
token for token; the head only decides how many tokens a pass commits.
"""

from __future__ import annotations

import torch
from torch import Tensor

from dllm_engine.decoding.block_decoder import BlockCausalDecoder
from dllm_engine.decoding.plan import StepPlan, Target
from dllm_engine.decoding.suffix_drafts import DraftChooser, Proposal
from dllm_engine.models.transformer import Segment


class DraftHeadDecoder(BlockCausalDecoder):
    """block_size: the head's block (the target's token and block_size - 1 of its drafts);
    chooser: where continuations may replace the head's drafts, a step then commits up to
    chooser.max_drafts + 1 tokens (the decoder's window is that wide)."""

    def __init__(self, *args, chooser: DraftChooser | None = None, greedy: bool = True, **kwargs):
        kwargs.update(adapter=False, bidirectional_clean_blocks=False, exact=True)
        self.head_drafts = kwargs["block_size"] - 1
        self.chooser = chooser
        # a sampled reply's kept drafts say how often a draft matches a sample, not the greedy
        # reply the chooser's odds are of: only greedy requests teach it odds (all, what a search saved)
        self.teaches_chooser = greedy
        if chooser is not None:
            kwargs["block_size"] = max(kwargs["block_size"], chooser.max_drafts + 1)
        kwargs.setdefault("verify_drafts", kwargs["block_size"] - 1)
        super().__init__(*args, **kwargs)
        self.continued_steps = 0  # steps whose drafts came from a continuation, not the head
        self._drafted_by: Proposal | str | None = None  # who drafted what the next pass checks
        self._checked = 0  # drafts the last pass checked
        self._head_checks = self.head_drafts  # of the head's next block, the drafts to check
        # verified rows' features the head has not taken yet: (features, first position)
        self.contexts: list[tuple[Tensor, int]] = []
        self._pass_start = 0
        self._pass_features: Tensor | None = None
        self._head_written = 0  # positions [0, this) hold the head's context (or will, after this step's head pass)

    def reuse_prefix(self, length: int) -> None:
        super().reuse_prefix(length)
        self._head_written = length  # shared blocks carry the head's layers (KVPool.attach_prefix)

    def final_len(self) -> int:
        return min(self.written, self._head_written)

    def plan(self) -> StepPlan:
        chunk = self._chunk_plan()
        if chunk is not None:  # a long prompt's chunk: its features are context too
            chunk.tap_rows = list(range(chunk.writes))
            return chunk
        drafts = self._drafts()
        tokens = self.unwritten + drafts
        last = len(self.unwritten) - 1
        plan = StepPlan([Segment(torch.tensor(tokens), self.written, self.cache, self.written + len(tokens), "causal")],
                        [Target(0, last, 0, forced=True)], writes=len(self.unwritten))
        plan.targets.extend(Target(0, last + 1 + j, j + 1, given=draft) for j, draft in enumerate(drafts))
        plan.tap_rows = list(range(len(tokens)))
        return plan

    def take_predictions(self, plan: StepPlan, tokens: list[int]) -> tuple[list[int], int]:
        if not plan.targets:  # a prefill chunk: every row it wrote is verified
            self.contexts.append((plan.taps, self.written))
        self._pass_start, self._pass_features = self.written, plan.taps
        self._checked = sum(t.given is not None for t in plan.targets)
        return super().take_predictions(plan, tokens)

    def _slide(self) -> None:
        """The committed prefix t_0 .. t_a into the reply; the right drafts' rows stay written, t_a
        is the next pass's first row, and the pass's verified rows become the head's context."""
        settled = self._settled_prefix()
        if not settled:
            return
        kept_drafts = settled - 1
        self._tell_chooser(kept_drafts)
        self.written += kept_drafts
        if self._pass_features is not None:
            self.contexts.append((self._pass_features[:self.written - self._pass_start], self._pass_start))
        self.reply.extend(self.block[:settled])
        self.unwritten = [self.block[settled - 1]]
        room = min(self.block_size, self.max_new_tokens - len(self.reply))
        self.block, self.guesses = [self.mask_id] * max(0, room), [self.mask_id] * max(0, room)
        if not self.block:
            self.finish_reason = "length"

    # ---- the head's step -----------------------------------------------------------------------
    def draft_request(self) -> tuple[list[tuple[Tensor, int]], int | None, int | None] | None:
        """What the head's step has to do for this request: (the contexts it has not taken,
        the exact token a block starts with and its position, or None, None when no block is
        wanted: a prefill chunk, no room left), or None when there is nothing at all."""
        if self.finished or not self.contexts:
            return None
        contexts, self.contexts = self.contexts, []
        self._head_written = max(self._head_written, *(start + len(features) for features, start in contexts))
        if not (self.reply and len(self.block) >= 2):
            return contexts, None, None
        self._head_checks = min(self.head_drafts, len(self.block) - 1)
        if self.chooser is not None:
            choice = self.chooser.choose(self.prompt_ids + self.reply, self._head_checks)
            if isinstance(choice, Proposal):
                self.continued_steps += 1
                self._guess(choice.tokens)
                self._drafted_by = choice
                return contexts, None, None
            self._head_checks = choice
            if not choice:  # drafts do not pay now: the next pass is the exact token alone
                return contexts, None, None
        return contexts, self.unwritten[-1], self.written

    def take_drafts(self, drafted: list[int]) -> None:
        """The head's guesses for the next positions (the next pass checks the first ones the
        chooser asked for)."""
        self._guess(drafted[:self._head_checks])
        self._drafted_by = "head"

    def _tell_chooser(self, kept: int) -> None:
        """How the drafts the last pass checked fared, so the chooser learns this engine's odds."""
        drafted_by, self._drafted_by = self._drafted_by, None
        if self.chooser is None or drafted_by is None or not self._checked:
            return
        if drafted_by != "head":
            self.chooser.observe_continuation(drafted_by.cut(self._checked), kept, odds=self.teaches_chooser)
        elif self.teaches_chooser:
            self.chooser.observe_head(self._checked, kept)

    def _guess(self, drafts: list[int]) -> None:
        for position, token in enumerate(drafts[:len(self.block) - 1]):
            self.guesses[position] = token
