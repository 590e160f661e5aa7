"""Text for the ear: clean LLM output for speech, and find sentences as they settle."""

from __future__ import annotations

import re
import unicodedata

_CODE_BLOCK = re.compile(r"```.*?(```|$)", re.S)
_INLINE_CODE = re.compile(r"`([^`]*)`")
_MD_LINK = re.compile(r"\[([^\]]+)\]\([^)]*\)")
_URL = re.compile(r"\bhttps?://([^\s/]+)\S*|\bwww\.([^\s/]+)\S*")
_EMPHASIS = re.compile(r"(\*\*|__|\*|_|~~)(?=\S)(.+?)(?<=\S)\1")
_HEADING_OR_QUOTE = re.compile(r"^\s{0,3}(#{1,6}|>)\s*", re.M)
_LIST_MARKER = re.compile(r"^\s*([-*+•]|\d+[.)])\s+", re.M)
_SPACES = re.compile(r"\s+")
_NUMBER_PERCENT = re.compile(r"(\d)\s?%")
_CURRENCY_AMOUNT = re.compile(r"([$€£])\s?(\d+(?:,\d{3})*(?:\.\d+)?)")
_CURRENCY_WORDS = {"$": "dollars", "€": "euros", "£": "pounds"}

# symbols read aloud as words; everything else non-speakable is dropped
_SYMBOL_WORDS = {
    "&": " and ", "@": " at ", "+": " plus ", "=": " equals ", "°": " degrees ",
    "$": " dollars ", "€": " euros ", "£": " pounds ", "/": " slash ",
}
_DROPPED = set("*#_~`|<>[]{}^\\")

_NOT_A_WORD = re.compile(r"[^a-z0-9' ]+")


def words(text: str) -> list[str]:
    """The words of a transcript, for comparing: lower case, punctuation gone, digits kept."""
    return _NOT_A_WORD.sub(" ", text.lower()).split()


_TERMINATOR = "[.!?…]"
_SENTENCE_END = re.compile(rf"(?<={_TERMINATOR})[\"')\]]*\s+(?=\S)")  # between two sentences
_WHOLE_SENTENCES_END = re.compile(rf"{_TERMINATOR}(?=\s|$)")  # where a text's last whole sentence ends


def clean_for_speech(text: str) -> str:
    """Markdown, emoji, URLs and symbols -> plain words a voice can read."""
    text = _CODE_BLOCK.sub(" ", text)
    text = _INLINE_CODE.sub(r"\1", text)
    text = _MD_LINK.sub(r"\1", text)
    text = _URL.sub(lambda m: " " + (m.group(1) or m.group(2)).replace(".", " dot ") + " ", text)
    text = _HEADING_OR_QUOTE.sub("", text)
    text = _LIST_MARKER.sub("", text)
    text = _EMPHASIS.sub(r"\2", text)
    text = _NUMBER_PERCENT.sub(r"\1 percent", text)
    text = _CURRENCY_AMOUNT.sub(lambda m: f"{m.group(2)} {_CURRENCY_WORDS[m.group(1)]}", text)  # "$5": "5 dollars"
    text = "".join(_speakable(ch) for ch in text)
    return _SPACES.sub(" ", text).strip()


def _speakable(ch: str) -> str:
    if ch in _SYMBOL_WORDS:
        return _SYMBOL_WORDS[ch]
    if ch in _DROPPED:
        return " "
    category = unicodedata.category(ch)
    if category in ("So", "Sk", "Cs", "Co", "Cn") or ch in "\u200d\ufe0f":
        return " "  # emoji, pictographs, joiners
    if category.startswith("C") and ch not in "\n\t":
        return " "
    return ch


def whole_sentences(text: str) -> str:
    """The text up to its last sentence end ("" when it has none)."""
    ends = [m.end() for m in _WHOLE_SENTENCES_END.finditer(text)]
    return text[: ends[-1]].strip() if ends else ""


def split_settled_sentences(text: str, final: bool) -> tuple[list[str], str]:
    """Split off the complete sentences of `text`; the rest waits for more text.

    A sentence is complete when its terminator is followed by whitespace and more text (or the
    text is final), so "3." in "3.5" is not taken for an end.
    """
    sentences: list[str] = []
    start = 0
    for match in _SENTENCE_END.finditer(text):
        sentence = text[start : match.start() + len(match.group(0).rstrip())].strip()
        if sentence:
            sentences.append(sentence)
        start = match.end()
    rest = text[start:]
    if final and rest.strip():
        sentences.append(rest.strip())
        rest = ""
    return sentences, rest


_CLAUSE_BREAK = re.compile(r"[,;:]\s+(?=\S)")
# a long first sentence without punctuation may also break before a conjunction (a natural breath)
_CONJUNCTION_BREAK = re.compile(r"\s+(?=(?:and|but|or|so|because|which|that|when|while|where|with)\s+\S)",
                                re.IGNORECASE)
LONG_CLAUSE_WORDS = 7


class SentenceSettler:
    """Feeds growing settled text (each call the whole text so far); returns new sentences once.

    The very first piece may be a clause (up to a comma, semicolon or colon, at least
    `first_clause_words` words; or, after 7 words without one, up to a conjunction): the listener
    hears something sooner when the first sentence is long, and a clause boundary is a natural
    place for a breath.
    """

    def __init__(self, first_clause_words: int = 4) -> None:
        self._consumed = 0  # chars of the settled text already handed out as sentences
        self._first_clause_words = first_clause_words

    def feed(self, settled_text: str, final: bool) -> list[str]:
        pending = settled_text[self._consumed :]
        sentences, rest = split_settled_sentences(pending, final)
        if not sentences and self._consumed == 0 and self._first_clause_words:
            clause, rest = self._first_clause(rest)
            sentences = [clause] if clause else []
        self._consumed = len(settled_text) - len(rest)
        return sentences

    def _first_clause(self, text: str) -> tuple[str, str]:
        for match in _CLAUSE_BREAK.finditer(text):
            clause = text[: match.start() + 1].strip()
            if len(clause.split()) >= self._first_clause_words:
                return clause, text[match.end() :]
        for match in _CONJUNCTION_BREAK.finditer(text):
            clause = text[: match.start()].strip()
            if len(clause.split()) >= max(LONG_CLAUSE_WORDS, self._first_clause_words):
                return clause, text[match.end() :]
        return "", text
