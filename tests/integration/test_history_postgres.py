"""CompactingChatMessageHistory on PostgresChatMessageHistory, against a private PostgreSQL server.

The server is started by ``tests/postgres_server.py`` (initdb in a temp dir,
a free 127.0.0.1 port) and stopped when the module's tests finish.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import psycopg
import pytest
from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_postgres import PostgresChatMessageHistory
from postgres_server import PostgresServer, postgres_server

from langchain_compaction._lc.convert import is_compaction_message, is_summary_message
from langchain_compaction.core.options import CompactionOptions
from langchain_compaction.errors import StoreError, SummarizationError
from langchain_compaction.history import CompactingChatMessageHistory, PostgresAdvisoryLock

__all__ = ["postgres_server"]  # the fixture, imported for pytest

pytestmark = pytest.mark.postgres

OPTIONS = CompactionOptions(context_window=3000, reserve_tokens=1000, keep_recent_tokens=600)
PAD = " lorem ipsum dolor" * 6
TABLE = "chat_history"


def contents(messages: list[BaseMessage]) -> list[str]:
    return [str(m.content) for m in messages if not is_summary_message(m)]


def assert_nothing_lost(expected: list[str], store: list[BaseMessage], archive: list[BaseMessage]) -> None:
    seen = Counter(contents(store) + contents(archive))
    assert [c for c in expected if seen[c] == 0] == []
    assert {c: n for c, n in seen.items() if n > 1} == {}
    assert set(seen) == set(expected)


def summarize(prompt: str) -> str:
    return "## Goal\n- postgres summary"


@pytest.fixture(scope="module")
def url(postgres_server: PostgresServer) -> str:
    with psycopg.connect(postgres_server.url) as conn:
        PostgresChatMessageHistory.create_tables(conn, TABLE)
    return postgres_server.url


@pytest.fixture
def conn(url: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.connect(url) as connection:
        yield connection


def history(conn: psycopg.Connection[Any], session: str) -> PostgresChatMessageHistory:
    return PostgresChatMessageHistory(TABLE, session, sync_connection=conn)


def test_uses_a_transactional_rewrite(conn: psycopg.Connection[Any]) -> None:
    wrapper = CompactingChatMessageHistory(history(conn, str(uuid.uuid4())), summarize, OPTIONS)
    assert "rewrite='postgres'" in repr(wrapper)


def test_compacts_in_order_with_ids_and_archive(conn: psycopg.Connection[Any]) -> None:
    session = str(uuid.uuid4())
    store, archive = history(conn, session), history(conn, str(uuid.uuid4()))
    wrapper = CompactingChatMessageHistory(store, summarize, OPTIONS, archive=archive)
    wrapper.add_messages([SystemMessage("Be brief.", id="sys")])
    written = ["Be brief."]
    for i in range(60):
        wrapper.add_messages([HumanMessage(f"q{i}{PAD}", id=f"h{i}"), AIMessage(f"a{i}{PAD}", id=f"a{i}")])
        written += [f"q{i}{PAD}", f"a{i}{PAD}"]
    # Read back through a fresh connection: the rewrite was committed.
    stored = history(conn, session).messages
    assert stored[0].id == "sys"
    assert is_summary_message(stored[1])
    assert [is_summary_message(m) for m in stored].count(True) == 1
    assert stored[-1].id == "a59"
    assert contents(stored)[1:] == written[-(len(stored) - 2) :]
    assert_nothing_lost(written, stored, archive.messages)
    assert wrapper.compact() is not None
    assert len(history(conn, session).messages) < len(stored)


def test_concurrent_threads_lose_nothing(conn: psycopg.Connection[Any]) -> None:
    # Eight threads sharing one connection, as an app with one history object would.
    store, archive = history(conn, str(uuid.uuid4())), history(conn, str(uuid.uuid4()))
    calls = 0

    def counted(prompt: str) -> str:
        nonlocal calls
        calls += 1
        return f"## Goal\n- summary {calls}"

    errors: list[BaseException] = []

    def writer(w: int) -> None:
        try:
            wrapper = CompactingChatMessageHistory(store, counted, OPTIONS, archive=archive)
            for i in range(200):
                wrapper.add_messages([HumanMessage(f"w{w}-m{i}{PAD}")])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert calls >= 10
    assert_nothing_lost([f"w{w}-m{i}{PAD}" for w in range(8) for i in range(200)], store.messages, archive.messages)


async def test_concurrent_async_tasks_lose_nothing(url: str) -> None:
    async with await psycopg.AsyncConnection.connect(url) as aconn:
        session, archive_session = str(uuid.uuid4()), str(uuid.uuid4())
        store = PostgresChatMessageHistory(TABLE, session, async_connection=aconn)
        archive = PostgresChatMessageHistory(TABLE, archive_session, async_connection=aconn)
        calls = 0

        async def asummarize(prompt: str) -> str:
            nonlocal calls
            calls += 1
            await asyncio.sleep(0.005)
            return f"## Goal\n- summary {calls}"

        async def writer(w: int) -> None:
            wrapper = CompactingChatMessageHistory(store, asummarize, OPTIONS, archive=archive)
            for i in range(200):
                await wrapper.aadd_messages([HumanMessage(f"w{w}-m{i}{PAD}")])

        await asyncio.gather(*(writer(w) for w in range(8)))
        assert calls >= 10
        stored, archived = await store.aget_messages(), await archive.aget_messages()
        assert is_summary_message(stored[0])
        assert_nothing_lost([f"w{w}-m{i}{PAD}" for w in range(8) for i in range(200)], stored, archived)


WRITER = textwrap.dedent(
    """
    import sys
    import psycopg
    from langchain_core.messages import HumanMessage
    from langchain_postgres import PostgresChatMessageHistory
    from langchain_compaction.history import CompactingChatMessageHistory
    from langchain_compaction.history import PostgresAdvisoryLock
    from langchain_compaction.core.options import CompactionOptions

    url, session, archive_session, name = sys.argv[1:5]
    pad = " lorem ipsum dolor" * 6
    with psycopg.connect(url) as conn:
        history = CompactingChatMessageHistory(
            PostgresChatMessageHistory("chat_history", session, sync_connection=conn),
            lambda prompt: "## Goal\\n- from " + name,
            CompactionOptions(context_window=3000, reserve_tokens=1000, keep_recent_tokens=600),
            archive=PostgresChatMessageHistory("chat_history", archive_session, sync_connection=conn),
            lock=PostgresAdvisoryLock(url, session),
        )
        for i in range(100):
            history.add_messages([HumanMessage(f"{name}-m{i}{pad}")])
    """
)


def test_processes_share_a_session_with_an_advisory_lock(url: str, conn: psycopg.Connection[Any]) -> None:
    session, archive_session = str(uuid.uuid4()), str(uuid.uuid4())
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, url, session, archive_session, f"p{n}"], stderr=subprocess.PIPE, text=True
        )
        for n in range(4)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    stored, archived = history(conn, session).messages, history(conn, archive_session).messages
    assert is_summary_message(stored[0])
    assert_nothing_lost([f"p{n}-m{i}{PAD}" for n in range(4) for i in range(100)], stored, archived)


def test_advisory_lock_excludes_other_connections(url: str) -> None:
    lock = PostgresAdvisoryLock(url, "exclusive")
    order: list[str] = []
    with lock.hold():

        def other() -> None:
            with lock.hold():
                order.append("other")

        thread = threading.Thread(target=other)
        thread.start()
        thread.join(0.3)
        assert thread.is_alive()  # blocked on the server
        order.append("first")
    thread.join(5)
    assert order == ["first", "other"]


def drop_lock_connection(url: str, lock: PostgresAdvisoryLock) -> None:
    """Have the server end the connection that holds ``lock``'s advisory key (and wait until it is gone)."""
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_locks WHERE locktype = 'advisory' "
            "AND classid = %s AND objid = %s AND pid <> pg_backend_pid()",
            ((lock.key >> 32) & 0xFFFFFFFF, lock.key & 0xFFFFFFFF),
        )


