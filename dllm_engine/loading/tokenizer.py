"""Tokenizer + chat template, built from a Hugging Face directory or from GGUF metadata."""

from __future__ import annotations

import json
from pathlib import Path

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

# GGUF token_type values (llama.cpp): 3 = control, 4 = user defined
_GGUF_CONTROL, _GGUF_USER_DEFINED = 3, 4


class TextTokenizer:
    """Encodes text, decodes ids, renders chat templates the way Hugging Face does."""

    def __init__(self, tokenizer: Tokenizer, chat_template: str | None, bos_token: str | None,
                 eos_token: str | None, extra_stop_tokens: tuple[str, ...] = ()):
        self.backend = tokenizer
        self.chat_template = chat_template
        self.bos_token, self.eos_token = bos_token, eos_token
        stops = {t for t in (eos_token, *extra_stop_tokens) if t}
        self.stop_ids = sorted(i for t in stops if (i := tokenizer.token_to_id(t)) is not None)
        self._template = _compile_template(chat_template) if chat_template else None

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return self.backend.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special)

    def token_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        if self._template is None:
            raise ValueError("this model has no chat template; pass raw=True and a prompt string")
        for index, message in enumerate(messages):
            if not isinstance(message, dict) or "role" not in message or "content" not in message:
                raise ValueError(f"message {index} must be a dict with 'role' and 'content', got {message!r}")
        return self._template.render(
            messages=messages, add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "", eos_token=self.eos_token or "",
        )

    # ---- construction ---------------------------------------------------------------------
    @classmethod
    def from_hf_dir(cls, directory: Path) -> "TextTokenizer":
        path = directory / "tokenizer.json"
        if not path.exists():
            raise FileNotFoundError(f"{directory} has no tokenizer.json")
        config = {}
        if (directory / "tokenizer_config.json").exists():
            config = json.loads((directory / "tokenizer_config.json").read_text())
        template = config.get("chat_template")
        if template is None and (directory / "chat_template.jinja").exists():
            template = (directory / "chat_template.jinja").read_text()
        if isinstance(template, list):  # named templates: take the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        return cls(Tokenizer.from_file(str(path)), template, _token_text(config.get("bos_token")),
                   _token_text(config.get("eos_token")), extra_stop_tokens=_chat_stop_tokens(template))

    @classmethod
    def from_gguf_fields(cls, fields: dict) -> "TextTokenizer":
        kind = fields.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise ValueError(f"unsupported GGUF tokenizer model {kind!r}: only byte-level BPE ('gpt2') is supported")
        tokens: list[str] = fields["tokenizer.ggml.tokens"]
        merges = [tuple(m.split(" ", 1)) for m in fields["tokenizer.ggml.merges"]]
        backend = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
        backend.pre_tokenizer = _gguf_pre_tokenizer(fields.get("tokenizer.ggml.pre", "default"))
        backend.decoder = decoders.ByteLevel()
        types = fields.get("tokenizer.ggml.token_type") or []
        specials = [tokens[i] for i, t in enumerate(types) if t in (_GGUF_CONTROL, _GGUF_USER_DEFINED)]
        backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])

        def named(key: str) -> str | None:
            index = fields.get(key)
            return tokens[index] if index is not None and 0 <= index < len(tokens) else None

        template = fields.get("tokenizer.chat_template")
        return cls(backend, template, named("tokenizer.ggml.bos_token_id"), named("tokenizer.ggml.eos_token_id"),
                   extra_stop_tokens=_chat_stop_tokens(template))


def _gguf_pre_tokenizer(pre: str):
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in ("smollm", "starcoder", "refact"):  # digits split one by one, then GPT-2 regex
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
    if pre in ("gpt2", "default"):
        return byte_level
    raise ValueError(f"unsupported GGUF pre-tokenizer {pre!r}: supported are smollm, starcoder, refact, gpt2")


def _token_text(token) -> str | None:
    if isinstance(token, dict):
        return token.get("content")
    return token


def _chat_stop_tokens(template: str | None) -> tuple[str, ...]:
    """End-of-turn markers the template uses; generation stops on them as on EOS."""
    markers = ("<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<|end|>")
    return tuple(m for m in markers if template and m in template)


def _compile_template(source: str) -> jinja2.Template:
    def raise_exception(message: str):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    env.filters["tojson"] = lambda value, indent=None: json.dumps(value, indent=indent, ensure_ascii=False)
    return env.from_string(source)
