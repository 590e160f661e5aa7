"""Checkpoints: Hugging Face directories, GGUF files, the registry of short names."""

from dllm_engine.loading.assemble import CheckpointError
from dllm_engine.loading.registry import (
    DEFAULT_MODEL,
    LoadedModel,
    UnknownModelError,
    known_names,
    load_model,
)

__all__ = ["CheckpointError", "DEFAULT_MODEL", "LoadedModel", "UnknownModelError", "known_names", "load_model"]