class DroppingLockOnWrite(BaseChatMessageHistory):
    """A store whose next write loses the wrapper's advisory lock as it starts (and lands all the same)."""

    def __init__(self, url: str, lock: PostgresAdvisoryLock) -> None:
        self.url, self.lock, self.armed = url, lock, False
        self.messages: list[BaseMessage] = []

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        if self.armed:
            self.armed = False
            drop_lock_connection(self.url, self.lock)
        self.messages.extend(messages)

    def clear(self) -> None:
        self.messages = []


async def test_a_lock_whose_connection_drops_after_the_write_is_released_without_an_error(
    url: str, caplog: pytest.LogCaptureFixture
) -> None:
    # The release raised psycopg's AdminShutdown after the message was written: a caller retried and stored it twice.
    lock = PostgresAdvisoryLock(url, uuid.uuid4())
    store = DroppingLockOnWrite(url, lock)
    history = CompactingChatMessageHistory(store, summarize, OPTIONS, lock=lock)
    store.armed = True
    history.add_messages([HumanMessage("first", id="m0")])
    store.armed = True
    await history.aadd_messages([HumanMessage("second", id="m1")])
    assert [m.id for m in store.messages] == ["m0", "m1"]
    gone = [
        r.getMessage() for r in caplog.records if "connection was gone when the lock was released" in r.getMessage()
    ]
    assert len(gone) == 2
    with lock.hold():  # free again, on the server
        pass


