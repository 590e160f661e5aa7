"""`voice-app desktop`: the assistant on this machine's microphone and speaker.

The same `Session` core as the server runs here; sounddevice streams are its transport instead
of a websocket. Mic frames go to `Session.push_pcm16` at the device's rate (the session
resamples); reply audio comes back through the session's `on_audio` hook and is queued for the
output stream; server events (transcripts, `output_audio_buffer.cleared`, turn metrics) drive
the console and drop queued playback on barge-in.

Echo guard: a speaker that the mic hears would make the assistant interrupt itself. While the
speaker plays (and for the echo tail after it), `EchoGate` passes a mic frame to the VAD only
when it is clearly louder than the echo that the frame's playback reference would produce; the
echo path's gain is measured continuously during playback (90th percentile of mic/reference
level ratios of echo-only frames), so it adapts to the room and the volume. Talking over the
assistant is louder than its echo and passes, held open between syllables; the echo alone is
replaced by silence. `--echo-guard off` for headsets.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from voice_app.audio.pcm import WIRE_RATE, StreamResampler, float_to_int16, int16_to_float

log = logging.getLogger(__name__)

EXIT_AUDIO_DEVICE = 2
INPUT_RATES = (16000, 48000, 44100, 24000)  # first one the device accepts; 16 kHz needs no resampling
OUTPUT_RATES = (24000, 48000, 44100, 16000)  # 24 kHz is the reply audio's own rate
BLOCK_MS = 20
# no mic frame for this long means the input is dead (a sound server that died can leave the
# stream "running" without callbacks, or spinning in ALSA's underrun recovery)
MIC_STALL_S = 5.0


class AudioDeviceError(RuntimeError):
    """No usable audio device: the message lists the devices found and how to choose one."""


# ---- devices ---------------------------------------------------------------------------------


def import_sounddevice() -> Any:
    try:
        import sounddevice
    except OSError as exc:  # the Python package is there, the PortAudio library is not
        raise AudioDeviceError(f"cannot use audio devices: {exc}. Install PortAudio "
                               "(Debian/Ubuntu: apt-get install libportaudio2).") from exc
    return sounddevice


def describe_devices(sd: Any) -> str:
    """The device table as sounddevice sees it, with the defaults marked."""
    devices = sd.query_devices()
    if len(devices) == 0:
        return "  (no audio devices found: is a sound card or a PulseAudio/PipeWire server available?)"
    return "\n".join("  " + line for line in str(devices).splitlines())


def choose_hint() -> str:
    return ("Choose devices with --input-device and --output-device (an index or part of a name "
            "from `voice-app desktop --list-devices`).")


def parse_device(spec: str | None) -> int | str | None:
    if spec is None:
        return None
    return int(spec) if spec.strip().isdigit() else spec


def resolve_device(sd: Any, spec: str | None, kind: str) -> dict[str, Any]:
    """The device `spec` names (index or name substring), or the default one, for `kind`
    ('input' or 'output'); AudioDeviceError names what was wrong and lists the devices."""
    try:
        info = sd.query_devices(parse_device(spec), kind=kind)
    except (ValueError, sd.PortAudioError) as exc:
        what = f"{kind} device {spec!r}" if spec is not None else f"default {kind} device"
        raise AudioDeviceError(f"no usable {what}: {exc}\nDevices found:\n{describe_devices(sd)}\n"
                               f"{choose_hint()}") from exc
    if info[f"max_{kind}_channels"] < 1:
        raise AudioDeviceError(f"device {info['name']!r} has no {kind} channels\nDevices found:\n"
                               f"{describe_devices(sd)}\n{choose_hint()}")
    return info


def negotiate_rate(sd: Any, info: dict[str, Any], kind: str, preferred: tuple[int, ...]) -> int:
    """The first of our preferred rates the device accepts, else its own default rate."""
    check = sd.check_input_settings if kind == "input" else sd.check_output_settings
    candidates = list(preferred) + [int(info["default_samplerate"])]
    for rate in candidates:
        try:
            check(device=info["index"], samplerate=rate, channels=1, dtype="int16")
            return rate
        except (ValueError, sd.PortAudioError):
            continue
    raise AudioDeviceError(f"{kind} device {info['name']!r} accepts none of the sample rates "
                           f"{candidates} in mono PCM16\nDevices found:\n{describe_devices(sd)}\n{choose_hint()}")


# ---- echo guard ------------------------------------------------------------------------------


def rms(samples: np.ndarray) -> float:
    if len(samples) == 0:
        return 0.0
    audio = samples.astype(np.float32)
    return float(np.sqrt(np.mean(audio * audio)))


class EchoGate:
    """Suppresses mic frames that are only the echo of what the speaker plays.

    `played` records the level of each output block and the time it reaches the speaker;
    `filter` compares a mic frame with the loudest reference block that could echo into it
    (played within `max_delay_s` before the frame was captured). The echo gain is the 90th
    percentile of the mic/reference ratio over recent echo-only frames (the loudest the echo
    usually gets); a frame passes when it is `margin` times louder than that predicts.

    A person talking over the reply: once `onset_frames` frames in a row pass, the gate stays
    open for `hold_s` after each loud frame, so the soft sounds between their syllables reach
    the VAD and Whisper too (without the hold, "Wait, stop, tell me about dogs" reached them
    as scraps). Frames judged to be the person never train the echo gain: they used to raise
    it within half a second of talking until the gate shut on the person.
    Thread-safe: the output callback writes, the loop reads.
    """

    AUDIBLE = 30.0  # reference RMS (int16) below this (-60 dBFS) is silence: nothing can echo

    def __init__(self, margin: float = 2.0, max_delay_s: float = 0.5, initial_gain: float = 1.0,
                 history: int = 150, hold_s: float = 0.3, onset_frames: int = 2, calibration_frames: int = 25):
        self.margin = margin
        self.max_delay_s = max_delay_s  # speaker -> mic, device buffers included (PulseAudio: ~0.3 s)
        self.hold_s = hold_s
        self.onset_frames = onset_frames
        # Until this many ratios are measured every frame trains the gain: an initial guess that
        # is too low would otherwise pass the echo as "the person" and never learn the truth.
        self.calibration_frames = calibration_frames
        self._gain = initial_gain  # mic level / speaker level of the echo path, until measured
        self._ratios: deque[float] = deque(maxlen=history)  # ~3 s of 20 ms echo frames
        self._reference: deque[tuple[float, float]] = deque()  # (time at the speaker, level)
        self._audible_since: float | None = None
        self._loud_run = 0  # consecutive frames louder than the echo
        self._person_until = float("-inf")  # the hold: frames captured before this pass
        self._lock = threading.Lock()
        self.suppressed_frames = 0

    def played(self, samples: np.ndarray, at: float) -> None:
        with self._lock:
            self._reference.append((at, rms(samples)))
            while self._reference and self._reference[0][0] < at - 5.0:
                self._reference.popleft()

    def reference_level(self, captured_at: float) -> float:
        with self._lock:
            return max((level for at, level in self._reference
                        if captured_at - self.max_delay_s <= at <= captured_at + 0.05), default=0.0)

    def filter(self, samples: np.ndarray, captured_at: float) -> np.ndarray:
        reference = self.reference_level(captured_at)
        if reference < self.AUDIBLE:  # nothing playing: the mic is all user
            self._audible_since = None
            return samples
        if self._audible_since is None:
            self._audible_since = captured_at
        level = rms(samples)
        # Right after playback starts the echo is still on its way: a quiet mic then says
        # nothing about the echo path, so only later frames measure it.
        echo_arrived = captured_at - self._audible_since >= self.max_delay_s
        if level > self.margin * self._gain * reference:
            self._loud_run += 1
            if self._loud_run >= self.onset_frames:
                self._person_until = captured_at + self.hold_s
            if echo_arrived and len(self._ratios) < self.calibration_frames:
                self._learn(level / reference)
            return samples
        self._loud_run = 0
        if captured_at < self._person_until:  # the person is mid-word
            return samples
        if echo_arrived:
            self._learn(level / reference)
        self.suppressed_frames += 1
        return np.zeros_like(samples)

    def _learn(self, ratio: float) -> None:
        self._ratios.append(ratio)
        self._gain = float(np.percentile(self._ratios, 90))


# ---- playback --------------------------------------------------------------------------------


class PlaybackQueue:
    """Reply audio waiting for the output stream (int16 at the device rate). The output
    callback pulls from it; a barge-in clears it."""

    def __init__(self) -> None:
        self._chunks: deque[np.ndarray] = deque()
        self._lock = threading.Lock()

    def push(self, samples: np.ndarray) -> None:
        with self._lock:
            self._chunks.append(samples)

    def pull(self, count: int) -> np.ndarray:
        out = np.zeros(count, dtype=np.int16)
        filled = 0
        with self._lock:
            while filled < count and self._chunks:
                chunk = self._chunks[0]
                take = min(count - filled, len(chunk))
                out[filled:filled + take] = chunk[:take]
                filled += take
                if take == len(chunk):
                    self._chunks.popleft()
                else:
                    self._chunks[0] = chunk[take:]
        return out

    def clear(self) -> None:
        with self._lock:
            self._chunks.clear()

    def queued_samples(self) -> int:
        with self._lock:
            return sum(len(chunk) for chunk in self._chunks)


# ---- console ---------------------------------------------------------------------------------


class Console:
    """What the person at the machine sees: their words as recognised, the reply as it
    settles, and each turn's latency."""

    def __init__(self, out: Any = None):
        self.out = out or sys.stdout
        self.live = self.out.isatty()
        self._reply_open = False
        self._reply_cut = False

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def show(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        if kind == "x_input_audio_transcription.partial" and self.live:
            self.out.write(f"\r\x1b[2Kyou: {event['stable']} {event['unstable']}")
            self.out.flush()
        elif kind == "conversation.item.input_audio_transcription.completed":
            self.say(("\r\x1b[2K" if self.live else "") + f"you: {event['transcript']}")
        elif kind == "response.output_audio_transcript.delta" or kind == "response.output_text.delta":
            if not self._reply_open:
                self.out.write("assistant: ")
                self._reply_open = True
            self.out.write(event["delta"])
            self.out.flush()
        elif kind == "output_audio_buffer.cleared":  # barge-in: while generating or while still playing
            self.say(" [interrupted]" if self._reply_open else "[interrupted]")
            self._reply_open = False
            self._reply_cut = True
        elif kind == "response.done":
            if not self._reply_cut:
                self.say("" if self._reply_open else "assistant: (no reply)")
            self._reply_open = self._reply_cut = False
        elif kind == "x_turn.metrics":
            self._show_latency(event)
        elif kind == "error":
            self.say(f"error: {event['error'].get('message')}")

    def _show_latency(self, event: dict[str, Any]) -> None:
        parts = [f"{label} {event[key]:.0f} ms" for key, label in (
            ("speech_stopped_to_transcript_ms", "transcript"),
            ("speech_stopped_to_first_audio_ms", "first audio"),
            ("barge_in_to_cleared_ms", "barge-in stop")) if event.get(key) is not None]
        if parts:
            self.say("  [latency: " + ", ".join(parts) + "]")


# ---- the transport ---------------------------------------------------------------------------


@dataclass
class AudioDevices:
    input: dict[str, Any]
    output: dict[str, Any]
    input_rate: int
    output_rate: int


def open_devices(sd: Any, input_spec: str | None, output_spec: str | None) -> AudioDevices:
    input_info = resolve_device(sd, input_spec, "input")
    output_info = resolve_device(sd, output_spec, "output")
    return AudioDevices(input_info, output_info, negotiate_rate(sd, input_info, "input", INPUT_RATES),
                        negotiate_rate(sd, output_info, "output", OUTPUT_RATES))


class DesktopTransport:
    """Runs one Session on the sound card until stopped."""

    def __init__(self, sd: Any, devices: AudioDevices, models: Any, settings: Any,
                 echo_gate: EchoGate | None, console: Console):
        self.sd = sd
        self.devices = devices
        self.models = models
        self.settings = settings
        self.echo_gate = echo_gate
        self.console = console
        self.playback = PlaybackQueue()
        self._to_device_rate = StreamResampler(WIRE_RATE, devices.output_rate)
        self._mic: asyncio.Queue[tuple[np.ndarray, float]] = asyncio.Queue(maxsize=500)
        self._stop = asyncio.Event()
        self.failure: str | None = None

    async def run(self) -> None:
        from voice_app.session import Session

        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, self._stop.set)
        session = Session(self.models, self.settings, send=self._on_event, on_audio=self._on_reply_audio)
        input_stream, output_stream = self._open_streams(loop)
        try:
            await session.start()
            with input_stream, output_stream:
                self.console.say(f"listening on {self.devices.input['name']!r} ({self.devices.input_rate} Hz), "
                                 f"speaking on {self.devices.output['name']!r} ({self.devices.output_rate} Hz); "
                                 "Ctrl-C to quit")
                await self._pump_mic(session)
        finally:
            await session.close()  # cancels engine requests and TTS work in flight
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(signum)

    def _open_streams(self, loop: asyncio.AbstractEventLoop) -> tuple[Any, Any]:
        def on_mic(indata: np.ndarray, frames: int, timing: Any, status: Any) -> None:
            captured_at = time.monotonic() - self.devices.input["default_low_input_latency"]
            loop.call_soon_threadsafe(self._queue_mic, indata[:, 0].copy(), captured_at)

        def on_speaker(outdata: np.ndarray, frames: int, timing: Any, status: Any) -> None:
            samples = self.playback.pull(frames)
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

    def _queue_mic(self, samples: np.ndarray, captured_at: float) -> None:
        if self._mic.full():  # the loop fell behind: drop the oldest frame, never block the device
            self._mic.get_nowait()
        self._mic.put_nowait((samples, captured_at))

    def _fail(self, reason: str) -> None:
        self.failure = reason
        self._stop.set()

    async def _pump_mic(self, session: Any) -> None:
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
        if event["type"] == "output_audio_buffer.cleared":
            self.playback.clear()  # barge-in: the rest of the reply is not played
        self.console.show(event)

    def _on_reply_audio(self, chunk_24k: np.ndarray) -> None:
        audio = self._to_device_rate.process(int16_to_float(chunk_24k))
        self.playback.push(float_to_int16(audio))


