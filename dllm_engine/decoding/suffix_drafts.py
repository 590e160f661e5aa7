"""Drafts from text the target has already produced: the continuations that followed the
request's latest tokens elsewhere (SuffixDecoding, arXiv 2411.04975; prompt lookup decoding).

A greedy target is deterministic: where its last few tokens match a stretch of its own earlier
output, what followed there is a strong guess for what follows now. Three sources are searched:

- the request's own prompt and reply (a reply that repeats the question, a list's pattern, an
  earlier turn of the conversation);
- a corpus of the target's own greedy replies to many voice-assistant turns, shipped with the
  model (`ReplyCorpus`, built by scripts/build_reply_corpus.py from the draft head's data);
- the engine's last few greedy replies (`RecentReplies`: a speculative reply redrafted on a
  longer transcript, a question asked again).

Each source yields the positions where the longest matching suffix of the request's tokens
occurs; the draft walks forward from them, at each step taking the token most of them continue
with and keeping only those that did. How likely each drafted token is to be kept is read from
a `Calibration` table measured on conversations the corpus did not hold, by source, match length
(which grows as the walk goes on), the token's share of the positions and their count: a share
alone is overconfident (a single two-token match "agrees" with itself). The draft's expected
kept tokens are the sum of the running products. The decoder drafts from here instead of the
draft head when that expectation, per second of the pass it needs, beats the head's
(`DraftChooser`); every verify pass's outcome is fed back (`observe_*`), so both figures move
towards what this engine's own requests show.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dllm_engine.decoding.step_costs import LOOK_EVERY, SearchValue, StepCosts

SEPARATOR = -1  # between the corpus's conversations: no match crosses it
_STORED_SEPARATOR = 65535  # the separator in a saved corpus's uint16 tokens
SAMPLE = 256  # positions a walk follows at most (an evenly spread sample of a larger match)
SOURCES = ("history", "corpus")
# a calibration cell's bounds (each value falls in the first bucket whose bound it does not pass)
ORDER_BOUNDS = (1, 2, 3, 4, 6, 8, 12, 16, 24)
SHARE_BOUNDS = (0.3, 0.5, 0.7, 0.9, 0.999)
COUNT_BOUNDS = (1, 3, 9)
# outcomes this engine saw that weigh as much as a cell's measured rate (or the head's held-out
# acceptance): the calibration and the held-out figures come from templated voice turns, and
# what a live engine is asked may be drafted better or worse than that
OBSERVED_WEIGHT = 16
HEAD_LOOK_LOSS = 0.1  # head drafts this close to paying are still checked now and then


@dataclass
class Step:
    token: int
    share: float  # of the positions still followed, those that continue with `token`
    count: int  # positions still followed


@dataclass
class Proposal:
    tokens: list[int]
    probs: list[float]  # running product: the chance that tokens[:j + 1] are all kept
    cells: list[tuple] = field(default_factory=list)  # each token's calibration cell
    # once chosen: (batch size, the best other option's tokens a second, this one's step share)
    chosen_over: tuple[int, float, float] | None = None

    def cut(self, count: int) -> "Proposal":
        return Proposal(self.tokens[:count], self.probs[:count], self.cells[:count], self.chosen_over)

    def expected(self, count: int | None = None) -> float:
        """Expected drafts kept when the first `count` tokens are checked."""
        return float(sum(self.probs[:count]))


def walk(array: np.ndarray, starts: np.ndarray, max_tokens: int) -> Iterator[Step]:
    """The greedy continuation from `starts` (positions in `array` right after a match), a step
    at a time (a caller stops reading where the drafts stop paying)."""
    if len(starts) > SAMPLE:
        starts = starts[np.linspace(0, len(starts) - 1, SAMPLE).astype(np.int64)]
    for offset in range(max_tokens):
        at = starts + offset
        inside = at < len(array)
        nexts = array[at[inside]]
        nexts = nexts[nexts != SEPARATOR]
        if not len(nexts):
            return
        token, agreeing = int(nexts[0]), len(nexts)
        if not (nexts == token).all():  # a long match mostly goes on one way: no sort needed
            values, counts = np.unique(nexts, return_counts=True)
            best = int(np.argmax(counts))
            token, agreeing = int(values[best]), int(counts[best])
        yield Step(token, agreeing / len(starts), len(starts))
        starts = starts[inside][array[at[inside]] == token]


def _bucket(value: float, bounds: tuple) -> int:
    return bisect.bisect_left(bounds, value)


@dataclass
class Calibration:
    """P(a drafted token is kept | the drafts before it were), by source, match length, share
    and count bucket: hits / trials measured (scripts/build_reply_corpus.py), with two trials
    of the share-based guess as the prior of each cell."""

    hits: np.ndarray = field(default_factory=lambda: Calibration.empty())
    trials: np.ndarray = field(default_factory=lambda: Calibration.empty())

    @staticmethod
    def empty() -> np.ndarray:
        return np.zeros((len(SOURCES), len(ORDER_BOUNDS) + 1, len(SHARE_BOUNDS) + 1, len(COUNT_BOUNDS) + 1))

    @staticmethod
    def _cell(source: str, order: int, step: Step) -> tuple[int, int, int, int]:
        return (SOURCES.index(source), _bucket(order, ORDER_BOUNDS), _bucket(step.share, SHARE_BOUNDS),
                _bucket(step.count, COUNT_BOUNDS))

    def prob(self, source: str, order: int, step: Step, observed: "Calibration | None" = None) -> float:
        """The cell's measured rate; with `observed` (this engine's own outcomes), that rate
        pulled towards what this engine saw, OBSERVED_WEIGHT outcomes weighing as much as it."""
        cell = self._cell(source, order, step)
        guess = step.share * step.count / (step.count + 1)
        measured = float((self.hits[cell] + 2 * guess) / (self.trials[cell] + 2))
        if observed is None:
            return measured
        return float((observed.hits[cell] + OBSERVED_WEIGHT * measured) / (observed.trials[cell] + OBSERVED_WEIGHT))

    def record(self, source: str, order: int, steps: Iterable[Step], truth: list[int]) -> None:
        """Count a walk's drafts against what the target said, up to the first wrong one."""
        cells, kept = [], 0
        for j, step in zip(range(len(truth)), steps):
            cells.append(self._cell(source, order + j, step))
            if step.token != truth[j]:
                break
            kept += 1
        self.observe(cells, kept)

    def proposal(self, source: str, order: int, steps: Iterable[Step], min_prob: float | list[float],
                 observed: "Calibration | None" = None) -> Proposal:
        """The walk's tokens while the chance that all so far are kept stays >= min_prob (for
        the j-th token min_prob[j], where it is a list: the walk stops at its end)."""
        floors = min_prob if isinstance(min_prob, list) else None
        proposal, running = Proposal([], []), 1.0
        for j, step in enumerate(steps):
            if floors is not None and j >= len(floors):
                break
            running *= self.prob(source, order + j, step, observed)
            if running < (floors[j] if floors is not None else min_prob):
                break
            proposal.tokens.append(step.token)
            proposal.probs.append(running)
            proposal.cells.append(self._cell(source, order + j, step))
        return proposal

    def observe(self, cells: list[tuple], kept: int) -> None:
        """Drafts of these cells were checked in order and the first `kept` held."""
        for j, cell in enumerate(cells[:kept + 1]):
            self.trials[cell] += 1
            self.hits[cell] += j < kept


