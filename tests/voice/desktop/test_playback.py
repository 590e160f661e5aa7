"""The speaker's queue counts what it really played of each reply."""

from __future__ import annotations

import numpy as np

from voice_app.desktop.playback import Speaker


async def test_the_device_sink_reports_the_samples_the_output_stream_took():
    speaker = Speaker(rate=24000)  # the reply's own rate: no resampling, exact counts
    first = speaker.open_sink({})
    assert await first.push(np.full(4800, 1000, dtype=np.int16), first.epoch)
    second = speaker.open_sink({})
    await second.push(np.full(2400, -1000, dtype=np.int16), second.epoch)
    assert (first.heard_ms(), first.left_ms(), second.left_ms()) == (0.0, 200.0, 100.0)

    pulled = speaker.pull(6000)  # one device callback: all of the first reply, half of the second
    assert (pulled[:4800] > 0).all() and (pulled[4800:] < 0).all()
    assert (first.heard_ms(), first.left_ms()) == (200.0, 0.0)
    assert (second.heard_ms(), second.left_ms()) == (50.0, 50.0)

    assert second.clear() == 50.0  # barge-in: what came out of the speaker, not an estimate
    assert second.left_ms() == 0.0 and speaker.pull(480).tolist() == [0] * 480
    # a chunk decided before the clear (its epoch read then) is never queued after it
    assert not await second.push(np.full(2400, -1000, dtype=np.int16), second.epoch - 1)
    assert second.left_ms() == 0.0


async def test_replies_are_resampled_to_the_device_rate():
    speaker = Speaker(rate=48000)
    sink = speaker.open_sink({})
    for _ in range(10):
        await sink.push(np.full(2400, 1000, dtype=np.int16), sink.epoch)  # 1 s at 24 kHz in 100 ms chunks
    queued_samples = sink.left_ms() * 48  # at the device's 48 kHz
    # an amount of audio: 1 s in, all but the few samples the resampler holds back until more comes
    assert 0.9 * 48000 < queued_samples <= 48000
    speaker.pull(48000)
    assert sink.heard_ms() * 48 == queued_samples and sink.left_ms() == 0.0
