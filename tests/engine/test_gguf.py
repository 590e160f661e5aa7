"""GGUF checkpoints: tiny llama files written with gguf's writer in the quant types SmolLM2's
file uses (and F16, Q4_0, K-quants), and the real SmolLM2-135M-Instruct file, each checked
against transformers' own GGUF loading of the same file."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from dllm_engine.loading import load_model
from dllm_engine.loading.registry import smollm2_gguf_path
from dllm_engine.models.kv_pool import BlockTable
from dllm_engine.models.transformer import Segment
from tiny_checkpoints import CHATML_TEMPLATE, GGUF_VARIANTS, write_tiny_llama_gguf

log = logging.getLogger(__name__)

TOLERANCE = 1e-4  # tiny models, fp32
SMOLLM2_TOLERANCE = 1e-3  # 30 layers of fp32 rounding on logits up to ~30
TOKENIZER_SAMPLES = [
    "Hello, world!",
    "The year 2024 had 366 days; pi is 3.14159.",
    "Café naïve résumé — «quotes» 日本語 🙂",
    "  leading spaces\tand\ttabs\nand newlines\n\n",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "don't we'll they're",
]
CHAT = [{"role": "user", "content": "What is the capital of France?"}]


def causal_mask(length: int) -> torch.Tensor:
    return torch.ones(length, length, dtype=torch.bool).tril()[None, None]


def our_logits(loaded, tokens: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return loaded.model.logits(loaded.model.forward_dense(tokens, causal_mask(tokens.shape[1])))


def greedy_with_cache(loaded, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Plain greedy decoding on our model through the KV-cache path (one token a step)."""
    model, stop = loaded.model, set(loaded.config.eos_token_ids)
    cache = BlockTable.standalone(model.config, max_len=len(prompt) + max_new_tokens, dtype=torch.float32)
    new: list[int] = []
    with torch.inference_mode():
        chunk, start = torch.tensor(prompt), 0
        for _ in range(max_new_tokens):
            end = start + chunk.numel()
            hidden = model.forward_segments([Segment(chunk, start, cache, attend_len=end, visibility="causal")])
            token = int(model.logits(hidden[-1:]).argmax())
            if token in stop:
                break
            new.append(token)
            chunk, start = torch.tensor([token]), end
    return new


# ---- tiny files ---------------------------------------------------------------------------------
@pytest.fixture(scope="module", params=list(GGUF_VARIANTS))
def tiny_gguf(request, tmp_path_factory, tiny_tokenizer):
    """(path, our loaded model, transformers' model, Q/K before llama.cpp's permutation)."""
    variant = GGUF_VARIANTS[request.param]
    directory = tmp_path_factory.mktemp(f"gguf-{variant.name}")
    path = directory / f"tiny-{variant.name}.gguf"
    unpermuted = write_tiny_llama_gguf(path, tiny_tokenizer, variant, seed=11)
    reference = AutoModelForCausalLM.from_pretrained(str(directory), gguf_file=path.name, dtype=torch.float32)
    return path, load_model(str(path), dtype=torch.float32), reference.eval(), unpermuted


