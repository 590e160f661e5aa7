"""Block-by-block drafting for one request.

`BlockCausalDecoder` serves block-causal models (SDAR, Fast-dLLM v2, our default) and the
autoregressive mode of every model (block size 1, adapter off). The KV cache is exact:
denoising steps never keep their keys and values; settled tokens are written to the cache with
the model's clean attention by the next step, which in the same packed pass denoises the block
against them. Models whose cache is written causally (ours, AR models) slide the block: each
step writes the settled prefix of the block, takes the exact autoregressive prediction for the
first open position from that write, and keeps the block's window B tokens wide. Models whose
clean blocks are written bidirectionally (SDAR, Fast-dLLM v2) keep fixed, aligned blocks.

Sliding decoders also verify drafts: the cache write carries the block's current guesses for
its first few open positions after the settled tokens, causally and with the base weights, so
the row of guess j predicts position j+1 exactly whenever guesses 0..j were right. Each step
then commits the exact token at the first open position plus one more per leading right
guess: tokens the autoregressive model would have produced, whatever their confidence.

`FullAttentionDecoder` serves bidirectional models (LLaDA, Dream): semi-autoregressive blocks
with a dual cache refreshed by one full pass at every block start.
"""

from __future__ import annotations

import torch

from dllm_engine.decoding.plan import StepPlan, Target
from dllm_engine.models.kv_pool import BlockTable
from dllm_engine.models.transformer import Segment


