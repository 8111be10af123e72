"""Prepared summaries: made in the background before the threshold, applied at it without waiting.

With ``CompactionOptions(prepare_at=0.7)``, once the context passes 70% of
the threshold an adapter starts the compaction it would make now (the same
cut, summary, checked facts) in the background (a daemon thread on sync paths,
a task on async ones) while the agent goes on. At the threshold the prepared
result is applied at once if the messages it was made from are unchanged
(same ids and content, compared by ``fingerprint``): its summary, then
everything after its cut. The agent went on meanwhile, so when that would not
land under the landing target, the messages between the prepared cut and
today's are folded in by one ordinary compaction that updates the prepared
summary (a small request, never a full re-summary).

A preparation still running at the threshold is waited for at most
``wait_seconds`` (``PREPARE_WAIT_SECONDS`` by default); then, and whenever a
preparation failed or its prefix changed, the threshold compacts on the spot
as before. Nothing a preparation does surfaces in a turn: its failures are
logged, its thread is a daemon (a blocked HTTP call is abandoned, never
awaited), and a task whose event loop closes (``asyncio.run`` per turn) is
simply gone. At most one preparation per thread runs in a process; across
processes a lease (``history.locks``' ``LeaseLock``) may say who prepares.

Where a prepared summary is kept: in the adapter, and, when the user opts in
and the graph has a LangGraph store, in the store under
``("compaction_prepared", <thread label>)`` keyed by the digest of the prefix
it was made from, so another worker or a restarted process applies it.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar, cast

from langchain_core.messages import BaseMessage, messages_from_dict, messages_to_dict

from langchain_compaction._lc.convert import fingerprint
from langchain_compaction._lc.threads import thread_label
from langchain_compaction.core.effects import Flow, adrive, drive
from langchain_compaction.core.result import CompactionResult

logger = logging.getLogger("langchain_compaction")

PREPARE_WAIT_SECONDS = 5.0
"""How long a turn at the threshold waits for a preparation still running, by default."""

PREPARE_EVENT = "langchain_compaction_prepare"
"""Name of the custom event (and custom-stream key) a turn that starts a preparation sends."""

STORE_NAMESPACE = "compaction_prepared"
"""First label of the store namespace prepared summaries are kept under."""


def prefix_digest(messages: Sequence[BaseMessage]) -> str:
    """The identity of a list of messages: a digest of their fingerprints, in order."""
    digest = hashlib.blake2b(digest_size=16)
    for message in messages:
        digest.update(fingerprint(message).encode("ascii"))
    return digest.hexdigest()


@dataclass(frozen=True, slots=True)
class PreparedSummary:
    """A compaction made from the first ``size`` messages of a conversation.

    It holds only what it wrote (the summary, and the bridge if any) and the
    positions of what it kept, so it applies to the caller's current objects.

    Attributes:
        size: How many messages it was made from.
        digest: ``prefix_digest`` of those messages.
        head: Positions of the leading messages kept before the summary.
        written: What the compaction wrote (the summary, the bridge).
        kept: Positions of the messages kept after it.
        result: The compaction's figures, as made.
        written_tokens: What ``written`` counts.
    """

    size: int
    digest: str
    head: tuple[int, ...]
    written: tuple[BaseMessage, ...]
    kept: tuple[int, ...]
    result: CompactionResult
    written_tokens: int = 0

    @classmethod
    def of(
        cls,
        snapshot: Sequence[BaseMessage],
        result: CompactionResult,
        output: Sequence[BaseMessage],
        written_tokens: int = 0,
    ) -> PreparedSummary:
        """The prepared form of compacting ``snapshot`` into ``output``."""
        where = {id(m): i for i, m in enumerate(snapshot)}
        first_written = next(i for i, m in enumerate(output) if id(m) not in where)
        written = [m for m in output if id(m) not in where]
        after = first_written + len(written)
        return cls(
            size=len(snapshot),
            digest=prefix_digest(snapshot),
            head=tuple(where[id(m)] for m in output[:first_written]),
            written=tuple(written),
            kept=tuple(where[id(m)] for m in output[after:]),
            result=result,
            written_tokens=written_tokens,
        )

    def matches(self, messages: Sequence[BaseMessage]) -> bool:
        """Whether ``messages`` starts with the very messages it was made from."""
        return len(messages) >= self.size and prefix_digest(messages[: self.size]) == self.digest

    def output_for(self, messages: Sequence[BaseMessage]) -> list[BaseMessage]:
        """The compacted conversation: its output over ``messages``' own objects, then what came after."""
        return [
            *(messages[i] for i in self.head),
            *self.written,
            *(messages[i] for i in self.kept),
            *messages[self.size :],
        ]

    def tokens_for(self, counts: Sequence[int]) -> int:
        """What ``output_for`` would count, from the per-message ``counts`` of the conversation now."""
        kept = sum(counts[i] for i in self.head) + sum(counts[i] for i in self.kept)
        return kept + self.written_tokens + sum(counts[self.size :])

    def to_value(self) -> dict[str, Any]:
        """The JSON value kept in a LangGraph store."""
        return {
            "size": self.size,
            "digest": self.digest,
            "head": list(self.head),
            "written": messages_to_dict(list(self.written)),
            "kept": list(self.kept),
            "result": self.result.to_dict(),
            "written_tokens": self.written_tokens,
        }

    @classmethod
    def from_value(cls, value: dict[str, Any]) -> PreparedSummary:
        """Read back ``to_value``; raises ``KeyError``/``TypeError``/``ValueError`` on a foreign value."""
        return cls(
            size=int(value["size"]),
            digest=str(value["digest"]),
            head=tuple(int(i) for i in value["head"]),
            written=tuple(messages_from_dict(value["written"])),
            kept=tuple(int(i) for i in value["kept"]),
            result=CompactionResult(**value["result"]),
            written_tokens=int(value.get("written_tokens", 0)),
        )


