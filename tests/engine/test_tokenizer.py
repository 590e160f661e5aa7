"""Tokenizer and chat templates of Hugging Face directories, against transformers' tokenizer
loading the same files."""

from __future__ import annotations

import json
import shutil

import jinja2
import pytest
from transformers import AutoTokenizer

from dllm_engine.loading.tokenizer import TextTokenizer
from tiny_checkpoints import CHATML_TEMPLATE, write_tokenizer_files

SAMPLES = [
    "Hello, world!",
    "The year 2024 had 366 days; pi is 3.14159.",
    "Café naïve résumé — «quotes» 日本語 🙂",
    "  leading spaces\tand\ttabs\nand newlines\n\n",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "",
]
CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Name a colour."}],
]
# A LLaMA-3 style template (as LLaDA ships): bos_token, trim, loop variables, raise_exception.
LLAMA3_STYLE_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] not in ['system', 'user', 'assistant'] %}"
    "{{ raise_exception('Unknown role: ' + message['role']) }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n\n' + message['content'] | trim + '<|im_end|>' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def tokenizer_pair(tiny_llama_dir):
    return TextTokenizer.from_hf_dir(tiny_llama_dir), AutoTokenizer.from_pretrained(str(tiny_llama_dir))


def test_ids_and_decoding_match_transformers(tokenizer_pair):
    ours, theirs = tokenizer_pair
    for text in SAMPLES:
        ids = ours.encode(text)
        assert ids == theirs(text, add_special_tokens=False).input_ids, text
        assert ours.decode(ids, skip_special=False) == theirs.decode(ids, skip_special_tokens=False) == text
        assert ours.decode(ids) == theirs.decode(ids, skip_special_tokens=True)


def test_special_tokens_stay_whole_and_stop_generation(tokenizer_pair):
    ours, _ = tokenizer_pair
    im_start, im_end = ours.token_id("<|im_start|>"), ours.token_id("<|im_end|>")
    assert ours.encode("<|im_start|>user<|im_end|>")[0] == im_start
    assert ours.encode("<|im_start|>user<|im_end|>")[-1] == im_end
    assert (ours.bos_token, ours.eos_token) == ("<|im_start|>", "<|im_end|>")
    assert im_end in ours.stop_ids  # the template's end-of-turn marker ends a reply


@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_renders_as_transformers_does(tokenizer_pair, add_generation_prompt):
    ours, theirs = tokenizer_pair
    assert ours.chat_template == CHATML_TEMPLATE
    for messages in CONVERSATIONS:
        expected = theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
        assert ours.render_chat(messages, add_generation_prompt) == expected


@pytest.fixture
def llama3_style_dir(tmp_path, tiny_llama_dir):
    """The tiny tokenizer with the template in chat_template.jinja (transformers 5's layout)."""
    shutil.copy(tiny_llama_dir / "tokenizer.json", tmp_path / "tokenizer.json")
    config = json.loads((tiny_llama_dir / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    (tmp_path / "chat_template.jinja").write_text(LLAMA3_STYLE_TEMPLATE)
    return tmp_path


def test_template_from_chat_template_jinja_renders_as_transformers_does(llama3_style_dir):
    ours = TextTokenizer.from_hf_dir(llama3_style_dir)
    theirs = AutoTokenizer.from_pretrained(str(llama3_style_dir))
    for messages in CONVERSATIONS:
        expected = theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert ours.render_chat(messages) == expected
        assert expected.startswith(ours.bos_token + "<|im_start|>")


def test_template_raise_exception_surfaces_its_message(llama3_style_dir):
    ours = TextTokenizer.from_hf_dir(llama3_style_dir)
    with pytest.raises(jinja2.exceptions.TemplateError, match="Unknown role: robot"):
        ours.render_chat([{"role": "robot", "content": "beep"}])


def test_malformed_message_is_named(tokenizer_pair):
    ours, _ = tokenizer_pair
    with pytest.raises(ValueError, match="message 1 must be a dict with 'role' and 'content'"):
        ours.render_chat([{"role": "user", "content": "hi"}, {"content": "no role"}])


def test_missing_template_says_to_use_raw(tmp_path, tiny_tokenizer):
    write_tokenizer_files(tmp_path, tiny_tokenizer)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="no chat template"):
        TextTokenizer.from_hf_dir(tmp_path).render_chat(CONVERSATIONS[0])
