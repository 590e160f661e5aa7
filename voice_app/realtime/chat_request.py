"""A `/v1/chat/completions` request body, validated: every bad field is an ApiError in OpenAI's
error shape, naming the field and what was wrong with it (imports nothing of the engine)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

MAX_CHOICES = 8  # n: each choice is one engine request
MAX_STOPS = 4  # as OpenAI
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}

# served as asked
ACCEPTED = {"model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "stop",
            "n", "stream", "stream_options", "x_deadline_s"}
# bookkeeping fields that do not change a reply: accepted and ignored
IGNORED = {"user", "metadata", "store", "service_tier", "parallel_tool_calls", "safety_identifier",
           "prompt_cache_key"}
# features this server does not have: accepted only with the value that leaves them off
NEUTRAL = {"frequency_penalty": (0,), "presence_penalty": (0,), "logit_bias": ({},), "logprobs": (False,),
           "top_logprobs": (0,), "tools": ([],), "tool_choice": ("none",), "functions": ([],),
           "function_call": ("none",), "response_format": ({"type": "text"},), "modalities": (["text"],),
           "audio": (), "prediction": (), "reasoning_effort": (), "web_search_options": ()}


class ApiError(Exception):
    """An error answer: HTTP status plus OpenAI's `{"error": {message, type, param, code}}`."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 error_type: str = "invalid_request_error", headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.error_type = error_type
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.error_type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param, code)


@dataclass(frozen=True)
class ChatRequest:
    model: str
    messages: list[dict[str, str]]  # role (system | user | assistant) and text content
    max_tokens: int | None  # None: the server's default, within the context
    temperature: float
    seed: int | None
    stop: tuple[str, ...]
    n: int
    stream: bool
    include_usage: bool
    deadline_s: float | None  # x_deadline_s: the engine's deadline-aware (lossy) decoding


