"""The model runner: one packed forward pass for a batch's step plans, and its predictions.

The scheduler hands it the live requests of a step and their plans (`StepPlan`: segments and
the rows whose predictions it needs); the runner packs every segment into one pass, runs the
output head on the predicting rows only, and returns a token and its confidence per target.

Two passes compute the same thing:
  fused   kernels/cpu: the whole pass in one C++ call over the checkpoint's own (quantized)
          blocks; the CPU default where the CPU has AVX2/FMA/F16C (dllm_engine/models/fused_cpu.py)
  torch   Transformer.forward_segments + kernels.confidence_head: CUDA, other CPUs, and the
          reference the fused pass is tested against
"""

from __future__ import annotations

import logging
from typing import Protocol

import torch
from torch import Tensor

from dllm_engine.decoding import StepPlan, pick_tokens
from dllm_engine.models.heads import split_head
from dllm_engine.models.kv_pool import BlockTable
from dllm_engine.models.transformer import Segment, Transformer
from dllm_engine.resolve import resolve_activations
from kernels import confidence_head

log = logging.getLogger(__name__)


class TorchPass:
    """Transformer.forward_segments, the head as kernels.confidence_head."""

    def __init__(self, model: Transformer, draft_vocab: list[int] | None = None):
        self.model = model
        self.draft_vocab = torch.tensor(draft_vocab, dtype=torch.long) if draft_vocab else None

    def forward(self, segments: list[Segment], rows: list[int]) -> Tensor:
        hidden = self.model.forward_segments(segments)
        return hidden[torch.tensor(rows, dtype=torch.long, device=hidden.device)]

    def forward_with_taps(self, segments: list[Segment], rows: list[int], tap_layers: list[int],
                          tap_rows: list[int]) -> tuple[Tensor, Tensor]:
        hidden, taps = self.model.forward_segments(segments, tap_layers)
        pick = lambda r: torch.tensor(r, dtype=torch.long, device=hidden.device)  # noqa: E731
        return hidden[pick(rows)], taps[pick(tap_rows)]

    def greedy(self, hidden: Tensor, draft_rows: list[int] | None = None) -> tuple[Tensor, Tensor]:
        weight = self.model.output_weight
        hidden = self.model.head_input(hidden)
        if not draft_rows or self.draft_vocab is None:
            return confidence_head(hidden, weight)[:2]
        vocab = self.draft_vocab.to(weight.device)

        def draft(rows: Tensor) -> tuple[Tensor, Tensor]:
            index, confidence, _ = confidence_head(rows, weight[vocab])
            return vocab[index], confidence

        return split_head(hidden, draft_rows, lambda rows: confidence_head(rows, weight)[:2], draft)

    def logits(self, hidden: Tensor) -> Tensor:
        return self.model.logits(hidden)


class ForwardPass(Protocol):
    """What the runner asks of a pass (TorchPass, dllm_engine.models.fused_cpu.FusedCpuModel,
    and a GPU pass would too): the packed forward, with a draft head's taps, and the heads."""

    def forward(self, segments: list[Segment], rows: list[int]) -> Tensor: ...

    def forward_with_taps(self, segments: list[Segment], rows: list[int], tap_layers: list[int],
                          tap_rows: list[int]) -> tuple[Tensor, Tensor]: ...

    def greedy(self, hidden: Tensor, draft_rows: list[int] | None = None) -> tuple[Tensor, Tensor]: ...

    def logits(self, hidden: Tensor) -> Tensor: ...


class DraftStep(Protocol):
    """A draft head's step (TorchDraftHead, dllm_engine.models.fused_cpu.FusedDraftHead)."""

    def write_context(self, runs: list[tuple[Tensor, int, BlockTable]]) -> None: ...

    def draft(self, blocks: list[tuple[int, int, BlockTable]]) -> list[list[int]]: ...


class TorchDraftHead:
    """A draft head's steps in torch (GPUs, CPUs without the fused pass, and its reference)."""

    def __init__(self, head, target: Transformer, draft_vocab: list[int]):
        self.head, self.target = head, target
        self.first_layer = target.config.num_layers
        self.vocab = torch.tensor(draft_vocab, dtype=torch.long)

    def write_context(self, runs: list[tuple[Tensor, int, object]]) -> None:
        for features, start, cache in runs:
            self.head.write_context(features.to(self.target.embed_tokens.dtype), start,
                                    cache.view(self.first_layer), self.target.rope)

    def draft(self, blocks: list[tuple[int, int, object]]) -> list[list[int]]:
        vocab = self.vocab.to(self.target.embed_tokens.device)
        weight = self.target.output_weight[vocab]
        drafted = []
        for first, start, cache in blocks:
            hidden = self.head.draft_block(first, start, cache.view(self.first_layer),
                                           self.target.embed_tokens, self.target.rope)
            index = confidence_head(self.target.head_input(hidden[1:]), weight)[0]
            drafted.append(vocab[index].tolist())
        return drafted


