"""Client event validation: every bad input names what was wrong."""

from __future__ import annotations

import json

import pytest

from voice_app.events.protocol import (CLIENT_EVENT_TYPES, InputAudioBufferAppend, ProtocolError,
                                         SessionUpdate, parse_client_event, with_x_events)
from voice_app.events.session_config import applied_settings, session_config


def _error(raw: str | bytes, max_bytes: int = 10000) -> ProtocolError:
    with pytest.raises(ProtocolError) as info:
        parse_client_event(raw, max_bytes)
    return info.value


def test_the_subset_of_realtime_client_events():
    assert set(CLIENT_EVENT_TYPES) == {
        "session.update", "input_audio_buffer.append", "input_audio_buffer.commit", "input_audio_buffer.clear",
        "conversation.item.create", "response.create", "response.cancel", "conversation.item.truncate",
        "output_audio_buffer.clear", "conversation.item.retrieve", "conversation.item.delete"}


def test_valid_events_parse_and_ignore_extra_fields():
    event = parse_client_event(json.dumps({"type": "input_audio_buffer.append", "audio": "AAAA",
                                           "event_id": "e1", "something_new": 1}), 10000)
    assert isinstance(event, InputAudioBufferAppend) and event.event_id == "e1"
    update = parse_client_event(json.dumps({"type": "session.update", "session": {
        "type": "realtime", "instructions": "Be terse.",
        "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24000},
                            "turn_detection": {"type": "server_vad", "threshold": 0.6, "silence_duration_ms": 400}},
                  "output": {"voice": "alloy"}}}}), 10000)
    assert isinstance(update, SessionUpdate)
    config, refused = session_config(update.session)
    assert config.audio.input.turn_detection.threshold == 0.6 and refused == []


@pytest.mark.parametrize("raw, code, words", [
    ("{not json", "invalid_json", "not valid JSON"),
    ("[1, 2]", "invalid_event", "JSON object"),
    ('{"no_type": 1}', "invalid_event", "'type'"),
    ('{"type": "response.dance"}', "unknown_event", "unknown event type 'response.dance'"),
    ('{"type": "input_audio_buffer.append"}', "invalid_value", "audio"),
    ('{"type": "conversation.item.truncate", "item_id": "x", "audio_end_ms": -5}', "invalid_value", "audio_end_ms"),
    ('{"type": "session.update", "session": "realtime"}', "invalid_value", "session"),
    ('{"type": "conversation.item.retrieve"}', "invalid_value", "item_id"),
    ('{"type": "response.create", "response": {"conversation": "other"}}', "invalid_value", "conversation"),
    ('{"type": "response.create", "response": {"input": [{"type": "item_reference"}]}}', "invalid_value", "id"),
    ('{"type": "response.create", "response": {"tools": [{"type": "function", "name": "f"}]}}', "unsupported_value",
     "function calling is not supported"),
    ('{"type": "response.create", "response": {"tool_choice": "required"}}', "unsupported_value", "tool_choice"),
])
def test_bad_events_are_named(raw, code, words):
    error = _error(raw)
    assert error.code == code
    assert words in error.message


def test_oversized_message_is_refused_before_parsing():
    error = _error("x" * 20000, max_bytes=10000)
    assert error.code == "message_too_large" and "10000" in error.message


def test_size_counts_utf8_bytes_and_unparseable_json_is_named():
    text = json.dumps({"type": "input_audio_buffer.append", "audio": "A"}, ensure_ascii=False)[:-1] + ', "n": "ü€"}'
    assert parse_client_event(text, len(text.encode())).type == "input_audio_buffer.append"
    error = _error(text, max_bytes=len(text) + 1)  # fits in characters, not in bytes
    assert error.code == "message_too_large" and f"{len(text.encode())} bytes" in error.message
    assert "nested too deeply" in _error("[" * 100_000 + "]" * 100_000, 10 ** 6).message
    assert "4300 digits" in _error('{"n": ' + "9" * 5000 + "}", 10 ** 6).message


def test_an_item_holds_at_most_its_text_limit():
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "x" * 60_000}] * 2}
    error = _error(json.dumps({"type": "conversation.item.create", "item": item}), 10 ** 6)
    assert error.param == "item.content" and "120000 characters" in error.message


def test_a_session_update_keeps_every_setting_it_can_and_names_the_refused_ones():
    config, refused = session_config({
        "type": "realtime", "model": "gpt-realtime", "instructions": "Be terse.", "tracing": "auto",
        "include": ["item.input_audio_transcription.logprobs"], "truncation": "auto", "tools": [],
        "tool_choice": "auto",
        "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000},
                            "noise_reduction": {"type": "near_field"},
                            "transcription": {"model": "gpt-4o-mini-transcribe", "language": "en"},
                            "turn_detection": {"type": "server_vad", "threshold": 2}},
                  "output": {"voice": "ash", "speed": 10}}})
    assert {r.param for r in refused} == {"audio.input.format", "audio.input.turn_detection", "audio.output.speed"}
    assert not any(r.unsupported for r in refused)
    assert "rate" in next(r.message for r in refused if r.param == "audio.input.format")
    assert config.instructions == "Be terse." and config.audio.output.voice == "ash"
    assert "turn_detection" not in config.audio.input.model_fields_set  # refused: left as it was
    assert applied_settings(config) == ["instructions", "audio.input.transcription", "audio.output.voice"]


def test_what_a_voice_conversation_cannot_do_is_refused_as_unsupported():
    config, refused = session_config({
        "instructions": "Hi.", "tools": [{"type": "function", "name": "weather"}], "tool_choice": "required",
        "prompt": {"id": "pmpt_1"}, "audio": {"input": {"transcription": {"language": "fr"}}}})
    assert {r.param: r.unsupported for r in refused} == {
        "tools": True, "tool_choice": True, "prompt": True, "audio.input.transcription": True}
    assert "function calling" in next(r.message for r in refused if r.param == "tools")
    assert config.instructions == "Hi."
    # odd shapes are refused field by field too
    config, refused = session_config({"audio": "loud", "output_modalities": ["video"], "instructions": "Ok."})
    assert {r.param for r in refused} == {"audio", "output_modalities"} and config.instructions == "Ok."


def test_x_events_are_asked_for_in_the_url():
    assert with_x_events("ws://h:1/v1/realtime") == "ws://h:1/v1/realtime?x_events=1"
    assert with_x_events("ws://h:1/v1/realtime?model=m&x_events=0") == "ws://h:1/v1/realtime?model=m&x_events=1"