# ---- command line ----------------------------------------------------------------------------


def register(subparsers: Any) -> None:
    from voice_app.cli import add_model_flags

    parser = subparsers.add_parser("desktop", help="talk with the assistant through this machine's mic and speaker")
    parser.add_argument("--list-devices", action="store_true", help="print the audio devices and exit")
    parser.add_argument("--input-device", help="microphone: an index or part of a name (default: system default)")
    parser.add_argument("--output-device", help="speaker: an index or part of a name (default: system default)")
    parser.add_argument("--echo-guard", choices=["gate", "off"], default="gate",
                        help="gate: ignore the speaker's echo in the mic while the assistant talks (default); "
                             "off: for headsets")
    add_model_flags(parser)
    parser.set_defaults(run=run_desktop)


def run_desktop(args: argparse.Namespace) -> int:
    try:
        sd = import_sounddevice()
        if args.list_devices:
            print(describe_devices(sd))
            return 0
        devices = open_devices(sd, args.input_device, args.output_device)
    except AudioDeviceError as exc:
        print(f"voice-app desktop: {exc}", file=sys.stderr)
        return EXIT_AUDIO_DEVICE
    return _converse(sd, devices, args)


def _converse(sd: Any, devices: AudioDevices, args: argparse.Namespace) -> int:
    from voice_app.cli import settings_from_args
    from voice_app.loaded_models import LoadedModels

    settings = settings_from_args(args)
    console = Console()
    console.say(f"loading models ({settings.engine_model}, {settings.engine_mode}) ...")
    models = LoadedModels.load(settings)
    transport = DesktopTransport(sd, devices, models, settings,
                                 EchoGate() if args.echo_guard == "gate" else None, console)
    try:
        asyncio.run(transport.run())
    except AudioDeviceError as exc:
        print(f"voice-app desktop: {exc}", file=sys.stderr)
        return EXIT_AUDIO_DEVICE
    finally:
        models.close()
    if transport.failure is not None:
        print(f"voice-app desktop: {transport.failure}\nDevices found:\n{describe_devices(sd)}\n{choose_hint()}",
              file=sys.stderr)
        return EXIT_AUDIO_DEVICE
    console.say("stopped")
    return 0
