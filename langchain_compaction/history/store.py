"""The store side of chat memory: each call checked, the locks, and a rewrite that survives a crash.

``Store`` is what ``CompactingChatMessageHistory`` stands on: every call to the
wrapped history (and to its journal) becomes a ``StoreError`` naming the store
and the operation when it fails; reads and writes hold the in-process lock and,
where needed, the cross-process one; and a rewrite is made with the strongest
method the store offers (``history.stores``), journaled where it has no atomic
one, so the next call (of any wrapper over the session) finishes a rewrite
that was interrupted, keeping whatever was appended meanwhile
(``history.journal``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.messages import BaseMessage

from langchain_compaction.core.bounded import Bounded
from langchain_compaction.core.effects import Call, Flow, twin
from langchain_compaction.errors import CompactionError, ConfigurationError, StoreError
from langchain_compaction.history import stores
from langchain_compaction.history.journal import Rewrite
from langchain_compaction.history.locks import CompactionLock
from langchain_compaction.history.session import SessionState, ahold, hold, still_held

logger = logging.getLogger("langchain_compaction")


def check_separate(
    inner: BaseChatMessageHistory, archive: BaseChatMessageHistory | None, journal: BaseChatMessageHistory | None
) -> None:
    """Refuse an archive or a journal that is the inner store, or a journal that is the archive.

    Each is written its own way: a rewrite replaces the inner store's messages
    and clears the journal, so an archive there loses the originals it keeps.
    Two histories are one when they are one object or stores of one session
    (``stores.session_key``: two ``FileChatMessageHistory`` on one path).

    Raises:
        ConfigurationError: Naming the history to replace.
    """
    earlier = {"the inner store": inner}
    for field, history in (("archive", archive), ("journal", journal)):
        if history is None:
            continue
        for name, other in earlier.items():
            if history is other or stores.session_key(history) == stores.session_key(other):
                why = "every rewrite clears the journal" if field == "journal" else "every rewrite replaces the store"
                raise ConfigurationError(field, history, f"pass a separate history, not {name} itself ({why})")
        earlier[f"the {field}"] = history
    if journal is not None:
        _one_session_a_journal(inner, journal)


_JOURNALS: Bounded[str] = Bounded(1024)
"""The session each journal met in this process was given for (by ``stores.session_key``)."""


def journal_session(inner: BaseChatMessageHistory) -> str:
    """The session ``inner`` holds, as a journal records it ("" for a store known only as an object)."""
    key = stores.session_key(inner)
    return "" if isinstance(key, tuple) and key[:1] == ("object",) else repr(key)


def _one_session_a_journal(inner: BaseChatMessageHistory, journal: BaseChatMessageHistory) -> None:
    """Refuse a journal another session of this process was given: each would finish the other's rewrite."""
    session, mine = journal_session(inner), journal_session(journal)
    if not session or not mine:
        return
    known = _JOURNALS.get(mine)
    if known is not None and known != session:
        raise ConfigurationError("journal", journal, _SHARED_JOURNAL)
    _JOURNALS.put(mine, session)


_LOSSY_JOURNAL = (
    "it does not give back what was written to it (a message's additional_kwargs, where the journal's marker is), "
    "so it could not finish a rewrite after a crash; nothing was rewritten: pass a history that keeps whole "
    "messages (FileChatMessageHistory, SQLChatMessageHistory)"
)
_SHARED_JOURNAL = (
    "it is the journal of another session: a rewrite interrupted in one would be finished in the other's history; "
    "give each session a journal of its own (e.g. a file or a session id named after the session)"
)


