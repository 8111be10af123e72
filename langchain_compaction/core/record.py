"""The conversation record: where a conversation stands, read from its summary's mark.

A summary message carries a mark (``additional_kwargs["langchain_compaction"]``)
and that mark is the one record of what compaction did to the conversation.
It lives in the state, so the checkpointer versions it: a fork, a restart or
another worker reads the record of the very checkpoint it runs on, and
anything a process keeps in memory is only a cache checked against it.

The record's own keys (features add theirs: checked facts keep ``facts``):

- ``last_message_id``: the conversation's last message when the summary was
  committed (a reply before it carries the old, larger usage; ``core.context``);
- ``kept_from``: the first message kept after the summary (what it covers ends
  there), and ``kept_before`` / ``kept_positions``: the messages from before
  the cut written back after it (pinned ones, those before a provider block);
- ``position``: the ordinal in the whole conversation of the first message
  kept, so every message has a stable number without reading any store;
- ``compaction``: how many compactions this timeline has had, this one
  included, numbered as they were committed (1, 2, 3; preparations aside);
- ``namespace``: which graph of the thread holds the conversation (empty at
  the top; a sub-agent's own history is its own conversation);
- ``lineage``: the id of every compaction of this timeline, oldest first. A
  compaction's id is a digest of the previous one and of what it removed, so
  the same compaction retried (a crash, a second worker) gets the same id, and
  two branches of a fork that compact differently get different ones.

``stamp`` writes these when a compaction is committed, from the conversation as
it is then (a summary prepared in the background earlier is stamped when it is
applied, not when it was made).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_compaction.core.types import Message

ANCHOR_KEY = "last_message_id"
KEPT_FROM_KEY = "kept_from"
KEPT_BEFORE_KEY = "kept_before"
KEPT_POSITIONS_KEY = "kept_positions"
POSITION_KEY = "position"
NUMBER_KEY = "compaction"
LINEAGE_KEY = "lineage"
NAMESPACE_KEY = "namespace"
KEPT_NOTHING_KEY = "kept_nothing"
"""Written ``True`` when a compaction kept no message after what it covers: it covers all it was written after."""


def written_here(message: Message) -> bool:
    """Whether ``message`` was written by this library (a summary or its bridge), so it has no position."""
    return message.is_summary and message.label != "langchain summary"


@dataclass(frozen=True, slots=True)
class Numbering:
    """Each message's ordinal in the whole conversation, and the record it was read from.

    Attributes:
        positions: One per message; ``None`` for what this library wrote.
        following: The position the next message would get.
        number: How many compactions this timeline has had.
        lineage: Their ids, oldest first (empty for a record written by 0.2).
    """

    positions: tuple[int | None, ...]
    following: int
    number: int
    lineage: tuple[str, ...]


def _ints(value: object) -> list[int]:
    return [p for p in value if isinstance(p, int) and not isinstance(p, bool)] if isinstance(value, list) else []


def _carried(mark: Mapping[str, Any]) -> dict[str, int]:
    """The positions a summary recorded for the messages from before its cut it wrote back, by id.

    By id, not in order: a summary written before the leading system
    messages were left out of ``kept_before`` recorded theirs too, and the
    first message after it took the system prompt's position.
    """
    ids = [i for i in mark.get(KEPT_BEFORE_KEY) or () if isinstance(i, str)]
    found = _ints(mark.get(KEPT_POSITIONS_KEY))
    return dict(zip(ids, found, strict=True)) if len(ids) == len(found) else {}


def numbering(messages: Sequence[Message]) -> Numbering:
    """Number ``messages`` from the record their newest summary carries.

    A summary's mark records the position of the first message it kept, so the
    count resumes there; what it kept from before its cut gets the positions
    it recorded; leading system messages before it keep theirs.
    """
    positions: list[int | None] = []
    counter = number = 0
    lineage: tuple[str, ...] = ()
    carried: dict[str, int] = {}
    for message in messages:
        if written_here(message):
            mark = message.mark
            position = mark.get(POSITION_KEY)
            if isinstance(position, int) and position >= counter:
                counter = position
                carried = _carried(mark)
                ids = mark.get(LINEAGE_KEY)
                lineage = tuple(i for i in ids if isinstance(i, str)) if isinstance(ids, list) else lineage
            found = mark.get(NUMBER_KEY)
            if isinstance(found, int):
                number = max(number, found)
            positions.append(None)
        elif message.id in carried:
            positions.append(carried.pop(message.id))
        else:
            positions.append(counter)
            counter += 1
    return Numbering(tuple(positions), counter, number, lineage)


def compaction_id(previous: str | None, removed: Sequence[tuple[int, Message]]) -> str:
    """The id of a compaction: a digest of the previous one's and of what it removes (position, id, text)."""
    pieces = [previous or ""]
    for position, message in removed:
        pieces += (f"\x00{position}\x00{message.id}\x00{message.role}\x00", message.text)
    # (One encoding of the whole: a digest fed in pieces is the digest of their concatenation.)
    return hashlib.blake2b("".join(pieces).encode("utf-8", "surrogatepass"), digest_size=6).hexdigest()


