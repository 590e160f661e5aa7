"""Hugging Face checkpoint directories: config.json, (sharded) safetensors, tokenizer files."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors import safe_open

from dllm_engine.loading.assemble import CheckpointError
from dllm_engine.loading.tokenizer import TextTokenizer
from dllm_engine.models.config import ModelConfig
from dllm_engine.models.families import family_for_hf_config, canonical_name


def load_hf_dir(directory: Path) -> tuple[ModelConfig, dict, TextTokenizer]:
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{directory} has no config.json")
    hf = json.loads(config_path.read_text())
    family = family_for_hf_config(hf)
    layout = "olmo" if family.name == "llada" else "hf"
    mask_id = hf.get("mask_token_id", family.mask_token_id)
    config = ModelConfig.from_hf(
        hf, family.name, attention=family.attention, qkv_bias=family.qkv_bias, qk_norm=family.qk_norm,
        logits_shift=family.logits_shift, mask_token_id=mask_id, block_size=int(hf.get("bd_size", family.block_size)),
        default_threshold=family.default_threshold,
    )
    if family.name == "llada":  # OLMo configs name these differently and never tie
        config.tie_embeddings = bool(hf.get("weight_tying", False))
    tensors = {}
    for shard in _shard_files(directory):
        with safe_open(str(shard), framework="pt") as handle:
            for name in handle.keys():
                key = canonical_name(layout, name)
                if key is not None:
                    tensors[key] = handle.get_tensor(name).float()
    if config.tie_embeddings:
        tensors.pop((None, "lm_head"), None)
    return config, tensors, TextTokenizer.from_hf_dir(directory)


def _shard_files(directory: Path) -> list[Path]:
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        missing = [n for n in names if not (directory / n).is_file()]
        if missing:
            raise CheckpointError(f"{directory}: shards listed in {index.name} are missing: {', '.join(missing)}")
        return [directory / n for n in names]
    single = directory / "model.safetensors"
    if single.is_file():
        return [single]
    found = sorted(directory.glob("*.safetensors"))
    if not found:
        raise CheckpointError(f"{directory}: no *.safetensors weights found")
    return found
