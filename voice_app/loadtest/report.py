"""What a load level measured: word error rate, latency percentiles, the table and the plot."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from voice_app.core.speech_text import words
from voice_app.loadtest.results import SessionResult, TurnResult

LATENCY_METRICS = ("eos_to_transcript_ms", "eos_to_first_audio_ms", "eos_to_done_ms", "barge_in_to_cleared_ms")


NUMBER_WORDS = dict(enumerate("zero one two three four five six seven eight nine ten eleven twelve thirteen "
                               "fourteen fifteen sixteen seventeen eighteen nineteen twenty".split()))


def normalized_words(text: str) -> list[str]:
    """Lower case, no punctuation, small numbers spelled out (Whisper writes '2' for 'two')."""
    return [NUMBER_WORDS.get(int(word), word) if word.isdigit() else word for word in words(text)]


def word_errors(reference: str, hypothesis: str) -> int:
    """Word-level Levenshtein distance (substitutions + deletions + insertions)."""
    ref, hyp = normalized_words(reference), normalized_words(hypothesis)
    row = list(range(len(hyp) + 1))
    for i, ref_word in enumerate(ref, start=1):
        previous_diagonal, row[0] = row[0], i
        for j, hyp_word in enumerate(hyp, start=1):
            substitution = previous_diagonal + (ref_word != hyp_word)
            previous_diagonal = row[j]
            row[j] = min(substitution, row[j] + 1, row[j - 1] + 1)
    return row[len(hyp)]


def score_transcript(result: TurnResult) -> None:
    if result.expected is None:
        return
    result.reference_words = len(normalized_words(result.expected))
    result.word_errors = word_errors(result.expected, result.transcript)
    result.wer = round(result.word_errors / max(1, result.reference_words), 4)


def percentiles(values: list[float]) -> dict[str, float | int | None]:
    if not values:
        return {"count": 0, "p50": None, "p95": None, "p99": None, "mean": None, "max": None}
    array = np.asarray(values, dtype=float)
    p50, p95, p99 = np.percentile(array, [50, 95, 99])
    return {"count": len(values), "p50": round(float(p50), 1), "p95": round(float(p95), 1),
            "p99": round(float(p99), 1), "mean": round(float(array.mean()), 1), "max": round(float(array.max()), 1)}


def summarize_level(sessions: int, results: list[SessionResult], wall_s: float) -> dict[str, Any]:
    turns = [turn for result in results for turn in result.turns]
    scored = [turn for turn in turns if turn.wer is not None and turn.response_id is not None]
    errors = ([f"session {r.index}: {r.detail}" for r in results if r.outcome == "error"]
              + [f"session {t.session} turn {t.turn}: {t.error}" for t in turns if t.error]
              + [f"session {r.index}: server error: {message}" for r in results for message in r.errors])
    return {
        "sessions": sessions,
        "wall_s": round(wall_s, 1),
        "turns_completed": sum(1 for t in turns if t.error is None and t.response_id is not None),
        "latency_ms": {name: percentiles([getattr(t, name) for t in turns if getattr(t, name) is not None])
                       for name in LATENCY_METRICS},
        "wer": round(sum(t.word_errors for t in scored) / max(1, sum(t.reference_words for t in scored)), 4),
        "barge_ins": sum(1 for t in turns if t.barge_in_to_cleared_ms is not None),
        "barge_ins_missed": sum(1 for t in turns if t.barge_in_missed),
        "stale_audio_deltas": sum(t.stale_audio_deltas for t in turns),
        # issue 16's cases: a pause inside a question, a backchannel over a reply, the answer's topic
        "one_turn": _share([t.one_turn for t in turns]),
        "backchannel_kept": _share([t.backchannel_kept for t in turns]),
        "on_topic": _share([t.on_topic for t in turns]),
        "errors": errors,
        "refused": sum(1 for r in results if r.outcome == "refused"),
        "dropped": sum(1 for r in results if r.outcome == "dropped"),
        "session_outcomes": [{"session": r.index, "outcome": r.outcome, "detail": r.detail, "replica": r.replica}
                             for r in results],
        # behind a proxy: where the sessions went (the x-voice-replica header), and how they fared there
        "replicas": per_replica(results),
        "turns": [asdict(t) for t in turns],
    }


def per_replica(results: list[SessionResult]) -> dict[str, dict[str, int]]:
    """Sessions, completed turns and each outcome per replica that answered ("unnamed": no header)."""
    counts: dict[str, dict[str, int]] = {}
    for result in results:
        entry = counts.setdefault(result.replica or "unnamed", {"sessions": 0, "turns_completed": 0})
        entry["sessions"] += 1
        entry[result.outcome] = entry.get(result.outcome, 0) + 1
        entry["turns_completed"] += sum(1 for t in result.turns if t.error is None and t.response_id is not None)
    return dict(sorted(counts.items()))


def format_replicas(levels: list[dict[str, Any]]) -> str:
    """One line a load level: sessions (completed turns) per replica; empty when no server named itself."""
    lines = []
    for level in levels:
        named = {name: c for name, c in level.get("replicas", {}).items() if name != "unnamed"}
        if named:
            shares = ", ".join(f"{name}: {c['sessions']} sessions ({c['turns_completed']} turns)"
                               for name, c in level["replicas"].items())
            lines.append(f"  [{level['sessions']} sessions] per replica: {shares}")
    return "\n".join(lines)


def _share(flags: list[bool | None]) -> dict[str, int]:
    """How many of the turns that measured a yes/no said yes."""
    measured = [flag for flag in flags if flag is not None]
    return {"yes": sum(measured), "of": len(measured)}


TABLE_COLUMNS = (("eos_to_transcript_ms", "eos->transcript"), ("eos_to_first_audio_ms", "eos->first audio"),
                 ("eos_to_done_ms", "eos->done"), ("barge_in_to_cleared_ms", "barge-in->cleared"))


def format_table(levels: list[dict[str, Any]]) -> str:
    """One row a load level: p50/p95/p99 in ms of each latency, then WER and failures."""
    def cell(stats: dict[str, Any]) -> str:
        if not stats["count"]:
            return "-"
        return f"{stats['p50']:.0f}/{stats['p95']:.0f}/{stats['p99']:.0f}"

    def share(counts: dict[str, int]) -> str:
        return f"{counts['yes']}/{counts['of']}" if counts["of"] else "-"

    header = ["sessions", "turns"] + [f"{label} p50/p95/p99" for _, label in TABLE_COLUMNS] + [
        "WER", "one turn", "backchannel kept", "on topic", "errors", "refused", "dropped"]
    rows = [[str(level["sessions"]), str(level["turns_completed"])]
            + [cell(level["latency_ms"][name]) for name, _ in TABLE_COLUMNS]
            + [f"{level['wer']:.3f}", share(level["one_turn"]), share(level["backchannel_kept"]),
               share(level["on_topic"]), str(len(level["errors"])), str(level["refused"]), str(level["dropped"])]
            for level in levels]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = [" | ".join(text.rjust(width) for text, width in zip(row, widths)) for row in [header, *rows]]
    lines.insert(1, "-+-".join("-" * width for width in widths))
    return "\n".join(lines)


def plot_levels(levels: list[dict[str, Any]], path: Path) -> None:
    """Box plots of each latency's distribution, one box per load level."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(TABLE_COLUMNS), figsize=(4.2 * len(TABLE_COLUMNS), 4.2), squeeze=False)
    for axis, (name, label) in zip(axes[0], TABLE_COLUMNS):
        data = [[t[name] for t in level["turns"] if t[name] is not None] for level in levels]
        positions = [str(level["sessions"]) for level in levels]
        if any(data):
            axis.boxplot([values or [float("nan")] for values in data], tick_labels=positions, whis=(5, 95))
        axis.set_title(label)
        axis.set_xlabel("concurrent sessions")
        axis.set_ylabel("ms")
        axis.grid(axis="y", alpha=0.3)
    figure.suptitle("voice-app loadtest: latency per load level (whiskers p5-p95)")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
