"""The same 24 kHz audio, cut into 10, 20, 40 or 100 ms chunks or sent whole, is the same turn
with the same transcript (real Whisper and Silero, a scripted engine). It was not: while nobody
spoke the input buffer kept the prefix padding before the newest sample instead of before the
VAD's position, so a turn starting in a window that straddled two chunks lost up to 32 ms of its
prefix, depending on the chunk size, and Whisper heard "the capital of friends" for "France"."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from voice_app.core.session import Session
from voice_app.settings import Settings
from voice_app.speech.loaded_models import LoadedModels

from ..clients import EventLog, silence
from ..fakes import ScriptedEngine

pytestmark = pytest.mark.slow
CHUNK_MS = (10, 20, 40, 100, None)  # None: the whole utterance in one append
LEAD_IN_S = 0.37  # where the speech starts relative to the chunk borders matters: this one showed it


async def one_turn(speech_models, audio: np.ndarray, chunk_ms: int | None, paced: bool) -> tuple[int, int, str]:
    """(audio_start_ms, audio_end_ms, transcript) of the one turn the audio makes."""
    models = LoadedModels(ScriptedEngine(), speech_models["transcriber"], speech_models["synthesizer"],
                          speech_models["vad"])
    log = EventLog()
    session = Session(models, Settings(turn_detection="server_vad"), log.send)
    step = len(audio) if chunk_ms is None else 24 * chunk_ms
    for offset in range(0, len(audio), step):
        await session.push_pcm16(audio[offset:offset + step])
        await asyncio.sleep(step / 24000 if paced else 0)
    done = await log.wait_for(lambda e: e["type"] == "conversation.item.input_audio_transcription.completed", 60)
    started = log.of_type("input_audio_buffer.speech_started")
    stopped = log.of_type("input_audio_buffer.speech_stopped")
    await session.close()
    assert len(started) == len(stopped) == 1, log.types()
    return started[0]["audio_start_ms"], stopped[0]["audio_end_ms"], done["transcript"]


@pytest.mark.parametrize("paced", [False, True], ids=["as_fast_as_possible", "paced_like_a_microphone"])
async def test_the_transcript_does_not_depend_on_the_chunk_size(speech_models, test_audio, paced):
    audio = np.concatenate([silence(LEAD_IN_S), test_audio["question"], silence(1.0)])
    sizes = CHUNK_MS if not paced else (20, 100)
    turns = {size: await one_turn(speech_models, audio, size, paced) for size in sizes}
    assert len(set(turns.values())) == 1, turns
    start_ms, _, transcript = turns[sizes[0]]
    assert "capital of france" in transcript.lower(), transcript
    # the whole prefix padding (300 ms) before the speech: the VAD put it at 416 ms
    assert start_ms == 116, turns


async def test_the_transcript_does_not_depend_on_how_soon_the_speech_starts(speech_models, test_audio):
    """Speech in the stream's first 300 ms has less prefix padding than the turn wants: Whisper
    gets the missing part as silence (tiny.en heard "friends" with 100 ms before "France")."""
    turns = {}
    for lead_in_s in (0.0, 0.05, 0.1, 0.3):
        audio = np.concatenate([silence(lead_in_s), test_audio["question"], silence(1.0)])
        turns[lead_in_s] = (await one_turn(speech_models, audio, 20, paced=False))[2]
    assert len(set(turns.values())) == 1 and "capital of france" in turns[0.0].lower(), turns
