"""Compacting chat memory: a ``BaseChatMessageHistory`` that wraps another one.

``CompactingChatMessageHistory(inner, model, options)`` reads and appends
through ``inner`` and, when the trigger rule says the history no longer fits
``options.context_window - options.reserve_tokens``, replaces the older part
with a summary (the same pipeline as ``compact``). Afterwards ``inner`` holds
the leading system messages, the summary, the bridge user turn when the recent
messages do not start with one (``CompactionOptions.ensure_user_turn``), and
the recent messages, in order, with their ids; the next compaction updates
that summary instead of nesting it and replaces the bridge.

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
   the store, exactly once; never a summary or a bridge, which this library
   wrote. Each summary records how long the archive was after its compaction,
   so a retry after a failed rewrite (or a crash) skips the originals already
   archived. Only the first compaction of a session has no counter to go by;
   a failed rewrite there is still archived once (the process remembers), but
   a process crash between its archive write and its rewrite archives that
   first batch again on retry. The archive must be a history dedicated to
   this session and written only by this wrapper.
4. The store is rewritten with the strongest method it offers
   (``history.stores``). A store with no atomic rewrite gets ``clear()`` then
   ``add_messages()``, journaled: if a write fails, the pending rewrite is kept
   in the process and the next call (any method) finishes it, keeping messages
   appended meanwhile. To survive a process crash between the clear and the
   add, pass ``journal=`` (a history on durable storage, e.g. the same store
   under a session id of its own): the rewrite is written there first and the next
   wrapper to open the session finishes it. Without a journal such a crash
   loses the history of that session.

Concurrency: every wrapper over the same session in one process shares an
in-process lock (threads and asyncio tasks). Writers in several processes
need a cross-process ``lock=`` (``FileLock`` or ``PostgresAdvisoryLock``);
writers that bypass the wrapper can race the rewrite. Only one compaction
per session runs at a time in a process; the model is called without any
lock held, so writers are blocked only for the re-read and the rewrite.

Every method is one line over a flow (``core.effects``) driven sync or async,
so the two APIs cannot drift apart.

Upstream deprecates ``BaseChatMessageHistory`` in favour of LangGraph
persistence (subclasses do not warn, and neither does this class). For a new
LangGraph application prefer the LangGraph compaction node; use this wrapper
where a chat-history store is already the memory.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, Literal

from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.messages import BaseMessage

from langchain_compaction._lc.conversation import Conversation
from langchain_compaction._lc.convert import message_list
from langchain_compaction._lc.counting import working
from langchain_compaction._lc.legacy import adapter_keywords
from langchain_compaction._lc.turn import Adapter, Outcome, Place, Trigger, Turn
from langchain_compaction.core.effects import Call, Flow, adrive, drive, twin
from langchain_compaction.core.options import CompactionOptions
from langchain_compaction.core.recall import Lookup
from langchain_compaction.core.redact import Redactor
from langchain_compaction.core.result import CompactionResult
from langchain_compaction.core.types import Message
from langchain_compaction.errors import CompactionError, ConfigurationError
from langchain_compaction.features import Feature
from langchain_compaction.features.prepare import PrepareAhead
from langchain_compaction.features.recall import recall_from
from langchain_compaction.history import stores
from langchain_compaction.history.journal import JOURNAL_MARK, Commit, archive_memo, archived_tail
from langchain_compaction.history.locks import (
    CompactionLock,
    FileLock,
    InProcessLock,
    LeaseLock,
    PostgresAdvisoryLock,
)
from langchain_compaction.history.session import aleased, leased, session_state
from langchain_compaction.history.store import Store, check_separate

__all__ = [
    "JOURNAL_MARK",
    "CompactingChatMessageHistory",
    "CompactionLock",
    "FileLock",
    "InProcessLock",
    "OnError",
    "PostgresAdvisoryLock",
]

logger = logging.getLogger("langchain_compaction")

OnError = Literal["raise", "warn"]
"""What an automatic compaction does when it fails: raise, or log and go on."""


def _check_history(field: str, value: object) -> None:
    if value is not None and not isinstance(value, BaseChatMessageHistory):
        raise ConfigurationError(
            field,
            value,
            "pass a BaseChatMessageHistory, e.g. SQLChatMessageHistory(session_id=..., connection=...)",
        )


def _check_arguments(inner: object, archive: object, journal: object, on_error: object, lock: object) -> None:
    if inner is None:
        raise ConfigurationError("inner", inner, "pass the BaseChatMessageHistory that stores the messages")
    for field, value in (("inner", inner), ("archive", archive), ("journal", journal)):
        _check_history(field, value)
    check_separate(inner, archive, journal)  # type: ignore[arg-type]
    if on_error not in ("raise", "warn"):
        raise ConfigurationError("on_error", on_error, "pass 'raise' or 'warn'")
    if lock is not None and not isinstance(lock, CompactionLock):
        raise ConfigurationError("lock", lock, "pass an object with hold() and ahold(), e.g. FileLock(path)")
    history_file = getattr(inner, "file_path", None)
    if isinstance(lock, FileLock) and history_file is not None:
        locked = {os.path.realpath(lock.path), os.path.realpath(lock.lease_path)}
        if os.path.realpath(history_file) in locked:
            raise ConfigurationError(
                "lock",
                lock,
                "pass a lock file of its own, e.g. FileLock(f'{path}.lock'): the history file is replaced on "
                "every write, so a lock taken on it holds nothing",
            )


_TOLD_NO_WINDOW: list[bool] = []
"""Whether a history without a window was said never to compact on its own (said once in a process)."""


def _lookup(query: object, ids: object, start: object, end: object, limit: object) -> Lookup:
    """``recall``'s arguments checked: each wrong one is named, with what to pass."""
    if not isinstance(query, str):
        raise ConfigurationError("query", query, "pass the words to look for as a string ('' for none)")
    if isinstance(ids, str) or not isinstance(ids, Iterable):
        raise ConfigurationError("ids", ids, "pass a list of message ids, e.g. ids=['m3']")
    ids = tuple(ids)  # (read once: a generator is read here, not twice)
    if not all(isinstance(i, str) for i in ids):
        raise ConfigurationError("ids", ids, "pass a list of message ids, e.g. ids=['m3']")
    for field, value in (("start", start), ("end", end)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ConfigurationError(field, value, "pass a position (0 is the first archived message), or None")
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ConfigurationError("limit", limit, "pass how many messages to return (1 or more)")
    return Lookup(query, ids, start, end, limit)  # type: ignore[arg-type]


class CompactingChatMessageHistory(Store, BaseChatMessageHistory, Adapter):
    """A chat history that compacts itself when it outgrows the window.

    Args:
        inner: The store that keeps the messages (any ``BaseChatMessageHistory``).
        model: Writes the summaries: a chat model, Runnable, function from
            prompt text to text, or summarizer.
        options: Budgets and prompts; ``context_window`` must be set for
            automatic compaction (0 turns it off; ``compact()`` still works).
            ``clear_tool_outputs`` cannot be used here: chat memory always
            summarizes, so its archive receives every original.
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
            for stores without an atomic rewrite (see the module docstring);
            not the archive, which every rewrite would clear.
        features: The features (``langchain_compaction.features``): checked
            facts and pins by default; ``PrepareAhead(at=0.7)`` prepares the
            next summary during an add (every process holding the session
            prepares its own; give it a ``lease=`` of its own to have one do
            it). ``ClearToolOutputs`` and ``Archive`` are
            refused: chat memory summarizes everything and archives into
            ``archive=``.
        **deprecated: The 0.2 keyword ``prepare_wait`` (``PrepareAhead(wait=...)``).

    Raises:
        ConfigurationError: An argument is invalid.

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
        features: Sequence[Feature] | None = None,
        **deprecated: Any,
    ) -> None:
        super().__init__()
        _check_arguments(inner, archive, journal, on_error, lock)
        legacy = adapter_keywords("CompactingChatMessageHistory", deprecated, ("prepare_wait",))
        self._turn = Turn.build(model, options, fallback, features, where="history", adapter=legacy)
        self.inner = inner
        self.archive = archive
        self.journal = journal
        self.on_error: OnError = on_error
        self.lock = lock
        self._strategy: stores.Strategy = stores.strategy(inner)
        self._state = session_state(inner)
        if self._turn.options.budget.threshold is None and not _TOLD_NO_WINDOW:
            _TOLD_NO_WINDOW.append(True)  # once per process: a wrapper is made per call, per session
            logger.warning(
                "CompactingChatMessageHistory has no context_window, so it never compacts on its own (only "
                "compact() does); pass CompactionOptions(context_window=<the model's window>), e.g. 200_000 for Claude"
            )
        prepare = self._turn.feature(PrepareAhead)
        if prepare is not None:
            shared = prepare.sharing(self._state)
            self._turn = replace(self._turn, features=tuple(shared if f is prepare else f for f in self._turn.features))
        self._conversation = Conversation(f"history:{stores.session_key(inner)!r}")

    # -- the public API: one line each over the flows -----------------------------

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        """The messages of ``inner`` (an interrupted rewrite finished first)."""
        return drive(self._read_flow())

    async def aget_messages(self) -> list[BaseMessage]:
        """Await the messages of ``inner``; see ``messages``."""
        return await adrive(self._read_flow())

    def recall(
        self,
        query: str = "",
        *,
        ids: Sequence[str] = (),
        start: int | None = None,
        end: int | None = None,
        limit: int = 10,
    ) -> list[tuple[int, BaseMessage]]:
        """Compacted messages of this session read back from ``archive``, newest first.

        The same look-up as the recall tool of the LangGraph adapters
        (``langchain_compaction.archive.recall_tool(history=...)`` gives an
        agent this one): every word of ``query`` must occur; ``ids`` and the
        position range (``start`` to ``end``, inclusive; positions count the
        archive's messages from 0) narrow it further.

        Returns:
            ``(position, message)`` pairs, at most ``limit``.

        Raises:
            ConfigurationError: There is no ``archive`` to read, or an
                argument is of the wrong kind (``ids`` a string, ``limit`` below 1).
            StoreError: The archive failed to read.
        """
        return drive(self.recall_flow(_lookup(query, ids, start, end, limit)))

    async def arecall(
        self,
        query: str = "",
        *,
        ids: Sequence[str] = (),
        start: int | None = None,
        end: int | None = None,
        limit: int = 10,
    ) -> list[tuple[int, BaseMessage]]:
        """The async twin of ``recall``."""
        return await adrive(self.recall_flow(_lookup(query, ids, start, end, limit)))

    def recall_flow(self, lookup: Lookup, redactor: Redactor | None = None) -> Flow[list[tuple[int, BaseMessage]]]:
        """``recall`` as a flow (``core.effects``), for the recall tool to drive on either path."""
        archive = self.archive
        if archive is None:
            raise ConfigurationError("archive", None, "pass archive=<a chat history> to keep compacted messages")
        stored = yield from self._io(stores.read(archive), "archive:read", archive)
        return recall_from(stored, lookup, redactor)

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Append to ``inner``, then compact if the history no longer fits.

        Raises:
            InvalidMessagesError: ``messages`` is not a list (one message: pass ``[message]``).
            StoreError: ``inner`` failed to store the messages.
            CompactionError: The automatic compaction failed (``on_error="raise"``);
                the messages were stored and the store is otherwise unchanged.
        """
        drive(self._add_flow(messages))

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Await the append to ``inner``, then compact; see ``add_messages``."""
        await adrive(self._add_flow(messages))

    def clear(self) -> None:
        """Clear ``inner`` (and any interrupted rewrite); the archive is kept."""
        drive(self._clear_flow())

    async def aclear(self) -> None:
        """Await ``inner.aclear()``; see ``clear``."""
        await adrive(self._clear_flow())

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
        return drive(self._compaction(force=True, instructions=custom_instructions, wait=True))

    async def acompact(self, custom_instructions: str = "") -> CompactionResult | None:
        """The async twin of ``compact``."""
        return await adrive(self._compaction(force=True, instructions=custom_instructions, wait=True))

    def repair(self) -> bool:
        """Finish an interrupted rewrite now; ``True`` if one was pending.

        Every other method does this first, so calling it is never required.

        Raises:
            StoreError: The store still fails; the rewrite stays pending.
        """
        return drive(self._repair_flow())

    def __repr__(self) -> str:
        return f"CompactingChatMessageHistory(inner={type(self.inner).__name__}, rewrite={self._strategy!r})"

    # -- the flows ----------------------------------------------------------------

    def _read_flow(self) -> Flow[list[BaseMessage]]:
        messages: list[BaseMessage] = yield self._locked(self._repaired(), write=False)
        return messages

    def _add_flow(self, messages: Sequence[BaseMessage]) -> Flow[None]:
        # (Any iterable, as every chat history takes: a generator too; one message, text or a dict is refused.)
        plain = isinstance(messages, Iterable) and not isinstance(messages, (BaseMessage, str, bytes, Mapping))
        batch = list(messages if plain else message_list(messages))
        for index, message in enumerate(batch):
            if not isinstance(message, BaseMessage):
                raise ConfigurationError(
                    f"messages[{index}]", message, "pass BaseMessage objects (e.g. HumanMessage('hi'))"
                )
        if not batch:
            return
        yield self._locked(self._append(batch), write=True)
        if self.options.budget.threshold is None:
            return
        try:
            yield from self._compaction(force=False, instructions="", wait=False)
        except CompactionError as exc:
            if self.on_error == "raise":
                raise
            logger.warning("automatic compaction failed; the history keeps growing and the next add retries: %s", exc)

    def _append(self, batch: list[BaseMessage]) -> Flow[None]:
        if self._may_be_torn:
            yield from self._repaired()
        yield from self._write(stores.append(self.inner, batch, self._strategy), "add_messages")

    def _clear_flow(self) -> Flow[None]:
        yield self._locked(self._clear(), write=True)

    def _clear(self) -> Flow[None]:
        yield from self._drop_pending()
        yield from self._write(stores.clear(self.inner), "clear")

    # -- compaction ---------------------------------------------------------------------

    def _archive(self, commit: Commit) -> Flow[int | None]:
        archive = self.archive
        if archive is None:
            return None
        existing: int = yield from self._io(stores.size(archive), "archive:size", archive)
        done = commit.already_archived(existing, self._state.archive_memo)
        grown = commit.previous_total is not None and existing > commit.previous_total
        if grown or (not done and existing and commit.previous_total is None and self._state.archive_memo is None):
            stored = yield from self._io(stores.read(archive), "archive:read", archive)  # (``archived_tail``)
            done = archived_tail(stored, commit.originals, counted=done)
        batch = commit.originals[done:]
        if batch:
            yield from self._write(stores.append(archive, batch), "archive:add_messages", archive)
        self._state.archive_memo = archive_memo(commit.originals)
        return existing + len(batch)

    def _commit(self, output: list[BaseMessage], snapshot: list[BaseMessage]) -> Flow[bool]:
        """Write a finished compaction, under the lock; ``False`` if the history changed under it."""
        current = yield from self._repaired()
        commit = Commit.build(output, snapshot, current)
        if commit is None:
            logger.warning(
                "the history changed under a compaction (cleared, or compacted by another writer); "
                "its summary was discarded and the store left as it was"
            )
            return False
        total = yield from self._archive(commit)
        yield from self._rewrite(current, commit.with_counter(total))
        self._state.archive_memo = None
        return True

    def _compaction(self, *, force: bool, instructions: str, wait: bool) -> Flow[CompactionResult | None]:
        flight = self._state.flight
        if not (yield twin(flight.take, flight.atake, wait)):
            return None  # another compaction of this session is running in this process
        try:
            # Across processes, the lease decides who summarizes. A forced
            # compaction waits for it and then reads the history (another
            # writer may have compacted meanwhile); an automatic one only
            # tries it around the summary calls, and leaves the history be
            # when another process holds it.
            lease = self.lock if isinstance(self.lock, LeaseLock) else None
            if force:
                result: CompactionResult | None = yield twin(
                    leased, aleased, lease, wait, self._turn_and_commit("force", instructions, None)
                )
                return result
            return (yield from self._turn_and_commit("auto", instructions, lease))
        finally:
            flight.release()

    def _turn_and_commit(
        self, trigger: Trigger, instructions: str, lease: LeaseLock | None
    ) -> Flow[CompactionResult | None]:
        snapshot, counted = yield self._locked(self._counted(), write=self._may_be_torn)
        place = Place(
            self._conversation, guard=lambda compaction: self._guarded(lease, compaction), refresh=self._fresh
        )
        outcome: Outcome = yield from self._turn.run(
            snapshot, place, trigger=trigger, instructions=instructions, counted=counted
        )
        return outcome.result

    def _fresh(self) -> Flow[tuple[list[BaseMessage], tuple[list[int], list[Message]]]]:
        """The history read again, first thing under the lease: another writer may have compacted meanwhile."""
        fresh: tuple[list[BaseMessage], tuple[list[int], list[Message]]] = yield self._locked(
            self._counted(), write=self._may_be_torn
        )
        return fresh

    def _guarded(self, lease: LeaseLock | None, compaction: Flow[Outcome]) -> Call[Outcome | None]:
        """The compaction and its commit, under the lease when there is one (one writer summarizes at a time)."""

        def committed() -> Flow[Outcome]:
            outcome = yield from compaction
            if outcome.result is None or outcome.messages is None or outcome.source is None:
                return Outcome()
            # The model was called with no write lock held: writers went on meanwhile.
            if (yield self._locked(self._commit(outcome.messages, outcome.source), write=True)):
                return outcome
            return Outcome()

        return twin(leased, aleased, lease, False, committed())

    def _counted(self) -> Flow[tuple[list[BaseMessage], tuple[list[int], list[Message]]]]:
        """The history now, with its counts and core forms (one read; only new messages are counted)."""
        snapshot = yield from self._repaired()
        counted = yield working(self.options, self._state.counted.counts_and_core, snapshot, self.options)
        return snapshot, counted
