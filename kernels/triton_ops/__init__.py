"""Triton implementations of the ops in `kernels`; imported only when Triton runs an op.

Importing a module here decorates its kernels, and Triton decides at that moment whether
they run compiled (CUDA) or in its CPU interpreter (``TRITON_INTERPRET=1``).
"""

import torch

from kernels.dispatch import triton_interpreting

# Fixed now, like the decoration of the kernels in the modules of this package.
INTERPRETED: bool = triton_interpreting()


def dot_options(dtype: torch.dtype) -> dict[str, object]:
    """Constexpr arguments for kernels that call tl.dot on `dtype` operands.

    DOT_PRECISION: fp32 operands use exact fp32 products ("ieee"), not TF32, so the argmax
    and the probabilities match the reference. UPCAST_DOT: Triton's CPU interpreter (3.9)
    gets tl.dot on bf16 operands wrong (it keeps bf16 as uint16 and multiplies the bit
    patterns; fp16 is fine), so under the interpreter bf16 operands are cast to fp32 first;
    compiled kernels keep the tensor cores.
    """
    return {
        "DOT_PRECISION": "ieee" if dtype == torch.float32 else "tf32",
        "UPCAST_DOT": INTERPRETED and dtype == torch.bfloat16,
    }
