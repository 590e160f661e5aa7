"""The wire protocol, in one place: client events we accept (pydantic models) and builders for
the server events we send. Names and shapes follow the OpenAI Realtime API (GA); our own
additions are named `x_...`. docs/protocol.md documents every event."""

from __future__ import annotations

import copy
import itertools
import json
from dataclasses import dataclass
from typing import Annotated, Any, Callable, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator
from pydantic_core import PydanticCustomError

CLOSE_TRY_AGAIN_LATER = 1013  # the websocket close code for "at capacity, retry later"
MAX_ITEM_TEXT_CHARS = 100_000  # of one conversation item, all its content parts together
MAX_CONTENT_PARTS = 16
MAX_INPUT_ITEMS = 64  # of one response.create's `input`


class ProtocolError(Exception):
    """A client event we cannot act on; becomes an `error` event, and the session goes on."""

    def __init__(self, code: str, message: str, param: str | None = None, event_id: str | None = None,
                 kind: str = "invalid_request_error"):
        super().__init__(message)
        self.code, self.message, self.param, self.event_id = code, message, param, event_id
        self.kind = kind  # the error event's `type`: invalid_request_error, or server_error for our faults


class _Event(BaseModel):
    # Unknown fields are ignored (clients send more than we use); known ones are type-checked.
    model_config = ConfigDict(extra="ignore")
    event_id: str | None = None


# ---- session configuration --------------------------------------------------------------


class AudioFormat(BaseModel):
    type: Literal["audio/pcm"] = "audio/pcm"
    rate: Literal[24000] = 24000


class ServerVad(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["server_vad"] = "server_vad"
    threshold: float | None = Field(None, gt=0.0, lt=1.0)
    prefix_padding_ms: int | None = Field(None, ge=0, le=5000)
    silence_duration_ms: int | None = Field(None, ge=32, le=10000)
    create_response: bool | None = None
    interrupt_response: bool | None = None


class SemanticVad(BaseModel):
    """The turn ends when the words sound finished (the LLM judges them) and a short silence
    follows; `eagerness` sets how long an unfinished-sounding turn may pause."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["semantic_vad"] = "semantic_vad"
    eagerness: Literal["low", "medium", "high", "auto"] | None = None
    create_response: bool | None = None
    interrupt_response: bool | None = None


TurnDetectionConfig = Annotated[Union[ServerVad, SemanticVad], Field(discriminator="type")]


def unsupported(message: str) -> PydanticCustomError:
    """A value that is well formed but asks for something this server cannot do."""
    return PydanticCustomError("unsupported", message)


class Transcription(BaseModel):
    """The input transcription's settings: any `model` name is accepted (the server's Whisper
    transcribes whatever is asked), `prompt` is ignored; Whisper here hears English only."""

    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    language: str | None = None

    @field_validator("language")
    @classmethod
    def _english(cls, language: str | None) -> str | None:
        if language and language.lower() not in ("en", "en-us", "en-gb", "english"):
            raise unsupported(f"the server's transcriber hears English only, not {language[:20]!r}")
        return language


class AudioInputConfig(BaseModel):
    # noise_reduction is accepted and ignored (the VAD and Whisper take the audio as it comes)
    model_config = ConfigDict(extra="ignore")
    format: AudioFormat | None = None
    # explicit null switches turn detection off (the client commits by hand); absent: unchanged
    turn_detection: TurnDetectionConfig | None = None
    transcription: Transcription | None = None


class AudioOutputConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")
    format: AudioFormat | None = None
    voice: str | None = None
    speed: float | None = Field(None, ge=0.25, le=4.0)


class AudioConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")
    input: AudioInputConfig | None = None
    output: AudioOutputConfig | None = None


def no_tools(tools: list[Any] | None) -> list[Any] | None:
    if tools:
        raise unsupported("function calling is not supported: the voice model cannot call tools, so "
                          f"the {len(tools)} tool(s) were not registered")
    return tools


def no_forced_tool(choice: Any) -> Any:
    if choice not in (None, "auto", "none"):
        raise unsupported("function calling is not supported: tool_choice can only be 'auto' or 'none'")
    return choice


class SessionConfig(BaseModel):
    """The settings a session.update may change. Fields a voice conversation can do without are
    accepted and ignored (model, tracing, include, truncation, temperature, noise_reduction,
    parallel_tool_calls, reasoning); `tools` must be empty, `tool_choice` 'auto'/'none' and
    `prompt` (a prompt stored at OpenAI) absent."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["realtime"] = "realtime"
    instructions: str | None = Field(None, max_length=20000)
    output_modalities: list[Literal["text", "audio"]] | None = None
    audio: AudioConfig | None = None
    max_output_tokens: int | Literal["inf"] | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    prompt: Any = None
    x_events: bool | None = None  # ours: send the x_... events to this client (docs/protocol.md)

    @field_validator("tools")
    @classmethod
    def _no_tools(cls, tools: list[Any] | None) -> list[Any] | None:
        return no_tools(tools)

    @field_validator("tool_choice")
    @classmethod
    def _no_forced_tool(cls, choice: Any) -> Any:
        return no_forced_tool(choice)

    @field_validator("prompt")
    @classmethod
    def _no_stored_prompt(cls, prompt: Any) -> Any:
        if prompt is not None:
            raise unsupported("stored prompts live on OpenAI's servers; send the text as `instructions`")
        return prompt


