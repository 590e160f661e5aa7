#!/usr/bin/env python3
"""The project's own speech evaluation set: voice-assistant utterances spoken by many voices in
many conditions, with their reference transcripts (scripts/eval_asr.py scores a recogniser on it).

    .venv/bin/python scripts/make_speech_eval.py [--out runs/speech-eval]

Voices: espeak-ng's English voices with variants and speaking rates, and Piper's joe with its
random variation on. Conditions: clean, white noise at 15 dB SNR, room reverb (sox), and
thinking pauses ("..." in a sentence: the parts spoken 0.7 s apart). The set is split: `tune`
(two espeak accents, clean and noisy) may guide decisions; `held_out` (other accents, variants,
rates, Piper, reverb) is only ever reported. Deterministic: the same files on every machine
with the same espeak-ng and sox (Debian's packages).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import wave
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

RATE = 16000
SENTENCES = [
    "What is the capital of France?", "What is the capital of ... Spain?", "How many legs does a spider have?",
    "How many days are there in a week?", "Tell me a joke about penguins.", "Set a timer for fifteen minutes.",
    "What is twelve times eight?", "Remind me to call Maria tomorrow at nine.", "Stop.", "Never mind.",
    "Hold on.", "What's the weather like in London today?", "Who wrote Romeo and Juliet?",
    "Can you recommend a good book for tonight?", "How do I boil an egg?", "Turn the music down, please.",
    "What is the boiling point of water?", "Translate good morning into Spanish.", "I'm feeling a bit tired today.",
    "How far is the moon from the earth?", "What does the word ... serendipity mean?", "Thanks, that was helpful.",
    "Is it going to rain in Tokyo this weekend?", "What is forty two plus seventeen?",
    "Tell me a short story about a dragon.", "Why is the sky blue?", "What time is it in New York?",
    "Spell the word necessary.", "How many ounces are in a pound?", "Wait, what is the largest ocean on Earth?",
]
ESPEAK = {  # voice, variant, words a minute, split
    "us": ("en-us", None, 170, "tune"), "gb": ("en-gb", None, 170, "tune"),
    "us-fast-f": ("en-us", "f3", 215, "held_out"), "scots": ("en-gb-scotland", "m3", 160, "held_out"),
    "caribbean": ("en-029", "f2", 165, "held_out"), "rp-slow": ("en-gb-x-rp", "m5", 135, "held_out"),
    "midlands": ("en-gb-x-gbcwmd", "f4", 180, "held_out"),
}
CONDITIONS = {"clean": [], "noise15": ["noise"], "reverb": ["reverb"]}


def espeak(text: str, voice: str, variant: str | None, wpm: int) -> np.ndarray:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "out.wav"
        name = f"{voice}+{variant}" if variant else voice
        subprocess.run(["espeak-ng", "-v", name, "-s", str(wpm), "-w", str(path), text], check=True)
        return resample(*read_wav(path))


def piper(text: str, synthesizer) -> np.ndarray:
    samples = synthesizer.synthesize_blocking(text, varied=True)  # 24 kHz PCM16, random variation on
    return resample(samples.astype(np.float32) / 32768.0, 24000)


def spoken(text: str, say) -> np.ndarray:
    """The sentence, its "..." parts spoken 0.7 s apart (a thinking pause)."""
    parts = [part.strip() for part in text.split("...") if part.strip()]
    pause = np.zeros(int(0.7 * RATE), dtype=np.float32)
    audio = []
    for index, part in enumerate(parts):
        audio += [say(part)] + ([pause] if index < len(parts) - 1 else [])
    return np.concatenate(audio)


def apply(audio: np.ndarray, effects: list[str], seed: int) -> np.ndarray:
    if not effects:
        return audio
    out = audio
    if "noise" in effects:
        rng = np.random.default_rng(seed)
        power = float(np.mean(audio ** 2)) or 1e-8
        out = out + rng.normal(0, np.sqrt(power / 10 ** (15 / 10)), len(out)).astype(np.float32)
    if "reverb" in effects:
        with tempfile.TemporaryDirectory() as tmp:
            src, dst = Path(tmp) / "in.wav", Path(tmp) / "out.wav"
            write_wav(src, out)
            subprocess.run(["sox", str(src), str(dst), "reverb", "50", "50", "80", "100", "0", "0"], check=True)
            out, _ = read_wav(dst)
    peak = float(np.max(np.abs(out))) or 1.0
    return (out * min(1.0, 0.9 / peak)).astype(np.float32)


def read_wav(path: Path) -> tuple[np.ndarray, int]:
    with wave.open(str(path)) as wav:
        rate, channels = wav.getframerate(), wav.getnchannels()
        data = np.frombuffer(wav.readframes(wav.getnframes()), dtype=np.int16).astype(np.float32) / 32768.0
    return data.reshape(-1, channels).mean(axis=1), rate


def write_wav(path: Path, audio: np.ndarray, rate: int = RATE) -> None:
    with wave.open(str(path), "wb") as wav:
        wav.setnchannels(1)
        wav.setsampwidth(2)
        wav.setframerate(rate)
        wav.writeframes((np.clip(audio, -1, 1) * 32767).astype("<i2").tobytes())


def resample(audio: np.ndarray, rate: int) -> np.ndarray:
    import soxr

    return soxr.resample(audio, rate, RATE).astype(np.float32) if rate != RATE else audio


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "speech-eval")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    from voice_app.settings import Settings
    from voice_app.speech.tts import PiperSynthesizer

    synthesizer = PiperSynthesizer(Settings().piper_voice)
    entries = []
    voices = {name: (lambda text, v=spec: espeak(text, *v[:3]), spec[3]) for name, spec in ESPEAK.items()}
    voices["piper-varied"] = (lambda text: piper(text, synthesizer), "held_out")
    for voice, (say, split) in voices.items():
        for condition, effects in CONDITIONS.items():
            if condition == "reverb" and split == "tune":
                continue  # reverb is only ever held out
            for index, text in enumerate(SENTENCES):
                key = hashlib.sha1(f"{voice}|{condition}|{text}".encode()).hexdigest()[:12]
                path = args.out / f"{voice}-{condition}-{index:02d}-{key}.wav"
                if not path.exists():
                    write_wav(path, apply(spoken(text, say), effects, seed=int(key[:8], 16)))
                entries.append({"file": path.name, "reference": text.replace("...", "").replace("  ", " "),
                                "voice": voice, "condition": condition, "split": split,
                                "pause": "..." in text, "command": text.rstrip(".") in ("Stop", "Never mind", "Hold on")})
    synthesizer.close()
    (args.out / "manifest.json").write_text(json.dumps(entries, indent=1))
    print(f"{len(entries)} utterances in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
