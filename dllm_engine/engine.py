"""Engine: load a model once, take requests from any thread, run them all on one scheduler
thread that packs every live request's next step into one shared forward pass.

All of the engine's torch work (loading, cache allocation, forward passes) runs off the
caller's thread: torch's CPU ops parallelise with OpenMP (libgomp), which keeps a worker pool
per thread that ever ran a parallel region. Once the caller's pool and the scheduler's pool
both exist there are more workers than cores, libgomp stops spin-waiting, and every parallel
region pays a futex wake-up: the scheduler's forward passes measured ~1.6x slower that way.

    engine = Engine.load("smollm2-135m-bd")
    handle = engine.submit([{"role": "user", "content": "Hi"}], GenerationParams())
    print(handle.result().committed_text)
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from dllm_engine.decoding import (
    BlockCausalDecoder, DeadlineController, FullAttentionDecoder, StepPlan, make_policy, pick_tokens,
)
from dllm_engine.decoding.batch_commit import Choice, choose_commits
from dllm_engine.loading import DEFAULT_MODEL, LoadedModel, load_model
from dllm_engine.models.families import FAMILIES
from dllm_engine.models.transformer import KVCache
from dllm_engine.prefix_cache import PrefixStore
from dllm_engine.request import (
    DraftUpdate, EngineError, EngineOverloaded, GenerationParams, RequestHandle, RequestStats,
)
from kernels import confidence_head

log = logging.getLogger(__name__)

BACKGROUND_EVERY = 4  # while foreground requests are live, background ones join one pass in this many
_NO_MASK = -1  # placeholder for models without a mask token: only ever used in AR mode, never fed


@dataclass
class LiveRequest:
    handle: RequestHandle
    params: GenerationParams
    decoder: BlockCausalDecoder | FullAttentionDecoder
    policy: object
    threshold: float
    submitted: float
    deadline: DeadlineController | None
    generator: torch.Generator | None
    stats: RequestStats = field(default_factory=RequestStats)
    committed_in_denoise: int = 0


@dataclass
class PendingStep:
    """A request between its step's predictions and its commits (see `Engine._step`)."""

    request: LiveRequest
    plan: StepPlan
    tokens: list[int]
    free: list[int]
    exact: int  # commits already made: forced AR tokens and verified drafts
    choice: Choice | None = None  # None: nothing left for the policy to decide