def _retried(
    previous: str | None,
    before: Sequence[Message],
    positions: Sequence[int | None],
    removed: Sequence[int],
    retry: tuple[str, int] | None,
) -> str | None:
    """The id of the try ``retry`` names, when this compaction takes out what it took out first (else ``None``)."""
    if retry is None or not 0 < retry[1] <= len(removed):
        return None
    sid, count = retry
    first = [(p, before[i]) for i in removed[:count] if (p := positions[i]) is not None]
    return sid if compaction_id(previous, first) == sid else None


def stamp(
    before: Sequence[Message],
    kept: Sequence[int],
    removed: Sequence[int],
    mark: Mapping[str, Any],
    namespace: Sequence[str] = (),
    *,
    retry: tuple[str, int] | None = None,
) -> dict[str, Any]:
    """The mark of a summary committed now: ``mark`` with the record's keys written from ``before``.

    Args:
        before: The conversation the compaction is committed to.
        kept: Indices (into ``before``) of the messages the output keeps.
        removed: Indices of the messages it takes out (or clears), in order.
        mark: The summary's mark as the compaction wrote it (``kept_from``,
            ``kept_before`` and the features' keys).
        namespace: Which graph of the thread holds the conversation.
        retry: An earlier try that did not finish (its summary failed, or the
            run was cancelled), after its archive was written: its id and how
            many messages it took out (``len(removed)``). A compaction that takes out the
            same messages and more, on the same record, keeps that id, so what
            the try archived is not archived again under another.

    Returns:
        The mark to write.
    """
    seen = numbering(before)
    positions = seen.positions
    by_id = {before[i].id: positions[i] for i in kept if before[i].id is not None}
    kept_from = mark.get(KEPT_FROM_KEY)
    position = by_id.get(kept_from) if isinstance(kept_from, str) else None
    kept_before = [i for i in mark.get(KEPT_BEFORE_KEY) or () if isinstance(i, str)]
    gone = [(p, before[i]) for i in removed if (p := positions[i]) is not None]
    previous = seen.lineage[-1] if seen.lineage else (str(seen.number) if seen.number else None)
    sid = compaction_id(previous, gone)
    out = dict(mark)
    out.update(
        {
            ANCHOR_KEY: before[-1].id if before and before[-1].id else None,
            POSITION_KEY: position if position is not None else seen.following,
            NUMBER_KEY: seen.number + 1,
            LINEAGE_KEY: [*seen.lineage, _retried(previous, before, positions, removed, retry) or sid],
            KEPT_POSITIONS_KEY: [p for i in kept_before if (p := by_id.get(i)) is not None],
            NAMESPACE_KEY: list(namespace),
        }
    )
    if out[ANCHOR_KEY] is None:
        del out[ANCHOR_KEY]
    # (Said outright: a missing kept_from is also a summary of 0.1, or a kept message without an id.)
    last = max(removed, default=-1)
    if not any(i > last for i in kept):
        out[KEPT_NOTHING_KEY] = True
    return out
