"""Continuation drafts (dllm_engine/decoding/suffix_drafts.py): the corpus search finds exactly
the longest matching stretches a brute-force scan finds, the walk's probabilities are the shares
it says, the chooser weighs a continuation against the head by tokens a second, and in the
engine a continuation's right drafts commit several tokens a pass while wrong ones change
nothing of the reply."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dllm_engine.decoding.step_costs import LOOK_EVERY, SearchValue, StepCosts
from dllm_engine.decoding.suffix_drafts import (SEPARATOR, Calibration, DraftChooser, RecentReplies, ReplyCorpus,
                                               Step, history_matches, walk)
from dllm_engine.engine import Engine
from dllm_engine.request import GenerationParams
from kernels import cpu
from test_draft_head import tiny_gguf, with_random_head  # noqa: F401 (a fixture)


def brute_matches(tokens: list[int], history: list[int], max_order: int) -> tuple[list[int], int]:
    """Positions after each occurrence of the history's longest suffix (up to max_order)."""
    best, positions = 0, []
    for order in range(1, min(max_order, len(history)) + 1):
        pattern = history[-order:]
        found = [end + 1 for end in range(order - 1, len(tokens)) if tokens[end - order + 1:end + 1] == pattern]
        if found:
            best, positions = order, found
    return positions, best


def test_the_corpus_finds_every_place_the_longest_matching_stretch_ends():
    rng = np.random.default_rng(0)
    conversations = [rng.integers(0, 5, size=rng.integers(3, 30)).tolist() for _ in range(150)]
    corpus = ReplyCorpus.build(conversations, depth=8)
    tokens = corpus.tokens.tolist()
    for _ in range(300):
        history = rng.integers(0, 5, size=rng.integers(1, 12)).tolist()
        starts, order = corpus.matches(np.asarray(history, dtype=np.int32), max_order=8, min_order=1)
        positions, best = brute_matches(tokens, history, 8)
        assert order == best and sorted(starts.tolist()) == sorted(positions)


def test_no_match_crosses_a_conversation_boundary_and_a_short_one_is_no_match():
    corpus = ReplyCorpus.build([[1, 2, 3], [4, 5, 6]], depth=8)
    starts, order = corpus.matches(np.array([3, 4, 5]), max_order=8, min_order=1)
    assert order == 2 and corpus.tokens[starts].tolist() == [6]  # [4, 5], not [3, sep, 4, 5]
    assert corpus.matches(np.array([9, 5]), max_order=8, min_order=2)[1] == 0
    assert corpus.matches(np.array([70000]), max_order=8, min_order=1)[1] == 0  # a token it never saw


def test_a_saved_corpus_loads_with_the_same_matches(tmp_path):
    corpus = ReplyCorpus.build([[10, 11, 12, 13], [11, 12, 14], [49151, 11, 12, 13]], depth=8)
    corpus.save(tmp_path / "replies.npz")
    loaded = ReplyCorpus.load(tmp_path / "replies.npz")
    assert loaded.tokens.tolist() == corpus.tokens.tolist() and SEPARATOR in loaded.tokens.tolist()
    for history in ([11, 12], [10, 11, 12], [9, 49151, 11]):
        a, b = corpus.matches(np.array(history), 8, 1), loaded.matches(np.array(history), 8, 1)
        assert a[1] == b[1] and sorted(a[0].tolist()) == sorted(b[0].tolist())


def test_the_walk_follows_the_majority_and_says_each_tokens_share_and_count():
    corpus = np.array([7, 1, 2, SEPARATOR, 7, 1, 3, SEPARATOR, 7, 1, 2, 5, SEPARATOR], dtype=np.int32)
    steps = list(walk(corpus, np.array([1, 5, 9]), max_tokens=4))
    assert [(s.token, s.share, s.count) for s in steps] == [(1, 1.0, 3), (2, 2 / 3, 3), (5, 1 / 2, 2)]


