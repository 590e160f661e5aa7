"""Training the draft head (dllm_engine/models/draft_head.py) on stored target features.

The target never runs here: its tapped features, final hidden states and greedy tokens were
stored once (draft_features.py), so a step is the head's own forward and backward over many
anchored blocks per sequence, cheap enough for two CPU cores. Time-boxed, resumable from the
run directory's checkpoint, with a progress bar; every few minutes the acceptance by offset on
held-out records is logged (docs/models.md plots it against training minutes).
"""

from __future__ import annotations

import json
import math
import random
import signal
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from dllm_engine.models.draft_head import DraftHead, draft_loss
from dllm_engine.training.draft_features import FeatureStore


@dataclass
class DraftTrainConfig:
    batch_size: int = 8
    anchors: int = 16  # blocks per sequence per step
    lr: float = 6e-4
    warmup_steps: int = 50
    min_lr_ratio: float = 0.1
    minutes: float = 80.0  # the run's total budget (a resumed run counts what it already spent)
    max_steps: int = 100_000
    offset_decay: float = 4.0
    kl_weight: float = 0.5
    eval_every_s: float = 300.0
    checkpoint_every: int = 100
    seed: int = 0
    bf16: bool = True  # autocast where the CPU multiplies bf16 natively


class Batches:
    """Random batches of sequences with anchors in their replies, from a FeatureStore."""

    def __init__(self, store: FeatureStore, draft_ids: list[int], vocab_size: int, block: int, anchors: int,
                 seed: int):
        self.index, self.features, self.final, self.greedy = store.open("r")
        self.offsets, self.prompts = self.index["offsets"], self.index["prompt_lengths"]
        self.records = [i for i in range(self.index["done"])
                        if self.offsets[i + 1] - self.offsets[i] - self.prompts[i] >= 2]
        self.lookup = torch.full((vocab_size,), -1, dtype=torch.long)
        self.lookup[torch.tensor(draft_ids)] = torch.arange(len(draft_ids))
        self.block, self.anchors = block, anchors
        self.rng = random.Random(seed)

    def __len__(self) -> int:
        return len(self.records)

    def sample(self, count: int, tokens_of) -> dict:
        return self.make([self.rng.choice(self.records) for _ in range(count)], tokens_of, self.rng)

    def make(self, chosen: list[int], tokens_of, rng: random.Random) -> dict:
        length = max(self.offsets[i + 1] - self.offsets[i] for i in chosen)
        width = self.features.shape[1]
        features = torch.zeros(len(chosen), length, width)
        final = torch.zeros(len(chosen), length, self.final.shape[1])
        tokens = torch.zeros(len(chosen), length, dtype=torch.long)
        greedy = torch.full((len(chosen), length), -1, dtype=torch.long)
        anchors = torch.zeros(len(chosen), self.anchors, dtype=torch.long)
        for b, i in enumerate(chosen):
            start, end = self.offsets[i], self.offsets[i + 1]
            n = end - start
            features[b, :n] = torch.from_numpy(np.asarray(self.features[start:end], dtype=np.float32))
            final[b, :n] = torch.from_numpy(np.asarray(self.final[start:end], dtype=np.float32))
            greedy[b, :n] = torch.from_numpy(np.asarray(self.greedy[start:end], dtype=np.int64))
            tokens[b, :n] = torch.tensor(tokens_of(i))
            first = self.prompts[i]  # the reply's first token: the first block a decode drafts after
            anchors[b] = torch.tensor([rng.randint(first, n - 1) for _ in range(self.anchors)])
        # row j >= 1 of a block anchored at a predicts position a + j: the target's greedy token
        # there, which it computed at a + j - 1 (a position past the sequence has none)
        offsets = torch.arange(1, self.block)
        source = anchors.unsqueeze(-1) + offsets - 1  # [b, A, B - 1]
        in_sequence = source < length
        labels_full = greedy.gather(1, source.clamp(max=length - 1).flatten(1)).view_as(source)
        labels_full = torch.where(in_sequence & (labels_full >= 0), labels_full, torch.full_like(labels_full, -1))
        labels = torch.where(labels_full >= 0, self.lookup[labels_full.clamp(min=0)], labels_full)
        target_hidden = final.gather(1, source.clamp(max=length - 1).flatten(1).unsqueeze(-1)
                                     .expand(-1, -1, final.shape[-1])).view(*source.shape, -1)
        return {"features": features, "tokens": tokens, "anchors": anchors, "labels": labels,
                "target_hidden": target_hidden}


