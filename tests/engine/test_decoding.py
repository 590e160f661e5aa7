"""Block decoding on a tiny random model: the exact cache, AR equivalence, EOS, policies."""

from __future__ import annotations

import pytest
import torch

from dllm_engine.decoding import (
    BlockCausalDecoder, DeadlineController, FactorPolicy, FixedStepsPolicy, StepPlan, ThresholdPolicy,
)
from dllm_engine.engine import Engine
from dllm_engine.models.config import ModelConfig
from dllm_engine.models.kv_pool import BlockTable
from dllm_engine.request import GenerationParams, RequestHandle
from dllm_engine.scheduler import LiveRequest, Scheduler

PROMPT = "What is the capital of France?"


@pytest.fixture(scope="module")
def tiny_bd(make_tiny_bd):
    return make_tiny_bd(seed=0)


@pytest.fixture(scope="module")
def engine(tiny_bd):
    engine = Engine(tiny_bd)
    yield engine
    engine.close()


def _uncached_block_decode(loaded, prompt_ids, block_size, threshold, max_new_tokens):
    """Reference: every step recomputes the whole sequence with a dense mask, no cache.

    The block slides: the first open position takes the base model's own AR prediction, the
    others commit when confident, and the settled prefix leaves the block for the context."""
    model, mask_id = loaded.model, loaded.config.mask_token_id
    reply: list[int] = []
    block = [mask_id] * min(block_size, max_new_tokens)
    while block:
        context = prompt_ids + reply
        n, size = len(context), len(block)
        attend = torch.ones(n + size, n + size, dtype=torch.bool).tril()
        attend[n:, n:] = True  # the block is bidirectional
        gate = torch.tensor([[False] * n + [True] * size])
        with torch.no_grad():
            hidden = model.forward_dense(torch.tensor([context + block]), attend[None, None], adapter_gate=gate)
            logits = model.logits(hidden[0]).float()
        block[0] = int(logits[n - 1].argmax())  # exact AR prediction from the clean context
        masked = [j for j in range(1, size) if block[j] == mask_id]
        if masked:
            probs = torch.softmax(logits[[n + j - 1 for j in masked]], dim=-1)
            confidence, tokens = probs.max(dim=-1)
            chosen = ThresholdPolicy(threshold, "leftmost").select(confidence.clone(), at_least_one=False)
            for j, pick, token in zip(masked, chosen.tolist(), tokens.tolist()):
                if pick:
                    block[j] = token
        settled = next((i for i, t in enumerate(block) if t == mask_id), len(block))
        reply.extend(block[:settled])
        block = block[settled:]
        block += [mask_id] * (min(block_size, max_new_tokens - len(reply)) - len(block))
    return reply


@pytest.mark.parametrize("threshold", [0.0, 0.05, 1.0])
def test_cached_decoding_gives_the_tokens_of_uncached_decoding(engine, tiny_bd, threshold):
    params = GenerationParams(max_new_tokens=10, block_size=4, threshold=threshold, stop_at_eos=False)
    final = engine.generate(PROMPT, params)
    expected = _uncached_block_decode(tiny_bd, engine.prompt_ids(PROMPT, raw=False), 4, threshold, 10)
    assert final.token_ids == expected
    assert final.finish_reason == "length"


@pytest.mark.parametrize("threshold", [0.0, 0.5, 1.0])
def test_block_size_one_equals_autoregressive_greedy(engine, threshold):
    ar = engine.generate(PROMPT, GenerationParams(mode="autoregressive", max_new_tokens=12, stop_at_eos=False))
    diffusion = engine.generate(PROMPT, GenerationParams(block_size=1, threshold=threshold, max_new_tokens=12,
                                                         stop_at_eos=False))
    assert diffusion.token_ids == ar.token_ids
    assert len(ar.token_ids) == 12 and ar.stats.forward_passes == 12


def test_low_threshold_commits_several_tokens_per_pass(engine):
    final = engine.generate(PROMPT, GenerationParams(max_new_tokens=16, block_size=8, threshold=0.0, stop_at_eos=False))
    assert final.stats.new_tokens == 16
    assert final.stats.tokens_per_forward > 2.0  # threshold 0 commits a whole block a pass


def test_updates_stream_a_growing_settled_prefix(engine):
    handle = engine.submit(PROMPT, GenerationParams(max_new_tokens=12, block_size=4, threshold=1.0, stop_at_eos=False))
    updates = list(handle)
    assert updates[-1].final and not any(u.final for u in updates[:-1])
    for earlier, later in zip(updates, updates[1:]):
        assert later.token_ids[: len(earlier.token_ids)] == earlier.token_ids
    assert all(u.draft_text.startswith(u.committed_text) for u in updates)


