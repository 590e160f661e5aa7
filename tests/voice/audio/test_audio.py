"""PCM16 validation and the input buffer."""

from __future__ import annotations

import numpy as np
import pytest

from voice_app.audio.buffer import InputBuffer
from voice_app.audio.pcm import AudioFormatError, decode_base64_pcm16, encode_base64_pcm16


def test_input_buffer_addresses_samples_by_stream_index():
    buffer = InputBuffer(max_samples=100)
    buffer.append(np.arange(60, dtype=np.float32))
    buffer.append(np.arange(60, 120, dtype=np.float32))
    assert buffer.start == 20 and buffer.end == 120  # only the newest 100 kept
    assert buffer.slice(10, 25).tolist() == [20, 21, 22, 23, 24]
    buffer.drop_before(100)
    assert buffer.slice(0).tolist() == list(range(100, 120))
    buffer.clear()
    assert buffer.start == buffer.end == 120 and len(buffer.slice(0)) == 0


def test_pcm16_base64_validation():
    samples = np.array([0, 1, -1, 32767, -32768], dtype=np.int16)
    assert decode_base64_pcm16(encode_base64_pcm16(samples)).tolist() == samples.tolist()
    with pytest.raises(AudioFormatError, match="base64"):
        decode_base64_pcm16("not base64!!")
    with pytest.raises(AudioFormatError, match="odd length"):
        decode_base64_pcm16("AAAA")  # 3 bytes
