"""The draft head (DFlash-style) on a tiny GGUF model: its file round-trips, the fused pass
drafts what the torch twin drafts, and whatever the head drafts, the reply is the target's
greedy AR reply token for token, in fewer passes the more of the drafts are right."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from dllm_engine.decoding.step_costs import StepCosts
from dllm_engine.engine import Engine
from dllm_engine.loading import load_model
from dllm_engine.loading.registry import attach_draft_head
from dllm_engine.models.draft_head import DraftHead, DraftHeadSpec, draft_loss, even_taps
from dllm_engine.models.kv_pool import BlockTable
from dllm_engine.request import EngineError, GenerationParams
from dllm_engine.training.draft_export import export_draft_head
from kernels import cpu
from tiny_checkpoints import GGUF_VARIANTS, write_tiny_llama_gguf

PROMPTS = ("Hello there!", "Tell me a story.", "What is the capital of France?")
BLOCK = 4


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory, tiny_tokenizer):
    path = tmp_path_factory.mktemp("draft-head") / "tiny.gguf"
    write_tiny_llama_gguf(path, tiny_tokenizer, GGUF_VARIANTS["smollm2"], seed=3)
    return path


def with_random_head(path, tmp_path, seed: int = 0, block: int = BLOCK):
    """The tiny model with a random draft head, written to a file and attached as users do."""
    loaded = load_model(str(path), dtype=torch.float32)
    head = DraftHead(loaded.config, DraftHeadSpec(taps=(0, 1), layers=2, block_size=block))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in head.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.2 + (1.0 if param.dim() == 1 else 0.0))
    file = tmp_path / f"head-{seed}.safetensors"
    export_draft_head(head, list(range(0, loaded.config.vocab_size, 2)), file, {})
    attach_draft_head(loaded, file)
    return loaded


def test_even_taps_spread_over_the_target():
    assert even_taps(30, 5) == (1, 8, 14, 20, 27)
    assert even_taps(30, 1) == (15,)


def test_a_head_file_round_trips_as_q8_0_blocks(tiny_gguf, tmp_path):
    loaded = load_model(str(tiny_gguf), dtype=torch.float32)
    head = DraftHead(loaded.config, DraftHeadSpec(taps=(0, 1), layers=2, block_size=BLOCK))
    torch.nn.init.normal_(head.fc.weight)
    export_draft_head(head, [5, 6, 7], tmp_path / "head.safetensors", {"note": "test"})
    attach_draft_head(loaded, tmp_path / "head.safetensors")
    assert set(loaded.draft_head_blocks) >= {"fc.weight", "layers.0.qkv.weight", "layers.1.mlp.down.weight"}
    assert loaded.config.is_diffusion and loaded.config.block_size == BLOCK and loaded.draft_vocab == [5, 6, 7]
    error = (loaded.draft_head.fc.weight - head.fc.weight).abs().max() / head.fc.weight.abs().max()
    assert 0 < float(error.detach()) < 1 / 127  # Q8_0: one rounding step of 127 per block's largest value


def test_a_head_file_that_does_not_fit_its_spec_is_refused(tiny_gguf, tmp_path):
    loaded = load_model(str(tiny_gguf), dtype=torch.float32)
    export_draft_head(DraftHead(loaded.config, DraftHeadSpec(taps=(0,), layers=1, block_size=BLOCK)), [1],
                      tmp_path / "head.safetensors", {})
    meta = tmp_path / "head.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "taps": [0, 1]}))
    with pytest.raises(ValueError, match="fc.weight of shape .* does not fit the head"):
        attach_draft_head(loaded, tmp_path / "head.safetensors")


@pytest.mark.parametrize("backend", ["torch", "fused"])
def test_whatever_a_random_head_drafts_the_reply_is_the_ar_reply(tiny_gguf, tmp_path, backend):
    if backend == "fused" and cpu.available() is not None:
        pytest.skip(f"CPU kernels unavailable: {cpu.available()}")
    loaded = with_random_head(tiny_gguf, tmp_path)
    engine = Engine(loaded, backend=backend)
    try:
        for prompt in PROMPTS:
            ar = engine.generate(prompt, GenerationParams(mode="autoregressive", max_new_tokens=20, stop_at_eos=False))
            drafted = engine.generate(prompt, GenerationParams(mode="diffusion", max_new_tokens=20, stop_at_eos=False))
            assert drafted.token_ids == ar.token_ids
    finally:
        engine.close()


def _oracle(engine, replies: dict[str, list[int]], right: int):
    """A drafter that knows the AR reply and drafts its next `right` tokens correctly, then
    wrong ones: the decoder's commits, cache keeping and draft bookkeeping under test."""
    decoders = {}

    def draft(requests):
        out = []
        for _, cache, first, position in requests:
            if first is None:  # context only (a prefill chunk)
                out.append(None)
                continue
            request = next(r for r in engine.scheduler.live if r.decoder.cache is cache)
            decoder = request.decoder
            reply = replies[tuple(decoder.prompt_ids)]
            done = len(decoder.reply)  # reply tokens committed, the last of them is `first`
            assert reply[done - 1] == first and position == len(decoder.prompt_ids) + done - 1
            truth = reply[done:done + BLOCK - 1]
            guesses = [t if i < right else (t + 1) % engine.config.vocab_size for i, t in enumerate(truth)]
            out.append(guesses + [0] * (BLOCK - 1 - len(guesses)))
            decoders[id(decoder)] = decoder
        return out

    return draft