# ---- the decoder's bookkeeping, driven with chosen predictions --------------------------------
MASK, EOS = 99, 2


def _decoder(block_size=4, max_new_tokens=8, stop_at_eos=True, verify_drafts=0):
    config = ModelConfig(
        family="llama_bd", vocab_size=100, hidden_size=8, intermediate_size=8, num_layers=1, num_heads=1,
        num_kv_heads=1, head_dim=8, rope_theta=10000.0, rms_norm_eps=1e-6, max_position_embeddings=64)
    return BlockCausalDecoder([5, 6, 7], BlockTable.standalone(config, 32, torch.float32), block_size, max_new_tokens,
                              MASK, {EOS}, True, stop_at_eos, adapter=True, bidirectional_clean_blocks=False,
                              verify_drafts=verify_drafts)


def _run_step(decoder, plan: StepPlan, tokens: list[int], confidence: list[float], policy) -> int:
    """The scheduler's own path for one request's step (exact commits, the batched commit
    choice, the rest); returns how many tokens it committed."""
    request = LiveRequest(handle=RequestHandle(1), params=GenerationParams(), decoder=decoder, policy=policy,
                          threshold=policy.threshold, submitted=0.0, deadline=None, generator=None)
    scheduler = Scheduler(decode=lambda ids: "", clock=lambda: 0.0, share_prefixes=False)
    scheduler.live.append(request)
    scheduler.postprocess([request], [plan], tokens, torch.tensor(confidence))
    return request.committed_in_denoise


def _step(decoder, predictions: dict[int, tuple[int, float]], policy=ThresholdPolicy(0.9)):
    plan: StepPlan = decoder.plan()
    tokens = [predictions[t.position][0] for t in plan.targets]
    confidence = [predictions[t.position][1] for t in plan.targets]
    return plan, _run_step(decoder, plan, tokens, confidence, policy)


def test_first_step_writes_the_prompt_and_denoises_the_block_in_one_pass():
    decoder = _decoder()
    plan, committed = _step(decoder, {0: (10, 0.1), 1: (11, 0.95), 2: (12, 0.2), 3: (13, 0.3)})
    assert [s.visibility for s in plan.segments] == ["causal", "full"]
    assert plan.targets[0].forced and plan.targets[0].segment == 0
    assert committed == 2
    # the settled prefix left the block for the reply; the window refilled to 4 open positions
    assert decoder.reply == [10, 11] and decoder.block == [MASK] * 4
    assert decoder.settled_ids() == [10, 11] and decoder.draft_ids() == [10, 11, 12, 13]
    nxt = decoder.plan()
    assert nxt.segments[0].tokens.tolist() == [10, 11] and nxt.segments[0].start == 3


def _step_with_checks(decoder, predictions: dict[int, tuple[int, float]], checked: dict[int, int]):
    """Like _step, but draft-check targets predict `checked[position]` (the causal rows' exact
    token there), while the block's own rows predict `predictions`."""
    plan: StepPlan = decoder.plan()
    tokens = [checked[t.position] if t.given is not None else predictions[t.position][0] for t in plan.targets]
    confidence = [1.0 if t.given is not None else predictions[t.position][1] for t in plan.targets]
    return plan, _run_step(decoder, plan, tokens, confidence, ThresholdPolicy(0.9))


def test_drafts_ride_the_cache_write_and_commit_exact_tokens_while_they_hold():
    decoder = _decoder(verify_drafts=2)
    _step(decoder, {0: (10, 0.1), 1: (11, 0.2), 2: (12, 0.2), 3: (13, 0.3)})
    assert decoder.reply == [10] and decoder.guesses == [11, 12, 13, MASK]
    plan = decoder.plan()
    assert plan.segments[0].tokens.tolist() == [10, 11, 12]  # the settled token, then two drafts
    assert plan.segments[1].start == 4  # the block overwrites the drafts' cache slots afterwards
    checks = [(t.row, t.position, t.given) for t in plan.targets if t.given is not None]
    assert checks == [(1, 1, 11), (2, 2, 12)]
    # the AR token at position 0 is 11 = draft 0, so position 1's check is exact (12 = draft 1: so is 2's)
    _, committed = _step_with_checks(decoder, {0: (11, 0.1), 1: (40, 0.3), 2: (41, 0.3), 3: (42, 0.3)},
                                     checked={1: 12, 2: 30})
    assert committed == 3 and decoder.reply == [10, 11, 12, 30]