class Store:
    """The wrapped history, its journal and locks (see the module docstring)."""

    inner: BaseChatMessageHistory
    journal: BaseChatMessageHistory | None
    lock: CompactionLock | None
    _strategy: stores.Strategy
    _state: SessionState

    def _io(self, call: Call[Any], operation: str, store: BaseChatMessageHistory | None = None) -> Flow[Any]:
        """Make one store call; a failure becomes a ``StoreError`` naming the store and the operation."""
        try:
            return (yield call)
        except CompactionError:
            raise
        except Exception as exc:
            target = store or self.inner
            where, _, method = operation.rpartition(":")
            msg = (
                f"{type(target).__name__}.{method} failed ({where or 'store'}): {type(exc).__name__}: {exc}. "
                "No message was lost: a compaction leaves the store as it was or finishes the rewrite on the next call"
            )
            raise StoreError(msg, operation=operation) from exc

    def _write(self, call: Call[Any], operation: str, store: BaseChatMessageHistory | None = None) -> Flow[Any]:
        """Make one store write under the lock, if the lock is still held (``session.still_held``).

        A cross-process lock can be lost while held (its connection ends);
        another writer may then be in, between its read and its rewrite, and
        a write made now could be overwritten or overwrite its. Stopping here
        loses nothing: the writes made so far stand, and the journal (or the
        pending rewrite) lets the next call finish a rewrite left half done.
        """
        yield still_held(operation)
        return (yield from self._io(call, operation, store))

    @property
    def _may_be_torn(self) -> bool:
        # A journaled rewrite may be half done; so may one that an earlier
        # process, whatever its store class, left in the journal.
        return self._strategy == "journal" or self.journal is not None

    def _locked(self, flow: Flow[Any], *, write: bool) -> Call[Any]:
        """``flow`` under the in-process lock, and the cross-process one when needed."""
        locks: list[CompactionLock] = [self._state.lock]
        # Atomic rewrites never show a half-written store, so reads skip the
        # cross-process lock; the journaled rewrite does show one.
        if self.lock is not None and (write or self._may_be_torn):
            locks.append(self.lock)
        return twin(hold, ahold, locks, flow)

    def _repair_flow(self) -> Flow[bool]:
        repaired: bool = yield self._locked(self._repair(), write=True)
        return repaired

    def _repair(self) -> Flow[bool]:
        if not self._may_be_torn or (yield from self._load_pending()) is None:
            return False
        yield from self._repaired()
        if self._state.pending is not None:
            msg = "the interrupted compaction rewrite could not be finished; it stays pending"
            raise StoreError(msg, operation="repair")
        return True

    # -- the rewrite, journaled where the store has no atomic one ----------------------

    def _load_pending(self) -> Flow[Rewrite | None]:
        # A journal is the truth every process shares: another writer may have finished the rewrite this one
        # left (a lost lock lets it in) and gone on, and writing this one's target again would put it back.
        if self.journal is None:
            return self._state.pending
        entries = yield from self._io(stores.read(self.journal), "journal:read", self.journal)
        pending = Rewrite.from_journal(entries)
        if pending is not None and pending.session and pending.session != journal_session(self.inner):
            # (Another process's session shares it: left as it is, for that session to finish.)
            raise ConfigurationError("journal", self.journal, _SHARED_JOURNAL)
        return pending

    def _drop_pending(self) -> Flow[None]:
        self._state.pending = None
        if self.journal is None:
            return
        try:
            yield from self._write(stores.clear(self.journal), "journal:clear", self.journal)
        except StoreError as exc:
            # Harmless: the journal now describes a finished rewrite, and the
            # next read finds the store already holds its target.
            logger.warning("%s", exc)

    def _rewrite(self, current: Sequence[BaseMessage], target: Sequence[BaseMessage]) -> Flow[None]:
        self._state.counted.forget()
        if self._strategy != "journal":
            yield from self._write(stores.replace_all(self._strategy, self.inner, target), "rewrite")
            return
        pending = Rewrite.of(current, target, journal_session(self.inner))
        if self.journal is not None:
            yield from self._write(stores.clear(self.journal), "journal:clear", self.journal)
            entries = [pending.marker(), *target]
            yield from self._write(stores.append(self.journal, entries), "journal:add_messages", self.journal)
            # Read back before the store is touched: a journal that keeps a message's role and text only
            # loses the marker, and would read as torn after a crash (the rewrite's target lost with it).
            kept = yield from self._io(stores.read(self.journal), "journal:read", self.journal)
            if Rewrite.from_journal(kept) is None:
                raise ConfigurationError("journal", self.journal, _LOSSY_JOURNAL)
        self._state.pending = pending  # from here on the next call can finish it
        yield from self._write(stores.clear(self.inner), "clear")
        yield from self._write(stores.append(self.inner, target), "add_messages")
        yield from self._drop_pending()

    def _repaired(self) -> Flow[list[BaseMessage]]:
        """The store's messages, after finishing an interrupted rewrite."""
        pending = (yield from self._load_pending()) if self._may_be_torn else None
        current: list[BaseMessage] = yield from self._io(stores.read(self.inner, self._strategy), "read")
        if pending is None:
            return current
        target, write = pending.reconcile(current)
        try:
            if write:
                yield from self._rewrite(current, target)
            if not write or self._strategy != "journal":  # a journaled rewrite drops it itself
                yield from self._drop_pending()
        except StoreError as exc:
            # Still pending: report the full history, try again next call.
            logger.warning("could not finish an interrupted compaction rewrite yet: %s", exc)
        return target
