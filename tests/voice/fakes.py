"""Scripted stand-ins for the models and the client's player, for unit tests of the session's
logic: no model files, no pacing by the wall clock. They keep the real contracts (the Protocols
of voice_app/core/models.py, dllm_engine.request's RequestHandle and DraftUpdate, and
voice_app/core/audio_sink.py's AudioSink); the slow tests run the same logic on the real models.

The user's voice: `ScriptedSpeech.say(text)` is a constant tone, one level per utterance and
WORD_S seconds a word. The VAD hears any sound as speech; the transcriber finds the utterance by
its level and returns as many of its words as the audio holds.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from dllm_engine.request import DraftUpdate, EngineError, GenerationParams, RequestHandle, RequestStats
from voice_app.audio.pcm import ASR_RATE, WIRE_RATE
from voice_app.core.audio_sink import ms_of
from voice_app.core.models import VAD_WINDOW
from voice_app.realtime.event_feed import EventFeed

WORD_S = 0.3  # how long the user takes to say a word
SPEECH_FLOOR = 0.02  # float level above which the fakes hear sound
SPOKEN_WORD_SAMPLES = WIRE_RATE // 4  # what the synthesizer makes of a word: 250 ms at 24 kHz


# ---- the user's voice, the VAD and the transcriber -------------------------------------------


class ScriptedSpeech:
    def __init__(self) -> None:
        self._texts: list[str] = []

    @staticmethod
    def _level(index: int) -> float:
        return 0.1 + 0.05 * index

    def say(self, text: str) -> np.ndarray:
        """PCM16 at 24 kHz, as a client sends it."""
        if text not in self._texts:
            self._texts.append(text)
        samples = int(len(text.split()) * WORD_S * WIRE_RATE)
        return np.full(samples, int(self._level(self._texts.index(text)) * 32767), dtype=np.int16)

    def hear(self, audio_16k: np.ndarray) -> str:
        voiced = np.abs(audio_16k) > SPEECH_FLOOR
        if not voiced.any():
            return ""
        level = float(np.median(np.abs(audio_16k[voiced])))
        text = min(self._texts, key=lambda t: abs(self._level(self._texts.index(t)) - level))
        words_heard = round(int(voiced.sum()) / (WORD_S * ASR_RATE))
        return " ".join(text.split()[:words_heard])


class ScriptedVadStream:
    def __init__(self) -> None:
        self._pending = np.zeros(0, dtype=np.float32)

    def process(self, samples_16k: np.ndarray) -> list[float]:
        self._pending = np.concatenate([self._pending, samples_16k.astype(np.float32)])
        windows = len(self._pending) // VAD_WINDOW
        probs = [1.0 if np.mean(np.abs(self._pending[i * VAD_WINDOW:(i + 1) * VAD_WINDOW])) > SPEECH_FLOOR else 0.0
                 for i in range(windows)]
        self._pending = self._pending[windows * VAD_WINDOW:]
        return probs

    def reset_if_long_idle(self) -> None:
        pass


class ScriptedVad:
    def stream(self) -> ScriptedVadStream:
        return ScriptedVadStream()


class ScriptedTranscriber:
    model_name = "scripted-asr"
    busy = False

    def __init__(self, speech: ScriptedSpeech):
        self._speech = speech
        self.finals = 0  # final-quality decodes (beam search): at a pause, or closing a turn
        self.contexts: list[str] = []  # each decode's context (Whisper's prompt), in order

    async def transcribe(self, audio_16k: np.ndarray, final: bool = False, context: str = "") -> str:
        await asyncio.sleep(0)  # a decode is never instant: the caller's loop turns over
        self.finals += final
        self.contexts.append(context)
        return self._speech.hear(audio_16k)


# ---- the synthesizer and the client's player -------------------------------------------------


class ScriptedSynthesizer:
    """Each word becomes SPOKEN_WORD_SAMPLES of a quiet tone (divided by the speed)."""

    def __init__(self) -> None:
        self.sentences: list[str] = []
        self._live_jobs = 0

    @property
    def live_jobs(self) -> int:
        return self._live_jobs

    async def synthesize(self, sentence: str, speed: float = 1.0, needed_at: float | None = None) -> np.ndarray:
        self._live_jobs += 1
        try:
            await asyncio.sleep(0)
            self.sentences.append(sentence)
            return np.full(int(len(sentence.split()) * SPOKEN_WORD_SAMPLES / speed), 1000, dtype=np.int16)
        finally:
            self._live_jobs -= 1


class ScriptedSink:
    """core.audio_sink.AudioSink with the epoch rule, counting what it played and dropped.
    `gate`: when set, each push waits for it after the sender's decision and before the
    sink's check, as a websocket push waits for the send lock: a test can clear the sink in
    exactly that gap."""

    def __init__(self, player: "ScriptedPlayer", ids: dict[str, Any]):
        self.ids = ids
        self._player = player
        self.epoch = 0
        self.pushed_samples = 0  # played (every epoch)
        self.pushed_after_clear = 0  # chunks played in an epoch after the first clear
        self.dropped_chunks = 0  # pushes the epoch rule refused
        self.cleared_at_ms: float | None = None
        self.gate: asyncio.Event | None = None
        self.waiting_at_gate = asyncio.Event()
        self._pushed = asyncio.Event()

    async def push(self, chunk: np.ndarray, epoch: int) -> bool:
        if self.gate is not None:
            self.waiting_at_gate.set()
            await self.gate.wait()
        if epoch != self.epoch:
            self.dropped_chunks += 1
            return False
        self.pushed_samples += len(chunk)
        self.pushed_after_clear += self.cleared_at_ms is not None
        self._pushed.set()
        return True

    async def wait_pushed(self, samples: int) -> None:
        """Until at least this many samples were played (in all, replays included)."""
        while self.pushed_samples < samples:
            self._pushed.clear()
            await asyncio.wait_for(self._pushed.wait(), 10)

    def heard_ms(self) -> float:
        if self.cleared_at_ms is not None:
            return self.cleared_at_ms
        return min(ms_of(self.pushed_samples), self._player.position_ms)

    def left_ms(self) -> float:
        return 0.0 if self.cleared_at_ms is not None else ms_of(self.pushed_samples) - self.heard_ms()

    def clear(self) -> float:
        self.cleared_at_ms = self.heard_ms()
        self.epoch += 1
        return self.cleared_at_ms

    def close(self) -> None:
        self.epoch += 1


class ScriptedPlayer:
    """A client's player whose position the test sets: every reply has been heard up to
    `position_ms` (or to its end, when shorter)."""

    def __init__(self, position_ms: float = 0.0):
        self.position_ms = position_ms
        self.sinks: list[ScriptedSink] = []

    def open_sink(self, ids: dict[str, Any]) -> ScriptedSink:
        self.sinks.append(ScriptedSink(self, ids))
        return self.sinks[-1]

    def sink_of(self, response_id: str) -> ScriptedSink:
        return next(sink for sink in self.sinks if sink.ids["response_id"] == response_id)


# ---- the engine ------------------------------------------------------------------------------


def echo_reply(messages: list[dict[str, str]]) -> str:
    return f"You said {messages[-1]['content'].rstrip('.?!')}. That is all I know. Goodbye now."


class ScriptedHandle(RequestHandle):
    def __init__(self, request_id: int, background: bool):
        super().__init__(request_id, background=background)
        self.stopped = asyncio.Event()  # cancelled: wakes a held reply

    def cancel(self) -> None:
        super().cancel()
        self.stopped.set()

    def publish(self, update: DraftUpdate) -> None:
        self._publish(update)  # what the engine's scheduler does after each step


class ScriptedEngine:
    """Replies with `reply(messages)`, `words_per_step` words a step, one step every `step_s`
    (0: as fast as the loop turns over). `hold_after_words`: the reply stops there until
    `release` is set (or it is cancelled), so a test can talk over a reply being produced.
    Like the real engine, it takes requests from any thread (sessions submit from a worker
    thread); the replies run on the event loop it was made on."""

    model_name = "scripted"
    max_context_tokens = 512
    takes_threshold = True

    def __init__(self, reply: Callable[[list[dict[str, str]]], str] = echo_reply, step_s: float = 0.0,
                 words_per_step: int = 2, hold_after_words: int | None = None):
        self.reply = reply
        self.step_s = step_s
        self.words_per_step = words_per_step
        self.hold_after_words = hold_after_words
        self.release = asyncio.Event()
        self.submitted: EventFeed[list[dict[str, str]]] = EventFeed()  # the prompts, in order
        self.handles: list[ScriptedHandle] = []
        self.params: list[GenerationParams] = []  # of each submit, in order
        self.judged: list[str] = []  # texts asked whether they sound finished
        self.prefilled: list[list[dict[str, str]]] = []  # heads prefilled between turns
        self.live_requests = 0
        self._tasks: set[asyncio.Task] = set()
        self._loop = asyncio.get_running_loop()

    def count_tokens(self, messages: list[dict[str, str]]) -> int:
        return sum(len(m["content"].split()) + 4 for m in messages)

    def submit(self, messages: list[dict[str, str]], params: GenerationParams) -> RequestHandle:
        params.validate()
        if not messages:
            raise EngineError("the prompt is empty")
        handle = ScriptedHandle(len(self.handles) + 1, params.background)
        self.handles.append(handle)
        self.params.append(params)
        words = self.reply(messages).split()[: params.max_new_tokens]
        self._loop.call_soon_threadsafe(self._begin, handle, messages, words)
        return handle

    def _begin(self, handle: ScriptedHandle, messages: list[dict[str, str]], words: list[str]) -> None:
        self.live_requests += 1
        self.submitted.append(messages)
        task = self._loop.create_task(self._run(handle, words))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def prefill_head(self, messages: list[dict[str, str]], mode: str = "auto") -> RequestHandle:
        """Records the head (the real engine writes its keys and values); live until cancelled."""
        handle = ScriptedHandle(len(self.handles) + 1, background=True)
        self.handles.append(handle)
        self.prefilled.append(messages)
        return handle

    def end_of_turn_probability(self, messages: list[dict[str, str]], background: bool = True) -> RequestHandle:
        """As SmolLM2 judges: words ending in . ? ! sound finished, others not."""
        handle = ScriptedHandle(len(self.handles) + 1, background)
        self.judged.append(messages[-1]["content"])
        finished = messages[-1]["content"].rstrip().endswith((".", "?", "!"))
        update = DraftUpdate(request_id=handle.request_id, committed_text="", draft_text="", token_ids=[], step=1,
                             final=True, finish_reason="length", token_probs=[0.8 if finished else 0.01])
        self._loop.call_soon_threadsafe(handle.publish, update)
        return handle

    async def wait_idle(self) -> None:
        """Until every request has ended (finished, or noticed its cancel)."""
        await asyncio.gather(*self._tasks)

    async def _run(self, handle: ScriptedHandle, words: list[str]) -> None:
        stats = RequestStats(prompt_tokens=10)
        committed = step = 0
        try:
            while committed < len(words):
                if self.hold_after_words is not None and committed >= self.hold_after_words:
                    await first_of(self.release, handle.stopped)
                await asyncio.sleep(self.step_s)
                if handle.cancelled:
                    handle.publish(_update(handle, words, committed, step, "cancelled", stats))
                    return
                step += 1
                committed = min(len(words), committed + self.words_per_step)
                stats.forward_passes, stats.new_tokens = step, committed
                handle.publish(_update(handle, words, committed, step, "stop" if committed == len(words) else None,
                                        stats))
        finally:
            self.live_requests -= 1


async def first_of(*events: asyncio.Event) -> None:
    waits = [asyncio.ensure_future(event.wait()) for event in events]
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for wait in waits:
        wait.cancel()


def _update(handle: RequestHandle, words: list[str], committed: int, step: int, reason: str | None,
            stats: RequestStats) -> DraftUpdate:
    return DraftUpdate(request_id=handle.request_id, committed_text=" ".join(words[:committed]),
                       draft_text=" ".join(words), token_ids=list(range(committed)), step=step,
                       final=reason is not None, finish_reason=reason, stats=stats)


@dataclass
class ScriptedModels:
    """core.models.Models, all scripted."""

    engine: ScriptedEngine = field(default_factory=ScriptedEngine)
    speech: ScriptedSpeech = field(default_factory=ScriptedSpeech)
    synthesizer: ScriptedSynthesizer = field(default_factory=ScriptedSynthesizer)
    vad: ScriptedVad = field(default_factory=ScriptedVad)
    voices: dict = field(default_factory=dict)  # other voices by name; any other name: `synthesizer`

    def __post_init__(self) -> None:
        self.transcriber = ScriptedTranscriber(self.speech)

    def voice(self, name: str):
        return self.voices.get(name, self.synthesizer)

    @property
    def tts_live_jobs(self) -> int:
        return self.synthesizer.live_jobs + sum(v.live_jobs for v in self.voices.values())