def test_the_calibration_learns_how_often_a_cell_is_kept_and_cuts_unlikely_drafts():
    calibration = Calibration()
    sure = [Step(4, 1.0, 1), Step(5, 1.0, 1)]
    untrained = calibration.prob("corpus", 2, sure[0])
    assert untrained == pytest.approx(0.5)  # one match agreeing with itself: the prior's guess
    for _ in range(40):  # two-token matches of one corpus stretch: the first draft held a quarter of the time
        calibration.record("corpus", 2, sure, [4, 5] if _ % 4 == 0 else [9, 5])
    assert calibration.prob("corpus", 2, sure[0]) == pytest.approx((10 + 1) / (40 + 2))
    assert calibration.prob("history", 2, sure[0]) == untrained  # another source's cell is untouched
    # the second draft (a three-token match by then) held each of its 10 trials: 11/12
    proposal = calibration.proposal("corpus", 2, sure, min_prob=0.2)
    assert proposal.tokens == [4, 5] and proposal.expected() == pytest.approx(11 / 42 * (1 + 11 / 12))
    assert calibration.proposal("corpus", 2, sure, min_prob=0.25).tokens == [4]


def test_the_history_match_is_the_longest_earlier_occurrence():
    history = np.array([5, 1, 2, 3, 9, 2, 3, 4, 1, 2, 3])
    starts, order = history_matches(history, max_order=8, min_order=2)
    assert order == 3 and starts.tolist() == [4]  # [1, 2, 3] before, followed by 9
    assert history_matches(np.array([1, 2, 3]), 8, 2)[1] == 0


def test_recent_replies_keep_the_last_few_after_their_prompts_tail():
    recent = RecentReplies(capacity=2, prompt_tail=2)
    recent.add([1, 2, 3], [10, 11, 12])
    recent.add([4, 5, 6], [20, 21])
    recent.add([7, 8, 9], [])  # nothing said: nothing kept
    starts, order = recent.matches(np.array([0, 2, 3, 10]), max_order=8, min_order=1)
    assert order == 3 and recent.tokens[starts].tolist() == [11]
    recent.add([1, 1, 1], [30])  # the oldest goes
    assert recent.matches(np.array([3, 10]), 8, 1)[1] == 0
    off = RecentReplies(capacity=0)
    off.add([1], [2])
    assert len(off.tokens) == 0


def test_the_chooser_drafts_a_continuation_only_where_it_beats_the_head_per_second():
    corpus = ReplyCorpus.build([[1, 2, 3, 4, 5, 6, 7, 8, 9]] * 5 + [[1, 2, 3, 0]], depth=16)
    history = [20, 1, 2, 3]
    free_rows = DraftChooser(corpus, head_kept=[0.5, 0.2, 0.1], max_drafts=5)
    assert free_rows.choose(history, 3).tokens == [4, 5, 6, 7, 8]  # 5 of 6 go on the same way
    # rows that cost much more than the first: only the drafts that pay for their row
    dear_rows = DraftChooser(corpus, [0.5, 0.2, 0.1], max_drafts=5,
                             costs=StepCosts.one_request([1, 1.1, 3, 5, 7, 9], head=0.1))
    assert dear_rows.choose(history, 3).tokens == [4]
    # a head that keeps nearly everything wins over an uncertain continuation
    sure_head = DraftChooser(ReplyCorpus.build([[1, 2, 3, 4]] * 2 + [[1, 2, 3, 5]] * 2, depth=8),
                             [0.99, 0.98, 0.97], max_drafts=5, costs=StepCosts(head=[(1, 0.0)]))
    assert sure_head.choose(history, 3) == 3  # all three of the head's drafts
    assert free_rows.choose([30, 31], 3) == 3  # nothing matches: the head's block


def test_step_costs_share_a_batch_pass_between_its_requests():
    costs = StepCosts({1: [(1, 8.0), (8, 11.0)], 8: [(1, 12.0), (2, 20.0), (8, 88.0)]}, 0.5, [(1, 1.0), (8, 4.0)],
                      timed=True)
    assert costs.share(1, 0) == pytest.approx(8.5)
    assert costs.share(1, 3) == pytest.approx(8 + 3 * 3 / 7 + 0.5)  # 4 rows: between the timed 1 and 8
    assert costs.share(8, 0) == pytest.approx(12 / 8 + 0.5)
    assert costs.share(8, 1) == pytest.approx(20 / 8 + 0.5)
    assert costs.share(4, 0) == pytest.approx(8 + (1.5 - 8) * 3 / 7 + 0.5)  # between the batch sizes timed
    assert costs.share(16, 7) == pytest.approx(88 / 8 + 0.5)  # past the largest: its share
    assert costs.head_share(8) == pytest.approx(0.5) and costs.head_share(4) == pytest.approx((1 + 9 / 7) / 4)
    assert StepCosts().share(8, 3) == pytest.approx(1.0)  # untimed: rows are free