class ModelRunner:
    """activations: "int8" runs the fused pass's integer kernels (kernel: which variant), and
    makes the torch pass quantize its activations the same way (its reference); "fp32" neither."""

    def __init__(self, model: Transformer, backend: str, packed: dict | None = None,
                 draft_vocab: list[int] | None = None, activations: str = "auto", kernel: str = "auto",
                 draft_head=None, head_blocks: dict | None = None):
        from dllm_engine.models.fused_cpu import FusedCpuModel, FusedDraftHead, mirror_int8_activations

        self.backend = backend
        self.activations = resolve_activations(activations, backend)
        self.tap_layers = list(draft_head.spec.taps) if draft_head is not None else []
        self.drafter: DraftStep | None = None
        self.pass_: ForwardPass
        if backend == "fused":
            self.pass_ = FusedCpuModel(model, packed, draft_vocab, self.activations, kernel)
            self.kernel = self.pass_.kernel
            if draft_head is not None:
                self.drafter = FusedDraftHead(draft_head, model, packed or {}, head_blocks or {}, draft_vocab,
                                              self.activations, kernel)
        else:
            mirror_int8_activations(model, packed, on=self.activations == "int8")
            self.pass_ = TorchPass(model, draft_vocab)
            self.kernel = "torch"
            if draft_head is not None:
                self.drafter = TorchDraftHead(draft_head, model, draft_vocab)

    def run(self, plans: list[StepPlan], sampling: list[tuple[float, torch.Generator | None]],
            drafts_only: list[bool] | None = None,
            scored: list[tuple[int, ...]] | None = None) -> tuple[list[int], Tensor, list[list[float] | None]]:
        """One pass over every plan's segments; a token and its confidence for every target, in
        plan order. sampling[i] is plan i's (temperature, generator): 0 is greedy. drafts_only[i]:
        plan i commits its free targets never unchecked (exact decoding), so their rows need only
        the draft vocabulary. scored[i]: token ids whose probabilities at plan i's first target
        are returned (the third value, None for plans that ask for none)."""
        segments, rows = pack(plans)
        tap_rows = packed_tap_rows(plans)
        with torch.inference_mode():
            if tap_rows:
                hidden, taps = self.pass_.forward_with_taps(segments, rows, self.tap_layers, tap_rows)
                offset = 0
                for plan in plans:
                    plan.taps = taps[offset:offset + len(plan.tap_rows)] if plan.tap_rows else None
                    offset += len(plan.tap_rows)
            else:
                hidden = self.pass_.forward(segments, rows)
            tokens, confidence = self.pass_.greedy(hidden, draft_rows(plans, drafts_only or [False] * len(plans)))
            offset, probs = 0, []
            for plan, (temperature, generator), wanted in zip(plans, sampling, scored or [()] * len(plans)):
                count = len(plan.targets)
                if temperature > 0:
                    logits = self.pass_.logits(hidden[offset:offset + count])
                    tokens[offset:offset + count], confidence[offset:offset + count] = \
                        pick_tokens(logits, temperature, generator, next_token_positions(plan))
                probs.append(None)
                if wanted and count:
                    distribution = torch.softmax(self.pass_.logits(hidden[offset:offset + 1]).float(), -1)[0]
                    probs[-1] = distribution[list(wanted)].tolist()
                offset += count
        return tokens.tolist(), confidence, probs  # one host read for the batch (a device sync on a GPU)

    def draft(self, requests: list[tuple[list[tuple[Tensor, int]], BlockTable, int | None, int | None]]
              ) -> list[list[int] | None]:
        """The draft head's step for requests (their new contexts as (features, first position),
        the request's cache, the exact token a block starts with and its position, or None):
        every context into its cache, then every block in one pass; each request's drafts (None
        where no block was asked for)."""
        with torch.inference_mode():
            runs = [(features, start, cache) for contexts, cache, _, _ in requests for features, start in contexts]
            if runs:
                self.drafter.write_context(runs)
            blocks = [(first, position, cache) for _, cache, first, position in requests if first is not None]
            drafted = iter(self.drafter.draft(blocks) if blocks else [])
            return [next(drafted) if first is not None else None for _, _, first, _ in requests]


def next_token_positions(plan: StepPlan) -> list[int | None]:
    """Per target, the position whose next token it predicts where it is an exact causal
    prediction (the AR token, a draft's check), else None (a masked block's row)."""
    return [plan.segments[t.segment].start + t.row if t.forced or t.given is not None else None
            for t in plan.targets]


def draft_rows(plans: list[StepPlan], drafts_only: list[bool]) -> list[int]:
    """The targets (in pass order) that only draft: free targets of exactly decoded plans."""
    rows, offset = [], 0
    for plan, only in zip(plans, drafts_only):
        if only:
            rows.extend(offset + i for i, t in enumerate(plan.targets) if not t.forced and t.given is None)
        offset += len(plan.targets)
    return rows


def packed_tap_rows(plans: list[StepPlan]) -> list[int]:
    """Every plan's tap rows, as rows of the packed pass."""
    rows, packed = [], 0
    for plan in plans:
        rows.extend(packed + r for r in plan.tap_rows)
        packed += sum(s.tokens.numel() for s in plan.segments)
    return rows


def pack(plans: list[StepPlan]) -> tuple[list[Segment], list[int]]:
    """Every plan's segments in order, and the packed row of every target."""
    segments, rows, starts = [], [], []
    packed = 0
    for plan in plans:
        starts.clear()
        for segment in plan.segments:
            starts.append(packed)
            packed += segment.tokens.numel()
        segments.extend(plan.segments)
        rows.extend(starts[t.segment] + t.row for t in plan.targets)
    return segments, rows
