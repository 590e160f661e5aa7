"""Which implementation of a kernel runs for a given call.

Every op in this package has a plain-torch reference (the CPU path and the oracle) and a
Triton kernel for CUDA. The engine never picks one itself: it calls the op, and the op asks
`resolve_backend` with the device of its inputs. Tests force ``backend="triton"`` on CPU
tensors with ``TRITON_INTERPRET=1`` set before the Triton kernels are first imported.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import sys
from typing import Literal

import torch

logger = logging.getLogger(__name__)

Backend = Literal["auto", "reference", "triton"]
BACKENDS: tuple[str, ...] = ("auto", "reference", "triton")

_warned_no_triton = False


@functools.cache
def triton_installed() -> bool:
    """True when the optional `triton` package imports (asked only when Triton could run)."""
    try:
        importlib.import_module("triton")
    except ImportError:
        return False
    return True


def triton_interpreting() -> bool:
    """True when TRITON_INTERPRET asks for Triton's CPU interpreter (read now)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def triton_kernels_interpreted() -> bool:
    """Whether our Triton kernels can run in the interpreter now. Triton fixes the mode per
    kernel when it is decorated (kernels.triton_ops records it), and the interpreter reads
    TRITON_INTERPRET again while it runs, so both must say so."""
    ops = sys.modules.get("kernels.triton_ops")
    return triton_interpreting() and (ops is None or ops.INTERPRETED)


def resolve_backend(backend: str, device: torch.device, op: str) -> Literal["reference", "triton"]:
    """Turn a requested backend into the one that runs on `device`.

    'auto' picks Triton for CUDA tensors when Triton is installed and the reference otherwise.
    'triton' on CPU tensors is only possible under the Triton interpreter.
    """
    global _warned_no_triton
    if backend not in BACKENDS:
        raise ValueError(f"{op}: backend must be one of {BACKENDS}, got {backend!r}")
    if backend == "reference":
        return "reference"
    if backend == "auto":
        if device.type != "cuda":
            return "reference"
        if triton_installed():
            return "triton"
        if not _warned_no_triton:
            logger.warning("triton is not installed: %s runs its torch reference on CUDA", op)
            _warned_no_triton = True
        return "reference"
    if not triton_installed():
        raise RuntimeError(f"{op}: backend='triton' needs the triton package (pip install triton)")
    if device.type != "cuda" and not triton_kernels_interpreted():
        raise RuntimeError(
            f"{op}: backend='triton' on {device.type} tensors needs TRITON_INTERPRET=1, set "
            "before the Triton kernels are imported and while they run"
        )
    return "triton"
