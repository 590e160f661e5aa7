"""Layers shared by every family: RMSNorm, rotary embeddings, a projection with an optional
LoRA adapter, grouped-query attention over a KV cache, and the SwiGLU MLP."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kernels.activation_quant import quantize_activations


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


class RotaryEmbedding(nn.Module):
    """Rotate-half rotary embeddings (the Hugging Face layout; GGUF rows are un-permuted on load)."""

    def __init__(self, head_dim: int, theta: float, max_positions: int):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
        angles = torch.outer(torch.arange(max_positions, dtype=torch.float64), inv_freq)
        angles = torch.cat([angles, angles], dim=-1)
        self.register_buffer("cos", angles.cos().float(), persistent=False)
        self.register_buffer("sin", angles.sin().float(), persistent=False)

    def tables(self, positions: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """cos/sin for `positions` (any shape), with a head axis added before the last."""
        if int(positions.max()) >= self.cos.shape[0]:
            raise ValueError(
                f"position {int(positions.max())} is past the model's context of {self.cos.shape[0]} tokens"
            )
        return self.cos[positions].unsqueeze(-2).to(dtype), self.sin[positions].unsqueeze(-2).to(dtype)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class LoRA(nn.Module):
    """Low-rank update B(A x) * scale, added to a frozen projection on selected tokens only."""

    def __init__(self, in_features: int, out_features: int, rank: int, alpha: float):
        super().__init__()
        self.down = nn.Parameter(torch.empty(rank, in_features))
        self.up = nn.Parameter(torch.zeros(out_features, rank))
        nn.init.kaiming_uniform_(self.down, a=5**0.5)
        self.scale = alpha / rank

    def forward(self, x: Tensor) -> Tensor:
        # computed in the adapter's dtype (fp32 while training on a bf16 base)
        return (F.linear(F.linear(x.to(self.down.dtype), self.down), self.up) * self.scale).to(x.dtype)


class Projection(nn.Module):
    """A linear layer whose LoRA (if any) applies only where the adapter gate is on.

    The gate is a per-token bool: the default diffusion model drafts masked blocks with the
    adapter but writes its KV cache with the base weights, so autoregressive mode and the
    cache stay exactly the base model's.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        self.lora: LoRA | None = None
        # the fused CPU pass multiplies this weight by 8-bit activations: the torch pass can too
        # (its test twin), the adapter's side path never
        self.int8_input = False

    def forward(self, x: Tensor, adapter_gate: Tensor | None = None) -> Tensor:
        """adapter_gate: None (base weights only), a bool mask over x's rows (training's dense
        pass), or the int64 indices of the rows of a packed [N, in] x (the engine's pass: no
        mask scan or host sync per projection)."""
        y = F.linear(quantize_activations(x) if self.int8_input else x, self.weight, self.bias)
        if self.lora is None or adapter_gate is None:
            return y
        if adapter_gate.dtype == torch.int64 and adapter_gate.dim() == 1 and x.dim() == 2:
            return y.index_add(0, adapter_gate, self.lora(x.index_select(0, adapter_gate)))
        if adapter_gate.dtype == torch.bool and adapter_gate.shape == x.shape[:-1]:
            if bool(adapter_gate.all()):
                return y + self.lora(x)
            rows = adapter_gate.nonzero(as_tuple=True)
            if rows[0].numel() == 0:
                return y
            y = y.clone()
            y[rows] = y[rows] + self.lora(x[rows])
            return y
        raise ValueError(f"adapter_gate must be a bool tensor of shape {tuple(x.shape[:-1])} or int64 row indices")


class MLP(nn.Module):
    """SwiGLU with the gate and up projections fused into one matmul."""

    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.intermediate = intermediate
        self.gate_up = Projection(hidden, 2 * intermediate, bias=False)
        self.down = Projection(intermediate, hidden, bias=False)

    def forward(self, x: Tensor, adapter_gate: Tensor | None) -> Tensor:
        gate, up = self.gate_up(x, adapter_gate).split(self.intermediate, dim=-1)
        return self.down(F.silu(gate) * up, adapter_gate)
