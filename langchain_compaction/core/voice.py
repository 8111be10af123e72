"""Whose words a user's message holds: their own voice, what they paste or pass on, a slash command.

``prose`` is the text without code blocks, listings and indented code;
``own_words`` is ``prose`` without quoted lines or a forwarded message: what
``core.extract`` reads the user's rules and revocations in, and
``core.identifiers`` their ids. A turn that starts with a slash command
(``command_line``) is the command alone. ``sentences`` splits a text where its
sentences and lines end.
"""

from __future__ import annotations

import re

from langchain_compaction.core.lines import holds_any

# Where a sentence ends: whitespace after a full stop, a question or an exclamation mark, right after
# Chinese and Japanese ones (written without a space), or a run of line breaks. Found from the mark
# (captured, and put back but for a line break): a pattern that opens with a set of characters is
# passed over the text in C from one mark to the next, where one that looked back from every space
# was tried at every position (five times slower).
_SENTENCE_END = re.compile(r"([.!?。！？\n])(?:(?<=[.!?])\s+|(?<=\n)\n*|(?<=[。！？]))")
# A fenced block to its closing fence or the end: of backticks, or of tildes
# opening a line (a "~~~" inside a sentence is no fence).
_FENCED = re.compile(r"```.*?(?:```|\Z)|^[ \t]{0,3}~~~.*?(?:^[ \t]{0,3}~~~|\Z)", re.DOTALL | re.MULTILINE)
# Space within a line: a line-anchored pattern that let ``\s`` cross line breaks
# would rescan a run of blank lines from each of them (quadratic on a pasted
# sheet of empty rows).
_SPACE = r"[^\S\n]"
# Pasted material rather than the user's words: a numbered listing ("1535: ..."),
# an indented code line (not a nested bullet), a file viewer's banner.
_LISTING_LINE = (
    rf"(?:{_SPACE}*\d+[:|]|(?:    |\t)(?!{_SPACE}*(?:[-*+]|\d+[.)])\s)"
    rf"|{_SPACE}*[\[(](?:File|Open file|Current directory)\b).*"
)
_LISTING = re.compile(_LISTING_LINE)
# Such a line after a line break. (A pattern that opens with the break is
# passed over the text in C from one break to the next; one anchored at every
# line's start was tried at every position.)
_LISTED = re.compile(rf"\n{_LISTING_LINE}")
# Someone else's words the user passes on: quoted lines, and everything after a
# forwarded message's header.
_QUOTED = re.compile(rf"^{_SPACE}*>.*$", re.MULTILINE)
_FORWARDED = re.compile(
    rf"^{_SPACE}*(?:-{{2,}}{_SPACE}*(?:Original Message|Forwarded message){_SPACE}*-{{2,}}|Begin forwarded message:"
    rf"|[*_]{{0,2}}From:[*_]{{0,2}}{_SPACE}+\S.*$)",  # (a header pasted in bold too: **From:** Bob)
    re.MULTILINE | re.IGNORECASE,
)


def prose(text: str) -> str:
    """The user's words and what they paste inline: code blocks, listings and indented code removed."""
    # (A fence is three backticks or tildes: most messages hold none, and a substring scan says so.)
    if "```" in text or "~~~" in text:
        text = _FENCED.sub(" ", text)
    first = _LISTING.match(text)
    if first is not None:
        text = text[first.end() :]
    return _LISTED.sub("\n", text) if "\n" in text else text


def sentences(text: str) -> list[str]:
    """``text`` split where a sentence or a line ends, each piece with its closing mark, unstripped.

    Example:
        >>> sentences("Fix it. Then run the tests!" + chr(10) + "Thanks")
        ['Fix it.', 'Then run the tests!', 'Thanks']
    """
    pieces = _SENTENCE_END.split(text)  # (the text between ends, and each end's mark)
    out = pieces[::2]
    for index, mark in enumerate(pieces[1::2]):
        if mark != "\n":
            out[index] += mark
    return out


# A slash command ("/add src/a.py"): what follows it in the same turn is the
# harness's answer, not the user's words.
SLASH_COMMAND = re.compile(r"/[A-Za-z][\w-]*")
"""A slash command's word ("/add", "/undo")."""
_COMMAND_START = re.compile(r"\s*/")  # (a turn whose first word opens with no slash is no command)


def command_line(text: str) -> str:
    """The slash command a turn starts with ("/add src/a.py"), when the turn is one; else ``""``.

    Example:
        >>> command_line("/undo" + chr(10) + "Removed: 52b4acb fix: legend"), command_line("/path/to/a.py is broken")
        ('/undo', '')
    """
    start = _COMMAND_START.match(text)
    if start is None:
        return ""  # (most turns: read no further than their first word)
    first = text[start.end() - 1 :].split("\n", 1)[0].strip()
    return first if SLASH_COMMAND.fullmatch(first.split(" ", 1)[0]) else ""


def own_words(text: str) -> str:
    """Only what the user says in their own voice: ``prose`` without quoted lines or a forwarded message.

    A turn that starts with a slash command is the command alone: what follows
    it is the harness's output.
    """
    return prose_and_own_words(text)[1]


def prose_and_own_words(text: str) -> tuple[str, str]:
    """``prose`` of ``text`` (of its slash command alone, when it starts with one) and ``own_words``, read once."""
    command = command_line(text)
    if command:
        return prose(command), command
    words = prose(text)
    # (A forwarded header says "from" or "message", in any case.)
    forwarded = _FORWARDED.search(words) if holds_any(words, ("from", "message")) else None
    own = words[: forwarded.start()] if forwarded is not None else words
    return words, _QUOTED.sub("", own) if ">" in own else own
