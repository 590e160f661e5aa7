"""`voice-app desktop`: flags, device checks, and the exit codes a user sees."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from voice_app.desktop.console import Console
from voice_app.desktop.devices import (EXIT_AUDIO_DEVICE, AudioDeviceError, AudioDevices, describe_devices,
                                       import_sounddevice, open_devices)
from voice_app.desktop.echo_gate import EchoGate
from voice_app.desktop.transport import DesktopTransport


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
    from voice_app.speech.loaded_models import LoadedModels

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
    if transport.failure is not None:  # already reported, the moment it happened
        return EXIT_AUDIO_DEVICE
    console.say("stopped")
    return 0
