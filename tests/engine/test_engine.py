"""The Engine's scheduler: batching, cancellation, back-pressure, errors, async streaming."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch

from dllm_engine.engine import Engine
from dllm_engine.loading import UnknownModelError, load_model
from dllm_engine.request import EngineError, EngineOverloaded, GenerationParams

PROMPTS = ["What is the capital of France?", "Hello there!", "Tell me about diffusion models please."]


@pytest.fixture(scope="module")
def tiny_bd(make_tiny_bd):
    return make_tiny_bd(seed=1)


@pytest.fixture()
def engine(tiny_bd):
    engine = Engine(tiny_bd, max_live_requests=4)
    yield engine
    engine.close()


@pytest.mark.parametrize("mode", ["diffusion", "autoregressive"])
def test_batched_requests_give_the_same_tokens_as_alone(engine, mode):
    params = GenerationParams(mode=mode, max_new_tokens=10, block_size=4, threshold=0.05, stop_at_eos=False)
    alone = [engine.generate(p, params).token_ids for p in PROMPTS]
    passes_before = engine.forward_passes
    handles = [engine.submit(p, params) for p in PROMPTS]
    together = [h.result().token_ids for h in handles]
    assert together == alone
    # they really shared passes: fewer passes than the three requests took one by one
    assert engine.forward_passes - passes_before < sum(h.last.stats.forward_passes for h in handles)


def test_cancel_stops_within_one_step_and_frees_the_request(engine):
    params = GenerationParams(mode="autoregressive", max_new_tokens=150, stop_at_eos=False)
    handle = engine.submit(PROMPTS[0], params)
    next(iter(handle))
    handle.cancel()
    at_cancel = handle.last.step  # the newest step published once cancel() returned (readers may lag)
    final = handle.result(timeout=30)
    assert final.final and final.finish_reason == "cancelled"
    assert final.step <= at_cancel + 1  # at most the step in flight when cancel() ran, then it stops
    assert engine.live_requests == 0
    # the others carry on undisturbed
    assert engine.generate(PROMPTS[1], GenerationParams(max_new_tokens=4, stop_at_eos=False)).stats.new_tokens == 4


def test_cancel_one_of_several_leaves_the_others_intact(engine):
    params = GenerationParams(max_new_tokens=12, block_size=4, threshold=0.05, stop_at_eos=False)
    expected = engine.generate(PROMPTS[2], params).token_ids
    victim = engine.submit(PROMPTS[0], GenerationParams(mode="autoregressive", max_new_tokens=150, stop_at_eos=False))
    survivor = engine.submit(PROMPTS[2], params)
    next(iter(victim))
    victim.cancel()
    assert survivor.result().token_ids == expected
    assert victim.result(timeout=30).finish_reason == "cancelled"


def test_over_the_request_limit_submit_raises_overloaded(engine):
    params = GenerationParams(mode="autoregressive", max_new_tokens=150, stop_at_eos=False)
    handles = [engine.submit(PROMPTS[0], params) for _ in range(4)]
    with pytest.raises(EngineOverloaded, match="limit is 4"):
        engine.submit(PROMPTS[0], params)
    for handle in handles:
        handle.cancel()
    for handle in handles:
        handle.result(timeout=30)
    assert engine.live_requests == 0


def test_cached_token_budget_is_enforced(tiny_bd):
    engine = Engine(tiny_bd, max_cached_tokens=100)
    try:
        with pytest.raises(EngineOverloaded, match="KV pool has"):
            engine.submit(PROMPTS[0], GenerationParams(max_new_tokens=150))
        assert engine.kv_stats()["reserved"] == 0  # the refused request promised nothing
    finally:
        engine.close()


@pytest.mark.parametrize("params, message", [
    (GenerationParams(max_new_tokens=0), "max_new_tokens"),
    (GenerationParams(threshold=1.5), "threshold"),
    (GenerationParams(block_size=0), "block_size"),
    (GenerationParams(temperature=-1.0), "temperature"),
    (GenerationParams(max_new_tokens=8000), "context"),
])
def test_bad_parameters_get_a_clear_error(engine, params, message):
    with pytest.raises(EngineError, match=message):
        engine.submit(PROMPTS[0], params)


def test_malformed_messages_get_a_clear_error(engine):
    with pytest.raises(EngineError, match="role"):
        engine.submit([{"content": "no role"}])


def test_diffusion_mode_on_an_autoregressive_model_is_refused(tiny_llama_dir):
    engine = Engine(load_model(str(tiny_llama_dir)))
    try:
        with pytest.raises(EngineError, match="autoregressive"):
            engine.submit(PROMPTS[0], GenerationParams(mode="diffusion"))
    finally:
        engine.close()


def test_temperature_sampling_is_reproducible_with_a_seed(engine):
    params = GenerationParams(max_new_tokens=8, block_size=4, temperature=1.0, seed=7, stop_at_eos=False)
    assert engine.generate(PROMPTS[0], params).token_ids == engine.generate(PROMPTS[0], params).token_ids


async def test_async_iteration_streams_updates(engine):
    handle = engine.submit(PROMPTS[1], GenerationParams(max_new_tokens=8, block_size=4, threshold=1.0,
                                                        stop_at_eos=False))
    updates = [u async for u in handle]
    assert updates[-1].final and updates[-1].stats.new_tokens == 8
    assert len(updates) == updates[-1].step


async def test_many_async_readers_do_not_block_each_other(engine):
    """Readers on one loop, requests stepped together: every reader hears its first update
    before any hears its last (readers served one after another would not), and the requests
    share their passes."""
    params = GenerationParams(mode="autoregressive", max_new_tokens=5, stop_at_eos=False)
    arrivals: list[tuple[int, bool]] = []  # (reader, final) in the order the loop saw them
    gate, real_schedule = threading.Event(), engine.scheduler.schedule
    engine.scheduler.schedule = lambda: (gate.wait(), real_schedule())[1]  # no step until all wait
    try:
        passes_before = engine.forward_passes
        handles = [engine.submit(p, params) for p in PROMPTS]

        async def read(index, handle):
            async for update in handle:
                arrivals.append((index, update.final))
            return update.token_ids

        readers = asyncio.gather(*(read(i, h) for i, h in enumerate(handles)))
        await asyncio.sleep(0.05)  # every reader parked on its handle
        gate.set()
        results = await asyncio.wait_for(readers, timeout=120)
    finally:
        engine.scheduler.schedule = real_schedule
        gate.set()
    assert all(len(r) == 5 for r in results)
    firsts = [next(n for n, (i, _) in enumerate(arrivals) if i == reader) for reader in range(len(PROMPTS))]
    lasts = [next(n for n, (i, final) in enumerate(arrivals) if i == reader and final) for reader in range(len(PROMPTS))]
    assert max(firsts) < min(lasts)
    assert engine.forward_passes - passes_before <= 5 + len(PROMPTS)  # batched, not 5 passes each


def test_mixed_policies_in_one_batch_commit_as_they_would_alone(engine):
    """One step's commit choice is batched (threshold rows through kernels.select_commits);
    each request must still get exactly what its own policy picks alone."""
    params = [
        GenerationParams(max_new_tokens=10, block_size=4, threshold=0.05, stop_at_eos=False),
        GenerationParams(max_new_tokens=10, block_size=4, threshold=0.9, fallback="most_confident", stop_at_eos=False),
        GenerationParams(max_new_tokens=10, block_size=4, policy="factor", factor=1.0, stop_at_eos=False),
        GenerationParams(max_new_tokens=10, block_size=4, policy="fixed_steps", steps_per_block=2, stop_at_eos=False),
    ]
    alone = [engine.generate(PROMPTS[i % 3], p).token_ids for i, p in enumerate(params)]
    handles = [engine.submit(PROMPTS[i % 3], p) for i, p in enumerate(params)]
    assert [h.result().token_ids for h in handles] == alone


def test_a_request_whose_blocks_fail_ends_alone_and_gives_them_back(engine, monkeypatch):
    from dllm_engine.models.kv_pool import KVPool

    real_attach = KVPool.attach_prefix
    failures = iter([True])

    def attach(pool, *args):
        if next(failures, False):
            raise RuntimeError("no block (injected)")
        return real_attach(pool, *args)

    monkeypatch.setattr(KVPool, "attach_prefix", attach)
    params = GenerationParams(max_new_tokens=4, stop_at_eos=False)
    failed = engine.generate(PROMPTS[0], params)
    assert failed.finish_reason == "error" and "no block (injected)" in failed.error
    assert engine.generate(PROMPTS[1], params).stats.new_tokens == 4
    assert engine.live_requests == 0
    stats = engine.kv_stats()
    assert stats["held"] == 0 and stats["reserved"] == 0  # nothing promised or listed is left behind


def test_load_reports_an_unknown_model_from_its_loading_thread():
    with pytest.raises(UnknownModelError, match="unknown model .no-such-model."):
        Engine.load("no-such-model")


def test_dtype_names_resolve_and_an_unknown_one_is_refused():
    from dllm_engine.resolve import resolve_dtype

    assert resolve_dtype("float32") is torch.float32 and resolve_dtype(torch.float16) is torch.float16
    assert resolve_dtype("auto") in (torch.bfloat16, torch.float32)
    with pytest.raises(EngineError, match="unknown dtype 'int3'"):
        resolve_dtype("int3")


def test_devices_resolve_and_a_missing_one_is_refused():
    from dllm_engine.resolve import resolve_device

    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto") == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(EngineError, match="unknown device 'gpu0'"):
        resolve_device("gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(EngineError, match="device 'cuda' is not available"):
            Engine.load("smollm2-135m", device="cuda")


def _record_batches(engine) -> list[set[int]]:
    """The request ids of each forward pass from now on (the real step runs unchanged)."""
    batches: list[set[int]] = []
    step = engine._step

    def recording_step(batch):
        batches.append({request.handle.request_id for request in batch})
        step(batch)

    engine._step = recording_step
    return batches


def test_a_background_request_joins_one_pass_in_four_beside_a_foreground_one(engine):
    long_reply = GenerationParams(mode="autoregressive", max_new_tokens=40, stop_at_eos=False)
    draft = GenerationParams(mode="autoregressive", max_new_tokens=12, stop_at_eos=False, background=True)
    alone = engine.generate(PROMPTS[1], draft).token_ids
    batches = _record_batches(engine)
    foreground = engine.submit(PROMPTS[0], long_reply)
    background = engine.submit(PROMPTS[1], draft)
    foreground.result(), background.result()
    with_foreground = [b for b in batches if foreground.request_id in b]
    shared = sum(background.request_id in b for b in with_foreground)
    assert 1 <= shared <= len(with_foreground) // 4 + 1, (shared, len(with_foreground))
    assert background.result().token_ids == alone  # sitting out changes when, never what


def test_a_promoted_background_request_steps_every_pass(engine):
    long_reply = GenerationParams(mode="autoregressive", max_new_tokens=40, stop_at_eos=False)
    draft = GenerationParams(mode="autoregressive", max_new_tokens=12, stop_at_eos=False, background=True)
    batches = _record_batches(engine)
    foreground = engine.submit(PROMPTS[0], long_reply)
    background = engine.submit(PROMPTS[1], draft)
    background.promote()  # the speculative draft was adopted: someone is listening now
    assert background.result().stats.new_tokens == 12
    foreground.result()
    with_both = [b for b in batches if background.request_id in b]
    assert len(with_both) == background.result().stats.forward_passes
    first = next(i for i, b in enumerate(batches) if background.request_id in b)
    assert all(background.request_id in b for b in batches[first:first + len(with_both)])


def test_result_may_be_asked_again_and_a_timeout_says_which_request(engine):
    handle = engine.submit(PROMPTS[0], GenerationParams(mode="autoregressive", max_new_tokens=4, stop_at_eos=False))
    first = handle.result(timeout=60)
    assert handle.result(timeout=1) is first and first.final  # it used to block forever the second time
    slow = engine.submit(PROMPTS[1], GenerationParams(mode="autoregressive", max_new_tokens=150, stop_at_eos=False))
    with pytest.raises(TimeoutError, match=f"request {slow.request_id} did not finish"):
        slow.result(timeout=0)
    slow.cancel()


@pytest.mark.parametrize("mode", ["diffusion", "autoregressive"])
def test_a_prompt_that_starts_like_an_earlier_one_reuses_its_cache_exactly(tiny_bd, mode):
    """The next turn of a conversation: its prompt is the last one, the reply, and more."""
    params = GenerationParams(mode=mode, max_new_tokens=10, block_size=4, threshold=0.05, stop_at_eos=False)
    first_turn = [{"role": "user", "content": PROMPTS[2]}]
    fresh = Engine(tiny_bd, share_prefixes=False)
    warm = Engine(tiny_bd)
    try:
        reply = warm.generate(first_turn, params)
        assert reply.stats.cached_prompt_tokens == 0
        next_turn = first_turn + [{"role": "assistant", "content": reply.committed_text},
                                  {"role": "user", "content": PROMPTS[0]}]
        reused = warm.generate(next_turn, params)
        from_scratch = fresh.generate(next_turn, params)
    finally:
        fresh.close()
        warm.close()
    assert reused.stats.cached_prompt_tokens >= warm.count_tokens(first_turn) - 8  # the whole earlier prompt, about
    assert from_scratch.stats.cached_prompt_tokens == 0
    assert reused.token_ids == from_scratch.token_ids


@pytest.mark.parametrize("mode", ["diffusion", "autoregressive"])
def test_a_head_prefilled_ahead_is_listed_by_the_next_turn_and_changes_nothing(tiny_bd, mode):
    """prefill_head between turns (voice_app's HeadWarmer): the next turn's prompt starts with
    the head, lists its blocks, and decodes what it decodes from scratch."""
    params = GenerationParams(mode=mode, max_new_tokens=10, block_size=4, stop_at_eos=False)
    head = [{"role": "user", "content": PROMPTS[2]}, {"role": "assistant", "content": PROMPTS[1]}]
    next_turn = head + [{"role": "user", "content": PROMPTS[0]}]
    fresh = Engine(tiny_bd, share_prefixes=False)
    warm = Engine(tiny_bd)
    try:
        done = warm.prefill_head(head, mode=mode).result(timeout=120)
        reused = warm.generate(next_turn, params)
        from_scratch = fresh.generate(next_turn, params)
    finally:
        fresh.close()
        warm.close()
    assert done.finish_reason == "length" and done.stats.prompt_tokens >= warm.count_tokens(head[:1])
    assert reused.stats.cached_prompt_tokens >= done.stats.prompt_tokens - 16  # all but a part-filled block
    assert reused.token_ids == from_scratch.token_ids


def test_live_requests_with_one_head_list_its_blocks_once_and_decode_exactly(tiny_bd):
    """A verdict or a redraft while the draft on the same words still runs: the head's blocks are
    listed by both, not copied, and both replies are what each gives alone."""
    params = GenerationParams(mode="autoregressive", max_new_tokens=60, stop_at_eos=False)
    head = " ".join(PROMPTS)  # several whole blocks of prompt
    fresh = Engine(tiny_bd, share_prefixes=False)
    shared = Engine(tiny_bd)
    try:
        alone = [fresh.generate(head + tail, params).token_ids for tail in (" One.", " Two?")]
        first = shared.submit(head + " One.", params)
        next(iter(first))  # its prompt is written (and published) by its first pass
        second = shared.submit(head + " Two?", params)
        next(iter(second))
        stats = shared.kv_stats()
        replies = [first.result(timeout=120), second.result(timeout=120)]
    finally:
        fresh.close()
        shared.close()
    assert replies[1].stats.cached_prompt_tokens >= 32
    assert stats["listed"] - stats["held"] >= replies[1].stats.cached_prompt_tokens // 16  # shared blocks
    assert [r.token_ids for r in replies] == alone


def test_only_the_shared_head_of_a_prompt_is_reused(engine):
    raw = GenerationParams(max_new_tokens=4, stop_at_eos=False, raw=True)
    engine.generate(PROMPTS[2], raw)
    assert engine.generate(PROMPTS[1], raw).stats.cached_prompt_tokens == 0  # nothing in common
    # chat prompts share the template's system prompt, and only that
    engine.generate(PROMPTS[0], GenerationParams(max_new_tokens=4, stop_at_eos=False))
    other = engine.generate(PROMPTS[1], GenerationParams(max_new_tokens=4, stop_at_eos=False))
    system_head = len(engine.prompt_ids(PROMPTS[1], raw=False)) - len(engine.prompt_ids(PROMPTS[1], raw=True))
    assert 0 < other.stats.cached_prompt_tokens <= system_head


def test_a_handle_nobody_reads_never_blocks_the_scheduler(tiny_bd):
    engine = Engine(tiny_bd)
    try:
        params = GenerationParams(mode="autoregressive", max_new_tokens=30, stop_at_eos=False)
        unread = engine.submit(PROMPTS[0], params)
        unread._updates.maxsize = 2  # a tiny buffer, filled long before the end
        assert engine.generate(PROMPTS[1], params).stats.new_tokens == 30
        final = unread.result(timeout=60)
        assert final.final and [u for u in unread][-1] is final  # the newest snapshots survive
    finally:
        engine.close()


def test_a_dead_scheduler_fails_every_request_and_refuses_new_ones(tiny_bd):
    engine = Engine(tiny_bd)
    waiting = engine.submit(PROMPTS[0], GenerationParams(mode="autoregressive", max_new_tokens=150, stop_at_eos=False))
    next(iter(waiting))

    def broken_schedule():
        raise RuntimeError("injected fault")

    engine.scheduler.schedule = broken_schedule
    final = waiting.result(timeout=30)
    assert final.finish_reason == "error" and "injected fault" in final.error
    health = engine.health()
    assert not health["alive"] and "injected fault" in health["failure"]
    with pytest.raises(EngineError, match="the engine failed"):
        engine.submit(PROMPTS[1])
    engine.close()


def test_score_tokens_give_the_next_token_probabilities_of_the_prompt(tiny_bd):
    """end_of_turn_probability: p(end-of-turn | the conversation so far), from one pass; the same
    numbers the model's logits give at the prompt's last position."""
    engine = Engine(tiny_bd)
    try:
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        prefix, eot = engine.end_of_turn_prompt(messages)
        full = engine.prompt_ids(messages, raw=False)
        assert full[: len(prefix)] == prefix and full[len(prefix)] == eot  # the token right after the text
        final = engine.end_of_turn_probability(messages).result(timeout=60)
        causal = torch.ones(len(prefix), len(prefix), dtype=torch.bool).tril()[None, None]
        with torch.inference_mode():
            logits = tiny_bd.model.logits(tiny_bd.model.forward_dense(torch.tensor([prefix]), causal)[0, -1])
        expected = torch.softmax(logits.float(), -1)[eot].item()
        assert final.token_probs == pytest.approx([expected], rel=1e-4)
        with pytest.raises(EngineError, match="autoregressive"):
            engine.submit(prefix, GenerationParams(score_tokens=(eot,)))
        with pytest.raises(EngineError, match="token ids must be in"):
            engine.submit([10**9], GenerationParams(mode="autoregressive"))
    finally:
        engine.close()


@pytest.mark.parametrize("chosen", ["diffusion", "autoregressive"])
def test_mode_auto_runs_what_the_engine_chose(engine, chosen):
    params = dict(max_new_tokens=8, block_size=4, threshold=0.05, stop_at_eos=False)
    engine.auto_mode = chosen
    engine.generate(PROMPTS[2], GenerationParams(mode=chosen, **params))  # both below find the prompt cached
    auto = engine.generate(PROMPTS[2], GenerationParams(mode="auto", **params))
    explicit = engine.generate(PROMPTS[2], GenerationParams(mode=chosen, **params))
    assert auto.token_ids == explicit.token_ids
    assert auto.stats.forward_passes == explicit.stats.forward_passes


def test_choose_mode_times_both_modes_and_keeps_the_faster(engine):
    speeds = engine.choose_mode(GenerationParams(block_size=4), new_tokens=6)
    assert set(speeds) == {"diffusion", "autoregressive"} and all(rate > 0 for rate in speeds.values())
    assert engine.auto_mode == max(speeds, key=speeds.get)
    assert engine.live_requests == 0


def test_mode_auto_on_an_autoregressive_model_is_autoregressive(tiny_llama_dir):
    engine = Engine(load_model(str(tiny_llama_dir), dtype=torch.float32))
    try:
        assert engine.choose_mode() == {} and engine.auto_mode == "autoregressive"
        assert engine.generate("Hi", GenerationParams(mode="auto", max_new_tokens=3)).stats.new_tokens >= 1
    finally:
        engine.close()


@pytest.mark.parametrize("max_new_tokens", [4, 200])  # ended by the length, or by EOS
def test_an_ar_reply_commits_exactly_one_token_a_pass(engine, max_new_tokens):
    """Every AR pass commits one token, the EOS that ends a reply included: 1.00 tokens a pass,
    not the 0.94 that counting only the reply's words gave."""
    final = engine.generate(PROMPTS[1], GenerationParams(mode="autoregressive", max_new_tokens=max_new_tokens))
    assert final.stats.tokens_per_forward == 1.0
    assert final.stats.committed_tokens == final.stats.new_tokens + (final.finish_reason == "stop")


def test_a_request_that_cannot_be_set_up_keeps_no_blocks(engine, monkeypatch):
    import dllm_engine.scheduler as scheduler_module

    def broken_policy(*args, **kwargs):
        raise ValueError("no such policy (injected)")

    monkeypatch.setattr(scheduler_module, "make_policy", broken_policy)
    with pytest.raises(ValueError, match="injected"):
        engine.submit(PROMPTS[0], GenerationParams(max_new_tokens=4))
    assert engine.kv_stats()["reserved"] == 0


def test_kv_cache_bytes_count_the_blocks_live_requests_hold_and_those_cached(tiny_bd):
    engine = Engine(tiny_bd)
    try:
        assert engine.kv_cache_bytes == 0
        live = engine.submit(PROMPTS[0], GenerationParams(mode="autoregressive", max_new_tokens=150, stop_at_eos=False))
        next(iter(live))  # its blocks are taken as its passes write them
        config, held = tiny_bd.config, engine.kv_cache_bytes
        per_token = 2 * config.num_layers * config.num_kv_heads * config.head_dim * engine.cache_dtype.itemsize
        assert held >= per_token * len(engine.prompt_ids(PROMPTS[0], raw=False))
        assert engine.kv_stats()["reserved"] > 0  # the rest of its longest reply is promised, not taken
        live.cancel()
        live.result(timeout=30)
        stats = engine.kv_stats()
        assert stats["held"] == stats["reserved"] == 0
        # what is left: its whole written blocks, cached for a prompt that starts the same
        assert 0 < engine.kv_cache_bytes == stats["idle"] * stats["block_bytes"] <= held + per_token * 150
    finally:
        engine.close()
