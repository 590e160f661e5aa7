"""Where a response's audio goes, and how much of it the listener has heard.

Each adopted response gets its own sink from the transport. `push` hands it reply audio (PCM16,
24 kHz) in order; `heard_ms` is how far playback has got; `clear` drops what is not played yet
and says how much was. Barge-in truncates the assistant's turn in the history with what `clear`
returns, so the history holds what was really heard wherever the transport can tell.

The sink is also the one gate reply audio passes on its way out, and it enforces the barge-in
guarantee: every `clear` (and `close`) advances the sink's `epoch`, and a chunk is played only
if the epoch its sender read when it decided to send is still the sink's epoch at the moment
it leaves (for the websocket: under the session's send lock, right before the frame is
written). So nothing decided before a clear can follow it, whatever the tasks' interleaving.
A paused reply that resumes reads the new epoch and speaks in it.
"""

from __future__ import annotations

import time
from typing import Any, Awaitable, Callable, Protocol

import numpy as np

from voice_app.audio.pcm import WIRE_RATE, encode_base64_pcm16
from voice_app.events.protocol import server_event

Send = Callable[[dict[str, Any]], Awaitable[None]]
# the session's send with a guard: the event goes out only if still_current() holds when it
# leaves (checked under the session's send lock); returns whether it went out
GuardedSend = Callable[[dict[str, Any], Callable[[], bool] | None], Awaitable[bool]]


class AudioSink(Protocol):
    epoch: int  # advanced by every clear() and close()

    async def push(self, chunk: np.ndarray, epoch: int) -> bool:
        """Plays the chunk unless the sink's epoch moved on from `epoch` before it left;
        returns whether it was played (False: dropped by a clear that came first)."""

    def heard_ms(self) -> float: ...

    def left_ms(self) -> float:
        """Audio pushed but not heard yet (0 once cleared)."""

    def clear(self) -> float:
        """Drops the audio not played yet and advances the epoch; returns heard_ms at that
        moment. Audio pushed in the new epoch plays on from there (a paused reply resumed)."""

    def close(self) -> None:
        """The response is over (cancelled): the epoch advances, nothing more is played."""


# the transport's factory: the response's ids (response_id, item_id, output_index,
# content_index) -> that response's sink
OpenSink = Callable[[dict[str, Any]], AudioSink]


def ms_of(samples: int, rate: int = WIRE_RATE) -> float:
    return samples * 1000.0 / rate


class WireAudioSink:
    """A websocket client's player: each chunk goes out as a `response.output_audio.delta`.

    The server cannot hear the client play, so it estimates: playback starts with the first
    delta and runs in real time (never past what was sent). A client that knows better says so
    with `conversation.item.truncate`, and the session takes its word instead.
    """

    def __init__(self, send: GuardedSend, ids: dict[str, Any], clock: Callable[[], float] = time.monotonic):
        self._send = send
        self._ids = ids
        self._clock = clock
        self.epoch = 0
        self._base_ms = 0.0  # heard before the last clear
        self._sent = 0  # samples since then
        self._started_at: float | None = None
        self._cleared_at_ms: float | None = None

    async def push(self, chunk: np.ndarray, epoch: int) -> bool:
        event = server_event("response.output_audio.delta", **self._ids, delta=encode_base64_pcm16(chunk))
        # decided and counted at the moment the frame leaves, under the session's send lock
        return await self._send(event, lambda: epoch == self.epoch and self._count(len(chunk)))

    def _count(self, samples: int) -> bool:
        if self._cleared_at_ms is not None:  # a resumed reply: playback restarts where it stopped
            self._base_ms, self._sent, self._started_at, self._cleared_at_ms = self._cleared_at_ms, 0, None, None
        if self._started_at is None:
            self._started_at = self._clock()
        self._sent += samples
        return True

    def heard_ms(self) -> float:
        if self._cleared_at_ms is not None:
            return self._cleared_at_ms
        if self._started_at is None:
            return self._base_ms
        return self._base_ms + min(ms_of(self._sent), (self._clock() - self._started_at) * 1000.0)

    def left_ms(self) -> float:
        return 0.0 if self._cleared_at_ms is not None else self._base_ms + ms_of(self._sent) - self.heard_ms()

    def clear(self) -> float:
        """The session tells the client to drop its queue (output_audio_buffer.cleared)."""
        self._cleared_at_ms = self.heard_ms()
        self.epoch += 1
        return self._cleared_at_ms

    def close(self) -> None:
        self.epoch += 1
