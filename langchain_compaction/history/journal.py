"""Pure helpers of chat memory: a rewrite in progress, what a compaction commits, the archive counter.

Nothing here touches a store. ``Rewrite`` records a rewrite that was started
(the list it started from and the list it must leave), so any later call can
tell from the store alone whether it finished, and finish it keeping whatever
was appended meanwhile; it is also what the optional journal holds. ``Commit``
is what a finished compaction writes, worked out under the lock from the
snapshot it summarized and the store as it is now.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from langchain_core.messages import BaseMessage, SystemMessage, message_to_dict

from langchain_compaction._lc.convert import SUMMARY_MARK, is_compaction_message
from langchain_compaction._lc.identity import fingerprint, same_message, starts_with

JOURNAL_MARK = "langchain_compaction_journal"
"""Key in ``additional_kwargs`` of the journal's marker message."""

_JOURNAL_VERSION = 2

logger = logging.getLogger("langchain_compaction")
_SAID_SHARED: list[bool] = []
"""Whether this process said an archive looks shared by sessions (said once)."""


def _digest(messages: Sequence[BaseMessage], version: int = _JOURNAL_VERSION) -> str:
    digest = hashlib.sha256()
    for message in messages:
        if version >= 2:
            key = fingerprint(message)
        else:
            # Journals written by 0.1.0 digested each message's full dict.
            key = json.dumps(message_to_dict(message), sort_keys=True, ensure_ascii=False, default=str)
        digest.update(key.encode("utf-8"))
        digest.update(b"\x00")
    return digest.hexdigest()


def _common_prefix(messages: Sequence[BaseMessage], target: Sequence[BaseMessage]) -> int:
    count = 0
    for a, b in zip(messages, target):
        if not same_message(a, b):
            break
        count += 1
    return count


@dataclass(frozen=True, slots=True)
class Rewrite:
    """A rewrite that was started: the list it started from and its target.

    ``reconcile`` tells, from what the store holds now, what it must hold:
    the target plus anything appended after the rewrite began.
    """

    base_count: int
    base_digest: str
    target: tuple[BaseMessage, ...]
    version: int = _JOURNAL_VERSION
    session: str = ""
    """Whose rewrite it is (``Store.journal_session``; "" when a store names no session it could be told by)."""

    @classmethod
    def of(cls, base: Sequence[BaseMessage], target: Sequence[BaseMessage], session: str = "") -> Rewrite:
        """The rewrite of the store's ``base`` into ``target``."""
        return cls(len(base), _digest(base), tuple(target), session=session)

    def reconcile(self, current: Sequence[BaseMessage]) -> tuple[list[BaseMessage], bool]:
        """``(what the store must hold, whether it must be written)``."""
        n = self.base_count
        if len(current) >= n and _digest(current[:n], self.version) == self.base_digest:
            # The store was never cleared: the rewrite did not start.
            return [*self.target, *current[n:]], True
        done = _common_prefix(current, self.target)
        return [*self.target, *current[done:]], done < len(self.target)

    def marker(self) -> SystemMessage:
        """The journal's first message: what the rest of the journal is."""
        meta = {
            "version": self.version,
            "base_count": self.base_count,
            "base_fingerprint": self.base_digest,
            "count": len(self.target),
            "session": self.session,
        }
        return SystemMessage(content="langchain-compaction rewrite journal", additional_kwargs={JOURNAL_MARK: meta})

    @classmethod
    def from_journal(cls, messages: Sequence[BaseMessage]) -> Rewrite | None:
        """The pending rewrite a journal holds; ``None`` if empty or torn."""
        if not messages:
            return None
        meta = messages[0].additional_kwargs.get(JOURNAL_MARK)
        if not isinstance(meta, dict) or meta.get("count") != len(messages) - 1:
            # Torn while it was written: the store was not touched yet.
            return None
        version = int(meta.get("version", 1))
        session = str(meta.get("session") or "")
        return cls(int(meta["base_count"]), str(meta["base_fingerprint"]), tuple(messages[1:]), version, session)


