"""Training a draft head end to end on a tiny GGUF model: the target's features go to a store
and back unchanged, the head learns to draft the target's own greedy replies (held-out
acceptance rises), a stopped run resumes from its checkpoint where it stopped, and SIGTERM pauses
a run cleanly."""

from __future__ import annotations

import json
import os
import signal

import numpy as np
import pytest
import torch

from dllm_engine.engine import Engine
from dllm_engine.loading import load_model
from dllm_engine.models.draft_head import DraftHead, DraftHeadSpec
from dllm_engine.request import GenerationParams
from dllm_engine.training.draft_features import FeatureStore, extract
from dllm_engine.training.draft_trainer import (Batches, DraftTrainConfig, MixedBatches, TrainingPaused,
                                               train_draft_head)
from dllm_engine.training.trainer import draft_vocabulary
from kernels import cpu
from tiny_checkpoints import GGUF_VARIANTS, write_tiny_llama_gguf

pytestmark = pytest.mark.skipif(cpu.available() is not None, reason=f"CPU kernels unavailable: {cpu.available()}")

TAPS = (0, 1)
BLOCK = 4


@pytest.fixture(scope="module")
def distilled(tmp_path_factory, tiny_tokenizer):
    """The tiny model and its own greedy replies to a few prompts (what distillation makes)."""
    path = tmp_path_factory.mktemp("draft-training") / "tiny.gguf"
    write_tiny_llama_gguf(path, tiny_tokenizer, GGUF_VARIANTS["smollm2"], seed=3)
    loaded = load_model(str(path), dtype=torch.float32)
    engine = Engine(loaded, share_prefixes=False)
    records = []
    try:
        for i in range(6):
            messages = [{"role": "user", "content": f"Question number {i}: tell me about the number {i * 7}."}]
            prompt_ids = engine.prompt_ids(messages, raw=False)
            reply = engine.generate(messages, GenerationParams(mode="autoregressive", max_new_tokens=24,
                                                               stop_at_eos=False))
            records.append({"prompt_ids": prompt_ids, "reply_ids": reply.token_ids})
    finally:
        engine.close()
    return loaded, records


def test_extracted_features_are_the_targets_and_its_greedy_tokens(distilled, tmp_path):
    loaded, records = distilled
    store = FeatureStore(tmp_path / "features", TAPS, loaded.config.hidden_size)
    extract(loaded, records, store, activations="fp32")
    index, features, final, greedy = store.open("r")
    assert index["done"] == len(records) and index["offsets"][-1] == features.shape[0]
    first = records[0]
    tokens = first["prompt_ids"] + first["reply_ids"]
    assert features.shape[1] == len(TAPS) * loaded.config.hidden_size
    # the replies are the target's greedy replies: its greedy token at each reply position is the next one
    prompt = len(first["prompt_ids"])
    assert np.array_equal(np.asarray(greedy[prompt - 1:len(tokens) - 1]), np.asarray(tokens[prompt:]))
    assert np.isfinite(np.asarray(final[:len(tokens)], dtype=np.float32)).all()


def stored_features(distilled, tmp_path):
    """The replies' features in a store, with what training reads beside them: (the model, the
    store, the draft vocabulary, the embeddings, record -> its tokens)."""
    loaded, records = distilled
    store = FeatureStore(tmp_path / "features", TAPS, loaded.config.hidden_size)
    extract(loaded, records, store)
    vocab = draft_vocabulary(records, loaded.config.vocab_size, loaded.config.eos_token_ids)

    def tokens_of(i):
        return records[i]["prompt_ids"] + records[i]["reply_ids"]

    return loaded, store, vocab, loaded.model.embed_tokens.detach(), tokens_of


def test_a_head_learns_the_targets_replies_and_a_run_resumes_where_it_stopped(distilled, tmp_path):
    loaded, store, vocab, embed, tokens_of = stored_features(distilled, tmp_path)

    def batches(seed):
        return Batches(store, vocab, loaded.config.vocab_size, BLOCK, anchors=8, seed=seed)

    torch.manual_seed(0)
    head = DraftHead(loaded.config, DraftHeadSpec(taps=TAPS, layers=1, block_size=BLOCK))
    config = DraftTrainConfig(batch_size=4, lr=3e-3, warmup_steps=5, minutes=10, max_steps=40, eval_every_s=1e9,
                              checkpoint_every=10, bf16=False)
    held_out = [("all", batches(1), tokens_of)]  # memorising six replies is the point here
    train = MixedBatches([(batches(0), tokens_of)], seed=0)
    history = train_draft_head(head, embed, embed[torch.tensor(vocab)], loaded.model.rope, train, held_out, config,
                               tmp_path)
    evals = json.loads((tmp_path / "draft_evals.json").read_text())
    assert len(history) == 40 and [e["step"] for e in evals] == [0, 40]
    assert evals[-1]["tokens_per_pass"] > evals[0]["tokens_per_pass"] + 0.3
    assert history[-1]["loss"] < history[0]["loss"]

    resumed = DraftHead(loaded.config, DraftHeadSpec(taps=TAPS, layers=1, block_size=BLOCK))
    more = train_draft_head(resumed, embed, embed[torch.tensor(vocab)], loaded.model.rope, train, held_out,
                            DraftTrainConfig(**{**vars(config), "max_steps": 50}), tmp_path)
    assert [h["step"] for h in more] == list(range(1, 51))  # the old history and 10 new steps
    assert more[:40] == history


class _SignalsAtSample:
    """Training batches that send this process SIGTERM while the `at`-th batch is being drawn, as
    `kill` does when a benchmark needs the cores."""

    def __init__(self, batches: MixedBatches, at: int):
        self.batches, self.at, self.drawn = batches, at, 0

    def __len__(self) -> int:
        return len(self.batches)

    def sample(self, count: int) -> dict:
        self.drawn += 1
        if self.drawn == self.at:
            os.kill(os.getpid(), signal.SIGTERM)
        return self.batches.sample(count)


def test_sigterm_pauses_a_run_after_its_step_and_the_rerun_resumes_it(distilled, tmp_path):
    loaded, store, vocab, embed, tokens_of = stored_features(distilled, tmp_path)

    train = MixedBatches([(Batches(store, vocab, loaded.config.vocab_size, BLOCK, anchors=4, seed=0), tokens_of)], 0)
    held_out = [("all", Batches(store, vocab, loaded.config.vocab_size, BLOCK, anchors=4, seed=1), tokens_of)]
    config = DraftTrainConfig(batch_size=2, warmup_steps=2, minutes=10, max_steps=12, eval_every_s=1e9,
                              checkpoint_every=100, bf16=False)
    spec = DraftHeadSpec(taps=TAPS, layers=1, block_size=BLOCK)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(TrainingPaused):
        train_draft_head(DraftHead(loaded.config, spec), embed, embed[torch.tensor(vocab)], loaded.model.rope,
                         _SignalsAtSample(train, at=5), held_out, config, tmp_path)
    assert signal.getsignal(signal.SIGTERM) is before  # the process's own handling is back
    assert torch.load(tmp_path / "draft_head.pt", weights_only=False)["step"] == 5  # the step in flight ended

    history = train_draft_head(DraftHead(loaded.config, spec), embed, embed[torch.tensor(vocab)], loaded.model.rope,
                               train, held_out, config, tmp_path)
    assert [h["step"] for h in history] == list(range(1, 13))
