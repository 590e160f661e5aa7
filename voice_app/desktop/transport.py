"""One Session on the sound card: mic frames in, reply audio out, events to the console."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import time
from typing import Any

import numpy as np

from voice_app.core.models import Models
from voice_app.core.session import Session
from voice_app.desktop.console import Console
from voice_app.desktop.devices import (EXIT_AUDIO_DEVICE, AudioDeviceError, AudioDevices, choose_hint,
                                       describe_devices)
from voice_app.desktop.echo_gate import EchoGate
from voice_app.desktop.playback import Speaker
from voice_app.settings import Settings

BLOCK_MS = 20
# no mic frame for this long means the input is dead (a sound server that died can leave the
# stream "running" without callbacks, or spinning in ALSA's underrun recovery)
MIC_STALL_S = 5.0
# after a device failure, the longest the teardown may take before the process exits anyway:
# a driver whose sound server died can block in its stream calls for good
TEARDOWN_LIMIT_S = 10.0


class DesktopTransport:
    """Runs one Session on the sound card until stopped."""

    def __init__(self, sd: Any, devices: AudioDevices, models: Models, settings: Settings,
                 echo_gate: EchoGate | None, console: Console):
        self.sd = sd
        self.devices = devices
        self.models = models
        self.settings = settings
        self.echo_gate = echo_gate
        self.console = console
        self.speaker = Speaker(devices.output_rate)
        self._mic: asyncio.Queue[tuple[np.ndarray, float]] = asyncio.Queue(maxsize=500)
        self._stop = asyncio.Event()
        self.failure: str | None = None

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, self._stop.set)
        # in-process: the console shows the x_... events (partials, turn metrics)
        session = Session(self.models, self.settings, send=self._on_event, open_sink=self.speaker.open_sink,
                          x_events=True)
        input_stream, output_stream = self._open_streams(loop)
        try:
            await session.start()
            try:
                self._start_streams(input_stream, output_stream)
                self.console.say(f"listening on {self.devices.input['name']!r} ({self.devices.input_rate} Hz), "
                                 f"speaking on {self.devices.output['name']!r} ({self.devices.output_rate} Hz); "
                                 "Ctrl-C to quit")
                await self._pump_mic(session)
            finally:
                self._close_streams(input_stream, output_stream)
        finally:
            await session.close()  # cancels engine requests and TTS work in flight
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(signum)

    def _open_streams(self, loop: asyncio.AbstractEventLoop) -> tuple[Any, Any]:
        def on_mic(indata: np.ndarray, frames: int, timing: Any, status: Any) -> None:
            captured_at = time.monotonic() - self.devices.input["default_low_input_latency"]
            loop.call_soon_threadsafe(self._queue_mic, indata[:, 0].copy(), captured_at)

        def on_speaker(outdata: np.ndarray, frames: int, timing: Any, status: Any) -> None:
            samples = self.speaker.pull(frames)
            outdata[:, 0] = samples
            if self.echo_gate is not None:
                self.echo_gate.played(samples, time.monotonic() + self.devices.output["default_low_output_latency"])

        def on_stream_end() -> None:  # a stream that ends by itself means the device failed
            if not self._stop.is_set():
                loop.call_soon_threadsafe(self._fail, "an audio stream stopped unexpectedly (device unplugged?)")

        try:
            input_stream = self.sd.InputStream(
                device=self.devices.input["index"], samplerate=self.devices.input_rate, channels=1, dtype="int16",
                blocksize=self.devices.input_rate * BLOCK_MS // 1000, callback=on_mic, finished_callback=on_stream_end)
            output_stream = self.sd.OutputStream(
                device=self.devices.output["index"], samplerate=self.devices.output_rate, channels=1, dtype="int16",
                blocksize=self.devices.output_rate * BLOCK_MS // 1000, callback=on_speaker,
                finished_callback=on_stream_end)
        except self.sd.PortAudioError as exc:
            raise AudioDeviceError(f"cannot open the audio streams: {exc}\nDevices found:\n"
                                   f"{describe_devices(self.sd)}\n{choose_hint()}") from exc
        return input_stream, output_stream

    def _start_streams(self, *streams: Any) -> None:
        try:
            for stream in streams:
                stream.start()
        except self.sd.PortAudioError as exc:
            raise AudioDeviceError(f"cannot start the audio streams: {exc}\nDevices found:\n"
                                   f"{describe_devices(self.sd)}\n{choose_hint()}") from exc

    def _close_streams(self, *streams: Any) -> None:
        for stream in streams:
            try:
                stream.abort()  # not stop(): that drains the speaker, which a dead device never does
                stream.close()
            except self.sd.PortAudioError:
                pass  # a failed device is reported already; closing the other stream matters more

    def _queue_mic(self, samples: np.ndarray, captured_at: float) -> None:
        if self._mic.full():  # the loop fell behind: drop the oldest frame, never block the device
            self._mic.get_nowait()
        self._mic.put_nowait((samples, captured_at))

    def _fail(self, reason: str) -> None:
        """Says what failed now, before the teardown that a dead device can block, and bounds
        everything after it (stream calls, models.close(), the interpreter's exit)."""
        if self.failure is not None:  # both streams can report the same death
            return
        self.failure = reason
        print(f"voice-app desktop: {reason}\nDevices found:\n{describe_devices(self.sd)}\n{choose_hint()}",
              file=sys.stderr, flush=True)
        deadline = threading.Timer(TEARDOWN_LIMIT_S, _exit_now, (EXIT_AUDIO_DEVICE,))
        deadline.daemon = True
        deadline.start()
        self._stop.set()

    async def _pump_mic(self, session: Session) -> None:
        stopped = asyncio.ensure_future(self._stop.wait())
        try:
            while not self._stop.is_set():
                frame = asyncio.ensure_future(self._mic.get())
                await asyncio.wait([frame, stopped], timeout=MIC_STALL_S, return_when=asyncio.FIRST_COMPLETED)
                if not frame.done():
                    frame.cancel()
                    if not self._stop.is_set():  # a mic that delivers nothing is as gone as an unplugged one
                        self._fail(f"the microphone delivered no audio for {MIC_STALL_S:.0f} s "
                                   "(device unplugged or sound server gone?)")
                    break
                samples, captured_at = frame.result()
                if self.echo_gate is not None:
                    samples = self.echo_gate.filter(samples, captured_at)
                await session.push_pcm16(samples, self.devices.input_rate)
        finally:
            stopped.cancel()

    async def _on_event(self, event: dict[str, Any]) -> None:
        self.console.show(event)


def _exit_now(code: int) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
