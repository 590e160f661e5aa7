"""The Realtime API's beta dialect, for clients written before the GA event names.

A beta client (`OpenAI-Beta: realtime=v1` header, or the browser subprotocol
`openai-beta.realtime-v1`) sends flat session fields (`modalities`, `input_audio_format`,
`turn_detection`, `voice`, ...) and listens for `response.audio.delta`, `response.text.delta`,
`conversation.item.created`. The session speaks GA only; the transport runs each client event
through `client_event_to_ga` and each server event through `server_event_to_beta`.
"""

from __future__ import annotations

import copy
from typing import Any

from voice_app.audio.pcm import WIRE_RATE

BETA_HEADER = "realtime=v1"
BETA_SUBPROTOCOL = "openai-beta.realtime-v1"

# beta audio format names -> GA format objects (anything but pcm16 is then refused by name)
_FORMATS = {"pcm16": {"type": "audio/pcm", "rate": WIRE_RATE}, "g711_ulaw": {"type": "audio/pcmu"},
            "g711_alaw": {"type": "audio/pcma"}}

GA_TO_BETA_EVENT_NAMES = {
    "response.output_audio.delta": "response.audio.delta",
    "response.output_audio.done": "response.audio.done",
    "response.output_audio_transcript.delta": "response.audio_transcript.delta",
    "response.output_audio_transcript.done": "response.audio_transcript.done",
    "response.output_text.delta": "response.text.delta",
    "response.output_text.done": "response.text.done",
    "conversation.item.added": "conversation.item.created",
}
_CONTENT_TYPES = {"output_audio": "audio", "output_text": "text"}


def is_beta_client(headers: dict[str, str], subprotocols: list[str]) -> bool:
    return BETA_HEADER in headers.get("openai-beta", "") or BETA_SUBPROTOCOL in subprotocols


# ---- client -> GA --------------------------------------------------------------------------


def client_event_to_ga(event: Any) -> Any:
    """A beta client event in GA shape (events that are the same in both pass unchanged)."""
    if not isinstance(event, dict):
        return event
    kind = event.get("type")
    if kind == "session.update" and isinstance(event.get("session"), dict):
        return {**event, "session": _session_to_ga(event["session"])}
    if kind == "response.create" and isinstance(event.get("response"), dict):
        return {**event, "response": _options_to_ga(event["response"])}
    return event


def _options_to_ga(options: dict[str, Any]) -> dict[str, Any]:
    ga = {k: v for k, v in options.items() if k not in ("modalities", "max_response_output_tokens")}
    if "modalities" in options:
        ga["output_modalities"] = _modalities_to_ga(options["modalities"])
    if "max_response_output_tokens" in options:
        ga["max_output_tokens"] = options["max_response_output_tokens"]
    return ga


def _modalities_to_ga(modalities: Any) -> Any:
    # beta ["text", "audio"] means spoken replies with a transcript: GA ["audio"]
    if isinstance(modalities, list) and "audio" in modalities:
        return ["audio"]
    return modalities


def _session_to_ga(session: dict[str, Any]) -> dict[str, Any]:
    flat_input = {"input_audio_format", "turn_detection", "input_audio_transcription"}
    flat_output = {"output_audio_format", "voice", "speed"}
    ga = _options_to_ga({k: v for k, v in session.items() if k not in flat_input | flat_output})
    audio_in: dict[str, Any] = {}
    if "input_audio_format" in session:
        audio_in["format"] = _format_to_ga(session["input_audio_format"])
    if "turn_detection" in session:  # an explicit null turns server VAD off
        audio_in["turn_detection"] = session["turn_detection"]
    if session.get("input_audio_transcription") is not None:  # its model is ignored, its language checked
        audio_in["transcription"] = session["input_audio_transcription"]
    audio_out: dict[str, Any] = {}
    if "output_audio_format" in session:
        audio_out["format"] = _format_to_ga(session["output_audio_format"])
    for key in ("voice", "speed"):
        if key in session:
            audio_out[key] = session[key]
    if audio_in or audio_out:
        ga["audio"] = {**({"input": audio_in} if audio_in else {}), **({"output": audio_out} if audio_out else {})}
    return ga


def _format_to_ga(name: Any) -> Any:
    return copy.deepcopy(_FORMATS[name]) if isinstance(name, str) and name in _FORMATS else {"type": str(name)}


# ---- GA -> beta ----------------------------------------------------------------------------


def server_event_to_beta(event: dict[str, Any]) -> dict[str, Any]:
    """A GA server event as a beta client expects it."""
    beta = dict(event)
    beta["type"] = GA_TO_BETA_EVENT_NAMES.get(event["type"], event["type"])
    if isinstance(beta.get("session"), dict):
        beta["session"] = _session_to_beta(beta["session"])
    if isinstance(beta.get("response"), dict):
        beta["response"] = _response_to_beta(beta["response"])
    if isinstance(beta.get("item"), dict):
        beta["item"] = _item_to_beta(beta["item"])
    if isinstance(beta.get("part"), dict):
        beta["part"] = _part_to_beta(beta["part"])
    return beta


def _part_to_beta(part: dict[str, Any]) -> dict[str, Any]:
    return {**part, "type": _CONTENT_TYPES.get(part.get("type"), part.get("type"))}


def _item_to_beta(item: dict[str, Any]) -> dict[str, Any]:
    return {**item, "content": [_part_to_beta(p) for p in item.get("content", [])]}


def _response_to_beta(response: dict[str, Any]) -> dict[str, Any]:
    beta = {k: v for k, v in response.items() if k != "output_modalities"}
    if "output_modalities" in response:
        beta["modalities"] = ["text", "audio"] if "audio" in response["output_modalities"] else ["text"]
    if isinstance(response.get("output"), list):
        beta["output"] = [_item_to_beta(item) for item in response["output"]]
    return beta


def _session_to_beta(session: dict[str, Any]) -> dict[str, Any]:
    audio = session.get("audio", {})
    audio_in, audio_out = audio.get("input", {}), audio.get("output", {})
    return {
        "id": session.get("id"), "object": "realtime.session", "model": session.get("model"),
        "modalities": ["text", "audio"] if "audio" in session.get("output_modalities", []) else ["text"],
        "instructions": session.get("instructions"),
        "voice": audio_out.get("voice"), "speed": audio_out.get("speed"),
        "input_audio_format": "pcm16", "output_audio_format": "pcm16",
        "input_audio_transcription": audio_in.get("transcription"),
        "turn_detection": audio_in.get("turn_detection"),
        "max_response_output_tokens": session.get("max_output_tokens"),
    }
