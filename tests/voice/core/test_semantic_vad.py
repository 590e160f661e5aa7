"""semantic_vad: a turn whose words sound finished ends after a short silence; one that sounds
unfinished may pause longer and stays one turn; server_vad keeps its fixed silence window."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from voice_app.core.options import COMPLETE_SILENCE_MS, EAGERNESS_MAX_SILENCE_MS
from voice_app.core.user_turn import UserTurn

from ..clients import silence, stream_audio
from ..fakes import SPEECH_FLOOR, WORD_S, ScriptedModels, ScriptedTranscriber
from .test_session import is_done, make_session

QUESTION = "What is the capital of Spain?"


async def speak(session, audio: np.ndarray) -> None:
    await stream_audio(session.push_pcm16, audio, realtime=False)


async def test_a_finished_question_ends_the_turn_after_a_short_silence():
    session, log, models = make_session(turn_detection="semantic_vad")
    await session.start()
    await speak(session, np.concatenate([models.speech.say(QUESTION), silence(0.3)]))  # server_vad needs 0.5 s
    stopped = await log.wait_for(lambda e: e["type"] == "input_audio_buffer.speech_stopped")
    assert models.engine.judged[-1] == QUESTION  # (earlier ones: partials, judged ahead of the pause)
    await log.wait_for(is_done())
    assert [(i.role, i.text) for i in session.conversation.items][0] == ("user", QUESTION)
    assert stopped["audio_end_ms"] > 0
    assert log.of_type("session.created")[0]["session"]["audio"]["input"]["turn_detection"] == {
        "type": "semantic_vad", "eagerness": "auto", "create_response": True, "interrupt_response": True}
    await session.close()


async def test_a_thinking_pause_mid_sentence_stays_one_turn():
    session, log, models = make_session(turn_detection="semantic_vad")
    words = models.speech.say(QUESTION)
    head = int(5 * WORD_S * 24000)  # "What is the capital of" ... 0.8 s ... "Spain?"
    await speak(session, np.concatenate([words[:head], silence(0.8), words[head:], silence(0.4)]))
    await log.wait_for(is_done())
    assert "What is the capital of" not in models.engine.judged  # unfinished by its last word: no pass
    users = [i.text for i in session.conversation.items if i.role == "user"]
    assert users == [QUESTION] and len(log.of_type("input_audio_buffer.speech_stopped")) == 1
    await session.close()


class HeldFinals(ScriptedTranscriber):
    """Final-quality decodes wait in the queue until `release`; a cancelled one is dropped from it."""

    def __init__(self, speech):
        super().__init__(speech)
        self.release = asyncio.Event()
        self.held, self.dropped = asyncio.Event(), asyncio.Event()
        self.dropped_words: list[str] = []

    async def transcribe(self, audio_16k: np.ndarray, final: bool = False, context: str = "") -> str:
        if final and not self.release.is_set():
            self.held.set()
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.dropped_words.append(self._speech.hear(audio_16k))
                self.dropped.set()
                raise
        return await super().transcribe(audio_16k, final, context)


async def test_a_pause_the_speaker_talks_through_drops_its_waiting_final_decode():
    # under load the decode made at a pause (beam search) waits for the shared Whisper worker;
    # once the speaker goes on it can no longer be the transcript, and must not hold the queue
    models = ScriptedModels()
    models.transcriber = HeldFinals(models.speech)
    session, log, _ = make_session(models, turn_detection="semantic_vad")
    words = models.speech.say(QUESTION)
    head = int(5 * WORD_S * 24000)
    await speak(session, np.concatenate([words[:head], silence(0.3)]))
    await asyncio.wait_for(models.transcriber.held.wait(), 5)
    assert not models.transcriber.dropped.is_set()  # a pause alone keeps it
    await speak(session, words[head:])
    await asyncio.wait_for(models.transcriber.dropped.wait(), 5)
    assert models.transcriber.dropped_words == ["What is the capital of"]
    models.transcriber.release.set()
    await speak(session, silence(0.4))
    await log.wait_for(is_done())
    assert [i.text for i in session.conversation.items if i.role == "user"] == [QUESTION]
    assert len(log.of_type("input_audio_buffer.speech_stopped")) == 1
    await session.close()


async def test_a_pause_whose_speech_went_on_before_its_decode_was_asked_makes_none():
    # the task that makes a pause's decode may run after the speaker has gone on
    models = ScriptedModels()
    session, _, _ = make_session(models, turn_detection="semantic_vad")
    words = models.speech.say(QUESTION)
    await speak(session, words[:int(3 * WORD_S * 24000)])  # still speaking: no pause yet
    listener = session.listener
    assert listener.turn is not None
    went_on_from = listener._detector.last_speech_sample - 2048  # a pause that speech has since passed
    assert await listener._decode_until_tail(listener.turn, went_on_from) is None
    assert models.transcriber.finals == 0 and not listener.turn.closing_decodes
    await session.close()


class PartialsHeard(ScriptedTranscriber):
    """Records, for each partial (greedy) decode, how much silence ends its audio."""

    def __init__(self, speech):
        super().__init__(speech)
        self.trailing_silence_ms: list[float] = []

    async def transcribe(self, audio_16k: np.ndarray, final: bool = False, context: str = "") -> str:
        if not final:
            voiced = np.flatnonzero(np.abs(audio_16k) > SPEECH_FLOOR)
            last = voiced[-1] + 1 if len(voiced) else 0
            self.trailing_silence_ms.append((len(audio_16k) - last) * 1000 / 16000)
        return await super().transcribe(audio_16k, final, context)


async def test_no_partial_decode_starts_once_the_speaker_has_gone_quiet():
    # the pause's closing decode follows within a few windows and hears the same words: a
    # partial of the silence would only sit in front of it in the one Whisper queue
    models = ScriptedModels()
    models.transcriber = PartialsHeard(models.speech)
    session, log, _ = make_session(models)
    await speak(session, models.speech.say(QUESTION))
    await log.wait_for(lambda e: e["type"] == "x_input_audio_transcription.partial"
                       and f"{e['stable']} {e['unstable']}".strip() == QUESTION)
    decoded = len(models.transcriber.trailing_silence_ms)
    await speak(session, silence(0.15))  # quiet for 4-5 windows: a pause and its closing decode, no end of turn
    await asyncio.sleep(0.3)  # six partial intervals
    assert session.listener.turn is not None
    assert models.transcriber.trailing_silence_ms[decoded:] == []
    await session.close()


async def test_an_unfinished_turn_still_ends_at_the_eagerness_limit():
    session, log, models = make_session(turn_detection="semantic_vad", eagerness="high")
    words = models.speech.say(QUESTION)
    head = int(5 * WORD_S * 24000)
    await speak(session, np.concatenate([words[:head], silence(EAGERNESS_MAX_SILENCE_MS["high"] / 1000 + 0.1)]))
    await log.wait_for(lambda e: e["type"] == "input_audio_buffer.speech_stopped")
    assert [i.text for i in session.conversation.items if i.role == "user"] == ["What is the capital of"]
    await session.close()


async def test_a_turn_ends_when_the_client_stops_sending_audio():
    # a microphone turned off mid-thought (or a recording sent whole): no silence windows come,
    # yet the turn must end once the missing audio has lasted the eagerness's limit
    session, log, models = make_session(turn_detection="semantic_vad", eagerness="high")
    words = models.speech.say(QUESTION)
    await speak(session, np.concatenate([words[:int(5 * WORD_S * 24000)], silence(0.1)]))
    assert not log.of_type("input_audio_buffer.speech_stopped")
    await log.wait_for(lambda e: e["type"] == "input_audio_buffer.speech_stopped")
    await log.wait_for(is_done())
    assert [i.text for i in session.conversation.items if i.role == "user"] == ["What is the capital of"]
    await session.close()


@pytest.mark.parametrize("over_a_reply, verdict", [(True, None), (False, True)])
async def test_a_short_finished_phrase_over_a_reply_waits_server_vads_window(over_a_reply, verdict):
    # "No wait, give me ..." as Whisper once heard it at the breath: "No way." An interruption
    # opens so and goes on; the reply it talks over is paused, so waiting costs nothing heard
    session, _, models = make_session(turn_detection="semantic_vad")
    turn = UserTurn("item_x", start_sample=0, started_at=0.0, barged_in=over_a_reply)
    assert await session.listener._judge_words(turn, 0, "No way.") is verdict
    assert models.engine.judged == ["No way."]  # the model called it finished either way
    assert await session.listener._judge_words(turn, 0, "No wait, give me pancakes.") is True
    await session.close()


async def test_server_vad_waits_out_its_silence_window_whatever_the_words():
    session, log, models = make_session(turn_detection="server_vad")
    await speak(session, np.concatenate([models.speech.say(QUESTION), silence(COMPLETE_SILENCE_MS / 1000 + 0.1)]))
    await speak(session, silence(0.05))
    assert not log.of_type("input_audio_buffer.speech_stopped") and models.engine.judged == []
    await speak(session, silence(0.4))
    await log.wait_for(lambda e: e["type"] == "input_audio_buffer.speech_stopped")
    await session.close()


async def test_a_client_switches_between_server_and_semantic_vad():
    session, log, _ = make_session(turn_detection="server_vad")
    await session.handle_text('{"type": "session.update", "session": {"type": "realtime", "audio": {"input": '
                              '{"turn_detection": {"type": "semantic_vad", "eagerness": "low"}}}}}')
    shape = log.of_type("session.updated")[-1]["session"]["audio"]["input"]["turn_detection"]
    assert shape["type"] == "semantic_vad" and shape["eagerness"] == "low"
    assert session.options.turn_detection.max_silence_ms() == EAGERNESS_MAX_SILENCE_MS["low"]
    await session.handle_text('{"type": "session.update", "session": {"type": "realtime", "audio": {"input": '
                              '{"turn_detection": {"type": "semantic_vad", "eagerness": "sometimes"}}}}}')
    assert "eagerness" in log.of_type("error")[-1]["error"]["message"]
    await session.close()