class Prepared(Protocol):
    """What a preparation makes: it says whether it still applies to the conversation."""

    def matches(self, messages: Sequence[BaseMessage]) -> bool:
        """Whether it was made from a prefix of ``messages`` that is unchanged."""
        ...


_P = TypeVar("_P", bound=Prepared)


@dataclass(slots=True)
class _Preparation(Generic[_P]):
    """One preparation in this process: running, finished or failed."""

    done: threading.Event = field(default_factory=threading.Event)
    value: _P | None = None
    task: asyncio.Task[None] | None = None


LeaseFactory = Callable[[str], Any]
"""Gives the lease (a ``LeaseLock``) that says which process prepares a thread's summary."""


class Preparer(Generic[_P]):
    """Starts, keeps and hands out prepared summaries for one adapter.

    Args:
        compact: Prepares the compaction of a snapshot, as a flow (the
            adapter's ordinary pipeline with a forced trigger): ``None`` when
            there is nothing to compact. What it makes is kept in a LangGraph
            store only if it is a ``PreparedSummary``.
        wait_seconds: How long a turn at the threshold waits for a running
            preparation.
        lease: Gives a cross-process lease per thread (``LeaseLock``), if
            several processes serve the same threads.
    """

    def __init__(
        self,
        compact: Callable[[list[BaseMessage], _P | None], Flow[_P | None]],
        *,
        wait_seconds: float = PREPARE_WAIT_SECONDS,
        lease: LeaseFactory | None = None,
    ) -> None:
        self._compact = compact
        self.wait_seconds = wait_seconds
        self._lease = lease
        self._lock = threading.Lock()
        self._by_thread: dict[str, _Preparation[_P]] = {}
        self.started = 0
        """Preparations started by this adapter (for figures and tests)."""

    # -- starting ----------------------------------------------------------------------

    def _claim(self, thread: str, base: _P | None) -> _Preparation[_P] | None:
        """A new preparation for ``thread``, unless it has one (running, finished or failed).

        One per thread until the threshold takes it: a finished one waits to
        be applied, and a failed one is not retried every turn (the threshold
        compacts on the spot). The exception is a finished one given as
        ``base``: the new preparation builds on it.
        """
        with self._lock:
            current = self._by_thread.get(thread)
            if current is not None and (base is None or current.value is not base):
                return None
            claim: _Preparation[_P] = _Preparation()
            self._by_thread[thread] = claim
            self.started += 1
            return claim

    def finished(self, thread: str) -> _P | None:
        """The preparation made for ``thread`` in this process, if it finished and has not been taken."""
        with self._lock:
            current = self._by_thread.get(thread)
        return current.value if current is not None and current.done.is_set() else None

    def start(self, thread: str, messages: Sequence[BaseMessage], store: Any = None, base: _P | None = None) -> bool:
        """Start preparing ``messages`` in a daemon thread; whether one was started.

        Args:
            thread: The conversation's key (its thread id).
            messages: The conversation now.
            store: A LangGraph store to keep the result in too, if any.
            base: A finished preparation to build on (the conversation went
                on since it was made), instead of starting from scratch.
        """
        claim = self._claim(thread, base)
        if claim is None:
            return False
        found = None if base is not None or store is None else store.search(namespace(thread), limit=_STORED)
        if found is not None and self._adopt(claim, self._stored(found, messages)):
            return False
        worker = threading.Thread(
            target=self._run,
            args=(thread, claim, list(messages), store, base),
            name="langchain-compaction-prepare",
            daemon=True,
        )
        worker.start()
        return True

    async def astart(
        self, thread: str, messages: Sequence[BaseMessage], store: Any = None, base: _P | None = None
    ) -> bool:
        """The async twin of ``start``: the preparation is a task of the running loop."""
        claim = self._claim(thread, base)
        if claim is None:
            return False
        if base is None and store is not None:
            found = self._stored(await store.asearch(namespace(thread), limit=_STORED), messages)
            if self._adopt(claim, found):
                return False
        run = self._arun(thread, claim, list(messages), store, base)
        claim.task = asyncio.get_running_loop().create_task(run)
        return True

    def _adopt(self, claim: _Preparation[_P], found: _P | None) -> bool:
        """Take over one another worker already prepared and kept in the store; whether there was one."""
        if found is None:
            return False
        claim.value = found
        claim.done.set()
        with self._lock:
            self.started -= 1  # not started here
        return True

    def _lease_for(self, thread: str) -> AbstractContextManager[bool]:
        return self._lease(thread).lease(wait=False) if self._lease is not None else nullcontext(True)

    def _run(
        self, thread: str, claim: _Preparation[_P], snapshot: list[BaseMessage], store: Any, base: _P | None
    ) -> None:
        try:
            with self._lease_for(thread) as held:
                if held:
                    claim.value = drive(self._compact(snapshot, base))
            value = claim.value
            if isinstance(value, PreparedSummary) and store is not None:
                store.put(namespace(thread), value.digest, value.to_value(), index=False)
        except Exception as exc:  # never surfaces in a turn
            logger.warning("preparing a summary in the background failed; the threshold compacts as usual: %s", exc)
        finally:
            claim.done.set()

    async def _arun(
        self, thread: str, claim: _Preparation[_P], snapshot: list[BaseMessage], store: Any, base: _P | None
    ) -> None:
        try:
            lease = self._lease(thread).alease(wait=False) if self._lease is not None else None
            if lease is None:
                claim.value = await adrive(self._compact(snapshot, base))
            else:
                async with lease as held:
                    if held:
                        claim.value = await adrive(self._compact(snapshot, base))
            value = claim.value
            if isinstance(value, PreparedSummary) and store is not None:
                await store.aput(namespace(thread), value.digest, value.to_value(), index=False)
        except asyncio.CancelledError:
            logger.info("a background summary was cancelled (its event loop closed); the threshold compacts as usual")
        except Exception as exc:  # never surfaces in a turn
            logger.warning("preparing a summary in the background failed; the threshold compacts as usual: %s", exc)
        finally:
            claim.done.set()

    # -- taking ------------------------------------------------------------------------

    def _pending(self, thread: str) -> _Preparation[_P] | None:
        with self._lock:
            return self._by_thread.get(thread)

    def _settle(self, thread: str, claim: _Preparation[_P], messages: Sequence[BaseMessage]) -> _P | None:
        """The finished preparation if it still applies; it is used (or dropped) either way."""
        with self._lock:
            if self._by_thread.get(thread) is claim:
                del self._by_thread[thread]
        if not claim.done.is_set():
            logger.warning(
                "the summary being prepared was not ready within %.1f s; compacting on the spot", self.wait_seconds
            )
            return None
        value = claim.value
        if value is None:
            return None
        if not value.matches(messages):
            logger.info("a prepared summary was discarded: the messages it covers changed since")
            return None
        return value

    @staticmethod
    def _stored(items: Sequence[Any], messages: Sequence[BaseMessage]) -> _P | None:
        # Only a ``PreparedSummary`` is ever put in a store (see ``_run``).
        return cast("_P | None", matching(items, messages))

    def take(self, thread: str, messages: Sequence[BaseMessage], store: Any = None) -> tuple[_P | None, float]:
        """The prepared summary for ``messages``, waiting for a running one up to ``wait_seconds``.

        Args:
            thread: The conversation's key.
            messages: The conversation now.
            store: A LangGraph store another worker may have kept one in.

        Returns:
            The summary (``None`` when there is none that applies) and the
            seconds waited.
        """
        claim = self._pending(thread)
        started = time.monotonic()
        if claim is not None:
            claim.done.wait(self.wait_seconds)
            found = self._settle(thread, claim, messages)
        else:
            found = None if store is None else self._stored(store.search(namespace(thread), limit=_STORED), messages)
        if store is not None:
            for item in store.search(namespace(thread), limit=_STORED):
                store.delete(namespace(thread), item.key)  # applied now, or stale
        return found, time.monotonic() - started

    async def atake(self, thread: str, messages: Sequence[BaseMessage], store: Any = None) -> tuple[_P | None, float]:
        """The async twin of ``take``."""
        claim = self._pending(thread)
        started = time.monotonic()
        if claim is not None:
            task = claim.task
            if task is not None and task.get_loop().is_closed():
                claim.done.set()  # its loop closed under it: it will never finish
            if task is not None and not claim.done.is_set() and task.get_loop() is asyncio.get_running_loop():
                await asyncio.wait({task}, timeout=self.wait_seconds)
            elif not claim.done.is_set():
                # A thread (or a task of another loop): wait without holding up this one.
                await asyncio.to_thread(claim.done.wait, self.wait_seconds)
            found = self._settle(thread, claim, messages)
        else:
            found = (
                None if store is None else self._stored(await store.asearch(namespace(thread), limit=_STORED), messages)
            )
        if store is not None:
            for item in await store.asearch(namespace(thread), limit=_STORED):
                await store.adelete(namespace(thread), item.key)
        return found, time.monotonic() - started


_STORED = 20
"""Prepared summaries looked at per thread in a store (there is normally one)."""


def namespace(thread: str) -> tuple[str, str]:
    """The store namespace of ``thread``'s prepared summaries."""
    return (STORE_NAMESPACE, thread_label(thread))


def matching(items: Sequence[Any], messages: Sequence[BaseMessage]) -> PreparedSummary | None:
    """The stored summary made from a prefix of ``messages`` (the longest), if any."""
    found: list[PreparedSummary] = []
    for item in items:
        try:
            prepared = PreparedSummary.from_value(item.value)
        except (KeyError, TypeError, ValueError) as exc:
            logger.warning("ignored a stored prepared summary this version cannot read: %s", exc)
            continue
        if prepared.matches(messages):
            found.append(prepared)
    return max(found, key=lambda p: p.size, default=None)
