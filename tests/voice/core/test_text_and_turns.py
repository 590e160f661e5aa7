"""Unit tests of core's pure logic: speech text, LocalAgreement, turn rules, history, metrics."""

from __future__ import annotations

import pytest

from voice_app.core.conversation import ContextFitter, ContextTooLong, Conversation, ConversationItem, SpokenPiece
from voice_app.core.local_agreement import LocalAgreement
from voice_app.core.metrics import VoiceMetrics
from voice_app.core.models import VAD_WINDOW
from voice_app.core.options import TurnDetection
from voice_app.core.speech_text import SentenceSettler, clean_for_speech, split_settled_sentences
from voice_app.core.turn_detector import TurnDetector


@pytest.mark.parametrize("raw, spoken", [
    ("**Paris** is the _capital_.", "Paris is the capital."),
    ("# Title\n- one\n- two", "Title one two"),
    ("See [the docs](https://x.org/a) or https://www.example.com/page now", "See the docs or www dot example dot com now"),
    ("Great job! 🎉👍", "Great job!"),
    ("Rock & roll costs $5, 50% off", "Rock and roll costs 5 dollars, 50 percent off"),
    ("Use `print()` here\n```python\nx = 1\n```\ndone", "Use print() here done"),
])
def test_clean_for_speech(raw, spoken):
    assert clean_for_speech(raw) == spoken


def test_sentences_settle_only_when_followed_by_more_text():
    assert split_settled_sentences("Hi there. How are", final=False) == (["Hi there."], "How are")
    assert split_settled_sentences("It costs 3.5 euros", final=False) == ([], "It costs 3.5 euros")
    assert split_settled_sentences("Done.", final=False) == ([], "Done.")
    assert split_settled_sentences("Done.", final=True) == (["Done."], "")
    settler = SentenceSettler()
    assert settler.feed("One. Tw", False) == ["One."]
    assert settler.feed("One. Two! Thr", False) == ["Two!"]
    assert settler.feed("One. Two! Three", True) == ["Three"]
    assert settler.feed("One. Two! Three", True) == []


def test_a_long_first_sentence_is_spoken_from_its_first_clause():
    settler = SentenceSettler(first_clause_words=4)
    assert settler.feed("Well, the capital", False) == []  # too short a clause to stand alone
    assert settler.feed("Well, the capital of France, as you know", False) == ["Well, the capital of France,"]
    assert settler.feed("Well, the capital of France, as you know, is Paris. It", False) == ["as you know, is Paris."]
    settler = SentenceSettler()
    assert settler.feed("Dogs are loyal and", False) == []  # too early to break before "and"
    long_start = "Dogs are loyal animals that people have kept for thousands of years and they"
    assert settler.feed(long_start, False) == ["Dogs are loyal animals that people have kept for thousands of years"]
    assert settler.feed(long_start + " love walks. More", False) == ["and they love walks."]


def test_local_agreement_commits_words_two_hypotheses_share():
    agreement = LocalAgreement()
    assert (p := agreement.update("What is")).stable == "" and p.unstable == "What is"
    p = agreement.update("what is the cap")
    assert (p.stable, p.unstable) == ("what is", "the cap")
    p = agreement.update("What is the capital of")
    assert (p.stable, p.unstable) == ("what is the", "capital of")  # settled words keep their spelling
    p = agreement.update("What was")  # a hypothesis that disagrees never takes stable words back
    assert p.stable == "what is the"
    assert agreement.update("What is the capital of France?").stable == "what is the"
    assert agreement.update("What is the capital of France?").unstable == ""


