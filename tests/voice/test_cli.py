"""The voice-app command line: flags override settings; optional mode modules plug in."""

from __future__ import annotations

import types

from voice_app import cli


def test_serve_flags_override_settings(monkeypatch):
    monkeypatch.setenv("VOICE_APP_PORT", "9000")
    monkeypatch.setenv("VOICE_APP_MAX_SESSIONS", "5")
    args = cli.build_parser().parse_args(["serve", "--port", "9100", "--engine-mode", "autoregressive",
                                          "--engine-model", "smollm2-135m"])
    settings = cli.settings_from_args(args)
    assert settings.port == 9100  # flag beats env
    assert settings.max_sessions == 5  # env kept where no flag was given
    assert (settings.engine_model, settings.engine_mode) == ("smollm2-135m", "autoregressive")


def test_mode_modules_register_their_subcommands(monkeypatch):
    def register(subparsers):
        subparsers.add_parser("desktop").set_defaults(run=lambda args: 7)

    fake_module = types.SimpleNamespace(register=register)
    real_import = cli.importlib.import_module
    monkeypatch.setattr(cli.importlib, "import_module",
                        lambda name: fake_module if name == "voice_app.desktop.command" else real_import(name))
    args = cli.build_parser().parse_args(["desktop"])
    assert args.run(args) == 7


def test_replica_flags(monkeypatch):
    monkeypatch.setenv("VOICE_APP_DRAIN_GRACE_S", "7")
    args = cli.build_parser().parse_args(["serve", "--replica-name", "pod-a"])
    settings = cli.settings_from_args(args)
    assert (settings.replica_name, settings.drain_grace_s) == ("pod-a", 7.0)
    args = cli.build_parser().parse_args(["serve", "--drain-grace-s", "0"])
    assert cli.settings_from_args(args).drain_grace_s == 0.0  # drain: close sessions at once