@dataclass
class Refusal:
    """One setting of a session.update that was not applied, and why."""

    param: str  # its path, e.g. "audio.input.format"
    message: str
    unsupported: bool = False  # well formed, but not something this server does


def _setting_path(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """The setting an error is about: a top-level field, or audio.input.X / audio.output.X."""
    return tuple(loc[:3]) if loc and loc[0] == "audio" else tuple(loc[:1])


def _remove(data: dict[str, Any], path: tuple[Any, ...]) -> bool:
    node: Any = data
    for key in path[:-1]:
        node = node.get(key) if isinstance(node, dict) else None
    if isinstance(node, dict) and path and path[-1] in node:
        del node[path[-1]]
        return True
    return False


def _described(error: dict[str, Any]) -> str:
    got = error.get("input")
    shown = f" (got {got!r})" if isinstance(got, (str, int, float, bool)) and len(repr(got)) <= 80 else ""
    inner = ".".join(str(part) for part in error["loc"][len(_setting_path(error["loc"])):])
    return f"{inner + ': ' if inner else ''}{error['msg']}{shown}"


def session_config(raw: dict[str, Any]) -> tuple[SessionConfig, list[Refusal]]:
    """A session.update's `session` as the settings that can be applied, and the ones refused:
    a setting that is invalid or unsupported is left out, never the whole update."""
    data = copy.deepcopy(raw)
    refused: list[Refusal] = []
    for _ in range(64):  # each round removes at least one setting
        try:
            return SessionConfig.model_validate(data), refused
        except ValidationError as exc:
            removed = False
            for error in exc.errors():
                path = _setting_path(error["loc"])
                if _remove(data, path):
                    removed = True
                    refused.append(Refusal(".".join(str(k) for k in path), _described(error),
                                           error["type"] == "unsupported"))
            if not removed:
                break
    return SessionConfig(), refused + [Refusal("session", "the settings could not be read")]


def applied_settings(config: SessionConfig) -> list[str]:
    """The settings a validated session.update sets, as paths (for the client's error message)."""
    names = [name for name in ("instructions", "output_modalities", "max_output_tokens", "x_events")
             if getattr(config, name) is not None]
    for side in ("input", "output"):
        part = getattr(config.audio, side, None) if config.audio is not None else None
        if part is not None:
            names += [f"audio.{side}.{name}" for name in sorted(part.model_fields_set)]
    return names


# ---- client events ----------------------------------------------------------------------


class SessionUpdate(_Event):
    type: Literal["session.update"]
    # validated setting by setting (session_config): one refused value never drops the rest
    session: dict[str, Any]


class InputAudioBufferAppend(_Event):
    type: Literal["input_audio_buffer.append"]
    audio: str


class InputAudioBufferCommit(_Event):
    type: Literal["input_audio_buffer.commit"]


class InputAudioBufferClear(_Event):
    type: Literal["input_audio_buffer.clear"]


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")
    type: Literal["input_text", "output_text", "text"]
    text: str = Field(max_length=MAX_ITEM_TEXT_CHARS)


class MessageItem(BaseModel):
    model_config = ConfigDict(extra="ignore")
    id: str | None = Field(None, max_length=64)
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system"]
    content: list[ContentPart] = Field(min_length=1, max_length=MAX_CONTENT_PARTS)

    @field_validator("content")
    @classmethod
    def _text_fits(cls, content: list[ContentPart]) -> list[ContentPart]:
        chars = sum(len(part.text) for part in content)
        if chars > MAX_ITEM_TEXT_CHARS:
            raise ValueError(f"the item's text is {chars} characters; at most {MAX_ITEM_TEXT_CHARS} are allowed")
        return content

    @property
    def text(self) -> str:
        return " ".join(part.text for part in self.content).strip()


class ConversationItemCreate(_Event):
    type: Literal["conversation.item.create"]
    previous_item_id: str | None = None
    item: MessageItem


class ItemReference(BaseModel):
    """An item of the conversation, by id, in a response's `input`."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["item_reference"]
    id: str = Field(max_length=64)


InputItem = Annotated[Union[MessageItem, ItemReference], Field(discriminator="type")]


class ResponseOptions(BaseModel):
    """response.create's `response`. `voice`, `audio`, `temperature` and the like are ignored."""

    model_config = ConfigDict(extra="ignore")
    instructions: str | None = Field(None, max_length=20000)
    output_modalities: list[Literal["text", "audio"]] | None = None
    max_output_tokens: int | Literal["inf"] | None = None
    # echoed in response.created / response.done (LiveKit finds its generate_reply by it)
    metadata: dict[str, str] | None = Field(None, max_length=16)
    # "none": an out-of-band reply, kept out of the conversation
    conversation: Literal["auto", "none"] | None = None
    # the prompt's items instead of the conversation's (messages, or references to its items)
    input: list[InputItem] | None = Field(None, max_length=MAX_INPUT_ITEMS)
    tools: list[Any] | None = None
    tool_choice: Any = None

    @field_validator("metadata")
    @classmethod
    def _metadata_fits(cls, metadata: dict[str, str] | None) -> dict[str, str] | None:
        for key, value in (metadata or {}).items():
            if len(key) > 64 or len(value) > 512:
                raise ValueError("metadata keys are at most 64 characters and values at most 512")
        return metadata

    @field_validator("tools")
    @classmethod
    def _no_tools(cls, tools: list[Any] | None) -> list[Any] | None:
        return no_tools(tools)

    @field_validator("tool_choice")
    @classmethod
    def _no_forced_tool(cls, choice: Any) -> Any:
        return no_forced_tool(choice)


class ResponseCreate(_Event):
    type: Literal["response.create"]
    response: ResponseOptions | None = None


class ResponseCancel(_Event):
    type: Literal["response.cancel"]
    response_id: str | None = None


class ConversationItemTruncate(_Event):
    type: Literal["conversation.item.truncate"]
    item_id: str
    content_index: int = Field(0, ge=0)
    audio_end_ms: int = Field(ge=0, le=24 * 3600 * 1000)


class OutputAudioBufferClear(_Event):
    type: Literal["output_audio_buffer.clear"]


class ConversationItemRetrieve(_Event):
    type: Literal["conversation.item.retrieve"]
    item_id: str = Field(max_length=64)


class ConversationItemDelete(_Event):
    type: Literal["conversation.item.delete"]
    item_id: str = Field(max_length=64)


ClientEvent = Annotated[
    Union[
        SessionUpdate, InputAudioBufferAppend, InputAudioBufferCommit, InputAudioBufferClear,
        ConversationItemCreate, ResponseCreate, ResponseCancel, ConversationItemTruncate,
        OutputAudioBufferClear, ConversationItemRetrieve, ConversationItemDelete,
    ],
    Field(discriminator="type"),
]
_client_event = TypeAdapter(ClientEvent)
CLIENT_EVENT_TYPES = sorted(
    model.model_fields["type"].annotation.__args__[0]  # the Literal's one value
    for model in ClientEvent.__origin__.__args__  # type: ignore[attr-defined]
)


X_EVENTS_PARAM = "x_events"  # ?x_events=1 on the websocket URL: this client wants our x_... events


def wants_x_events(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def with_x_events(url: str) -> str:
    """A realtime URL that asks for the x_... events (our own clients: the page, tests, load)."""
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != X_EVENTS_PARAM]
    return urlunsplit(parts._replace(query=urlencode(query + [(X_EVENTS_PARAM, "1")])))


def utf8_size(raw: str | bytes) -> int:
    """The message's size on the wire: UTF-8 bytes, not characters."""
    if isinstance(raw, bytes) or raw.isascii():
        return len(raw)
    return len(raw.encode("utf-8", "surrogatepass"))


def parse_client_event(raw: str | bytes, max_bytes: int,
                       translate: Callable[[Any], Any] | None = None) -> BaseModel:
    """Wire text -> a validated client event model, or ProtocolError naming what was wrong.
    translate: applied to the parsed JSON first (a client dialect's fields -> ours)."""
    size = utf8_size(raw)
    if size > max_bytes:
        raise ProtocolError("message_too_large", f"message of {size} bytes exceeds the limit of {max_bytes} bytes")
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ProtocolError("invalid_json", f"message is not valid JSON: {exc}") from exc
    except RecursionError as exc:  # json's C scanner recurses once per nesting level
        raise ProtocolError("invalid_json", "message is nested too deeply to parse") from exc
    except ValueError as exc:  # e.g. an integer longer than Python converts (4300 digits)
        raise ProtocolError("invalid_json", f"message holds a value that cannot be parsed: {exc}") from exc
    return validate_client_event(translate(data) if translate is not None else data)


def validate_client_event(data: Any) -> BaseModel:
    if not isinstance(data, dict):
        raise ProtocolError("invalid_event", f"an event must be a JSON object, got {type(data).__name__}")
    event_id = data.get("event_id") if isinstance(data.get("event_id"), str) else None
    event_type = data.get("type")
    if not isinstance(event_type, str):
        raise ProtocolError("invalid_event", "event has no string 'type' field", "type", event_id)
    if event_type not in CLIENT_EVENT_TYPES:
        raise ProtocolError("unknown_event",
                            f"unknown event type {event_type!r}; supported: {', '.join(CLIENT_EVENT_TYPES)}",
                            "type", event_id)
    try:
        return _client_event.validate_python(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"][1:])  # drop the union tag
        got = first.get("input")
        shown = f" (got {got!r})" if isinstance(got, (str, int, float, bool)) and len(repr(got)) <= 80 else ""
        code = "unsupported_value" if first["type"] == "unsupported" else "invalid_value"
        raise ProtocolError(code, f"{event_type}: {where}: {first['msg']}{shown}", where, event_id) from exc


# ---- server events ----------------------------------------------------------------------

_event_counter = itertools.count(1)


def server_event(event_type: str, **fields: Any) -> dict[str, Any]:
    return {"type": event_type, "event_id": f"event_{next(_event_counter)}", **fields}


def error_event(error: ProtocolError) -> dict[str, Any]:
    return server_event("error", error={
        "type": error.kind, "code": error.code, "message": error.message,
        "param": error.param, "event_id": error.event_id,
    })


def message_item(item_id: str, role: str, text: str, status: str = "completed",
                 audio: bool = False) -> dict[str, Any]:
    """A conversation item as the wire shows it."""
    if role == "user":
        part = {"type": "input_audio", "transcript": text} if audio else {"type": "input_text", "text": text}
    elif role == "assistant":
        part = {"type": "output_audio", "transcript": text} if audio else {"type": "output_text", "text": text}
    else:
        part = {"type": "input_text", "text": text}
    return {"id": item_id, "object": "realtime.item", "type": "message", "role": role,
            "status": status, "content": [part]}
