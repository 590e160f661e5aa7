"""The official openai SDK as a test client of the real server."""

from __future__ import annotations

import asyncio
import base64
import time

import numpy as np
from openai import AsyncOpenAI

from tests.voice.session_driver import CHUNK


class SdkClient:
    """The official openai SDK's realtime client, recording every event it receives; beta=True:
    its beta client (`client.beta.realtime`, which sends `OpenAI-Beta: realtime=v1`)."""

    def __init__(self, server, beta: bool = False):
        self.client = AsyncOpenAI(api_key="sk-test-not-checked", websocket_base_url=server.ws_url)
        self.beta = beta
        self.events: list = []

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
            self.events.append(event)

    async def speak(self, samples: np.ndarray, realtime: bool = True) -> None:
        for offset in range(0, len(samples), CHUNK):
            chunk = samples[offset : offset + CHUNK].astype("<i2").tobytes()
            await self.conn.input_audio_buffer.append(audio=base64.b64encode(chunk).decode())
            await asyncio.sleep(0.1 if realtime else 0)

    async def wait_for(self, predicate, timeout_s: float = 60.0, start: int = 0):
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for event in self.events[start:]:
                if predicate(event):
                    return event
            await asyncio.sleep(0.02)
        raise AssertionError(f"no matching event; got {[e.type for e in self.events]}")

    def of_type(self, event_type: str) -> list:
        return [e for e in self.events if e.type == event_type]
