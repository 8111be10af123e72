"""Compacting chat memory: a ``BaseChatMessageHistory`` that wraps another one.

``CompactingChatMessageHistory(inner, model, options)`` reads and appends
through ``inner`` and, when ``over_threshold`` says the history no longer fits
``options.context_window - options.reserve_tokens``, replaces the older part
with a summary (the same ``prepare`` / ``run_flow`` / ``finish`` as
``compact``). Afterwards ``inner`` holds the leading system messages, the
summary, the bridge user turn when the recent messages do not start with one
(``CompactionOptions.ensure_user_turn``), and the recent messages, in order,
with their ids; the next compaction updates that summary instead of nesting it
and replaces the bridge.

Nothing is lost:

1. The summary is made from a snapshot before anything is written. If the
   model fails, times out or returns nothing, ``inner`` is untouched and a
   ``CompactionError`` surfaces (with ``on_error="warn"`` it is logged, the
   history keeps growing, and the next add tries again).
2. Under the lock, the store is re-read; messages appended since the snapshot
   are kept after the recent ones. If the snapshot is no longer a prefix of
   the store (it was cleared, or compacted by another process), the summary is
   discarded and nothing changes.
3. ``archive`` (optional) receives every compacted original before it leaves
   the store, exactly once (see below); never a summary or a bridge, which
   this library wrote.
4. The store is rewritten with the strongest method it offers:

   - ``InMemoryChatMessageHistory``: one list assignment; readers see the old
     list or the new one.
   - ``FileChatMessageHistory``: the new JSON goes to a temp file beside it,
     is fsynced, then ``os.replace``-d over it: a crash leaves the old file or
     the new one.
   - ``SQLChatMessageHistory`` (sync or async engine): DELETE and INSERTs in
     one SQLAlchemy transaction: the old rows or the new ones.
   - ``PostgresChatMessageHistory`` (sync or async connection): DELETE and
     INSERTs in one psycopg transaction: the old rows or the new ones.
   - Any other store, or a subclass of those above that overrides their read
     or write methods: ``clear()`` then ``add_messages()``, journaled. If a
     write fails, the pending list is kept in the process and the next call
     (any method) finishes the rewrite, keeping messages appended meanwhile.
     To survive a process crash between the clear and the add, pass
     ``journal=`` (a history on durable storage, e.g. the same store under
     another session id): the rewrite is written there first and the next
     wrapper to open the session finishes it. Without a journal such a crash
     loses the history of that session.

   The archive counter: each summary records how long the archive was after
   its compaction, so a retry after a failed rewrite (or a crash) skips the
   originals already archived. Only the first compaction of a session has no
   counter to go by; a failed rewrite there is still archived once (the
   process remembers), but a process crash between its archive write and its
   rewrite archives that first batch again on retry. The archive must be a
   history dedicated to this session and written only by this wrapper.

Concurrency: every wrapper over the same session in one process shares an
in-process lock (threads and asyncio tasks). Writers in several processes
need a cross-process ``lock=`` (``FileLock`` or ``PostgresAdvisoryLock``);
writers that bypass the wrapper can race the rewrite. Only one compaction
per session runs at a time in a process; the model is called without any
lock held, so writers are blocked only for the re-read and the rewrite.

Upstream deprecates ``BaseChatMessageHistory`` in favour of LangGraph
persistence (subclasses do not warn, and neither does this class). For a new
LangGraph application prefer the LangGraph compaction node; use this wrapper
where a chat-history store is already the memory.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import sys
import threading
import uuid
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Hashable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, TypeVar

from langchain_core.chat_history import BaseChatMessageHistory, InMemoryChatMessageHistory
from langchain_core.messages import BaseMessage, SystemMessage, message_to_dict, messages_to_dict

from langchain_compaction.adapters._convert import SUMMARY_MARK, is_compaction_message
from langchain_compaction.adapters.locks import CompactionLock, InProcessLock
from langchain_compaction.adapters.messages import Prepared, finish, over_threshold, prepare
from langchain_compaction.core.engine import arun_flow, run_flow
from langchain_compaction.core.options import CompactionOptions
from langchain_compaction.core.result import CompactionResult
from langchain_compaction.errors import CompactionError, ConfigurationError, StoreError
from langchain_compaction.summarizers.chat_model import as_summarizer

__all__ = ["JOURNAL_MARK", "CompactingChatMessageHistory", "OnError"]

logger = logging.getLogger("langchain_compaction")

OnError = Literal["raise", "warn"]
"""What an automatic compaction does when it fails: raise, or log and go on."""

JOURNAL_MARK = "langchain_compaction_journal"
"""Key in ``additional_kwargs`` of the journal's marker message."""