def stretch_matches(array: np.ndarray, history: np.ndarray, max_order: int, min_order: int) -> tuple[np.ndarray, int]:
    """Positions right after each occurrence in `array` of the history's longest suffix (of
    min_order..max_order tokens) that occurs there, and that suffix's length: the matches end
    where the history's last token sits, and grow backwards while the tokens before agree."""
    ends = np.flatnonzero(array == history[-1])
    order, found = 1, ends
    top = min(max_order, len(history))
    while len(ends) and order < top:
        ends = ends[ends >= order]
        ends = ends[array[ends - order] == history[-1 - order]]
        if len(ends):
            order, found = order + 1, ends
    if order < min_order or not len(found):
        return np.empty(0, dtype=np.int64), 0
    return found + 1, order


def history_matches(history: np.ndarray, max_order: int, min_order: int) -> tuple[np.ndarray, int]:
    """stretch_matches of the history in itself, before its last token (positions index the history)."""
    return stretch_matches(history[:-1], history, min(max_order, len(history) - 1), min_order)


class RecentReplies:
    """The last `capacity` greedy replies the engine made (each after its prompt's tail), searched
    like the corpus: a reply asked for again (a redraft on a longer transcript, the same question
    in another session) is drafted from what the target just said."""

    def __init__(self, capacity: int = 64, prompt_tail: int = 24):
        self.capacity, self.prompt_tail = capacity, prompt_tail
        self._replies: list[list[int]] = []
        self.tokens = np.empty(0, dtype=np.int32)

    def add(self, prompt_ids: list[int], reply_ids: list[int]) -> None:
        if not reply_ids or not self.capacity:
            return
        self._replies = (self._replies + [prompt_ids[-self.prompt_tail:] + reply_ids])[-self.capacity:]
        self.tokens = np.asarray([t for reply in self._replies for t in reply + [SEPARATOR]], dtype=np.int32)

    def matches(self, history: np.ndarray, max_order: int, min_order: int) -> tuple[np.ndarray, int]:
        return stretch_matches(self.tokens, history, max_order, min_order)


