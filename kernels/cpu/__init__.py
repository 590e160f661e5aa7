"""CPU kernels in C++: the engine's whole packed forward pass in one call, over weights kept in
their checkpoint's blocks (llama.cpp's Q4_1 / Q8_0) or fp32, with 8-bit activations and integer
dot products (csrc/int8.h) or fp32 ones. The baseline is AVX2 + FMA + F16C; every integer kernel
variant is compiled (AVX2, AVX-512 VNNI) and the best one this CPU runs is chosen at load
(`int8_variants()` lists them, fastest first).

The extension is compiled on first use with torch's cpp_extension (ninja + the system C++
compiler, ~1 minute) into this checkout's build/ folder, and reused after; `make setup` builds
it ahead (`python -m kernels.cpu`). The folder is the checkout's own: torch's shared extension
cache would have two checkouts on one machine rebuild it over each other's sources. Where it cannot run (no AVX2/FMA/F16C, not x86, no compiler)
`available()` says why and the engine keeps its torch path.
"""

from __future__ import annotations

import functools
import logging
import platform
from pathlib import Path

log = logging.getLogger(__name__)

SOURCES = ["bindings.cpp", "matmul.cpp", "attention.cpp", "attention_avx2.cpp", "attention_avx512.cpp", "model.cpp",
           "quantize.cpp", "int8_avx2.cpp", "int8_avx512.cpp", "machine.cpp"]
_CSRC = Path(__file__).resolve().parent / "csrc"
_CPU_FLAGS = ("avx2", "fma", "f16c")
# a checkout builds into its own folder; an installed package into torch's extension cache
_CHECKOUT = _CSRC.parents[2]
BUILD_DIR = _CHECKOUT / "build" / "kernels-cpu" if (_CHECKOUT / "pyproject.toml").is_file() else None

# weight types the kernels read (kernels/cpu/csrc/weights.h)
F32, Q8_0, Q4_1 = 0, 1, 2
BLOCK_BYTES = {Q8_0: 34, Q4_1: 20}  # per 32 weights


def cpu_support() -> str | None:
    """None when this CPU can run the kernels, else why not."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"the CPU kernels are x86-64 only (this is {platform.machine()})"
    try:
        flags = set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return "cannot read /proc/cpuinfo to check for AVX2/FMA/F16C"
    missing = [f for f in _CPU_FLAGS if f not in flags]
    return f"the CPU lacks {', '.join(missing)}" if missing else None


@functools.cache
def extension():
    """The compiled extension module (built on first call); raises RuntimeError if it cannot be."""
    reason = cpu_support()
    if reason:
        raise RuntimeError(reason)
    from torch.utils import cpp_extension

    if BUILD_DIR is not None:
        BUILD_DIR.mkdir(parents=True, exist_ok=True)
    try:
        return cpp_extension.load(
            name="dllm_cpu_kernels",
            build_directory=str(BUILD_DIR) if BUILD_DIR else None,
            sources=[str(_CSRC / s) for s in SOURCES],
            extra_cflags=["-O3", "-mavx2", "-mfma", "-mf16c", "-fopenmp", "-DNDEBUG"],
            extra_ldflags=["-fopenmp"],
            verbose=False,
        )
    except Exception as exc:  # a missing compiler or ninja, a build error: say so, once
        raise RuntimeError(f"could not build the CPU kernels: {exc}") from exc


def int8_variants() -> list[str]:
    """The integer kernel variants this CPU runs, fastest first ([] when the kernels cannot build)."""
    return [] if available() else list(extension().int8_variants())


def attention_kernel_sets() -> list[str]:
    """The instruction sets attention's inner kernels run in on this CPU, widest first."""
    return [] if available() else list(extension().attention_kernel_sets())


def available() -> str | None:
    """None when the kernels are built and loadable, else why not (logged once by the caller)."""
    reason = cpu_support()
    if reason:
        return reason
    try:
        extension()
    except RuntimeError as exc:
        return str(exc)
    return None
