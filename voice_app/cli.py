"""`voice-app serve | desktop | loadtest`.

Each subcommand lives in its own module with `register(subparsers)`; modules that are not
there (yet) are simply not offered. Flags override env vars (VOICE_APP_*) and .env.
"""

from __future__ import annotations

import argparse
import importlib
import logging
from typing import Any

from voice_app.settings import Settings

log = logging.getLogger(__name__)

SUBCOMMAND_MODULES = ("voice_app.desktop.command", "voice_app.loadtest.command")


def add_model_flags(parser: argparse.ArgumentParser) -> None:
    """Flags every mode that loads models shares; they map onto Settings fields."""
    parser.add_argument("--engine-model", help="engine model name (default: smollm2-135m-bd)")
    parser.add_argument("--engine-mode", choices=["auto", "diffusion", "autoregressive"],
                        help="auto (default): the faster on this machine, timed at startup")
    parser.add_argument("--engine-device", help="cpu, cuda, cuda:N (default auto: cuda when there is one)")
    parser.add_argument("--max-new-tokens", type=int, help="reply length cap in tokens")
    parser.add_argument("--reply-deadline-s", type=float,
                        help="time budget for a whole reply; the engine commits more tokens a step when late")
    parser.add_argument("--whisper-model", help="tiny.en (the default) or base, the packaged Whisper models; "
                        "or a CTranslate2 directory")
    parser.add_argument("--tts", choices=["piper", "hibari"], help="the voice engine (default: hibari)")
    parser.add_argument("--piper-voice", help="Piper voice .onnx file")
    parser.add_argument("--instructions", help="the default instructions (spoken-style system prompt)")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ...")


def add_exposure_flags(parser: argparse.ArgumentParser) -> None:
    """Who may connect and how long a session may hold the server (docs/security.md)."""
    parser.add_argument("--allowed-origins", help="comma-separated page origins allowed besides the server's own "
                        "(e.g. https://app.example); * allows any")
    parser.add_argument("--allowed-hosts", help="comma-separated Host header names accepted (default: the loopback "
                        "names when --host is loopback, any when it is 0.0.0.0); *.example.com patterns allowed")
    parser.add_argument("--api-token", help="require this bearer token of /v1 clients (prefer VOICE_APP_API_TOKEN: "
                        "flags show in the process list)")
    parser.add_argument("--idle-timeout-s", type=float, help="end a session after this long without a client event")
    parser.add_argument("--max-session-s", type=float, help="end a session after this long (default 3600)")
    parser.add_argument("--send-timeout-s", type=float, help="drop a client that takes no event for this long")
    parser.add_argument("--max-message-bytes", type=int, help="largest client event (default 15 MiB)")
    parser.add_argument("--context-tokens", type=int, help="prompt + reply tokens of one response, at most")
    parser.add_argument("--history-max-items", type=int, help="conversation items a session keeps")
    parser.add_argument("--history-max-chars", type=int, help="conversation text a session keeps, in characters")
    parser.add_argument("--max-output-tokens-cap", type=int, help="the most reply tokens a client may ask for")
    parser.add_argument("--response-inactivity-timeout-s", type=float,
                        help="fail a reply when the engine sends nothing for this long")
    parser.add_argument("--client-engine-settings", choices=["on", "off"],
                        help="on (default): a session.update's x_engine may choose its replies' engine mode "
                             "and threshold; off: every session decodes as --engine-mode says")


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Settings from env/.env, with every flag the user gave taking precedence."""
    overrides = {name: value for name, value in vars(args).items()
                 if value is not None and name in Settings.model_fields}
    if "client_engine_settings" in overrides:
        overrides["client_engine_settings"] = overrides["client_engine_settings"] == "on"
    return Settings(**overrides)


def _register_serve(subparsers: Any) -> None:
    parser = subparsers.add_parser("serve", help="serve the web page and the realtime websocket")
    parser.add_argument("--host", help="interface to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port (default 8765)")
    parser.add_argument("--web-dir", help="directory served at / (default web)")
    parser.add_argument("--max-sessions", type=int, help="concurrent sessions before refusing (HTTP 503)")
    parser.add_argument("--replica-name", help="this replica's name in the x-voice-replica header "
                        "(default hostname:port)")
    parser.add_argument("--drain-grace-s", type=float, help="on SIGTERM, how long live replies may take to finish "
                        "before their sessions are closed with 1012 (default 20)")
    add_exposure_flags(parser)
    add_model_flags(parser)
    parser.set_defaults(run=_run_serve)


def _run_serve(args: argparse.Namespace) -> int:
    from voice_app.realtime.server import serve

    serve(settings_from_args(args))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="voice-app", description=__doc__.splitlines()[0])
    subparsers = parser.add_subparsers(dest="command", required=True)
    _register_serve(subparsers)
    for module_name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise  # the module exists but something it needs is missing: say so
            continue
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=getattr(args, "log_level", "INFO").upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return args.run(args)
