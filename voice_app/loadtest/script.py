"""Conversation scripts for `voice-app loadtest`: what each simulated user says, and when.

A script is YAML or JSON:

    name: smalltalk
    turns:
      - say: What is the capital of France?       # text, spoken by Piper (cached on disk)
      - wav: recordings/story.wav                  # or a recording (any rate, PCM16)
        transcript: Tell me a story.               #   what it says, for the word error rate
        pause_ms: 800                              # silence after the last reply was heard out
      - say: Wait, stop, tell me about dogs.
        barge_in_after_ms: 500                     # talk over the previous reply, 500 ms after
                                                   #   its first audio arrived
        expect: [dog]                              # the reply must hold one of these words
      - say: Mm-hmm.
        backchannel_after_ms: 1500                 # talk over the previous reply, which should
                                                   #   carry on (a false interruption)
      - say: What is the capital of ... Spain?     # "..." is a pause inside the utterance
        gap_ms: 800                                #   this long: it should stay one turn

Every utterance is turned into PCM16 mono 24 kHz samples once, before any session starts.
"""

from __future__ import annotations

import hashlib
import json
import logging
import wave
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from voice_app.audio.pcm import WIRE_RATE, float_to_int16, resample

log = logging.getLogger(__name__)

DEFAULT_SCRIPT: dict[str, Any] = {
    "name": "default",
    "turns": [
        {"say": "What is the capital of France?", "expect": ["paris"]},
        {"say": "Tell me a long story about a dragon and a knight.", "pause_ms": 800},
        {"say": "Mm-hmm.", "backchannel_after_ms": 1500},
        {"say": "Wait, stop. What is two plus two?", "barge_in_after_ms": 600, "expect": ["two", "four", "plus"]},
        {"say": "What is the capital of ... Spain?", "gap_ms": 800, "pause_ms": 800, "expect": ["madrid", "spain"]},
    ],
}
TURN_FIELDS = {"say", "wav", "transcript", "pause_ms", "barge_in_after_ms", "backchannel_after_ms", "gap_ms", "expect"}
GAP_MARK = "..."
DEFAULT_CACHE_DIR = Path.home() / ".cache" / "voice-app" / "loadtest"


class ScriptError(ValueError):
    """A script that cannot be run; the message names the file, the turn and the field."""


@dataclass(frozen=True)
class ScriptTurn:
    say: str | None
    wav: Path | None
    transcript: str | None  # the words spoken, for the word error rate (None: not scored)
    pause_ms: int = 0
    barge_in_after_ms: int | None = None
    backchannel_after_ms: int | None = None  # talks over the previous reply, which should go on
    gap_ms: int | None = None  # silence where the `say` text has "...": still one turn
    expect: tuple[str, ...] = ()  # the reply should hold one of these words

    @property
    def talks_over(self) -> int | None:
        """ms after the previous reply's first audio this turn starts, if it talks over it."""
        return self.barge_in_after_ms if self.barge_in_after_ms is not None else self.backchannel_after_ms


@dataclass(frozen=True)
class Script:
    name: str
    turns: list[ScriptTurn]


def load_script(path: str | None) -> Script:
    """The script in `path` (YAML or JSON), or the built-in default when None."""
    if path is None:
        return parse_script(DEFAULT_SCRIPT, "the default script", Path.cwd())
    file = Path(path)
    try:
        text = file.read_text()
    except OSError as exc:
        raise ScriptError(f"cannot read script {path}: {exc}") from exc
    try:
        data = json.loads(text) if file.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ScriptError(f"script {path} is not valid {'JSON' if file.suffix == '.json' else 'YAML'}: {exc}") from exc
    return parse_script(data, f"script {path}", file.parent)


def parse_script(data: Any, where: str, base_dir: Path) -> Script:
    if not isinstance(data, dict) or not isinstance(data.get("turns"), list) or not data["turns"]:
        raise ScriptError(f"{where}: expected a mapping with a non-empty list `turns`")
    turns = [_parse_turn(raw, f"{where}, turn {number}", base_dir, first=number == 1)
             for number, raw in enumerate(data["turns"], start=1)]
    return Script(str(data.get("name", where)), turns)


