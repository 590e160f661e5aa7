"""When a draining server may close a session: WebSocketTransport.busy, from the events it carries."""

from __future__ import annotations

import asyncio

from voice_app.realtime import websocket_transport
from voice_app.realtime.websocket_transport import WebSocketTransport
from voice_app.settings import Settings


class RecordingSocket:
    """The transport's end of a websocket: takes text frames."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    async def send_text(self, text: str) -> None:
        self.sent.append(text)


def transport() -> WebSocketTransport:
    return WebSocketTransport(RecordingSocket(), Settings(whisper_model="unused", piper_voice="unused"), beta=False)


async def test_a_reply_keeps_the_session_busy_until_its_done():
    carrier = transport()
    assert not carrier.busy
    await carrier.send({"type": "response.created", "response": {"id": "resp_1"}})
    await carrier.send({"type": "response.output_text.delta", "response_id": "resp_1", "delta": "Hi"})
    assert carrier.busy
    await carrier.send({"type": "response.created", "response": {"id": "resp_2"}})  # a second, out of band
    await carrier.send({"type": "response.done", "response": {"id": "resp_1"}})
    assert carrier.busy
    await carrier.send({"type": "response.done", "response": {"id": "resp_2"}})
    assert not carrier.busy


async def test_a_user_turn_is_busy_while_spoken_and_until_answered_or_given_up(monkeypatch):
    monkeypatch.setattr(websocket_transport, "TURN_ANSWER_WAIT_S", 0.2)
    carrier = transport()
    await carrier.send({"type": "input_audio_buffer.speech_started"})
    assert carrier.busy
    await carrier.send({"type": "input_audio_buffer.speech_stopped"})
    assert carrier.busy  # its reply is about to be created
    await carrier.send({"type": "response.created", "response": {"id": "resp_1"}})
    await carrier.send({"type": "response.done", "response": {"id": "resp_1"}})
    assert not carrier.busy
    # words that get no reply (a cough): busy only for the wait
    await carrier.send({"type": "input_audio_buffer.speech_started"})
    await carrier.send({"type": "input_audio_buffer.speech_stopped"})
    assert carrier.busy
    await asyncio.sleep(0.25)
    assert not carrier.busy
