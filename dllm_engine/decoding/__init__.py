"""Denoising policies, deadline control, and the per-request block decoders."""

from dllm_engine.decoding.block_decoder import BlockCausalDecoder, FullAttentionDecoder
from dllm_engine.decoding.deadline import DeadlineController
from dllm_engine.decoding.draft_head_decoder import DraftHeadDecoder
from dllm_engine.decoding.plan import StepPlan, Target
from dllm_engine.decoding.policies import FactorPolicy, FixedStepsPolicy, ThresholdPolicy, make_policy
from dllm_engine.decoding.sampling import pick_tokens

__all__ = [
    "BlockCausalDecoder", "DeadlineController", "DraftHeadDecoder", "FactorPolicy", "FixedStepsPolicy", "FullAttentionDecoder",
    "StepPlan", "Target", "ThresholdPolicy", "make_policy", "pick_tokens",
]
