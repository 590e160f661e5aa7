"""The voice-app command line: flags override settings; optional mode modules plug in."""

from __future__ import annotations

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


def test_mode_modules_register_their_subcommands():
    """desktop and loadtest live in their own rooms and plug their subcommands in."""
    parser = cli.build_parser()
    desktop = parser.parse_args(["desktop", "--list-devices"])
    assert desktop.run.__module__ == "voice_app.desktop.command" and desktop.list_devices is True
    loadtest = parser.parse_args(["loadtest", "--url", "ws://127.0.0.1:1/v1/realtime"])
    assert loadtest.run.__module__ == "voice_app.loadtest.command"


def test_replica_flags(monkeypatch):
    monkeypatch.setenv("VOICE_APP_DRAIN_GRACE_S", "7")
    args = cli.build_parser().parse_args(["serve", "--replica-name", "pod-a"])
    settings = cli.settings_from_args(args)
    assert (settings.replica_name, settings.drain_grace_s) == ("pod-a", 7.0)
    args = cli.build_parser().parse_args(["serve", "--drain-grace-s", "0"])
    assert cli.settings_from_args(args).drain_grace_s == 0.0  # drain: close sessions at once