class ReplyCorpus:
    """The target's replies as one token array (conversations separated by SEPARATOR), and the
    suffix array of that array read backwards, sorted on each suffix's first `depth` tokens: a
    backwards suffix is a stretch of tokens *ending* somewhere, so reading the request's tokens
    from its last one backwards narrows one range of it a token at a time, and the last range
    left holds every place where the longest matching stretch ends."""

    def __init__(self, tokens: np.ndarray, suffixes: np.ndarray, depth: int, calibration: Calibration | None = None):
        self.calibration = calibration or Calibration()
        self.tokens = tokens.astype(np.int32)
        self.backwards = self.tokens[::-1].copy()
        self.suffixes = suffixes.astype(np.int64)
        self.depth = depth
        first = self.backwards[self.suffixes]  # sorted: each token's range of the array
        self._first_bounds = np.searchsorted(first, np.arange(int(first.max(initial=0)) + 2))

    @classmethod
    def build(cls, conversations: list[list[int]], depth: int = 32) -> "ReplyCorpus":
        pieces = []
        for tokens in conversations:
            pieces.extend(tokens)
            pieces.append(SEPARATOR)
        corpus = np.asarray(pieces, dtype=np.int32)
        return cls(corpus, sort_suffixes(corpus[::-1], depth), depth)

    @classmethod
    def load(cls, path: Path) -> "ReplyCorpus":
        with np.load(path) as data:
            tokens = data["tokens"].astype(np.int32)
            tokens[tokens == _STORED_SEPARATOR] = SEPARATOR
            calibration = Calibration(data["hits"], data["trials"]) if "hits" in data else None
            return cls(tokens, data["suffixes"], int(data["depth"]), calibration)

    def save(self, path: Path) -> None:
        """As uint16 tokens (a vocabulary under 65,535) and uint32 suffix positions."""
        if self.tokens.max(initial=0) >= _STORED_SEPARATOR or len(self.tokens) >= 2**32:
            raise ValueError("a reply corpus is stored as uint16 tokens and uint32 positions")
        stored = np.where(self.tokens == SEPARATOR, _STORED_SEPARATOR, self.tokens).astype(np.uint16)
        np.savez_compressed(path, tokens=stored, suffixes=self.suffixes.astype(np.uint32), depth=np.int64(self.depth),
                            hits=self.calibration.hits, trials=self.calibration.trials)

    def __len__(self) -> int:
        return len(self.tokens)

    def _narrow(self, lo: int, hi: int, offset: int, token: int) -> tuple[int, int]:
        """The part of the suffix range [lo, hi) (whose suffixes agree on their first `offset`
        tokens, so are sorted by the next) whose token at `offset` is `token`."""
        if hi - lo > 1024:  # a long range: binary search, reading only the tokens it visits
            def at(suffix) -> int:
                position = int(suffix) + offset
                return int(self.backwards[position]) if position < len(self.backwards) else SEPARATOR - 1
            return (bisect.bisect_left(self.suffixes, token, lo, hi, key=at),
                    bisect.bisect_right(self.suffixes, token, lo, hi, key=at))
        column = self.suffixes[lo:hi] + offset
        inside = column < len(self.backwards)
        values = np.where(inside, self.backwards[np.where(inside, column, 0)], SEPARATOR - 1)
        left, right = np.searchsorted(values, [token, token + 1])
        return lo + int(left), lo + int(right)

    def matches(self, history: np.ndarray, max_order: int, min_order: int) -> tuple[np.ndarray, int]:
        """Positions right after each occurrence in the corpus of the history's longest suffix
        (of min_order..max_order tokens), and that suffix's length."""
        token = int(history[-1])
        if token + 1 >= len(self._first_bounds):
            return np.empty(0, dtype=np.int64), 0
        lo, hi = int(self._first_bounds[token]), int(self._first_bounds[token + 1])
        order, found = 1, (lo, hi)
        top = min(max_order, self.depth, len(history))
        while lo < hi and order < top:
            lo, hi = self._narrow(lo, hi, order, int(history[-1 - order]))
            if lo < hi:
                order, found = order + 1, (lo, hi)
        if order < min_order or found[0] >= found[1]:
            return np.empty(0, dtype=np.int64), 0
        # a backwards suffix starting at r ends the forward stretch at len - 1 - r
        return len(self.tokens) - self.suffixes[found[0]:found[1]], order