def _run_detector(probs, **rules):
    detector = TurnDetector(TurnDetection(**rules))
    return [(e.kind, e.sample // VAD_WINDOW) for p in probs for e in detector.feed(p)], detector


def test_turn_detector_server_vad_semantics():
    silence_windows = 500 // 32 + 1
    probs = [0.1] * 5 + [0.9] * 20 + [0.1] * silence_windows
    events, detector = _run_detector(probs, type="server_vad", threshold=0.5, silence_duration_ms=500, pause_ms=160)
    assert events == [("speech_started", 5), ("pause", 25), ("speech_stopped", 25)]
    assert not detector.in_speech
    # a dip shorter than the silence duration does not end the turn; hysteresis keeps 0.4 as speech
    probs = [0.9] * 5 + [0.1] * 6 + [0.4] * 3 + [0.9] * 5 + [0.1] * 3
    events, detector = _run_detector(probs, type="server_vad", threshold=0.5, silence_duration_ms=500, pause_ms=160)
    assert [kind for kind, _ in events] == ["speech_started", "pause"]
    assert detector.in_speech and detector.speech_ms() > 500


def test_turn_detector_semantic_vad_ends_a_finished_turn_early_and_an_unfinished_one_late():
    probs = [0.9] * 10 + [0.1] * 10  # 320 ms of silence: past the short wait, far from the long one
    events, detector = _run_detector(probs, type="semantic_vad", eagerness="auto")
    assert [kind for kind, _ in events] == ["speech_started", "pause"] and detector.in_speech
    stop = detector.words_sound_finished()  # the verdict arrives after 200 ms of silence: ends now
    assert stop is not None and stop.kind == "speech_stopped" and stop.sample == 10 * VAD_WINDOW
    # a verdict given early waits for the short silence; new words cancel it
    detector = TurnDetector(TurnDetection(type="semantic_vad", eagerness="auto"))
    for p in [0.9] * 10 + [0.1] * 2:
        detector.feed(p)
    assert detector.words_sound_finished() is None and detector.finished_words
    assert [e.kind for p in [0.9] * 3 for e in detector.feed(p)] == [] and not detector.finished_words
    kinds = [e.kind for _ in range(40) for e in detector.feed(0.1)]  # 1.3 s of silence, no verdict yet
    assert kinds == ["pause"] and detector.in_speech
    assert detector.words_sound_finished(False) is None  # unfinished: on to the eagerness's limit
    assert detector.words_sound_finished(None) is not None  # the engine could not say: server_vad's 500 ms


def test_heard_text_of_a_truncated_item():
    item = ConversationItem("item_1", "assistant", "One two. Three four five six.", audio=True,
                            pieces=[SpokenPiece("One two.", 0, 1000), SpokenPiece("Three four five six.", 1000, 2000)])
    assert item.text_heard_until(0) == ""
    assert item.text_heard_until(500) == "One"
    assert item.text_heard_until(1000) == "One two."
    assert item.text_heard_until(2000) == "One two. Three four"
    assert item.text_heard_until(5000) == "One two. Three four five six."


class _TemplateCounter:
    """Words as tokens, rendered the way a chat template renders them: a fixed header, two
    tokens of markup around each message. Counts the words it is asked to tokenize."""

    max_context_tokens = 30

    def __init__(self) -> None:
        self.words_tokenized = 0

    def count_tokens(self, messages):
        words = sum(len(m["content"].split()) for m in messages)
        self.words_tokenized += words
        return 3 + words + 2 * len(messages)


def test_history_is_trimmed_oldest_first_to_fit_the_context():
    conversation = Conversation()
    for i in range(6):
        conversation.add(ConversationItem(f"u{i}", "user", f"question {i} " + "word " * 3))
        conversation.add(ConversationItem(f"a{i}", "assistant", f"answer {i}"))
    counter = _TemplateCounter()
    # low_water=1: a trim keeps as much as fits (the default cuts deeper, see the next test)
    messages = ContextFitter(counter, low_water=1.0).fit(conversation.messages("be brief"), reply_tokens=10)
    assert messages[0] == {"role": "system", "content": "be brief"}
    assert messages[-1]["content"] == "answer 5"
    assert counter.count_tokens(messages) <= 20
    all_messages = conversation.messages("be brief")
    one_more = all_messages[:1] + all_messages[-len(messages):]  # the kept turns and the one before
    assert counter.count_tokens(one_more) > 20, "the newest turns that fit, and no fewer"
    with pytest.raises(ContextTooLong, match="tokens"):
        ContextFitter(counter).fit([{"role": "user", "content": "word " * 40}], reply_tokens=10)
    assert ContextFitter(counter, context_tokens=20).context_tokens == 20
    assert ContextFitter(counter, context_tokens=4096).context_tokens == 30, "never past the model's context"


def test_a_growing_conversation_keeps_its_prompt_head_between_trims():
    """The engine's prefix cache reuses a prompt's head: the fitter cuts down to half the budget
    when it must, then keeps that head while the turns fit, instead of dropping one turn a turn."""
    counter = _TemplateCounter()
    counter.max_context_tokens = 60
    fitter, conversation = ContextFitter(counter), Conversation()
    heads, trims = [], 0
    for i in range(40):
        conversation.add(ConversationItem(f"u{i}", "user", f"question {i} word"))
        conversation.add(ConversationItem(f"a{i}", "assistant", f"answer {i}"))
        kept = fitter.fit(conversation.messages("be brief"), reply_tokens=10)
        assert counter.count_tokens(kept) <= 50 and kept[-1]["content"] == f"answer {i}"
        trims += bool(heads) and kept[1] != heads[-1]
        heads.append(kept[1])
    assert heads[-1]["content"] != "question 0 word", "the history outgrew the context"
    assert trims <= 40 // 3, f"the head moved {trims} times in 40 turns"
    # a draft's prompt (the pending user words appended) starts at the same head
    draft = fitter.fit(conversation.messages("be brief", pending_user_text="and then"), reply_tokens=10)
    assert draft[1] == heads[-1] or counter.count_tokens(draft) > 50 - 6


def test_a_trim_made_between_turns_is_the_head_the_next_turn_keeps():
    """HeadWarmer's view: right after a reply, the fitter says whether the next turn (a user
    message of up to 6 tokens) would trim, makes that trim then, and the turn's own fit, its
    drafts' and its verdict's keep that head."""
    counter = _TemplateCounter()
    counter.max_context_tokens = 60
    fitter, conversation = ContextFitter(counter), Conversation()
    warmed = []
    for i in range(40):
        conversation.add(ConversationItem(f"u{i}", "user", f"question {i} word"))
        conversation.add(ConversationItem(f"a{i}", "assistant", f"answer {i}"))
        ahead = fitter.trim_ahead(conversation.messages("be brief"), reply_tokens=10, next_message_tokens=6)
        if ahead is not None:
            assert ahead[0]["role"] == "system" and ahead[-1]["content"] == f"answer {i}"
            warmed.append(ahead)
        for pending in ("next one", "next one please"):
            kept = fitter.fit(conversation.messages("be brief", pending_user_text=pending), reply_tokens=10)
            if ahead is not None:
                assert kept[:-1] == ahead, "the turn starts with the head prefilled for it"
    assert len(warmed) >= 3, "the history outgrew the context several times"
    assert fitter.trim_ahead(conversation.messages("be brief"), reply_tokens=10, next_message_tokens=6) is None


def test_fitting_a_long_history_tokenizes_each_message_once():
    """The trim walks a running sum of per-message costs, remembered by text: thousands of
    items cost linear tokenizer work, not a re-render of the whole prompt per dropped turn."""
    counter = _TemplateCounter()
    counter.max_context_tokens = 4096
    fitter = ContextFitter(counter, low_water=1.0)  # as much as fits: a long kept tail
    messages = [{"role": "user" if i % 2 else "assistant", "content": f"turn {i} " + "word " * 200}
                for i in range(2000)]
    history_words = sum(len(m["content"].split()) for m in messages)
    kept = fitter.fit(messages, reply_tokens=64)
    assert kept[-1] == messages[-1] and 10 < len(kept) < 25
    assert counter.words_tokenized <= 3 * history_words + 4 * 4096  # [m, m] and [m] once each, a final check
    counter.words_tokenized = 0
    fitter.fit(messages + [{"role": "user", "content": "one more"}], reply_tokens=64)
    assert counter.words_tokenized <= 3 * 4096, "a redraft re-counts only the kept prompt"


def test_history_is_capped_and_announces_what_it_forgets():
    conversation = Conversation(max_items=10, max_chars=1000)
    in_progress = ConversationItem("speaking", "user", status="in_progress")
    conversation.add(in_progress)
    for i in range(30):
        conversation.add(ConversationItem(f"i{i}", "user", f"message {i}"))
    assert len(conversation.items) == 10 and conversation.items[0] is in_progress, "an item being written stays"
    assert conversation.take_evicted() == [f"i{i}" for i in range(21)] and conversation.take_evicted() == []
    conversation.add(ConversationItem("big", "user", "x" * 995))
    assert [item.id for item in conversation.items] == ["speaking", "big"]


def test_metrics_render_prometheus_text():
    metrics = VoiceMetrics()
    metrics.first_audio_ms.observe(120.0)
    metrics.first_audio_ms.observe(700.0)
    metrics.add_gauge("voice_live_sessions", "live", lambda: 3)
    text = metrics.render()
    assert 'voice_speech_stopped_to_first_audio_ms_bucket{le="150"} 1' in text
    assert 'voice_speech_stopped_to_first_audio_ms_bucket{le="+Inf"} 2' in text
    assert "voice_speech_stopped_to_first_audio_ms_count 2" in text
    assert "voice_live_sessions 3" in text


def test_a_cut_off_reply_shows_the_engine_only_its_whole_sentences():
    conversation = Conversation()
    conversation.add(ConversationItem("item_1", "user", "Tell me a story about a dragon."))
    conversation.add(ConversationItem("item_2", "assistant", "Once upon a time there was a dragon. The dragon, a",
                                      audio=True, status="incomplete"))
    conversation.add(ConversationItem("item_3", "user", "Stop. What is two plus two?"))
    messages = conversation.messages("Be brief.")
    assert messages[2] == {"role": "assistant", "content": "Once upon a time there was a dragon."}
    assert messages[-1] == {"role": "user", "content": "Stop. What is two plus two?"}  # the prompt ends with it
    assert conversation.items[1].text.endswith("The dragon, a")  # the history keeps what was heard
    conversation.items[1].text = "Once upon a"  # cut before the first sentence ended: left out
    assert [m["role"] for m in conversation.messages("Be brief.")] == ["system", "user", "user"]