@pytest.mark.parametrize("right", [0, 1, 2, BLOCK - 1])
def test_right_drafts_commit_several_tokens_a_pass_and_keep_the_reply_exact(tiny_gguf, tmp_path, right):
    loaded = with_random_head(tiny_gguf, tmp_path)
    # the head's drafts alone (continuations of earlier text would replace some: test_suffix_drafts.py)
    engine = Engine(loaded, backend="fused" if cpu.available() is None else "torch", share_prefixes=False,
                    continuations=False)
    try:
        prompt_ids = {p: engine.prompt_ids(p, raw=False) for p in PROMPTS}
        ar_params = GenerationParams(mode="autoregressive", max_new_tokens=24, stop_at_eos=False)
        replies = {tuple(prompt_ids[p]): engine.generate(p, ar_params).token_ids for p in PROMPTS}
        engine._runner.draft = _oracle(engine, replies, right)
        for prompt in PROMPTS:
            result = engine.generate(prompt, GenerationParams(mode="diffusion", max_new_tokens=24, stop_at_eos=False))
            assert result.token_ids == replies[tuple(prompt_ids[prompt])]
            # a pass commits the target's token and every right draft: 1 prefill + the rest
            assert result.stats.forward_passes == 1 + -(-(24 - 1) // (right + 1))
            # every pass after the prefill kept `right` drafts, but the last may have had fewer left
            counts = result.stats.pass_commits
            assert counts[1] >= 1 and sum(counts) == result.stats.forward_passes
            assert sum(counts[right + 1:]) >= result.stats.forward_passes - 2
    finally:
        engine.close()


def engine_with_chooser(path, tmp_path) -> Engine:
    """The tiny model with a random head that claims good held-out odds, and the draft chooser."""
    loaded = with_random_head(path, tmp_path)
    loaded.draft_head_meta["held_out"] = {"by_offset": [0.9, 0.8, 0.7]}
    return Engine(loaded, backend="fused" if cpu.available() is None else "torch", share_prefixes=False,
                  recent_replies=0)


def test_a_batch_whose_rows_are_dear_checks_no_drafts_and_keeps_the_reply_exact(tiny_gguf, tmp_path):
    engine = engine_with_chooser(tiny_gguf, tmp_path)
    try:
        params = GenerationParams(mode="diffusion", max_new_tokens=24, stop_at_eos=False)
        ar = engine.generate(PROMPTS[0], dataclasses.replace(params, mode="autoregressive")).token_ids
        engine._runner.draft = _oracle(engine, {tuple(engine.prompt_ids(PROMPTS[0], raw=False)): ar}, BLOCK - 1)
        # a machine where 4 rows cost what one does and every row past them as much again
        engine.draft_chooser.costs = StepCosts({1: [(1, 1.0), (4, 1.0)], 4: [(1, 1.0), (2, 5.0), (4, 13.0)]}, 0.0,
                                               [(1, 0.01)], timed=True)
        alone = engine.generate(PROMPTS[0], params)
        assert alone.token_ids == ar and alone.stats.forward_passes < 12
        with engine._lock:  # the four arrive together: every pass carries all four
            handles = [engine.submit(PROMPTS[0], params) for _ in range(4)]
        for result in [handle.result() for handle in handles]:
            assert result.token_ids == ar
            assert result.stats.forward_passes == 24  # the prefill's token, then one a pass
    finally:
        engine.close()


def _lenient_oracle(engine, truth: list[int]):
    """A head that drafts `truth` (every third draft wrong) for a request whose reply so far is
    its prefix, and token 0 for any other."""
    def draft(requests):
        out = []
        for _, cache, first, _ in requests:
            if first is None:
                out.append(None)
                continue
            reply = next(r for r in engine.scheduler.live if r.decoder.cache is cache).decoder.reply
            ahead = truth[len(reply):len(reply) + BLOCK - 1] if truth[:len(reply)] == reply else []
            guesses = [t if (len(reply) + i) % 3 else (t + 1) % engine.config.vocab_size for i, t in enumerate(ahead)]
            out.append(guesses + [0] * (BLOCK - 1 - len(guesses)))
        return out

    return draft


def test_a_seeded_sample_is_the_seeded_ar_sample_whatever_the_drafts_and_the_batch(tiny_gguf, tmp_path):
    engine = engine_with_chooser(tiny_gguf, tmp_path)
    try:
        # a hot sample: the tiny random model is peaked
        sampled = GenerationParams(mode="autoregressive", max_new_tokens=24, stop_at_eos=False, temperature=8.0, seed=11)
        ar = engine.generate(PROMPTS[1], sampled).token_ids
        assert ar != engine.generate(PROMPTS[1], dataclasses.replace(sampled, seed=12)).token_ids
        engine._runner.draft = _lenient_oracle(engine, ar)  # some drafts hold, a different count each pass
        diffusion = dataclasses.replace(sampled, mode="diffusion")
        alone = engine.generate(PROMPTS[1], diffusion)
        assert alone.token_ids == ar and alone.stats.forward_passes < 24
        with engine._lock:  # and batched with others, whose rows share its passes
            handles = [engine.submit(PROMPTS[1], diffusion)] + [engine.submit(p, diffusion) for p in PROMPTS]
        assert handles[0].result().token_ids == ar
    finally:
        engine.close()


def test_only_greedy_replies_teach_the_chooser_its_odds(tiny_gguf, tmp_path):
    engine = engine_with_chooser(tiny_gguf, tmp_path)
    try:
        chooser = engine.draft_chooser
        params = GenerationParams(mode="diffusion", max_new_tokens=16, stop_at_eos=False)
        sampled = engine.generate(PROMPTS[1], dataclasses.replace(params, temperature=8.0, seed=3))
        assert sampled.stats.forward_passes > 1  # the head drafted and its drafts were checked ...
        assert chooser.head_checked == [] and chooser.observed.trials.sum() == 0  # ... and taught nothing
        engine.generate(PROMPTS[1], params)
        assert sum(chooser.head_checked) + chooser.observed.trials.sum() > 0
    finally:
        engine.close()


def test_the_fused_head_drafts_what_the_torch_head_drafts(tiny_gguf, tmp_path):
    if cpu.available() is not None:
        pytest.skip(f"CPU kernels unavailable: {cpu.available()}")
    from dllm_engine.models.fused_cpu import FusedDraftHead
    from dllm_engine.runner import TorchDraftHead

    loaded = with_random_head(tiny_gguf, tmp_path, seed=5)
    features = torch.randn(9, 2 * loaded.config.hidden_size)
    drafted = {}
    for name, drafter in (("fused", FusedDraftHead(loaded.draft_head, loaded.model, loaded.packed,
                                                     loaded.draft_head_blocks, loaded.draft_vocab, "fp32")),
                          ("torch", TorchDraftHead(loaded.draft_head, loaded.model, loaded.draft_vocab))):
        caches = [BlockTable.standalone(loaded.config, 32, torch.float32, extra_layers=2) for _ in range(2)]
        with torch.inference_mode():
            drafter.write_context([(features[:5], 0, caches[0]), (features, 0, caches[1])])
            drafted[name] = drafter.draft([(7, 5, caches[0]), (11, 9, caches[1])])
    assert drafted["fused"] == drafted["torch"]


def test_a_draft_block_larger_than_the_head_was_trained_for_is_refused(tiny_gguf, tmp_path):
    engine = Engine(with_random_head(tiny_gguf, tmp_path), backend="torch")
    try:
        with pytest.raises(EngineError, match="block_size must be in 2..4"):
            engine.submit("Hi", GenerationParams(mode="diffusion", block_size=8))
    finally:
        engine.close()


@pytest.mark.parametrize("backend", ["torch", "fused"])
def test_a_decode_block_smaller_than_the_heads_decodes_to_the_last_token(tiny_gguf, tmp_path, backend):
    if backend == "fused" and cpu.available() is not None:
        pytest.skip(f"the fused CPU pass cannot run here: {cpu.available()}")
    engine = Engine(with_random_head(tiny_gguf, tmp_path, block=8), backend=backend)
    try:  # the head drafts its whole block of 8 from the last exact token, past the reply's end
        params = dict(max_new_tokens=20, stop_at_eos=False)
        ar = engine.generate("Hello there!", GenerationParams(mode="autoregressive", **params))
        drafted = engine.generate("Hello there!", GenerationParams(mode="diffusion", block_size=2, **params))
        assert drafted.token_ids == ar.token_ids and len(ar.token_ids) == 20
    finally:
        engine.close()


def test_the_loss_weights_early_offsets_and_ignores_rows_without_a_label():
    logits = torch.zeros(1, 3, 5)
    logits[0, 0, 2] = 10.0  # offset 1 right, offset 2 and 3 wrong
    labels = torch.tensor([[2, 4, -1]])
    loss, stats = draft_loss(logits, logits.clone(), labels, offset_decay=4.0, kl_weight=0.0)
    assert stats["first_right"] == 1.0 and stats["accepted"] == 1.0
    assert 0 < float(loss) < float(torch.log(torch.tensor(5.0)))  # offset 2's CE, down-weighted


def test_choose_block_times_each_block_and_decodes_with_the_best(tiny_gguf, tmp_path):
    loaded = with_random_head(tiny_gguf, tmp_path)
    loaded.draft_head_meta["held_out"] = {"by_offset": [0.9, 0.8, 0.01]}  # the third draft rarely pays
    engine = Engine(loaded, backend="fused" if cpu.available() is None else "torch")
    try:
        choice = engine.choose_block(context=16, repeats=2)
        assert [row["block"] for row in choice["blocks"]] == [2, 3, 4]
        best = max(choice["blocks"], key=lambda row: row["tokens_per_s"])
        assert choice["chosen"] == best["block"] == engine.config.block_size
        # the verify pass timed for every count of drafts a continuation may have (1..7), and
        # the continuation chooser weighs its drafts by those timings
        # and larger passes' (a batch's requests share one), the head's by the requests it drafts for
        one = [f"1x{rows}" for rows in range(1, engine.draft_chooser.max_drafts + 2)]
        batches = [f"{n}x{rows}" for n in (2, 4, 8) for rows in (1, 2, 4, 8)]
        assert list(choice["verify_ms"]) == one + batches
        assert choice["head_context_ms"] > 0 and list(choice["head_block_ms"]) == [1, 2, 4, 8]
        costs = engine.draft_chooser.costs
        assert costs.timed and sorted(costs.verify) == [1, 2, 4, 8] and len(costs.verify[1]) == len(one)
        assert costs.verify[8][0][1] == pytest.approx(choice["verify_ms"]["8x1"] / 1000, abs=1e-5)
        assert costs.head[0][1] == pytest.approx(choice["head_block_ms"][1] / 1000, abs=1e-5)
        ar = engine.generate("Hello there!", GenerationParams(mode="autoregressive", max_new_tokens=12))
        assert engine.generate("Hello there!", GenerationParams(mode="diffusion", max_new_tokens=12)).token_ids == ar.token_ids
    finally:
        engine.close()
    plain = Engine(load_model(str(tiny_gguf)), backend="torch")
    try:
        assert plain.choose_block() is None  # no draft head: nothing to choose
    finally:
        plain.close()


@pytest.mark.parametrize("mode", ["autoregressive", "diffusion"])
def test_a_long_prompt_prefilled_in_chunks_gives_the_same_reply(tiny_gguf, tmp_path, mode):
    loaded = with_random_head(tiny_gguf, tmp_path)
    prompt = "Tell me a story about " + "a very long and winding road " * 6
    params = GenerationParams(mode=mode, max_new_tokens=12, stop_at_eos=False)
    replies = {}
    for chunk in (0, 8):
        engine = Engine(loaded, backend="fused" if cpu.available() is None else "torch", prefill_chunk=chunk,
                        share_prefixes=False)
        try:
            final = engine.generate(prompt, params)
            replies[chunk] = final.token_ids
            stats = final.stats
        finally:
            engine.close()
    assert stats.prompt_tokens > 16 and replies[8] == replies[0]
    # the prompt took a pass per chunk, but tokens a pass count the passes that decode
    assert stats.prefill_passes >= (stats.prompt_tokens - 1) // 8 and stats.pass_commits[0] >= stats.prefill_passes
    assert stats.tokens_per_forward == 1.0 if mode == "autoregressive" else stats.tokens_per_forward >= 1.0


def test_a_reply_keeps_stepping_while_another_request_prefills_a_long_prompt(tiny_gguf, tmp_path):
    loaded = with_random_head(tiny_gguf, tmp_path)
    engine = Engine(loaded, backend="torch", prefill_chunk=4, share_prefixes=False)
    try:
        streaming = engine.submit("Hi", GenerationParams(mode="autoregressive", max_new_tokens=200, stop_at_eos=False))
        next(iter(streaming))
        long = engine.submit("word " * 40, GenerationParams(mode="autoregressive", max_new_tokens=1))
        before = streaming.last.stats.forward_passes
        final = long.result(timeout=60)
        during = streaming.last.stats.forward_passes - before
        streaming.cancel()
        # every chunk pass of the long prompt also stepped the live reply
        assert final.stats.forward_passes >= 10 and during >= final.stats.forward_passes - 1
    finally:
        engine.close()


def test_a_head_prefilled_in_the_replies_mode_carries_the_draft_heads_layers(tiny_gguf, tmp_path):
    """A draft head's requests list only blocks that hold the head's layers too: a head
    prefilled ahead in diffusion mode serves the next turn's reply and its AR verdict; one
    prefilled in AR mode serves the verdict only. Every reply is the one decoded from scratch."""
    loaded = with_random_head(tiny_gguf, tmp_path)
    head = [{"role": "user", "content": "Tell me about " + "the long and winding road " * 4},
            {"role": "assistant", "content": "It winds " * 8}]
    next_turn = head + [{"role": "user", "content": "And then?"}]
    reply = GenerationParams(mode="diffusion", max_new_tokens=8, stop_at_eos=False)
    verdict = GenerationParams(mode="autoregressive", max_new_tokens=1, stop_at_eos=False)
    fresh = Engine(loaded, backend="torch", share_prefixes=False)
    try:
        truth = fresh.generate(next_turn, reply).token_ids
    finally:
        fresh.close()
    cached = {}
    for warm_mode in ("diffusion", "autoregressive"):
        engine = Engine(loaded, backend="torch")
        try:
            written = engine.prefill_head(head, mode=warm_mode).result(timeout=60).stats.prompt_tokens
            drafted = engine.generate(next_turn, reply)
            judged = engine.generate(next_turn, verdict)
        finally:
            engine.close()
        assert drafted.token_ids == truth
        cached[warm_mode] = (drafted.stats.cached_prompt_tokens, judged.stats.cached_prompt_tokens, written)
    drafted, judged, written = cached["diffusion"]
    assert written > 32 and drafted >= written - 16 and judged >= written - 16
    drafted, judged, written = cached["autoregressive"]
    assert drafted == 0 and judged >= written - 16
