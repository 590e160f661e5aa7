"""Prompts as the engine takes them: a user message or a conversation, rendered with the model's
chat template, or token ids as they are; and the end-of-turn question semantic turn detection
asks of a conversation."""

from __future__ import annotations

from dllm_engine.loading.tokenizer import TextTokenizer
from dllm_engine.request import EngineError

EOT_MARKER = "\u2063EOT\u2063"  # invisible separator: never in a transcript


def prompt_ids(tokenizer: TextTokenizer, vocab_size: int, prompt: str | list[dict] | list[int], raw: bool) -> list[int]:
    """raw: a string prompt is encoded as it is, not as a user message of the chat template."""
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        if not all(0 <= t < vocab_size for t in prompt):
            raise EngineError(f"prompt token ids must be in 0..{vocab_size - 1}")
        return list(prompt)  # token ids, as they are
    if isinstance(prompt, str):
        if raw:
            return tokenizer.encode(prompt)
        prompt = [{"role": "user", "content": prompt}]
    try:
        return tokenizer.encode(tokenizer.render_chat(prompt))
    except ValueError as exc:
        raise EngineError(str(exc)) from exc


def end_of_turn_prompt(tokenizer: TextTokenizer, messages: list[dict]) -> tuple[list[int], int]:
    """(prompt ids up to the end of the last message's text, the end-of-turn token after it)."""
    if not messages or not isinstance(messages[-1].get("content"), str):
        raise EngineError("end_of_turn_prompt needs messages ending with a text message")
    marked = messages[:-1] + [{**messages[-1], "content": messages[-1]["content"] + EOT_MARKER}]
    try:
        head, _, tail = tokenizer.render_chat(marked, add_generation_prompt=False).partition(EOT_MARKER)
    except ValueError as exc:
        raise EngineError(str(exc)) from exc
    tail_ids = tokenizer.encode(tail)
    if not tail_ids:
        raise EngineError("the chat template puts nothing after a message: no end-of-turn token to score")
    return tokenizer.encode(head), tail_ids[0]