def test_the_chooser_drafts_less_as_the_batch_grows():
    # this machine's shape: up to 8 rows cost little more than one, 32 rows four times as much
    curve = [(1, 7.6), (2, 8.2), (4, 8.7), (8, 11.0), (16, 18.0), (32, 43.9), (64, 86.6)]  # by rows in the pass
    costs = StepCosts({batch: [(each, seconds) for rows, seconds in curve if (each := rows // batch) >= 1]
                       for batch in (1, 2, 4, 8)}, 0.5, [(1, 1.5), (2, 1.8), (4, 2.4), (8, 3.6)], timed=True)
    chooser = DraftChooser(None, head_kept=[0.45, 0.25, 0.12], costs=costs)
    counts = {}
    for batch in (1, 2, 4, 8):
        chooser.batch = batch
        counts[batch] = chooser.choose([5, 6, 7], 3)
    assert counts[1] == 3 and counts[8] == 0  # alone: the whole block; eight requests: none
    assert counts[1] >= counts[2] >= counts[4] >= counts[8]
    # untimed costs never stop the head: they are a guess, not this machine's figures
    untimed = DraftChooser(None, head_kept=[0.05, 0.0, 0.0], batch=8)
    assert untimed.choose([5, 6, 7], 3) > 0


def test_the_chooser_learns_from_what_the_verify_passes_kept():
    corpus = ReplyCorpus.build([[1, 2, 3, 4, 5, 6, 7, 8, 9]] * 5, depth=16)
    chooser = DraftChooser(corpus, head_kept=[0.3, 0.1, 0.0], max_drafts=5, costs=StepCosts(head=[(1, 0.0)]))
    proposal = chooser.choose([20, 1, 2, 3], 3)
    assert proposal is not None
    for _ in range(200):  # here the corpus's continuations always fail at once
        chooser.observe_continuation(proposal, kept=0)
    assert chooser.choose([20, 1, 2, 3], 3) == 2  # the head's drafts (its third keeps nothing)
    assert chooser.head_kept_now(0) == pytest.approx(0.3)
    for _ in range(48):  # and the head keeps everything it drafts
        chooser.observe_head(checked=3, kept=3)
    assert chooser.head_kept_now(0) == pytest.approx((48 + 16 * 0.3) / (48 + 16))
    assert chooser.head_kept_now(2) == pytest.approx(48 / 64)


def test_head_drafts_that_nearly_pay_are_still_checked_now_and_then_so_their_odds_can_recover():
    # a draft costs a tenth of a row: the first draft pays where it is kept 1 time in 9 or more
    costs = StepCosts.one_request([1.0, 1.1, 1.2, 1.3], head=0.0)
    chooser = DraftChooser(None, head_kept=[0.5, 0.25, 0.1], costs=costs)
    assert chooser.choose([5, 6, 7], 3) > 0
    for _ in range(200):  # a run of replies the head drafts badly
        chooser.observe_head(checked=1, kept=0)
    checks = [chooser.choose([5, 6, 7], 3) for _ in range(4 * LOOK_EVERY)]
    assert checks.count(0) == 4 * (LOOK_EVERY - 1)  # one step in LOOK_EVERY still checks a draft
    assert all(c == 1 for c in checks if c)
    for _ in range(100):  # what those looks see: the head drafts well again
        chooser.observe_head(checked=1, kept=1)
    assert chooser.choose([5, 6, 7], 3) > 0
    # where drafts are far from paying (a row costs what a step does), they are not looked at
    dear = DraftChooser(None, head_kept=[0.05, 0.0, 0.0], costs=StepCosts.one_request([1.0, 2.0, 3.0, 4.0], head=0.0))
    assert all(dear.choose([5, 6, 7], 3) == 0 for _ in range(4 * LOOK_EVERY))


def _engine(loaded, **kwargs):
    return Engine(loaded, backend="fused" if cpu.available() is None else "torch", share_prefixes=False, **kwargs)


@pytest.mark.parametrize("right", [True, False])
def test_continuations_commit_their_right_drafts_and_never_change_the_reply(tiny_gguf, tmp_path, right):
    loaded = with_random_head(tiny_gguf, tmp_path)
    params = GenerationParams(mode="autoregressive", max_new_tokens=24, stop_at_eos=False)
    prompt = "Tell me a story."
    plain = _engine(loaded, continuations=False)
    try:
        reply = plain.generate(prompt, params).token_ids
        head_only = plain.generate(prompt, GenerationParams(mode="diffusion", max_new_tokens=24, stop_at_eos=False))
        prompt_ids = plain.prompt_ids(prompt, raw=False)
    finally:
        plain.close()
    vocab = loaded.config.vocab_size
    if right:  # the target's own reply
        written = [prompt_ids[-4:] + reply] * 3
    else:  # copies of it, each with one token wrong: drafts right up to a point, then wrong
        written = [prompt_ids[-4:] + reply[:j] + [(reply[j] + 1) % vocab] + reply[j + 1:] for j in range(0, 24, 3)]
    loaded.reply_corpus = ReplyCorpus.build(written, depth=32)
    engine = _engine(loaded)
    try:
        result = engine.generate(prompt, GenerationParams(mode="diffusion", max_new_tokens=24, stop_at_eos=False))
    finally:
        engine.close()
    assert result.token_ids == reply == head_only.token_ids
    if right:  # the corpus knew the reply: long runs of it commit in a pass each
        assert result.stats.continued_passes >= 1
        assert result.stats.forward_passes < head_only.stats.forward_passes
        assert max(i for i, n in enumerate(result.stats.pass_commits) if n) >= 5


def test_a_reply_asked_for_again_is_drafted_from_the_recent_one(tiny_gguf, tmp_path):
    loaded = with_random_head(tiny_gguf, tmp_path)
    params = GenerationParams(mode="diffusion", max_new_tokens=24, stop_at_eos=False)
    passes = {}
    for recent in (0, 8):
        engine = _engine(loaded, recent_replies=recent)
        try:
            first = engine.generate("Tell me a story.", params)
            again = engine.generate("Tell me a story.", params)
        finally:
            engine.close()
        assert again.token_ids == first.token_ids
        passes[recent] = again.stats.forward_passes
    assert passes[8] <= 6 < passes[0]  # 24 tokens: the prefill, then up to 8 a pass


def test_a_search_that_does_not_pay_for_its_time_is_made_one_step_in_eight():
    value = SearchValue()
    assert value.worth_looking(8)  # nothing known: look
    value.record_spent(8, 0.0004)
    value.record_saved(8, 0.0)
    looks = [value.worth_looking(8) for _ in range(16)]
    assert looks.count(True) == 2 and looks[LOOK_EVERY - 1] and looks[2 * LOOK_EVERY - 1]
    assert value.worth_looking(1)  # each batch size on its own figures
    value.record_spent(1, 0.0004)
    value.record_saved(1, 0.002)
    assert all(value.worth_looking(1) for _ in range(16))
    for _ in range(200):  # the odds moved: continuations pay again in a batch of eight
        value.record_saved(8, 0.001)
    assert all(value.worth_looking(8) for _ in range(16))


def test_the_chooser_skips_searches_that_do_not_pay_and_keeps_the_head(monkeypatch):
    corpus = ReplyCorpus.build([[1, 2, 3, 4, 5, 6, 7, 8, 9]] * 5, depth=16)
    chooser = DraftChooser(corpus, head_kept=[0.5, 0.2, 0.1], max_drafts=5, batch=8)
    searches = []
    propose = chooser.propose
    monkeypatch.setattr(chooser, "propose", lambda *args: searches.append(1) or propose(*args))
    chooser.search.record_spent(8, 0.001)
    chooser.search.record_saved(8, 0.0)
    choices = [chooser.choose([20, 1, 2, 3], 3) for _ in range(LOOK_EVERY)]
    assert len(searches) == 1 and choices[:-1] == [3] * (LOOK_EVERY - 1)
    assert choices[-1].tokens[:3] == [4, 5, 6]  # the one search still drafts the continuation


def test_what_a_search_saved_is_what_the_verify_pass_kept():
    corpus = ReplyCorpus.build([[1, 2, 3, 4, 5, 6, 7, 8, 9]] * 5, depth=16)
    chooser = DraftChooser(corpus, head_kept=[0.1, 0.0, 0.0], max_drafts=3,
                           costs=StepCosts.one_request([1.0, 1.2, 1.4, 1.6], head=0.5))
    proposal = chooser.choose([20, 1, 2, 3], 3)
    assert proposal.tokens == [4, 5, 6] and chooser.search.saved == {}  # told at the verify pass
    batch, other_rate, share = proposal.chosen_over
    assert batch == 1 and share == pytest.approx(1.6) and other_rate == pytest.approx(1.0)  # no drafts: 1 a second
    chooser.observe_continuation(proposal.cut(3), kept=0)  # all wrong: no drafts would have done better
    assert chooser.search.saved[1] == pytest.approx(1.0 - 1.6)
