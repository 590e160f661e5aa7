"""The trained draft head as a file: its matrices as llama.cpp Q8_0 blocks (what the fused CPU
pass multiplies directly, and half the size of fp16: the head stays under 16 MB), its norms
and mask embedding in fp32, and a JSON beside it (the spec, the draft vocabulary, how it was
trained). dllm_engine/loading/registry.py reads it back."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from dllm_engine.models.draft_head import DraftHead

BLOCKS_SUFFIX = ".q8_0"


def export_draft_head(head: DraftHead, draft_vocab: list[int], path: Path, extra: dict) -> int:
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    tensors = {}
    for name, value in head.state_dict().items():
        value = value.detach().float().contiguous()
        if value.dim() == 2 and value.shape[1] % 32 == 0:
            blocks = quantize(value.numpy(), GGMLQuantizationType.Q8_0)
            tensors[name + BLOCKS_SUFFIX] = torch.from_numpy(np.ascontiguousarray(blocks).view(np.uint8))
        else:
            tensors[name] = value
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path))
    meta = {"taps": list(head.spec.taps), "layers": head.spec.layers, "block_size": head.spec.block_size,
            "base": "smollm2-135m", "draft_vocab": draft_vocab, **extra}
    path.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")
    return path.stat().st_size


def dequantize_q8_0(blocks: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Q8_0 blocks [rows, cols / 32 * 34] (fp16 scale, 32 int8) -> fp32 [rows, cols]."""
    raw = blocks.reshape(rows, cols // 32, 34)
    scale = raw[..., :2].contiguous().view(torch.float16).float()
    values = raw[..., 2:].contiguous().view(torch.int8).float()
    return (values * scale).reshape(rows, cols)


def plot_acceptance(evals: list[dict], path: Path) -> None:
    """Held-out acceptance by offset (the share of blocks whose check keeps at least j drafts)
    against training minutes."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not evals:
        return
    minutes = [e["seconds"] / 60 for e in evals]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for offset in range(len(evals[0]["by_offset"])):
        left.plot(minutes, [e["by_offset"][offset] for e in evals], label=f"draft {offset + 1}")
    left.set_xlabel("training minutes (2 CPU cores)")
    left.set_ylabel("kept by the check (share of blocks)")
    left.set_title("acceptance by offset, held-out replies")
    left.legend(fontsize=7)
    right.plot(minutes, [e["tokens_per_pass"] for e in evals])
    right.set_xlabel("training minutes (2 CPU cores)")
    right.set_ylabel("tokens per target pass (1 + drafts kept)")
    right.set_title("tokens per pass, held-out replies")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
