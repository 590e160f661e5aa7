"""The protocol fuzz corpus (voice_app/loadtest/fuzz.py runs it): every client event type mutated
(fields missing, of the wrong type, unknown, nested 100,000 deep, 5,000-digit numbers), the
edge cases a review found (empty and huge instructions, odd, empty, 6 MiB and 16 MiB audio, a
whole utterance in one append, 2,000 history items, back-to-back commits, 50 response.create in
a row) and malformed frames; each case with the check its events must pass.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from voice_app.audio.pcm import WIRE_RATE

Frame = str | bytes
DEEP = 100_000  # nesting levels (json's C scanner recurses once per level)
HUGE_DIGITS = 5_000  # over Python's 4,300-digit int conversion limit
MIB = 1024 * 1024
BETA_HEADERS = {"OpenAI-Beta": "realtime=v1"}
TRANSCRIBED = "conversation.item.input_audio_transcription.completed"

TEMPLATES: dict[str, dict[str, Any]] = {  # one valid event of each client type
    "session.update": {"type": "session.update", "session": {"type": "realtime", "instructions": "Be brief."}},
    "input_audio_buffer.append": {"type": "input_audio_buffer.append", "audio": base64.b64encode(bytes(4800)).decode()},
    "input_audio_buffer.commit": {"type": "input_audio_buffer.commit"},
    "input_audio_buffer.clear": {"type": "input_audio_buffer.clear"},
    "conversation.item.create": {"type": "conversation.item.create", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hello."}]}},
    "conversation.item.truncate": {"type": "conversation.item.truncate", "item_id": "item_x", "content_index": 0,
                                   "audio_end_ms": 100},
    "response.create": {"type": "response.create", "response": {"output_modalities": ["text"], "max_output_tokens": 8}},
    "response.cancel": {"type": "response.cancel", "response_id": "resp_x"},
    "output_audio_buffer.clear": {"type": "output_audio_buffer.clear"},
    "conversation.item.retrieve": {"type": "conversation.item.retrieve", "item_id": "item_x"},
    "conversation.item.delete": {"type": "conversation.item.delete", "item_id": "item_x"},
}
TEMPLATES = {kind: {**event, "event_id": f"fuzz-{kind}"} for kind, event in TEMPLATES.items()}
REQUIRED = {"session.update": ["session"], "input_audio_buffer.append": ["audio"],
            "conversation.item.create": ["item"], "conversation.item.truncate": ["item_id", "audio_end_ms"],
            "conversation.item.retrieve": ["item_id"], "conversation.item.delete": ["item_id"]}
WRONG = {str: [12345, {"a": 1}], int: ["twelve", [1]], dict: ["x", []]}  # values no field of that type takes


@dataclass
class FuzzCase:
    name: str
    frames: Callable[[], list[Frame]]  # built when run: some are 16 MiB
    must_error: bool = False  # at least one of its frames must be answered by an error event
    check: Callable[[list[dict[str, Any]]], str | None] | None = None  # more to verify: why not, or None
    beta: bool = False
    timeout_s: float = 120.0
    settle_on: str | None = None  # an event type the case's own outcome ends with: awaited before the probe


def dumps(event: Any) -> str:
    return json.dumps(event)


def tagged(event: dict[str, Any], event_id: str) -> dict[str, Any]:
    return {**event, "event_id": event_id}


# ---- the corpus ----------------------------------------------------------------------------


def corpus(utterance: np.ndarray) -> list[FuzzCase]:
    """Every case in the GA dialect, then again as a beta client. `utterance`: PCM16 24 kHz speech."""
    ga = mutated_events() + edge_cases(utterance) + malformed_frames()
    beta = [dataclasses.replace(case, name=f"beta/{case.name}", beta=True) for case in ga]
    return ga + beta


def mutated_events() -> list[FuzzCase]:
    cases = []
    for kind, template in TEMPLATES.items():
        first = next((name for name in template if name != "type"), "event_id")
        cases += [
            FuzzCase(f"{kind}/unknown_field", lambda t=template: [dumps({**t, "x_unknown": {"a": [1, {"b": None}]}})]),
            FuzzCase(f"{kind}/deep_nesting", lambda k=kind, f=first: [
                f'{{"type": "{k}", "{f}": ' + "[" * DEEP + "]" * DEEP + "}"], must_error=True),
            FuzzCase(f"{kind}/huge_integer", lambda k=kind, f=first: [
                f'{{"type": "{k}", "{f}": {"9" * HUGE_DIGITS}}}'], must_error=True),
        ]
        for name in REQUIRED.get(kind, []):
            cases.append(FuzzCase(f"{kind}/missing_{name}", lambda t=template, n=name: [
                dumps({k: v for k, v in t.items() if k != n})], must_error=True))
        for name, value in template.items():
            if name == "type":
                continue
            for number, wrong in enumerate(WRONG[type(value)]):
                cases.append(FuzzCase(f"{kind}/wrong_type_{name}_{number}", lambda t=template, n=name, w=wrong: [
                    dumps({**t, n: w})], must_error=True))
    return cases


def edge_cases(utterance: np.ndarray) -> list[FuzzCase]:
    speech = np.concatenate([utterance, np.zeros(WIRE_RATE, dtype=np.int16)])  # then 1 s of silence
    create = TEMPLATES["conversation.item.create"]
    text_reply = TEMPLATES["response.create"]
    vad_off = {"type": "session.update", "session": {"type": "realtime", "audio": {"input": {"turn_detection": None}}}}
    return [
        FuzzCase("instructions/empty_on_a_fresh_session", lambda: [
            dumps({"type": "response.create", "response": {"instructions": ""}})], must_error=True),
        FuzzCase("instructions/over_20000_chars", lambda: [
            dumps({"type": "response.create", "response": {"instructions": "x" * 20001}})], must_error=True),
        FuzzCase("instructions/15000_chars", lambda: [dumps(create), dumps(
            {"type": "response.create", "response": {"instructions": "Be brief. " * 1500, "output_modalities": ["text"],
                                                     "max_output_tokens": 8}})]),
        FuzzCase("audio/odd_length", lambda: [append_frame(b"\x00\x01\x02")], must_error=True),
        FuzzCase("audio/empty", lambda: [append_frame(b"")]),
        FuzzCase("audio/not_base64", lambda: [dumps({"type": "input_audio_buffer.append", "audio": "%%%"})],
                 must_error=True),
        FuzzCase("audio/6_MiB_append", lambda: [append_frame(np.concatenate(
            [np.zeros(int(6 * MIB * 3 / 8) - len(speech), dtype=np.int16), speech]).astype("<i2").tobytes())]),
        FuzzCase("audio/16_MiB_message", lambda: [dumps({"type": "input_audio_buffer.append",
                                                         "audio": "A" * (16 * MIB)})], must_error=True),
        FuzzCase("audio/whole_utterance_in_one_append", lambda: [append_frame(speech.astype("<i2").tobytes())],
                 check=heard_the_utterance, settle_on=TRANSCRIBED),
        FuzzCase("audio/two_commits_back_to_back", lambda: [
            dumps(vad_off), append_frame(speech.astype("<i2").tobytes()),
            dumps(TEMPLATES["input_audio_buffer.commit"]), dumps(TEMPLATES["input_audio_buffer.commit"])],
            must_error=True, check=one_item_committed, settle_on=TRANSCRIBED),
        FuzzCase("history/2000_items_of_8_KB", lambda: [
            dumps({**create, "item": {**create["item"], "content": [{"type": "input_text", "text": f"{i} " + "note " * 1600}]}})
            for i in range(2000)] + [dumps(text_reply)], timeout_s=300),
        FuzzCase("response/50_creates_in_a_row", lambda: [dumps(create)] + [dumps(text_reply)] * 50, must_error=True),
        FuzzCase("response/max_output_tokens_50_digits", lambda: [dumps(
            {"type": "response.create", "response": {"max_output_tokens": 10 ** 50}})], must_error=True),
        FuzzCase("session/rate_16000", lambda: [dumps({"type": "session.update", "session": {
            "type": "realtime", "audio": {"input": {"format": {"type": "audio/pcm", "rate": 16000}}}}})],
            must_error=True),
        FuzzCase("session/speed_10", lambda: [dumps({"type": "session.update", "session": {
            "type": "realtime", "audio": {"output": {"speed": 10}}}})], must_error=True),
        FuzzCase("session/max_output_tokens_0", lambda: [dumps({"type": "session.update", "session": {
            "type": "realtime", "max_output_tokens": 0}})], must_error=True),
        FuzzCase("session/one_bad_setting_among_good_ones", lambda: [dumps({"type": "session.update", "session": {
            "type": "realtime", "instructions": "Be brief.", "tracing": "auto", "tools": [{"type": "function", "name": "f"}],
            "audio": {"output": {"speed": 10, "voice": "ash"}}}})], must_error=True, check=applied_the_good_settings,
            settle_on="session.updated"),
        FuzzCase("session/vad_off_then_commit_nothing", lambda: [
            dumps(vad_off), dumps(TEMPLATES["input_audio_buffer.commit"])], must_error=True),
        FuzzCase("truncate/unknown_item", lambda: [dumps(TEMPLATES["conversation.item.truncate"])], must_error=True),
        FuzzCase("truncate/negative_audio_end", lambda: [dumps({**TEMPLATES["conversation.item.truncate"],
                                                                "audio_end_ms": -1})], must_error=True),
    ]


def malformed_frames() -> list[FuzzCase]:
    raw = {"not_json": "{this is not json", "empty": "", "array": "[1, 2]", "string": '"hello"', "null": "null",
           "number": "42", "no_type": '{"event_id": "e"}', "unknown_type": '{"type": "response.dance"}'}
    cases = [FuzzCase(f"frame/{name}", lambda text=text: [text], must_error=True) for name, text in raw.items()]
    return cases + [FuzzCase("frame/binary", lambda: [b"\x00\x01\x02"], must_error=True)]


def append_frame(pcm: bytes) -> str:
    return dumps({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm).decode()})


def heard_the_utterance(events: list[dict[str, Any]]) -> str | None:
    transcripts = [e["transcript"] for e in events
                   if e.get("type") == "conversation.item.input_audio_transcription.completed"]
    return None if any(t.strip() for t in transcripts) else f"no transcript of the utterance: {transcripts!r}"


def applied_the_good_settings(events: list[dict[str, Any]]) -> str | None:
    updated = [e for e in events if e.get("type") == "session.updated"]
    if not updated:
        return "no session.updated after a partly refused session.update"
    session = updated[-1]["session"]
    voice = (session.get("audio") or {}).get("output", {}).get("voice", session.get("voice"))
    return None if session.get("instructions") == "Be brief." and voice == "ash" else f"not applied: {session!r}"


def one_item_committed(events: list[dict[str, Any]]) -> str | None:
    committed = [e for e in events if e.get("type") == "input_audio_buffer.committed"]
    return None if len(committed) == 1 else f"{len(committed)} items committed for one buffer"
