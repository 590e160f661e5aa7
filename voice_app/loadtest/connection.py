"""One realtime websocket as the load generator uses it: every received event kept, with its
arrival time, for the simulated user's waits."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any, Callable

from voice_app.realtime.event_feed import EventFeed


class SessionClosed(Exception):
    def __init__(self, code: int | None, reason: str):
        super().__init__(f"connection closed (code {code}: {reason or 'no reason'})")
        self.code, self.reason = code, reason


@dataclass
class ReceivedEvent:
    at: float  # time.monotonic() on arrival
    event: dict[str, Any]


class RealtimeConnection:
    """A websocket to /v1/realtime; every received event is kept, in order, for the waiters."""

    def __init__(self, websocket: Any):
        self.ws = websocket
        self._feed: EventFeed[ReceivedEvent] = EventFeed()
        self.events = self._feed.items
        self._reader = asyncio.create_task(self._read())

    @property
    def closed(self) -> SessionClosed | None:
        return self._feed.ended  # type: ignore[return-value]

    async def _read(self) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            async for message in self.ws:
                self._feed.append(ReceivedEvent(time.monotonic(), json.loads(message)))
        except ConnectionClosed:
            pass
        self._feed.end(SessionClosed(self.ws.close_code, self.ws.close_reason or ""))

    async def send(self, event: dict[str, Any]) -> None:
        await self.ws.send(json.dumps(event))

    async def wait_for(self, predicate: Callable[[dict[str, Any]], bool], start: int, timeout_s: float,
                       what: str) -> tuple[int, ReceivedEvent]:
        """The first event at index >= start matching `predicate`, as (index, event);
        SessionClosed once the connection closed without one."""
        return await self._feed.wait_for(lambda received: predicate(received.event), start, timeout_s, what)

    async def close(self) -> None:
        await self.ws.close()
        await self._reader


def of_type(event_type: str, response_id: str | None = None) -> Callable[[dict[str, Any]], bool]:
    def matches(event: dict[str, Any]) -> bool:
        if event.get("type") != event_type:
            return False
        if response_id is None:
            return True
        found = event.get("response_id") or (event.get("response") or {}).get("id")
        return found == response_id
    return matches
