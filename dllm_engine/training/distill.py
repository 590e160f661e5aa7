"""Self-distillation data: the base model's own greedy autoregressive replies, made by our
engine with many requests in flight at once, appended to a JSONL file (resumable)."""

from __future__ import annotations

import json
import logging
import random
import time
from pathlib import Path

from dllm_engine.engine import Engine
from dllm_engine.request import GenerationParams
from dllm_engine.training.prompts import broad_conversation, broad_follow_up, conversation, second_turn

log = logging.getLogger(__name__)


def _key(messages: list[dict]) -> str:
    return json.dumps(messages, sort_keys=True)


def distill(engine: Engine, prompts: list[str], out: Path, max_new_tokens: int, concurrency: int = 32,
            second_turns: int = 0, seed: int = 0) -> list[dict]:
    """One record per prompt (half with the voice system prompt), and for the first
    `second_turns` of them one more: a follow-up, or a question over a reply cut off as by a
    barge-in. Makes only what `out` lacks; returns every record."""
    firsts = [conversation(p, voice_system=i % 2 == 0) for i, p in enumerate(prompts)]
    done = _answer(engine, firsts, out, max_new_tokens, concurrency)
    records = [done[_key(m)] for m in firsts]
    if second_turns:
        rng = random.Random(seed)
        seconds = [second_turn(r["messages"], r["reply"], rng) for r in records[:second_turns]]
        done = _answer(engine, seconds, out, max_new_tokens, concurrency)
        records += [done[_key(m)] for m in seconds]
    return records


def distill_broad(engine: Engine, prompts: list[str], out: Path, max_new_tokens: int, follow_ups: int = 0,
                  seed: int = 0, concurrency: int = 48) -> list[dict]:
    """distill() over the broader draw (training/prompts.py broad_*): each first turn under one
    of the system prompts voice clients send, follow-ups from the broader list."""
    rng = random.Random(seed)
    firsts = [broad_conversation(p, rng) for p in prompts]
    done = _answer(engine, firsts, out, max_new_tokens, concurrency)
    records = [done[_key(m)] for m in firsts]
    if follow_ups:
        seconds = [broad_follow_up(r["messages"], r["reply"], rng) for r in records[:follow_ups]]
        done = _answer(engine, seconds, out, max_new_tokens, concurrency)
        records += [done[_key(m)] for m in seconds]
    return records


def _answer(engine: Engine, conversations: list[list[dict]], out: Path, max_new_tokens: int,
            concurrency: int) -> dict[str, dict]:
    done = {}
    if out.exists():
        for line in out.read_text().splitlines():
            record = json.loads(line)
            done[_key(record["messages"])] = record
    todo = [m for m in conversations if _key(m) not in done]
    log.info("distillation: %d cached, %d to make", len(conversations) - len(todo), len(todo))
    params = GenerationParams(mode="autoregressive", max_new_tokens=max_new_tokens)
    started, made, waiting = time.monotonic(), 0, list(todo)
    live: list[tuple[list[dict], object]] = []
    with out.open("a") as sink:
        while waiting or live:  # a rolling window: a finished reply's place goes to the next at once
            while waiting and len(live) < concurrency:
                messages = waiting.pop(0)
                live.append((messages, engine.submit(messages, params)))
            finished = [(m, h) for m, h in live if h.done]
            if not finished:
                time.sleep(0.005)
                continue
            live = [(m, h) for m, h in live if not h.done]
            for messages, handle in finished:
                final = handle.result()
                record = {"prompt": messages[-1]["content"], "messages": messages,
                          "prompt_ids": engine.prompt_ids(messages, raw=False),
                          "reply_ids": final.token_ids, "reply": final.committed_text,
                          "finished": final.finish_reason == "stop"}
                sink.write(json.dumps(record) + "\n")
                done[_key(messages)] = record
                made += 1
                if made % 64 == 0 or made == len(todo):
                    sink.flush()
                    rate = made / (time.monotonic() - started)
                    print(f"distilled {made}/{len(todo)} ({rate:.2f} replies/s)", flush=True)
    return done
