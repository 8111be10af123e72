"""Identifiers in a message's text, read without a model: what a summary must not paraphrase.

Ids and codes that mix letters and digits, numeric ids with hyphens, amounts
(with a currency sign, or a currency named beside them: "145.60 EUR"), dates
(in words too: "14 March 2025"),
versions, paths, file names, URLs, e-mail addresses and names from code
(``camelCase``, ``snake_case``; not the parts of a value found already),
but nothing from an encoded blob. ``core.facts`` keeps those a user gave; the
extractive summarizer copies them by the same rule. Every rule is a linear scan
or regex, tried word by word.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from string import ascii_letters, ascii_lowercase, ascii_uppercase, digits

from langchain_compaction.core.lines import MAX_KEY_CHARS, clip
from langchain_compaction.core.voice import SLASH_COMMAND, command_line, prose

# Identifiers are matched token by token (whitespace-separated words, trimmed
# of brackets and punctuation), so a pathological input stays linear.
_URL = re.compile(r"https?://[^\s)>\]\"'`]+")
_TOKEN = re.compile(
    r"""
      [\w.+-]+@[\w-]+(?:\.[\w-]+)+                         # e-mail addresses
    | [\w.~@/-]*/[\w.@/-]+                                 # paths (checked by _is_path)
    | [A-Za-z]:[\\/][\w.~@$\\/-]+                          # Windows paths (C:\Users\..., C:/...)
    | [\w-]+\.(?:py|pyi|js|ts|tsx|jsx|json|ya?ml|toml|md|txt|csv|c|h|cc|cpp|hpp|go|rs|java|kt|rb|php|sh|sql
        |html|css|cfg|ini|lock|xml|ipynb|env|pony|swift|scala|lua|vue|scss|proto|tf|gradle
        |pdf|docx?|xlsx?|pptx?|odt|ods|rtf|tsv|parquet|avro|pkl|npy|npz|h5|db|sqlite3?|log|bak|dat
        |png|jpe?g|gif|svg|webp|tiff?|mp3|mp4|wav|mov|zip|tar|gz|tgz|bz2|xz|7z|whl|jar)  # bare file names
    | [$€£¥]\d[\d,]*(?:\.\d+)?                             # amounts
    | \d{3,}-\d{4,}|\d+(?:-\d+){2,}                        # numeric ids and dates (047-2299310455), not ranges
    | v?\d+\.\d+(?:\.\d+)+                                 # versions
    | (?=[A-Za-z_-]*\d)(?=[\d_-]*[A-Za-z])[A-Za-z0-9][A-Za-z0-9_-]{3,}  # codes mixing letters and digits
    | \d[\d,]{3,}(?:\.\d+)?                                # long numbers
    """,
    re.VERBOSE,
)
_CURRENCY_CODES = "EUR|USD|GBP|JPY|CHF|CAD|AUD|NZD|CNY|HKD|SGD|INR|SEK|NOK|DKK|PLN|CZK|HUF|BRL|MXN|ZAR|TRY|KRW|AED"
_CURRENCY_SIGNS = "€£¥₹₩"
_CURRENCY_NAMES = "euros?|dollars?|pounds?|yen"
_CURRENCY_WORDS = tuple(name.removesuffix("s?") for name in _CURRENCY_NAMES.split("|"))  # ("euro", ...)
_CURRENCY = rf"(?:(?:{_CURRENCY_CODES})\b|[{_CURRENCY_SIGNS}]|(?:{_CURRENCY_NAMES})\b)"
# Every amount names its currency: a scan for the codes and signs (branches
# that each start with a capital or a sign, which the engine skips to) and
# substring scans for the words spare ``_AMOUNT``, tried at every position,
# the texts that name none.
_CURRENCY_MARK = re.compile("|".join((_CURRENCY_CODES, *_CURRENCY_SIGNS)))


def _names_currency(text: str, shape: bytes | None = None) -> bool:
    """Whether ``text`` names a currency; ``shape``: its ``_NAME_CLASSES`` when ASCII (a code is three capitals)."""
    coded = shape is None or b"AAA" in shape  # (no ASCII text holds a sign)
    return (coded and _CURRENCY_MARK.search(text) is not None) or any(word in text for word in _CURRENCY_WORDS)


# (A number starts where no word, digit or separator of its own precedes it:
# each run is read once, from its start. "1'1'1'..." read from each digit took minutes.)
_AMOUNT = re.compile(
    rf"(?<![\w.,']){_CURRENCY}[^\S\n]?\d(?:[\d.,']*\d)?(?![\w])|(?<![\w.,'])\d(?:[\d.,']*\d)?[^\S\n]?{_CURRENCY}"
)
# A date written in words: "14 March 2025", "March 14th, 2025", "3 Feb". (Months
# capitalized, as they are written; "May" only beside its day.)
_MONTH_NAMES: tuple[str, ...] = ("January", "February", "March", "April", "May", "June", "July", "August")
_MONTH_NAMES += ("September", "October", "November", "December")
_MONTHS = "(?:" + "|".join((*_MONTH_NAMES, *(m[:3] for m in _MONTH_NAMES), "Sept")) + r")\b\.?"
_DAY = r"(?:[1-9]|[12]\d|3[01])(?:st|nd|rd|th)?"
_DATE = re.compile(rf"\b(?:{_DAY}[^\S\n](?:of[^\S\n])?{_MONTHS}|{_MONTHS}[^\S\n]{_DAY}\b)(?:,?[^\S\n]\d{{4}}\b)?")
_MONTH_MARK = re.compile("|".join(m[:3] for m in _MONTH_NAMES))  # (one pass spares most texts)
_PARTS = re.compile(r"[^\w]+")
_MAX_TOKEN_CHARS = 200
# camelCase, PascalCase with an inner capital, snake_case; tried at word starts only.
_CODE_NAME = re.compile(
    r"\b(?:[a-z]+[A-Z][A-Za-z0-9]*|[A-Z][a-z0-9]+[A-Z][A-Za-z0-9]*|[A-Za-z][A-Za-z0-9]*_[A-Za-z0-9_]+)\b"
)
# What makes a word a candidate. (A dot counts only before a letter or digit,
# as in a file name: a word that ends a sentence is no identifier.)
_IDENTIFIER_MARK = re.compile(r"[\d/@$€£¥]|\.\w")


def _maybe_identifiers(text: str) -> list[str]:
    """The words of ``text`` that hold a digit, a slash, an @, a currency sign or an inner dot.

    Found in C in ASCII text (``_words_holding``); else split in C, and a word
    of letters alone is let go without a pattern (a pattern tried at every
    position of the text took twice as long).
    """
    if text.isascii():
        return _words_holding(text, text.encode("ascii").translate(_MARK_CLASSES), b"#", b".w")
    return [word for word in text.split() if not word.isalpha() and _IDENTIFIER_MARK.search(word)]


def _classes(*groups: tuple[str, bytes]) -> bytes:
    """A ``bytes.translate`` table for ASCII text: each group's characters to its class.

    Whitespace (what ``str.split`` splits at) goes to a space, any other character to a dash.
    """
    table = bytearray(b"-" * 256)
    for code in range(128):
        if chr(code).isspace():
            table[code] = ord(" ")
    for characters, mark in groups:
        for character in characters:
            table[ord(character)] = mark[0]
    return bytes(table)


# An ASCII text's characters by class, one byte each: a mark is then a byte or two
# that ``bytes.find`` finds (``_words_holding``).
_MARK_CLASSES = _classes((digits + "/@$", b"#"), (ascii_letters + "_", b"w"), (".", b"."))
"""``_IDENTIFIER_MARK``'s marks in ASCII: a digit, a slash, an @ or a dollar is a ``#``; an inner dot is a
``.`` before a ``w`` (a letter or an underscore) or a ``#`` (a digit: a mark already)."""
_NAME_CLASSES = _classes((ascii_lowercase + digits, b"a"), (ascii_uppercase, b"A"), ("_", b"_"))
"""What makes a word a code name's candidate (``names_in_code``) in ASCII: an ``_``, or an ``a`` (a small letter or a
digit) before an ``A`` (a capital)."""


