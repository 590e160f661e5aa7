#!/usr/bin/env python3
"""How long a streamed reply stalls while another client's long prompt prefills (issue 28).

    .venv/bin/python scripts/bench_prefill_stall.py [--prompt-tokens 1800] [--url http://127.0.0.1:8765]

Client A streams a long reply through /v1/chat/completions; once it is flowing, client B asks
for one token after a prompt of --prompt-tokens tokens. Prints JSON and a table: A's gaps
between chunks before, during and after B's prefill (the largest is the stall a listener
hears), and B's time to its token. Without --url it starts a server on a free port in-process
with the engine's defaults (`--prefill-chunk 0` turns chunked prefill off, for the before).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running voice server (default: start one here)")
    parser.add_argument("--prompt-tokens", type=int, default=1800)
    parser.add_argument("--prefill-chunk", type=int, default=None, help="the engine's chunk (default: its own)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from openai import OpenAI

    server = None
    url = args.url
    if url is None:
        server = start_server(args.prefill_chunk)
        url = server.base_url
    client = OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    model = client.models.list().data[0].id
    arrivals: list[float] = []
    b_window: dict[str, float] = {}

    def stream_a() -> None:
        story = [{"role": "user", "content": "Tell me a very long story about a lighthouse keeper and a storm."}]
        for chunk in client.chat.completions.create(model=model, messages=story, max_tokens=400, stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                arrivals.append(time.monotonic())

    reader = threading.Thread(target=stream_a)
    reader.start()
    while len(arrivals) < 30 and reader.is_alive():
        time.sleep(0.01)
    filler = "The quick brown fox jumps over the lazy dog near the quiet river bank. " * (args.prompt_tokens // 15)
    b_window["start"] = time.monotonic()
    client.chat.completions.create(model=model, max_tokens=1,
                                   messages=[{"role": "user", "content": filler + "Summarise that."}])
    b_window["end"] = time.monotonic()
    reader.join()
    if server is not None:
        server.stop()

    gaps = [(b - a) * 1000 for a, b in zip(arrivals, arrivals[1:])]
    during = [(b - a) * 1000 for a, b in zip(arrivals, arrivals[1:]) if b > b_window["start"] and a < b_window["end"]]
    before = [(b - a) * 1000 for a, b in zip(arrivals, arrivals[1:]) if b <= b_window["start"]]
    report = {"prompt_tokens": args.prompt_tokens, "chunks": len(arrivals),
              "median_gap_ms": round(statistics.median(gaps), 1) if gaps else None,
              "median_gap_before_ms": round(statistics.median(before), 1) if before else None,
              "largest_gap_during_prefill_ms": round(max(during), 1) if during else None,
              "largest_gap_ms": round(max(gaps), 1) if gaps else None,
              "long_prompt_reply_s": round(b_window["end"] - b_window["start"], 2)}
    if args.json:
        print(json.dumps(report, indent=2))
    print("| prompt tokens | median gap (ms) | largest gap during the prefill (ms) | long prompt's reply (s) |")
    print("|---|---|---|---|")
    print(f"| {report['prompt_tokens']} | {report['median_gap_ms']} | {report['largest_gap_during_prefill_ms']} | "
          f"{report['long_prompt_reply_s']} |")
    return 0


def start_server(prefill_chunk: int | None):
    from dllm_engine.engine import Engine
    from voice_app.realtime.server import BackgroundServer
    from voice_app.settings import Settings
    from voice_app.speech.loaded_models import LoadedModels

    settings = Settings(port=0)
    kwargs = {} if prefill_chunk is None else {"prefill_chunk": prefill_chunk}
    engine = Engine.load(settings.engine_model, **kwargs)
    return BackgroundServer(settings, LoadedModels.load(settings, engine=engine)).start()


if __name__ == "__main__":
    sys.exit(main())