class Engine:
    def __init__(self, loaded: LoadedModel, max_live_requests: int = 32, max_cached_tokens: int = 131072,
                 clock: Callable[[], float] = time.monotonic, cache_dtype: torch.dtype | None = None,
                 prefix_cache_entries: int = 16):
        self.loaded = loaded
        self.model = loaded.model
        self.config = loaded.config
        self.tokenizer = loaded.tokenizer
        self.max_live_requests = max_live_requests
        self.max_cached_tokens = max_cached_tokens
        self.clock = clock
        self.cache_dtype = cache_dtype or self.model.embed_tokens.dtype
        self.device = self.model.embed_tokens.device
        self._ids = itertools.count(1)
        self._lock = threading.Condition()
        self._incoming: list[LiveRequest] = []
        self._live: list[LiveRequest] = []
        self._closing = False
        self.forward_passes = 0
        # copies of ended requests' written cache slots, for prompts that start the same
        # (at most 16384 tokens, held beyond max_cached_tokens)
        self._prefixes = PrefixStore(prefix_cache_entries)
        self._thread = threading.Thread(target=self._run, name="dllm-scheduler", daemon=True)
        self._thread.start()

    @classmethod
    def load(cls, name_or_path: str = DEFAULT_MODEL, dtype: torch.dtype | str = "auto", download: bool = False,
             device: torch.device | str = "auto", **kwargs) -> "Engine":
        device = resolve_device(device)
        dtype = resolve_dtype(dtype, device)

        def load() -> LoadedModel:
            loaded = load_model(name_or_path, dtype=dtype, download=download)
            loaded.model.to(device)
            return loaded

        # on a short-lived thread, whose OpenMP pool dies with it (see the module docstring)
        return cls(_on_fresh_thread(load), **kwargs)

    # ---- public API ------------------------------------------------------------------------
    @property
    def model_name(self) -> str:
        return self.loaded.name

    @property
    def max_context_tokens(self) -> int:
        return self.config.max_position_embeddings

    @property
    def live_requests(self) -> int:
        with self._lock:
            return len(self._live) + len(self._incoming)

    def count_tokens(self, messages: list[dict]) -> int:
        return len(self.prompt_ids(messages, raw=False))

    def prompt_ids(self, prompt: str | list[dict], raw: bool) -> list[int]:
        if isinstance(prompt, str):
            if raw:
                return self.tokenizer.encode(prompt)
            prompt = [{"role": "user", "content": prompt}]
        try:
            return self.tokenizer.encode(self.tokenizer.render_chat(prompt))
        except ValueError as exc:
            raise EngineError(str(exc)) from exc

    def submit(self, prompt: str | list[dict], params: GenerationParams | None = None) -> RequestHandle:
        params = params or GenerationParams()
        params.validate()
        ids = self.prompt_ids(prompt, params.raw)
        if not ids:
            raise EngineError("the prompt is empty")
        request = self._make_request(ids, params)
        with self._lock:
            if self._closing:
                raise EngineError("the engine is closed")
            live = self._live + self._incoming
            if len(live) >= self.max_live_requests:
                raise EngineOverloaded(f"{len(live)} live requests: the engine's limit is {self.max_live_requests}")
            cached = sum(r.decoder.cache.max_len for r in live) + request.decoder.cache.max_len
            if cached > self.max_cached_tokens:
                raise EngineOverloaded(f"{cached} cached tokens would exceed the limit of {self.max_cached_tokens}")
            self._incoming.append(request)
            self._lock.notify()
        return request.handle

    def generate(self, prompt: str | list[dict], params: GenerationParams | None = None) -> DraftUpdate:
        return self.submit(prompt, params).result()

    def close(self) -> None:
        with self._lock:
            self._closing = True
            self._lock.notify()
        self._thread.join(timeout=10)

    # ---- request setup ---------------------------------------------------------------------
    def _make_request(self, ids: list[int], params: GenerationParams) -> LiveRequest:
        config = self.config
        diffusion = params.mode == "diffusion"
        if diffusion and not config.is_diffusion:
            raise EngineError(f"model {self.model_name} is autoregressive ({config.family}); use mode='autoregressive'")
        block = (params.block_size or config.block_size) if diffusion else 1
        total = len(ids) + params.max_new_tokens + block + 1
        if total > config.max_position_embeddings:
            raise EngineError(f"prompt ({len(ids)} tokens) + max_new_tokens ({params.max_new_tokens}) exceeds the "
                              f"model's context of {config.max_position_embeddings} tokens")
        cache = KVCache(config, total, self.cache_dtype, self.device, allocate=False)  # on the scheduler
        family = FAMILIES.get(config.family)
        common = dict(prompt_ids=ids, cache=cache, block_size=block, max_new_tokens=params.max_new_tokens,
                      mask_id=config.mask_token_id if config.mask_token_id is not None else _NO_MASK,
                      eos_ids=set(config.eos_token_ids), shift=config.logits_shift, stop_at_eos=params.stop_at_eos)
        if config.attention == "bidirectional" and diffusion:
            decoder = FullAttentionDecoder(**common)
        else:
            decoder = BlockCausalDecoder(
                **common, adapter=diffusion and self.model.has_adapter,
                bidirectional_clean_blocks=bool(family and family.bidirectional_clean_blocks) and diffusion,
                verify_drafts=params.verify_drafts if diffusion else 0)
        threshold = params.threshold if params.threshold is not None else config.default_threshold
        fallback = params.fallback or (family.commit_fallback if family else "most_confident")
        now = self.clock()
        generator = None
        if params.temperature > 0:
            generator = torch.Generator().manual_seed(params.seed if params.seed is not None else int(now * 1e6))
        deadline = DeadlineController(params.deadline_s, threshold, self.clock) if params.deadline_s else None
        return LiveRequest(
            handle=RequestHandle(next(self._ids), background=params.background), params=params, decoder=decoder,
            policy=make_policy(params.policy, threshold, params.factor, params.steps_per_block, block, fallback),
            threshold=threshold, submitted=now, deadline=deadline, generator=generator,
            stats=RequestStats(prompt_tokens=len(ids)),
        )

    # ---- scheduler -------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._live and not self._incoming and not self._closing:
                    self._lock.wait()
                if self._closing:
                    for request in self._live + self._incoming:
                        self._finish(request, "cancelled")
                    self._live, self._incoming = [], []
                    self._prefixes.clear()
                    return
                for request in self._incoming:
                    self._admit(request)
                self._incoming.clear()
                for request in [r for r in self._live if r.handle.cancelled]:
                    self._finish(request, "cancelled")
                batch = self._choose_batch()
            if batch:
                self._step(batch)

    def _choose_batch(self) -> list[LiveRequest]:
        """Every live request, except that background ones (speculative drafts) sit out while a
        foreground one is live, but for every BACKGROUND_EVERY-th pass: on a CPU each row costs
        about the same, so a draft that may be thrown away must not slow a reply being heard."""
        foreground = [r for r in self._live if not r.handle.background]
        if foreground and self.forward_passes % BACKGROUND_EVERY:
            return foreground
        return list(self._live)

    def _admit(self, request: LiveRequest) -> None:
        """Move a submitted request into the live batch, its cache allocated on this thread."""
        try:
            request.decoder.cache.allocate()
        except (RuntimeError, MemoryError) as exc:  # torch reports allocation failure as RuntimeError
            self._finish(request, "error", error=f"could not allocate the KV cache: {exc}")
            return
        decoder = request.decoder
        if decoder.reusable_cache:
            reused = self._prefixes.take(decoder.prompt_ids, decoder.cache, len(decoder.prompt_ids) - 1)
            if reused:
                decoder.reuse_prefix(reused)
                request.stats.cached_prompt_tokens = reused
        self._live.append(request)

    def _step(self, batch: list[LiveRequest]) -> None:
        plans = [request.decoder.plan() for request in batch]
        try:
            tokens, confidence = self._forward(batch, plans)
        except Exception as exc:  # a failed pass ends the requests in it, never the scheduler
            log.exception("forward pass failed")
            for request in batch:
                self._finish(request, "error", error=f"{type(exc).__name__}: {exc}")
            return
        self.forward_passes += 1
        token_ids = tokens.tolist()  # one host read for the batch (a device sync on a GPU)
        steps = []
        offset = 0
        for request, plan in zip(batch, plans):
            rows = slice(offset, offset + len(plan.targets))
            offset = rows.stop
            step = self._guarded(request, self._take_predictions, request, plan, token_ids[rows], confidence[rows])
            if step is not None:
                steps.append(step)
        try:
            chosen = choose_commits([step.choice for step in steps if step.choice is not None])
        except Exception as exc:
            log.exception("commit selection failed")
            for step in steps:
                self._finish(step.request, "error", error=f"{type(exc).__name__}: {exc}")
            return
        picks = iter(chosen)
        for step in steps:
            self._guarded(step.request, self._commit, step, next(picks) if step.choice is not None else [])

    def _guarded(self, request: LiveRequest, function: Callable, *args):
        """function(*args), ending only this request if its bookkeeping fails."""
        try:
            return function(*args)
        except Exception as exc:
            log.exception("request %d failed", request.handle.request_id)
            self._finish(request, "error", error=f"{type(exc).__name__}: {exc}")
            return None

    def _forward(self, batch: list[LiveRequest], plans: list[StepPlan]):
        segments, rows, starts = [], [], []
        packed = 0
        for plan in plans:
            starts.clear()
            for segment in plan.segments:
                starts.append(packed)
                packed += segment.tokens.numel()
            segments.extend(plan.segments)
            rows.extend(starts[t.segment] + t.row for t in plan.targets)
        with torch.inference_mode():
            hidden = self.model.forward_segments(segments)
            predicting = hidden[torch.tensor(rows, dtype=torch.long, device=hidden.device)]
            # greedy: argmax and its probability straight from the head, no [rows, vocab] softmax kept
            tokens, confidence, _ = confidence_head(predicting, self.model.output_weight)
            offset = 0
            for request, plan in zip(batch, plans):
                count = len(plan.targets)
                if request.params.temperature > 0:
                    logits = self.model.logits(predicting[offset:offset + count])
                    picked = pick_tokens(logits, request.params.temperature, request.generator)
                    tokens[offset:offset + count], confidence[offset:offset + count] = picked
                offset += count
        return tokens, confidence

    def _take_predictions(self, request: LiveRequest, plan: StepPlan, tokens: list[int],
                          confidence: torch.Tensor) -> PendingStep:
        decoder, stats = request.decoder, request.stats
        free, exact = decoder.take_predictions(plan, tokens)
        step = PendingStep(request, plan, tokens, free, exact)
        if request.deadline is not None:
            request.deadline.record_step()
        if decoder.wants_choice(free, exact):
            threshold = None
            if request.deadline is not None:
                pace = request.committed_in_denoise / max(1, stats.denoise_steps)
                threshold = request.deadline.threshold(decoder.tokens_left(), pace if stats.denoise_steps else 2.0)
            step.choice = Choice(request.policy, confidence[free], threshold, decoder.steps_left(request.policy),
                                 at_least_one=exact == 0)
        return step

    def _commit(self, step: PendingStep, chosen: list[bool]) -> None:
        request = step.request
        decoder, stats = request.decoder, request.stats
        committed = step.exact + decoder.commit_chosen(step.plan, step.tokens, step.free, chosen)
        stats.forward_passes += 1
        stats.denoise_steps += 1
        request.committed_in_denoise += committed
        if stats.first_token_s is None and decoder.settled_ids():
            stats.first_token_s = self.clock() - request.submitted
        if decoder.finished:
            self._finish(request, decoder.finish_reason)
        else:
            self._publish(request, final=False)

    def _finish(self, request: LiveRequest, reason: str, error: str | None = None) -> None:
        if request in self._live:
            self._live.remove(request)
        decoder = request.decoder
        if reason != "error" and decoder.reusable_cache:
            self._prefixes.offer(decoder.cached_token_ids(), decoder.cache)
        decoder.cache = None  # free the KV cache now, not when the handle dies (the store copied its head)
        if request.deadline is not None:
            request.stats.deadline_met = request.deadline.met()
        self._publish(request, final=True, reason=reason, error=error)

    def _publish(self, request: LiveRequest, final: bool, reason: str | None = None, error: str | None = None) -> None:
        decoder, stats = request.decoder, request.stats
        settled = decoder.settled_ids()
        stats.new_tokens = len(settled)
        stats.elapsed_s = self.clock() - request.submitted
        request.handle._publish(DraftUpdate(
            request_id=request.handle.request_id,
            committed_text=self.tokenizer.decode(settled),
            draft_text=self.tokenizer.decode(decoder.draft_ids()),
            token_ids=settled, step=stats.denoise_steps, final=final, finish_reason=reason,
            stats=RequestStats(**vars(stats)), error=error,
        ))


DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


def resolve_device(device: torch.device | str) -> torch.device:
    """"auto" is the first CUDA device when there is one, else the CPU."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(device)
    except RuntimeError as exc:
        raise EngineError(f"unknown device {device!r}: {exc}") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise EngineError(f"device {str(device)!r} is not available: this torch sees no CUDA device")
    if device.type not in ("cpu", "cuda"):
        raise EngineError(f"device {str(device)!r} is not supported: use cpu or cuda")
    return device


def resolve_dtype(dtype: torch.dtype | str, device: torch.device = torch.device("cpu")) -> torch.dtype:
    """A dtype or its name; "auto" is bfloat16 where matmuls run natively in it (CUDA, or a CPU
    with avx512_bf16 / AMX: 1.7-2x faster than float32 here, measured with `dllm bench`), else
    float32 (emulated bf16 is slower than float32)."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" or _cpu_has_native_bf16() else torch.float32
    if dtype not in DTYPES:
        raise EngineError(f"unknown dtype {dtype!r}; known: auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]


def _cpu_has_native_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:  # not Linux: no cheap way to ask, so the safe choice
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def _on_fresh_thread(function: Callable, *args, **kwargs):
    """function(*args, **kwargs) on a new thread that ends with it; returns or raises its outcome."""
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["value"] = function(*args, **kwargs)
        except BaseException as exc:  # handed to the caller below
            outcome["error"] = exc

    thread = threading.Thread(target=run, name="dllm-load")
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
