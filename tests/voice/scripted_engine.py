"""A scripted stand-in for the engine, used only by unit tests of the session's logic.

It speaks the engine's real contract (dllm_engine.request.RequestHandle / DraftUpdate): a thread
publishes a few draft updates per reply and honours cancel between steps.
"""

from __future__ import annotations

import threading
import time
from typing import Callable

from dllm_engine.request import DraftUpdate, GenerationParams, RequestHandle, RequestStats


def echo_reply(messages: list[dict[str, str]]) -> str:
    return f"You said {messages[-1]['content'].rstrip('.?!')}. That is all I know. Goodbye now."


class ScriptedEngine:
    model_name = "scripted"
    max_context_tokens = 512

    def __init__(self, reply: Callable[[list[dict[str, str]]], str] = echo_reply, step_s: float = 0.02,
                 words_per_step: int = 2):
        self.reply = reply
        self.step_s = step_s
        self.words_per_step = words_per_step
        self.submitted: list[list[dict[str, str]]] = []
        self._live = 0
        self._lock = threading.Lock()
        self._next_id = 0

    @property
    def live_requests(self) -> int:
        with self._lock:
            return self._live

    def count_tokens(self, messages: list[dict[str, str]]) -> int:
        return sum(len(m["content"].split()) + 4 for m in messages)

    def submit(self, messages: list[dict[str, str]], params: GenerationParams) -> RequestHandle:
        params.validate()
        with self._lock:
            self._next_id += 1
            self._live += 1
            handle = RequestHandle(self._next_id)
        self.submitted.append(messages)
        words = self.reply(messages).split()[: params.max_new_tokens]
        threading.Thread(target=self._run, args=(handle, words), daemon=True).start()
        return handle

    def _run(self, handle: RequestHandle, words: list[str]) -> None:
        stats = RequestStats(prompt_tokens=10)
        committed = 0
        step = 0
        try:
            while committed < len(words):
                time.sleep(self.step_s)
                if handle.cancelled:
                    handle._publish(self._update(handle, words, committed, step, True, "cancelled", stats))
                    return
                step += 1
                committed = min(len(words), committed + self.words_per_step)
                stats.forward_passes, stats.new_tokens = step, committed
                done = committed == len(words)
                handle._publish(self._update(handle, words, committed, step, done, "stop" if done else None, stats))
        finally:
            with self._lock:
                self._live -= 1

    @staticmethod
    def _update(handle, words, committed, step, final, reason, stats) -> DraftUpdate:
        return DraftUpdate(request_id=handle.request_id, committed_text=" ".join(words[:committed]),
                           draft_text=" ".join(words), token_ids=list(range(committed)), step=step,
                           final=final, finish_reason=reason, stats=stats)
