"""Fixtures for the engine tests: tiny checkpoints written once per session."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer

from tiny_checkpoints import FAMILY_SPECS, train_tiny_tokenizer, write_hf_checkpoint


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
