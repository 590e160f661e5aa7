"""`voice-app loadtest`: script parsing and scoring, and real runs (the CLI as a user runs it)
against a real server with the real models."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from voice_app.loadtest.report import format_table, percentiles, word_errors
from voice_app.loadtest.script import ScriptError, load_script, parse_script

ROOT = Path(__file__).resolve().parents[3]

BARGE_IN_SCRIPT = """
name: story then barge-in
turns:
  - say: Tell me a long story about a dragon and a knight.
  - say: Wait, stop, tell me about dogs instead.
    barge_in_after_ms: 300
"""


def engine_overrides() -> dict[str, str]:
    """The default model once its draft head is trained; the AR base model until then."""
    if (ROOT / "dllm_engine" / "adapters" / "smollm2-135m-bd.draft-head.safetensors").is_file():
        return {}
    return {"engine_model": "smollm2-135m", "engine_mode": "autoregressive"}


@pytest.fixture(scope="module")
def loadtest_server(speech_models):
    """A real voice server admitting 2 sessions."""
    from dllm_engine.engine import Engine
    from voice_app.realtime.server import BackgroundServer
    from voice_app.settings import Settings
    from voice_app.speech.loaded_models import LoadedModels

    settings = Settings(port=0, max_sessions=2, web_dir=str(ROOT / "web"), **engine_overrides())
    engine = Engine.load(settings.engine_model)
    models = LoadedModels(engine, speech_models["transcriber"], speech_models["synthesizer"], speech_models["vad"])
    server = BackgroundServer(settings, models).start()
    yield server
    server.stop()
    engine.close()


def run_cli(*args: str, timeout_s: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "voice_app", "loadtest", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout_s)


# ---- real runs ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_two_sessions_with_a_barge_in_complete_with_a_valid_report(loadtest_server, tmp_path):
    script = tmp_path / "script.yaml"
    script.write_text(BARGE_IN_SCRIPT)
    report_path, plot_path = tmp_path / "report.json", tmp_path / "latency.png"
    result = run_cli("--url", loadtest_server.ws_url + "/realtime", "--sessions", "2", "--script", str(script),
                     "--stagger-ms", "300", "--report", str(report_path), "--plot", str(plot_path))
    assert result.returncode == 0, result.stdout + result.stderr

    report = json.loads(report_path.read_text())
    (level,) = report["levels"]
    assert level["sessions"] == 2
    assert (level["errors"], level["refused"], level["dropped"]) == ([], 0, 0)
    assert level["turns_completed"] == 4
    assert [o["outcome"] for o in level["session_outcomes"]] == ["completed", "completed"]
    for name in ("eos_to_transcript_ms", "eos_to_first_audio_ms", "eos_to_done_ms"):
        stats = level["latency_ms"][name]
        assert stats["count"] == 4 and 0 < stats["p50"] <= stats["p95"] <= stats["p99"]
    assert level["barge_ins"] + level["barge_ins_missed"] == 2
    assert level["stale_audio_deltas"] == 0  # nothing of a cleared reply arrives after the clear
    statuses = {(t["turn"], t["status"]) for t in level["turns"]}
    assert statuses <= {(0, "cancelled"), (0, "completed"), (1, "completed")}  # talked over while sending or playing
    assert level["wer"] < 0.5  # Piper speech through Whisper tiny: a few words off at most
    assert "sessions" in result.stdout and "p50/p95/p99" in result.stdout  # the console table
    assert plot_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_sessions_over_the_servers_limit_are_reported_refused(loadtest_server, tmp_path):
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"turns": [{"say": "What is the capital of France?"}]}))
    report_path = tmp_path / "report.json"
    # --duration 1: a turn takes longer than that, so each admitted session talks exactly once
    result = run_cli("--url", loadtest_server.ws_url + "/realtime", "--sessions", "3", "--script", str(script),
                     "--stagger-ms", "0", "--duration", "1", "--report", str(report_path))
    level = json.loads(report_path.read_text())["levels"][0]
    assert result.returncode == 0, result.stdout + result.stderr  # a refusal is the server's answer, not an error
    assert level["refused"] == 1 and level["errors"] == [] and level["turns_completed"] == 2
    refused = [o for o in level["session_outcomes"] if o["outcome"] == "refused"]
    assert "503" in refused[0]["detail"] and "at_capacity" in refused[0]["detail"]


# ---- bad input ---------------------------------------------------------------------------------


def test_a_url_that_is_not_a_websocket_exits_2():
    result = run_cli("--url", "http://127.0.0.1:1/v1/realtime", timeout_s=60)
    assert result.returncode == 2 and "--url must be a ws://" in result.stderr


def test_an_unreachable_server_is_an_error_not_a_crash(tmp_path):
    from voice_app.realtime.server import free_port

    script = tmp_path / "s.yaml"
    script.write_text("turns:\n  - say: Hello there.\n")
    report = tmp_path / "r.json"
    result = run_cli("--url", f"ws://127.0.0.1:{free_port()}/v1/realtime", "--script", str(script),
                     "--report", str(report), timeout_s=120)
    assert result.returncode == 1
    level = json.loads(report.read_text())["levels"][0]
    assert level["session_outcomes"][0]["outcome"] == "error" and "session 0" in level["errors"][0]


@pytest.mark.parametrize("turns, message", [
    ([{"say": "hi", "volume": 3}], "unknown field(s) volume"),
    ([{"say": "hi", "wav": "a.wav"}], "exactly one of `say`"),
    ([{"say": "hi", "barge_in_after_ms": 100}], "not on the first turn"),
    ([{"say": "hi"}, {"say": "yo", "pause_ms": -5}], "turn 2: `pause_ms` must be whole milliseconds"),
    ([{"say": "hi"}, {"say": "yo", "barge_in_after_ms": 10, "pause_ms": 5}], "exclude each other"),
    ([{"wav": "missing.wav"}], "does not exist"),
    ([], "non-empty list `turns`"),
])
def test_bad_scripts_are_refused_naming_the_turn_and_field(tmp_path, turns, message):
    with pytest.raises(ScriptError) as error:
        parse_script({"turns": turns}, "script x.yaml", tmp_path)
    assert message in str(error.value) and "script x.yaml" in str(error.value)


def test_script_files_in_yaml_and_json_and_the_default(tmp_path):
    (tmp_path / "a.yaml").write_text("turns:\n  - say: Hello.\n  - say: Go on.\n    barge_in_after_ms: 200\n")
    (tmp_path / "b.json").write_text('{"turns": [{"say": "Hello."}]}')
    (tmp_path / "c.yaml").write_text("turns: [unclosed\n")
    assert [t.barge_in_after_ms for t in load_script(str(tmp_path / "a.yaml")).turns] == [None, 200]
    assert load_script(str(tmp_path / "b.json")).turns[0].transcript == "Hello."
    assert any(t.barge_in_after_ms is not None for t in load_script(None).turns)  # the built-in one barges in
    with pytest.raises(ScriptError, match="not valid YAML"):
        load_script(str(tmp_path / "c.yaml"))
    with pytest.raises(ScriptError, match="cannot read script"):
        load_script(str(tmp_path / "missing.yaml"))


# ---- scoring -----------------------------------------------------------------------------------


def test_word_errors_count_substitutions_deletions_and_insertions():
    assert word_errors("What is the capital of France?", "what is the capital of france") == 0
    assert word_errors("What is two plus two?", "What is 2 plus 2?") == 0  # digits are spelled out
    assert word_errors("a dragon and a knight", "a dragon in the night") == 3
    assert word_errors("one two three", "one three") == 1
    assert word_errors("one two", "one two three four") == 2


def test_percentiles_and_the_table():
    stats = percentiles([float(v) for v in range(1, 101)])
    assert (stats["count"], stats["p50"], stats["p99"]) == (100, 50.5, 99.0) and 94.9 <= stats["p95"] <= 95.1
    assert percentiles([])["p50"] is None
    empty = {"count": 0, "p50": None, "p95": None, "p99": None}
    level = {"sessions": 4, "turns_completed": 8, "wer": 0.05, "errors": [], "refused": 1, "dropped": 0,
             "latency_ms": {"eos_to_transcript_ms": stats, "eos_to_first_audio_ms": stats,
                            "eos_to_done_ms": stats, "barge_in_to_cleared_ms": empty},
             "one_turn": {"yes": 3, "of": 4}, "backchannel_kept": {"yes": 0, "of": 0}, "on_topic": {"yes": 2, "of": 2}}
    table = format_table([level]).splitlines()
    cells = [cell.strip() for cell in table[2].split("|")]
    assert len(table) == 3 and "50/95/99" in table[2] and cells[-2] == "1"
    assert cells[-6:-3] == ["3/4", "-", "2/2"]  # one turn, backchannel kept, on topic


def test_a_reply_is_heard_out_at_real_time_pace_from_when_its_audio_arrives():
    import base64

    from voice_app.loadtest.connection import ReceivedEvent
    from voice_app.loadtest.user import playback_end

    def delta(at: float, seconds: float, response_id: str = "resp_1") -> ReceivedEvent:
        audio = base64.b64encode(b"\0\0" * int(24000 * seconds)).decode()
        return ReceivedEvent(at, {"type": "response.output_audio.delta", "response_id": response_id, "delta": audio})

    events = [delta(10.0, 1.0), delta(10.1, 1.0), delta(10.2, 0.5, "resp_other"), delta(15.0, 0.5)]
    assert playback_end(events, "resp_1", speed=1.0) == pytest.approx(15.5)  # a gap: the queue ran dry at 12.0
    assert playback_end(events[:2], "resp_1", speed=2.0) == pytest.approx(11.0)


def test_latencies_run_from_where_the_voice_ends_not_from_the_clips_trailing_quiet():
    import numpy as np

    from voice_app.loadtest.user import voice_offset_s, voice_onset_s

    rate = 24000
    tone = (3000 * np.sin(np.arange(rate // 2) * 0.1)).astype(np.int16)  # 500 ms of voice
    hiss = np.full(rate // 10, 20, dtype=np.int16)  # 100 ms of quiet below -40 dBFS
    clip = np.concatenate([hiss, tone, hiss, hiss, np.zeros(rate // 20, dtype=np.int16)])
    assert voice_onset_s(clip) == pytest.approx(0.1)
    assert voice_offset_s(clip) == pytest.approx(0.6)
    assert voice_offset_s(np.zeros(rate // 5, dtype=np.int16)) == pytest.approx(0.2)  # no voice: the clip's end


def test_script_turns_for_a_pause_inside_a_backchannel_and_expected_words(tmp_path):
    from voice_app.loadtest.script import ScriptError, parse_script

    script = parse_script({"turns": [
        {"say": "Tell me a story."},
        {"say": "Mm-hmm.", "backchannel_after_ms": 900},
        {"say": "What is the capital of ... Spain?", "gap_ms": 700, "expect": ["Madrid"]},
    ]}, "test", tmp_path)
    backchannel, gap = script.turns[1], script.turns[2]
    assert backchannel.talks_over == 900 and backchannel.barge_in_after_ms is None
    assert gap.transcript == "What is the capital of Spain?" and gap.expect == ("madrid",)
    for bad, message in [
        ({"say": "Hi ... there", "gap_ms": 500, "backchannel_after_ms": 10}, "needs a previous reply"),
        ({"say": "No mark here", "gap_ms": 500}, "needs a `say` text with"),
        ({"say": "Hi", "expect": "paris"}, "`expect` must be a list of words"),
    ]:
        with pytest.raises(ScriptError, match=message):
            parse_script({"turns": [bad]}, "test", tmp_path)
    with pytest.raises(ScriptError, match="exclude each other"):
        parse_script({"turns": [{"say": "A"}, {"say": "B", "pause_ms": 5, "backchannel_after_ms": 5}]}, "test", tmp_path)


def test_sessions_are_counted_per_replica_that_answered():
    from voice_app.loadtest.report import format_replicas, summarize_level
    from voice_app.loadtest.results import SessionResult, TurnResult

    def session(index: int, replica: str | None, outcome: str = "completed", turns: int = 1) -> SessionResult:
        done = [TurnResult(index, n, 0, None, response_id=f"resp_{index}_{n}") for n in range(turns)]
        return SessionResult(index, outcome=outcome, replica=replica, turns=done)

    results = [session(0, "replica-1", turns=2), session(1, "replica-2"), session(2, "replica-1", "dropped", 0),
               session(3, None, "error", 0)]
    level = summarize_level(4, results, 1.0)
    assert level["replicas"] == {
        "replica-1": {"sessions": 2, "turns_completed": 2, "completed": 1, "dropped": 1},
        "replica-2": {"sessions": 1, "turns_completed": 1, "completed": 1},
        "unnamed": {"sessions": 1, "turns_completed": 0, "error": 1},
    }
    assert [o["replica"] for o in level["session_outcomes"]] == ["replica-1", "replica-2", "replica-1", None]
    line = format_replicas([level])
    assert "replica-1: 2 sessions (2 turns)" in line and "replica-2: 1 sessions (1 turns)" in line
    # a single server that names no replica adds no line to the console output
    assert format_replicas([summarize_level(1, [session(0, None)], 1.0)]) == ""
