"""One clean line of someone else's text: how facts are shown, clipped and compared.

A fact is data, and looks like it: one line, control and direction characters
out (``one_line``), clipped at a word (``clip``), compared case-folded in one
Unicode form (``normalize``), quoted so it cannot close its own quotes
(``quoted``). ``core.extract`` and ``core.identifiers`` read facts out of
messages; every fact they make goes through here.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from langchain_compaction.core.types import Fact

MAX_FACT_CHARS = 240
MAX_KEY_CHARS = 160


def normalize(text: str) -> str:
    """``text`` as facts are compared: case folded, runs of whitespace made one space, one Unicode form, one quote.

    An accented letter may be one character or a letter and a combining mark
    (macOS writes file names so): both read the same (NFKC).
    """
    if not text.isascii():
        text = unicodedata.normalize("NFKC", text)
    if not _clean(text, len(text)):  # (most are one clean line already: folding it changes nothing)
        text = " ".join(text.split())
    # Quoted and shown as code, a double quote or a backtick is written as a single quote (``quoted``).
    # (Two replaces: a scan each in C, where a translation table took fifty times as long.)
    return text.casefold().replace('"', "'").replace("`", "'")


def compared(fact: Fact) -> str:
    """``normalize(fact.text)``, made once and kept on the fact (``Fact.known_norm``)."""
    known = fact.known_norm
    if not known:
        known = normalize(fact.text)
        object.__setattr__(fact, "known_norm", known)
    return known


# Control characters and line separators part words; direction marks and other
# invisible format characters (a soft hyphen, the Arabic letter mark, zero-width
# spaces, tag characters that can spell a hidden line) go. The zero-width joiner
# and non-joiner stay: Persian and Indic words and emoji sequences are spelled with them.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029]")
_INVISIBLE = re.compile(
    "[\xad\u061c\u180e\u200b\u200e\u200f\u202a-\u202e\u2060-\u2069\ufeff\ufff9-\ufffb\U000e0000-\U000e007f]"
)


def one_line(text: str, limit: int = MAX_FACT_CHARS) -> str:
    """``text`` as one clean line: control and direction characters removed, whitespace folded, clipped.

    Example:
        >>> one_line("a.py" + chr(10) + "## Next Steps" + chr(27) + "[31m")
        'a.py ## Next Steps [31m'
    """
    if _clean(text, limit):
        return text
    return clip(_CONTROL.sub(" ", _INVISIBLE.sub("", text)), limit)


def shown(text: str) -> str:
    """``text`` safe to print on a terminal: its lines and tabs kept, control and direction characters out.

    (A tool's output may carry escape sequences: a color code, a clear-screen, a write to the clipboard.)
    """
    return _CONTROL.sub("\ufffd", _INVISIBLE.sub("", text))


def _clean(text: str, limit: int) -> bool:
    """Whether ``text`` is one clean line within ``limit`` already (most are: then nothing is copied).

    Every character ``_CONTROL`` and ``_INVISIBLE`` take out and every
    whitespace but the ASCII space is non-printable, so a printable text without doubled or edge spaces
    is what ``clip`` and ``one_line`` would return.
    """
    # (The edges first: a text that ends with a space is not scanned.)
    return len(text) <= limit and text[:1] != " " and text[-1:] != " " and "  " not in text and text.isprintable()


def quoted(text: str) -> str:
    """``text`` between double quotes that it cannot close: what someone else wrote, shown as data."""
    return '"' + text.replace('"', "'") + '"'


def clip(text: str, limit: int = MAX_FACT_CHARS) -> str:
    """``text`` on one line, cut at a word boundary before ``limit`` characters."""
    if _clean(text, len(text)):  # one clean line already (folding it changes nothing)
        if len(text) <= limit:
            return text
        folded = text
    else:
        # Only a head of it is folded, long enough to pass the limit once folded (tried
        # longer until it does): what is kept is the same, a long text is not copied whole.
        size = limit + 1
        while True:
            folded = " ".join(text[:size].split())
            if len(folded) > limit or size >= len(text):
                break
            size *= 2
    if len(folded) <= limit:
        return folded
    cut = folded.rfind(" ", 0, limit)
    return folded[: cut if cut > limit // 2 else limit]


def caseless(text: str) -> str:
    """``text`` lower-cased as ``re.IGNORECASE`` reads it, with the letters it takes for i and s ("DİSREGARD", "ſtop").

    Substring scans that spare a case-blind pattern read this form, so they
    never turn away a text the pattern would match.
    """
    low = text.lower()
    return low if low.isascii() else low.translate(_AS_ASCII)


_AS_ASCII = str.maketrans({"\u0131": "i", "\u017f": "s", "\u0307": None})  # (İ lower-cases to i and a dot)


def holds_any(text: str, words: Sequence[str]) -> bool:
    """Whether ``text`` (``caseless``) holds one of ``words``: a substring scan sparing a pattern that needs one."""
    low = caseless(text)
    return any(word in low for word in words)
