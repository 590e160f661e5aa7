"""8-bit activations as the CPU integer kernels see them (kernels/cpu/csrc/quantize.cpp), in torch.

Each 32-value block of the last axis is rounded to int8, q = round-half-even(x * 127 / max|x|)
(so |q| <= 127), and scaled back by max|x| / 127: the same fp32 operations as the C++ quantizer,
so this returns exactly the values the integer matmul multiplies. The torch pass applies it
where the fused pass runs an integer matmul, and the two then agree up to summation order.
"""

from __future__ import annotations

import torch
from torch import Tensor

BLOCK = 32


def quantize_activations(x: Tensor) -> Tensor:
    if x.shape[-1] % BLOCK:
        raise ValueError(f"activations are quantized in blocks of {BLOCK}: the last axis is {x.shape[-1]}")
    blocks = x.float().unflatten(-1, (x.shape[-1] // BLOCK, BLOCK))
    top = blocks.abs().amax(-1, keepdim=True)
    inverse = torch.where(top > 0, 127.0 / top, torch.zeros_like(top))
    return (torch.round(blocks * inverse) * (top / 127.0)).flatten(-2).to(x.dtype)
