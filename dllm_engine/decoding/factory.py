"""Which decoder a request gets, from the model and the request's parameters."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dllm_engine.decoding.block_decoder import BlockCausalDecoder, BlockDecoderBase, FullAttentionDecoder
from dllm_engine.decoding.draft_head_decoder import DraftHeadDecoder
from dllm_engine.decoding.suffix_drafts import DraftChooser
from dllm_engine.models.families import FAMILIES
from dllm_engine.models.kv_pool import BlockTable, KVPool
from dllm_engine.request import EngineError, GenerationParams

if TYPE_CHECKING:
    from dllm_engine.loading.registry import LoadedModel

_NO_MASK = -1  # placeholder for models without a mask token: only ever used in AR mode, never fed


def decode_block(loaded: "LoadedModel", params: GenerationParams) -> int:
    """The block a request decodes with (1 for AR), refused when the model cannot."""
    config, head = loaded.config, loaded.draft_head
    if params.mode != "diffusion":
        return 1
    if not config.is_diffusion:
        raise EngineError(f"model {loaded.name} is autoregressive ({config.family}); use mode='autoregressive'")
    block = params.block_size or config.block_size
    if head is not None and not 2 <= block <= head.spec.block_size:
        raise EngineError(f"block_size must be in 2..{head.spec.block_size} for {loaded.name}'s draft head, got {block}")
    return block


def make_decoder(loaded: "LoadedModel", ids: list[int], params: GenerationParams, pool: KVPool,
                 chooser: DraftChooser | None = None) -> BlockDecoderBase:
    """The request's decoder over a block table of the pool reserved for its longest reply
    (kv_pool.PoolFull when the pool cannot promise it):
    the draft head's when the model has one (drafting continuations too where `chooser` is
    given), LLaDA/Dream's full-attention decoder, else the block-causal one (AR mode is a block
    of 1 with the adapter off)."""
    config = loaded.config
    diffusion = params.mode == "diffusion"
    block = decode_block(loaded, params)
    head = loaded.draft_head if diffusion else None
    # the head drafts its whole block (whatever the decode block) from the last verified position
    overhang = max(block, head.spec.block_size) if head is not None else block
    if head is not None and chooser is not None:
        overhang = max(overhang, chooser.max_drafts + 1)
    total = len(ids) + params.max_new_tokens + overhang + 1
    if total > config.max_position_embeddings:
        raise EngineError(f"prompt ({len(ids)} tokens) + max_new_tokens ({params.max_new_tokens}) exceeds the "
                          f"model's context of {config.max_position_embeddings} tokens")
    cache = BlockTable(pool, total, has_head=head is not None)
    family = FAMILIES.get(config.family)
    common = dict(prompt_ids=ids, cache=cache, block_size=block, max_new_tokens=params.max_new_tokens,
                  mask_id=config.mask_token_id if config.mask_token_id is not None else _NO_MASK,
                  eos_ids=set(config.eos_token_ids), shift=config.logits_shift, stop_at_eos=params.stop_at_eos)
    if head is not None:
        return DraftHeadDecoder(**common, chooser=chooser, greedy=params.temperature == 0)
    if config.attention == "bidirectional" and diffusion:
        return FullAttentionDecoder(**common)
    exact = params.exact
    if exact is None:  # the default: exact, unless the caller asked for the lossy dial
        exact = params.threshold is None and params.deadline_s is None and params.policy == "threshold"
    return BlockCausalDecoder(
        **common, adapter=diffusion and loaded.model.has_adapter,
        bidirectional_clean_blocks=bool(family and family.bidirectional_clean_blocks) and diffusion,
        verify_drafts=params.verify_drafts if diffusion else 0, exact=exact and diffusion)