class MixedBatches:
    """Batches from several stores (data sets), each batch from one, chosen in proportion to
    their sizes."""

    def __init__(self, sources: list[tuple[Batches, object]], seed: int):
        self.sources = [(b, tokens_of) for b, tokens_of in sources if len(b)]
        self.rng = random.Random(seed)

    def __len__(self) -> int:
        return sum(len(b) for b, _ in self.sources)

    def sample(self, count: int) -> dict:
        batches, tokens_of = self.rng.choices(self.sources, weights=[len(b) for b, _ in self.sources])[0]
        return batches.sample(count, tokens_of)


def step_loss(head: DraftHead, batch: dict, embed: torch.Tensor, vocab_weight: torch.Tensor, rope,
              config: DraftTrainConfig) -> tuple[torch.Tensor, dict]:
    hidden = head.forward_train(batch["features"], batch["tokens"], batch["anchors"], embed, rope)
    logits = hidden[:, :, 1:] @ vocab_weight.T.to(hidden.dtype)
    with torch.no_grad():
        target_logits = batch["target_hidden"] @ vocab_weight.T
    return draft_loss(logits, target_logits, batch["labels"], config.offset_decay, config.kl_weight)


def acceptance_by_offset(head: DraftHead, batches: Batches, records: list[int], tokens_of, embed, vocab_weight,
                         rope, block: int) -> dict:
    """On held-out records: how often the draft at each offset is right with all before it right
    (the share of blocks whose check keeps at least that many drafts), and the mean kept."""
    rng = random.Random(1234)
    kept = torch.zeros(block - 1)
    blocks = 0
    with torch.no_grad():
        for first in range(0, len(records), 8):
            batch = batches.make(records[first:first + 8], tokens_of, rng)
            hidden = head.forward_train(batch["features"], batch["tokens"], batch["anchors"], embed, rope)
            guesses = (hidden[:, :, 1:] @ vocab_weight.T).argmax(-1)
            hits = ((guesses == batch["labels"]) & (batch["labels"] >= 0)).long().cumprod(-1)
            kept += hits.flatten(0, 1).sum(0).float()
            blocks += hits.shape[0] * hits.shape[1]
    by_offset = (kept / max(1, blocks)).tolist()
    return {"by_offset": [round(v, 4) for v in by_offset], "tokens_per_pass": round(1 + sum(by_offset), 3)}


def held_out_acceptance(head: DraftHead, held_out: list[tuple[str, Batches, object]], embed, vocab_weight,
                        rope) -> dict:
    """acceptance_by_offset on each held-out set, and over all of them (weighted by blocks)."""
    results = {name: acceptance_by_offset(head, batches, batches.records, tokens_of, embed, vocab_weight, rope,
                                          head.spec.block_size)
               for name, batches, tokens_of in held_out}
    weights = {name: len(batches.records) for name, batches, _ in held_out}
    total = sum(weights.values())
    offsets = len(next(iter(results.values()))["by_offset"])
    by_offset = [round(sum(results[n]["by_offset"][j] * weights[n] for n in results) / total, 4) for j in range(offsets)]
    return {"by_offset": by_offset, "tokens_per_pass": round(1 + sum(by_offset), 3), "sets": results}


