#!/usr/bin/env python3
"""The voices side by side: time to a sentence's audio, CPU seconds per second of speech, and
how well Whisper (the server's recogniser) understands them: its word error rate on each
voice's speech of the evaluation sentences (scripts/make_speech_eval.py's).

    .venv/bin/python scripts/eval_tts.py [--engines piper,hibari] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from scripts.eval_asr import normalized, word_errors  # noqa: E402
from scripts.make_speech_eval import SENTENCES  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engines", default="piper,hibari")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    from voice_app.audio.pcm import ASR_RATE, WIRE_RATE, int16_to_float, resample
    from voice_app.settings import Settings
    from voice_app.speech.asr import Transcriber
    from voice_app.speech.tts import HibariSynthesizer, PiperSynthesizer

    settings = Settings()
    transcriber = Transcriber(settings.whisper_model, settings.whisper_compute_type, settings.whisper_cpu_threads, 1,
                              settings.whisper_final_beam)
    sentences = [s.replace("...", ",") for s in SENTENCES]
    report = {}
    for engine in args.engines.split(","):
        synthesizer = HibariSynthesizer() if engine == "hibari" else PiperSynthesizer(settings.piper_voice)
        synthesizer.synthesize_blocking("Hello.")  # warm
        wall, cpu, speech_s, errors, words = [], 0.0, 0.0, 0, 0
        for sentence in sentences:
            started, started_cpu = time.perf_counter(), time.process_time()
            samples = synthesizer.synthesize_blocking(sentence, varied=False)
            wall.append(time.perf_counter() - started)
            cpu += time.process_time() - started_cpu
            speech_s += len(samples) / WIRE_RATE
            heard = transcriber.transcribe_blocking(resample(int16_to_float(samples), WIRE_RATE, ASR_RATE), final=True)
            reference = normalized(sentence)
            errors += word_errors(reference, normalized(heard))
            words += len(reference)
        synthesizer.close()
        report[engine] = {"median_sentence_ms": round(1000 * statistics.median(wall), 1),
                          "cpu_s_per_speech_s": round(cpu / speech_s, 3), "realtime_factor": round(speech_s / sum(wall), 1),
                          "whisper_wer": round(errors / words, 4), "sentences": len(sentences)}
    transcriber.close()
    print(json.dumps(report, indent=2))
    print("\n| voice | sentence to audio, median (ms) | CPU s per s of speech | x real time | Whisper WER on it |")
    print("|---|---|---|---|---|")
    for engine, r in report.items():
        print(f"| {engine} | {r['median_sentence_ms']} | {r['cpu_s_per_speech_s']} | {r['realtime_factor']} | "
              f"{r['whisper_wer']:.1%} |")
    if args.json:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
