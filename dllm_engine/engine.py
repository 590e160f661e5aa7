"""Engine: load a model once, take requests from any thread, run them all on one scheduler
thread that packs every live request's next step into one shared forward pass.

Three rooms, as in nano-vllm: the engine (this file: the public API and the scheduler
thread), the scheduler (scheduler.py: admission, batch choice, commits, finishing) and the
model runner (runner.py: packing, the forward pass, the output head, sampling). One step is
`scheduler.schedule()` -> `runner.run()` -> `scheduler.postprocess()`.

All of the engine's torch work (loading, forward passes) runs off the
caller's thread: torch's CPU ops parallelise with OpenMP (libgomp), which keeps a worker pool
per thread that ever ran a parallel region. Once the caller's pool and the scheduler's pool
both exist there are more workers than cores, libgomp stops spin-waiting, and every parallel
region pays a futex wake-up: the scheduler's forward passes measured ~1.6x slower that way.

    engine = Engine.load("smollm2-135m-bd")
    handle = engine.submit([{"role": "user", "content": "Hi"}], GenerationParams())
    print(handle.result().committed_text)
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import threading
import time
from typing import Callable

import torch

from dllm_engine import calibration, chat_prompts
from dllm_engine.decoding import DraftHeadDecoder
from dllm_engine.decoding.factory import make_decoder
from dllm_engine.decoding.suffix_drafts import DraftChooser, RecentReplies
from dllm_engine.loading import DEFAULT_MODEL, LoadedModel, load_model
from dllm_engine.models.kv_pool import KVPool, PoolFull
from dllm_engine.request import DraftUpdate, EngineError, EngineOverloaded, GenerationParams, Mode, RequestHandle
from dllm_engine.resolve import resolve_activations, resolve_device, resolve_dtype, resolve_kv_cache, resolve_pass
from dllm_engine.runner import ModelRunner
from dllm_engine.scheduler import BACKGROUND_EVERY, LiveRequest, Scheduler

log = logging.getLogger(__name__)

__all__ = ["BACKGROUND_EVERY", "Engine"]

# prompt tokens a request prefills in one pass: a longer prompt takes several passes, so the
# replies batched with it wait for one chunk, not the whole prefill. 64 measured best on two
# cores (docs/benchmarks.md, "Chunked prefill"): larger chunks stall the batch longer and, their
# attention rows costing more, do not even prefill faster
PREFILL_CHUNK = 64


class Engine:
    def __init__(self, loaded: LoadedModel, max_live_requests: int = 32, max_cached_tokens: int = 131072,
                 clock: Callable[[], float] = time.monotonic, kv_cache: str = "auto",
                 share_prefixes: bool = True, backend: str = "auto", activations: str = "auto",
                 kernel: str = "auto", prefill_chunk: int = PREFILL_CHUNK, continuations: bool = True,
                 recent_replies: int = 64):
        self.loaded = loaded
        self.model = loaded.model
        self.config = loaded.config
        self.tokenizer = loaded.tokenizer
        self.max_live_requests = max_live_requests
        self.max_cached_tokens = max_cached_tokens
        self.clock = clock
        self.device = self.model.embed_tokens.device
        self.backend = resolve_pass(backend, self.device)
        self.activations = resolve_activations(activations, self.backend)
        self.kernel = kernel  # the integer kernel variant asked for; the runner says which runs
        self.prefill_chunk = prefill_chunk
        # with a draft head: where a continuation of text the target wrote before (the request's
        # own, the reply corpus's, the last `recent_replies` replies') promises more than the
        # head's block, the verify pass checks it instead (decoding/suffix_drafts.py)
        self.draft_chooser: DraftChooser | None = None
        if loaded.draft_head is not None and continuations:
            kept = (loaded.draft_head_meta.get("held_out") or {}).get("by_offset") or []
            self.draft_chooser = DraftChooser(loaded.reply_corpus, list(kept), recent=RecentReplies(recent_replies))
        self.cache_dtype = resolve_kv_cache(kv_cache, self.backend, self.activations, self.model.embed_tokens.dtype)
        # every request's keys and values: max_cached_tokens positions in blocks (kv_pool.py)
        head = loaded.draft_head
        self.kv_pool = KVPool.for_tokens(self.config, max_cached_tokens, self.cache_dtype, self.device,
                                         extra_layers=head.cache_layers if head is not None else 0)
        # what mode="auto" runs: diffusion where the model has it, until choose_mode measures
        self.auto_mode: Mode = "diffusion" if self.config.is_diffusion else "autoregressive"
        self._ids = itertools.count(1)
        self._lock = threading.Condition()
        self._incoming: list[LiveRequest] = []
        self._admitting: list[LiveRequest] = []  # taken from _incoming, not yet live
        self._calls: list[Callable[[], None]] = []  # work for the scheduler thread between steps
        self._closing = False
        self._failure: str | None = None  # why the scheduler thread died, if it did
        self.last_step_at: float | None = None
        self.scheduler = Scheduler(self.tokenizer.decode, clock, share_prefixes, on_greedy_reply=self._keep_reply)
        self._runner: ModelRunner | None = None
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dllm-scheduler", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._failure:
            raise EngineError(self._failure)

    @classmethod
    def load(cls, name_or_path: str = DEFAULT_MODEL, dtype: torch.dtype | str = "auto", download: bool = False,
             device: torch.device | str = "auto", backend: str = "auto", **kwargs) -> "Engine":
        device = resolve_device(device)
        backend = resolve_pass(backend, device)
        # the fused pass reads fp32 norms and adapters (its matmuls read the checkpoint's blocks)
        dtype = torch.float32 if backend == "fused" else resolve_dtype(dtype, device)

        def load() -> LoadedModel:
            loaded = load_model(name_or_path, dtype=dtype, download=download)
            loaded.model.to(device)
            return loaded

        # on a short-lived thread, whose OpenMP pool dies with it (see the module docstring)
        return cls(_on_fresh_thread(load), backend=backend, **kwargs)

    # ---- public API ------------------------------------------------------------------------
    @property
    def model_name(self) -> str:
        return self.loaded.name

    @property
    def max_context_tokens(self) -> int:
        return self.config.max_position_embeddings

    @property
    def takes_threshold(self) -> bool:
        """Whether GenerationParams.threshold changes this model's decoding: not where a draft
        head drafts and the target verifies (exact by construction), nor for an AR model."""
        return self.config.is_diffusion and self.loaded.draft_head is None

    @property
    def forward_passes(self) -> int:
        return self.scheduler.passes

    @property
    def live_requests(self) -> int:
        with self._lock:
            return len(self._pending()) + len(self.scheduler.live)

    @property
    def kv_cache_bytes(self) -> int:
        """Bytes of the KV pool's blocks in use: listed by live requests, or cached for later prompts."""
        stats = self.kv_pool.stats()
        return (stats["held"] + stats["idle"]) * stats["block_bytes"]

    def kv_stats(self) -> dict[str, int]:
        """The KV pool's blocks (KVPool.stats)."""
        return self.kv_pool.stats()

    @property
    def alive(self) -> bool:
        """Whether the scheduler thread is running (False once closed or after a fatal error)."""
        return self._thread.is_alive() and self._failure is None

    @property
    def drafts_description(self) -> str | None:
        """What diffusion mode drafts with: the head's block, and continuations where they pay."""
        if self.loaded.draft_head is None:
            return None
        head = f"draft head, block {self.config.block_size}"
        if self.draft_chooser is None:
            return head
        corpus = self.loaded.reply_corpus
        source = f"{len(corpus):,}-token reply corpus" if corpus is not None else "the request's own tokens"
        return f"{head}; continuations of earlier text (up to {self.draft_chooser.max_drafts} tokens, {source})"

    def health(self) -> dict:
        """For /healthz: the scheduler's liveness and when it last finished a step."""
        age = None if self.last_step_at is None else round(self.clock() - self.last_step_at, 3)
        return {"alive": self.alive, "failure": self._failure, "backend": self.backend,
                "activations": self.activations, "kernel": self.kernel,
                "kv_cache": str(self.cache_dtype).removeprefix("torch."), "auto_mode": self.auto_mode,
                "drafts": self.drafts_description,
                "live_requests": self.live_requests, "forward_passes": self.forward_passes,
                "seconds_since_last_step": age}

    def count_tokens(self, messages: list[dict]) -> int:
        return len(self.prompt_ids(messages, raw=False))

    def end_of_turn_probability(self, messages: list[dict], background: bool = True) -> RequestHandle:
        """How likely the model thinks the last (user) message is finished: the probability of the
        chat template's end-of-turn token right after its text, from one pass over a prompt whose
        head a recent request of the same conversation usually has in the prefix cache. The
        handle's final update carries it as token_probs[0]."""
        prefix, eot = self.end_of_turn_prompt(messages)
        return self.submit(prefix, GenerationParams(mode="autoregressive", max_new_tokens=1, stop_at_eos=False,
                                                     score_tokens=(eot,), background=background))

    def prefill_head(self, messages: list[dict], mode: str = "auto", background: bool = False) -> RequestHandle:
        """Writes a conversation's head (its prompt up to the end of the last message's text)
        into the KV pool, as a request in `mode` (the mode of the requests that will share it: a
        draft head's requests list only blocks that carry the head's layers). Its blocks are
        published as its chunks go, so a later prompt that starts with the head lists them even
        if it is cancelled part way."""
        prefix, _ = self.end_of_turn_prompt(messages)
        # two tokens: a draft head writes its layers for a pass's rows in the step after that pass
        return self.submit(prefix, GenerationParams(mode=mode, max_new_tokens=2, stop_at_eos=False,
                                                     background=background))

    def end_of_turn_prompt(self, messages: list[dict]) -> tuple[list[int], int]:
        """(prompt ids up to the end of the last message's text, the end-of-turn token after it)."""
        return chat_prompts.end_of_turn_prompt(self.tokenizer, messages)

    def prompt_ids(self, prompt: str | list[dict] | list[int], raw: bool) -> list[int]:
        return chat_prompts.prompt_ids(self.tokenizer, self.config.vocab_size, prompt, raw)

    def submit(self, prompt: str | list[dict] | list[int], params: GenerationParams | None = None) -> RequestHandle:
        """prompt: a user message, a conversation (rendered with the chat template), or token ids."""
        params = params or GenerationParams()
        params.validate()
        if params.mode == "auto":
            params = dataclasses.replace(params, mode=self.auto_mode)
        ids = self.prompt_ids(prompt, params.raw)
        if not ids:
            raise EngineError("the prompt is empty")
        try:
            request = self._make_request(ids, params)  # reserves the blocks of its longest reply
        except PoolFull as exc:
            raise EngineOverloaded(str(exc)) from exc
        try:
            with self._lock:
                if self._failure:
                    raise EngineError(f"the engine failed and takes no requests: {self._failure}")
                if self._closing:
                    raise EngineError("the engine is closed")
                live = len(self._pending()) + len(self.scheduler.live)
                if live >= self.max_live_requests:
                    raise EngineOverloaded(f"{live} live requests: the engine's limit is {self.max_live_requests}")
                self._incoming.append(request)
                self._lock.notify()
        except EngineError:
            request.decoder.cache.release()
            raise
        return request.handle

    def generate(self, prompt: str | list[dict], params: GenerationParams | None = None) -> DraftUpdate:
        return self.submit(prompt, params).result()

    def choose_mode(self, params: GenerationParams | None = None, new_tokens: int = 32,
                    rounds: int = 3) -> dict[str, float]:
        """Times greedy replies in each mode on this machine (with `params`' other settings)
        and makes the faster one what mode="auto" runs; returns tokens/s per mode. Exact
        diffusion gives the AR reply's words, so only speed decides: several tokens a pass win
        where a pass over a block costs not much more than a one-token pass, and lose where the
        cost grows with the rows (docs/benchmarks.md has the curves per machine). Call it on an
        idle engine."""
        if not self.config.is_diffusion:
            return {}
        self.choose_block()  # a draft head's block first: it decides what diffusion's speed is
        template = dataclasses.replace(params or GenerationParams(), stop_at_eos=False, background=False)
        speeds = calibration.reply_speeds(self, template, new_tokens, rounds)
        self.auto_mode = max(speeds, key=lambda mode: speeds[mode])
        log.info("mode='auto' runs %s on this machine (%s)", self.auto_mode,
                 ", ".join(f"{mode} {rate:.1f} tokens/s" for mode, rate in speeds.items()))
        return speeds

    def choose_block(self, context: int = 128, repeats: int = 5) -> dict | None:
        """For a model with a draft head: times the verify pass over the exact token and k
        drafts for every k a step can check, and the head's step, then makes diffusion mode
        draft the head's k with the most tokens a second, by the head's held-out acceptance by
        offset (its metadata): rows cost more on some machines than on others. The continuation
        drafts' chooser takes the same timings, and those of larger passes (a batch's requests
        share one pass, and the head drafts for them in one). Call it on an idle engine.
        Returns the table, or None without a draft head."""
        head = self.loaded.draft_head
        kept = (self.loaded.draft_head_meta.get("held_out") or {}).get("by_offset")
        if head is None or not kept:
            return None
        most = max(head.spec.block_size - 1, self.draft_chooser.max_drafts if self.draft_chooser else 0)
        shapes, batches = calibration.timed_shapes(most + 1, batched=self.draft_chooser is not None)
        times = self._on_scheduler(lambda: calibration.draft_step_seconds(self, shapes, batches, context, repeats))
        steps = [v + times.context + times.blocks[0] for v in times.verify[1:head.spec.block_size]]
        table = calibration.block_table(steps, kept)
        best = max(table, key=lambda row: row["tokens_per_s"])
        self.config.block_size = best["block"]
        if self.draft_chooser is not None:
            self.draft_chooser.costs = times.costs(shapes, batches)
        log.info("diffusion drafts blocks of %d on this machine (%s)", best["block"],
                 ", ".join(f"{r['block']}: {r['tokens_per_s']} tokens/s" for r in table))
        return {"chosen": best["block"], "blocks": table, **times.report(shapes, batches)}

    def _on_scheduler(self, function):
        """function() between two steps of the scheduler thread (the runner is that thread's)."""
        done = threading.Event()
        outcome: dict = {}

        def run() -> None:
            try:
                outcome["value"] = function()
            except BaseException as exc:  # handed to the caller
                outcome["error"] = exc
            done.set()

        with self._lock:
            self._calls.append(run)
            self._lock.notify()
        done.wait()
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]

    def close(self) -> None:
        with self._lock:
            self._closing = True
            self._lock.notify()
        self._thread.join(timeout=10)

    @contextlib.contextmanager
    def head_drafts_only(self):
        """Requests made inside draft with the head alone, no continuations (benches compare the
        two side by side); call it on an idle engine."""
        chooser, self.draft_chooser = self.draft_chooser, None
        try:
            yield
        finally:
            self.draft_chooser = chooser

    def _keep_reply(self, prompt_ids: list[int], reply_ids: list[int]) -> None:
        """An ended greedy reply, for continuation drafts of later requests."""
        if self.draft_chooser is not None:
            self.draft_chooser.recent.add(prompt_ids, reply_ids)

    # ---- request setup ---------------------------------------------------------------------
    def _make_request(self, ids: list[int], params: GenerationParams) -> LiveRequest:
        decoder = make_decoder(self.loaded, ids, params, self.kv_pool, self.draft_chooser)
        try:
            decoder.prefill_chunk = self.prefill_chunk
            return LiveRequest.around(decoder, self.config, params, next(self._ids), self.clock)
        except BaseException:  # e.g. a policy the parameters name wrongly: its blocks are not kept
            decoder.cache.release()
            raise

    # ---- the scheduler thread --------------------------------------------------------------
    def _pending(self) -> list[LiveRequest]:
        return self._incoming + self._admitting

    def _run(self) -> None:
        try:
            self._runner = ModelRunner(self.model, self.backend, self.loaded.packed, self.loaded.draft_vocab,
                                       self.activations, self.kernel, self.loaded.draft_head,
                                       self.loaded.draft_head_blocks)
            self.kernel = self._runner.kernel
        except Exception as exc:  # e.g. the CPU kernels' weights disagree with the model
            log.exception("could not set up the model runner")
            self._failure = f"{type(exc).__name__}: {exc}"
        self._ready.set()
        if self._failure:
            return
        try:
            while self._loop_once():
                pass
        except BaseException as exc:  # never die silently: every waiting handle hears why
            log.exception("the engine's scheduler failed")
            with self._lock:
                self._failure = f"{type(exc).__name__}: {exc}"
                pending, self._incoming, self._admitting = self._pending(), [], []
            self.scheduler.close(pending, reason="error", error=f"the engine failed: {self._failure}")

    def _loop_once(self) -> bool:
        """One round: take new requests, drop cancelled ones, run one step; False once closed."""
        with self._lock:
            while not self.scheduler.live and not self._incoming and not self._closing and not self._calls:
                self._lock.wait()
            calls, self._calls = self._calls, []
        for call in calls:  # e.g. choose_block's timing, on the thread that owns the runner
            call()
        with self._lock:
            if self._closing:
                pending, self._incoming = self._pending(), []
                self.scheduler.close(pending)
                return False
            self._admitting, self._incoming = self._incoming, []
        for request in self._admitting:  # shared prompt heads and their copies: outside the lock
            self.scheduler.admit(request)
        with self._lock:
            self._admitting = []
        self.scheduler.drop_cancelled()
        batch = self.scheduler.schedule()
        if batch:
            self._step(batch)
        return True

    def _step(self, batch: list[LiveRequest]) -> None:
        batch, plans = self.scheduler.plan(batch)
        if not batch:
            return
        try:
            tokens, confidence, probs = self._runner.run(
                plans, [r.sampling for r in batch],
                [r.decoder.drafts_only and r.params.temperature == 0 for r in batch],
                [r.params.score_tokens if r.token_probs is None else () for r in batch])
        except Exception as exc:  # a failed pass ends the requests in it, never the scheduler
            log.exception("forward pass failed")
            self.scheduler.fail(batch, exc)
            return
        for request, token_probs in zip(batch, probs):
            if token_probs is not None:
                request.token_probs = token_probs
        self.scheduler.postprocess(batch, plans, tokens, confidence)
        self._draft(batch)
        self.last_step_at = self.clock()

    def _draft(self, batch: list[LiveRequest]) -> None:
        """The draft head's step for the requests it drafts for, right after their target pass:
        the next pass checks what it drafts (DraftHeadDecoder), chosen for a pass the size of
        this one."""
        if self.draft_chooser is not None:
            self.draft_chooser.batch = max(1, len(batch))
        wanted = [(r, r.decoder.draft_request()) for r in batch
                  if isinstance(r.decoder, DraftHeadDecoder) and r in self.scheduler.live]
        wanted = [(r, ask) for r, ask in wanted if ask is not None]
        if not wanted:
            return
        try:
            drafts = self._runner.draft([(contexts, r.decoder.cache, first, position)
                                         for r, (contexts, first, position) in wanted])
        except Exception as exc:  # like a failed pass: the requests in it end, the scheduler goes on
            log.exception("draft head pass failed")
            self.scheduler.fail([r for r, _ in wanted], exc)
            return
        for (request, _), drafted in zip(wanted, drafts):
            if drafted is not None:
                request.decoder.take_drafts(drafted)


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
