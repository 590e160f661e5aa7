"""semantic_vad's judgement: do the user's words so far sound finished?

The LLM already resident in the engine answers it: the probability that the user's turn ends
(the chat template's end-of-turn token) right after the transcript, in the conversation so
far: one pass over a prompt whose head the prefix cache usually holds. SmolLM2 reads the
punctuation Whisper writes, so "What is the capital of France?" scores ~0.6 and "What is the
capital of" ~0.0. Lexical checks keep the small model honest: words that end on "of", "the",
"and" ... or on a pause's comma ("No wait,") are unfinished whatever the score, and words that
end a sentence but score low ("Hello.") wait server_vad's window rather than the eagerness's
limit, as do words Whisper wrote in lower case without punctuation (the model reads no end in them).
Without a verdict in time (a busy engine) the turn ends at server_vad's silence window too.
Verdicts are asked for each partial transcript as it comes (`prefetch`), so the one a pause
needs is usually ready when the pause begins.
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Callable

from voice_app.core.models import Engine
from voice_app.core.offload import submit_off_loop
from voice_app.core.speech_text import words

log = logging.getLogger(__name__)

VERDICT_TIMEOUT_S = 1.0  # a verdict later than this is not worth waiting for

# Words a sentence hardly ends on. Whisper punctuates a thinking pause as if it ended a question
# ("What is the capital of?"), and the model believes the punctuation (p = 0.51 there, 0.00
# without the "?"): after one of these, the words are unfinished whatever the score.
DANGLING_WORDS = frozenset("a an the and or but because of to at in on into my your his her its our their "
                           "plus minus times than um uh er".split())

# Punctuation Whisper writes at a pause inside a sentence ("No wait, ", "So..."): the speaker
# is drawing breath, not done, whatever the model makes of the words before it.
MID_SENTENCE_ENDINGS = (",", ";", ":", "-", "...", "…")


def sounds_cut_off(transcript: str) -> bool:
    """Words that end mid-sentence: on a dangling word ("the capital of") or a pause's comma."""
    return last_word(transcript) in DANGLING_WORDS or transcript.rstrip().endswith(MID_SENTENCE_ENDINGS)


# what people say to show they are listening, not to take the turn
# (with the ways Whisper tiny spells "mm-hmm": "M", "mm", "MM", "NMM", "Hmm", ...)
BACKCHANNELS = {"m", "mm", "mmm", "nmm", "hm", "hmm", "mhm", "mhmm", "mm-hmm", "mmhmm", "uh-huh", "uh", "um", "yeah",
                "yes", "yep", "ok", "okay", "right", "sure", "i", "see", "got", "it", "oh", "ah", "wow", "nice", "cool",
                "aha", "huh", "uhhuh", "mhmm"}


# A hum ("mm-hmm") is what Whisper tiny hears worst ("M", "minimum", "in a month", "an m m m"):
# over a paused reply, speech this short (three syllables at most, whatever Whisper made of it)
# that is neither a stop command nor a question is taken for one. A wrong guess costs little:
# the reply resumes where it paused, and speech that goes on cuts it.
HUM_MAX_SPEECH_MS = 600


def is_false_interruption(transcript: str, speech_ms: int | None = None) -> bool:
    """No words (a cough, a door), a bare backchannel of at most three words, or (given how
    long the speech lasted) a hum, whatever words Whisper heard in it."""
    spoken = words(transcript.replace("-", ""))  # "mm-hmm" is one word here
    if len(spoken) <= 3 and all(word in BACKCHANNELS for word in spoken):
        return True
    return (speech_ms is not None and speech_ms <= HUM_MAX_SPEECH_MS and "?" not in transcript
            and not is_stop_command(transcript))


# A whole turn that only tells the assistant to stop: it cuts the reply and gets no reply of its
# own (answering "Stop." made SmolLM2 carry on with the story it cut).
STOP_COMMANDS = frozenset({
    "stop", "stop it", "stop that", "stop talking", "stop stop", "wait", "wait wait", "hold on", "hang on",
    "never mind", "nevermind", "be quiet", "quiet", "silence", "enough", "that's enough", "that is enough",
    "cancel", "pause", "shut up", "no stop", "stop please", "please stop", "ok stop", "okay stop",
})
_COMMAND_FILLERS = frozenset("ok okay oh um uh hey no please now thanks".split())
_HUSH = re.compile(r"^(s?h+|shh+|sh+h*|shush|hush)$")  # "Shh", "Shhh", "Sh", "Hush"


def is_stop_command(transcript: str) -> bool:
    """"Stop.", "Wait.", "Hold on.", "Never mind.", "Be quiet.", "Shh" and the like, alone, or a
    run of them ("Wait, stop.", "Okay, stop!"): every phrase between punctuation is one, or only
    fillers."""
    phrases = [_without_fillers(p) for p in re.split(r"[,.;:!?]+", transcript)]
    commands = [p for p in phrases if p]
    return bool(commands) and all(" ".join(p) in STOP_COMMANDS or all(_HUSH.match(w) for w in p) for p in commands)