def train_draft_head(head: DraftHead, embed: torch.Tensor, vocab_weight: torch.Tensor, rope, train: MixedBatches,
                     held_out: list[tuple[str, Batches, object]], config: DraftTrainConfig,
                     run_dir: Path) -> list[dict]:
    """Trains `head` in place until the time budget or max_steps; returns the history."""
    from tqdm import tqdm

    torch.manual_seed(config.seed)
    optimizer = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=config.lr,
                                  weight_decay=0.01, betas=(0.9, 0.95))
    checkpoint = run_dir / "draft_head.pt"
    history, evals, step, spent = [], [], 0, 0.0
    if checkpoint.exists():
        state = torch.load(checkpoint, weights_only=False)
        head.load_state_dict(state["head"])
        optimizer.load_state_dict(state["optimizer"])
        history, evals, step, spent = state["history"], state["evals"], state["step"], state["seconds"]
        print(f"resumed at step {step} ({spent / 60:.1f} minutes in)")
    budget = config.minutes * 60
    started = time.monotonic() - spent
    last_eval = -1e9 if not evals else time.monotonic() - (spent - evals[-1]["seconds"])

    def save() -> None:
        torch.save({"head": head.state_dict(), "optimizer": optimizer.state_dict(), "history": history,
                    "evals": evals, "step": step, "seconds": time.monotonic() - started,
                    "config": asdict(config)}, checkpoint)

    bar = tqdm(total=int(budget), initial=int(spent), unit="s", dynamic_ncols=True,
               bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} s {postfix}")
    pause = _PauseRequest()
    try:
        while step < config.max_steps and time.monotonic() - started < budget and not pause.asked:
            if time.monotonic() - last_eval >= config.eval_every_s:
                result = evaluate(head, held_out, embed, vocab_weight, rope, config, evals, step,
                                  time.monotonic() - started, run_dir)
                bar.write(f"held-out at {evals[-1]['seconds'] / 60:.1f} min: {result['tokens_per_pass']} tokens a "
                          f"pass, by offset {result['by_offset']}")
                last_eval = time.monotonic()
            lr = _schedule(step, (time.monotonic() - started) / budget, config)
            value, stats = _optimizer_step(head, optimizer, lr, train.sample(config.batch_size),
                                           lambda batch: step_loss(head, batch, embed, vocab_weight, rope, config),
                                           config.bf16)
            step += 1
            history.append({"step": step, "loss": value, "lr": lr, "elapsed": round(time.monotonic() - started, 1),
                            **{k: round(v, 4) for k, v in stats.items()}})
            bar.update(min(time.monotonic() - started, budget) - bar.n)  # past the total, tqdm's format fails
            bar.set_postfix(step=step, loss=f"{value:.3f}", first=f"{stats['first_right']:.2f}",
                            kept=f"{stats['accepted']:.2f}")
            if step % config.checkpoint_every == 0:
                save()
    finally:
        pause.restore()
    bar.close()
    if pause.asked:  # paused (SIGTERM or Ctrl-C) to free the cores: resumes from this checkpoint
        save()
        raise TrainingPaused(f"paused at step {step} ({(time.monotonic() - started) / 60:.1f} minutes in); "
                             "rerun to resume")
    if not evals or evals[-1]["step"] < step:  # the head as shipped gets its own measurement
        evaluate(head, held_out, embed, vocab_weight, rope, config, evals, step, time.monotonic() - started, run_dir)
    save()
    return history


def _optimizer_step(head: DraftHead, optimizer, lr: float, batch: dict, loss_of, bf16: bool) -> tuple[float, dict]:
    for group in optimizer.param_groups:
        group["lr"] = lr
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss, stats = loss_of(batch)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
    optimizer.step()
    return float(loss.detach()), stats


class TrainingPaused(Exception):
    """The run stopped before its budget, on request, with its checkpoint saved."""


class _PauseRequest:
    """SIGTERM or Ctrl-C asks the loop to stop after the step it is in and save, so a benchmark
    can have the cores; the time budget counts only the minutes spent training."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self) -> None:
        self.asked = False
        self.previous = {}
        if threading.current_thread() is threading.main_thread():  # only there can Python take signals
            self.previous = {signum: signal.signal(signum, self._ask) for signum in self.SIGNALS}

    def _ask(self, signum, frame) -> None:
        self.asked = True

    def restore(self) -> None:
        for signum, handler in self.previous.items():
            signal.signal(signum, handler)


def evaluate(head: DraftHead, held_out: list[tuple[str, Batches, object]], embed, vocab_weight, rope,
             config: DraftTrainConfig, evals: list[dict], step: int, seconds: float, run_dir: Path) -> dict:
    """held_out_acceptance now, appended to `evals` and written to run_dir/draft_evals.json."""
    head.eval()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=config.bf16):
        result = held_out_acceptance(head, held_out, embed, vocab_weight, rope)
    head.train()
    evals.append({"step": step, "seconds": round(seconds, 1), **result})
    (run_dir / "draft_evals.json").write_text(json.dumps(evals, indent=1))
    return result


def _schedule(step: int, progress: float, config: DraftTrainConfig) -> float:
    """Linear warm-up over steps, then a cosine over the share of the time budget spent."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    progress = min(1.0, max(0.0, progress))
    floor = config.lr * config.min_lr_ratio
    return floor + (config.lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))