def sort_suffixes(corpus: np.ndarray, depth: int) -> np.ndarray:
    """Suffix start positions sorted by their first `depth` tokens (prefix doubling: each round
    sorts by twice as many tokens, from the ranks of the last)."""
    n = len(corpus)
    rank = corpus.astype(np.int64) + 2  # the separator ranks low; past the end ranks 0
    span = 1
    while True:
        after = np.zeros(n, dtype=np.int64)
        after[:n - span] = rank[span:]
        order = np.lexsort((after, rank))
        pairs = np.stack([rank[order], after[order]])
        new = np.empty(n, dtype=np.int64)
        new[order] = np.concatenate([[1], (np.diff(pairs, axis=1) != 0).any(axis=0)]).cumsum()
        rank, span = new, span * 2
        if span >= depth or rank.max() == n:
            return order


_UNTRAINED = Calibration()  # no corpus, no table: every cell is its share-based guess (never written)


@dataclass
class DraftChooser:
    """Chooses, per step, what the next verify pass checks: the likelier continuation (request
    history or corpus) cut where it stops paying, the draft head's block or its first drafts,
    or, where drafts cost more than they keep, nothing (the head's block pass is then spared).

    head_kept[j]: the head's held-out share of blocks whose first j + 1 drafts were all kept.
    costs: what a step costs on this machine by the rows and requests in its passes
    (`StepCosts`, timed by Engine.choose_block); batch: how many requests the next pass
    carries (the engine sets it each step), each assumed to check as many drafts."""

    corpus: ReplyCorpus | None
    head_kept: list[float]
    max_drafts: int = 7
    min_prob: float = 0.05
    max_order: int = 32
    min_order: int = 1
    costs: StepCosts = field(default_factory=StepCosts)
    batch: int = 1
    search: SearchValue = field(default_factory=SearchValue)  # whether looking pays, by batch
    recent: RecentReplies = field(default_factory=RecentReplies)
    # what this engine's verify passes said: continuation drafts by cell, the head's by offset
    observed: Calibration = field(default_factory=Calibration)
    head_checked: list[int] = field(default_factory=list)
    head_held: list[int] = field(default_factory=list)
    head_passed: int = 0  # steps since the head's drafts, not paying by their odds, were last checked

    @property
    def calibration(self) -> Calibration:
        return self.corpus.calibration if self.corpus is not None else _UNTRAINED

    def verify_cost(self, drafts: int) -> float:
        return self.costs.share(self.batch, drafts)

    def head_kept_now(self, offset: int) -> float:
        """P(the head's first offset + 1 drafts are all kept): held-out, pulled towards what this
        engine saw."""
        prior = self.head_kept[offset] if offset < len(self.head_kept) else 0.0
        checked = self.head_checked[offset] if offset < len(self.head_checked) else 0
        held = self.head_held[offset] if offset < len(self.head_held) else 0
        kept = (held + OBSERVED_WEIGHT * prior) / (checked + OBSERVED_WEIGHT)
        # never above the odds of the drafts before it (an offset seldom checked keeps its prior)
        return min(kept, self.head_kept_now(offset - 1)) if offset else kept

    def head_rate(self, head_drafts: int) -> tuple[float, int]:
        """Expected tokens a second of a step that checks the head's first k drafts, for the best
        k up to `head_drafts`, and that k."""
        head = self.costs.head_share(self.batch)
        rates = [(1 + sum(self.head_kept_now(j) for j in range(k))) / (self.verify_cost(k) + head)
                 for k in range(1, head_drafts + 1)]
        best = int(np.argmax(rates))
        return rates[best], best + 1

    def _still_check_head(self, relative_rate: float) -> bool:
        """Whether a step checks the head's drafts though by their odds they do not pay (their
        rate is relative_rate of checking none): one step in LOOK_EVERY, where they come within
        HEAD_LOOK_LOSS of paying (so looking costs a step at most 1.25 % on average). Odds learnt
        from this engine's passes move only while drafts are checked: without these looks, a run
        of replies the head drafts badly would stop it for good where it nearly pays."""
        if relative_rate < 1 - HEAD_LOOK_LOSS:
            return False
        self.head_passed += 1
        if self.head_passed < LOOK_EVERY:
            return False
        self.head_passed = 0
        return True

    def observe_head(self, checked: int, kept: int) -> None:
        """A verify pass checked `checked` of the head's drafts and kept the first `kept`."""
        grow = max(0, checked - len(self.head_checked))
        self.head_checked += [0] * grow
        self.head_held += [0] * grow
        for j in range(checked):
            self.head_checked[j] += 1
            self.head_held[j] += j < kept

    def observe_continuation(self, proposal: Proposal, kept: int, odds: bool = True) -> None:
        """A verify pass checked `proposal` and kept its first `kept` tokens: the cells' odds learn
        from it (where `odds`: a greedy request's), and the search that found it what it saved."""
        if odds:
            self.observed.observe(proposal.cells, kept)
        if proposal.chosen_over is not None:  # what the search that found it saved, in fact
            batch, other_rate, share = proposal.chosen_over
            self.search.record_saved(batch, (1 + kept) / max(other_rate, 1e-9) - share)

    def walks(self, history: list[int]) -> list[tuple[str, int, Iterator[Step]]]:
        """(source, match length, walk) from each source where the request's tokens match (recent
        replies count as the request's own history: text of the same hour, often the same talk)."""
        tokens = np.asarray(history, dtype=np.int32)
        found = [("history", tokens, history_matches(tokens, self.max_order, self.min_order)),
                 ("history", self.recent.tokens, self.recent.matches(tokens, self.max_order, self.min_order))]
        if self.corpus is not None:
            found.append(("corpus", self.corpus.tokens, self.corpus.matches(tokens, self.max_order, self.min_order)))
        return [(source, order, walk(array, starts, self.max_drafts))
                for source, array, (starts, order) in found if order]

    def propose(self, history: list[int], floors: list[float] | None = None) -> Proposal | None:
        """The continuation of the request's tokens with the most expected kept drafts, or None.
        floors[j]: the least chance of the first j + 1 tokens all kept that is worth checking
        (min_prob where not given)."""
        best = None
        for source, order, steps in self.walks(history):
            proposal = self.calibration.proposal(source, order, steps, floors or self.min_prob, self.observed)
            if proposal.tokens and (best is None or proposal.expected() > best.expected()):
                best = proposal
        return best

    def floors(self, rate: float) -> list[float]:
        """Per draft j, the least chance of drafts 0..j all being kept for which checking draft j
        can beat `rate` tokens a second: its row's cost times that rate. The walk stops below
        it (in a large batch most walks stop at the first token); with costs that grow faster
        the more rows a pass has, no later draft could pay either, so the cut is exact."""
        costs = [self.verify_cost(n) for n in range(self.max_drafts + 1)]
        return [max(self.min_prob, rate * (costs[j + 1] - costs[j])) for j in range(self.max_drafts)]

    def choose(self, history: list[int], head_drafts: int) -> Proposal | int:
        """What the next pass checks: a continuation (cut to the length with the most expected
        tokens a second), or how many of the head's drafts (0: none, where the costs are timed
        and a pass's rows are dearer than what drafts keep, e.g. in a large batch; one such step
        in LOOK_EVERY still checks them where their odds may be what is wrong). Where the
        search for a continuation has not been paying for its own time at this batch size, most
        steps skip it (`SearchValue`)."""
        head_rate, head_checks = self.head_rate(head_drafts) if head_drafts else (0.0, 0)
        if self.costs.timed and 1 / self.verify_cost(0) >= head_rate:
            still = self._still_check_head(head_rate * self.verify_cost(0))
            head_rate, head_checks = 1 / self.verify_cost(0), head_checks if still else 0
        if not self.search.worth_looking(self.batch):
            return head_checks
        started = time.perf_counter()
        proposal = self.propose(history, self.floors(head_rate))
        self.search.record_spent(self.batch, time.perf_counter() - started)
        if proposal is not None:
            rates = [(1 + proposal.expected(n)) / self.verify_cost(n) for n in range(1, len(proposal.tokens) + 1)]
            best = int(np.argmax(rates))
            if rates[best] > head_rate:  # what it saved is told when its verify pass is seen
                chosen = proposal.cut(best + 1)
                chosen.chosen_over = (self.batch, head_rate, self.verify_cost(best + 1))
                return chosen
        self.search.record_saved(self.batch, 0.0)
        return head_checks
