"""Clients of the Realtime API's beta dialect (the openai SDK's `client.beta.realtime`), against
the real server and models: flat session fields in, beta event names out."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from voice_app.realtime.beta_dialect import GA_TO_BETA_EVENT_NAMES, client_event_to_ga, server_event_to_beta

from ..clients import SdkClient, silence

pytestmark = pytest.mark.slow
GA_ONLY_NAMES = set(GA_TO_BETA_EVENT_NAMES)


async def test_a_beta_client_gets_a_text_answer_under_beta_names(voice_server):
    async with SdkClient(voice_server, beta=True) as client:
        await client.conn.session.update(session={"modalities": ["text"], "instructions": "Be brief."})
        await client.conn.conversation.item.create(item={
            "type": "message", "role": "user",
            "content": [{"type": "input_text", "text": "What is the capital of France?"}]})
        await client.conn.response.create()
        done = await client.wait_for(lambda e: e.type == "response.done")

    updated = client.of_type("session.updated")[0].session
    assert updated.modalities == ["text"] and updated.instructions == "Be brief."
    assert client.of_type("conversation.item.created")
    text = "".join(e.delta for e in client.of_type("response.text.delta"))
    assert done.response.status == "completed" and "paris" in text.lower(), text
    assert done.response.output[0].content[0].type == "text"
    assert not [e for e in client.events if e.type in GA_ONLY_NAMES]  # no GA names leak


async def test_a_beta_client_talks_and_hears_the_answer(voice_server, test_audio):
    async with SdkClient(voice_server, beta=True) as client:
        await client.conn.session.update(session={
            "modalities": ["text", "audio"], "input_audio_format": "pcm16", "output_audio_format": "pcm16",
            "turn_detection": {"type": "server_vad", "silence_duration_ms": 500}})
        await client.speak(np.concatenate([silence(0.3), test_audio["question"], silence(1.0)]))
        done = await client.wait_for(lambda e: e.type == "response.done")

    assert client.of_type("session.updated")[0].session.turn_detection.silence_duration_ms == 500
    heard = client.of_type("conversation.item.input_audio_transcription.completed")[0].transcript
    assert "capital of france" in heard.lower()
    audio = b"".join(base64.b64decode(e.delta) for e in client.of_type("response.audio.delta"))
    assert len(audio) > 24000 * 2 * 0.3
    spoken = client.of_type("response.audio_transcript.done")[0].transcript
    assert "paris" in spoken.lower(), spoken
    assert done.response.output[0].content[0].type == "audio"


async def test_a_beta_client_asking_for_g711_gets_an_error_naming_it(voice_server):
    async with SdkClient(voice_server, beta=True) as client:
        await client.conn.session.update(session={"input_audio_format": "g711_ulaw"})
        error = await client.wait_for(lambda e: e.type == "error")
    assert "format" in error.error.param
    assert "audio/pcmu" in error.error.message and "audio/pcm'" in error.error.message


def test_beta_session_fields_map_onto_the_ga_shape():
    beta = {"type": "session.update", "session": {
        "modalities": ["text", "audio"], "voice": "joe", "input_audio_format": "pcm16", "turn_detection": None,
        "max_response_output_tokens": 50, "temperature": 0.7}}
    ga = client_event_to_ga(beta)["session"]
    assert ga["output_modalities"] == ["audio"] and ga["max_output_tokens"] == 50
    assert ga["audio"]["input"] == {"format": {"type": "audio/pcm", "rate": 24000}, "turn_detection": None}
    assert ga["audio"]["output"] == {"voice": "joe"}
    transcription = {"model": "whisper-1", "language": "en"}
    assert client_event_to_ga({"type": "session.update", "session": {"input_audio_transcription": transcription}})[
        "session"] == {"audio": {"input": {"transcription": transcription}}}
    assert client_event_to_ga({"type": "response.create", "response": {"modalities": ["text"]}}) == {
        "type": "response.create", "response": {"output_modalities": ["text"]}}
    assert client_event_to_ga("not an object") == "not an object"
    renamed = server_event_to_beta({"type": "response.output_audio_transcript.delta", "delta": "Hi"})
    assert renamed == {"type": "response.audio_transcript.delta", "delta": "Hi"}