_T = TypeVar("_T")
Strategy = Literal["memory", "file", "sql", "postgres", "journal"]

# Methods whose stock behaviour the atomic rewrites reproduce; a subclass that
# overrides any of them may do more (caching, side effects), so it gets the
# journaled path that calls its own methods.
_STORE_METHODS = (
    "messages",
    "get_messages",
    "aget_messages",
    "add_message",
    "aadd_message",
    "add_messages",
    "aadd_messages",
    "clear",
    "aclear",
)
_STOCK: dict[Strategy, tuple[str, str]] = {
    "file": ("langchain_community.chat_message_histories.file", "FileChatMessageHistory"),
    "sql": ("langchain_community.chat_message_histories.sql", "SQLChatMessageHistory"),
    "postgres": ("langchain_postgres.chat_message_histories", "PostgresChatMessageHistory"),
}


# ---------------------------------------------------------------------------
# Pure helpers
# ---------------------------------------------------------------------------


def _key(message: BaseMessage) -> str:
    """A message's identity across a store round trip."""
    return json.dumps(message_to_dict(message), sort_keys=True, ensure_ascii=False, default=str)


def _fingerprint(messages: Sequence[BaseMessage]) -> str:
    digest = hashlib.sha256()
    for message in messages:
        digest.update(_key(message).encode("utf-8"))
        digest.update(b"\x00")
    return digest.hexdigest()


def _starts_with(messages: Sequence[BaseMessage], prefix: Sequence[BaseMessage]) -> bool:
    if len(messages) < len(prefix):
        return False
    return all(a is b or _key(a) == _key(b) for a, b in zip(messages, prefix))


def _common_prefix(messages: Sequence[BaseMessage], target: Sequence[BaseMessage]) -> int:
    count = 0
    for a, b in zip(messages, target):
        if a is not b and _key(a) != _key(b):
            break
        count += 1
    return count


@dataclass(frozen=True, slots=True)
class _Pending:
    """A rewrite that was started: the list it started from and its target.

    ``reconcile`` tells, from what the store holds now, what it must hold:
    the target plus anything appended after the rewrite began.
    """

    base_count: int
    base_fingerprint: str
    target: tuple[BaseMessage, ...]

    @classmethod
    def of(cls, base: Sequence[BaseMessage], target: Sequence[BaseMessage]) -> _Pending:
        return cls(len(base), _fingerprint(base), tuple(target))

    def reconcile(self, current: Sequence[BaseMessage]) -> tuple[list[BaseMessage], bool]:
        """``(what the store must hold, whether it must be written)``."""
        n = self.base_count
        if len(current) >= n and _fingerprint(current[:n]) == self.base_fingerprint:
            # The store was never cleared: the rewrite did not start.
            return [*self.target, *current[n:]], True
        done = _common_prefix(current, self.target)
        rest = list(current[done:])
        return [*self.target, *rest], done < len(self.target)

    def marker(self) -> SystemMessage:
        """The journal's first message: what the rest of the journal is."""
        return SystemMessage(
            content="langchain-compaction rewrite journal",
            additional_kwargs={
                JOURNAL_MARK: {
                    "version": 1,
                    "base_count": self.base_count,
                    "base_fingerprint": self.base_fingerprint,
                    "count": len(self.target),
                }
            },
        )

    @classmethod
    def from_journal(cls, messages: Sequence[BaseMessage]) -> _Pending | None:
        """The pending rewrite a journal holds; ``None`` if empty or torn."""
        if not messages:
            return None
        meta = messages[0].additional_kwargs.get(JOURNAL_MARK)
        if not isinstance(meta, dict) or meta.get("count") != len(messages) - 1:
            # Torn while it was written: the store was not touched yet.
            return None
        return cls(int(meta["base_count"]), str(meta["base_fingerprint"]), tuple(messages[1:]))


@dataclass(frozen=True, slots=True)
class _Commit:
    """What a finished compaction writes, worked out under the lock."""

    messages: list[BaseMessage]
    summary_index: int
    originals: list[BaseMessage]
    previous_total: int | None


