"""The chat completion request's validation (the real server's answers are in test_chat_api.py)."""

from __future__ import annotations

import json

import pytest

from voice_app.realtime.chat_request import ApiError, parse_chat_request

USER = [{"role": "user", "content": "Hi"}]


def parse(**fields):
    return parse_chat_request(json.dumps({"model": "m", "messages": USER, **fields}).encode(), max_tokens_cap=1024)


def refusal(**fields) -> ApiError:
    with pytest.raises(ApiError) as caught:
        parse(**fields)
    return caught.value


def test_defaults_and_accepted_fields():
    chat = parse()
    assert (chat.max_tokens, chat.temperature, chat.seed, chat.stop, chat.n, chat.stream) == (None, 0.0, None, (), 1, False)
    chat = parse(max_tokens=5, max_completion_tokens=7, temperature=0.5, top_p=1, seed=3, stop="END", n=2,
                 stream=True, stream_options={"include_usage": True}, x_deadline_s=0.5, user="u", logprobs=False,
                 frequency_penalty=0, tools=None)
    assert (chat.max_tokens, chat.temperature, chat.seed, chat.stop, chat.n) == (7, 0.5, 3, ("END",), 2)
    assert chat.include_usage and chat.deadline_s == 0.5


def test_messages_roles_and_text_parts():
    chat = parse(messages=[{"role": "developer", "content": "Be brief."},
                           {"role": "user", "content": [{"type": "text", "text": "Hello "}, {"type": "text", "text": "there"}]},
                           {"role": "assistant", "content": "Hi!", "name": "bot"}])
    assert chat.messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"},
                             {"role": "assistant", "content": "Hi!"}]


@pytest.mark.parametrize("fields, param, words", [
    ({"messages": None}, "messages", "required"),
    ({"messages": "Hi"}, "messages", "must be a list"),
    ({"messages": []}, "messages", "empty"),
    ({"messages": ["Hi"]}, "messages[0]", "must be an object"),
    ({"messages": [{"content": "Hi"}]}, "messages[0].role", "no `role`"),
    ({"messages": [{"role": "robot", "content": "Hi"}]}, "messages[0].role", '"robot"'),
    ({"messages": [{"role": "tool", "content": "Hi"}]}, "messages[0].role", "no tools"),
    ({"messages": [{"role": "user"}]}, "messages[0].content", "no `content`"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content", "string or a list"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     "messages[0].content[0]", "only text parts"),
    ({"model": ""}, "model", "model"),
    ({"max_tokens": -1}, "max_tokens", "at least 1"),
    ({"max_tokens": 0}, "max_tokens", "at least 1"),
    ({"max_completion_tokens": 100000}, "max_completion_tokens", "too large"),
    ({"max_tokens": "ten"}, "max_tokens", "integer"),
    ({"max_tokens": 2.5}, "max_tokens", "integer"),
    ({"temperature": 3}, "temperature", "0.0..2.0"),
    ({"temperature": True}, "temperature", "number"),
    ({"top_p": 0.9}, "top_p", "not supported"),
    ({"n": 0}, "n", "1..8"),
    ({"n": 9}, "n", "1..8"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop", "at most 4"),
    ({"stop": [""]}, "stop", "empty"),
    ({"stop": 5}, "stop", "string or a list"),
    ({"stream": "yes"}, "stream", "true or false"),
    ({"stream_options": {"include_usage": True}}, "stream_options", "only allowed when stream is true"),
    ({"x_deadline_s": 0}, "x_deadline_s", "> 0"),
    ({"logprobs": True}, "logprobs", "not supported"),
    ({"tools": [{"type": "function"}]}, "tools", "not supported"),
    ({"response_format": {"type": "json_object"}}, "response_format", "not supported"),
    ({"frobnicate": 1}, "frobnicate", "Unrecognized"),
])
def test_each_bad_field_is_named(fields, param, words):
    error = refusal(**fields)
    assert (error.status, error.param) == (400, param)
    assert words in error.message
    assert set(error.body()["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("raw, words", [(b"", "empty"), (b"  ", "empty"), (b"{oops", "not valid JSON"),
                                        (b"[1]", "must be a JSON object"), (b"\xff", "not valid JSON")])
def test_unreadable_bodies(raw, words):
    with pytest.raises(ApiError) as caught:
        parse_chat_request(raw, max_tokens_cap=1024)
    assert caught.value.status == 400 and words in caught.value.message
