"""What every chat-memory wrapper over one session in this process shares, and its locks.

Wrappers over the same store session (``stores.session_key``) share one
``SessionState``: the in-process lock, the flight (one compaction at a time),
a rewrite left unfinished, the archive memo and the counts of the stored
history. The calls here hold locks around a flow (``core.effects``): the
write lock (``hold``) and the lease of who summarizes (``lease``); the flow
asks before each write whether the write lock is still held (``still_held``).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
import weakref
from collections.abc import Hashable, Iterator, Sequence
from typing import Any

from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.messages import BaseMessage

from langchain_compaction._lc.conversation import CONVERSATIONS_REMEMBERED
from langchain_compaction._lc.convert import to_core_list
from langchain_compaction._lc.counting import count_messages
from langchain_compaction._lc.identity import fingerprint
from langchain_compaction.core.bounded import Bounded
from langchain_compaction.core.effects import Call, Flow, adrive, drive, in_forked_child, twin
from langchain_compaction.core.options import CompactionOptions
from langchain_compaction.core.types import Message
from langchain_compaction.errors import CompactionError, StoreError
from langchain_compaction.history import stores
from langchain_compaction.history.journal import Rewrite
from langchain_compaction.history.locks import AsyncHeld, CompactionLock, Held, InProcessLock, LeaseLock, poll


class StoredCounts:
    """Token counts of a stored history, kept between reads of it.

    A chat-history store hands back fresh objects on every read, so identity
    and ids (often missing there) cannot say what was counted before. A store
    only grows at its end between compactions, though: when the messages at a
    few telling places of the previously known list are unchanged (their
    ``fingerprint``: the first, the first after the leading system messages,
    where a summary sits and every compaction writes a new one, the two after
    it, and the last), only the messages after it are counted. Anything else
    counts everything again, as does ``forget`` (called on every rewrite this
    process makes). An older message edited in place under its id is not
    noticed here: these counts only decide when to compact, and a compaction
    converts and counts every message afresh.
    """

    def __init__(self) -> None:
        self._known: tuple[CompactionOptions, int, dict[int, str], list[int], list[Message]] | None = None

    def forget(self) -> None:
        """Count everything at the next call (the store was rewritten)."""
        self._known = None

    @staticmethod
    def _marks(messages: Sequence[BaseMessage], core: Sequence[Message]) -> dict[int, str]:
        lead = next((i for i, m in enumerate(core) if m.role != "system"), len(core))
        places = {0, lead, lead + 1, lead + 2, len(messages) - 1}
        return {i: fingerprint(messages[i]) for i in places if 0 <= i < len(messages)}

    def counts_and_core(
        self, messages: Sequence[BaseMessage], options: CompactionOptions
    ) -> tuple[list[int], list[Message]]:
        """Counts and core forms of ``messages``, counting only what is new since the last call.

        Args:
            messages: The store's messages, as just read.
            options: The options in force (their counter counts).

        Returns:
            One count and one core message per message.
        """
        known = self._known  # one read: another thread may replace it
        start, counts, core = 0, [], []
        if (
            known is not None
            and known[0] is options
            and 0 < known[1] <= len(messages)
            and all(fingerprint(messages[i]) == mark for i, mark in known[2].items())
        ):
            start, counts, core = known[1], known[3], known[4]
        fresh = to_core_list(messages[start:])
        counts = [*counts, *count_messages(messages[start:], fresh, options)]
        core = [*core, *fresh]
        self._known = (options, len(messages), self._marks(messages, core), counts, core) if messages else None
        return list(counts), list(core)


class Flight:
    """One compaction of a session at a time in this process (threads and tasks).

    A plain lock an async task can poll. A blocking wait for it on the thread of
    an event loop whose task holds it would never end, so it raises instead.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._task_thread: int | None = None

    def take(self, wait: bool) -> bool:
        """Take the flight (or wait for it); whether it was taken."""
        if wait and self._task_thread == threading.get_ident():
            msg = (
                "compact() was called on the event loop's thread while an acompact() or aadd_messages() of the "
                "same session is compacting; waiting here would deadlock the loop: use acompact() in async code"
            )
            raise CompactionError(msg)
        return self._lock.acquire(blocking=wait)

    async def atake(self, wait: bool) -> bool:
        """The async twin of ``take``, polling while it waits."""
        if not await poll(lambda: self._lock.acquire(blocking=False), wait):
            return False
        self._task_thread = threading.get_ident()
        return True

    def release(self) -> None:
        """Let the next compaction of the session go."""
        self._task_thread = None
        self._lock.release()


