"""Speech recognition: faster-whisper decodes an utterance (the session re-decodes the open one;
core/local_agreement.py turns the changing hypotheses into a stable prefix and a tail).

Decoding runs in a bounded thread pool, never on the event loop.
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from voice_app.speech.decode_batches import WaitingBatch
from voice_app.speech.transcript_guard import collapse_repetitions, is_loop, looks_failed
from voice_app.speech.weights import verify_if_packaged, whisper_model_path
from voice_app.speech.workers import PriorityPool

SAMPLE_RATE = 16000
FULL_WINDOW_FRAMES = 3000  # Whisper's native 30 s encoder window (100 mel frames a second)
WINDOW_MARGIN_FRAMES = 100  # an utterance's window holds at least 1 s of padding after it


@dataclass(frozen=True)
class WindowPolicy:
    """How long an encoder window is: the utterance plus a margin, rounded up to `step_frames`,
    at least `min_frames`. Measured over the speech-eval set (docs/benchmarks.md, "Speech"):
    greedy decodes (partials) hear as well or better in a 3 s window stepped by 1 s as in
    a 10 s one, at half the time; the beam's final decode heard best in 10 s windows."""

    min_frames: int
    step_frames: int

    def frames(self, utterance_frames: int) -> int:
        window = -(-(utterance_frames + WINDOW_MARGIN_FRAMES) // self.step_frames) * self.step_frames
        return min(FULL_WINDOW_FRAMES, max(self.min_frames, window))


PARTIAL_WINDOW = WindowPolicy(min_frames=300, step_frames=100)
FINAL_WINDOW = WindowPolicy(min_frames=1000, step_frames=500)
NO_SPEECH_THRESHOLD = 0.6  # above this (and a low log-probability), the window is silence
SILENT_LOG_PROB = -1.0  # faster-whisper's pair: no_speech_prob > 0.6 and avg log-prob < -1.0
FALLBACK_TEMPERATURES = (0.4, 0.8)  # a final decode that looks failed is retried at these
MAX_BATCH = 8  # utterances decoded in one call (decode_batches.py)
# Whisper's prompt holds at most this many tokens of what was said before the utterance (the
# assistant's last words): the prompt's length is the decoder's cost, and one batch's rows need
# prompts of one length (CTranslate2), so a reply of this many tokens or more fills it exactly
CONTEXT_TOKENS = 32


def best_attempt(attempts: list[tuple[str, float | None]]) -> str:
    """The last decode, unless it too looks failed: then the likeliest of those that hold words and
    are not loops (faster-whisper's rule, less its loops; a sampled retry of a failed decode is
    often worse than the beam's, and a sampled "... ... ..." can be likelier per token than any words)."""
    text, log_prob = attempts[-1]
    if len(attempts) == 1 or not looks_failed(text, log_prob):
        return text
    candidates = [attempt for attempt in attempts if not is_loop(attempt[0]) and any(map(str.isalnum, attempt[0]))]
    candidates = candidates or attempts
    return max(candidates, key=lambda attempt: -math.inf if attempt[1] is None else attempt[1])[0]


class Transcriber:
    """One faster-whisper model shared by all sessions, with a fixed number of decode workers.

    Utterances shorter than ~28 s are encoded in a window just long enough for them (WindowPolicy:
    at least 3 s for partials, 10 s for finals) instead of Whisper's padded 30 s: the encoder's
    cost scales with the window, so a short turn decodes several times faster.
    """

    def __init__(self, model: str, compute_type: str = "int8", cpu_threads: int = 2, workers: int = 1,
                 final_beam: int = 3):
        from faster_whisper import WhisperModel
        from faster_whisper.tokenizer import Tokenizer

        path = whisper_model_path(model)
        verify_if_packaged(path)
        self.model_name = model
        self._model = WhisperModel(
            path, device="cpu", compute_type=compute_type, cpu_threads=cpu_threads, num_workers=workers
        )
        multilingual = self._model.model.is_multilingual
        tokenizer = Tokenizer(self._model.hf_tokenizer, multilingual, task="transcribe",
                              language="en" if multilingual else None)
        self._tokenizer = tokenizer
        self._task_prompt = [*tokenizer.sot_sequence, tokenizer.no_timestamps]
        self.final_beam = final_beam  # beam search for a turn's final transcript; partials stay greedy
        self._pool = PriorityPool(workers, "asr")
        self._workers = workers
        self._lock = threading.Lock()
        self._queued = 0
        # urgency: finals (someone waits to be answered) before partials
        self._finals = WaitingBatch(self._pool, 0.0, lambda waiting: self.finals_as_ready(*zip(*waiting)),
                                    MAX_BATCH, "finals")
        self._partials = WaitingBatch(self._pool, 1.0,
                                      lambda waiting: enumerate(self.transcribe_partials(*zip(*waiting))),
                                      MAX_BATCH, "partials")

    @property
    def live_jobs(self) -> int:
        """Decode jobs queued or running (the partials decoded together are one), for /healthz and
        /metrics (0 once every session is gone)."""
        return self._pool.live_jobs

    @property
    def busy(self) -> bool:
        """True when every worker has a job waiting: partials should skip a beat."""
        with self._lock:
            return self._queued >= self._workers

    def transcribe_blocking(self, audio_16k: np.ndarray, final: bool = False, context: str = "") -> str:
        """final: a turn's closing transcript (`transcribe_finals`); otherwise greedy. `context`:
        what was said just before (the assistant's last words), Whisper's prompt."""
        return (self.transcribe_finals if final else self.transcribe_partials)([audio_16k], [context])[0]

    def transcribe_partials(self, audios: Sequence[np.ndarray], contexts: Sequence[str] | None = None) -> list[str]:
        """Greedy transcripts of several utterances (open turns of different sessions)."""
        decoded = self._decode_each_alone(audios, self._prompts(audios, contexts), PARTIAL_WINDOW, 1)
        return [collapse_repetitions(text) for (text, _), _ in decoded]

    def transcribe_finals(self, audios: Sequence[np.ndarray], contexts: Sequence[str] | None = None) -> list[str]:
        """Turns' closing transcripts (`finals_as_ready`), in order."""
        texts = [""] * len(audios)
        for index, text in self.finals_as_ready(audios, contexts):
            texts[index] = text
        return texts

    def context_prompt(self, context: str) -> list[int]:
        """Whisper's decoder prompt: the last CONTEXT_TOKENS tokens of `context` as the previous
        text (Whisper's <|startofprev|>), then the task's tokens. Measured over the speech-eval
        set (docs/benchmarks.md, "Speech"): a context that holds the utterance's words halves
        tiny.en's WER, one that does not raises it (settings.whisper_reply_context is off)."""
        previous = self._tokenizer.encode(" " + context.strip())[-CONTEXT_TOKENS:] if context.strip() else []
        if not previous:
            return list(self._task_prompt)
        return [self._tokenizer.sot_prev, *previous, *self._task_prompt]

    def _prompts(self, audios: Sequence[np.ndarray], contexts: Sequence[str] | None) -> list[list[int]]:
        return [self.context_prompt(context) for context in (contexts or [""] * len(audios))]

    def finals_as_ready(self, audios: Sequence[np.ndarray],
                        contexts: Sequence[str] | None = None) -> Iterator[tuple[int, str]]:
        """(index, closing transcript) of each utterance: beam search, and faster-whisper's
        fallback to sampling for a decode that looks failed. Those that decoded well come first:
        the rare retries (one utterance at a time) keep no one else waiting."""
        retries = []
        prompts = self._prompts(audios, contexts)
        for index, (first, features) in enumerate(self._decode_each_alone(audios, prompts, FINAL_WINDOW,
                                                                          self.final_beam)):
            if features is None or not looks_failed(*first):
                yield index, collapse_repetitions(first[0])
            else:
                retries.append((index, first, features))
        for index, first, features in retries:
            attempts = [first]
            for temperature in FALLBACK_TEMPERATURES:
                attempts.append(self._decode_windows([features], [prompts[index]], FINAL_WINDOW, 1, temperature)[0])
                if not looks_failed(*attempts[-1]):
                    break
            yield index, collapse_repetitions(best_attempt(attempts))

    def _decode_each_alone(self, audios: Sequence[np.ndarray], prompts: list[list[int]], policy: WindowPolicy,
                           beam: int) -> list[tuple[tuple[str, float | None], np.ndarray | None]]:
        """((text, average log-probability), features) of each utterance as it would decode
        alone: those whose encoder windows and prompts are the same length go through Whisper in
        one call (the same words, for less than one call each). features: None where the
        utterance is too short to hear or too long for one window (decoded in segments), which
        nothing retries."""
        results: list[tuple[tuple[str, float | None], np.ndarray | None]] = [(("", None), None)] * len(audios)
        groups: dict[tuple[int, int], list[tuple[int, np.ndarray]]] = {}
        for index, audio in enumerate(audios):
            features = self._model.feature_extractor(audio)
            frames = features.shape[-1]
            if frames > FULL_WINDOW_FRAMES - 200:
                results[index] = ((self._transcribe_long(audio, prompts[index]), None), None)
            elif frames >= 10:
                groups.setdefault((policy.frames(frames), len(prompts[index])), []).append((index, features))
        for group in groups.values():
            decoded = self._decode_windows([features for _, features in group],
                                           [prompts[index] for index, _ in group], policy, beam)
            for (index, features), attempt in zip(group, decoded):
                results[index] = (attempt, features)
        return results

    def _decode_windows(self, features: list[np.ndarray], prompts: list[list[int]], policy: WindowPolicy,
                        beam: int = 1, temperature: float = 0.0) -> list[tuple[str, float | None]]:
        """(text, average log-probability) of each utterance, decoded in one call in a window
        just long enough for the longest (all of them: the same window, and prompts of one
        length, as grouped by the caller).

        Not `WhisperModel.transcribe`: it pads every segment to Whisper's 30 s window
        (`pad_or_trim`), which costs a short turn several times the encoder time, and it judges
        silence by the no-speech probability together with the average log-probability. This
        path uses faster-whisper's internals instead (`WhisperModel.model`, the CTranslate2
        Whisper, and `.feature_extractor`, `.hf_tokenizer`, `faster_whisper.tokenizer.Tokenizer`),
        so pyproject.toml pins faster-whisper to the exact version it was written against; the
        slow speech tests run it on the real model.
        """
        import ctranslate2

        longest = max(f.shape[-1] for f in features)
        padded = np.zeros((len(features), features[0].shape[0], policy.frames(longest)), dtype=np.float32)
        for row, f in enumerate(features):
            padded[row, :, :f.shape[-1]] = f
        sampling = {"sampling_temperature": temperature, "sampling_topk": 0} if temperature > 0 else {}
        results = self._model.model.generate(
            ctranslate2.StorageView.from_array(padded), prompts, beam_size=beam,
            # CTranslate2 counts the prompt in the length: a long context must not leave a short utterance none
            max_length=len(prompts[0]) + int(16 + 8 * longest / 100.0), return_no_speech_prob=True, return_scores=True,
            **sampling,
        )
        decoded = []
        for result in results:
            # ctranslate2's score: the sequence's log-probability normalised by its length
            log_prob = float(result.scores[0]) if result.scores else None
            if result.no_speech_prob > NO_SPEECH_THRESHOLD and (log_prob is None or log_prob < SILENT_LOG_PROB):
                decoded.append(("", log_prob))
            else:
                decoded.append((self._tokenizer.decode(result.sequences_ids[0]).strip(), log_prob))
        return decoded

    def _transcribe_long(self, audio_16k: np.ndarray, prompt: list[int]) -> str:
        previous = prompt[1:-len(self._task_prompt)] if len(prompt) > len(self._task_prompt) else None
        segments, _info = self._model.transcribe(
            audio_16k, language="en", beam_size=1, temperature=0.0, initial_prompt=previous,
            condition_on_previous_text=False, without_timestamps=True, vad_filter=False,
        )
        return " ".join(segment.text.strip() for segment in segments).strip()

    async def transcribe(self, audio_16k: np.ndarray, final: bool = False, context: str = "") -> str:
        """final: a turn's closing transcript, which someone waits on: it goes before every
        queued partial (of any session). Decodes of a kind that wait for a worker together are
        decoded together (decode_batches.py). `context`: as for `transcribe_blocking`."""
        with self._lock:
            self._queued += 1
        try:
            return await asyncio.wrap_future((self._finals if final else self._partials).add((audio_16k, context)))
        finally:
            with self._lock:
                self._queued -= 1

    def close(self) -> None:
        """Cancels the decodes not started (queued jobs and waiting utterances); running ones finish."""
        self._pool.shutdown()
        self._partials.cancel()
        self._finals.cancel()
