"""The terminal side of desktop mode: what the person at the machine reads."""

from __future__ import annotations

import sys
from typing import Any


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