class SessionState:
    """What every wrapper over one session in this process shares."""

    def __init__(self, owner: weakref.ref[BaseChatMessageHistory] | None = None) -> None:
        self.owner = owner
        """For a store known only as an object (no session id or path), that object."""
        self.lock = InProcessLock()
        self.flight = Flight()
        self._pending: Rewrite | None = None
        self.archive_memo: tuple[str, ...] | None = None
        self.counted = StoredCounts()
        self.prepared: Any = None
        """This session's preparations (``PrepareAhead.sharing``): a wrapper made per call finds the last one's."""

    @property
    def pending(self) -> Rewrite | None:
        """A rewrite that was started and not finished (what the next call finishes)."""
        return self._pending

    @pending.setter
    def pending(self, value: Rewrite | None) -> None:
        # While a rewrite is pending this state must outlive every wrapper
        # (RunnableWithMessageHistory makes a new one per call): the next
        # wrapper over the session finishes it from here.
        self._pending = value
        with _SESSIONS_GUARD:
            if value is None:
                _UNFINISHED.discard(self)
            else:
                _UNFINISHED.add(self)


_SESSIONS: weakref.WeakValueDictionary[Hashable, SessionState] = weakref.WeakValueDictionary()
_UNFINISHED: set[SessionState] = set()
_SESSIONS_GUARD = threading.Lock()


_RECENT: Bounded[SessionState] = Bounded(CONVERSATIONS_REMEMBERED)
"""The sessions used last, held: ``RunnableWithMessageHistory`` makes a wrapper per call and drops it,
and the next one finds the session's counts and preparations where the last left them."""


@in_forked_child
def _after_fork_in_child() -> None:
    # A process forked while one of its threads compacted a session (a worker
    # pool, multiprocessing's default on Linux) gets that session's locks held
    # by a thread it does not have: compact() hung and add_messages never
    # compacted again. The child starts with every session free.
    global _SESSIONS_GUARD  # noqa: PLW0603 (a module-level lock, made anew)
    _SESSIONS_GUARD = threading.Lock()
    _RECENT.after_fork()
    for state in {*_SESSIONS.values(), *_UNFINISHED}:
        state.lock = InProcessLock()
        state.flight = Flight()


def session_state(inner: BaseChatMessageHistory) -> SessionState:
    """The state every wrapper over ``inner``'s session in this process shares."""
    key = stores.session_key(inner)
    owner = weakref.ref(inner) if isinstance(key, tuple) and key[:1] == ("object",) else None
    with _SESSIONS_GUARD:
        state = _SESSIONS.get(key)
        if state is not None and state.owner is not None and state.owner() is not inner:
            state = None  # another object at a reused address: the state was the one gone
        if state is None:
            state = _SESSIONS[key] = SessionState(owner)
    _RECENT.put(key, state)
    return state


# -- calls that hold locks around a flow ------------------------------------------------


@contextlib.contextmanager
def _failing(lock: CompactionLock, what: str, outcome: str) -> Iterator[None]:
    """Around a step of ``lock``: its failure (its database down, say) is a ``StoreError`` saying ``outcome``."""
    try:
        yield
    except CompactionError:
        raise
    except Exception as error:
        msg = f"{what} {type(lock).__name__} failed ({type(error).__name__}: {error}); {outcome}"
        raise StoreError(msg, operation="lock") from error


