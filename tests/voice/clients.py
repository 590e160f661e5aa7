"""Test clients of a session: an in-process event log (a transport's end of a Session) and the
official openai SDK against the real server. Both wait for events with realtime/event_feed.py,
the same helper the load generator uses."""

from __future__ import annotations

import asyncio
import base64
import json
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


class GatedLog(EventLog):
    """An EventLog whose transport can stall: `hold(predicate)` makes the next matching event's
    send wait (as a slow websocket write does, holding the session's send lock) until the
    returned gate is set; `stalled` is set once an event waits there."""

    def __init__(self) -> None:
        super().__init__()
        self._holds: list[tuple[Callable[[dict[str, Any]], bool], asyncio.Event]] = []
        self.stalled = asyncio.Event()

    def hold(self, predicate: Callable[[dict[str, Any]], bool]) -> asyncio.Event:
        gate = asyncio.Event()
        self._holds.append((predicate, gate))
        return gate

    async def send(self, event: dict[str, Any]) -> None:
        for index, (predicate, gate) in enumerate(self._holds):
            if predicate(event):
                del self._holds[index]
                self.stalled.set()
                await gate.wait()
                break
        await super().send(event)


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
        # our x_... events too (partials, drafts, turn metrics): the tests look at them
        self._manager = realtime.connect(model="smollm2-135m-bd", extra_query={"x_events": "1"})
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


class PacedClient:
    """A websocket client that reads its socket at a set pace (bytes a second; 0: not at all),
    with a small receive buffer, so the server meets a slow or stalled reader at the TCP level
    (a phone on a bad network, a frozen tab): websockets' sans-I/O protocol on a raw socket."""

    def __init__(self, url: str, read_bytes_per_s: float | None = None, receive_buffer: int = 4096):
        from websockets.client import ClientProtocol
        from websockets.uri import parse_uri

        self.uri = parse_uri(url)
        self.protocol = ClientProtocol(self.uri, max_size=None)
        self.read_bytes_per_s = read_bytes_per_s  # None: as fast as it comes
        self.receive_buffer = receive_buffer
        self.bytes_read = 0
        self._feed: EventFeed[dict[str, Any]] = EventFeed()
        self.events = self._feed.items
        self._reading = asyncio.Event()
        self._reading.set()

    async def open(self) -> "PacedClient":
        import socket

        loop = asyncio.get_running_loop()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.receive_buffer)
        self.sock.setblocking(False)
        await loop.sock_connect(self.sock, (self.uri.host, self.uri.port))
        self.protocol.send_request(self.protocol.connect())
        await self._flush()
        self._reader = asyncio.create_task(self._read())
        return self

    def stop_reading(self) -> None:
        self._reading.clear()

    async def send(self, event: dict[str, Any]) -> None:
        self.protocol.send_text(json.dumps(event).encode())
        await self._flush()

    async def wait_for(self, predicate: Callable[[dict[str, Any]], bool], timeout_s: float = 60.0,
                       start: int = 0) -> dict[str, Any]:
        return await first_match(self._feed, predicate, timeout_s, start, lambda: [e["type"] for e in self.events])

    def close(self) -> None:
        self._reader.cancel()
        self.sock.close()

    async def _flush(self) -> None:
        data = b"".join(self.protocol.data_to_send())
        if data:
            await asyncio.get_running_loop().sock_sendall(self.sock, data)

    async def _read(self) -> None:
        from websockets.frames import Frame, Opcode

        loop = asyncio.get_running_loop()
        while True:
            await self._reading.wait()
            chunk = await loop.sock_recv(self.sock, 1024 if self.read_bytes_per_s else 65536)
            if not chunk:
                self._feed.end(ConnectionError("the server closed the connection"))
                return
            self.bytes_read += len(chunk)
            self.protocol.receive_data(chunk)
            for received in self.protocol.events_received():
                if isinstance(received, Frame) and received.opcode == Opcode.TEXT:
                    self._feed.append(json.loads(received.data))
            await self._flush()  # pongs and the closing handshake
            if self.read_bytes_per_s:
                await asyncio.sleep(len(chunk) / self.read_bytes_per_s)
