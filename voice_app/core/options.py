"""A session's options: what `session.update` changes and `session.created/updated` shows."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from voice_app.audio.pcm import WIRE_RATE
from voice_app.events import protocol as p
from voice_app.events.session_config import EngineConfig, Refusal, SemanticVad, ServerVad, SessionConfig
from voice_app.settings import Settings

MAX_OUTPUT_TOKENS = 4096  # the most the Realtime API lets a client ask for a reply


# semantic_vad: how long a turn whose words sound unfinished may pause before it ends anyway
EAGERNESS_MAX_SILENCE_MS = {"high": 800, "medium": 1600, "auto": 1600, "low": 3000}
COMPLETE_SILENCE_MS = 200  # ...and how long one whose words sound finished waits


@dataclass
class TurnDetection:
    """When speech starts and ends, and what a turn does to responses.

    server_vad ends a turn after `silence_duration_ms` of silence. semantic_vad (the default)
    asks the LLM whether the words so far sound finished (core/end_of_turn.py): then
    COMPLETE_SILENCE_MS ends the turn, otherwise the eagerness's longer limit."""

    enabled: bool = True  # False: the client commits turns itself (turn_detection: null)
    type: str = "semantic_vad"  # or "server_vad"
    eagerness: str = "auto"
    threshold: float = 0.5
    prefix_padding_ms: int = 300
    silence_duration_ms: int = 500
    pause_ms: int = 64  # ours, not on the wire: a pause this long starts a speculative draft
    create_response: bool = True
    interrupt_response: bool = True

    @property
    def semantic(self) -> bool:
        return self.type == "semantic_vad"

    def max_silence_ms(self) -> int:
        """The silence that ends a turn whatever its words (server_vad: the only rule)."""
        return EAGERNESS_MAX_SILENCE_MS[self.eagerness] if self.semantic else self.silence_duration_ms

    def update(self, vad: ServerVad | SemanticVad | None) -> None:
        self.enabled = vad is not None
        if vad is None:
            return  # the other values are kept for when it is turned on again
        self.type = vad.type
        for name in ("threshold", "prefix_padding_ms", "silence_duration_ms", "eagerness", "create_response",
                     "interrupt_response"):
            if getattr(vad, name, None) is not None:
                setattr(self, name, getattr(vad, name))

    def shape(self) -> dict[str, Any] | None:
        if not self.enabled:
            return None
        common = {"create_response": self.create_response, "interrupt_response": self.interrupt_response}
        if self.semantic:
            return {"type": "semantic_vad", "eagerness": self.eagerness, **common}
        return {"type": "server_vad", "threshold": self.threshold, "prefix_padding_ms": self.prefix_padding_ms,
                "silence_duration_ms": self.silence_duration_ms, **common}


