"""A dead sound device ends desktop mode with its diagnosis, even when the driver then blocks
in its stream calls (PortAudio over a PulseAudio server that died): the fake PortAudio here
hangs in abort() the way such a driver can; the real device path is in test_desktop.py."""

from __future__ import annotations

import asyncio
import threading

from voice_app.desktop import transport
from voice_app.desktop.console import Console
from voice_app.desktop.devices import EXIT_AUDIO_DEVICE, AudioDevices
from voice_app.desktop.transport import DesktopTransport
from voice_app.settings import Settings

from ..fakes import ScriptedModels

DEVICE = {"index": 0, "name": "fake card", "default_low_input_latency": 0.01, "default_low_output_latency": 0.01}


class HangingPortAudio:
    """Streams that never call back (the server is gone) and block in abort() until released."""

    class PortAudioError(Exception):
        pass

    def __init__(self):
        self.released = threading.Event()
        self.aborts = 0
        outer = self

        class Stream:
            def __init__(self, **kwargs):
                self.started = False

            def start(self):
                self.started = True

            def abort(self):
                outer.aborts += 1
                outer.released.wait(timeout=30)

            def close(self):
                pass

        self.InputStream = self.OutputStream = Stream

    def query_devices(self):
        return ["0 fake card, ALSA (1 in, 1 out)"]


async def test_a_device_that_stops_and_then_blocks_its_teardown_still_exits_2_with_the_reason(monkeypatch, capsys):
    sd = HangingPortAudio()
    exits: list[int] = []

    def exit_now(code: int) -> None:  # instead of os._exit: record, and let the teardown finish
        exits.append(code)
        sd.released.set()

    monkeypatch.setattr(transport, "MIC_STALL_S", 0.2)
    monkeypatch.setattr(transport, "TEARDOWN_LIMIT_S", 0.3)
    monkeypatch.setattr(transport, "_exit_now", exit_now)
    devices = AudioDevices(DEVICE, DEVICE, 16000, 24000)
    desktop = DesktopTransport(sd, devices, ScriptedModels(), Settings(), None, Console())
    await asyncio.wait_for(desktop.run(), timeout=20)

    assert exits == [EXIT_AUDIO_DEVICE]  # the deadline fired while abort() was blocked
    assert sd.aborts >= 1
    assert desktop.failure is not None and "delivered no audio" in desktop.failure
    reported = capsys.readouterr().err  # said at once, before the teardown that blocked
    assert "delivered no audio" in reported and "Devices found:" in reported and "fake card" in reported


async def test_a_clean_stop_needs_no_deadline(monkeypatch):
    sd = HangingPortAudio()
    sd.released.set()  # abort() returns at once
    exits: list[int] = []
    monkeypatch.setattr(transport, "_exit_now", exits.append)
    desktop = DesktopTransport(sd, AudioDevices(DEVICE, DEVICE, 16000, 24000), ScriptedModels(), Settings(), None,
                               Console())
    running = asyncio.ensure_future(desktop.run())
    await asyncio.sleep(0.2)
    desktop._stop.set()  # what Ctrl-C does
    await asyncio.wait_for(running, timeout=20)
    assert desktop.failure is None and exits == [] and sd.aborts == 2
