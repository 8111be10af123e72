"""The chat-history stores chat memory knows, and the strongest rewrite each offers.

Every store call is a ``Call`` (``core.effects``): the wrapper's flows yield
them and run the same on the sync and the async path.

- ``InMemoryChatMessageHistory``: one list assignment; readers see the old
  list or the new one.
- ``FileChatMessageHistory``: the new JSON goes to a temp file beside it, is
  fsynced, then ``os.replace``-d over it: a crash leaves the old file or the new.
- ``SQLChatMessageHistory`` (sync or async engine): DELETE and INSERTs in one
  SQLAlchemy transaction.
- ``PostgresChatMessageHistory`` (sync or async connection): DELETE and
  INSERTs in one psycopg transaction.
- Any other store, or a subclass of those that overrides their read or write
  methods: ``"journal"``, the wrapper's journaled ``clear()`` then
  ``add_messages()``.
"""

from __future__ import annotations

import json
import os
import stat
import sys
import time
import uuid
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any, Literal

from langchain_core.chat_history import BaseChatMessageHistory, InMemoryChatMessageHistory
from langchain_core.messages import BaseMessage, message_to_dict, messages_from_dict, messages_to_dict

from langchain_compaction.core.effects import Call, blocking, inline, twin

Strategy = Literal["memory", "file", "sql", "postgres", "journal"]
"""How a store is rewritten (see the module docstring)."""

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
# Reads of a file another writer is rewriting in place: about 0.1 s in all.
_FILE_READ_ATTEMPTS = 10

_STOCK: dict[Strategy, tuple[str, str]] = {
    "file": ("langchain_community.chat_message_histories.file", "FileChatMessageHistory"),
    "sql": ("langchain_community.chat_message_histories.sql", "SQLChatMessageHistory"),
    "postgres": ("langchain_postgres.chat_message_histories", "PostgresChatMessageHistory"),
}


def _stock_class(module: str, name: str) -> type | None:
    loaded = sys.modules.get(module)  # not imported means the store cannot be one
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


def strategy(inner: BaseChatMessageHistory) -> Strategy:
    """The strongest rewrite ``inner`` offers."""
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


SESSION_ID_TYPES = (str, int, uuid.UUID)
"""What a session id may be (chat stores take each), told by its text: ``str(session_id)``."""


def session_key(inner: BaseChatMessageHistory) -> Hashable:
    """Stores whose keys are equal hold one session (wrappers over them share a lock)."""
    path = getattr(inner, "file_path", None)
    if path is not None:
        return ("file", str(Path(path).resolve()))
    session = getattr(inner, "session_id", None)
    session = getattr(inner, "_session_id", None) if session is None else session  # (0 and "" are ids too)
    if not isinstance(session, SESSION_ID_TYPES):
        return ("object", id(inner))
    table = getattr(inner, "_table_name", None) or getattr(getattr(inner, "sql_model_class", None), "__tablename__", "")
    engine = getattr(inner, "engine", None) or getattr(inner, "async_engine", None)
    where = _database(getattr(engine, "url", "")) if engine is not None else ""
    connection = getattr(inner, "_connection", None) or getattr(inner, "_aconnection", None)
    if connection is not None:
        where = str(getattr(getattr(connection, "info", None), "dsn", ""))
    return (type(inner).__qualname__, str(session), str(table), where)


def _database(url: object) -> str:
    """Where an engine's URL keeps its data: a SQLite file by its absolute path, whatever the driver.

    ``sqlite:///chat.db``, ``sqlite:////srv/chat.db`` and ``sqlite+aiosqlite:///chat.db`` are one file:
    a sync and an async wrapper over it, or two that name it differently, share one lock.
    """
    database = str(getattr(url, "database", None) or "")
    if str(getattr(url, "drivername", "")).startswith("sqlite") and database not in ("", ":memory:"):
        return str(url) if database.startswith("file:") else f"sqlite:{Path(database).resolve()}"
    return str(url)


# -- the calls every store answers --------------------------------------------------


def _read(store: BaseChatMessageHistory) -> list[BaseMessage]:
    return list(store.messages)


async def _aread(store: BaseChatMessageHistory) -> list[BaseMessage]:
    return list(await store.aget_messages())


def read(store: BaseChatMessageHistory, kind: Strategy | None = None) -> Call[list[BaseMessage]]:
    """Read every message of ``store`` (a ``kind`` store the way that kind allows; by default, its own kind)."""
    if (kind or strategy(store)) == "file":
        return blocking(_file_read, store)
    return twin(_read, _aread, store)


