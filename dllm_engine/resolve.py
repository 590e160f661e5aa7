"""What each of the engine's "auto" settings becomes on the machine at hand: the device, the
weights' dtype, the forward pass, its activations and its keys and values. Each setting is
checked by name, with a clear error for a value that is not one."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from dllm_engine.models.fused_cpu import KV_CACHE_DTYPES
from dllm_engine.request import EngineError

log = logging.getLogger(__name__)

DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def resolve_device(device: torch.device | str) -> torch.device:
    """"auto" is the first CUDA device when there is one, else the CPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(device)
    except RuntimeError as exc:
        raise EngineError(f"unknown device {device!r}: {exc}") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise EngineError(f"device {str(device)!r} is not available: this torch sees no CUDA device")
    if device.type not in ("cpu", "cuda"):
        raise EngineError(f"device {str(device)!r} is not supported: use cpu or cuda")
    return device


def resolve_dtype(dtype: torch.dtype | str, device: torch.device = torch.device("cpu")) -> torch.dtype:
    """A dtype or its name; "auto" is bfloat16 where matmuls run natively in it (CUDA, or a CPU
    with avx512_bf16 / AMX: 1.7-2x faster than float32 here, measured with `dllm bench`), else
    float32 (emulated bf16 is slower than float32)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" or _cpu_has_native_bf16() else torch.float32
    if dtype not in DTYPES:
        raise EngineError(f"unknown dtype {dtype!r}; known: auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]


def _cpu_has_native_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:  # not Linux: no cheap way to ask, so the safe choice
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


# which forward pass runs the model (an engine's `backend`); kernels/dispatch.py's backends are
# another choice, of an op's implementation (torch reference or Triton) inside the torch pass
PASSES = ("auto", "fused", "torch")

def resolve_pass(backend: str, device: torch.device) -> str:
    """'auto' is the fused CPU pass on a CPU that can run it, else torch."""
    from kernels import cpu

    if backend not in PASSES:
        raise ValueError(f"backend must be one of {', '.join(PASSES)}, got {backend!r}")
    if backend == "torch" or (backend == "auto" and device.type != "cpu"):
        return "torch"
    if device.type != "cpu":
        raise ValueError(f"the fused backend runs on the CPU, not {device}")
    reason = cpu.available()
    if reason is None:
        return "fused"
    if backend == "fused":
        raise ValueError(f"the fused CPU backend is not available: {reason}")
    log.warning("fused CPU kernels unavailable (%s): the engine runs its torch pass", reason)
    return "torch"


ACTIVATIONS = ("auto", "int8", "fp32")


KV_CACHES = ("auto", "fp16", "fp32")


def resolve_kv_cache(kv_cache: str, backend: str, activations: str, model_dtype: torch.dtype) -> torch.dtype:
    """The dtype of every request's keys and values. 'auto': on the fused CPU pass fp16 with
    8-bit activations (its attention is bound by reading them; docs/kernels.md measures the
    effect on replies) and fp32 with fp32 activations (the pass that equals transformers); the
    model's dtype on torch. 'fp16' / 'fp32' choose for the fused pass."""
    if kv_cache not in KV_CACHES:
        raise ValueError(f"kv_cache must be one of {', '.join(KV_CACHES)}, got {kv_cache!r}")
    if backend != "fused":
        if kv_cache != "auto":
            raise ValueError(f"kv_cache={kv_cache!r} chooses the fused CPU pass's caches; the torch pass keeps the "
                             "model's dtype")
        return model_dtype
    if kv_cache == "auto":
        kv_cache = "fp16" if activations == "int8" else "fp32"
    return KV_CACHE_DTYPES[kv_cache]


def resolve_activations(activations: str, backend: str) -> str:
    """'auto': 8-bit activations on the fused CPU pass (its integer kernels), fp32 on torch."""
    if activations not in ACTIVATIONS:
        raise ValueError(f"activations must be one of {', '.join(ACTIVATIONS)}, got {activations!r}")
    if activations == "auto":
        return "int8" if backend == "fused" else "fp32"
    return activations
