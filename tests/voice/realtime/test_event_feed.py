"""The event feed every test client and the load generator wait on."""

from __future__ import annotations

import asyncio

import pytest

from voice_app.realtime.event_feed import EventFeed


async def test_a_wait_finds_a_past_event_or_the_next_matching_one():
    feed: EventFeed[str] = EventFeed()
    feed.append("a")
    assert await feed.wait_for(lambda item: item == "a") == (0, "a")
    waiting = asyncio.ensure_future(feed.wait_for(lambda item: item.startswith("b"), start=1))
    for item in ("c", "b1", "b2"):
        await asyncio.sleep(0)
        feed.append(item)
    assert await waiting == (2, "b1")


async def test_a_wait_ends_with_the_feed_or_its_timeout():
    feed: EventFeed[str] = EventFeed()
    with pytest.raises(TimeoutError, match="no greeting within 0 s"):
        await feed.wait_for(lambda item: True, timeout_s=0.01, what="greeting")
    waiting = asyncio.ensure_future(feed.wait_for(lambda item: item == "never"))
    await asyncio.sleep(0)
    feed.end(ConnectionError("gone"))
    with pytest.raises(ConnectionError, match="gone"):
        await waiting