def _words_holding(text: str, classes: bytes, first: bytes, second: bytes) -> list[str]:
    """The words of ASCII ``text`` (``str.split``'s, in order) whose ``classes`` hold ``first`` or ``second``.

    ``classes``: ``text`` translated by a ``_classes`` table, one byte a character.
    Searched in C, from one word that holds a mark to the next: a loop over
    every word ran Python for each, where most hold none.
    """
    found: list[str] = []
    one, two = classes.find(first), classes.find(second)
    while one >= 0 or two >= 0:
        hit = one if two < 0 or 0 <= one < two else two
        start = classes.rfind(b" ", 0, hit) + 1
        end = classes.find(b" ", hit)
        end = len(classes) if end < 0 else end
        found.append(text[start:end])
        if 0 <= one < end:
            one = classes.find(first, end)
        if 0 <= two < end:
            two = classes.find(second, end)
    return found


def identifiers(text: str, *, code_names: bool = True, max_code_names: int | None = None) -> list[str]:
    """Ids, codes, amounts, dates, versions, paths, URLs, addresses and code names in ``text``.

    ``max_code_names`` keeps only the first code names (a pasted prompt or
    listing names dozens); values are never capped.

    Example:
        >>> identifiers("Rebook RZ8KPW for $1,250.50 on 2024-05-21, see docs/booking.md")
        ['RZ8KPW', '$1,250.50', '2024-05-21', 'docs/booking.md']
        >>> identifiers("Use the useCart hook in CartPanel and keep max_retries")
        ['useCart', 'CartPanel', 'max_retries']
    """
    # What a harness answered to a slash command is not what the user gave.
    return identifiers_in(prose(command_line(text) or text), code_names=code_names, max_code_names=max_code_names)


