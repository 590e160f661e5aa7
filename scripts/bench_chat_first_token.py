"""First-token latency of the chat API's streamed replies on an idle server, in engine steps and ms.

    voice-app serve --port 8799 &
    python scripts/bench_chat_first_token.py --url http://127.0.0.1:8799 --trials 10

Each trial streams the answer to a different question (so only the chat template's head is in
the prefix cache and the rest of the prompt is prefilled) on an idle server and records:
- client first token: request sent -> first content delta received (what a client waits);
- engine first token: the engine's submit -> first committed token (x_dllm.first_token_s);
- passes to first token: forward passes the request had taken when its first token was
  committed (x_dllm.passes_to_first_token; 1 = the first step, which also prefills the prompt);
- later step: the mean length of the request's other steps, for scale.
Prints a Markdown table with the medians (--json for JSON). Needs the openai SDK (`test` extra).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import httpx
from openai import OpenAI

QUESTIONS = [
    "What is the capital of France?", "Who wrote Romeo and Juliet?", "What is the capital of Japan?",
    "Why is the sky blue?", "What do bees make?", "How many days are in a week?", "What is ice made of?",
    "Name a large animal that lives in the sea.", "What is the capital of Germany?", "What do cows eat?",
]
COLUMNS = {"client_first_token_ms": "client first token (ms)", "engine_first_token_ms": "engine first token (ms)",
           "passes_to_first_token": "passes to first token", "later_step_ms": "later step (ms)"}


def wait_until_idle(url: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while httpx.get(url + "/healthz").json()["engine_live_requests"] and time.monotonic() < deadline:
        time.sleep(0.05)


def trial(client: OpenAI, url: str, model: str, question: str) -> dict:
    wait_until_idle(url)
    started = time.perf_counter()
    first, stats = None, None
    for chunk in client.chat.completions.create(model=model, messages=[{"role": "user", "content": question}],
                                                max_tokens=32, stream=True):
        choice = chunk.choices[0]
        if first is None and choice.delta.content:
            first = time.perf_counter() - started
        if choice.finish_reason:
            stats = choice.x_dllm
    later = (stats["elapsed_s"] - stats["first_token_s"]) / max(1, stats["forward_passes"] - 1)
    return {"question": question, "client_first_token_ms": round(first * 1000, 1),
            "engine_first_token_ms": round(stats["first_token_s"] * 1000, 1),
            "passes_to_first_token": stats["passes_to_first_token"], "later_step_ms": round(later * 1000, 1)}


def medians(rows: list[dict]) -> dict:
    return {key: round(statistics.median(row[key] for row in rows), 1) for key in COLUMNS}


def table(rows: list[dict]) -> str:
    lines = ["| question | " + " | ".join(COLUMNS.values()) + " |", "|---|" + "---:|" * len(COLUMNS)]
    for row in rows + [{"question": "**median**", **medians(rows)}]:
        lines.append(f"| {row['question']} | " + " | ".join(str(row[key]) for key in COLUMNS) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8765", help="a running voice-app serve")
    parser.add_argument("--trials", type=int, default=len(QUESTIONS))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    client = OpenAI(api_key="unused", base_url=args.url + "/v1", max_retries=0)
    model = client.models.list().data[0].id
    trial(client, args.url, model, "Hello!")  # warm-up, not counted
    rows = [trial(client, args.url, model, QUESTIONS[i % len(QUESTIONS)]) for i in range(args.trials)]
    print(json.dumps({"model": model, "trials": rows, "median": medians(rows)}, indent=1) if args.json
          else table(rows))


if __name__ == "__main__":
    main()