@dataclass
class SessionOptions:
    instructions: str
    max_output_tokens: int
    unlimited_output_tokens: int  # what max_output_tokens "inf" means: the server's default
    output_tokens_cap: int = MAX_OUTPUT_TOKENS  # the most a client may ask for (the operator's setting)
    voice: str = "heart"  # from_settings: the server's default voice
    speed: float = 1.0
    audio_out: bool = True  # output_modalities ["audio"] (spoken, with a transcript) or ["text"]
    audio_format: dict[str, Any] = field(default_factory=lambda: {"type": "audio/pcm", "rate": WIRE_RATE})
    turn_detection: TurnDetection = field(default_factory=TurnDetection)
    engine_mode: str = "auto"  # x_engine: how this session's replies are decoded
    engine_threshold: float | None = None  # None: exact decoding
    engine_settings_allowed: bool = True  # the operator's --client-engine-settings
    engine_takes_threshold: bool = True  # False: the model decodes exactly whatever the threshold

    @classmethod
    def from_settings(cls, settings: Settings, engine_takes_threshold: bool = True) -> "SessionOptions":
        return cls(instructions=settings.instructions, max_output_tokens=settings.max_new_tokens,
                   unlimited_output_tokens=settings.max_new_tokens, voice=settings.default_voice,
                   output_tokens_cap=min(settings.max_output_tokens_cap, MAX_OUTPUT_TOKENS),
                   turn_detection=TurnDetection(type=settings.turn_detection, eagerness=settings.eagerness,
                                                threshold=settings.vad_threshold,
                                                prefix_padding_ms=settings.prefix_padding_ms,
                                                silence_duration_ms=settings.silence_duration_ms,
                                                pause_ms=settings.draft_pause_ms),
                   engine_mode=settings.engine_mode, engine_settings_allowed=settings.client_engine_settings,
                   engine_takes_threshold=engine_takes_threshold)

    def reply_tokens(self, requested: int | str, event_id: str | None = None) -> int:
        """A client's max_output_tokens as a token count; ProtocolError when over the operator's
        cap (settings.max_output_tokens_cap) or below 1."""
        if requested == "inf":
            return self.unlimited_output_tokens
        if not 1 <= int(requested) <= self.output_tokens_cap:
            shown = requested if len(str(requested)) <= 20 else f"a {len(str(requested))}-digit number"
            raise p.ProtocolError("invalid_value", f"max_output_tokens must be in 1..{self.output_tokens_cap} or "
                                  f"'inf', got {shown}", "max_output_tokens", event_id)
        return int(requested)

    def update(self, config: SessionConfig) -> list[Refusal]:
        """Applies a session.update's validated settings, each on its own: one out of the
        operator's range (max_output_tokens over the cap) is refused and returned, the others
        still apply."""
        refused: list[Refusal] = []
        if config.max_output_tokens is not None:
            try:
                self.max_output_tokens = self.reply_tokens(config.max_output_tokens)
            except p.ProtocolError as error:
                refused.append(Refusal("max_output_tokens", error.message))
        if config.instructions is not None:
            self.instructions = config.instructions
        if config.output_modalities is not None:
            self.audio_out = "audio" in config.output_modalities
        audio = config.audio
        if audio is not None and audio.input is not None and "turn_detection" in audio.input.model_fields_set:
            self.turn_detection.update(audio.input.turn_detection)
        if audio is not None and audio.output is not None:
            self.voice = audio.output.voice or self.voice
            self.speed = audio.output.speed or self.speed
        if config.x_engine is not None:
            refused += self._update_engine(config.x_engine)
        return refused

    def _update_engine(self, engine: EngineConfig) -> list[Refusal]:
        if not self.engine_settings_allowed:
            return [Refusal("x_engine", "this server decodes every session's replies the same way "
                                        "(the operator turned --client-engine-settings off)")]
        self.engine_mode = engine.mode or self.engine_mode
        if engine.threshold is not None and not self.engine_takes_threshold:
            return [Refusal("x_engine.threshold", "this model's drafts are verified by the model itself, so its "
                                                  "replies are exact; a threshold does not apply")]
        if "threshold" in engine.model_fields_set:  # null: back to exact decoding
            self.engine_threshold = engine.threshold
        return []

    def engine_shape(self) -> dict[str, Any]:
        return {"mode": self.engine_mode, "threshold": self.engine_threshold,
                "takes_threshold": self.engine_takes_threshold}

    def shape(self, session_id: str, model: str, transcription_model: str) -> dict[str, Any]:
        """The session object of session.created / session.updated."""
        return {
            "type": "realtime", "object": "realtime.session", "id": session_id, "model": model,
            "instructions": self.instructions,
            "output_modalities": ["audio"] if self.audio_out else ["text"],
            "max_output_tokens": self.max_output_tokens,
            "audio": {
                "input": {"format": dict(self.audio_format), "turn_detection": self.turn_detection.shape(),
                          "transcription": {"model": transcription_model}},
                "output": {"format": dict(self.audio_format), "voice": self.voice, "speed": self.speed},
            },
        }
