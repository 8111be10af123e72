"""Token estimates that need no tokenizer.

pi's compaction (``estimateTokens`` in its Go port) counts ``len(text) / 4`` over text parts only. That
is right for English prose and wrong for almost everything an agent carries:
source code, JSON tool results, CJK text and base64 run far fewer characters
per token, so a 4-chars rule undercounts them and the context overflows before
compaction fires. The estimate here keeps plain prose at four characters per
token (``estimate_tokens("a" * 400) == 100``) and charges more for the
character classes that tokenizers split finely. The weights were fitted so that
no content class is underestimated against the cl100k, o200k and legacy Claude
tokenizers (``bench/estimate_accuracy.py`` measures it).
"""

from __future__ import annotations

import re

from langchain_compaction.core.effects import breathe
from langchain_compaction.core.types import Message

IMAGE_TOKENS = 1600
"""Fixed cost of one image: about what a 1092x1092 image costs on Claude."""

MESSAGE_OVERHEAD_TOKENS = 4
"""Per-message framing (role markers, separators) that providers bill."""

TOOL_CALL_OVERHEAD_TOKENS = 8
"""Per tool call framing (the call id, the block's structure)."""

# Characters other than ASCII letters and spaces cost more than a quarter of a
# token each. Weights are tokens per character.
_PUNCT_WEIGHT = 0.4
_DIGIT_WEIGHT = 0.5
_NEWLINE_WEIGHT = 0.5
_CYRILLIC_LIKE_WEIGHT = 0.5  # Cyrillic, Greek, Armenian, Hebrew, Arabic, ...
_CJK_WEIGHT = 1.0  # Han, kana, Hangul: about a token a character
_OTHER_WEIGHT = 1.0
# Long runs without spaces (base64, hex, hashes, minified data) tokenize badly:
# charge each of their characters this much instead of its class weight.
_DENSE_RUN_WEIGHT = 0.75
_DENSE_RUN = re.compile(r"[A-Za-z0-9+/=_\-]{48,}")
_DENSE_RUN_MIN_CLASS_CHANGES = 12

_ASCII_LETTERS_AND_SPACE = str.maketrans("", "", "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ \t")
_DIGITS = str.maketrans("", "", "0123456789")
_CJK = re.compile(r"[\u1100-\u11ff\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef]")
_CYRILLIC_LIKE = re.compile(r"[\u0370-\u07ff]")
_CLASS_CHANGE = re.compile(r"[a-z][A-Z0-9+/]|[A-Z][0-9+/]|[0-9][A-Za-z+/]")


def _dense_runs(text: str) -> int:
    """Characters in long space-free runs that look like encoded data.

    A long identifier (``very_long_snake_case_name``) is also space-free, so a
    run only counts when its character class keeps changing, as it does in
    base64 and hex but not in words.
    """
    total = 0
    for match in _DENSE_RUN.finditer(text):
        run = match.group()
        if len(_CLASS_CHANGE.findall(run)) >= max(_DENSE_RUN_MIN_CLASS_CHANGES, len(run) // 16):
            total += len(run)
    return total


def estimate_tokens(text: str) -> int:
    """Estimate the tokens in a piece of text, without a tokenizer.

    Plain prose costs about one token per four characters, as in pi's
    compaction; punctuation, digits, line breaks, non-Latin scripts and
    encoded data cost more, so code, JSON, CJK text and base64 are not
    undercounted.

    Args:
        text: Any string.

    Returns:
        The estimated token count (0 for an empty string).

    Example:
        >>> estimate_tokens("a" * 400)
        100
    """
    if not text:
        return 0
    # ASCII letters and spaces: the cheap majority of prose.
    rest = text.translate(_ASCII_LETTERS_AND_SPACE)
    cheap = len(text) - len(rest)
    tokens = cheap * 0.25
    if rest:
        without_digits = rest.translate(_DIGITS)
        digits = len(rest) - len(without_digits)
        newlines = without_digits.count("\n")
        if without_digits.isascii():
            punct = len(without_digits) - newlines
            tokens += digits * _DIGIT_WEIGHT + newlines * _NEWLINE_WEIGHT + punct * _PUNCT_WEIGHT
        else:
            cjk = len(_CJK.findall(without_digits))
            cyr = len(_CYRILLIC_LIKE.findall(without_digits))
            ascii_other = sum(1 for ch in without_digits if ch < "\x80") - newlines
            other = len(without_digits) - cjk - cyr - ascii_other - newlines
            tokens += (
                digits * _DIGIT_WEIGHT
                + newlines * _NEWLINE_WEIGHT
                + ascii_other * _PUNCT_WEIGHT
                + cjk * _CJK_WEIGHT
                + cyr * _CYRILLIC_LIKE_WEIGHT
                + other * _OTHER_WEIGHT
            )
    if len(text) >= 48 and (dense := _dense_runs(text)):
        # Re-price dense runs: they were charged at letter/digit rates above.
        tokens += dense * (_DENSE_RUN_WEIGHT - 0.3)
    return int(tokens)


def estimate_message(message: Message) -> int:
    """Estimate everything a model is billed for in one message.

    Counts text, reasoning, structured blocks, tool-call names and arguments,
    the tool result's own text, a fixed cost per image and a per-message
    overhead: pi's compaction counted text parts only, so tool-heavy agents
    overflowed before it fired.

    Args:
        message: The message to count.

    Returns:
        The estimated token count.
    """
    breathe()  # called per message: on the worker thread, let the event loop in
    total = MESSAGE_OVERHEAD_TOKENS
    for part in message.parts:
        if part.kind == "image":
            total += IMAGE_TOKENS
        else:
            total += estimate_tokens(part.text)
    for call in message.tool_calls:
        total += TOOL_CALL_OVERHEAD_TOKENS + estimate_tokens(call.name) + estimate_tokens(call.arguments)
    if message.tool_call_id:
        total += estimate_tokens(message.tool_call_id)
    return total