def identifiers_in(words: str, *, code_names: bool = True, max_code_names: int | None = None) -> list[str]:
    """``identifiers`` of a text made ``prose`` already (``core.voice.prose_and_own_words``)."""
    found: dict[str, None] = {}  # (an ordered set: a tool's output may hold thousands)
    words = _without_dumps(words)
    if "://" in words:
        for url in _URL.findall(words):
            _add_new(found, url.rstrip(".,;:!?"))
    shape = words.encode("ascii").translate(_NAME_CLASSES) if words.isascii() else None
    # An amount with its currency named beside it ("145.60 EUR", "EUR 420.00", "1.250,50 €"): two words.
    for amount in _AMOUNT.findall(words) if _names_currency(words, shape) else ():
        _add_new(found, amount)
    dated = _dates(words, found)
    # Only words with a digit, a dot inside, a slash, an @ or a currency sign can be
    # identifiers: one pass finds them, plain words are never looked at.
    for word in _maybe_identifiers(words if words.isascii() else _NON_ASCII_GLUE.sub(" ", words)):
        for token in _tokens(word):
            if encoded(token) or ("/" in token and not is_path(token)) or token in dated:
                continue  # "and/or", "yes/no"
            _add_new(found, token)
    # Names from code the user wrote in prose (camelCase, PascalCase with an
    # inner capital, snake_case): a model paraphrases them into plain words.
    names = _code_names(words, shape) if code_names else []
    if names:
        values = len(found)
        # (Not the parts of a value found already: "report_final" of "report_final.pdf". One split of
        # them all: its parts are theirs, but for an empty one, which no name is.)
        parts = set(_PARTS.split(" ".join(found)))
        for name in names:
            if max_code_names is not None and len(found) - values >= max_code_names:
                break
            if name not in parts:
                _add_new(found, name)
    return list(found)


# A line of a hex or octal dump (xxd, hexdump, od): an offset, then four groups of digits or more.
_DUMP_LINE = re.compile(r"^[^\S\n]*[0-9A-Fa-f]{6,16}:?(?:[^\S\n]+[0-9A-Fa-f]{2,8}){4,}(?:[^\S\n].*)?$", re.MULTILINE)
_DATA_LINE_CHARS = 400


def _without_dumps(words: str) -> str:
    """``words`` without the lines of a dump and of minified data: no facts there.

    Minified data is a long line of hardly a space, thick with JSON's marks (a
    paragraph of Chinese has no spaces either, a signed URL few marks).
    """
    if "\n" in words or len(words) > _DATA_LINE_CHARS:
        words = _DUMP_LINE.sub("", words)
    if len(words) <= _DATA_LINE_CHARS:
        return words
    lines = words.split("\n")
    kept = [line for line in lines if len(line) <= _DATA_LINE_CHARS or not _minified(line)]
    return words if len(kept) == len(lines) else "\n".join(kept)


def _minified(line: str) -> bool:
    return line.count(" ") * 50 <= len(line) and sum(map(line.count, '{}[]":,')) * 8 >= len(line)


def _dates(words: str, found: dict[str, None]) -> set[str]:
    """Add the dates written in words (``_DATE``) to ``found``; their words, which are no identifiers alone ("21st")."""
    dated: set[str] = set()
    for date in _DATE.findall(words) if _MONTH_MARK.search(words) else ():
        _add_new(found, date.rstrip("."))
        dated.update(part.strip(",.") for part in date.split())
    return dated


def _tokens(word: str) -> Sequence[str]:
    """``word`` trimmed of brackets and punctuation, when that matches ``_TOKEN``; else its pieces that do.

    Pieces are split at ``:``, ``=`` and ``|``: "code:QX42LM", "id=RZ8KPW", a table
    row "|QX42LM|2024-05-21|". None is a URL's (``_URL`` reads those) or longer
    than ``_MAX_TOKEN_CHARS``.
    """
    token = word.lstrip(_OPENERS).rstrip(_CLOSERS)
    if "://" in token:
        return ()
    if _TOKEN.fullmatch(token):
        return (token,) if len(token) <= _MAX_TOKEN_CHARS else ()
    pieces = [piece.lstrip(_OPENERS).rstrip(_CLOSERS) for piece in _ASCII_GLUE.split(word)]
    if len(pieces) == 1:
        return ()  # (the token itself, which matched nothing)
    return [p for p in pieces if len(p) <= _MAX_TOKEN_CHARS and "://" not in p and _TOKEN.fullmatch(p)]