def test_a_wrong_draft_stops_the_checks_after_it():
    decoder = _decoder(verify_drafts=2)
    _step(decoder, {0: (10, 0.1), 1: (11, 0.2), 2: (12, 0.2), 3: (13, 0.3)})
    # the AR token at position 0 is 15, not draft 11: nothing after it was checked against the truth
    _, committed = _step_with_checks(decoder, {0: (15, 0.1), 1: (40, 0.3), 2: (41, 0.3), 3: (42, 0.95)},
                                     checked={1: 12, 2: 30})
    assert committed == 2 and decoder.reply == [10, 15]
    assert decoder.block == [MASK, MASK, 42, MASK]  # the block's own confident guess still commits


def test_no_drafts_without_guesses_or_past_an_eos_guess():
    decoder = _decoder(verify_drafts=3)
    assert decoder.plan().segments[0].tokens.tolist() == [5, 6, 7]  # first step: no guesses yet
    _step(decoder, {0: (10, 0.1), 1: (EOS, 0.2), 2: (12, 0.2), 3: (13, 0.3)})
    assert decoder.plan().segments[0].tokens.tolist() == [10]  # an EOS guess has nothing after it to check


def test_eos_ends_the_reply_once_everything_before_it_is_committed():
    decoder = _decoder()
    _step(decoder, {0: (10, 1.0), 1: (11, 0.1), 2: (EOS, 0.99), 3: (EOS, 0.99)})
    assert not decoder.finished  # the position before the EOS is still open
    _step(decoder, {0: (11, 0.5)})  # it is now the block's first position: the AR prediction
    assert decoder.finished and decoder.finish_reason == "stop"
    assert decoder.settled_ids() == [10, 11]


def test_a_finished_block_is_written_by_the_next_pass():
    decoder = _decoder()
    _step(decoder, {0: (10, 1.0), 1: (11, 1.0), 2: (12, 1.0), 3: (13, 1.0)})
    plan = decoder.plan()
    assert plan.segments[0].tokens.tolist() == [10, 11, 12, 13] and plan.segments[0].start == 3
    assert plan.segments[1].start == 7 and plan.segments[1].attend_len == 11


def test_length_limit_ends_with_reason_length():
    decoder = _decoder(block_size=4, max_new_tokens=6, stop_at_eos=False)
    _step(decoder, {p: (20 + p, 1.0) for p in range(4)})
    _step(decoder, {p: (30 + p, 1.0) for p in range(2)})
    assert decoder.finish_reason == "length" and decoder.settled_ids() == [20, 21, 22, 23, 30, 31]


# ---- policies ----------------------------------------------------------------------------------
def test_threshold_policy_commits_confident_ones_and_at_least_one():
    assert ThresholdPolicy(0.9).select(torch.tensor([0.5, 0.95, 0.91])).tolist() == [False, True, True]
    assert ThresholdPolicy(0.9).select(torch.tensor([0.2, 0.4, 0.3])).tolist() == [False, True, False]


def test_factor_policy_follows_the_rank_rule():
    # k=1 needs >= 1 - 1/2 = 0.5, k=2 needs >= 0.667, k=3 needs >= 0.75
    chosen = FactorPolicy(1.0).select(torch.tensor([0.7, 0.9, 0.6]))
    assert chosen.tolist() == [True, True, False]


def test_prefill_chunks_shrink_as_the_context_they_attend_to_grows():
    """A chunk's rows read the whole context: past CHUNK_CONTEXT positions the chunk shrinks in
    proportion, so a pass batched with it costs about the same (down to a quarter)."""
    decoder = _decoder()
    decoder.prefill_chunk = 64
    sizes = {}
    for written in (0, 512, 1024, 2048, 4096):
        decoder.written = written
        sizes[written] = decoder.chunk_size()
    assert sizes == {0: 64, 512: 64, 1024: 32, 2048: 16, 4096: 16}


def test_one_long_prompts_chunk_joins_a_pass_a_foreground_ones_first():
    config = ModelConfig(
        family="llama_bd", vocab_size=100, hidden_size=8, intermediate_size=8, num_layers=1, num_heads=1,
        num_kv_heads=1, head_dim=8, rope_theta=10000.0, rms_norm_eps=1e-6, max_position_embeddings=128)

    def request(prompt_len: int, background: bool, submitted: float) -> LiveRequest:
        decoder = BlockCausalDecoder(list(range(10, 10 + prompt_len)), BlockTable.standalone(config, 64, torch.float32),
                                     1, 4, MASK, {EOS}, True, True, adapter=False, bidirectional_clean_blocks=False)
        decoder.prefill_chunk = 8
        return LiveRequest(handle=RequestHandle(int(submitted), background=background), params=GenerationParams(),
                           decoder=decoder, policy=ThresholdPolicy(0.9), threshold=0.9, submitted=submitted,
                           deadline=None, generator=None)

    scheduler = Scheduler(decode=lambda ids: "", clock=lambda: 0.0, share_prefixes=False)
    draft, reply, later = request(40, True, 1.0), request(40, False, 2.0), request(40, False, 3.0)
    short = request(3, False, 4.0)
    batch, plans = scheduler.plan([draft, reply, later, short])
    assert batch == [reply, short]  # the other chunks wait: their plans are the same next pass
    assert [p.is_prefill_chunk for p in plans] == [True, False]
    batch, _ = scheduler.plan([draft, later])
    assert batch == [later]


