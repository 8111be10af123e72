"""Locks that keep a compaction's rewrite apart from concurrent writers.

``CompactingChatMessageHistory`` always takes an in-process lock, shared by
every wrapper over the same session in the process (``InProcessLock``). When
several processes share one database, pass a cross-process lock as ``lock=``
as well; it is taken inside the in-process one around every write:

```
CompactionLock            the protocol: hold() / ahold()
├── InProcessLock         threads and asyncio tasks of one process (default)
├── FileLock              processes on one machine (fcntl.flock on a lock file)
└── PostgresAdvisoryLock  processes anywhere that reach one PostgreSQL server
```

None of them is reentrant across processes; the wrapper never nests them.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
import weakref
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager, AbstractContextManager, asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from langchain_compaction.errors import CompactionError, ConfigurationError

__all__ = ["CompactionLock", "FileLock", "InProcessLock", "PostgresAdvisoryLock"]

# Polling bounds for the async paths: a blocking acquire would stall the event
# loop, so they try without blocking and sleep between attempts.
POLL_START = 0.0005
POLL_MAX = 0.02


async def backoff(delay: float) -> float:
    """Sleep ``delay`` seconds; the next, doubled delay (at most ``POLL_MAX``)."""
    await asyncio.sleep(delay)
    return min(delay * 2, POLL_MAX)


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

    @contextmanager
    def _opened(self) -> Iterator[int]:
        """The lock file's descriptor; unlocked and closed on exit, whatever happened."""
        import fcntl

        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            yield fd
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)  # a no-op when it was never locked
            os.close(fd)

    @contextmanager
    def hold(self) -> Iterator[None]:
        """Block until no other holder has the file locked."""
        import fcntl

        with self._opened() as fd:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield

    @asynccontextmanager
    async def ahold(self) -> AsyncIterator[None]:
        """Await the file lock, polling so the event loop is never blocked."""
        import fcntl

        with self._opened() as fd:
            delay = POLL_START
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    delay = await backoff(delay)
            yield

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


class PostgresAdvisoryLock:
    """A cross-process lock: a PostgreSQL session-level advisory lock.

    Each ``hold`` opens its own autocommit connection, takes
    ``pg_advisory_lock(key)`` and releases it on exit; the server releases it
    too if the connection dies, so a crashed holder never leaves it stuck.
    Needs ``psycopg`` (``pip install "psycopg[binary]"``).

    Args:
        conninfo: A libpq connection string or URL.
        name: What to lock, usually the session id; hashed into the 64-bit key.

    Example:
        >>> lock = PostgresAdvisoryLock("postgresql://localhost/chat", "3f2b...")
        >>> lock.key == advisory_key("3f2b...")
        True
    """

    def __init__(self, conninfo: str, name: str) -> None:
        if not isinstance(conninfo, str) or not conninfo:
            raise ConfigurationError("conninfo", conninfo, "pass a libpq connection string or postgresql:// URL")
        self.conninfo = conninfo
        self.name = name
        self.key = advisory_key(name)

    @staticmethod
    def _psycopg() -> Any:
        try:
            import psycopg
        except ImportError as exc:
            msg = 'PostgresAdvisoryLock needs psycopg: pip install "psycopg[binary]"'
            raise ImportError(msg) from exc
        return psycopg

    @contextmanager
    def hold(self) -> Iterator[None]:
        """Block until the advisory lock is held."""
        psycopg = self._psycopg()
        with psycopg.connect(self.conninfo, autocommit=True) as conn:
            conn.execute("SELECT pg_advisory_lock(%s)", (self.key,))
            try:
                yield
            finally:
                conn.execute("SELECT pg_advisory_unlock(%s)", (self.key,))

    @asynccontextmanager
    async def ahold(self) -> AsyncIterator[None]:
        """Await the advisory lock on an async connection."""
        psycopg = self._psycopg()
        async with await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True) as conn:
            await conn.execute("SELECT pg_advisory_lock(%s)", (self.key,))
            try:
                yield
            finally:
                await conn.execute("SELECT pg_advisory_unlock(%s)", (self.key,))

    def __repr__(self) -> str:
        return f"PostgresAdvisoryLock(name={self.name!r}, key={self.key})"
