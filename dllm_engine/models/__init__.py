"""Transformer architectures: one shared decoder stack, configured per family."""

from dllm_engine.models.config import ModelConfig
from dllm_engine.models.transformer import Segment, Transformer

__all__ = ["ModelConfig", "Segment", "Transformer"]
