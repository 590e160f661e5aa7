"""The draft head's training turns: seeded and distinct, and the wide draw's held-out part asks
about words its training part never contains (so its acceptance measures new content)."""

from __future__ import annotations

import re

from dllm_engine.training.prompts import SANITY_QUESTIONS, broad_voice_prompts, voice_prompts
from dllm_engine.training.prompts_wide import HELD_OUT_SEED, SUBJECTS, subjects, wide_prompts


def test_the_wide_draws_train_and_held_out_words_are_disjoint_and_cover_every_word():
    train, held = subjects("train"), subjects("held_out")
    for category, words in SUBJECTS.items():
        assert set(train[category]).isdisjoint(held[category])
        assert sorted(train[category] + held[category]) == sorted(words)
        assert held[category], f"{category} has no held-out word"


def test_held_out_turns_name_no_training_word():
    held_words = sorted({w for words in subjects("held_out").values() for w in words}, key=len, reverse=True)
    trained = {w for words in subjects("train").values() for w in words}
    for prompt in wide_prompts(200, seed=HELD_OUT_SEED, part="held_out"):
        rest = f" {prompt.lower()} "
        for word in held_words:  # "tennis" may be in "table tennis", a held-out word
            rest = rest.replace(word.lower(), " ")
        assert not [w for w in trained if re.search(rf"\b{re.escape(w.lower())}\b", rest)], prompt


def test_draws_are_seeded_distinct_and_never_a_sanity_question():
    sanity = {q for q, _ in SANITY_QUESTIONS}
    for draw in (lambda s: voice_prompts(300, s), lambda s: broad_voice_prompts(300, s),
                 lambda s: wide_prompts(300, s, "train")):
        first, again, other = draw(1), draw(1), draw(2)
        assert first == again and first != other
        assert len(set(first)) == len(first) == 300
        assert not sanity & set(first)
