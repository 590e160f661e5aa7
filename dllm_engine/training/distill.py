"""Self-distillation data: the base model's own greedy autoregressive replies, made by our
engine with many requests in flight at once, appended to a JSONL file (resumable)."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from dllm_engine.engine import Engine
from dllm_engine.request import GenerationParams
from dllm_engine.training.prompts import conversation

log = logging.getLogger(__name__)


def distill(engine: Engine, prompts: list[str], out: Path, max_new_tokens: int, concurrency: int = 32) -> list[dict]:
    """Make (or finish making) one record per prompt; returns all records in prompt order."""
    done = {}
    if out.exists():
        for line in out.read_text().splitlines():
            record = json.loads(line)
            done[record["prompt"]] = record
    todo = [p for p in prompts if p not in done]
    log.info("distillation: %d cached, %d to make", len(done), len(todo))
    params = GenerationParams(mode="autoregressive", max_new_tokens=max_new_tokens)
    started, made = time.monotonic(), 0
    with out.open("a") as sink:
        for first in range(0, len(todo), concurrency):
            wave = todo[first:first + concurrency]
            jobs = []
            for index, prompt in enumerate(wave):
                messages = conversation(prompt, voice_system=(first + index) % 2 == 0)
                jobs.append((prompt, messages, engine.submit(messages, params)))
            for prompt, messages, handle in jobs:
                final = handle.result()
                record = {"prompt": prompt, "messages": messages,
                          "prompt_ids": engine.prompt_ids(messages, raw=False),
                          "reply_ids": final.token_ids, "reply": final.committed_text,
                          "finished": final.finish_reason == "stop"}
                sink.write(json.dumps(record) + "\n")
                done[prompt] = record
                made += 1
            sink.flush()
            rate = made / (time.monotonic() - started)
            log.info("distilled %d/%d (%.2f replies/s)", len(done), len(prompts), rate)
            print(f"distilled {len(done)}/{len(prompts)} ({rate:.2f} replies/s)", flush=True)
    return [done[p] for p in prompts if p in done]