def size(store: BaseChatMessageHistory) -> Call[int]:
    """How many messages ``store`` holds: a count where the store can make one, else a read of them all.

    An archive only grows: counting it at every compaction by reading it made
    a long session's compactions read the whole archive each time.
    """
    kind = strategy(store)
    if kind == "memory":
        return inline(len, getattr(store, "messages", ()))
    if kind == "sql":
        return twin(_sql_size, _sql_asize, store)
    if kind == "postgres":
        return twin(_pg_size, _pg_asize, store)
    if kind == "file":
        return blocking(_file_length, store)
    return twin(_length, _alength, store)


def _file_length(store: Any) -> int:
    return len(_file_read(store))


def _length(store: BaseChatMessageHistory) -> int:
    return len(store.messages)


async def _alength(store: BaseChatMessageHistory) -> int:
    return len(await store.aget_messages())


def _sql_count(session: Any, store: Any) -> int:
    from sqlalchemy import func, select

    model = store.sql_model_class
    column = getattr(model, store.session_id_field_name)
    return int(session.execute(select(func.count()).select_from(model).where(column == store.session_id)).scalar())


def _sql_size(store: Any) -> int:
    with store.session_maker() as session:
        return _sql_count(session, store)


async def _sql_asize(store: Any) -> int:
    async with store.session_maker() as session:
        return int(await session.run_sync(_sql_count, store))


def _pg_count_statement(store: Any) -> Any:
    from psycopg import sql

    return sql.SQL("SELECT count(*) FROM {} WHERE session_id = %s").format(sql.Identifier(store._table_name))


def _pg_size(store: Any) -> int:
    if store._connection is None:
        return _length(store)  # (the store's own read says what it can do)
    with store._connection.cursor() as cursor:
        cursor.execute(_pg_count_statement(store), (str(store._session_id),))
        return int(cursor.fetchone()[0])


async def _pg_asize(store: Any) -> int:
    if store._aconnection is None:
        return await _alength(store)
    async with store._aconnection.cursor() as cursor:
        await cursor.execute(_pg_count_statement(store), (str(store._session_id),))
        row = await cursor.fetchone()
        return int(row[0])


def append(store: BaseChatMessageHistory, messages: Sequence[BaseMessage], kind: Strategy | None = None) -> Call[None]:
    """Append ``messages`` to ``store``: its own method, or, for a file, an atomic replace.

    The kind is the store's own by default: an archive or a journal in a file
    is appended to atomically too (the stock class truncates the file and
    writes it again, so a process killed meanwhile left it empty).
    """
    if (kind or strategy(store)) == "file":
        # FileChatMessageHistory appends by truncating and rewriting the file
        # in place, so a reader in another process can find it half written.
        return blocking(_file_append, store, list(messages))
    return twin(store.add_messages, store.aadd_messages, list(messages))


def clear(store: BaseChatMessageHistory) -> Call[None]:
    """Clear ``store`` with its own method."""
    return twin(store.clear, store.aclear)


# -- the atomic rewrites -----------------------------------------------------------------


def _memory_replace(store: Any, messages: Sequence[BaseMessage]) -> None:
    store.messages = list(messages)  # one assignment: readers see old or new


def _file_read(store: Any) -> list[BaseMessage]:
    # Wrappers write the file atomically; a writer that does not (the stock
    # class used directly, in another process) can leave it half written for
    # a moment: read again rather than fail.
    path = Path(store.file_path)
    for attempt in range(_FILE_READ_ATTEMPTS):
        try:
            return messages_from_dict(json.loads(path.read_text(encoding=store.encoding)))
        except json.JSONDecodeError:
            if attempt == _FILE_READ_ATTEMPTS - 1:
                raise
            time.sleep(0.002 * (attempt + 1))
    raise AssertionError  # pragma: no cover - the loop returns or raises


def _file_append(store: Any, messages: Sequence[BaseMessage]) -> None:
    _file_replace(store, [*_file_read(store), *messages])


def _file_replace(store: Any, messages: Sequence[BaseMessage]) -> None:
    data = json.dumps(messages_to_dict(list(messages)), ensure_ascii=store.ensure_ascii)
    replace_file(store.file_path, data, encoding=store.encoding)


