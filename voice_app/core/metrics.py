"""Prometheus text exposition for the voice server: counters, gauges and latency histograms."""

from __future__ import annotations

import threading
from bisect import bisect_left
from typing import Any, Callable

LATENCY_BUCKETS_MS = (25, 50, 100, 150, 200, 300, 500, 750, 1000, 1500, 2500, 5000, 10000)


class Counter:
    def __init__(self, name: str, help_text: str):
        self.name, self.help_text = name, help_text
        self._value = 0.0
        self._lock = threading.Lock()

    def inc(self, amount: float = 1.0) -> None:
        with self._lock:
            self._value += amount

    def render(self) -> list[str]:
        return [f"# HELP {self.name} {self.help_text}", f"# TYPE {self.name} counter",
                f"{self.name} {self._value:g}"]


class Gauge:
    """A value read at scrape time from a callback (live sessions, live engine requests)."""

    def __init__(self, name: str, help_text: str, read: Callable[[], float]):
        self.name, self.help_text, self._read = name, help_text, read

    def render(self) -> list[str]:
        return [f"# HELP {self.name} {self.help_text}", f"# TYPE {self.name} gauge",
                f"{self.name} {float(self._read()):g}"]


class Histogram:
    def __init__(self, name: str, help_text: str, buckets: tuple[float, ...] = LATENCY_BUCKETS_MS):
        self.name, self.help_text, self.buckets = name, help_text, buckets
        self._counts = [0] * (len(buckets) + 1)  # the last slot is +Inf
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float) -> None:
        with self._lock:
            self._counts[bisect_left(self.buckets, value)] += 1
            self._sum += value

    @property
    def count(self) -> int:
        return sum(self._counts)

    def render(self) -> list[str]:
        lines = [f"# HELP {self.name} {self.help_text}", f"# TYPE {self.name} histogram"]
        running = 0
        for bound, count in zip(self.buckets, self._counts):
            running += count
            lines.append(f'{self.name}_bucket{{le="{bound:g}"}} {running}')
        lines.append(f'{self.name}_bucket{{le="+Inf"}} {running + self._counts[-1]}')
        lines += [f"{self.name}_sum {self._sum:g}", f"{self.name}_count {self.count}"]
        return lines


class VoiceMetrics:
    """Every metric the server exports; sessions report into it."""

    def __init__(self) -> None:
        self.sessions_total = Counter("voice_sessions_total", "Sessions accepted")
        self.sessions_rejected = Counter("voice_sessions_rejected_total", "Sessions refused at capacity")
        self.turns_total = Counter("voice_turns_total", "User turns that got a response")
        self.barge_ins_total = Counter("voice_barge_ins_total", "Responses talked over by user speech")
        self.false_interruptions_total = Counter("voice_false_interruptions_total",
                                                 "Responses talked over by no words or a backchannel, then resumed")
        self.client_errors_total = Counter("voice_client_errors_total", "Error events sent to clients")
        self.transcript_ms = Histogram(
            "voice_speech_stopped_to_transcript_ms", "End of speech to final transcript (ms)")
        self.first_draft_ms = Histogram(
            "voice_speech_stopped_to_first_draft_ms", "End of speech to first draft text (ms)")
        self.first_audio_ms = Histogram(
            "voice_speech_stopped_to_first_audio_ms", "End of speech to first audio delta (ms)")
        self.barge_in_ms = Histogram(
            "voice_barge_in_to_cleared_ms", "User speech start to output_audio_buffer.cleared (ms)")
        self.tokens_per_forward = Histogram(
            "voice_tokens_per_forward", "Engine tokens per forward pass, per response",
            buckets=(0.5, 1, 1.5, 2, 3, 4, 6, 8, 16))
        self._gauges: list[Gauge] = []
        self._added: list[Counter] = []  # counters of other transports (the chat API)

    def observe_turn(self, report: dict[str, Any], first_report: bool = True) -> None:
        """Records one x_turn.metrics report; a repeated report (barge-in after the response
        was done) only adds its barge-in time."""
        observed = [("barge_in_to_cleared_ms", self.barge_in_ms)]
        if first_report:
            observed += [("speech_stopped_to_transcript_ms", self.transcript_ms),
                         ("speech_stopped_to_first_draft_ms", self.first_draft_ms),
                         ("speech_stopped_to_first_audio_ms", self.first_audio_ms)]
            if report.get("forward_passes"):
                self.tokens_per_forward.observe(report["tokens_per_forward"])
            if report.get("speech_stopped_to_transcript_ms") is not None:
                self.turns_total.inc()
        for key, histogram in observed:
            if report.get(key) is not None:
                histogram.observe(report[key])

    def add_gauge(self, name: str, help_text: str, read: Callable[[], float]) -> None:
        self._gauges.append(Gauge(name, help_text, read))

    def add_counter(self, name: str, help_text: str) -> Counter:
        counter = Counter(name, help_text)
        self._added.append(counter)
        return counter

    def render(self) -> str:
        metrics = [self.sessions_total, self.sessions_rejected, self.turns_total, self.barge_ins_total,
                   self.false_interruptions_total, self.client_errors_total, self.transcript_ms, self.first_draft_ms,
                   self.first_audio_ms, self.barge_in_ms, self.tokens_per_forward, *self._added, *self._gauges]
        return "\n".join(line for metric in metrics for line in metric.render()) + "\n"