def _without_fillers(phrase: str) -> list[str]:
    """The phrase's words, less the fillers around them ("okay", "please"), unless the phrase
    is a command with them ("okay stop")."""
    spoken = [w.strip("-") for w in words(phrase)]
    while spoken and spoken[0] in _COMMAND_FILLERS and " ".join(spoken) not in STOP_COMMANDS:
        spoken = spoken[1:]
    while spoken and spoken[-1] in _COMMAND_FILLERS and " ".join(spoken) not in STOP_COMMANDS:
        spoken = spoken[:-1]
    return spoken


def last_word(transcript: str) -> str:
    spoken = words(transcript)
    return spoken[-1] if spoken else ""


def ends_a_sentence(transcript: str) -> bool:
    return transcript.rstrip().endswith((".", "?", "!"))


# Whisper tiny.en sometimes writes a whole utterance in lower case without one punctuation mark
# ("who wrote Romeo and Juliet"), and the model reads no end in it (p = 0.000; 0.108 with "?"):
# such words say nothing either way, so they wait server_vad's window, not the eagerness's limit.
# Two words or fewer ("how many") are too likely the start of a thought.
UNPUNCTUATED_MIN_WORDS = 3


def written_without_punctuation(transcript: str) -> bool:
    text = transcript.strip()
    return (text[:1].islower() and not re.search(r"[.,;:!?…]", text)
            and len(words(text)) >= UNPUNCTUATED_MIN_WORDS)


class EndOfTurnJudge:
    def __init__(self, engine: Engine, conversation_with: Callable[[str], list[dict[str, str]]],
                 threshold: float, fit: Callable[[list[dict[str, str]]], list[dict[str, str]]] | None = None):
        self._engine = engine
        self._conversation_with = conversation_with  # the transcript as the pending user message
        self._fit = fit or (lambda messages: messages)  # trims the prompt to the context (blocking)
        self.threshold = threshold
        self._verdicts: dict[str, asyncio.Task] = {}  # per transcript, asked or answered

    def forget(self) -> None:
        """A new turn: earlier verdicts were about another context."""
        self._verdicts.clear()

    def close(self) -> None:
        for task in self._verdicts.values():
            task.cancel()
        self._verdicts.clear()

    def prefetch(self, transcript: str) -> None:
        """Asks now, while the user may still be talking: when they stop after these words, the
        verdict is ready instead of one engine round trip away."""
        if transcript.strip() and not sounds_cut_off(transcript):
            self._verdict(transcript.strip())

    async def sounds_finished(self, transcript: str) -> bool | None:
        """True (the short silence ends the turn), False (unfinished: the eagerness's limit), or
        None (server_vad's window): no verdict in time, or a low score for words that do end a
        sentence ("Hello." scores 0.006: a greeting should not wait 1.6 s) or that Whisper wrote
        without punctuation."""
        if sounds_cut_off(transcript):
            return False
        probability = await self.probability(transcript)
        if probability is not None and probability >= self.threshold:
            return True
        if probability is None or ends_a_sentence(transcript) or written_without_punctuation(transcript):
            return None
        return False

    async def probability(self, transcript: str) -> float | None:
        """p(end of turn | conversation, transcript); None when the engine cannot say in time."""
        text = transcript.strip()
        if not text:
            return None
        return await asyncio.shield(self._verdict(text))

    def _verdict(self, text: str) -> asyncio.Task:
        """The one engine request per transcript; a verdict that failed may be asked again."""
        task = self._verdicts.get(text)
        if task is None or (task.done() and (task.cancelled() or task.result() is None)):
            task = self._verdicts[text] = asyncio.ensure_future(self._ask(text))
        return task

    async def _ask(self, text: str) -> float | None:
        try:  # the chat template and the tokenizer run on a worker thread, not the event loop
            messages = self._conversation_with(text)
            handle = await submit_off_loop(
                lambda: self._engine.end_of_turn_probability(self._fit(messages), background=False))
        except Exception as exc:  # an overloaded or failed engine: the silence rule decides alone
            log.info("no end-of-turn verdict for %r: %s", text, exc)
            return None
        try:
            final = await asyncio.wait_for(_final_update(handle), VERDICT_TIMEOUT_S)
        except asyncio.TimeoutError:
            handle.cancel()
            log.info("end-of-turn verdict for %r took over %.0f ms", text, VERDICT_TIMEOUT_S * 1000)
            return None
        except asyncio.CancelledError:  # the session closed: no engine request nobody reads
            handle.cancel()
            raise
        except Exception as exc:  # the request failed in the engine
            log.info("no end-of-turn verdict for %r: %s", text, exc)
            return None
        if not final.token_probs:
            return None
        stats = final.stats
        log.debug("p(end of turn | %r) = %.3f (%d of %d prompt tokens cached, %d passes, %.0f ms in the engine)",
                  text, final.token_probs[0], stats.cached_prompt_tokens, stats.prompt_tokens, stats.forward_passes,
                  stats.elapsed_s * 1000)
        return final.token_probs[0]


async def _final_update(handle):
    final = None
    async for update in handle:
        final = update
    return final
