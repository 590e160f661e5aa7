"""Output head fused with the per-position confidence a denoising step needs.

For each hidden state h (a masked position), logits = h @ W.T / temperature; the step needs
only the argmax token, its softmax probability and the softmax entropy, never the whole
[positions x vocab] logits. Both implementations run an online softmax over vocabulary tiles
and keep three running numbers per row: the max logit m, S = sum(exp(z - m)) and
Z = sum(exp(z - m) * (z - m)). Then prob(argmax) = 1 / S and entropy = log(S) - Z / S.
"""

from __future__ import annotations

import torch

from kernels.dispatch import Backend, resolve_backend

# The reference's [N, chunk] fp32 logits stay within this many bytes. As few chunks as that
# allows: each chunk is ~10 torch ops, and on a CPU shared with ASR/TTS every op's thread
# barrier costs (8192-row chunks were 2-3x slower than one chunk under load; docs/kernels.md).
REFERENCE_LOGITS_BYTES = 16 << 20
MIN_VOCAB_CHUNK = 8192


def reference_vocab_chunk(rows: int) -> int:
    """Vocabulary rows per reference chunk for `rows` hidden states."""
    return max(MIN_VOCAB_CHUNK, REFERENCE_LOGITS_BYTES // (4 * max(rows, 1)))


def check_inputs(hidden: torch.Tensor, weight: torch.Tensor, temperature: float) -> None:
    """Raise ValueError naming the bad argument; shapes, dtypes, devices and temperature."""
    if hidden.dim() != 2:
        raise ValueError(f"confidence_head: hidden must be [N, H], got shape {tuple(hidden.shape)}")
    if weight.dim() != 2:
        raise ValueError(f"confidence_head: weight must be [V, H], got shape {tuple(weight.shape)}")
    if hidden.shape[1] != weight.shape[1]:
        raise ValueError(
            f"confidence_head: hidden size differs, hidden is {tuple(hidden.shape)} and "
            f"weight is {tuple(weight.shape)}"
        )
    if weight.shape[0] == 0:
        raise ValueError("confidence_head: weight has an empty vocabulary (V = 0)")
    if hidden.dtype != weight.dtype:
        raise ValueError(f"confidence_head: dtype differs, hidden {hidden.dtype}, weight {weight.dtype}")
    if not hidden.dtype.is_floating_point:
        raise ValueError(f"confidence_head: hidden must be floating point, got {hidden.dtype}")
    if hidden.device != weight.device:
        raise ValueError(f"confidence_head: device differs, hidden {hidden.device}, weight {weight.device}")
    if not temperature > 0.0:
        raise ValueError(f"confidence_head: temperature must be > 0, got {temperature}")


def reference(
    hidden: torch.Tensor, weight: torch.Tensor, temperature: float = 1.0,
    vocab_chunk: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Plain torch, chunked over the vocabulary. Logits are computed in the inputs' dtype (a
    bf16 head rounds logits to bf16, as the model's own head would) and reduced in fp32."""
    check_inputs(hidden, weight, temperature)
    rows = hidden.shape[0]
    vocab_chunk = vocab_chunk or reference_vocab_chunk(rows)
    device = hidden.device
    best_logit = torch.full((rows,), float("-inf"), dtype=torch.float32, device=device)
    best_token = torch.zeros(rows, dtype=torch.int64, device=device)
    exp_sum = torch.zeros(rows, dtype=torch.float32, device=device)
    weighted_sum = torch.zeros(rows, dtype=torch.float32, device=device)
    for start in range(0, weight.shape[0], vocab_chunk):
        logits = (hidden @ weight[start:start + vocab_chunk].T).float()
        if temperature != 1.0:
            logits.div_(temperature)
        chunk_max, chunk_arg = logits.max(dim=1)
        new_max = torch.maximum(best_logit, chunk_max)
        # Strictly greater: on ties the earlier chunk (lower token id) keeps the argmax.
        improved = chunk_max > best_logit
        best_token = torch.where(improved, chunk_arg + start, best_token)
        # Rescale the running sums to the new max (Z' = e^shift * (Z + S * shift)); before
        # the first chunk S = 0 and best_logit = -inf, kept out of the arithmetic.
        started = exp_sum > 0
        shift = torch.where(started, best_logit - new_max, 0.0)
        rescale = torch.where(started, torch.exp(shift), 0.0)
        weighted_sum = rescale * (weighted_sum + exp_sum * shift)
        exp_sum = exp_sum * rescale
        centred = logits.sub_(new_max[:, None])  # in place: the chunk's logits are not reused
        probs = torch.exp(centred)
        exp_sum = exp_sum + probs.sum(dim=1)
        weighted_sum = weighted_sum + torch.linalg.vecdot(probs, centred)
        best_logit = new_max
    return best_token, 1.0 / exp_sum, torch.log(exp_sum) - weighted_sum / exp_sum


def confidence_head(
    hidden: torch.Tensor, weight: torch.Tensor, temperature: float = 1.0, *,
    backend: Backend = "auto",
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Argmax token (int64 [N]), its softmax probability and the softmax entropy (fp32 [N])
    of hidden [N, H] @ weight[V, H].T / temperature. Ties go to the lowest token id."""
    check_inputs(hidden, weight, temperature)
    if resolve_backend(backend, hidden.device, "confidence_head") == "reference":
        return reference(hidden, weight, temperature)
    from kernels.triton_ops.head_confidence import run_confidence_head

    return run_confidence_head(hidden, weight, temperature)
