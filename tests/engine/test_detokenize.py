"""Incremental detokenization gives exactly the whole sequence's decode, step by step, on the
real tokenizer (multi-byte characters, spaces, emoji split over tokens)."""

from __future__ import annotations

import pytest

from dllm_engine.detokenize import IncrementalText


@pytest.fixture(scope="module")
def tokenizer():
    from dllm_engine.loading.gguf_file import load_gguf
    from dllm_engine.loading.registry import smollm2_gguf_path

    return load_gguf(smollm2_gguf_path())[2]


@pytest.mark.parametrize("text", [
    "The capital of France is Paris. It has about two million people, and the Seine runs through it.",
    "Café, naïve, jalapeño — and 日本語のテキスト, plus emoji 🎉🐉 split over byte tokens!",
    "  leading spaces,\nnew lines\n\nand   runs of   spaces ",
])
def test_the_text_of_every_prefix_equals_its_whole_decode(tokenizer, text):
    ids = tokenizer.encode(text)
    incremental = IncrementalText(tokenizer.decode)
    for end in range(len(ids) + 1):
        assert incremental.text(ids[:end]) == tokenizer.decode(ids[:end])
        more = ids[end:end + 5]
        assert incremental.extended(ids[:end], more) == tokenizer.decode(ids[:end] + more)


def test_a_sequence_that_is_not_an_extension_starts_over(tokenizer):
    incremental = IncrementalText(tokenizer.decode)
    first, second = tokenizer.encode("one two three four five six seven eight nine ten eleven twelve thirteen "
                                     "fourteen fifteen"), tokenizer.encode("something else entirely")
    incremental.text(first)
    assert incremental.text(second) == tokenizer.decode(second)
