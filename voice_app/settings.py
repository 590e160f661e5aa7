"""Server and pipeline settings: env vars (VOICE_APP_*), a .env file, then CLI flags on top."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

MIB = 1024 * 1024

DEFAULT_INSTRUCTIONS = (
    "You are a friendly voice assistant. Your words are spoken aloud, so answer in one or two "
    "short, natural sentences. Never use lists, markdown, code, emoji or URLs."
)


def default_piper_voice() -> str:
    from voice_app.speech.weights import PIPER_JOE

    return str(PIPER_JOE.load_module().model_path())


# the voices a session may ask for by name (session.update's audio.output.voice), by engine
VOICES = {"joe": "piper", "heart": "hibari"}


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="VOICE_APP_", env_file=".env", extra="ignore")

    host: str = "127.0.0.1"
    port: int = Field(8765, ge=0, le=65535)
    web_dir: str = "web"

    # models
    engine_model: str = "smollm2-135m-bd"
    # auto: the engine times both at startup and runs the faster (exact diffusion and AR give the
    # same words; on a 2-core CPU AR is ~2.8x faster, on a GPU diffusion is)
    engine_mode: Literal["auto", "diffusion", "autoregressive"] = "auto"
    # whether a session.update's x_engine may choose its own replies' mode and threshold
    client_engine_settings: bool = True
    engine_device: str = "auto"  # cpu, cuda, cuda:N; auto: cuda when there is one
    max_new_tokens: int = Field(64, ge=1, le=1024)
    reply_deadline_s: float | None = Field(None, gt=0)
    # tiny.en or base (the packaged ones: voice_app/speech/weights.py), or a CTranslate2 folder;
    # tiny.en: base heard the project's speech set no better at ~1.7x the decode time
    # (docs/benchmarks.md, Speech)
    whisper_model: str = "tiny.en"
    whisper_compute_type: str = "int8"
    whisper_final_beam: int = Field(3, ge=1, le=10)  # beam of a turn's final transcript (partials: greedy)
    # hear a turn after the assistant's last reply (Whisper's prompt). Off: over the speech-eval
    # set it halves tiny.en's WER where the reply holds the user's words, but after SmolLM2's
    # replies to other questions WER rose 21.4 -> 28.7 % (tune) and words of the reply leaked
    # into the transcript (docs/benchmarks.md, Speech; eval_asr.py --context)
    whisper_reply_context: bool = False
    # 1, not 2: CTranslate2 brings its own libgomp, and once its worker has a 2-thread OpenMP
    # team the engine's torch forward passes ran at half speed (CPU use 2.0 -> 1.1 cores, with
    # Whisper idle); tiny.en decodes 2.8 s of speech in 165 ms on one thread, 172 ms on two
    whisper_cpu_threads: int = Field(1, ge=1)
    asr_workers: int = Field(1, ge=1, le=16)
    # the voice engine: hibari is 4x sooner to a sentence's audio than Piper joe for a tenth of
    # the CPU, and Whisper hears it as well or better (docs/benchmarks.md, scripts/eval_tts.py)
    tts: Literal["piper", "hibari"] = "hibari"
    piper_voice: str = Field(default_factory=default_piper_voice)
    piper_config: str | None = None  # None: the voice file's path + ".json"
    tts_workers: int = Field(1, ge=1, le=16)

    # who may connect (docs/security.md): same-origin pages and non-browser clients by default
    allowed_origins: Annotated[list[str], NoDecode] = []  # more page origins; "*": any
    allowed_hosts: Annotated[list[str], NoDecode] = []  # Host header names; empty: derived from `host`
    api_token: str | None = None  # required of every /v1 client when set (Bearer header or subprotocol)

    # running as one replica of many (docs/deploy.md)
    replica_name: str | None = None  # the x-voice-replica header on every reply; None: hostname:port
    # on SIGTERM/SIGINT: refuse new sessions, let live replies finish for up to this long, then
    # close the sessions with 1012 and exit 0 (Kubernetes' terminationGracePeriodSeconds must exceed it)
    drain_grace_s: float = Field(20.0, ge=0)

    # sessions
    max_sessions: int = Field(8, ge=1)
    # OpenAI's limit for one client event (an append of 15 MiB of base64 audio is legal there)
    max_message_bytes: int = Field(15 * MIB, ge=1024)
    idle_timeout_s: float = Field(600.0, gt=0)  # no client event for this long: the session ends
    max_session_s: float = Field(3600.0, gt=0)  # OpenAI's documented maximum session length
    send_timeout_s: float = Field(20.0, gt=0)  # a client that takes no event for this long is dropped
    history_max_items: int = Field(512, ge=2)  # a session's conversation; the oldest items go first
    history_max_chars: int = Field(MIB, ge=1024)  # of item text
    context_tokens: int = Field(2048, ge=128)  # prompt + reply of one response, at most (KV cache size)
    max_output_tokens_cap: int = Field(1024, ge=1, le=8192)  # the most a client may ask for a reply
    response_inactivity_timeout_s: float = Field(30.0, gt=0)  # no engine update this long: the reply fails
    instructions: str = DEFAULT_INSTRUCTIONS
    # put these default instructions before a client's own: replies are spoken whatever the
    # client asks, and SmolLM2-135M drifts off task (even into French) under short system
    # prompts like "Answer briefly." but not after them (measured on a dozen prompts)
    keep_spoken_style: bool = True

    # turn taking (session.update may change them per session): semantic_vad asks the LLM
    # whether the words sound finished; server_vad waits out silence_duration_ms
    turn_detection: Literal["semantic_vad", "server_vad"] = "semantic_vad"
    eagerness: Literal["low", "medium", "high", "auto"] = "auto"
    end_of_turn_threshold: float = Field(0.15, gt=0.0, lt=1.0)  # p(end of turn) above which words sound finished
    vad_threshold: float = Field(0.5, gt=0.0, lt=1.0)
    prefix_padding_ms: int = Field(300, ge=0, le=5000)
    silence_duration_ms: int = Field(500, ge=32, le=10000)
    partial_interval_ms: int = Field(250, ge=50, le=5000)
    # a pause this long starts a speculative draft and the closing decode (once its 50 ms tail is in)
    draft_pause_ms: int = Field(64, ge=32, le=5000)
    barge_in_min_speech_ms: int = Field(64, ge=0, le=5000)  # speech over a reply that pauses it
    barge_in_sure_ms: int = Field(1200, ge=0, le=10000)  # speech this long over a paused reply cuts it at once
    # a reply talked over by a cough or a bare "mm-hmm" carries on where it stopped; off: any
    # speech over a reply cuts it
    resume_false_interruptions: bool = True
    # reply audio goes out at most this far ahead of playback (0: as fast as it is made): the
    # reply stays in progress while it plays, so it can be paused and resumed
    audio_lead_ms: int = Field(1500, ge=0, le=600000)
    speculative_tts: bool = True  # synthesize a speculative draft's first sentences early

    @property
    def default_voice(self) -> str:
        """The name of the voice settings.tts speaks with."""
        return next(name for name, engine in VOICES.items() if engine == self.tts)

    @field_validator("allowed_origins", "allowed_hosts", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        """VOICE_APP_ALLOWED_ORIGINS=https://a.example,https://b.example (or a JSON list)."""
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                import json

                return json.loads(text)
            return [part.strip() for part in text.split(",") if part.strip()]
        return value
