"""`session.update`'s settings, validated one by one: a refused value (named with the reason)
never drops the others. The shapes follow the OpenAI Realtime API (GA); docs/protocol.md lists
what is supported, ignored and refused."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import PydanticCustomError


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


class EngineConfig(BaseModel):
    """Ours (`x_engine`): how the engine decodes this session's replies. `mode` as the server's
    --engine-mode; `threshold` the confidence a drafted token needs to be committed without
    verification (lossy, fewer passes); null: exact, the reply AR greedy would give."""

    model_config = ConfigDict(extra="forbid")
    mode: Literal["auto", "autoregressive", "diffusion"] | None = None
    threshold: float | None = Field(None, gt=0.0, le=1.0)


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
    x_engine: EngineConfig | None = None  # ours: the engine's decoding for this session's replies

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
    """The setting an error is about: a top-level field, audio.input.X / audio.output.X, or x_engine.X."""
    if loc and loc[0] == "audio":
        return tuple(loc[:3])
    return tuple(loc[:2]) if loc and loc[0] == "x_engine" and len(loc) > 1 else tuple(loc[:1])


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
    if config.x_engine is not None:
        names += [f"x_engine.{name}" for name in sorted(config.x_engine.model_fields_set)]
    return names
