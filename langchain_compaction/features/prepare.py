"""Summaries prepared ahead: made in the background before the threshold, applied at it without waiting.

With ``PrepareAhead(at=0.7)``, once the context passes 70% of the threshold
the turn starts the compaction it would make now (the same cut, summary and
checked facts) in the background (a daemon thread on sync paths, a task on
async ones) while the agent goes on. At the threshold the prepared result is
applied at once if the messages it was made from are unchanged (same ids and
content, compared by ``fingerprint``): its summary, then everything after its
cut. It is stamped with the conversation's record when it is applied
(``core.record``), so a preparation made before another worker's, a
``/compact`` or an overflow compaction is simply found not to match and
dropped, never applied to a list it does not describe.

What a process keeps is a cache: one entry per conversation
(``_lc.conversation.Conversation``), at most ``remember`` of them, checked
against the conversation before use. With ``in_store=True`` a finished
preparation is also kept in the graph's LangGraph store under
``("compaction_prepared", <thread>, <namespace>...)``, keyed by the digest of
the messages it was made from, so another worker or a restarted process
applies it. Nothing a preparation does surfaces in a turn: a failure, a store
that fails, a lease held elsewhere, a closed event loop or a cancelled task is
logged and the threshold compacts on the spot.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

from langchain_core.messages import BaseMessage

from langchain_compaction._lc.conversation import CONVERSATIONS_REMEMBERED, Conversation, opening
from langchain_compaction.core.bounded import Bounded
from langchain_compaction.core.effects import Flow, adrive, drive, in_forked_child, twin
from langchain_compaction.core.options import Budget, CompactionOptions, check_int, check_seconds
from langchain_compaction.errors import ConfigurationError
from langchain_compaction.features.base import Feature
from langchain_compaction.features.prepared import (
    PreparedSummary,
    mark_applied,
    read_prepared,
    write_prepared,
)

logger = logging.getLogger("langchain_compaction")

PREPARE_WAIT_SECONDS = 5.0
"""How long a turn at the threshold waits for a preparation still running, by default."""

LeaseFactory = Callable[[str], Any]
"""Gives the lease (a ``LeaseLock``) that says which process prepares a conversation's summary."""

_ADVICE = (
    "pass a share of the threshold above the landing (half the threshold) and below 1, e.g. 0.7, "
    "or leave PrepareAhead out to summarize at the threshold"
)


@dataclass(slots=True)
class _Preparation:
    """One preparation in this process: running, finished or failed."""

    origin: str
    done: threading.Event = field(default_factory=threading.Event)
    value: PreparedSummary | None = None
    task: asyncio.Task[None] | None = None
    # A turn stopped waiting for it (it is counted when it finishes); its task was cancelled.
    abandoned: bool = False
    counted: bool = False
    cancelled: bool = False
    told: bool = False  # (that its loop closed: said once, by the next compaction of its conversation)

    @property
    def closed(self) -> bool:
        """Whether it was cancelled with its event loop, closed since (``asyncio.run`` per turn).

        Told only after the fact: a loop shutting down cancels its tasks as
        any caller may, and is closed by the next turn, which runs on another.
        """
        return self.cancelled and self.task is not None and self.task.get_loop().is_closed()


_SETTLING = threading.Lock()
"""Held while an abandoned preparation is counted: by the turn that left it, or by the run as it finishes."""


_UNSTORED: weakref.WeakSet[Bounded[_Preparation]] = weakref.WeakSet()
"""The features with ``in_store=True`` that said they ran without a store (by their preparations)."""
_CACHES: weakref.WeakSet[Bounded[_Preparation]] = weakref.WeakSet()
"""Every live feature's preparations, for a forked child to drop those still running."""


@in_forked_child
def _after_fork_in_child() -> None:
    # The threads and event loops running preparations did not come along: a
    # preparation left running would make every threshold turn wait for it.
    for cache in list(_CACHES):
        cache.after_fork()
        cache.retain(lambda preparation: preparation.done.is_set())


Compact = Callable[[list[BaseMessage], "PreparedSummary | None"], Flow["PreparedSummary | None"]]
"""Makes the preparation of a snapshot (the turn's own compaction, forced), on top of an earlier one if given."""


@dataclass(frozen=True, slots=True)
class _Run:
    """One preparation to run in the background: how, for which conversation, from what."""

    compact: Compact
    conversation: Conversation
    claim: _Preparation
    snapshot: list[BaseMessage]
    base: PreparedSummary | None
    store: Any


