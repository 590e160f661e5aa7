"""The spoken test utterances: Piper says each once (cached under tests/.cache), PCM16 mono 24 kHz,
made the way `voice-app loadtest` makes a script's `say` turns."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from voice_app.loadtest.script import Script, ScriptTurn, utterance_audio
from voice_app.settings import default_piper_voice

UTTERANCES = {
    "question": "What is the capital of France?",
    "greeting": "Hello, how are you today?",
    "interrupt": "Wait, stop, tell me about dogs instead.",
    "story": "Tell me a long story about a dragon and a knight.",
}
CACHE_DIR = Path(__file__).resolve().parents[1] / ".cache" / "voice_audio"


def spoken_utterances() -> dict[str, np.ndarray]:
    script = Script("test utterances", [ScriptTurn(say=text, wav=None, transcript=text) for text in UTTERANCES.values()])
    return dict(zip(UTTERANCES, utterance_audio(script, default_piper_voice(), CACHE_DIR)))
