"""The websocket's audio sink: deltas on the wire, and the server's estimate of what was heard."""

from __future__ import annotations

import base64

import numpy as np

from voice_app.core.audio_sink import WireAudioSink


class Clock:
    def __init__(self) -> None:
        self.now = 64.0  # steps of 1/4 and 1/8 s add up exactly in binary

    def __call__(self) -> float:
        return self.now


async def test_the_wire_sink_sends_deltas_and_estimates_real_time_playback_from_the_first():
    sent: list[dict] = []

    async def send(event: dict, still_current=None) -> bool:  # the session's guarded send
        if still_current is not None and not still_current():
            return False
        sent.append(event)
        return True

    clock = Clock()
    ids = {"response_id": "resp_1", "item_id": "item_1", "output_index": 0, "content_index": 0}
    sink = WireAudioSink(send, ids, clock)
    assert (sink.heard_ms(), sink.left_ms()) == (0.0, 0.0)
    for _ in range(3):
        assert await sink.push(np.ones(4800, dtype=np.int16), sink.epoch)  # 200 ms each
    assert [e["type"] for e in sent] == ["response.output_audio.delta"] * 3
    assert {k: sent[0][k] for k in ids} == ids and len(base64.b64decode(sent[0]["delta"])) == 9600

    clock.now += 0.25
    assert (sink.heard_ms(), sink.left_ms()) == (250.0, 350.0)
    clock.now += 10.0
    assert (sink.heard_ms(), sink.left_ms()) == (600.0, 0.0)  # never past what was sent

    sink = WireAudioSink(send, ids, clock)
    epoch = sink.epoch
    await sink.push(np.ones(24000, dtype=np.int16), epoch)
    clock.now += 0.375
    assert sink.clear() == 375.0
    clock.now += 5.0
    assert (sink.heard_ms(), sink.left_ms()) == (375.0, 0.0)  # the client dropped the rest
    sent.clear()
    assert not await sink.push(np.ones(4800, dtype=np.int16), epoch)  # decided before the clear: dropped
    assert not sent and sink.heard_ms() == 375.0
    assert await sink.push(np.ones(4800, dtype=np.int16), sink.epoch)  # a resume: plays on from 375 ms
    clock.now += 0.125
    assert (sink.heard_ms(), sink.left_ms()) == (500.0, 75.0)
    sink.close()
    assert not await sink.push(np.ones(4800, dtype=np.int16), sink.epoch - 1) and len(sent) == 1