@dataclass(frozen=True, slots=True)
class Commit:
    """What a finished compaction writes, worked out under the lock.

    Attributes:
        messages: The store's new content.
        summary_index: Where the summary is in it.
        originals: The caller's messages the summary replaced (for the archive).
        previous_total: The archive length an earlier summary recorded, if any.
    """

    messages: list[BaseMessage]
    summary_index: int
    originals: list[BaseMessage]
    previous_total: int | None

    @classmethod
    def build(
        cls, output: list[BaseMessage], snapshot: Sequence[BaseMessage], current: Sequence[BaseMessage]
    ) -> Commit | None:
        """The new list: the compacted snapshot (``output``), then whatever was appended since.

        Returns:
            ``None`` when the snapshot is no longer a prefix of the store (it
            was cleared, or compacted by another writer).
        """
        if not starts_with(current, snapshot):
            return None
        gone = _taken_out(output, snapshot)
        # What this library wrote (an earlier summary, its bridge) is replaced,
        # not archived: the archive holds the caller's originals only.
        originals = [m for m in gone if not is_compaction_message(m)]
        replaced = [m for m in gone if is_compaction_message(m)]
        known = [c for c in map(archive_counter, replaced) if c is not None]
        written = {id(m) for m in snapshot}
        return cls(
            messages=[*output, *current[len(snapshot) :]],
            summary_index=next(i for i, m in enumerate(output) if id(m) not in written),
            originals=originals,
            previous_total=max(known) if known else None,
        )

    def with_counter(self, total: int | None) -> list[BaseMessage]:
        """The messages, with the summary recording the archive's length ``total``."""
        if total is None:
            return self.messages
        summary = self.messages[self.summary_index]
        meta = {**(summary.additional_kwargs.get(SUMMARY_MARK) or {}), "archived": total}
        marked = summary.model_copy(update={"additional_kwargs": {**summary.additional_kwargs, SUMMARY_MARK: meta}})
        messages = list(self.messages)
        messages[self.summary_index] = marked
        return messages

    def already_archived(self, existing: int, memo: tuple[str, ...] | None) -> int:
        """How many of ``originals`` an earlier, failed attempt archived."""
        originals = self.originals
        if self.previous_total is not None:
            return max(0, min(existing - self.previous_total, len(originals)))
        if memo and len(memo) <= len(originals) and archive_memo(originals[: len(memo)]) == memo:
            return len(memo)
        return 0


def _taken_out(output: Sequence[BaseMessage], snapshot: Sequence[BaseMessage]) -> list[BaseMessage]:
    """The messages of ``snapshot`` that ``output`` (its compaction) no longer holds, in order.

    Told apart by object, as many times as each is held: one message object
    added twice (a constant "continue" turn) is two messages, and a copy the
    output keeps is the later one (the recent messages are what is kept).
    """
    left = Counter(map(id, output))
    gone = []
    for message in reversed(snapshot):
        if left[id(message)] > 0:
            left[id(message)] -= 1
        else:
            gone.append(message)
    gone.reverse()
    return gone


def archive_counter(message: BaseMessage) -> int | None:
    """The archive length a summary recorded after its compaction, if any."""
    meta = message.additional_kwargs.get(SUMMARY_MARK)
    value = meta.get("archived") if isinstance(meta, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def archived_tail(stored: Sequence[BaseMessage], originals: Sequence[BaseMessage], *, counted: int = 0) -> int:
    """How many of ``originals``, from the first, already end the archive ``stored`` (the most that do).

    A first compaction records no archive length to retry by: a process that
    died between its archive write and its rewrite left them there, and the
    next writer's compaction holds the same messages. An archive that grew
    since the last compaction is read too, not counted: the growth (``counted``
    messages, by length) may be another session's, which would be skipped.
    """
    most = min(len(stored), len(originals))
    tail = [fingerprint(m) for m in stored[len(stored) - most :]]
    head = [fingerprint(m) for m in originals[:most]]
    found = next((k for k in range(most, 0, -1) if tail[most - k :] == head[:k]), 0)
    if found < counted and not _SAID_SHARED:
        _SAID_SHARED.append(True)  # (once a process: each session's wrapper may hold its own archive object)
        logger.warning(
            "the archive holds messages this session did not write since its last compaction: it looks shared "
            "with another session, whose messages recall would return too; give each session an archive of its "
            "own (its originals are archived all the same)"
        )
    return found


def archive_memo(messages: Sequence[BaseMessage]) -> tuple[str, ...]:
    """What the process remembers of an archived batch (for a retry without a counter)."""
    return tuple(fingerprint(m) for m in messages)
