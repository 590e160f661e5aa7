"""After a barge-in the real model answers the words that cut the reply off, misheard or not,
instead of carrying on with the cut reply (the prompt the session builds for that turn)."""

from __future__ import annotations

import pytest

from dllm_engine.request import GenerationParams
from voice_app.core.conversation import Conversation, ConversationItem
from voice_app.settings import DEFAULT_INSTRUCTIONS

pytestmark = pytest.mark.slow

CUT_STORY = ("Once upon a time, in a land far away, there lived a dragon named Ember. "
             "The dragon, a magnificent creature, spread its")


@pytest.mark.parametrize("question, about", [
    ("Stop. Actually, what is two plus two?", ("two", "2", "4", "four")),
    ("Stop. Actually, what is too plus too?", ("too", "two", "plus")),  # as Whisper once heard it
    ("Wait, what is the capital of France?", ("paris",)),
])
def test_the_turn_after_a_barge_in_answers_the_new_words(engine, question, about):
    conversation = Conversation()
    conversation.add(ConversationItem("item_1", "user", "Tell me a story about a dragon."))
    conversation.add(ConversationItem("item_2", "assistant", CUT_STORY, audio=True, status="incomplete"))
    conversation.add(ConversationItem("item_3", "user", question))
    messages = conversation.messages(DEFAULT_INSTRUCTIONS)
    assert messages[-1] == {"role": "user", "content": question}
    reply = engine.generate(messages, GenerationParams(max_new_tokens=30)).committed_text.lower()
    assert any(word in reply for word in about), reply
    assert "spread its" not in reply and "ember" not in reply, reply  # not the story carried on
