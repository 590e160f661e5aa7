#!/usr/bin/env python3
"""Word error rate, repetition hallucinations and decode latency of the speech recogniser on
the project's evaluation set (scripts/make_speech_eval.py), per configuration and per split.

    .venv/bin/python scripts/eval_asr.py [--set runs/speech-eval] [--configs greedy,final] [--tail-ms 100 --pad-ms 100]
                                         [--context scripts/speech_eval_context.json] [--json out.json]

Configurations: `greedy` (how partials decode: beam 1, no fallback), `final` (how a turn's
closing transcript decodes: the server's beam, faster-whisper's temperature fallback; both keep
one copy of a decoding loop). Each utterance is decoded as the server decodes a turn: its
audio with the turn's 300 ms of lead-in (and, with --tail-ms, cut where the server cuts the turn's
final decode). With --context, each utterance is heard after what the assistant said before it
(Whisper's prompt, as the server gives it the last reply): a JSON object from an utterance's
reference text to that text. The `held_out` split is reported apart from `tune`
and never guides a setting. Prints JSON and a table.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
import wave
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

_UNITS = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
          "sixteen seventeen eighteen nineteen").split()
_TENS = "twenty thirty forty fifty sixty seventy eighty ninety".split()


def number_words(n: int) -> str:
    if n < 20:
        return _UNITS[n]
    if n < 100:
        return _TENS[n // 10 - 2] + ("" if n % 10 == 0 else " " + _UNITS[n % 10])
    if n < 1000:
        return _UNITS[n // 100] + " hundred" + ("" if n % 100 == 0 else " " + number_words(n % 100))
    return str(n)


def normalized(text: str) -> list[str]:
    """Lower case, digits as words, contractions expanded, punctuation gone."""
    text = text.lower().replace("'s ", " is ").replace("what's", "what is").replace("i'm", "i am")
    text = re.sub(r"\d+", lambda m: " " + number_words(int(m.group())) + " ", text)
    return re.sub(r"[^a-z' ]+", " ", text.replace("-", " ")).split()


def word_errors(reference: list[str], hypothesis: list[str]) -> int:
    """Levenshtein distance over words."""
    previous = list(range(len(hypothesis) + 1))
    for i, ref in enumerate(reference, start=1):
        current = [i] + [0] * len(hypothesis)
        for j, hyp in enumerate(hypothesis, start=1):
            current[j] = min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (ref != hyp))
        previous = current
    return previous[-1]


def hallucinated(reference: list[str], hypothesis: list[str]) -> bool:
    """A phrase repeated three times in a row that the reference does not have, or a
    transcript far longer than what was said."""
    if len(hypothesis) > 2 * len(reference) + 3:
        return True
    for size in range(1, 5):
        for i in range(len(hypothesis) - 3 * size + 1):
            phrase = hypothesis[i:i + size]
            if hypothesis[i + size:i + 2 * size] == phrase == hypothesis[i + 2 * size:i + 3 * size]:
                if " ".join(phrase * 3) not in " ".join(reference):
                    return True
    return False


def read_16k(path: Path) -> np.ndarray:
    with wave.open(str(path)) as wav:
        return np.frombuffer(wav.readframes(wav.getnframes()), dtype=np.int16).astype(np.float32) / 32768.0


def cut_after_speech(audio: np.ndarray, vad, tail_ms: int, pad_ms: int = 0) -> np.ndarray:
    """The audio up to the turn detector's last speech window plus `tail_ms`, then `pad_ms` of
    digital silence, as the server cuts a turn for its final transcript (core/user_turn.py
    FINAL_TAIL_SAMPLES and CLOSING_PAD_SAMPLES)."""
    from voice_app.core.options import TurnDetection
    from voice_app.core.turn_detector import TurnDetector

    detector = TurnDetector(TurnDetection())
    for prob in vad.stream().process(audio):
        detector.feed(prob)  # its last speech window only moves forward
    last_speech = detector.last_speech_sample or len(audio)  # no speech heard: the whole utterance
    return np.concatenate([audio[:last_speech + tail_ms * 16], np.zeros(pad_ms * 16, dtype=np.float32)])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--set", type=Path, default=ROOT / "runs" / "speech-eval")
    parser.add_argument("--configs", default="greedy,final")
    parser.add_argument("--model", default=None, help="a Whisper model (default: the server's)")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--tail-ms", type=int, default=None,
                        help="cut each utterance this long after the VAD's last speech, as the server "
                             "cuts a turn (default: the whole file, its trailing quiet included)")
    parser.add_argument("--pad-ms", type=int, default=0, help="digital silence after the --tail-ms cut")
    parser.add_argument("--context", type=Path, default=None,
                        help="JSON: reference text -> what the assistant said before it")
    args = parser.parse_args()
    from voice_app.settings import Settings
    from voice_app.speech.asr import Transcriber

    settings = Settings()
    transcriber = Transcriber(args.model or settings.whisper_model, settings.whisper_compute_type,
                              settings.whisper_cpu_threads, 1, settings.whisper_final_beam)
    entries = json.loads((args.set / "manifest.json").read_text())
    lead_in = np.zeros(int(0.3 * 16000), dtype=np.float32)
    transcriber.transcribe_blocking(np.zeros(16000, dtype=np.float32))  # warm
    vad = None
    if args.tail_ms is not None:
        from voice_app.speech.vad import SileroVad
        vad = SileroVad()
    contexts = json.loads(args.context.read_text()) if args.context else {}
    report = {"model": transcriber.model_name, "utterances": len(entries), "final_beam": transcriber.final_beam,
              "tail_ms": args.tail_ms, "pad_ms": args.pad_ms, "context": str(args.context) if args.context else None,
              "results": {}, "by_voice": {}, "misheard": {}, "hallucinated": {}}
    for config in args.configs.split(","):
        rows = []
        for entry in entries:
            audio = np.concatenate([lead_in, read_16k(args.set / entry["file"])])
            if vad is not None:
                audio = cut_after_speech(audio, vad, args.tail_ms, args.pad_ms)
            started = time.perf_counter()
            text = transcriber.transcribe_blocking(audio, final=config == "final",
                                                   context=contexts.get(entry["reference"], ""))
            seconds = time.perf_counter() - started
            reference, hypothesis = normalized(entry["reference"]), normalized(text)
            rows.append({**entry, "text": text, "errors": word_errors(reference, hypothesis), "words": len(reference),
                         "hallucinated": hallucinated(reference, hypothesis), "ms": 1000 * seconds})
        report["results"][config] = summarize(rows)
        report["by_voice"][config] = {voice: wer([r for r in rows if r["voice"] == voice])
                                      for voice in sorted({r["voice"] for r in rows})}
        report["misheard"][config] = [heard(r) for r in rows if r["errors"]][:40]
        report["hallucinated"][config] = [heard(r) for r in rows if r["hallucinated"]]
    transcriber.close()
    print(json.dumps({k: v for k, v in report.items() if k not in ("misheard", "by_voice")}, indent=2))
    print("\n| configuration | split | WER | hallucinations | utterances | median decode (ms) | p95 decode (ms) |")
    print("|---|---|---|---|---|---|---|")
    for config, splits in report["results"].items():
        for split, r in splits.items():
            print(f"| {config} | {split} | {r['wer']:.1%} | {r['hallucinations']} | {r['utterances']} | "
                  f"{r['median_ms']:.0f} | {r['p95_ms']:.0f} |")
    voices = list(next(iter(report["by_voice"].values())))
    print("\nWER by voice\n\n| configuration | " + " | ".join(voices) + " |")
    print("|---|" + "---|" * len(voices))
    for config, by_voice in report["by_voice"].items():
        print(f"| {config} | " + " | ".join(f"{by_voice[v]:.1%}" for v in voices) + " |")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


def wer(rows: list[dict]) -> float:
    return sum(r["errors"] for r in rows) / max(1, sum(r["words"] for r in rows))


def heard(row: dict) -> dict:
    return {"voice": row["voice"], "condition": row["condition"], "reference": row["reference"], "heard": row["text"]}


def summarize(rows: list[dict]) -> dict:
    out = {}
    for split in ("tune", "held_out", "all"):
        chosen = [r for r in rows if split == "all" or r["split"] == split]
        if not chosen:
            continue
        times = sorted(r["ms"] for r in chosen)
        out[split] = {"wer": wer(chosen),
                      "hallucinations": sum(r["hallucinated"] for r in chosen), "utterances": len(chosen),
                      "median_ms": statistics.median(times), "p95_ms": times[int(0.95 * (len(times) - 1))]}
    return out


if __name__ == "__main__":
    sys.exit(main())