class BlockDecoderBase:
    """What both decoders share: the block, its commits, EOS and length bookkeeping."""

    # whether cache slot i holds keys and values of tokens 0..i alone, so its blocks can serve
    # another request's prompt (dllm_engine/models/kv_pool.py); BlockCausalDecoder may say yes
    reusable_cache = False
    exact = False  # only checked tokens commit (BlockCausalDecoder may say yes)
    continued_steps = 0  # steps that checked a continuation instead of a drafter's block (DraftHeadDecoder)

    def __init__(self, prompt_ids: list[int], cache: BlockTable, block_size: int, max_new_tokens: int,
                 mask_id: int, eos_ids: set[int], shift: bool, stop_at_eos: bool):
        self.prompt_ids = prompt_ids
        self.cache = cache
        self.block_size = block_size
        self.max_new_tokens = max_new_tokens
        self.mask_id = mask_id
        self.eos_ids = eos_ids if stop_at_eos else set()
        self.shift = shift
        self.reply: list[int] = []  # tokens of finished blocks (final)
        self.block: list[int] = []
        self.guesses: list[int] = []  # best current guess for every block position
        self.finish_reason: str | None = None
        self.steps_in_block = 0

    # ---- views ------------------------------------------------------------------------
    @property
    def drafts_only(self) -> bool:
        """Whether this request's free rows only ever draft (exact decoding: what commits is
        checked), so their head may take the draft vocabulary."""
        return self.exact

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def settled_ids(self) -> list[int]:
        """Reply tokens that are final: finished blocks, then the block up to its first mask."""
        ids = list(self.reply)
        for token in self.block:
            if token == self.mask_id or token in self.eos_ids:
                break
            ids.append(token)
        return ids

    def draft_ids(self) -> list[int]:
        ids = list(self.reply)
        for token, guess in zip(self.block, self.guesses):
            chosen = guess if token == self.mask_id else token
            if chosen in self.eos_ids:
                break
            if chosen != self.mask_id:  # no guess yet for this position
                ids.append(chosen)
        return ids

    def masked_positions(self) -> list[int]:
        """Positions still to commit: masked ones before the first committed EOS."""
        needed = []
        for position, token in enumerate(self.block):
            if token in self.eos_ids:
                break
            if token == self.mask_id:
                needed.append(position)
        return needed

    def final_len(self) -> int:
        """Leading positions whose keys and values are final and shareable (0: none ever are)."""
        return 0

    def masked_count(self) -> int:
        return len(self.masked_positions())

    def tokens_left(self) -> int:
        return self.max_new_tokens - len(self.reply) - (len(self.block) - self.masked_count())

    # ---- commits ------------------------------------------------------------------------
    def _new_block(self) -> bool:
        size = min(self.block_size, self.max_new_tokens - len(self.reply))
        if size <= 0:
            self.finish_reason = "length"
            return False
        self.block = [self.mask_id] * size
        self.guesses = [self.mask_id] * size
        self.steps_in_block = 0
        return True

    def take_predictions(self, plan: StepPlan, tokens: list[int]) -> tuple[list[int], int]:
        """Record this step's guesses and commit its exact ones (forced targets, verified
        drafts); returns the indices of the free targets left for the policy and the number
        of exact commits. Plans list forced and draft-check targets first, in block order."""
        self.steps_in_block += 1
        free = []
        exact = 0
        drafts_hold = True
        for index, target in enumerate(plan.targets):
            position = target.position
            if target.given is not None:
                drafts_hold = drafts_hold and self.block[position - 1] == target.given
                if drafts_hold and self.block[position] == self.mask_id:
                    self.block[position] = self.guesses[position] = tokens[index]
                    exact += 1
                continue
            if self.block[position] != self.mask_id:  # settled by a verified draft this step
                continue
            self.guesses[position] = tokens[index]
            if target.forced:
                self.block[position] = tokens[index]
                exact += 1
            else:
                free.append(index)
        return free, exact

    def wants_choice(self, free: list[int], exact: int) -> bool:
        # after an exact commit the rest must earn it; once EOS closed the block, none
        return bool(free) and not (exact and self._eos_closed())

    def commit_chosen(self, plan: StepPlan, tokens: list[int], free: list[int], chosen: list[bool]) -> int:
        """Commit the chosen free targets and move the block on; returns how many."""
        committed = 0
        for pick, index in zip(chosen, free):
            if pick:
                self.block[plan.targets[index].position] = tokens[index]
                committed += 1
        self._after_commit()
        return committed

    def steps_left(self, policy) -> int | None:
        total = getattr(policy, "steps_per_block", None)
        return None if total is None else max(1, total - self.steps_in_block + 1)

    def _eos_closed(self) -> bool:
        return bool(self.block) and self.masked_count() == 0 and any(t in self.eos_ids for t in self.block)

    def _block_outcome(self) -> str | None:
        """'eos' when the reply ends in this block, 'full' when the block is done, else None."""
        if self.masked_count():
            return None
        return "eos" if any(t in self.eos_ids for t in self.block) else "full"

    def _after_commit(self) -> None:
        raise NotImplementedError

    def plan(self) -> StepPlan:
        raise NotImplementedError


