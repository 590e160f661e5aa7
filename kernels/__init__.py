"""Fused compute ops for the denoising hot path of the diffusion LLM engine.

kernels/cpu: the whole forward pass in C++ for CPUs (AVX2, AVX-512 VNNI), over quantized weights
and (by default) 8-bit activations; activation_quant.py is its activation quantizer in torch.

Each of the ops below has a plain-torch `reference` (the CPU path and the test oracle) and a Triton kernel
for CUDA, behind one function that dispatches on the device of its inputs. `backend=` forces
one ('reference' or 'triton'; the latter on CPU only under TRITON_INTERPRET=1). Triton is
optional: without it every op runs its reference.
"""

from kernels.activation_quant import quantize_activations
from kernels.block_attention import block_attention
from kernels.commit_selection import FORCE_BEST, FORCE_LEFTMOST, FORCE_NONE, select_commits
from kernels.dispatch import BACKENDS, Backend
from kernels.head_confidence import confidence_head

__all__ = [
    "BACKENDS", "FORCE_BEST", "FORCE_LEFTMOST", "FORCE_NONE", "Backend", "block_attention", "confidence_head",
    "quantize_activations", "select_commits",
]
