"""The wire protocol, in one place: client events we accept (pydantic models) and builders for
the server events we send. Names and shapes follow the OpenAI Realtime API (GA); our own
additions are named `x_...`. docs/protocol.md documents every event. session.update's settings
are validated in session_config.py."""

from __future__ import annotations

import itertools
import json
from typing import Annotated, Any, Callable, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, field_validator

from voice_app.events.session_config import no_forced_tool, no_tools

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