class BlockCausalDecoder(BlockDecoderBase):
    # a prompt longer than this prefills a chunk a pass (0: all at once); the engine sets it, so
    # a live reply batched with a long prompt waits for one chunk, not for the whole prefill
    prefill_chunk = 0
    # past this many written positions a chunk shrinks in proportion (down to a quarter): its
    # rows' attention reads the whole context, so rows x context, not rows, is what a pass costs
    CHUNK_CONTEXT = 512

    def __init__(self, *args, adapter: bool, bidirectional_clean_blocks: bool, verify_drafts: int = 0,
                 exact: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self.adapter = adapter
        self.bidirectional_clean_blocks = bidirectional_clean_blocks
        self.sliding = not bidirectional_clean_blocks
        self.verify_drafts = verify_drafts if self.sliding and self.shift else 0
        # only the forced AR token and confirmed drafts commit (every step has the former)
        self.exact = exact and self.sliding and self.shift
        self.written = 0  # cache positions [0, written) hold final keys and values
        self.unwritten: list[int] = list(self.prompt_ids)  # to be written by the next step
        self._new_block()

    def wants_choice(self, free: list[int], exact: int) -> bool:
        if self.exact and exact:
            return False
        return super().wants_choice(free, exact)

    # ---- prefix reuse (dllm_engine/models/kv_pool.py) -------------------------------------
    @property
    def reusable_cache(self) -> bool:
        """Cache slot i holds base-weight causal keys and values of tokens 0..i alone (not so
        when clean blocks are written bidirectionally)."""
        return not self.bidirectional_clean_blocks

    def final_len(self) -> int:
        return self.written if self.reusable_cache else 0

    def cached_token_ids(self) -> list[int]:
        """The tokens whose final keys and values cache slots [0, len) hold."""
        return (self.prompt_ids + self.settled_ids())[: self.written]

    def reuse_prefix(self, length: int) -> None:
        """Positions [0, length) hold the prompt's head already (shared blocks): write only the rest
        (at least the last prompt token, whose row predicts the first reply token)."""
        if self.written or not 0 < length < len(self.prompt_ids):
            raise ValueError(f"cannot reuse {length} cached tokens of a {len(self.prompt_ids)}-token prompt "
                             f"after {self.written} were written")
        self.written = length
        self.unwritten = list(self.prompt_ids[length:])

    def chunk_size(self) -> int:
        """Prompt tokens the next chunk writes: prefill_chunk, fewer over a long context."""
        shrunk = self.prefill_chunk * self.CHUNK_CONTEXT // max(self.CHUNK_CONTEXT, self.written)
        return max(shrunk, self.prefill_chunk // 4, 1)

    def _chunk_plan(self) -> StepPlan | None:
        """The next chunk of a long prompt, written causally with nothing predicted yet."""
        if not (self.sliding and self.prefill_chunk and not self.reply and len(self.unwritten) > self.chunk_size()):
            return None
        tokens = torch.tensor(self.unwritten[:self.chunk_size()])
        end = self.written + len(tokens)
        return StepPlan([Segment(tokens, self.written, self.cache, end, "causal")], writes=len(tokens))

    def plan(self) -> StepPlan:
        chunk = self._chunk_plan()
        if chunk is not None:
            return chunk
        plan = StepPlan(writes=len(self.unwritten))
        start = self.written
        if self.unwritten:
            drafts = self._drafts()
            plan.segments.append(self._write_segment(start, drafts))
            start += len(self.unwritten)  # the block's segment overwrites the drafts' cache slots after them
            last = len(self.unwritten) - 1
            if self.shift and self.block[0] == self.mask_id:  # the AR prediction of the block's first token
                plan.targets.append(Target(0, last, 0, forced=True))
                plan.targets.extend(Target(0, last + 1 + j, j + 1, given=draft) for j, draft in enumerate(drafts))
        needed = [p for p in self.masked_positions() if not (self.shift and p == 0)]
        if needed:
            tokens = torch.tensor(self.block)
            plan.segments.append(Segment(tokens, start, self.cache, start + len(self.block), "full", adapter=self.adapter))
            segment = len(plan.segments) - 1
            plan.targets.extend(Target(segment, p - 1 if self.shift else p, p) for p in needed)
        return plan

    def _drafts(self) -> list[int]:
        """Guesses for the block's leading open positions worth checking in the cache write:
        each must have an open position after it, and none may be EOS (nothing follows it)."""
        drafts = []
        for position in range(min(self.verify_drafts, len(self.block) - 1)):
            guess = self.guesses[position]
            if (self.block[position] != self.mask_id or self.block[position + 1] != self.mask_id
                    or guess == self.mask_id or guess in self.eos_ids):
                break
            drafts.append(guess)
        return drafts

    def _write_segment(self, start: int, drafts: list[int]) -> Segment:
        tokens = torch.tensor(self.unwritten + drafts)
        end = start + len(tokens)
        if not self.bidirectional_clean_blocks:
            return Segment(tokens, start, self.cache, end, "causal")
        if start == 0:  # the prompt, in blocks counted from its first token
            return Segment(tokens, 0, self.cache, end, "blocks", block_size=self.block_size)
        return Segment(tokens, start, self.cache, end, "full")

    def take_predictions(self, plan: StepPlan, tokens: list[int]) -> tuple[list[int], int]:
        self.written += plan.writes  # this step's pass wrote them
        self.unwritten = self.unwritten[plan.writes:]
        if not plan.targets:  # a prefill chunk: nothing predicted yet
            return [], 0
        return super().take_predictions(plan, tokens)

    def _after_commit(self) -> None:
        if self.sliding:
            self._slide()
            return
        outcome = self._block_outcome()
        if outcome == "eos":
            end = next(i for i, t in enumerate(self.block) if t in self.eos_ids)
            self.reply.extend(self.block[:end])
            self.block, self.guesses = [], []
            self.finish_reason = "stop"
        elif outcome == "full":
            self.reply.extend(self.block)
            self.unwritten = list(self.block)
            self.block, self.guesses = [], []
            self._new_block()


    def _settled_prefix(self) -> int:
        """How many of the block's leading tokens are committed; one that is EOS ends the reply
        there (finished, the block emptied, 0 returned)."""
        settled = 0
        while settled < len(self.block) and self.block[settled] != self.mask_id:
            if self.block[settled] in self.eos_ids:
                self.reply.extend(self.block[:settled])
                self.block, self.guesses = [], []
                self.finish_reason = "stop"
                return 0
            settled += 1
        return settled

    def _slide(self) -> None:
        """Move the block's settled prefix into the reply (and the next write), refill the window."""
        settled = self._settled_prefix()
        if not settled:
            return
        self.reply.extend(self.block[:settled])
        self.unwritten.extend(self.block[:settled])
        self.block, self.guesses = self.block[settled:], self.guesses[settled:]
        room = min(self.block_size, self.max_new_tokens - len(self.reply)) - len(self.block)
        self.block += [self.mask_id] * max(0, room)
        self.guesses += [self.mask_id] * max(0, room)
        if not self.block:
            self.finish_reason = "length"


class FullAttentionDecoder(BlockDecoderBase):
    """LLaDA / Dream: the whole reply is masked from the start; blocks settle left to right."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.total = len(self.prompt_ids) + self.max_new_tokens
        self.block_start = len(self.prompt_ids)
        self.refresh = True  # the next step recomputes the whole sequence's cache
        self._new_block()

    def _sequence(self) -> list[int]:
        tail = self.max_new_tokens - len(self.reply) - len(self.block)
        return self.prompt_ids + self.reply + self.block + [self.mask_id] * tail

    def plan(self) -> StepPlan:
        needed = self.masked_positions()
        offset = 1 if self.shift else 0
        if self.refresh:
            segment = Segment(torch.tensor(self._sequence()), 0, self.cache, self.total, "full")
            rows = [self.block_start + p - offset for p in needed]
        else:
            window = self.block_start - offset
            tokens = torch.tensor(self._sequence()[window:self.block_start + len(self.block)])
            segment = Segment(tokens, window, self.cache, self.total, "full")
            rows = needed
        return StepPlan([segment], [Target(0, row, p) for row, p in zip(rows, needed)])

    def _after_commit(self) -> None:
        self.refresh = False
        eos_at = next((i for i, t in enumerate(self.block) if t in self.eos_ids), None)
        if eos_at is not None:  # once EOS is committed, the tail is EOS
            self.block[eos_at:] = [self.block[eos_at]] * (len(self.block) - eos_at)
        outcome = self._block_outcome()
        if outcome == "eos":
            self.reply.extend(self.block[:eos_at])
            self.block, self.guesses = [], []
            self.finish_reason = "stop"
        elif outcome == "full":
            self.reply.extend(self.block)
            self.block_start += len(self.block)
            self.block, self.guesses = [], []
            self.refresh = self._new_block()
