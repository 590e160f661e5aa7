"""The model slots a session uses, as typed Protocols: what core needs of each model and nothing
more. speech/ fills them with Whisper, Piper and Silero (`LoadedModels`), dllm_engine with the
engine; unit tests fill them with scripted fakes."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

VAD_WINDOW = 512  # samples at 16 kHz (32 ms) a VAD probability covers: the window Silero is trained on


class Engine(Protocol):
    """dllm_engine.engine.Engine as the voice app uses it (see dllm_engine/request.py)."""

    model_name: str
    max_context_tokens: int

    @property
    def live_requests(self) -> int: ...

    @property
    def takes_threshold(self) -> bool:
        """Whether a threshold (lossy commits) changes how the model decodes."""

    def count_tokens(self, messages: list[dict[str, str]]) -> int: ...

    def submit(self, messages: list[dict[str, str]], params: Any) -> Any:
        """-> a RequestHandle: async-iterable DraftUpdates, cancel(), promote()."""

    def end_of_turn_probability(self, messages: list[dict[str, str]], background: bool = True) -> Any:
        """-> a RequestHandle whose final update's token_probs[0] is p(the last message is finished)."""

    def prefill_head(self, messages: list[dict[str, str]], mode: str = "auto") -> Any:
        """-> a RequestHandle that writes the messages' keys and values for later prompts to share."""


class Transcriber(Protocol):
    model_name: str

    @property
    def busy(self) -> bool:
        """Every worker has a job waiting: partial transcripts should skip a beat."""

    async def transcribe(self, audio_16k: np.ndarray, final: bool = False, context: str = "") -> str: ...


class Synthesizer(Protocol):
    @property
    def live_jobs(self) -> int: ...

    async def synthesize(self, sentence: str, speed: float = 1.0, needed_at: float | None = None) -> np.ndarray:
        """One sentence -> PCM16 samples at 24 kHz; `needed_at` (time.monotonic()) orders the queue."""


class VadStream(Protocol):
    """One audio stream's voice activity state."""

    def process(self, samples_16k: np.ndarray) -> list[float]:
        """Speech probabilities, one per VAD_WINDOW samples completed by these samples."""

    def reset_if_long_idle(self) -> None: ...


class Vad(Protocol):
    def stream(self) -> VadStream: ...


class Models(Protocol):
    """What a Session is given: one of each, shared by every session of a server."""

    engine: Engine
    transcriber: Transcriber
    synthesizer: Synthesizer  # the server's default voice
    vad: Vad

    def voice(self, name: str) -> Synthesizer:
        """The synthesizer of the voice called `name`; the default one for a name the server
        has no voice for (OpenAI clients send theirs: "alloy", "marin", ...)."""

    @property
    def tts_live_jobs(self) -> int:
        """Sentences being synthesised, all voices together."""