class LosingLockOnRead(BaseChatMessageHistory):
    """An archive whose next read comes just after the wrapper's advisory lock was lost and another writer got in."""

    def __init__(self, url: str, lock: PostgresAdvisoryLock, intruder: Callable[[], None]) -> None:
        self.url, self.lock, self.intruder, self.armed = url, lock, intruder, False
        self.kept: list[BaseMessage] = []

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        if self.armed:
            self.armed = False
            drop_lock_connection(self.url, self.lock)
            self.intruder()
        return list(self.kept)

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        self.kept.extend(messages)

    def clear(self) -> None:
        self.kept = []


@pytest.mark.parametrize("asynchronous", [False, True])
async def test_a_writer_whose_lock_was_lost_stops_before_its_rewrite_and_loses_nothing(
    url: str, conn: psycopg.Connection[Any], asynchronous: bool
) -> None:
    # The server frees an advisory lock with its connection; the holder went on and rewrote the store from
    # what it had read, over a message another writer had added meanwhile (acknowledged, then gone).
    session = str(uuid.uuid4())
    lock = PostgresAdvisoryLock(url, session)

    def intruder() -> None:  # another process: it takes the freed lock and adds a message
        with PostgresAdvisoryLock(url, session).hold(), psycopg.connect(url) as other:
            history(other, session).add_messages([HumanMessage(f"intruder{PAD}")])

    archive = LosingLockOnRead(url, lock, intruder)
    said = [f"m{i}{PAD}" for i in range(30)]
    async with await psycopg.AsyncConnection.connect(url) as aconn:
        store = (
            PostgresChatMessageHistory(TABLE, session, async_connection=aconn)
            if asynchronous
            else history(conn, session)
        )
        wrapper = CompactingChatMessageHistory(store, summarize, OPTIONS, archive=archive, lock=lock)
        for text in said:
            if asynchronous:
                await wrapper.aadd_messages([HumanMessage(text)])
            else:
                wrapper.add_messages([HumanMessage(text)])
        archive.armed = True
        with pytest.raises(StoreError, match="lost while held") as info:
            await wrapper.acompact() if asynchronous else wrapper.compact()
        assert info.value.operation == "lock"
        assert contents(history(conn, session).messages) == [*said, f"intruder{PAD}"]  # untouched
        assert archive.kept == []  # stopped before its first write
        assert (await wrapper.acompact() if asynchronous else wrapper.compact()) is not None  # the next call goes on
    assert_nothing_lost([*said, f"intruder{PAD}"], history(conn, session).messages, archive.kept)


def test_a_lock_lost_during_the_compaction_after_an_add_says_the_messages_are_stored(
    url: str, conn: psycopg.Connection[Any]
) -> None:
    """The add's messages landed before its automatic compaction lost the lock: the error says not to add them again.

    It said "call again", and a caller that did stored its messages twice.
    """
    session = str(uuid.uuid4())
    lock = PostgresAdvisoryLock(url, session)
    archive = LosingLockOnRead(url, lock, lambda: None)
    wrapper = CompactingChatMessageHistory(history(conn, session), summarize, OPTIONS, archive=archive, lock=lock)
    raised = None
    for i in range(60):
        archive.armed = True  # (the connection ends during whatever compaction this add makes)
        try:
            wrapper.add_messages([HumanMessage(f"m{i}{PAD * 3}")])
        except StoreError as error:
            raised = (f"m{i}{PAD * 3}", error)
            break
    assert raised is not None, "no add compacted"
    text, error = raised
    assert "are stored: do not add them again" in str(error)
    assert "call again" not in str(error)
    assert contents(history(conn, session).messages).count(text) + contents(archive.kept).count(text) == 1