def _parse_turn(raw: Any, where: str, base_dir: Path, first: bool) -> ScriptTurn:
    if not isinstance(raw, dict):
        raise ScriptError(f"{where}: expected a mapping with `say` or `wav`, got {raw!r}")
    unknown = sorted(set(raw) - TURN_FIELDS)
    if unknown:
        raise ScriptError(f"{where}: unknown field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(TURN_FIELDS))}")
    if ("say" in raw) == ("wav" in raw):
        raise ScriptError(f"{where}: give exactly one of `say` (text) or `wav` (a file)")
    if "say" in raw and (not isinstance(raw["say"], str) or not raw["say"].strip()):
        raise ScriptError(f"{where}: `say` must be non-empty text")
    wav = None
    if "wav" in raw:
        wav = (base_dir / str(raw["wav"])).resolve()
        if not wav.is_file():
            raise ScriptError(f"{where}: `wav` file {wav} does not exist")
    talking_over = [name for name in ("barge_in_after_ms", "backchannel_after_ms") if name in raw]
    if len(talking_over) > 1 or (talking_over and "pause_ms" in raw):
        raise ScriptError(f"{where}: `pause_ms`, `barge_in_after_ms` and `backchannel_after_ms` exclude each other")
    if talking_over and first:
        raise ScriptError(f"{where}: `{talking_over[0]}` needs a previous reply to talk over; not on the first turn")
    gap = _milliseconds(raw, "gap_ms", where)
    if gap is not None and GAP_MARK not in str(raw.get("say", "")):
        raise ScriptError(f"{where}: `gap_ms` needs a `say` text with \"{GAP_MARK}\" where the pause goes")
    expect = raw.get("expect", [])
    if not isinstance(expect, list) or not all(isinstance(word, str) and word.strip() for word in expect):
        raise ScriptError(f"{where}: `expect` must be a list of words")
    say = raw.get("say")
    spoken = " ".join(say.replace(GAP_MARK, " ").split()) if say else None
    return ScriptTurn(say=say, wav=wav, transcript=raw.get("transcript", spoken),
                      pause_ms=_milliseconds(raw, "pause_ms", where) or 0,
                      barge_in_after_ms=_milliseconds(raw, "barge_in_after_ms", where),
                      backchannel_after_ms=_milliseconds(raw, "backchannel_after_ms", where), gap_ms=gap,
                      expect=tuple(word.lower() for word in expect))


def _milliseconds(raw: dict[str, Any], name: str, where: str) -> int | None:
    value = raw.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 600_000:
        raise ScriptError(f"{where}: `{name}` must be whole milliseconds in 0..600000, got {value!r}")
    return value


# ---- audio -----------------------------------------------------------------------------------


def utterance_audio(script: Script, piper_voice: str, cache_dir: Path = DEFAULT_CACHE_DIR) -> list[np.ndarray]:
    """PCM16 mono 24 kHz samples of every turn, in order; text is synthesised once and cached,
    without Piper's random variation, so every machine hears the same utterances."""
    synthesizer = None

    def spoken(text: str) -> np.ndarray:
        nonlocal synthesizer
        cached = cache_dir / f"{hashlib.sha1(f'{piper_voice}|fixed|{text}'.encode()).hexdigest()[:16]}.wav"
        if not cached.is_file():
            if synthesizer is None:
                from voice_app.speech.tts import PiperSynthesizer

                synthesizer = PiperSynthesizer(piper_voice)
            write_wav_24k(cached, synthesizer.synthesize_blocking(text, varied=False))
            log.info("synthesised %r -> %s", text, cached)
        return read_wav_24k(cached)

    audio = []
    for turn in script.turns:
        if turn.wav is not None:
            audio.append(read_wav_24k(turn.wav))
        elif turn.gap_ms is not None:  # the parts spoken apart, silence between
            gap = np.zeros(WIRE_RATE * turn.gap_ms // 1000, dtype=np.int16)
            parts = [spoken(part.strip()) for part in turn.say.split(GAP_MARK)]
            audio.append(np.concatenate([piece for part in parts for piece in (part, gap)][:-1]))
        else:
            audio.append(spoken(turn.say))
    if synthesizer is not None:
        synthesizer.close()
    return audio


def read_wav_24k(path: Path) -> np.ndarray:
    """A PCM16 WAV of any rate and channel count, as mono 24 kHz int16."""
    try:
        with wave.open(str(path), "rb") as wav:
            if wav.getsampwidth() != 2:
                raise ScriptError(f"{path}: only PCM16 WAV files are supported, got {8 * wav.getsampwidth()}-bit")
            channels, rate = wav.getnchannels(), wav.getframerate()
            samples = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2")
    except (wave.Error, EOFError) as exc:
        raise ScriptError(f"{path}: not a readable WAV file: {exc}") from exc
    mono = samples.reshape(-1, channels).mean(axis=1) / 32768.0
    return float_to_int16(resample(mono.astype(np.float32), rate, WIRE_RATE))


def write_wav_24k(path: Path, samples: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    with wave.open(str(partial), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(WIRE_RATE)
        wav.writeframes(samples.astype("<i2").tobytes())
    partial.replace(path)  # a run killed mid-write leaves no truncated cache entry

