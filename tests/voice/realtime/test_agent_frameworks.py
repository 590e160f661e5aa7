"""Voice-agent frameworks people build on, with their default settings, against the real server
and models (issue 17): openai-agents' RealtimeAgent / RealtimeRunner and LiveKit Agents' OpenAI
realtime plugin (its RealtimeSession driven directly, without a LiveKit room). Each holds a text
turn and a spoken one; the server sends them no `error` and no x_... event (they did not ask),
and the frameworks log no schema error about anything the server sent."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import numpy as np
import pytest

from voice_app.realtime.event_feed import EventFeed

from ..clients import first_match, silence

pytestmark = pytest.mark.slow

QUESTION = "What is the capital of France?"


def framework_errors(caplog, *loggers: str) -> list[str]:
    return [f"{r.name}: {r.getMessage()[:300]}" for r in caplog.records
            if r.levelno >= logging.ERROR and r.name.startswith(loggers)]


# ---- openai-agents ---------------------------------------------------------------------------


class AgentsSession:
    """openai-agents' realtime session on our server: RealtimeRunner(RealtimeAgent) with only the
    URL and a key set; every session event and every raw server event kept."""

    def __init__(self, server):
        self.server = server
        self._feed: EventFeed[Any] = EventFeed()
        self.events = self._feed.items
        self.server_events: list[dict[str, Any]] = []

    async def __aenter__(self) -> "AgentsSession":
        from agents import set_tracing_disabled
        from agents.realtime import RealtimeAgent, RealtimeRunner

        set_tracing_disabled(True)  # the SDK's trace export would call api.openai.com
        agent = RealtimeAgent(name="Assistant", instructions="You are a helpful voice assistant.")
        runner = RealtimeRunner(agent)
        self.session = await runner.run(model_config={
            "url": self.server.ws_url + "/realtime?model=gpt-realtime", "api_key": "sk-test-not-checked"})
        await self.session.__aenter__()
        self._reader = asyncio.create_task(self._read())
        return self

    async def __aexit__(self, *exc) -> None:
        self._reader.cancel()
        await self.session.__aexit__(*exc)

    async def _read(self) -> None:
        async for event in self.session:
            if event.type == "raw_model_event" and event.data.type == "raw_server_event":
                self.server_events.append(event.data.data)
            self._feed.append(event)

    async def wait_for(self, predicate, timeout_s: float = 90.0, start: int = 0) -> Any:
        return await first_match(self._feed, predicate, timeout_s, start, lambda: [e.type for e in self.events])

    def server_types(self) -> list[str]:
        return [e.get("type") for e in self.server_events]

    def transcripts(self, role: str) -> list[str]:
        history = self.session._history  # what the SDK's history_updated events carry
        texts = []
        for item in history:
            if getattr(item, "role", None) != role:
                continue
            for part in item.content:
                text = getattr(part, "transcript", None) or getattr(part, "text", None)
                if text:
                    texts.append(text)
        return texts


async def test_openai_agents_realtime_agent_holds_a_text_and_a_spoken_turn(voice_server, test_audio, caplog):
    caplog.set_level(logging.INFO)
    async with AgentsSession(voice_server) as client:
        await client.session.send_message(QUESTION)
        await client.wait_for(lambda e: e.type == "agent_end")
        audio = [e for e in client.events if e.type == "audio"]
        assert audio and sum(len(e.audio.data) for e in audio) > 24000 * 2 * 0.3, "at least 0.3 s of speech"
        assert any("paris" in text.lower() for text in client.transcripts("assistant")), client.transcripts("assistant")

        # a spoken turn, in the 100 ms chunks a microphone loop sends, under the SDK's default
        # semantic_vad with interrupt_response
        start = len(client.events)
        speech = np.concatenate([silence(0.3), test_audio["question"], silence(1.2)])
        for offset in range(0, len(speech), 2400):
            await client.session.send_audio(speech[offset:offset + 2400].astype("<i2").tobytes())
            await asyncio.sleep(0.1)
        await client.wait_for(lambda e: e.type == "agent_end", start=start)
        heard = [t for t in client.transcripts("user") if "capital of france" in t.lower()]
        assert heard, client.transcripts("user")

    types = client.server_types()
    assert "session.updated" in types and "response.done" in types
    assert not [e for e in client.events if e.type == "error"], [e.error for e in client.events if e.type == "error"]
    assert "error" not in types, [e for e in client.server_events if e.get("type") == "error"]
    assert not [t for t in types if t.startswith("x_")], "x_ events only for clients that ask"
    updated = [e for e in client.server_events if e["type"] == "session.updated"][0]["session"]
    assert updated["audio"]["output"]["voice"] == "ash"  # the SDK's default voice, accepted
    assert updated["audio"]["input"]["turn_detection"]["type"] == "semantic_vad"
    done = [e for e in client.server_events if e["type"] == "response.done"]
    assert all(e["response"]["usage"]["output_tokens"] > 0 for e in done)
    assert not framework_errors(caplog, "openai.agents", "agents"), framework_errors(caplog, "openai.agents", "agents")


# ---- LiveKit Agents (livekit-plugins-openai) --------------------------------------------------


class LiveKitSession:
    """LiveKit's OpenAI RealtimeModel pointed at our server (base_url and a key, nothing else),
    its RealtimeSession driven directly: no LiveKit room or server is needed for that."""

    def __init__(self, server):
        self.server = server
        self._feed: EventFeed[dict[str, Any]] = EventFeed()
        self.server_events = self._feed.items
        self.errors: list[Any] = []
        self.generations: list[Any] = []

    async def __aenter__(self) -> "LiveKitSession":
        from livekit.plugins.openai.realtime import RealtimeModel

        self.model = RealtimeModel(base_url=self.server.base_url + "/v1", api_key="sk-test-not-checked")
        self.session = self.model.session()
        self.session.on("openai_server_event_received", self._feed.append)
        self.session.on("error", self.errors.append)
        self.session.on("generation_created", self.generations.append)
        return self

    async def __aexit__(self, *exc) -> None:
        await self.session.aclose()
        await self.model.aclose()

    async def wait_for_server_event(self, predicate, timeout_s: float = 90.0, start: int = 0) -> dict[str, Any]:
        return await first_match(self._feed, predicate, timeout_s, start,
                                 lambda: [e.get("type") for e in self.server_events])


async def read_generation(generation) -> tuple[str, int]:
    """A generation's text (the audio's transcript) and how many audio samples it carried."""
    text, samples = [], 0
    async for message in generation.message_stream:
        async def read_text():
            async for piece in message.text_stream:
                text.append(str(piece))

        async def read_audio():
            nonlocal samples
            async for frame in message.audio_stream:
                samples += frame.samples_per_channel
        await asyncio.gather(read_text(), read_audio())
    return "".join(text), samples


async def test_livekit_realtime_session_generates_replies_to_text_and_speech(voice_server, test_audio, caplog):
    from livekit import rtc

    caplog.set_level(logging.INFO)
    async with LiveKitSession(voice_server) as client:
        await client.session.update_instructions("You are a helpful voice assistant.")
        chat_ctx = client.session.chat_ctx.copy()
        chat_ctx.add_message(role="user", content=QUESTION)
        await client.session.update_chat_ctx(chat_ctx)
        # generate_reply() resolves when a response.created carries its metadata.client_event_id
        generation = await asyncio.wait_for(client.session.generate_reply(), 30)
        assert generation.user_initiated
        text, samples = await asyncio.wait_for(read_generation(generation), 120)
        assert "paris" in text.lower(), text
        assert samples > 24000 * 0.3, "at least 0.3 s of speech"
        created = [e for e in client.server_events if e["type"] == "response.created"][0]
        assert created["response"]["metadata"]["client_event_id"].startswith("response_create_")

        # a spoken turn: 20 ms frames (LiveKit's rtc frames), its default semantic_vad turn-taking
        await client.wait_for_server_event(lambda e: e["type"] == "response.done")
        start = len(client.generations)
        speech = np.concatenate([silence(0.3), test_audio["question"], silence(1.2)])
        for offset in range(0, len(speech), 480):
            chunk = speech[offset:offset + 480]
            client.session.push_audio(rtc.AudioFrame(chunk.astype("<i2").tobytes(), 24000, 1, len(chunk)))
            await asyncio.sleep(0.02)
        heard = await client.wait_for_server_event(
            lambda e: e["type"] == "conversation.item.input_audio_transcription.completed")
        assert "capital of france" in heard["transcript"].lower(), heard
        await client.wait_for_server_event(lambda e: e["type"] == "response.done"
                                           and client.server_events.index(e) > client.server_events.index(heard))
        assert len(client.generations) > start and not client.generations[-1].user_initiated
        user_items = [item for item in client.session.chat_ctx.items
                      if item.type == "message" and item.role == "user"]
        assert any("capital of france" in (item.text_content or "").lower() for item in user_items[1:]), user_items

    types = [e.get("type") for e in client.server_events]
    assert not client.errors, client.errors
    assert "error" not in types, [e for e in client.server_events if e.get("type") == "error"]
    assert not [t for t in types if t.startswith("x_")], "x_ events only for clients that ask"
    updated = [e for e in client.server_events if e["type"] == "session.updated"][0]["session"]
    assert updated["audio"]["input"]["turn_detection"]["type"] == "semantic_vad"
    errors = framework_errors(caplog, "livekit")
    assert not errors, errors
    warnings = [r.getMessage() for r in caplog.records if r.name.startswith("livekit") and r.levelno >= logging.WARNING]
    print("livekit warnings:", warnings)
    assert not [w for w in warnings if "rejected" in w or "error" in w.lower()], warnings