def test_tiny_gguf_logits_match_transformers(tiny_gguf):
    path, loaded, reference, _ = tiny_gguf
    tokens = torch.randint(0, loaded.config.vocab_size, (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        theirs = reference(input_ids=tokens).logits
    diff = float((our_logits(loaded, tokens) - theirs).abs().max())
    assert float(theirs.abs().max()) > 1.0
    assert diff < TOLERANCE, f"{path.name}: max abs logit difference {diff:.2e}"


def test_tiny_gguf_config_and_tying(tiny_gguf):
    path, loaded, reference, _ = tiny_gguf
    variant = GGUF_VARIANTS[path.stem.removeprefix("tiny-")]
    config = loaded.config
    assert (config.family, config.attention) == ("llama", "causal")
    assert (config.hidden_size, config.intermediate_size) == (variant.hidden, variant.intermediate)
    assert (config.num_layers, config.num_heads, config.num_kv_heads) == (2, 4, 2)
    assert config.rope_theta == 100000.0 and abs(config.rms_norm_eps - 1e-5) < 1e-9
    assert config.tie_embeddings == (variant.output is None) == reference.config.tie_word_embeddings


@pytest.mark.parametrize("variant", ["smollm2", "f16_untied", "q4_0"])
def test_tiny_gguf_undoes_llama_cpp_q_k_permutation(variant, tmp_path, tiny_tokenizer):
    """Our Q/K rows come back in the Hugging Face (rotate-half) order the file was made from."""
    path = tmp_path / "tiny.gguf"
    unpermuted = write_tiny_llama_gguf(path, tiny_tokenizer, GGUF_VARIANTS[variant], seed=3)
    loaded = load_model(str(path), dtype=torch.float32)
    layer, config = loaded.model.layers[1], loaded.config
    q_rows, kv_rows = config.num_heads * config.head_dim, config.num_kv_heads * config.head_dim
    q, k = layer.qkv.weight[:q_rows], layer.qkv.weight[q_rows:q_rows + kv_rows]
    # 4-bit quantization moves a value by at most 1/15 of its block's range; a wrong row order by O(range)
    for ours, original in ((q, unpermuted["blk.1.attn_q.weight"]), (k, unpermuted["blk.1.attn_k.weight"])):
        error = float((ours - torch.from_numpy(original)).abs().max())
        assert error < 0.15 * float(np.abs(original).max()), f"rows out of order: error {error:.3f}"


def test_tiny_gguf_tokenizer_matches_transformers(tiny_gguf, tiny_tokenizer):
    path, loaded, _, _ = tiny_gguf
    theirs = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    for text in TOKENIZER_SAMPLES:
        ids = loaded.tokenizer.encode(text)
        assert ids == theirs(text, add_special_tokens=False).input_ids, text
        assert ids == tiny_tokenizer.encode(text).ids, text  # and the tokenizer it was made from
        assert loaded.tokenizer.decode(ids, skip_special=False) == text
    assert loaded.tokenizer.chat_template == CHATML_TEMPLATE
    assert loaded.tokenizer.render_chat(CHAT) == theirs.apply_chat_template(CHAT, tokenize=False,
                                                                             add_generation_prompt=True)
    assert loaded.tokenizer.token_id("<|im_end|>") in loaded.config.eos_token_ids


# ---- the real SmolLM2-135M-Instruct file --------------------------------------------------------
@pytest.fixture(scope="module")
def smollm2():
    path = smollm2_gguf_path()
    ours = load_model(str(path), dtype=torch.float32)
    reference = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return ours, reference.eval(), tokenizer


@pytest.mark.slow
def test_smollm2_logits_match_transformers_on_a_chat_prompt(smollm2):
    ours, reference, _ = smollm2
    prompt = ours.tokenizer.encode(ours.tokenizer.render_chat(CHAT))
    tokens = torch.tensor([prompt])
    with torch.inference_mode():
        theirs = reference(input_ids=tokens).logits
    diff = float((our_logits(ours, tokens) - theirs).abs().max())
    log.info("SmolLM2 chat prompt (%d tokens): max abs logit diff %.3e (logits up to %.1f)",
             len(prompt), diff, float(theirs.abs().max()))
    assert diff < SMOLLM2_TOLERANCE, f"max abs logit difference {diff:.2e}"


@pytest.mark.slow
def test_smollm2_tokenizer_and_chat_template_match_transformers(smollm2):
    ours, _, theirs = smollm2
    for text in TOKENIZER_SAMPLES:
        assert ours.tokenizer.encode(text) == theirs(text, add_special_tokens=False).input_ids, text
    conversations = [CHAT, [{"role": "system", "content": "Be brief."}, *CHAT,
                            {"role": "assistant", "content": "Paris."}, {"role": "user", "content": "And Italy?"}]]
    for messages in conversations:
        for add_generation_prompt in (True, False):
            expected = theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
            assert ours.tokenizer.render_chat(messages, add_generation_prompt) == expected


@pytest.mark.slow
def test_smollm2_greedy_answers_paris_as_transformers_does(smollm2):
    ours, reference, _ = smollm2
    prompt = ours.tokenizer.encode(ours.tokenizer.render_chat(CHAT))
    new = greedy_with_cache(ours, prompt, max_new_tokens=12)
    assert "Paris" in ours.tokenizer.decode(new)
    with torch.inference_mode():
        generated = reference.generate(torch.tensor([prompt]), max_new_tokens=len(new), do_sample=False,
                                       eos_token_id=ours.config.eos_token_ids, pad_token_id=2)
    assert new == generated[0, len(prompt):].tolist()


@pytest.mark.slow
def test_dllm_generate_on_smollm2_equals_transformers_greedy(smollm2, dllm_generate):
    """The contract other work relies on, on the registered name: greedy, raw prompt, fp32
    activations (8-bit ones are another model's arithmetic: test_int8_activations_...)."""
    ours, reference, _ = smollm2
    prompt, max_new = "The capital of France is", 16
    result = dllm_generate("smollm2-135m", prompt, max_new)
    assert (result["model"], result["mode"]) == ("smollm2-135m", "autoregressive")
    prompt_ids = ours.tokenizer.encode(prompt)
    with torch.inference_mode():
        output = reference.generate(torch.tensor([prompt_ids]), attention_mask=torch.ones(1, len(prompt_ids)),
                                    max_new_tokens=max_new, do_sample=False,
                                    eos_token_id=ours.config.eos_token_ids, pad_token_id=2)
    expected = output[0, len(prompt_ids):].tolist()
    stop = next((i for i, t in enumerate(expected) if t in ours.config.eos_token_ids), len(expected))
    assert result["token_ids"] == expected[:stop]
    assert "Paris" in result["text"]


@pytest.mark.slow
def test_int8_activations_keep_the_answer(dllm_generate):
    result = dllm_generate("smollm2-135m", "The capital of France is", 16, activations="int8")
    assert "Paris" in result["text"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["autoregressive", "diffusion"])
def test_bf16_engine_answers_paris(mode):
    """bf16 is the torch pass's default where matmuls run natively in it (CUDA, CPUs with
    avx512_bf16 but not the fused pass): its answers must stay the model's, not just its speed."""
    from dllm_engine.engine import Engine
    from dllm_engine.request import GenerationParams

    engine = Engine.load("smollm2-135m-bd", dtype="bfloat16", backend="torch")
    try:
        reply = engine.generate(CHAT, GenerationParams(mode=mode, max_new_tokens=12)).committed_text
    finally:
        engine.close()
    assert "Paris" in reply, reply


@pytest.mark.slow
def test_checked_drafts_keep_the_reply_exactly_autoregressive_in_fewer_passes():
    """Threshold 1: nothing but exact tokens commits (the AR token at the block's first open
    position, and drafts the causal cache write confirmed), so the reply must equal greedy
    autoregressive decoding token for token; the confirmed drafts make it take fewer passes."""
    from dllm_engine.engine import Engine
    from dllm_engine.request import GenerationParams

    engine = Engine.load("smollm2-135m-bd", dtype="float32")
    try:
        prompt = [{"role": "user", "content": "Tell me about the moon."}]
        greedy = engine.generate(prompt, GenerationParams(mode="autoregressive", max_new_tokens=40))
        checked = engine.generate(prompt, GenerationParams(mode="diffusion", threshold=1.0, verify_drafts=3,
                                                           max_new_tokens=40))
    finally:
        engine.close()
    assert checked.token_ids == greedy.token_ids
    assert checked.stats.forward_passes < greedy.stats.forward_passes


@pytest.mark.slow
def test_the_fused_pass_gives_the_torch_pass_greedy_replies_on_the_real_model():
    """SmolLM2's Q4_1/Q8_0 blocks streamed by kernels/cpu against the same weights dequantized
    to fp32 torch: token for token on a fixed prompt set, in both modes. With fp32 activations:
    8-bit ones round, and over 30 layers a rounding that a 1e-7 difference of summation order
    flips grows into other tokens (the integer kernels are compared with the torch quantizer on
    the tiny GGUF in test_fused_cpu.py, and keep AR == exact diffusion bit for bit here)."""
    from kernels import cpu
    from dllm_engine.bench import BENCH_PROMPTS
    from dllm_engine.engine import Engine
    from dllm_engine.request import GenerationParams

    if cpu.available() is not None:
        pytest.skip(f"CPU kernels unavailable: {cpu.available()}")
    replies = {}
    for backend in ("fused", "torch"):
        engine = Engine.load("smollm2-135m-bd", dtype="float32", backend=backend, share_prefixes=False,
                             activations="fp32")
        try:
            replies[backend] = [engine.generate(p, GenerationParams(mode=mode, max_new_tokens=16)).token_ids
                                for p in BENCH_PROMPTS[:3] for mode in ("autoregressive", "diffusion")]
        finally:
            engine.close()
    assert replies["fused"] == replies["torch"]


@pytest.mark.slow
def test_the_default_model_checks_continuations_of_its_own_replies_and_keeps_the_ar_reply():
    """The shipped reply corpus (adapters/smollm2-135m.replies.npz) on the real model: some
    passes check a continuation instead of the head's block, and every reply is the greedy AR
    reply token for token (the default int8 pass: AR == exact diffusion bit for bit)."""
    from dllm_engine.bench import BENCH_PROMPTS
    from dllm_engine.engine import Engine
    from dllm_engine.request import GenerationParams

    engine = Engine.load("smollm2-135m-bd", share_prefixes=False)
    try:
        assert engine.loaded.reply_corpus is not None and len(engine.loaded.reply_corpus) > 100_000
        continued = 0
        for prompt in BENCH_PROMPTS[:4]:
            ar = engine.generate(prompt, GenerationParams(mode="autoregressive", max_new_tokens=48))
            drafted = engine.generate(prompt, GenerationParams(mode="diffusion", max_new_tokens=48))
            assert drafted.token_ids == ar.token_ids, prompt
            continued += drafted.stats.continued_passes
    finally:
        engine.close()
    assert continued > 0