@dataclass(frozen=True, slots=True)
class PrepareAhead(Feature):
    """Prepare the next compaction in the background, and apply it at the threshold without waiting.

    Attributes:
        at: Where a preparation starts: past this share of the threshold when
            nothing is fixed (above the landing, half the threshold); a long
            system prompt or many tools raise the landing, and the mark keeps
            its place between the landing and the threshold (``mark_for``).
        wait: How many seconds a turn at the threshold waits for a
            preparation still running before it compacts on the spot.
        in_store: Also keep a finished preparation in the graph's LangGraph
            store, so another worker or a restarted process applies it.
        lease: With several processes serving the same threads, a function
            from a conversation's key (its thread id) to a lock with a lease
            (``history.FileLock``, ``history.PostgresAdvisoryLock``) that says
            which process prepares it.
        remember: How many conversations' preparations a process keeps (the
            least recently used are dropped past it).

    Its record in ``CompactionResult.parts["prepared"]``: ``applied`` (the
    compaction applied a preparation) and ``waited`` (seconds the turn waited
    for it).

    Example:
        >>> PrepareAhead(at=0.7).bind(CompactionOptions(context_window=24_000)).mark
        14700
    """

    name: ClassVar[str] = "prepared"
    at: float = 0.7
    wait: float = PREPARE_WAIT_SECONDS
    in_store: bool = False
    lease: LeaseFactory | None = None
    remember: int = CONVERSATIONS_REMEMBERED
    mark: int | None = field(default=None, init=False, compare=False)
    # Set in __post_init__, sized by ``remember``.
    _cache: Bounded[_Preparation] = field(init=False, repr=False, compare=False)
    _spent: Bounded[tuple[int, int]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        share = self.at
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not 0.5 < share < 1:
            raise ConfigurationError("at", share, _ADVICE)
        check_seconds("wait", self.wait, f"pass seconds (0 or more; {PREPARE_WAIT_SECONDS} by default)", zero=True)
        if not isinstance(self.in_store, bool):
            raise ConfigurationError("in_store", self.in_store, "pass True or False")
        if self.lease is not None and not callable(self.lease):
            raise ConfigurationError("lease", self.lease, "pass a function from a thread id to a lock, or None")
        check_int("remember", self.remember, minimum=1, advice="a positive number of conversations")
        object.__setattr__(self, "_cache", Bounded(self.remember))
        object.__setattr__(self, "_spent", Bounded(self.remember))
        _CACHES.add(self._cache)

    def bind(self, options: CompactionOptions) -> PrepareAhead:
        """This feature with its mark worked out for ``options`` (the same cache: preparations carry over)."""
        mark = self.mark_for(options.budget)
        if mark is not None and options.budget.landing is not None and mark <= options.budget.landing:
            raise ConfigurationError("at", self.at, _ADVICE)  # (rounded onto the landing: no room to prepare in)
        return self._copy(mark=mark)

    def _copy(self, **changes: Any) -> PrepareAhead:
        """This feature with ``changes`` made (its fields are set once, in ``__post_init__``, or here)."""
        copy = PrepareAhead.__new__(PrepareAhead)
        for name in ("at", "wait", "in_store", "lease", "remember", "mark", "_cache", "_spent"):
            object.__setattr__(copy, name, changes.get(name, getattr(self, name)))
        return copy

    def sharing(self, holder: Any) -> PrepareAhead:
        """This feature keeping its preparations in ``holder.prepared`` (made there if missing).

        Chat memory's wrappers over one session share them: ``RunnableWithMessageHistory``
        makes a wrapper per call, and a preparation started under one is applied under the next.
        """
        caches = holder.prepared
        if caches is None:
            caches = holder.prepared = (self._cache, self._spent)
        return self._copy(_cache=caches[0], _spent=caches[1])

    def mark_for(self, budget: Budget) -> int | None:
        """The size past which a summary is prepared under ``budget`` (``None`` without a window).

        ``at`` is a share of the threshold when nothing is fixed, where the
        landing is half of it. A fixed part (a long system prompt, many tools)
        raises the landing, and the mark keeps its place between the landing
        and the threshold: a compaction must not land past the mark, or the
        next preparation would start on the turn after it.
        """
        if budget.threshold is None or budget.landing is None:
            return None
        return budget.landing + round((budget.threshold - budget.landing) * (2 * self.at - 1))

    # -- what a turn asks ---------------------------------------------------------------

    def finished(self, conversation: Conversation, messages: Sequence[BaseMessage]) -> PreparedSummary | None:
        """The preparation finished for this conversation, if it still matches ``messages`` (else it is dropped)."""
        claim = self._cache.get(conversation.key)
        if claim is None or not claim.done.is_set() or claim.value is None:
            return None
        if claim.value.matches(messages):
            return claim.value
        self._cache.pop(conversation.key, claim)  # made from messages that are no longer there
        self._discard(conversation, claim.value)
        return None

    def _discard(self, conversation: Conversation, prepared: PreparedSummary) -> None:
        """Count what a preparation that will never be applied cost (the next compaction reports it).

        One kept in the store may be applied by another worker, whose result
        reports its calls: it is counted only when a worker prunes it from the
        store unapplied.
        """
        if not prepared.shared:  # one in the store is counted when it is pruned unapplied (``_read_store``)
            self._count(conversation, prepared.result.summarizer_calls, prepared.result.summarizer_input_tokens)

    def _count(self, conversation: Conversation, calls: int, sent: int) -> None:
        if calls or sent:
            before = self._spent.get(conversation.key) or (0, 0)
            self._spent.put(conversation.key, (before[0] + calls, before[1] + sent))

    def _settle(self, conversation: Conversation, claim: _Preparation) -> None:
        """Count an abandoned preparation once it has finished (asked by the turn that left it, and by its run)."""
        with _SETTLING:
            if claim.counted or not claim.abandoned or not claim.done.is_set() or claim.value is None:
                return
            claim.counted = True
        self._discard(conversation, claim.value)

    def running(self, conversation: Conversation) -> bool:
        """Whether a preparation of this conversation is under way in this process."""
        claim = self._cache.get(conversation.key)
        return claim is not None and not claim.done.is_set()

    def ahead(
        self,
        compact: Compact,
        conversation: Conversation,
        messages: Sequence[BaseMessage],
        base: PreparedSummary | None,
        store: Any = None,
    ) -> Flow[bool]:
        """Start preparing ``messages`` in the background (on top of ``base``); whether one was started.

        A running preparation of the conversation is left to finish; a stored
        one that another worker made for these messages is adopted instead.
        """
        if self.in_store and store is None and self._cache not in _UNSTORED:
            _UNSTORED.add(self._cache)  # (said once per feature)
            logger.warning(
                "PrepareAhead(in_store=True) runs on a graph without a LangGraph store, so its preparations are "
                "kept in this process only; compile(store=...) (or create_agent(store=...)) to share them"
            )
        claim = self._claim(conversation, messages, base)
        if claim is None:
            return False
        if base is None and self.in_store and store is not None:
            found, _ = yield from read_prepared(store, conversation, messages)
            if found is not None:
                claim.value = found
                claim.done.set()
                return False
        try:
            run = _Run(compact, conversation, claim, list(messages), base, store)
            started: bool = yield twin(self._start, self._astart, run)
        except Exception as exc:  # never surfaces in a turn: the threshold compacts as usual
            logger.warning("could not start preparing a summary (%s: %s)", type(exc).__name__, exc)
            self._cache.pop(conversation.key, claim)
            return False
        return started

    def take(
        self, conversation: Conversation, messages: Sequence[BaseMessage], store: Any = None, *, wait: bool = True
    ) -> Flow[tuple[PreparedSummary | None, float, tuple[int, int]]]:
        """The preparation for ``messages``, the seconds waited, and what discarded ones cost (calls, tokens sent).

        A running preparation is waited for up to ``wait`` seconds, or, with
        ``wait=False``, left running (it is applied on a later turn).
        """
        started = time.monotonic()
        claim = self._held(conversation)
        if claim is not None and not wait and not claim.done.is_set():
            return None, 0.0, (0, 0)  # left to finish (what discarded ones cost waits for the compaction reporting it)
        if claim is not None and claim.closed:
            # It stays, so this conversation is not prepared ahead here again (``_claim``); the store is still read.
            if not claim.told:
                claim.told = True
                logger.warning(
                    "a summary being prepared for this conversation was cancelled: its event loop closed before it "
                    "finished and this compaction runs on another (asyncio.run per turn?), so it is no longer prepared "
                    "ahead in this process and the threshold compacts on the spot; run its turns on one event loop"
                )
            claim = None
        if claim is not None and not claim.done.is_set():
            yield twin(_wait, _await, claim, self.wait)
        found = None
        if claim is not None:
            self._cache.pop(conversation.key, claim)
            if not claim.done.is_set():
                logger.warning(
                    "the summary being prepared was not ready within %g s; compacting on the spot", self.wait
                )
                claim.abandoned = True
                self._settle(conversation, claim)  # (what it sends is reported by a later compaction)
            elif claim.value is not None and claim.value.matches(messages):
                found = claim.value
            elif claim.value is not None:
                logger.info("a prepared summary was discarded: the messages it covers changed since")
                self._discard(conversation, claim.value)
        if self.in_store and store is not None:
            stored, pruned = yield from read_prepared(store, conversation, messages, prune=True)
            self._count(conversation, *pruned)
            # The store's copy first: every worker (and a retried turn) then
            # applies the same preparation, so a compaction keeps one id.
            if stored is not None and found is not None and found.digest != stored.digest:
                self._discard(conversation, found)
            found = stored or found
            if found is not None and found.shared:
                yield from mark_applied(store, conversation, found)
        return found, time.monotonic() - started, self._spent.pop(conversation.key) or (0, 0)

    # -- the background run -----------------------------------------------------------------

    def _claim(
        self, conversation: Conversation, messages: Sequence[BaseMessage], base: PreparedSummary | None
    ) -> _Preparation | None:
        """A new preparation for the conversation, unless it has one.

        One per conversation until the threshold takes it: a running one is
        left to finish, a finished one waits to be applied (or, given as
        ``base``, is built on), a failed one is not retried every turn,
        unless the conversation was compacted since it started, and one whose
        event loop closed under it is not retried at all (one whose task alone
        was cancelled is, at once: ``_held``).
        """
        origin = opening(messages)
        current = self._held(conversation)
        if current is not None and (current.closed or not (current.done.is_set() and current.value is base)):
            return None
        if current is not None and base is None and current.origin == origin:
            return None  # it failed (or another process holds the lease): the threshold compacts as usual
        claim = _Preparation(origin)
        self._cache.put(conversation.key, claim)
        return claim

    def _held(self, conversation: Conversation) -> _Preparation | None:
        """The conversation's preparation, if any; one cancelled on an event loop that still runs is dropped.

        Its task was cancelled (by the program, or a server's shutdown of one
        request's tasks), not its loop closed: the next turn past the mark
        prepares again.
        """
        claim = self._cache.get(conversation.key)
        if claim is None or not claim.cancelled or claim.closed:
            return claim
        self._cache.pop(conversation.key, claim)
        logger.warning(
            "a summary being prepared for this conversation was cancelled (its task, not its event loop, which still "
            "runs): it is not applied, and the next turn past the preparation mark prepares one again"
        )
        return None

    def _lease_key(self, conversation: Conversation) -> str:
        return "|".join((conversation.thread or "", *conversation.namespace))

    def _lease_for(self, conversation: Conversation) -> AbstractContextManager[bool]:
        if self.lease is None:
            return nullcontext(True)
        return self.lease(self._lease_key(conversation)).lease(wait=False)  # type: ignore[no-any-return]

    def _prepare(self, run: _Run) -> Flow[PreparedSummary | None]:
        """Under the lease: a preparation another worker stored meanwhile, else one made now and stored.

        The store is read again once the lease is held, and written before it
        is let go: a worker that waited for the lease finds what the holder
        made instead of making it twice.
        """
        store = run.store if self.in_store else None
        if store is not None and run.base is None:
            found, _ = yield from read_prepared(store, run.conversation, run.snapshot)
            if found is not None:
                return found
        prepared = yield from run.compact(run.snapshot, run.base)
        if prepared is None or store is None:
            return prepared
        try:
            yield from write_prepared(store, run.conversation, prepared)
        except Exception as exc:  # kept in this process all the same
            logger.warning("could not keep a prepared summary in the store (%s: %s)", type(exc).__name__, exc)
            return prepared
        return replace(prepared, shared=True)

    def _start(self, run: _Run) -> bool:
        def work() -> None:
            claim = run.claim
            try:
                with self._lease_for(run.conversation) as held:
                    if held:
                        claim.value = drive(self._prepare(run))
            except Exception as exc:  # never surfaces in a turn
                _failed(exc)
            finally:
                claim.done.set()
                self._settle(run.conversation, claim)

        threading.Thread(target=work, name="langchain-compaction-prepare", daemon=True).start()
        return True

    async def _astart(self, run: _Run) -> bool:
        async def work() -> None:
            claim = run.claim
            try:
                lease = self.lease(self._lease_key(run.conversation)).alease(wait=False) if self.lease else None
                if lease is None:
                    claim.value = await adrive(self._prepare(run))
                else:
                    async with lease as held:
                        if held:
                            claim.value = await adrive(self._prepare(run))
            except asyncio.CancelledError:
                # Its loop closing, or only its task? The next look says (``closed``, ``_held``): a program that
                # ends while a preparation runs, its turns all on one loop, is told nothing.
                claim.cancelled = True
                raise
            except Exception as exc:  # never surfaces in a turn
                _failed(exc)
            finally:
                claim.done.set()
                self._settle(run.conversation, claim)

        run.claim.task = asyncio.get_running_loop().create_task(work())
        return True


def _failed(exc: Exception) -> None:
    logger.warning(
        "preparing a summary in the background failed; the threshold compacts as usual: %s: %s", type(exc).__name__, exc
    )


def _wait(claim: _Preparation, seconds: float) -> None:
    claim.done.wait(seconds)


async def _await(claim: _Preparation, seconds: float) -> None:
    task = claim.task
    if task is not None and task.get_loop().is_closed():
        claim.done.set()  # its loop closed under it: it will never finish
        return
    if task is not None and task.get_loop() is asyncio.get_running_loop():
        await asyncio.wait({task}, timeout=seconds)
    else:
        # A thread (or a task of another loop): wait without holding up this one.
        await asyncio.to_thread(claim.done.wait, seconds)