def parse_json_body(raw: bytes) -> dict[str, Any]:
    if not raw.strip():
        raise bad_request("the request body is empty: send a JSON object with `model` and `messages`")
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise bad_request(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise bad_request(f"the request body must be a JSON object, got {type(body).__name__}")
    return body


def parse_chat_request(raw: bytes, max_tokens_cap: int) -> ChatRequest:
    """max_tokens_cap: the most completion tokens a client may ask for (the server's setting)."""
    body = {key: value for key, value in parse_json_body(raw).items() if value is not None}  # null: absent
    check_known_fields(body)
    stream = boolean(body, "stream", False)
    return ChatRequest(
        model=required_model(body), messages=chat_messages(body.get("messages")),
        max_tokens=max_tokens(body, max_tokens_cap), temperature=number(body, "temperature", 0.0, 0.0, 2.0),
        seed=integer(body, "seed", None, -2**63, 2**64 - 1), stop=stop_strings(body.get("stop")),
        n=integer(body, "n", 1, 1, MAX_CHOICES), stream=stream, include_usage=include_usage(body, stream),
        deadline_s=positive_deadline(body),
    )


def check_known_fields(body: dict[str, Any]) -> None:
    for name, value in body.items():
        if name in NEUTRAL:
            if value not in NEUTRAL[name]:
                raise bad_request(f"`{name}` is not supported by this server (it only accepts "
                                  f"{' or '.join(json.dumps(v) for v in NEUTRAL[name]) or 'null'})", name,
                                  "unsupported_parameter")
        elif name not in ACCEPTED and name not in IGNORED:
            raise bad_request(f"Unrecognized request argument supplied: {name}", name, "unknown_parameter")
    if "top_p" in body and number(body, "top_p", 1.0, 0.0, 1.0) != 1.0:
        raise bad_request(f"top_p {body['top_p']} is not supported: the engine samples from the whole distribution "
                          "(only top_p=1 is accepted; lower `temperature` instead)", "top_p", "unsupported_value")


def required_model(body: dict[str, Any]) -> str:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("you must provide a model name (`model`, a string)", "model")
    return model


def chat_messages(value: Any) -> list[dict[str, str]]:
    if value is None:
        raise bad_request("`messages` is required: a list of {role, content} objects", "messages")
    if not isinstance(value, list):
        raise bad_request(f"`messages` must be a list, got {type(value).__name__}", "messages")
    if not value:
        raise bad_request("`messages` is empty: send at least one message", "messages")
    return [chat_message(index, item) for index, item in enumerate(value)]


def chat_message(index: int, item: Any) -> dict[str, str]:
    where = f"messages[{index}]"
    if not isinstance(item, dict):
        raise bad_request(f"{where} must be an object with `role` and `content`, got {type(item).__name__}", where)
    role = item.get("role")
    if role is None:
        raise bad_request(f"{where} has no `role`", f"{where}.role")
    if role not in ROLES:
        raise bad_request(f"{where}.role {json.dumps(role)} is not supported: use one of "
                          f"{', '.join(ROLES)} (this server has no tools or functions)", f"{where}.role")
    for field in ("tool_calls", "function_call", "audio"):
        if item.get(field) is not None:
            raise bad_request(f"{where}.{field} is not supported by this server", f"{where}.{field}")
    return {"role": ROLES[role], "content": message_text(where, item.get("content"))}


def message_text(where: str, content: Any) -> str:
    """A message's text: a string, or a list of text parts joined (OpenAI's content parts)."""
    if isinstance(content, str):
        return content
    if content is None:
        raise bad_request(f"{where} has no `content`", f"{where}.content")
    if not isinstance(content, list):
        raise bad_request(f"{where}.content must be a string or a list of text parts, got "
                          f"{type(content).__name__}", f"{where}.content")
    return "".join(text_part(f"{where}.content[{index}]", part) for index, part in enumerate(content))


def text_part(where: str, part: Any) -> str:
    if not isinstance(part, dict) or part.get("type") != "text":
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        raise bad_request(f"{where} is of type {json.dumps(kind)}: only text parts "
                          '({"type": "text", "text": ...}) are supported', where)
    if not isinstance(part.get("text"), str):
        raise bad_request(f"{where}.text must be a string", f"{where}.text")
    return part["text"]


def max_tokens(body: dict[str, Any], cap: int) -> int | None:
    """max_completion_tokens, or the older max_tokens (OpenAI prefers the former when both come)."""
    name = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    value = integer(body, name, None, None, None)
    if value is not None and value < 1:
        raise bad_request(f"{name} must be at least 1, got {value}", name, "integer_below_min_value")
    if value is not None and value > cap:
        raise bad_request(f"{name} is too large: {value}. This server allows at most {cap} completion tokens "
                          "(its max_output_tokens_cap setting)", name, "integer_above_max_value")
    return value


def integer(body: dict[str, Any], name: str, default: int | None, low: int | None, high: int | None) -> int | None:
    value = body.get(name, default)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise bad_request(f"{name} must be an integer, got {json.dumps(value)}", name, "invalid_type")
    check_range(name, value, low, high)
    return value


def number(body: dict[str, Any], name: str, default: float, low: float, high: float) -> float:
    value = body.get(name, default)
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise bad_request(f"{name} must be a number, got {json.dumps(value)}", name, "invalid_type")
    check_range(name, value, low, high)
    return float(value)


def check_range(name: str, value: float, low: float | None, high: float | None) -> None:
    if (low is not None and value < low) or (high is not None and value > high):
        raise bad_request(f"{name} must be in {low}..{high}, got {value}", name, "invalid_value")


def boolean(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name, default)
    if not isinstance(value, bool):
        raise bad_request(f"{name} must be true or false, got {json.dumps(value)}", name, "invalid_type")
    return value


def stop_strings(value: Any) -> tuple[str, ...]:
    stops = [value] if isinstance(value, str) else value
    if stops is None:
        return ()
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad_request("stop must be a string or a list of strings", "stop", "invalid_type")
    if len(stops) > MAX_STOPS:
        raise bad_request(f"stop takes at most {MAX_STOPS} sequences, got {len(stops)}", "stop", "invalid_value")
    if "" in stops:
        raise bad_request("stop sequences must not be empty strings", "stop", "invalid_value")
    return tuple(stops)


def include_usage(body: dict[str, Any], stream: bool) -> bool:
    options = body.get("stream_options")
    if options is None:
        return False
    if not stream:
        raise bad_request("stream_options is only allowed when stream is true", "stream_options")
    if not isinstance(options, dict) or set(options) - {"include_usage", "include_obfuscation"}:
        raise bad_request('stream_options must be an object like {"include_usage": true}', "stream_options")
    return boolean(options, "include_usage", False)


def positive_deadline(body: dict[str, Any]) -> float | None:
    if "x_deadline_s" not in body:
        return None
    deadline = number(body, "x_deadline_s", 0.0, 0.0, 3600.0)
    if deadline <= 0:
        raise bad_request(f"x_deadline_s must be > 0 seconds, got {deadline}", "x_deadline_s", "invalid_value")
    return deadline