def test_fixed_steps_policy_spreads_commits_over_the_steps_left():
    chosen = FixedStepsPolicy(4).select(torch.tensor([0.1, 0.9, 0.5, 0.7, 0.2, 0.3]), steps_left=3)
    assert chosen.tolist() == [False, True, False, True, False, False]


# ---- deadline ----------------------------------------------------------------------------------
class FakeClock:
    """Moves only when told to, or by `tick` seconds at every reading."""

    def __init__(self, tick: float = 0.0):
        self.now = 100.0
        self.tick = tick

    def __call__(self):
        self.now += self.tick
        return self.now


def test_deadline_keeps_the_threshold_while_on_time_and_lowers_it_when_late():
    clock = FakeClock()
    controller = DeadlineController(deadline_s=1.0, base_threshold=0.9, clock=clock)
    for _ in range(3):
        controller.record_step()
        clock.now += 0.1
    controller.record_step()
    assert controller.step_time_s == pytest.approx(0.1)
    # 0.7 s left affords 7 steps; 10 tokens at 2 per step need 5: on time
    assert controller.threshold(tokens_left=10, tokens_per_step=2.0) == 0.9
    # 40 tokens need 20 steps: late by a factor 7/20
    assert controller.threshold(tokens_left=40, tokens_per_step=2.0) == pytest.approx(0.9 * 7 / 20)
    clock.now += 1.0
    assert controller.threshold(tokens_left=40, tokens_per_step=2.0) == 0.0
    assert not controller.met()


def test_deadline_in_the_engine_reports_whether_it_was_met(tiny_bd):
    clock = FakeClock()
    engine = Engine(tiny_bd, clock=clock)
    try:
        on_time = engine.generate(PROMPT, GenerationParams(max_new_tokens=8, block_size=4, deadline_s=5.0,
                                                           threshold=1.0, stop_at_eos=False, verify_drafts=0))
        assert on_time.stats.deadline_met is True  # the clock never moved
        assert on_time.stats.forward_passes == 8  # threshold 1: only the exact AR commit each pass
        clock.tick = 0.3  # every reading of the clock now costs 0.3 s: the 0.5 s budget is soon spent
        late = engine.generate(PROMPT, GenerationParams(max_new_tokens=8, block_size=4, deadline_s=0.5,
                                                        threshold=1.0, stop_at_eos=False, verify_drafts=0))
        assert late.stats.deadline_met is False
        assert late.stats.new_tokens == 8
        assert late.stats.forward_passes < on_time.stats.forward_passes  # the threshold was lowered
    finally:
        engine.close()


def test_leftmost_fallback_commits_the_first_masked_position():
    confidence = torch.tensor([0.2, 0.4, 0.95, 0.3])
    assert ThresholdPolicy(0.9, "leftmost").select(confidence.clone()).tolist() == [True, False, True, False]
    assert ThresholdPolicy(0.99, "leftmost").select(confidence.clone()).tolist() == [True, False, False, False]
    assert ThresholdPolicy(0.99).select(confidence.clone()).tolist() == [False, False, True, False]


@pytest.mark.parametrize("prompt", [PROMPT, "Tell me a story.", "Hi"])
def test_the_default_is_exact_decoding_the_autoregressive_reply(engine, prompt):
    """Without a threshold or deadline only exact tokens commit (the AR token, confirmed
    drafts): whatever the adapter drafts, the reply is greedy AR decoding's."""
    ar = engine.generate(prompt, GenerationParams(mode="autoregressive", max_new_tokens=16, stop_at_eos=False))
    exact = engine.generate(prompt, GenerationParams(max_new_tokens=16, block_size=4, stop_at_eos=False))
    assert exact.token_ids == ar.token_ids
    lossy = engine.generate(prompt, GenerationParams(max_new_tokens=16, block_size=4, threshold=0.0, stop_at_eos=False))
    assert lossy.stats.forward_passes < exact.stats.forward_passes  # the dial trades exactness for passes