_OPENERS = "([{<\"'`*#"  # ("#" too: "order #48213", "ticket #112-4455667")
_CLOSERS = ")]}>\"'`*.,;:!?"
_ASCII_GLUE = re.compile(r"[:=|]")
# Chinese, Japanese and Korean text is written without spaces: a run of its
# letters, or its full-width punctuation, parts the ids and paths around it
# ("预订号：QX42LM，日期2024-05-21"), except a run between path separators
# (a folder's name: "/home/用户/app.py") or joined to a file name ("模块_0.py",
# "设置.yaml"). So do the quotes of other languages («», „“, ‹›) and an
# emoji or a symbol written against an id ("📦ORD-5521", with its variation selector too).
CJK_LETTERS = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af"
"""Chinese, Japanese and Korean letters (a character class's inside), written without spaces."""
_NON_ASCII_GLUE = re.compile(
    rf"[\u3000-\u303f\uff00-\uffef«»‹›„“”‘’‚‛‟\u2600-\u27bf\U0001f000-\U0001faff\ufe0e\ufe0f\u20e3]"
    rf"|(?<![/\\_\-{CJK_LETTERS}])[{CJK_LETTERS}]+(?![/\\{CJK_LETTERS}]|[_\-][\w-]*\.[A-Za-z]|\.[A-Za-z])"
)


def names_in_code(text: str) -> list[str]:
    """The code names in ``text`` (camelCase, PascalCase with an inner capital, snake_case), in order, repeats too.

    Example:
        >>> names_in_code("call build_case_type on TOKEN_KIND_ANY, not Plain words")
        ['build_case_type', 'TOKEN_KIND_ANY']
    """
    return _code_names(text, text.encode("ascii").translate(_NAME_CLASSES) if text.isascii() else None)


def _code_names(text: str, shape: bytes | None) -> list[str]:
    """``names_in_code``, given ``text``'s ``_NAME_CLASSES`` (``None`` for text not ASCII)."""
    # Only a word with an underscore or a capital after a small letter or a
    # digit can hold one: found in C (``_words_holding``), or split in C with
    # most words let go by a test or two, and the pattern reads what is left.
    # (Not from inside a pasted blob: base64 is full of "camelCase"; a word
    # under 20 characters is never encoded.)
    if shape is not None:
        words = _words_holding(text, shape, b"_", b"aA")
    else:
        words = [w for w in text.split() if "_" in w or (not w.islower() and _INNER_CAPITAL.search(w))]
    readable = [w for w in words if len(w) < 20 or (len(w) <= _MAX_TOKEN_CHARS and not encoded(w))]
    return _CODE_NAME.findall(" ".join(readable)) if readable else []


_INNER_CAPITAL = re.compile(r"[a-z0-9][A-Z]")


# Base64, hex and hash runs: their character class keeps changing, which an id's does not.
_CLASS_CHANGE = re.compile(r"[a-z][A-Z0-9+/=]|[A-Z][0-9+/=]|[0-9][A-Za-z+/=]")
_HEX = re.compile(r"[0-9a-fA-F]{24,}")


def encoded(token: str) -> bool:
    """Whether ``token`` looks like encoded data (base64, hex, a hash, minified blobs), not an identifier.

    Example:
        >>> encoded("RZ8KPW"), encoded("iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJ"), encoded("deadbeef" * 4)
        (False, True, True)
    """
    if len(token) > 60:
        return True
    if len(token) < 20 or (is_path(token) and "/" in token):
        return False
    if _HEX.fullmatch(token) or len(_CLASS_CHANGE.findall(token)) * 4 >= len(token):
        return True
    # Base64 of binary data mixes cases and digits, with long runs (AAAA) that
    # change class rarely; a name mixes cases sparingly.
    letters = [c for c in token if c.isalpha()]
    upper = sum(1 for c in letters if c.isupper())
    mixed = 0 < upper < len(letters) and upper * 10 >= len(letters) * 3
    return len(token) >= 24 and mixed and any(c.isdigit() for c in token)


def _add_new(found: dict[str, None], value: str) -> None:
    if value:
        found.setdefault(clip(value, MAX_KEY_CHARS), None)


def is_path(value: str) -> bool:
    """Whether ``value`` looks like a file path or URL (not a slash command, not \"and/or\")."""
    last = value.rstrip("/").rsplit("/", 1)[-1]
    if SLASH_COMMAND.fullmatch(value):
        return False  # "/add", "/undo": a slash command, not a path worth keeping
    return value.startswith(("/", "~", "./", "../", "http")) or "." in last or value.count("/") >= 2


# Words too common to say what a task is about (and the library's own).
