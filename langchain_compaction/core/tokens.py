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
from langchain_compaction.core.types import Message, Part, ToolCall

IMAGE_TOKENS = 1600
"""Fixed cost of one image: about what a 1092x1092 image costs on Claude."""
PDF_PAGE_TOKENS = 3000
"""Cost of one PDF page: Anthropic gives 1,500-3,000 tokens of text a page, and
each page is also shown to the model as an image."""
PDF_BYTES_PER_PAGE = 50_000
"""A page's size in a PDF whose pages cannot be counted (compressed object streams)."""
_PDF_PAGE = re.compile(rb"/Type\s*/Page(?![A-Za-z])")


def pdf_tokens(data: bytes) -> int:
    """The estimated cost of a PDF: ``PDF_PAGE_TOKENS`` a page.

    Pages are counted by their page objects; a file that hides them in
    compressed streams is taken as a page per ``PDF_BYTES_PER_PAGE``.

    Example:
        >>> pdf_tokens(b"%PDF-1.4 1 0 obj << /Type /Pages /Count 2 >> << /Type /Page >> << /Type/Page >>")
        6000
    """
    pages = len(_PDF_PAGE.findall(data)) or -(-len(data) // PDF_BYTES_PER_PAGE)
    return max(pages, 1) * PDF_PAGE_TOKENS


MESSAGE_OVERHEAD_TOKENS = 4
"""Per-message framing (role markers, separators) that providers bill."""

TOOL_CALL_OVERHEAD_TOKENS = 8
"""Per tool call framing (the call id, the block's structure)."""

# Characters other than ASCII letters and spaces cost more than a quarter of a
# token each. Weights are in twentieths of a token per character (``UNITS``):
# every weight is a whole number of them, so the estimate of a text made of
# pieces is exactly the sum of the pieces' (a transcript's cost is added up
# from its blocks instead of being estimated again).
UNITS = 20
"""Twentieths of a token: the unit the estimate counts in (``estimate_units``)."""
_LETTER_WEIGHT = 5  # ASCII letters, spaces and tabs: four characters a token
_PUNCT_WEIGHT = 8
_DIGIT_WEIGHT = 10
_NEWLINE_WEIGHT = 10
_CYRILLIC_LIKE_WEIGHT = 10  # Cyrillic, Greek, Armenian, Hebrew, Arabic, ...
_CJK_WEIGHT = 20  # Han, kana, Hangul: about a token a character
_OTHER_WEIGHT = 20
# Long runs without spaces (base64, hex, hashes, minified data) tokenize badly:
# charge each of their characters this much more than a letter or digit.
_DENSE_RUN_EXTRA = 9
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
    # (A run holds no space: a text with no word that long has none, found by a split in C.)
    if len(max(text.split(), key=len, default="")) < 48:
        return 0
    total = 0
    for match in _DENSE_RUN.finditer(text):
        run = match.group()
        if len(_CLASS_CHANGE.findall(run)) >= max(_DENSE_RUN_MIN_CLASS_CHANGES, len(run) // 16):
            total += len(run)
    return total


def estimate_units(text: str) -> int:
    """``estimate_tokens`` in twentieths of a token, before rounding down.

    Additive where a line break joins two texts (no character's weight
    depends on what lies across a line break): ``estimate_units(a + "\\n" + b)``
    is ``estimate_units(a) + estimate_units("\\n") + estimate_units(b)``.

    Example:
        >>> estimate_units("ab\\ncd") == estimate_units("ab") + estimate_units("\\n") + estimate_units("cd")
        True
    """
    if not text:
        return 0
    # ASCII letters and spaces: the cheap majority of prose.
    rest = text.translate(_ASCII_LETTERS_AND_SPACE)
    units = (len(text) - len(rest)) * _LETTER_WEIGHT
    if rest:
        without_digits = rest.translate(_DIGITS)
        units += (len(rest) - len(without_digits)) * _DIGIT_WEIGHT
        newlines = without_digits.count("\n")
        units += newlines * _NEWLINE_WEIGHT
        if without_digits.isascii():
            units += (len(without_digits) - newlines) * _PUNCT_WEIGHT
        else:
            cjk = len(_CJK.findall(without_digits))
            cyr = len(_CYRILLIC_LIKE.findall(without_digits))
            ascii_other = sum(1 for ch in without_digits if ch < "\x80") - newlines
            other = len(without_digits) - cjk - cyr - ascii_other - newlines
            units += ascii_other * _PUNCT_WEIGHT + cjk * _CJK_WEIGHT
            units += cyr * _CYRILLIC_LIKE_WEIGHT + other * _OTHER_WEIGHT
    if len(text) >= 48:
        # Re-price dense runs: they were charged at letter/digit rates above.
        units += _dense_runs(text) * _DENSE_RUN_EXTRA
    return units


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
    return estimate_units(text) // UNITS


def part_units(part: Part) -> int:
    """``estimate_units`` of a part's text, made once per part and kept on it."""
    return _kept_units(part, part.text)


def argument_units(call: ToolCall) -> int:
    """``estimate_units`` of a tool call's arguments, made once per call and kept on it."""
    return _kept_units(call, call.arguments)


def _kept_units(holder: Part | ToolCall, text: str) -> int:
    """``estimate_units(text)``, kept in ``holder.known_units`` (-1 until made)."""
    units = holder.known_units
    if units < 0:
        units = estimate_units(text)
        object.__setattr__(holder, "known_units", units)  # a cache, not a change of value
    return units


def attachment_tokens(message: Message) -> int:
    """What ``estimate_message`` charges for a message's images and files."""
    return sum(_attached(part) for part in message.parts if part.kind == "image")


def _attached(part: Part) -> int:
    """An image's or a file's cost: a fixed one, or a PDF's pages (``pdf_tokens``, kept on the part)."""
    return part.tokens or IMAGE_TOKENS


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
            total += _attached(part)
        elif not part.unsent:
            total += part_units(part) // UNITS
    for call in message.tool_calls:
        total += TOOL_CALL_OVERHEAD_TOKENS + estimate_tokens(call.name) + argument_units(call) // UNITS
    if message.tool_call_id:
        total += estimate_tokens(message.tool_call_id)
    for result in message.results:  # (a user turn's tool_result blocks)
        total += estimate_message(result) - MESSAGE_OVERHEAD_TOKENS
    return total