def _taking(lock: CompactionLock) -> contextlib.AbstractContextManager[None]:
    """Around taking ``lock``: a lock that cannot be taken is a ``StoreError``."""
    outcome = (
        "nothing was read or written under it, and no message was lost: call again once the lock's service is back"
    )
    return _failing(lock, "taking the lock", outcome)


_HELD: contextvars.ContextVar[tuple[tuple[CompactionLock, Any], ...]] = contextvars.ContextVar(
    "langchain_compaction_held", default=()
)
"""The locks the running flow is driven under, each with what its ``hold()`` yielded (``still_held`` asks them).
A context variable: the flow is made before its locks are taken, and a task or thread that drives it gets its own."""


def _check_held(operation: str) -> None:
    for lock, held in _HELD.get():
        if isinstance(held, Held):
            with _failing(lock, "checking the lock", _lost(operation)):
                held.check()


async def _acheck_held(operation: str) -> None:
    for lock, held in _HELD.get():
        if isinstance(held, AsyncHeld):
            with _failing(lock, "checking the lock", _lost(operation)):
                await held.acheck()


def _lost(operation: str) -> str:
    """What a lock lost before ``operation`` means for the caller: whether to call again.

    Only the add's own write not made asks for the call again: after it, the
    messages are stored, and adding them again would store them twice.
    """
    said = (
        "it was lost while held (the server frees it with its connection), so another writer may be in; this writer "
        f"stopped before its next write ({operation}). No message was lost"
    )
    if operation == "add_messages":
        return f"{said}, and the messages given were not stored: add them again"
    return (
        f"{said}: what was written stands (an add's messages are stored: do not add them again), and a rewrite it "
        "left unfinished is finished by the next call"
    )


def still_held(operation: str) -> Call[None]:
    """A step, right before a write (``operation``): a ``StoreError`` if a lock the flow runs under was lost."""
    return twin(_check_held, _acheck_held, operation)


def hold(locks: Sequence[CompactionLock], flow: Flow[Any]) -> Any:
    """Drive ``flow`` holding each of ``locks``' write lock, in order."""
    with contextlib.ExitStack() as stack:
        held = []
        for lock in locks:
            with _taking(lock):
                held.append((lock, stack.enter_context(lock.hold())))
        token = _HELD.set(tuple(held))
        try:
            return drive(flow)
        finally:
            _HELD.reset(token)


async def ahold(locks: Sequence[CompactionLock], flow: Flow[Any]) -> Any:
    """The async twin of ``hold``; a cancelled caller keeps the locks until the flow has ended."""
    async with contextlib.AsyncExitStack() as stack:
        held = []
        for lock in locks:
            with _taking(lock):
                held.append((lock, await stack.enter_async_context(lock.ahold())))
        # The flow's task takes a copy of this context, with the locks it runs under.
        token = _HELD.set(tuple(held))
        try:
            task = asyncio.ensure_future(adrive(flow))
        finally:
            _HELD.reset(token)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            # A store write may be running in a worker thread (threads cannot
            # be cancelled): hold the locks until the flow has ended, so no
            # other writer gets in under a write still landing.
            while not task.done():
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.wait({task})
            raise


def leased(lock: LeaseLock | None, wait: bool, flow: Flow[Any]) -> Any:
    """Drive ``flow`` holding ``lock``'s lease (``None``: without one); ``None`` if another holds it."""
    if lock is None:
        return drive(flow)
    with lock.lease(wait) as held:
        return drive(flow) if held else None


async def aleased(lock: LeaseLock | None, wait: bool, flow: Flow[Any]) -> Any:
    """The async twin of ``leased``."""
    if lock is None:
        return await adrive(flow)
    async with lock.alease(wait) as held:
        return await adrive(flow) if held else None