def replace_file(path: str | os.PathLike[str], text: str, *, encoding: str | None = "utf-8") -> None:
    """Write ``text`` as the whole of the file at ``path``: all of it or, when the write fails, nothing.

    It is written beside the file and renamed over it, so a full disk or a
    process killed mid-write leaves the old file whole. A path reached
    through a symlink is written where the link points (a rename would swap
    the link for a file), with the file's own mode (a new file takes the
    umask's: a private history would become readable). A device or a pipe
    (``/dev/stdout``) is written to, not replaced.

    Raises:
        OSError: The file could not be written; it is unchanged.
    """
    try:
        status = os.stat(path)
    except FileNotFoundError:
        mode = None
    else:
        if not stat.S_ISREG(status.st_mode):  # (by the name given: a pipe's real path is no file name)
            with open(path, "w", encoding=encoding) as handle:
                handle.write(text)
            return
        mode = status.st_mode & 0o7777
    target = Path(os.path.realpath(path))
    temp = target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:
        with open(temp, "w", encoding=encoding) as handle:
            if mode is not None:
                os.chmod(temp, mode)
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, target)  # atomic on POSIX and Windows
    finally:
        temp.unlink(missing_ok=True)
    try:
        directory = os.open(target.parent, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(directory)  # make the rename itself durable
    finally:
        os.close(directory)


def _sql_write(session: Any, store: Any, messages: Sequence[BaseMessage]) -> None:
    from sqlalchemy import delete

    model = store.sql_model_class
    column = getattr(model, store.session_id_field_name)
    rows = [store.converter.to_sql_model(m, store.session_id) for m in messages]
    with session.begin():
        session.execute(delete(model).where(column == store.session_id))
        session.add_all(rows)


def _sql_replace(store: Any, messages: Sequence[BaseMessage]) -> None:
    with store.session_maker() as session:
        _sql_write(session, store, messages)


async def _sql_areplace(store: Any, messages: Sequence[BaseMessage]) -> None:
    # The async session runs the same transaction through its sync facade.
    async with store.session_maker() as session:
        await session.run_sync(_sql_write, store, messages)


def _pg_statements(store: Any, messages: Sequence[BaseMessage]) -> tuple[Any, tuple[str], Any, list[tuple[str, str]]]:
    from psycopg import sql

    table = sql.Identifier(store._table_name)
    delete = sql.SQL("DELETE FROM {} WHERE session_id = %s").format(table)
    insert = sql.SQL("INSERT INTO {} (session_id, message) VALUES (%s, %s)").format(table)
    session = str(store._session_id)
    return delete, (session,), insert, [(session, json.dumps(message_to_dict(m))) for m in messages]


def _pg_pending(connection: Any, side: str) -> str | None:
    """What to end first: the store's reads leave a transaction open (commit it), a failed one must roll back."""
    from psycopg import pq

    if connection is None:
        msg = f"this PostgresChatMessageHistory has no {side}_connection; use the other API"
        raise ValueError(msg)
    status = connection.info.transaction_status
    return {pq.TransactionStatus.INTRANS: "commit", pq.TransactionStatus.INERROR: "rollback"}.get(status)


def _pg_replace(store: Any, messages: Sequence[BaseMessage]) -> None:
    connection = store._connection
    if pending := _pg_pending(connection, "sync"):
        getattr(connection, pending)()
    delete, key, insert, rows = _pg_statements(store, messages)
    with connection.transaction(), connection.cursor() as cursor:
        cursor.execute(delete, key)
        cursor.executemany(insert, rows)


async def _pg_areplace(store: Any, messages: Sequence[BaseMessage]) -> None:
    connection = store._aconnection
    if pending := _pg_pending(connection, "async"):
        await getattr(connection, pending)()
    delete, key, insert, rows = _pg_statements(store, messages)
    async with connection.transaction(), connection.cursor() as cursor:
        await cursor.execute(delete, key)
        await cursor.executemany(insert, rows)


async def _amemory_replace(store: Any, messages: Sequence[BaseMessage]) -> None:
    _memory_replace(store, messages)


def replace_all(kind: Strategy, store: BaseChatMessageHistory, messages: Sequence[BaseMessage]) -> Call[None]:
    """Replace every message of ``store`` at once, the way ``kind`` allows (not ``"journal"``)."""
    if kind == "memory":
        return twin(_memory_replace, _amemory_replace, store, messages)
    if kind == "file":
        # File I/O has no async API; the store's own async methods do the same.
        return blocking(_file_replace, store, messages)
    if kind == "sql":
        return twin(_sql_replace, _sql_areplace, store, messages)
    if kind == "postgres":
        return twin(_pg_replace, _pg_areplace, store, messages)
    msg = f"a {kind!r} store has no atomic rewrite"
    raise ValueError(msg)
