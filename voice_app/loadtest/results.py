"""What one simulated user measured: a result per turn and per session (filled by user.py,
scored and summed by report.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class TurnResult:
    session: int
    turn: int
    script_turn: int
    expected: str | None
    transcript: str = ""
    wer: float | None = None
    reference_words: int = 0
    word_errors: int = 0
    response_id: str | None = None
    status: str | None = None
    eos_to_transcript_ms: float | None = None
    eos_to_first_audio_ms: float | None = None
    eos_to_done_ms: float | None = None
    barge_in_to_cleared_ms: float | None = None
    barge_in_missed: bool = False  # the reply talked over had already finished playing
    stale_audio_deltas: int = 0
    backchannel_kept: bool | None = None  # a backchannel turn: the reply talked over carried on
    one_turn: bool | None = None  # a turn with a pause inside: the server heard it as one turn
    on_topic: bool | None = None  # a turn with `expect`: the reply holds one of the words
    server_metrics: dict[str, Any] | None = None
    error: str | None = None
    expect: tuple[str, ...] = ()


@dataclass
class SessionResult:
    index: int
    outcome: str = "completed"  # completed | refused | dropped | error
    detail: str = ""
    turns: list[TurnResult] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # `error` events from the server
    replica: str | None = None  # the x-voice-replica header of the server (or replica behind a proxy) that answered
