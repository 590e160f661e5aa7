"""Test clients of a session: an in-process event log (a transport's end of a Session) and the
official openai SDK against the real server. Both wait for events with realtime/event_feed.py,
the same helper the load generator uses."""

from __future__ import annotations

import asyncio
import base64
from typing import Any, Callable

import numpy as np
from openai import AsyncOpenAI

from voice_app.realtime.event_feed import EventFeed

CHUNK = 2400  # 100 ms at 24 kHz


async def first_match(feed: EventFeed, predicate: Callable[[Any], bool], timeout_s: float, start: int,
                      describe: Callable[[], list[str]]) -> Any:
    try:
        return (await feed.wait_for(predicate, start, timeout_s))[1]
    except TimeoutError:
        raise AssertionError(f"no matching event within {timeout_s} s; got {describe()}") from None


class EventLog:
    """Records every server event a Session sends (pass `log.send` as its `send`)."""

    def __init__(self, on_event: Callable[[dict[str, Any]], None] | None = None) -> None:
        self._feed: EventFeed[dict[str, Any]] = EventFeed()
        self.events = self._feed.items
        self._on_event = on_event  # sees each event as it is sent, before the next one

    async def send(self, event: dict[str, Any]) -> None:
        if self._on_event is not None:
            self._on_event(event)
        self._feed.append(event)

    def of_type(self, event_type: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == event_type]

    def types(self) -> list[str]:
        return [e["type"] for e in self.events]

    async def wait_for(self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 30.0,
                       start: int = 0) -> dict[str, Any]:
        """The first event from index `start` on that matches; waits for it to arrive."""
        return await first_match(self._feed, predicate, timeout, start, self.types)


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(24000 * seconds), dtype=np.int16)


async def stream_audio(push: Callable[[np.ndarray], Any], samples: np.ndarray, realtime: bool = True) -> None:
    """Feeds audio in 100 ms chunks, paced like a microphone when `realtime`."""
    for offset in range(0, len(samples), CHUNK):
        await push(samples[offset : offset + CHUNK])
        await asyncio.sleep(0.1 if realtime else 0)


class SdkClient:
    """The official openai SDK's realtime client, recording every event it receives; beta=True:
    its beta client (`client.beta.realtime`, which sends `OpenAI-Beta: realtime=v1`)."""

    def __init__(self, server, beta: bool = False):
        self.client = AsyncOpenAI(api_key="sk-test-not-checked", websocket_base_url=server.ws_url)
        self.beta = beta
        self._feed: EventFeed[Any] = EventFeed()
        self.events = self._feed.items

    async def __aenter__(self):
        realtime = self.client.beta.realtime if self.beta else self.client.realtime
        self._manager = realtime.connect(model="smollm2-135m-bd")
        self.conn = await self._manager.__aenter__()
        self._reader = asyncio.create_task(self._read())
        return self

    async def __aexit__(self, *exc):
        self._reader.cancel()
        await self._manager.__aexit__(*exc)

    async def _read(self):
        async for event in self.conn:
            self._feed.append(event)

    async def speak(self, samples: np.ndarray, realtime: bool = True) -> None:
        for offset in range(0, len(samples), CHUNK):
            chunk = samples[offset : offset + CHUNK].astype("<i2").tobytes()
            await self.conn.input_audio_buffer.append(audio=base64.b64encode(chunk).decode())
            await asyncio.sleep(0.1 if realtime else 0)

    async def wait_for(self, predicate, timeout_s: float = 60.0, start: int = 0):
        return await first_match(self._feed, predicate, timeout_s, start, lambda: [e.type for e in self.events])

    def of_type(self, event_type: str) -> list:
        return [e for e in self.events if e.type == event_type]
