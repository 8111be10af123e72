"""Locks that keep a compaction's rewrite apart from concurrent writers.

``CompactingChatMessageHistory`` always takes an in-process lock, shared by
every wrapper over the same session in the process (``InProcessLock``). When
several processes share one database, pass a cross-process lock as ``lock=``
as well; it is taken inside the in-process one around every write:

```
CompactionLock            the protocol: hold() / ahold()       (required)
                          and lease(wait) / alease(wait)       (optional)
├── InProcessLock         threads and asyncio tasks of one process (default)
├── FileLock              processes on one machine (fcntl.flock on a lock file)
└── PostgresAdvisoryLock  processes anywhere that reach one PostgreSQL server
```

``hold`` is the write lock: held only while the store is read and rewritten.
A lock that can be lost while held (``PostgresAdvisoryLock``: its connection
ends, and the server frees it) yields a ``Held`` (``AsyncHeld`` from
``ahold``), which the wrapper asks before each write; when it is lost, the
writer stops there rather than write over a writer that got in since.
``lease`` is a second, separate lock that says who summarizes: a writer that
finds the history over budget tries it without waiting, and only the one that
gets it calls the model, with the write lock free all the while (writers go on
appending). A custom lock without ``lease`` still keeps the store consistent,
but every writer that sees the history over budget may summarize it (the
surplus summaries are discarded). None of them is reentrant across processes;
the wrapper never nests a lock in itself.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager, AbstractContextManager, asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, Protocol, runtime_checkable
from uuid import UUID

from langchain_compaction.errors import CompactionError, ConfigurationError
from langchain_compaction.history.stores import SESSION_ID_TYPES

__all__ = ["CompactionLock", "FileLock", "InProcessLock", "PostgresAdvisoryLock"]

logger = logging.getLogger("langchain_compaction")

# Polling bounds for the async paths: a blocking acquire would stall the event
# loop, so they try without blocking and sleep between attempts.
POLL_START = 0.0005
POLL_MAX = 0.02


async def backoff(delay: float) -> float:
    """Sleep ``delay`` seconds; the next, doubled delay (at most ``POLL_MAX``)."""
    await asyncio.sleep(delay)
    return min(delay * 2, POLL_MAX)


@runtime_checkable
class LeaseLock(Protocol):
    """A lock that can also grant the lease of who summarizes (see the module docstring)."""

    def lease(self, wait: bool = False) -> AbstractContextManager[bool]:
        """Try the lease (or wait for it); yield whether it is held."""
        ...

    def alease(self, wait: bool = False) -> AbstractAsyncContextManager[bool]:
        """The async twin of ``lease``: never blocks the event loop."""
        ...


@runtime_checkable
class Held(Protocol):
    """What ``hold()`` may yield for a lock that can be lost while held: a way to ask it is not."""

    def check(self) -> None:
        """Return if the lock is still held; raise (any exception, saying why) if it was lost."""
        ...


@runtime_checkable
class AsyncHeld(Protocol):
    """What ``ahold()`` may yield for a lock that can be lost while held; see ``Held``."""

    async def acheck(self) -> None:
        """The async twin of ``Held.check``."""
        ...


@runtime_checkable
class CompactionLock(Protocol):
    """A mutual-exclusion lock usable from blocking code and from asyncio.

    Example:
        >>> lock = InProcessLock()
        >>> with lock.hold():
        ...     pass
        >>> isinstance(lock, CompactionLock)
        True
    """

    def hold(self) -> AbstractContextManager[Any]:
        """Block until the lock is held; release it when the block exits."""
        ...

    def ahold(self) -> AbstractAsyncContextManager[Any]:
        """Await the lock without blocking the event loop; release on exit."""
        ...


class InProcessLock:
    """Excludes threads and asyncio tasks of one process from each other.

    Blocking code takes a ``threading.RLock``. An asyncio task first takes an
    ``asyncio.Lock`` of its event loop (tasks on one loop share a thread, so
    the RLock alone would let them all in), then the RLock without blocking,
    sleeping between attempts so the loop keeps running. A blocking ``hold()``
    on the thread of a loop whose task holds the lock would wait for that task
    forever (the loop cannot run while its thread blocks), so it raises
    ``CompactionError`` instead of entering; from any other thread the two
    wait for each other.

    Example:
        >>> import asyncio
        >>> lock = InProcessLock()
        >>> async def main():
        ...     async with lock.ahold():
        ...         return "held"
        >>> asyncio.run(main())
        'held'
    """

    def __init__(self) -> None:
        self._rlock = threading.RLock()
        self._guard = threading.Lock()
        self._loop_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
            weakref.WeakKeyDictionary()
        )
        # The thread whose event loop has a task holding the lock, if any.
        self._task_thread: int | None = None
        self._lease = threading.Lock()

    @contextmanager
    def hold(self) -> Iterator[None]:
        """Hold the lock (reentrant within one thread).

        Raises:
            CompactionError: Called on the thread of an event loop whose task
                holds the lock (blocking there would deadlock the loop).
        """
        if self._task_thread == threading.get_ident():
            msg = (
                "a blocking call (add_messages, messages, compact, ...) was made on the event loop's thread "
                "while an asyncio task holds the same chat history's lock; blocking here would deadlock the "
                "loop: use the async methods (aadd_messages, aget_messages, acompact) in async code"
            )
            raise CompactionError(msg)
        with self._rlock:
            yield

    def _loop_lock(self) -> asyncio.Lock:
        loop = asyncio.get_running_loop()
        with self._guard:
            lock = self._loop_locks.get(loop)
            if lock is None:
                lock = self._loop_locks[loop] = asyncio.Lock()
            return lock

    @asynccontextmanager
    async def ahold(self) -> AsyncIterator[None]:
        """Hold the lock from a task (not reentrant within one task)."""
        async with self._loop_lock():
            delay = POLL_START
            while not self._rlock.acquire(blocking=False):
                delay = await backoff(delay)
            self._task_thread = threading.get_ident()
            try:
                yield
            finally:
                self._task_thread = None
                self._rlock.release()

    @contextmanager
    def lease(self, wait: bool = False) -> Iterator[bool]:
        """Try the lease (a second lock), or wait for it; yield whether it is held."""
        held = self._lease.acquire(blocking=wait)
        try:
            yield held
        finally:
            if held:
                self._lease.release()

    @asynccontextmanager
    async def alease(self, wait: bool = False) -> AsyncIterator[bool]:
        """The async twin of ``lease``, polling while it waits."""
        held = await poll(lambda: self._lease.acquire(blocking=False), wait)
        try:
            yield held
        finally:
            if held:
                self._lease.release()


async def poll(attempt: Callable[[], bool], wait: bool) -> bool:
    """``attempt()`` until it succeeds (or once, without ``wait``), sleeping between tries."""
    delay = POLL_START
    while not attempt():
        if not wait:
            return False
        delay = await backoff(delay)
    return True


class FileLock:
    """A cross-process lock on one machine: ``fcntl.flock`` on a lock file.

    Every ``hold`` opens the file anew, so threads of one process exclude each
    other too (``flock`` locks belong to the open file, not the process). The
    lock is released by the kernel if the holder dies, so a crash never leaves
    it stuck. POSIX only.

    Args:
        path: The lock file; created if missing, never deleted.

    Example:
        >>> import tempfile, os
        >>> lock = FileLock(os.path.join(tempfile.mkdtemp(), "chat.lock"))
        >>> with lock.hold():
        ...     pass
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        try:
            import fcntl  # noqa: F401  (POSIX only)
        except ImportError as exc:  # pragma: no cover - Windows
            raise ConfigurationError(
                "lock", path, "FileLock needs fcntl (POSIX); use PostgresAdvisoryLock or your own CompactionLock"
            ) from exc
        self.path = Path(path)

    @property
    def lease_path(self) -> Path:
        """The second lock file, whose holder is the one writer that summarizes."""
        return self.path.with_name(self.path.name + ".lease")

    @staticmethod
    @contextmanager
    def _opened(path: Path) -> Iterator[int]:
        """A lock file's descriptor; unlocked and closed on exit, whatever happened."""
        import fcntl

        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            yield fd
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)  # a no-op when it was never locked
            os.close(fd)

    @staticmethod
    def _try(fd: int) -> bool:
        import fcntl

        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True

    @contextmanager
    def hold(self) -> Iterator[None]:
        """Block until no other holder has the file locked."""
        import fcntl

        with self._opened(self.path) as fd:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield

    @asynccontextmanager
    async def ahold(self) -> AsyncIterator[None]:
        """Await the file lock, polling so the event loop is never blocked."""
        with self._opened(self.path) as fd:
            await poll(lambda: self._try(fd), wait=True)
            yield

    @contextmanager
    def lease(self, wait: bool = False) -> Iterator[bool]:
        """Try the lease file's lock (or wait for it); yield whether it is held."""
        import fcntl

        with self._opened(self.lease_path) as fd:
            if wait:
                fcntl.flock(fd, fcntl.LOCK_EX)
            yield wait or self._try(fd)

    @asynccontextmanager
    async def alease(self, wait: bool = False) -> AsyncIterator[bool]:
        """The async twin of ``lease``, polling while it waits."""
        with self._opened(self.lease_path) as fd:
            yield await poll(lambda: self._try(fd), wait)

    def __repr__(self) -> str:
        return f"FileLock({str(self.path)!r})"


