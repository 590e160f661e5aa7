"""Finding the sound card: devices by index or name, and the sample rates they accept."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

INPUT_RATES = (16000, 48000, 44100, 24000)  # first one the device accepts; 16 kHz needs no resampling
OUTPUT_RATES = (24000, 48000, 44100, 16000)  # 24 kHz is the reply audio's own rate


EXIT_AUDIO_DEVICE = 2  # the exit code of every "no usable audio device" outcome


class AudioDeviceError(RuntimeError):
    """No usable audio device: the message lists the devices found and how to choose one."""


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