def _archive_counter(message: BaseMessage) -> int | None:
    meta = message.additional_kwargs.get(SUMMARY_MARK)
    value = meta.get("archived") if isinstance(meta, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _build_commit(
    prepared: Prepared, output: list[BaseMessage], snapshot: Sequence[BaseMessage], current: Sequence[BaseMessage]
) -> _Commit | None:
    """The new list: the compacted snapshot, then whatever was appended since."""
    if not _starts_with(current, snapshot):
        return None
    plan = prepared.plan
    # What this library wrote (an earlier summary, its bridge) is replaced,
    # not archived: the archive holds the caller's originals only.
    originals = [snapshot[i] for i in range(plan.start, plan.cut) if not is_compaction_message(snapshot[i])]
    counters = [_archive_counter(snapshot[i]) for i in plan.previous_summaries]
    known = [c for c in counters if c is not None]
    return _Commit(
        messages=[*output, *current[len(snapshot) :]],
        summary_index=len(plan.keep_head),
        originals=originals,
        previous_total=max(known) if known else None,
    )


def _with_counter(commit: _Commit, total: int | None) -> list[BaseMessage]:
    if total is None:
        return commit.messages
    summary = commit.messages[commit.summary_index]
    meta = dict(summary.additional_kwargs.get(SUMMARY_MARK) or {})
    meta["archived"] = total
    marked = summary.model_copy(update={"additional_kwargs": {**summary.additional_kwargs, SUMMARY_MARK: meta}})
    messages = list(commit.messages)
    messages[commit.summary_index] = marked
    return messages


def _already_archived(commit: _Commit, existing: int, memo: tuple[str, ...] | None) -> int:
    """How many of ``commit.originals`` an earlier, failed attempt archived."""
    originals = commit.originals
    if commit.previous_total is not None:
        return max(0, min(existing - commit.previous_total, len(originals)))
    if memo and len(memo) <= len(originals) and tuple(_key(m) for m in originals[: len(memo)]) == memo:
        return len(memo)
    return 0


# ---------------------------------------------------------------------------
# Store detection and per-session state
# ---------------------------------------------------------------------------


def _stock_class(module: str, name: str) -> type | None:
    loaded = sys.modules.get(module)  # not imported means inner cannot be one
    cls = getattr(loaded, name, None) if loaded is not None else None
    return cls if isinstance(cls, type) else None


def _is_stock(inner: BaseChatMessageHistory, cls: type | None) -> bool:
    if cls is None or not isinstance(inner, cls):
        return False
    for klass in type(inner).__mro__:
        if klass is cls:
            return True
        if any(name in vars(klass) for name in _STORE_METHODS):
            return False
    return False  # pragma: no cover - cls is in the MRO


def _strategy(inner: BaseChatMessageHistory) -> Strategy:
    if _is_stock(inner, InMemoryChatMessageHistory):
        return "memory"
    for name, (module, cls_name) in _STOCK.items():
        if _is_stock(inner, _stock_class(module, cls_name)):
            if name == "postgres" and not all(
                hasattr(inner, a) for a in ("_connection", "_aconnection", "_session_id", "_table_name")
            ):
                break  # an unknown langchain-postgres layout: fall back to the journal
            return name
    return "journal"


def _session_key(inner: BaseChatMessageHistory) -> Hashable:
    """Wrappers whose keys are equal share one in-process lock and journal."""
    path = getattr(inner, "file_path", None)
    if path is not None:
        return ("file", str(Path(path).resolve()))
    session = getattr(inner, "session_id", None) or getattr(inner, "_session_id", None)
    if isinstance(session, (str, int, uuid.UUID)):
        table = getattr(inner, "_table_name", None) or getattr(
            getattr(inner, "sql_model_class", None), "__tablename__", ""
        )
        engine = getattr(inner, "engine", None) or getattr(inner, "async_engine", None)
        where = str(getattr(engine, "url", "")) if engine is not None else ""
        connection = getattr(inner, "_connection", None) or getattr(inner, "_aconnection", None)
        if connection is not None:
            where = str(getattr(getattr(connection, "info", None), "dsn", ""))
        return (type(inner).__qualname__, str(session), str(table), where)
    return ("object", id(inner))


class _SessionState:
    """What every wrapper over one session in this process shares."""

    def __init__(self) -> None:
        self.lock = InProcessLock()
        # One compaction at a time; a plain Lock so an async task may poll it.
        self.flight = threading.Lock()
        self.pending: _Pending | None = None
        self.archive_memo: tuple[str, ...] | None = None


_SESSIONS: weakref.WeakValueDictionary[Hashable, _SessionState] = weakref.WeakValueDictionary()
_SESSIONS_GUARD = threading.Lock()


def _session_state(inner: BaseChatMessageHistory) -> _SessionState:
    key = _session_key(inner)
    with _SESSIONS_GUARD:
        state = _SESSIONS.get(key)
        if state is None:
            state = _SESSIONS[key] = _SessionState()
        return state


# ---------------------------------------------------------------------------
# Atomic rewrites of the stores we know
# ---------------------------------------------------------------------------


def _file_replace(store: Any, messages: Sequence[BaseMessage]) -> None:
    path = Path(store.file_path)
    data = json.dumps(messages_to_dict(list(messages)), ensure_ascii=store.ensure_ascii)
    temp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:
        with open(temp, "w", encoding=store.encoding) as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)  # atomic on POSIX and Windows
    finally:
        temp.unlink(missing_ok=True)
    try:
        directory = os.open(path.parent, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(directory)  # make the rename itself durable
    finally:
        os.close(directory)


def _sql_rows(store: Any, messages: Sequence[BaseMessage]) -> list[Any]:
    return [store.converter.to_sql_model(m, store.session_id) for m in messages]


def _sql_rewrite(store: Any, messages: Sequence[BaseMessage]) -> None:
    from sqlalchemy import delete

    model = store.sql_model_class
    column = getattr(model, store.session_id_field_name)
    rows = _sql_rows(store, messages)
    with store.session_maker() as session, session.begin():
        session.execute(delete(model).where(column == store.session_id))
        session.add_all(rows)


async def _sql_arewrite(store: Any, messages: Sequence[BaseMessage]) -> None:
    from sqlalchemy import delete

    model = store.sql_model_class
    column = getattr(model, store.session_id_field_name)
    rows = _sql_rows(store, messages)
    async with store.session_maker() as session, session.begin():
        await session.execute(delete(model).where(column == store.session_id))
        session.add_all(rows)


def _pg_statements(store: Any, messages: Sequence[BaseMessage]) -> tuple[Any, Any, list[tuple[str, str]]]:
    from psycopg import sql

    table = sql.Identifier(store._table_name)
    delete = sql.SQL("DELETE FROM {} WHERE session_id = %s").format(table)
    insert = sql.SQL("INSERT INTO {} (session_id, message) VALUES (%s, %s)").format(table)
    values = [(str(store._session_id), json.dumps(message_to_dict(m))) for m in messages]
    return delete, insert, values


def _pg_idle_status(connection: Any) -> str:
    from psycopg import pq

    status = connection.info.transaction_status
    if status == pq.TransactionStatus.INTRANS:
        return "commit"  # the store's reads leave a read-only transaction open
    if status == pq.TransactionStatus.INERROR:
        return "rollback"
    return "idle"


def _pg_rewrite(store: Any, messages: Sequence[BaseMessage]) -> None:
    connection = store._connection
    if connection is None:
        msg = "this PostgresChatMessageHistory has no sync_connection; use the async methods"
        raise ValueError(msg)
    delete, insert, values = _pg_statements(store, messages)
    action = _pg_idle_status(connection)
    if action != "idle":
        getattr(connection, action)()
    with connection.transaction(), connection.cursor() as cursor:
        cursor.execute(delete, (str(store._session_id),))
        if values:
            cursor.executemany(insert, values)


async def _pg_arewrite(store: Any, messages: Sequence[BaseMessage]) -> None:
    connection = store._aconnection
    if connection is None:
        msg = "this PostgresChatMessageHistory has no async_connection; use the sync methods"
        raise ValueError(msg)
    delete, insert, values = _pg_statements(store, messages)
    action = _pg_idle_status(connection)
    if action != "idle":
        await getattr(connection, action)()
    async with connection.transaction(), connection.cursor() as cursor:
        await cursor.execute(delete, (str(store._session_id),))
        if values:
            await cursor.executemany(insert, values)


# ---------------------------------------------------------------------------
# The wrapper
# ---------------------------------------------------------------------------


def _check_history(field: str, value: object) -> None:
    if value is not None and not isinstance(value, BaseChatMessageHistory):
        raise ConfigurationError(
            field,
            value,
            "pass a BaseChatMessageHistory, e.g. SQLChatMessageHistory(session_id=..., connection=...)",
        )


class CompactingChatMessageHistory(BaseChatMessageHistory):
    """A chat history that compacts itself when it outgrows the window.

    Args:
        inner: The store that keeps the messages (any ``BaseChatMessageHistory``).
        model: Writes the summaries: a chat model, Runnable, function from
            prompt text to text, or summarizer.
        options: Budgets and prompts; ``context_window`` must be set for
            automatic compaction (0 turns it off; ``compact()`` still works).
        archive: A history that receives every compacted original, exactly
            once, before it leaves ``inner``; dedicated to this session.
        fallback: A summarizer used when ``model`` fails.
        on_error: ``"raise"`` (default): a failed automatic compaction raises
            ``CompactionError`` from ``add_messages`` (the messages are stored
            all the same). ``"warn"``: it is logged and retried on the next add.
        lock: A cross-process lock (``FileLock``, ``PostgresAdvisoryLock``)
            for several processes writing one session; the in-process lock is
            always taken.
        journal: A history on durable storage that holds a rewrite in progress,
            for stores without an atomic rewrite (see the module docstring).

    Example:
        >>> from langchain_core.messages import AIMessage, HumanMessage
        >>> from langchain_core.chat_history import BaseChatMessageHistory
        >>> class ListHistory(BaseChatMessageHistory):
        ...     def __init__(self):
        ...         self.messages = []
        ...     def add_messages(self, messages):
        ...         self.messages.extend(messages)
        ...     def clear(self):
        ...         self.messages = []
        >>> history = CompactingChatMessageHistory(
        ...     ListHistory(),
        ...     lambda prompt: "## Goal\\n- chat",
        ...     CompactionOptions(context_window=2000, reserve_tokens=500, keep_recent_tokens=300),
        ... )
        >>> for i in range(40):
        ...     history.add_messages([HumanMessage(f"question {i} " * 10), AIMessage(f"answer {i} " * 10)])
        >>> history.messages[0].additional_kwargs["langchain_compaction"]["kind"]
        'summary'
    """

    def __init__(
        self,
        inner: BaseChatMessageHistory,
        model: Any,
        options: CompactionOptions | None = None,
        *,
        archive: BaseChatMessageHistory | None = None,
        fallback: Any = None,
        on_error: OnError = "raise",
        lock: CompactionLock | None = None,
        journal: BaseChatMessageHistory | None = None,
    ) -> None:
        super().__init__()
        if inner is None:
            raise ConfigurationError("inner", inner, "pass the BaseChatMessageHistory that stores the messages")
        _check_history("inner", inner)
        _check_history("archive", archive)
        _check_history("journal", journal)
        for field, other in (("archive", archive), ("journal", journal)):
            if other is not None and (other is inner or _session_key(other) == _session_key(inner)):
                raise ConfigurationError(field, other, "pass a separate history, not the inner store itself")
        if options is None:
            options = CompactionOptions()
        if not isinstance(options, CompactionOptions):
            raise ConfigurationError("options", options, "pass CompactionOptions(context_window=...)")
        if on_error not in ("raise", "warn"):
            raise ConfigurationError("on_error", on_error, "pass 'raise' or 'warn'")
        if lock is not None and not isinstance(lock, CompactionLock):
            raise ConfigurationError("lock", lock, "pass an object with hold() and ahold(), e.g. FileLock(path)")
        self.inner = inner
        # A chat memory's archive must receive every original, and clearing
        # rewrites tool outputs in place: here compaction always summarizes.
        self.options = replace(options, clear_tool_outputs=False) if options.clear_tool_outputs else options
        self.archive = archive
        self.journal = journal
        self.on_error: OnError = on_error
        self.lock = lock
        self._summarizer = as_summarizer(model)
        self._fallback = None if fallback is None else as_summarizer(fallback, field="fallback")
        self._strategy: Strategy = _strategy(inner)
        self._state = _session_state(inner)

    # -- locking ------------------------------------------------------------

    def _cross_needed(self, write: bool) -> bool:
        # Atomic rewrites never show a half-written store, so reads skip the
        # cross-process lock; the journaled rewrite does show one.
        return self.lock is not None and (write or self._may_be_torn)

    @property
    def _may_be_torn(self) -> bool:
        # A journaled rewrite may be half done; so may one that an earlier
        # process, whatever its store class, left in the journal.
        return self._strategy == "journal" or self.journal is not None

    @contextmanager
    def _hold(self, *, write: bool) -> Iterator[None]:
        with self._state.lock.hold():
            if self.lock is not None and self._cross_needed(write):
                with self.lock.hold():
                    yield
            else:
                yield

    @asynccontextmanager
    async def _ahold(self, *, write: bool) -> AsyncIterator[None]:
        async with self._state.lock.ahold():
            if self.lock is not None and self._cross_needed(write):
                async with self.lock.ahold():
                    yield
            else:
                yield

    # -- store calls, wrapped -----------------------------------------------

    def _error(self, operation: str, exc: Exception, store: BaseChatMessageHistory) -> StoreError:
        where, _, method = operation.rpartition(":")
        msg = (
            f"{type(store).__name__}.{method} failed ({where or 'store'}): {type(exc).__name__}: {exc}. "
            "No message was lost: a compaction leaves the store as it was or finishes the rewrite on the next call"
        )
        error = StoreError(msg, operation=operation)
        error.__cause__ = exc
        return error

    def _call(self, operation: str, function: Callable[[], _T], store: BaseChatMessageHistory | None = None) -> _T:
        try:
            return function()
        except CompactionError:
            raise
        except Exception as exc:
            raise self._error(operation, exc, store or self.inner) from exc

    async def _acall(
        self, operation: str, function: Callable[[], Awaitable[_T]], store: BaseChatMessageHistory | None = None
    ) -> _T:
        try:
            return await function()
        except CompactionError:
            raise
        except Exception as exc:
            raise self._error(operation, exc, store or self.inner) from exc

    def _read(self) -> list[BaseMessage]:
        return list(self._call("read", lambda: self.inner.messages))

    async def _aread(self) -> list[BaseMessage]:
        return list(await self._acall("read", self.inner.aget_messages))

    # -- the journaled rewrite and its repair ---------------------------------

    def _load_pending(self) -> _Pending | None:
        if self._state.pending is not None or self.journal is None:
            return self._state.pending
        journal = self.journal
        return _Pending.from_journal(self._call("journal:read", lambda: journal.messages, journal))

    async def _aload_pending(self) -> _Pending | None:
        if self._state.pending is not None or self.journal is None:
            return self._state.pending
        journal = self.journal
        return _Pending.from_journal(await self._acall("journal:read", journal.aget_messages, journal))

    def _drop_pending(self) -> None:
        self._state.pending = None
        if self.journal is not None:
            journal = self.journal
            try:
                self._call("journal:clear", journal.clear, journal)
            except StoreError as exc:
                # Harmless: the journal now describes a finished rewrite, and
                # the next read finds the store already holds its target.
                logger.warning("%s", exc)

    async def _adrop_pending(self) -> None:
        self._state.pending = None
        if self.journal is not None:
            journal = self.journal
            try:
                await self._acall("journal:clear", journal.aclear, journal)
            except StoreError as exc:
                logger.warning("%s", exc)

    def _journaled_rewrite(self, current: Sequence[BaseMessage], target: Sequence[BaseMessage]) -> None:
        pending = _Pending.of(current, target)
        if self.journal is not None:
            journal = self.journal
            self._call("journal:clear", journal.clear, journal)
            self._call("journal:add_messages", lambda: journal.add_messages([pending.marker(), *target]), journal)
        self._state.pending = pending  # from here on the next call can finish it
        self._call("clear", self.inner.clear)
        self._call("add_messages", lambda: self.inner.add_messages(list(target)))
        self._drop_pending()

    async def _ajournaled_rewrite(self, current: Sequence[BaseMessage], target: Sequence[BaseMessage]) -> None:
        pending = _Pending.of(current, target)
        if self.journal is not None:
            journal = self.journal
            await self._acall("journal:aclear", journal.aclear, journal)
            await self._acall(
                "journal:aadd_messages", lambda: journal.aadd_messages([pending.marker(), *target]), journal
            )
        self._state.pending = pending
        await self._acall("aclear", self.inner.aclear)
        await self._acall("aadd_messages", lambda: self.inner.aadd_messages(list(target)))
        await self._adrop_pending()

    def _repaired(self) -> list[BaseMessage]:
        """The store's messages, after finishing an interrupted rewrite."""
        if not self._may_be_torn:
            return self._read()
        pending = self._load_pending()
        current = self._read()
        if pending is None:
            return current
        target, write = pending.reconcile(current)
        if not write:
            self._drop_pending()
            return target
        try:
            if self._strategy == "journal":
                self._journaled_rewrite(current, target)
            else:
                self._rewrite(current, target)
                self._drop_pending()
        except StoreError as exc:
            # Still pending: report the full history, try again next call.
            logger.warning("could not finish an interrupted compaction rewrite yet: %s", exc)
        return target

    async def _arepaired(self) -> list[BaseMessage]:
        if not self._may_be_torn:
            return await self._aread()
        pending = await self._aload_pending()
        current = await self._aread()
        if pending is None:
            return current
        target, write = pending.reconcile(current)
        if not write:
            await self._adrop_pending()
            return target
        try:
            if self._strategy == "journal":
                await self._ajournaled_rewrite(current, target)
            else:
                await self._arewrite(current, target)
                await self._adrop_pending()
        except StoreError as exc:
            logger.warning("could not finish an interrupted compaction rewrite yet: %s", exc)
        return target

    def repair(self) -> bool:
        """Finish an interrupted rewrite now; ``True`` if one was pending.

        Every other method does this first, so calling it is never required.

        Raises:
            StoreError: The store still fails; the rewrite stays pending.
        """
        with self._hold(write=True):
            if not self._may_be_torn or self._load_pending() is None:
                return False
            self._repaired()
            if self._state.pending is not None:
                msg = "the interrupted compaction rewrite could not be finished; it stays pending"
                raise StoreError(msg, operation="repair")
            return True

    # -- the rewrite of each store ------------------------------------------

    def _rewrite(self, current: Sequence[BaseMessage], target: Sequence[BaseMessage]) -> None:
        store: Any = self.inner
        if self._strategy == "memory":
            store.messages = list(target)  # one assignment: readers see old or new
        elif self._strategy == "file":
            self._call("rewrite", lambda: _file_replace(store, target))
        elif self._strategy == "sql":
            self._call("rewrite", lambda: _sql_rewrite(store, target))
        elif self._strategy == "postgres":
            self._call("rewrite", lambda: _pg_rewrite(store, target))
        else:
            self._journaled_rewrite(current, target)

    async def _arewrite(self, current: Sequence[BaseMessage], target: Sequence[BaseMessage]) -> None:
        store: Any = self.inner
        if self._strategy == "memory":
            store.messages = list(target)
        elif self._strategy == "file":
            # File I/O has no async API; the store's own async methods do the same.
            await self._acall("rewrite", lambda: asyncio.to_thread(_file_replace, store, target))
        elif self._strategy == "sql":
            await self._acall("rewrite", lambda: _sql_arewrite(store, target))
        elif self._strategy == "postgres":
            await self._acall("rewrite", lambda: _pg_arewrite(store, target))
        else:
            await self._ajournaled_rewrite(current, target)

    # -- archive --------------------------------------------------------------

    def _archive(self, commit: _Commit) -> int | None:
        archive = self.archive
        if archive is None:
            return None
        existing = len(self._call("archive:read", lambda: archive.messages, archive))
        skip = _already_archived(commit, existing, self._state.archive_memo)
        batch = commit.originals[skip:]
        if batch:
            self._call("archive:add_messages", lambda: archive.add_messages(batch), archive)
        self._state.archive_memo = tuple(_key(m) for m in commit.originals)
        return existing + len(batch)

    async def _aarchive(self, commit: _Commit) -> int | None:
        archive = self.archive
        if archive is None:
            return None
        existing = len(await self._acall("archive:aget_messages", archive.aget_messages, archive))
        skip = _already_archived(commit, existing, self._state.archive_memo)
        batch = commit.originals[skip:]
        if batch:
            await self._acall("archive:aadd_messages", lambda: archive.aadd_messages(batch), archive)
        self._state.archive_memo = tuple(_key(m) for m in commit.originals)
        return existing + len(batch)

    # -- compaction -------------------------------------------------------------

    def _due(self, snapshot: Sequence[BaseMessage]) -> bool:
        return over_threshold(snapshot, self.options)

    def _discarded(self) -> None:
        logger.warning(
            "the history changed under a compaction (cleared, or compacted by another writer); "
            "its summary was discarded and the store left as it was"
        )

    def _compact(self, force: bool, instructions: str, wait: bool) -> CompactionResult | None:
        if not self._state.flight.acquire(blocking=wait):
            return None  # another compaction of this session is running
        try:
            with self._hold(write=self._may_be_torn):
                snapshot = self._repaired()
            if not force and not self._due(snapshot):
                return None
            prepared = prepare(snapshot, self.options, instructions, force=force)
            if prepared is None:
                return None
            # The model is called with no lock held: writers go on meanwhile.
            report = run_flow(prepared.flow, self._summarizer, fallback=self._fallback, timeout=self.options.timeout)
            result, output = finish(prepared, report, self.options)
            with self._hold(write=True):
                current = self._repaired()
                commit = _build_commit(prepared, output, snapshot, current)
                if commit is None:
                    self._discarded()
                    return None
                total = self._archive(commit)
                self._rewrite(current, _with_counter(commit, total))
                self._state.archive_memo = None
            return result
        finally:
            self._state.flight.release()

    async def _acompact(self, force: bool, instructions: str, wait: bool) -> CompactionResult | None:
        delay = 0.001
        while not self._state.flight.acquire(blocking=False):
            if not wait:
                return None
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)
        try:
            async with self._ahold(write=self._may_be_torn):
                snapshot = await self._arepaired()
            if not force and not self._due(snapshot):
                return None
            prepared = prepare(snapshot, self.options, instructions, force=force)
            if prepared is None:
                return None
            report = await arun_flow(
                prepared.flow, self._summarizer, fallback=self._fallback, timeout=self.options.timeout
            )
            result, output = finish(prepared, report, self.options)
            async with self._ahold(write=True):
                current = await self._arepaired()
                commit = _build_commit(prepared, output, snapshot, current)
                if commit is None:
                    self._discarded()
                    return None
                total = await self._aarchive(commit)
                await self._arewrite(current, _with_counter(commit, total))
                self._state.archive_memo = None
            return result
        finally:
            self._state.flight.release()

    def _failed(self, exc: CompactionError) -> None:
        if self.on_error == "raise":
            raise exc
        logger.warning("automatic compaction failed; the history keeps growing and the next add retries: %s", exc)

    # -- BaseChatMessageHistory -------------------------------------------------

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        """The messages of ``inner`` (an interrupted rewrite finished first)."""
        with self._hold(write=False):
            return self._repaired()

    async def aget_messages(self) -> list[BaseMessage]:
        """Await the messages of ``inner``; see ``messages``."""
        async with self._ahold(write=False):
            return await self._arepaired()

    @staticmethod
    def _batch(messages: Sequence[BaseMessage]) -> list[BaseMessage]:
        batch = list(messages)
        for index, message in enumerate(batch):
            if not isinstance(message, BaseMessage):
                raise ConfigurationError(
                    f"messages[{index}]", message, "pass BaseMessage objects (e.g. HumanMessage('hi'))"
                )
        return batch

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Append to ``inner``, then compact if the history no longer fits.

        Raises:
            StoreError: ``inner`` failed to store the messages.
            CompactionError: The automatic compaction failed (``on_error="raise"``);
                the messages were stored and the store is otherwise unchanged.
        """
        batch = self._batch(messages)
        if not batch:
            return
        with self._hold(write=True):
            if self._may_be_torn:
                self._repaired()
            self._call("add_messages", lambda: self.inner.add_messages(batch))
        if self.options.context_window <= 0:
            return
        try:
            self._compact(force=False, instructions="", wait=False)
        except CompactionError as exc:
            self._failed(exc)

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Await the append to ``inner``, then compact; see ``add_messages``."""
        batch = self._batch(messages)
        if not batch:
            return
        async with self._ahold(write=True):
            if self._may_be_torn:
                await self._arepaired()
            await self._acall("aadd_messages", lambda: self.inner.aadd_messages(batch))
        if self.options.context_window <= 0:
            return
        try:
            await self._acompact(force=False, instructions="", wait=False)
        except CompactionError as exc:
            self._failed(exc)

    def clear(self) -> None:
        """Clear ``inner`` (and any interrupted rewrite); the archive is kept."""
        with self._hold(write=True):
            self._drop_pending()
            self._call("clear", self.inner.clear)

    async def aclear(self) -> None:
        """Await ``inner.aclear()``; see ``clear``."""
        async with self._ahold(write=True):
            await self._adrop_pending()
            await self._acall("aclear", self.inner.aclear)

    def compact(self, custom_instructions: str = "") -> CompactionResult | None:
        """Compact now, whatever the size (waits for a running compaction).

        Args:
            custom_instructions: Added to the summary prompt.

        Returns:
            The result, or ``None`` if there was nothing to compact.

        Raises:
            CompactionError: The summary or the rewrite failed (whatever
                ``on_error`` says); the store was left as it was.
        """
        return self._compact(force=True, instructions=custom_instructions, wait=True)

    async def acompact(self, custom_instructions: str = "") -> CompactionResult | None:
        """The async twin of ``compact``."""
        return await self._acompact(force=True, instructions=custom_instructions, wait=True)

    def __repr__(self) -> str:
        return f"CompactingChatMessageHistory(inner={type(self.inner).__name__}, rewrite={self._strategy!r})"
