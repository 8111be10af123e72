"""Reading compacted messages back: by keyword, by id or by position, newest first.

Both ways back to what a compaction removed use this one rule: the recall
tool over a LangGraph store's archive (``_lc.archive``) and chat memory's
``archive=`` history. A store ignores a text query unless it has a vector
index, and compares filter values as text, so matching and ordering happen
here, over a thread's items, by the position each was archived with (its
ordinal in the whole conversation).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from langchain_compaction.core.lines import normalize
from langchain_compaction.core.redact import Redactor, apply_redactor
from langchain_compaction.core.transcript import message_body, role_label
from langchain_compaction.core.types import Message

MAX_RESULTS = 50
"""The most messages one look-up returns."""


@dataclass(frozen=True, slots=True)
class Archived:
    """One compacted message as an archive holds it.

    Attributes:
        position: Its ordinal in the whole conversation (0 for the first message).
        key: Its id in the archive (the message id, or a key derived from it).
        message: The message, in core form.
    """

    position: int
    key: str
    message: Message


@dataclass(frozen=True, slots=True)
class Lookup:
    """What to read back. Criteria combine; none given means the newest messages.

    Attributes:
        query: Words that must all occur in a message (case, spacing and
            the punctuation around a word ignored); those where each occurs
            as a whole word come first.
        ids: Message ids (or archive keys) to read.
        start: The first position to read.
        end: The last position to read (inclusive).
        limit: The most messages to return.
    """

    query: str = ""
    ids: tuple[str, ...] = ()
    start: int | None = None
    end: int | None = None
    limit: int = 10

    def words(self) -> list[str]:
        """The query's words, folded as messages are, without the punctuation around them ("code:", "(RZ8KPW)?")."""
        return [w for w in (word.strip(_EDGES) for word in normalize(self.query).split()) if w]

    def within(self, item: Archived) -> bool:
        """Whether ``item`` meets every criterion but the query (its id and position)."""
        if self.ids and item.key not in self.ids and (item.message.id or "") not in self.ids:
            return False
        if self.start is not None and item.position < self.start:
            return False
        return self.end is None or item.position <= self.end


# What a model writes around the words it asks for: a question mark, a colon, brackets, quotes.
_EDGES = ".,;:!?()[]{}<>'\"`*"


def _searched(item: Archived) -> str:
    """What a query is looked for in: the message's role and body, folded as queries are."""
    return normalize(f"{role_label(item.message)} {message_body(item.message)}")


def select(items: Iterable[Archived], lookup: Lookup) -> list[Archived]:
    """The items ``lookup`` asks for, newest (highest position) first, at most ``lookup.limit``.

    Example:
        >>> from langchain_compaction.core.types import Part
        >>> said = [Archived(i, f"m{i}", Message("user", (Part("text", t),), id=f"m{i}"))
        ...         for i, t in enumerate(["Book RZ8KPW", "thanks", "RZ8KPW is confirmed"])]
        >>> [a.position for a in select(said, Lookup(query="rz8kpw"))]
        [2, 0]
    """
    limit = max(1, min(lookup.limit, MAX_RESULTS))
    words = lookup.words()
    found: list[tuple[Archived, str]] = []
    for item in items:
        if lookup.within(item):
            text = _searched(item) if words else ""  # (folded once a message, whatever the query's length)
            if all(word in text for word in words):
                found.append((item, text))
    found.sort(key=lambda pair: pair[0].position, reverse=True)
    if words:
        # Whole-word matches first ("T-1" before the newer "T-10" ... "T-19"), each newest first: also
        # when they would all be returned, since the rendering may leave the last out for size. A match
        # of parts of words ("book" in "booking") is still a match, ranked after every whole-word one.
        whole = [re.compile(rf"(?<!\w){re.escape(word)}(?!\w)") for word in words]
        found.sort(key=lambda pair: not all(pattern.search(pair[1]) for pattern in whole))
    return [item for item, _ in found[:limit]]


_LEFT_OUT = "... {} more match(es) left out for size; narrow the look-up."
_LEFT_OUT_ROOM = len("\n\n" + _LEFT_OUT.format(10**6))


def render(found: Sequence[Archived], *, max_chars: int, redactor: Redactor | None = None) -> str:
    """``found`` as text for a model, within ``max_chars``, each message headed by its position, role and id.

    A message longer than what is left is cut (the cut says so); what does
    not fit at all is counted at the end, so the caller can narrow the look-up.
    """
    if not found:
        return "No archived message matches. Try other words, an id, or a position range."
    pieces: list[str] = []
    used = 0
    for shown, item in enumerate(found):
        body = message_body(item.message)
        if redactor is not None:
            body = apply_redactor(redactor, body)
        head = f"[#{item.position} {role_label(item.message)} id={item.key}]"
        # (Room is kept for the line that counts what is left out, when more follow.)
        room = max_chars - used - len(head) - 1 - (_LEFT_OUT_ROOM if shown + 1 < len(found) else 0)
        if room < 40:
            pieces.append(_LEFT_OUT.format(len(found) - shown))
            break
        if len(body) > room:
            body = body[: room - 30] + " ... [cut for size]"
        piece = f"{head}\n{body}"
        pieces.append(piece)
        used += len(piece) + 2
    return "\n\n".join(pieces)
