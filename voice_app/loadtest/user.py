"""One simulated user: a microphone streaming PCM16 at real-time pace, and a script runner that
says each turn's utterance, watches the server's events and measures the latencies."""

from __future__ import annotations

import asyncio
import base64
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from voice_app.audio.pcm import WIRE_RATE
from voice_app.loadtest.connection import RealtimeConnection, ReceivedEvent, SessionClosed, of_type
from voice_app.loadtest.report import normalized_words, score_transcript
from voice_app.loadtest.results import SessionResult, TurnResult
from voice_app.loadtest.script import Script, ScriptTurn
from voice_app.realtime.event_feed import audio_after_clear
from voice_app.events.protocol import CLOSE_TRY_AGAIN_LATER, with_x_events

REPLICA_HEADER = "x-voice-replica"  # voice_app/realtime/server.py names the replica in it

MAX_SUPERSEDED_RESPONSES = 3  # a VAD split of one utterance can cancel a reply or two before the real one


class Microphone:
    """Streams `input_audio_buffer.append` frames on an absolute schedule (sleep drift does not
    accumulate): queued speech when there is some, silence otherwise."""

    def __init__(self, connection: RealtimeConnection, frame_ms: int, speed: float):
        self.connection = connection
        self.frame = WIRE_RATE * frame_ms // 1000
        self.period_s = frame_ms / 1000.0 / speed
        self._speech: list[np.ndarray] = []
        self._spoken: asyncio.Future | None = None
        self._started_at: float | None = None
        self._task = asyncio.create_task(self._stream())

    async def say(self, samples: np.ndarray) -> tuple[float, float]:
        """Queues an utterance; returns (first frame sent, last frame sent) once it is out."""
        self._spoken = asyncio.get_running_loop().create_future()
        self._started_at = None
        self._speech = [samples[i:i + self.frame] for i in range(0, len(samples), self.frame)]
        return await self._spoken

    async def _stream(self) -> None:
        silence = np.zeros(self.frame, dtype=np.int16)
        next_at = time.monotonic()
        while self.connection.closed is None:
            frame = self._speech.pop(0) if self._speech else silence
            await self.connection.send({"type": "input_audio_buffer.append",
                                        "audio": base64.b64encode(frame.astype("<i2").tobytes()).decode()})
            now = time.monotonic()
            if frame is not silence:
                self._started_at = self._started_at or now
                if not self._speech and self._spoken is not None and not self._spoken.done():
                    self._spoken.set_result((self._started_at, now))
            next_at += self.period_s
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))

    async def stop(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


def _loud_windows(samples: np.ndarray, rate: int, level: float) -> np.ndarray:
    """Which 10 ms windows of the utterance are louder than `level` (RMS, full scale 1)."""
    window = rate // 100
    audio = samples[:len(samples) - len(samples) % window].astype(np.float32) / 32768.0
    return np.sqrt(np.mean(audio.reshape(-1, window) ** 2, axis=1)) > level


def voice_onset_s(samples: np.ndarray, rate: int = WIRE_RATE, level: float = 0.01) -> float:
    """Seconds into an utterance where its voice starts: the first 10 ms louder than -40 dBFS
    (a synthesised clip leads with 40-70 ms of near silence)."""
    loud = np.flatnonzero(_loud_windows(samples, rate, level))
    return loud[0] / 100 if len(loud) else 0.0


def voice_offset_s(samples: np.ndarray, rate: int = WIRE_RATE, level: float = 0.01) -> float:
    """Seconds into an utterance where its voice ends: the end of the last 10 ms louder than
    -40 dBFS (a clip's trailing quiet is not speech the listener waits through)."""
    loud = np.flatnonzero(_loud_windows(samples, rate, level))
    return (loud[-1] + 1) / 100 if len(loud) else len(samples) / rate


@dataclass
class RunOptions:
    url: str
    frame_ms: int = 40
    speed: float = 1.0
    stagger_ms: int = 500
    turns: int | None = None
    duration_s: float | None = None
    turn_timeout_s: float = 120.0
    api_key: str | None = None  # for a server started with an API token (sent as a bearer token)


def playback_end(events: list[ReceivedEvent], response_id: str, speed: float) -> float:
    """When a client playing each audio delta of the reply as it arrives, in real time, falls silent."""
    is_audio = of_type("response.output_audio.delta", response_id)
    end = 0.0
    for received in events:
        if is_audio(received.event):
            seconds = len(base64.b64decode(received.event["delta"])) / 2 / WIRE_RATE / speed
            end = max(end, received.at) + seconds
    return end


def reply_transcript(done: dict[str, Any]) -> str:
    """The spoken (or written) text of a response.done's reply."""
    texts = [part.get("transcript") or part.get("text") or ""
             for item in done["response"].get("output", []) for part in item.get("content", [])]
    return " ".join(texts)


def ms_between(start: float | None, end: float | None) -> float | None:
    return None if start is None or end is None else round((end - start) * 1000.0, 1)


class SimulatedUser:
    def __init__(self, index: int, script: Script, audio: list[np.ndarray], options: RunOptions):
        self.index = index
        self.script = script
        self.audio = audio
        self.options = options
        self.result = SessionResult(index)
        self.conn: RealtimeConnection | None = None
        self._pending_reply: PendingReply | None = None  # a reply left playing for the next turn's barge-in
        self._heard_reply_at = 0.0  # when a client playing the last reply in real time finishes it

    async def run(self) -> SessionResult:
        from websockets.asyncio.client import connect

        await asyncio.sleep(self.index * self.options.stagger_ms / 1000.0)
        try:
            headers = {"Authorization": f"Bearer {self.options.api_key}"} if self.options.api_key else None
            # x_events: the turn metrics it reports come in x_turn.metrics
            async with connect(with_x_events(self.options.url), max_size=None, open_timeout=60, ping_interval=None,
                               additional_headers=headers) as websocket:
                self.result.replica = websocket.response.headers.get(REPLICA_HEADER)
                self.conn = RealtimeConnection(websocket)
                await self.conn.wait_for(of_type("session.created"), 0, 60, "session.created")
                mic = Microphone(self.conn, self.options.frame_ms, self.options.speed)
                try:
                    await self._converse(mic)
                finally:
                    await mic.stop()
                    self.result.errors = [e.event["error"].get("message", "") for e in self.conn.events
                                          if e.event.get("type") == "error"]
                await self.conn.close()
        except SessionClosed as closed:
            refused = closed.code == CLOSE_TRY_AGAIN_LATER and not self.result.turns
            self.result.outcome = "refused" if refused else "dropped"
            self.result.detail = str(closed)
        except (OSError, TimeoutError, asyncio.TimeoutError) as exc:
            self.result.outcome, self.result.detail = "error", f"{type(exc).__name__}: {exc}"
        except Exception as exc:  # websockets' handshake errors (InvalidStatus, InvalidURI, ...)
            self.result.outcome, self.result.detail = "error", f"{type(exc).__name__}: {exc}"
            response = getattr(exc, "response", None)  # a refused handshake still names its replica
            if response is not None:
                self.result.replica = self.result.replica or response.headers.get(REPLICA_HEADER)
                if response.status_code == 503:  # at capacity or draining: the server's answer
                    self.result.outcome = "refused"
                    self.result.detail = f"HTTP 503: {bytes(response.body or b'').decode(errors='replace')[:300]}"
        return self.result

    def _wants_turn(self, number: int, started: float) -> bool:
        """--duration: keep talking until the time is up; else --turns, or the script once."""
        if self.options.duration_s is not None:
            return time.monotonic() - started < self.options.duration_s
        return number < (self.options.turns or len(self.script.turns))

    async def _converse(self, mic: Microphone) -> None:
        started = time.monotonic()
        turns = self.script.turns
        number = 0
        while self._wants_turn(number, started):
            script_index = number % len(turns)  # the script cycles
            # A barge-in or backchannel comes next (if any turn does): leave this reply playing for it.
            next_barges_in = turns[(number + 1) % len(turns)].talks_over is not None
            result = TurnResult(self.index, number, script_index, turns[script_index].transcript)
            self.result.turns.append(result)
            try:
                await self._play_turn(mic, turns[script_index], self.audio[script_index], result,
                                      leave_playing=next_barges_in)
            except TimeoutError as exc:
                result.error = str(exc)
            number += 1
        await self._finish_pending_reply()

    async def _play_turn(self, mic: Microphone, turn: ScriptTurn, samples: np.ndarray, result: TurnResult,
                         leave_playing: bool) -> None:
        talked_over, self._pending_reply = self._pending_reply, None
        if turn.talks_over is not None and talked_over is not None:
            await asyncio.sleep(max(0.0, talked_over.first_audio_at + turn.talks_over / 1000 / self.options.speed
                                    - time.monotonic()))
        else:
            if talked_over is not None:
                await self._wait_done(talked_over)
                talked_over = None
            # A person answers after hearing the reply out (the server streams it faster than it plays).
            heard_in_s = max(0.0, self._heard_reply_at - time.monotonic())
            await asyncio.sleep(heard_in_s + turn.pause_ms / 1000 / self.options.speed)
        mark = len(self.conn.events)
        speech_start, last_frame_sent = await mic.say(samples)
        # eos: where the voice ended, not the clip's trailing quiet (its last frame left then)
        speech_end = last_frame_sent - (len(samples) / WIRE_RATE - voice_offset_s(samples)) / self.options.speed
        if talked_over is not None and turn.backchannel_after_ms is not None:
            await self._follow_backchannel(talked_over, mark, result, leave_playing)
            return
        if talked_over is not None:  # from where the voice starts, not the quiet that leads the clip
            await self._measure_barge_in(talked_over, mark, speech_start + voice_onset_s(samples), result)
            await self._wait_done(talked_over, heard_out=False)
            result.stale_audio_deltas = audio_after_clear((e.event for e in self.conn.events[mark:]),
                                                          talked_over.response_id)
        await self._follow_reply(mark, speech_end, result, leave_playing, turn)

    async def _follow_backchannel(self, talked_over: "PendingReply", mark: int, result: TurnResult,
                                  leave_playing: bool) -> None:
        """A "mm-hmm" over a reply: the reply should carry on (more of its audio, or its done
        as completed) rather than be cancelled; no new reply is expected."""
        timeout = self.options.turn_timeout_s
        index, heard = await self.conn.wait_for(of_type("conversation.item.input_audio_transcription.completed"),
                                                mark, timeout, "the backchannel's transcript")
        result.transcript = heard.event["transcript"]
        score_transcript(result)
        more_audio = of_type("response.output_audio.delta", talked_over.response_id)
        done = of_type("response.done", talked_over.response_id)
        try:
            _, outcome = await self.conn.wait_for(lambda e: more_audio(e) or done(e), index, 5, "the reply going on")
            result.backchannel_kept = outcome.event["type"] != "response.done" or \
                outcome.event["response"]["status"] == "completed"
        except TimeoutError:
            result.backchannel_kept = False
        if leave_playing and result.backchannel_kept:
            self._pending_reply = talked_over
        else:
            await self._wait_done(talked_over)

    async def _measure_barge_in(self, talked_over: "PendingReply", mark: int, speech_start: float,
                                result: TurnResult) -> None:
        """speech start sent -> the talked-over reply's clear; a reply that had finished playing
        before the barge-in is counted as missed, not as an error."""
        cleared = of_type("output_audio_buffer.cleared", talked_over.response_id)
        try:
            index, event = await self.conn.wait_for(cleared, mark, self.options.turn_timeout_s / 4,
                                                    "output_audio_buffer.cleared")
        except TimeoutError:
            result.barge_in_missed = True
            return
        result.barge_in_to_cleared_ms = ms_between(speech_start, event.at)

    async def _follow_reply(self, mark: int, speech_end: float, result: TurnResult, leave_playing: bool,
                            turn: ScriptTurn) -> None:
        conn, timeout = self.conn, self.options.turn_timeout_s
        search_from = mark
        for _ in range(MAX_SUPERSEDED_RESPONSES + 1):
            created_index, created = await conn.wait_for(of_type("response.created"), search_from, timeout,
                                                         "response.created after the utterance")
            response_id = created.event["response"]["id"]
            first_index, first = await conn.wait_for(
                lambda e: of_type("response.output_audio.delta", response_id)(e)
                or of_type("response.done", response_id)(e), created_index, timeout, "reply audio")
            if first.event["type"] == "response.output_audio.delta":
                break
            search_from = first_index + 1  # cancelled before speaking (a later VAD turn took over)
        transcripts = [e for e in conn.events[mark:created_index]
                       if e.event["type"] == "conversation.item.input_audio_transcription.completed"]
        result.transcript = " ".join(e.event["transcript"].strip() for e in transcripts).strip()
        if turn.gap_ms is not None:
            result.one_turn = len([e for e in transcripts if e.event["transcript"].strip()]) == 1
        result.response_id = response_id
        result.expect = turn.expect
        result.eos_to_transcript_ms = ms_between(speech_end, transcripts[-1].at if transcripts else None)
        result.eos_to_first_audio_ms = ms_between(speech_end, first.at)
        score_transcript(result)
        reply = PendingReply(result, response_id, created_index, first.at, speech_end, mark)
        if leave_playing:
            self._pending_reply = reply  # the next turn talks over it
        else:
            await self._wait_done(reply)

    async def _wait_done(self, reply: "PendingReply", heard_out: bool = True) -> None:
        result, timeout = reply.result, self.options.turn_timeout_s
        done_index, done = await self.conn.wait_for(of_type("response.done", reply.response_id),
                                                    reply.created_index, timeout, "response.done")
        result.status = done.event["response"]["status"]
        result.eos_to_done_ms = ms_between(reply.speech_end, done.at)
        if result.one_turn is not None:  # a later part heard as its own turn may cut this reply
            result.one_turn = result.one_turn and _transcripts_between(self.conn.events, reply.mark, done_index) == 1
        if result.expect:
            said = " ".join(normalized_words(reply_transcript(done.event)))
            result.on_topic = any(word in said for word in result.expect)
        if heard_out:
            self._heard_reply_at = playback_end(self.conn.events[reply.created_index:], reply.response_id,
                                                self.options.speed)
        try:
            _, metrics = await self.conn.wait_for(of_type("x_turn.metrics", reply.response_id), reply.created_index,
                                                  5, "x_turn.metrics")
            result.server_metrics = {k: v for k, v in metrics.event.items() if k not in ("type", "event_id")}
        except TimeoutError:
            pass

    async def _finish_pending_reply(self) -> None:
        """A reply left running for a barge-in that never came (end of the run): wait it out."""
        reply, self._pending_reply = self._pending_reply, None
        if reply is not None:
            await self._wait_done(reply)


def _transcripts_between(events: list[ReceivedEvent], start: int, end: int) -> int:
    return sum(1 for e in events[start:end]
               if e.event["type"] == "conversation.item.input_audio_transcription.completed"
               and e.event["transcript"].strip())


@dataclass
class PendingReply:
    """A reply whose `response.done` is still to come (left playing for a barge-in)."""

    result: TurnResult
    response_id: str
    created_index: int
    first_audio_at: float
    speech_end: float
    mark: int  # the connection's event index when the turn's utterance began
