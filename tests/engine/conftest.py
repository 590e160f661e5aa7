"""Fixtures for the engine tests: tiny checkpoints written once per session."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from tiny_checkpoints import FAMILY_SPECS, train_tiny_tokenizer, write_hf_checkpoint

REPO_ROOT = Path(__file__).resolve().parents[2]


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "slow: loads the real SmolLM2-135M GGUF (tens of seconds on 2 cores)")


@pytest.fixture(scope="session")
def tiny_tokenizer() -> Tokenizer:
    return train_tiny_tokenizer()


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    """A tiny random LLaMA checkpoint in Hugging Face layout (tied embeddings, like SmolLM2)."""
    directory = tmp_path_factory.mktemp("tiny-llama")
    write_hf_checkpoint(directory, FAMILY_SPECS["llama"], tiny_tokenizer)
    return directory


def _run_dllm_generate(model: str, prompt: str, max_new_tokens: int, activations: str = "fp32") -> dict:
    """`dllm generate ... --json` as a user runs it (a subprocess); returns its JSON object."""
    command = [sys.executable, "-m", "dllm_engine.cli", "generate", "--model", model, "--mode", "autoregressive",
               "--dtype", "float32", "--activations", activations, "--raw", "--max-new-tokens", str(max_new_tokens),
               "--json", prompt]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=REPO_ROOT)
    assert result.returncode == 0, f"dllm generate failed ({result.returncode}):\n{result.stderr[-3000:]}"
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, f"expected one JSON line on stdout, got:\n{result.stdout}"
    return json.loads(lines[0])


@pytest.fixture(scope="session")
def dllm_generate():
    return _run_dllm_generate


@pytest.fixture(scope="session")
def make_tiny_bd(tiny_llama_dir):
    """The tiny llama turned block-diffusion (block 4) with a random, non-zero adapter."""
    import torch

    from dllm_engine.loading import load_model
    from dllm_engine.loading.registry import make_block_diffusion

    def make(seed: int):
        loaded = load_model(str(tiny_llama_dir), dtype=torch.float32)
        make_block_diffusion(loaded, rank=4, alpha=8.0, block_size=4, threshold=0.9)
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, param in loaded.model.named_parameters():
                if "lora" in name or name == "mask_embedding":
                    param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
        return loaded

    return make