class _Rows(BaseChatMessageHistory):
    """A durable store as one process sees it: each process has its own object over the same rows."""

    def __init__(self, rows: list[BaseMessage], on_clear: Callable[[], None] | None = None) -> None:
        self.rows, self.on_clear = rows, on_clear

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        return list(self.rows)

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        self.rows.extend(messages)

    def clear(self) -> None:
        del self.rows[:]
        if self.on_clear is not None:
            hook, self.on_clear = self.on_clear, None
            hook()


def test_a_writer_that_lost_its_lock_mid_rewrite_does_not_write_it_again_over_the_next_writers(url: str) -> None:
    """The journal says what is pending, not the writer's memory: another process may have finished it since.

    The writer kept its rewrite in memory and, on its next call, wrote its
    old target in front of the other process's later summary: two summaries,
    messages both in the store and the archive.
    """
    store: list[BaseMessage] = []
    journal: list[BaseMessage] = []
    archive: list[BaseMessage] = []
    lock = PostgresAdvisoryLock(url, "session-1")
    inner = _Rows(store)

    def wrapper(rows: _Rows, said: str, held: PostgresAdvisoryLock) -> CompactingChatMessageHistory:
        return CompactingChatMessageHistory(
            rows, lambda p: f"## Goal\n- {said}", OPTIONS, archive=_Rows(archive), journal=_Rows(journal), lock=held
        )

    first = wrapper(inner, "summary by the first", lock)
    for i in range(10):
        first.add_messages([HumanMessage(f"q{i}{PAD}", id=f"q{i}"), AIMessage(f"a{i}{PAD}", id=f"a{i}")])
    inner.on_clear = lambda: drop_lock_connection(url, lock)  # (the server ends the lock's connection then)
    with pytest.raises(StoreError, match="lost while held"):
        first.compact()
    other = wrapper(_Rows(store), "summary by the other", PostgresAdvisoryLock(url, "session-1"))
    for i in range(10, 16):
        other.add_messages([HumanMessage(f"q{i}{PAD}", id=f"q{i}"), AIMessage(f"a{i}{PAD}", id=f"a{i}")])
    assert other.compact() is not None
    first.messages  # noqa: B018 - the first writer's next call
    assert sum(is_summary_message(m) for m in store) == 1
    held = [m.id for m in [*store, *archive] if not is_compaction_message(m)]
    assert sorted(held) == sorted(f"{p}{i}" for i in range(16) for p in "qa")


def test_model_failure_and_store_failure_leave_rows(conn: psycopg.Connection[Any]) -> None:
    session = str(uuid.uuid4())
    store = history(conn, session)

    def failing(prompt: str) -> str:
        raise RuntimeError("no model today")

    wrapper = CompactingChatMessageHistory(store, failing, OPTIONS)
    written: list[BaseMessage] = []

    def fill() -> None:
        for i in range(60):
            written.extend([HumanMessage(f"q{i}{PAD}"), AIMessage(f"a{i}{PAD}")])
            wrapper.add_messages(written[-2:])

    with pytest.raises(SummarizationError):
        fill()
    assert contents(store.messages) == [str(m.content) for m in written]

    # A CHECK constraint rejects the summary row: the rewrite fails after its
    # DELETE, among its INSERTs, and the transaction rolls back.
    before = store.messages
    conn.execute(f"ALTER TABLE {TABLE} ADD CONSTRAINT no_poison CHECK (message::text NOT LIKE '%%poison%%')")
    conn.commit()
    try:
        poisoned = CompactingChatMessageHistory(store, lambda p: "## Goal\n- poison", OPTIONS)
        with pytest.raises(StoreError) as info:
            poisoned.compact()
        assert info.value.operation == "rewrite"
        assert store.messages == before
    finally:
        conn.rollback()
        conn.execute(f"ALTER TABLE {TABLE} DROP CONSTRAINT no_poison")
        conn.commit()
    healthy = CompactingChatMessageHistory(store, summarize, OPTIONS)
    assert healthy.compact() is not None
    assert is_summary_message(store.messages[0])