def advisory_key(name: str) -> int:
    """A stable signed 64-bit advisory-lock key for ``name``.

    Example:
        >>> advisory_key("session-1") == advisory_key("session-1")
        True
    """
    digest = hashlib.sha256(name.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


class _Connected:
    """What ``PostgresAdvisoryLock.hold`` yields: the lock is held as long as its connection is alive.

    A session-level advisory lock ends only with an unlock or with its
    session, so one round trip that succeeds says it is still held.
    """

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def check(self) -> None:
        """Raise the connection's error if it is gone (and the lock with it)."""
        self._conn.execute("SELECT 1")


class _AsyncConnected:
    """What ``PostgresAdvisoryLock.ahold`` yields; see ``_Connected``."""

    def __init__(self, conn: Any) -> None:
        self._conn = conn

    async def acheck(self) -> None:
        """Raise the connection's error if it is gone (and the lock with it)."""
        await self._conn.execute("SELECT 1")


class PostgresAdvisoryLock:
    """A cross-process lock: a PostgreSQL session-level advisory lock.

    Each ``hold`` opens its own autocommit connection, takes
    ``pg_advisory_lock(key)`` and releases it on exit; the server releases it
    too if the connection dies, so a crashed holder never leaves it stuck (a
    release that finds its connection gone logs a warning, never raises: the
    lock is free, and what was written under it stands).
    Needs ``psycopg`` (``pip install "psycopg[binary]"``).

    Args:
        conninfo: A libpq connection string or URL.
        name: What to lock, usually the session id (a ``str``, ``int`` or
            ``UUID``, as chat stores take it; locked by its text, so
            ``uuid`` and ``str(uuid)`` are one lock); hashed into the 64-bit key.

    Raises:
        ConfigurationError: ``conninfo`` or ``name`` is of the wrong kind.

    Example:
        >>> lock = PostgresAdvisoryLock("postgresql://localhost/chat", "3f2b...")
        >>> lock.key == advisory_key("3f2b...")
        True
    """

    def __init__(self, conninfo: str, name: str | int | UUID) -> None:
        if not isinstance(conninfo, str) or not conninfo:
            raise ConfigurationError("conninfo", conninfo, "pass a libpq connection string or postgresql:// URL")
        if isinstance(name, bool) or not isinstance(name, SESSION_ID_TYPES):
            raise ConfigurationError("name", name, "pass what to lock as a string, usually the session id")
        self.conninfo = conninfo
        self.name = str(name)
        self.key = advisory_key(self.name)
        self.lease_key = advisory_key(f"{self.name}\x00lease")

    @staticmethod
    def _psycopg() -> Any:
        try:
            import psycopg
        except ImportError as exc:
            msg = 'PostgresAdvisoryLock needs psycopg: pip install "psycopg[binary]"'
            raise ImportError(msg) from exc
        return psycopg

    def _unlock(self, conn: Any, key: int) -> None:
        """Release ``key`` on ``conn``; a connection that is gone released it already (``_released``)."""
        try:
            conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
        except self._psycopg().OperationalError as error:
            self._released(error)

    async def _aunlock(self, conn: Any, key: int) -> None:
        """The async twin of ``_unlock``."""
        try:
            await conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
        except self._psycopg().OperationalError as error:
            self._released(error)

    def _released(self, error: Exception) -> None:
        # The connection is closed on the way out whatever happened, and the
        # server ends a session's advisory locks with it: the lock is free.
        # Raising here told a caller whose write had landed that it failed,
        # and a retry stored its messages twice.
        logger.warning(
            "%r: its connection was gone when the lock was released (%s: %s); the server released the lock "
            "with the connection, and what was written under it stands",
            self,
            type(error).__name__,
            str(error).strip(),
        )

    @contextmanager
    def hold(self) -> Iterator[Held]:
        """Block until the advisory lock is held; yield what tells it is still held (``Held``)."""
        psycopg = self._psycopg()
        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            conn.execute("SELECT pg_advisory_lock(%s)", (self.key,))
            try:
                yield _Connected(conn)
            finally:
                self._unlock(conn, self.key)

    @asynccontextmanager
    async def ahold(self) -> AsyncIterator[AsyncHeld]:
        """Await the advisory lock on an async connection; yield what tells it is still held."""
        psycopg = self._psycopg()
        async with await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True) as conn:
            await conn.execute("SELECT pg_advisory_lock(%s)", (self.key,))
            try:
                yield _AsyncConnected(conn)
            finally:
                await self._aunlock(conn, self.key)

    @contextmanager
    def lease(self, wait: bool = False) -> Iterator[bool]:
        """Try the lease (a second advisory key), or wait for it; yield whether it is held."""
        psycopg = self._psycopg()
        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            if wait:
                conn.execute("SELECT pg_advisory_lock(%s)", (self.lease_key,))
                held = True
            else:
                row = conn.execute("SELECT pg_try_advisory_lock(%s)", (self.lease_key,)).fetchone()
                held = bool(row and row[0])
            try:
                yield held
            finally:
                if held:
                    self._unlock(conn, self.lease_key)

    @asynccontextmanager
    async def alease(self, wait: bool = False) -> AsyncIterator[bool]:
        """The async twin of ``lease`` (the server waits; the event loop does not)."""
        psycopg = self._psycopg()
        async with await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True) as conn:
            if wait:
                await conn.execute("SELECT pg_advisory_lock(%s)", (self.lease_key,))
                held = True
            else:
                cursor = await conn.execute("SELECT pg_try_advisory_lock(%s)", (self.lease_key,))
                row = await cursor.fetchone()
                held = bool(row and row[0])
            try:
                yield held
            finally:
                if held:
                    await self._aunlock(conn, self.lease_key)

    def __repr__(self) -> str:
        return f"PostgresAdvisoryLock(name={self.name!r}, key={self.key})"
