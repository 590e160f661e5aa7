"""dllm_engine: an inference engine for diffusion language models (and their AR baselines)."""

from dllm_engine.request import (
    DraftUpdate,
    EngineError,
    EngineOverloaded,
    GenerationParams,
    RequestHandle,
    RequestStats,
)

__all__ = [
    "DraftUpdate",
    "EngineError",
    "EngineOverloaded",
    "GenerationParams",
    "RequestHandle",
    "RequestStats",
]
