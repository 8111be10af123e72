"""The archive: every compacted original kept in a LangGraph store, and read back.

With ``archive=True`` on ``CompactionNode`` or ``CompactionMiddleware`` and a
store on the graph (``compile(store=...)``, ``create_agent(store=...)``), each
message a compaction takes out of the state is written to the store before
the state is rewritten, under ``(prefix, <thread label>)`` (the label as
``_lc.threads`` encodes it), one item per message keyed by its id, with:

- ``position``: its ordinal in the whole conversation, zero-padded so a store
  that compares values as text orders it right. The summary's mark records
  the position of the first message it kept, so positions continue across
  compactions without reading the store;
- ``role``, ``compaction`` (the number of the compaction that removed it) and
  ``message`` (LangChain's message dict, ``message_to_dict``).

Exactly once: an item already there with the same position is the same
message archived by an earlier try (a retry, a restarted process), so it is
not written again; a reused id with another position is kept under its own
key, never over the earlier message. A message the library only cleared (a
tool output replaced by a placeholder) is archived when cleared, in full, and
not again when its placeholder is summarized.

Reading back (``recall_tool``) pages through the calling thread's items: a
store ignores a text query without a vector index, so keyword, id and
position look-ups are done by ``core.recall``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from langchain_core.messages import BaseMessage, message_to_dict, messages_from_dict
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.prebuilt import ToolRuntime
from langgraph.store.base import BaseStore, GetOp, Item, PutOp

from langchain_compaction._lc.convert import (
    KEPT_POSITIONS_KEY,
    NUMBER_KEY,
    POSITION_KEY,
    SUMMARY_MARK,
    is_compaction_message,
    to_core,
)
from langchain_compaction._lc.threads import thread_label, thread_of
from langchain_compaction.core.effects import Flow, adrive, drive, twin
from langchain_compaction.core.prompts import RECALL_NOTE
from langchain_compaction.core.recall import MAX_RESULTS, Archived, Lookup, render, select
from langchain_compaction.core.redact import Redactor, redact_message
from langchain_compaction.core.transcript import message_body
from langchain_compaction.errors import ConfigurationError, StoreError

logger = logging.getLogger("langchain_compaction")

ARCHIVE_NAMESPACE = "compaction_archive"
"""First label of the store namespace compacted messages are archived under, by default."""

RECALL_TOOL_NAME = "recall_messages"
"""The recall tool's name, by default."""

_PAGE = 1_000
"""Items a first read of a thread's archive asks for (grown until the archive fits)."""

_WIDTH = 12
"""Digits of a zero-padded position."""


@dataclass(frozen=True, slots=True)
class Archive:
    """Where and how compacted messages are archived in a LangGraph store.

    Attributes:
        prefix: First label of the namespace (``("compaction_archive", <thread>)``).
        index: Also index each message's text for semantic search (the store
            must be created with an ``index`` config; embedding every
            archived message costs money, so it is off by default).
        max_messages: Keep at most this many archived messages per thread,
            dropping the oldest after each compaction (``None``: all).
        ttl_minutes: Let each archived message expire after this many
            minutes, where the store supports TTL (``PostgresStore`` with a
            TTL config and its sweeper; ``InMemoryStore`` has none). ``None``
            uses the store's own default TTL, if any.
        on_error: ``"raise"`` (a failed archive write fails the compaction
            with ``StoreError`` and the state is left as it was) or ``"warn"``
            (the failure is logged and the turn goes on uncompacted).
    """

    prefix: str = ARCHIVE_NAMESPACE
    index: bool = False
    max_messages: int | None = None
    ttl_minutes: float | None = None
    on_error: Literal["raise", "warn"] = "raise"

    def __post_init__(self) -> None:
        if not isinstance(self.prefix, str) or not self.prefix or "." in self.prefix:
            raise ConfigurationError("prefix", self.prefix, "pass a non-empty namespace label without dots")
        if not isinstance(self.index, bool):
            raise ConfigurationError("index", self.index, "pass True or False")
        if self.max_messages is not None and (
            isinstance(self.max_messages, bool) or not isinstance(self.max_messages, int) or self.max_messages < 1
        ):
            raise ConfigurationError("max_messages", self.max_messages, "pass a positive number, or None for all")
        ttl = self.ttl_minutes
        if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or ttl <= 0):
            raise ConfigurationError("ttl_minutes", self.ttl_minutes, "pass minutes (more than 0), or None")
        if self.on_error not in ("raise", "warn"):
            raise ConfigurationError("on_error", self.on_error, "pass 'raise' or 'warn'")

    @classmethod
    def of(cls, value: object) -> Archive | None:
        """What an adapter's ``archive=`` argument means: ``None`` (off), or the archive's settings.

        Raises:
            ConfigurationError: ``value`` is not a bool or an ``Archive``.
        """
        if value is None or value is False:
            return None
        if value is True:
            return cls()
        if isinstance(value, Archive):
            return value
        raise ConfigurationError("archive", value, "pass True, False or Archive(...)")

    def namespace(self, thread: str) -> tuple[str, str]:
        """The namespace of ``thread``'s archive."""
        return self.prefix, thread_label(thread)


def archive_note(archive: Archive | None) -> str:
    """The line written under each summary when ``archive`` is on ("" when off)."""
    return "" if archive is None else RECALL_NOTE.format(tool=RECALL_TOOL_NAME)


# -- numbering: each message's ordinal in the whole conversation ---------------------


def _mark(message: BaseMessage) -> dict[str, Any]:
    mark = message.additional_kwargs.get(SUMMARY_MARK)
    return mark if isinstance(mark, dict) else {}


def numbering(messages: Sequence[BaseMessage]) -> tuple[list[int | None], int, int]:
    """Each message's ordinal in the whole conversation (``None`` for a summary or bridge).

    A summary's mark records the position of the first message it kept, so
    the count resumes there; leading system messages before it keep theirs.

    Returns:
        The positions, the position the next message would get, and how many
        compactions have written a summary so far.
    """
    positions: list[int | None] = []
    counter = compactions = 0
    carried: list[int] = []  # positions of what a summary kept from before its cut, in order
    for message in messages:
        if is_compaction_message(message):
            mark = _mark(message)
            position, number = mark.get(POSITION_KEY), mark.get(NUMBER_KEY)
            if isinstance(position, int) and position >= counter:
                counter = position
                kept = mark.get(KEPT_POSITIONS_KEY)
                carried = [p for p in kept if isinstance(p, int)] if isinstance(kept, list) else []
            if isinstance(number, int):
                compactions = max(compactions, number)
            positions.append(None)
            continue
        if carried:
            positions.append(carried.pop(0))
            continue
        positions.append(counter)
        counter += 1
    return positions, counter, compactions


def _cleared(message: BaseMessage) -> bool:
    return _mark(message).get("kind") == "cleared"


def leaving(before: Sequence[BaseMessage], after: Sequence[BaseMessage]) -> list[tuple[int, BaseMessage]]:
    """The messages of ``before`` a compaction takes out of the state (or clears), with their positions.

    A message stays when ``after`` holds it (the same object, or the same id
    in the same form: a checkpointer hands out copies); a cleared copy of it
    does not count, so its original is archived in full.
    """
    positions, _, _ = numbering(before)
    objects = {id(m) for m in after}
    by_id = {m.id: m for m in after if m.id}
    out = []
    for position, message in zip(positions, before, strict=True):
        if position is None or id(message) in objects or _cleared(message):
            continue
        twin_message = by_id.get(message.id) if message.id else None
        if twin_message is not None and not _cleared(twin_message):
            continue
        out.append((position, message))
    return out


# -- writing -------------------------------------------------------------------------


def _padded(position: int) -> str:
    return str(position).zfill(_WIDTH)


def _base_key(position: int, message: BaseMessage) -> str:
    return message.id or f"position-{_padded(position)}"


def _ttl(archive: Archive, store: BaseStore) -> float | None:
    if archive.ttl_minutes is not None:
        return archive.ttl_minutes
    config = getattr(store, "ttl_config", None) or {}
    default = config.get("default_ttl") if isinstance(config, dict) else None
    return float(default) if isinstance(default, (int, float)) and getattr(store, "supports_ttl", False) else None


@dataclass(frozen=True, slots=True)
class Batch:
    """What one compaction archives.

    Attributes:
        namespace: The thread's archive namespace.
        items: The messages leaving the state, with their positions (``leaving``).
        number: The number of the compaction that removes them.
    """

    namespace: tuple[str, str]
    items: Sequence[tuple[int, BaseMessage]]
    number: int

    def gets(self) -> list[GetOp]:
        """Reads of the keys the items would take."""
        return [GetOp(self.namespace, _base_key(p, m)) for p, m in self.items]

    def puts(self, archive: Archive, store: BaseStore, found: Sequence[Item | None]) -> list[PutOp]:
        """The writes that archive the items, given what their keys already hold (``found``)."""
        ttl = _ttl(archive, store)
        puts = []
        for (position, message), existing in zip(self.items, found, strict=True):
            key = _base_key(position, message)
            if existing is not None:
                if existing.value.get("position") == _padded(position):
                    continue  # archived by an earlier try: exactly once
                key = f"{key}@{_padded(position)}"  # the id was reused: never overwrite the earlier message
            value: dict[str, Any] = {
                "position": _padded(position),
                "role": message.type,
                "compaction": self.number,
                "message": message_to_dict(message),
            }
            if archive.index:
                value["text"] = message_body(to_core(message))
            puts.append(PutOp(self.namespace, key, value, index=["text"] if archive.index else False, ttl=ttl))
        return puts

    def stale(self, archive: Archive, items: Sequence[Item]) -> list[PutOp]:
        """Deletions of the archived items older than the newest ``max_messages`` (retention by count)."""
        if archive.max_messages is None or not self.items:
            return []
        oldest_kept = _padded(max(self.items[-1][0] + 1 - archive.max_messages, 0))
        return [PutOp(i.namespace, i.key, None) for i in items if str(i.value.get("position", "")) < oldest_kept]


def write(archive: Archive, store: BaseStore, batch: Batch) -> Flow[int]:
    """Archive ``batch``; how many messages were written (those archived before are skipped).

    A flow for ``drive``/``adrive``: the store's calls are made sync or awaited.
    """
    found: list[Item | None] = yield twin(store.batch, store.abatch, batch.gets())
    puts = batch.puts(archive, store, found)
    if puts:
        yield twin(store.batch, store.abatch, puts)
    if archive.max_messages is not None:
        stale = batch.stale(archive, (yield from read_all(store, batch.namespace)))
        if stale:
            yield twin(store.batch, store.abatch, stale)
    return len(puts)


def archived(
    archive: Archive | None,
    store: BaseStore | None,
    config: Any,
    before: Sequence[BaseMessage],
    after: Sequence[BaseMessage],
) -> Flow[bool]:
    """Archive what a compaction takes out of the state; whether the compaction may be applied.

    Raises:
        ConfigurationError: The archive is on and the graph has no store.
        StoreError: The store failed and ``on_error`` is ``"raise"``.
    """
    if archive is None:
        return True
    if store is None:
        raise ConfigurationError(
            "archive",
            True,
            "the graph has no LangGraph store to archive into; compile(store=InMemoryStore()) (or "
            "create_agent(store=...)), or pass archive=False",
        )
    thread = thread_of(config)
    if not thread:
        logger.warning(
            "archive is on but the run has no thread_id in its config, so the compacted messages of this run are "
            "not archived (a run without a thread has no conversation to file them under)"
        )
        return True
    _, _, number = numbering(after)
    batch = Batch(archive.namespace(thread), leaving(before, after), number)
    if not batch.items:
        return True
    try:
        written = yield from write(archive, store, batch)
    except Exception as error:
        if archive.on_error == "warn":
            logger.warning(
                "archiving failed (%s: %s): the state stays uncompacted this turn", type(error).__name__, error
            )
            return False
        msg = f"archiving the compacted messages failed ({type(error).__name__}: {error}); the state was not changed"
        raise StoreError(msg, operation="archive") from error
    logger.info("archived %d compacted message(s) (%d already there)", written, len(batch.items) - written)
    return True


# -- reading back --------------------------------------------------------------------


# A thread's whole archive is read in one search, with a limit grown until it
# is not reached: paging with offsets is not stable (PostgresStore orders by
# update time, and one batch writes many items with the same time, so pages
# skip and repeat items).


def read_all(store: BaseStore, namespace: tuple[str, ...]) -> Flow[Sequence[Item]]:
    """Every item under ``namespace`` (a thread's whole archive), as a flow."""
    limit = _PAGE
    while True:
        found: list[Item] = yield twin(store.search, store.asearch, namespace, limit=limit)
        if len(found) < limit:
            return found
        limit *= 4


def _as_archived(item: Item) -> Archived | None:
    value = item.value
    try:
        message = messages_from_dict([value["message"]])[0]
        position = int(str(value["position"]))
    except (KeyError, TypeError, ValueError, IndexError):
        return None  # not an item this library wrote: skipped
    return Archived(position, item.key, to_core(message))


def _semantic(store: BaseStore, namespace: tuple[str, ...], lookup: Lookup) -> Flow[list[Item]]:
    """What a vector index ranks close to the query, when the store has one."""
    if not lookup.query or not getattr(store, "index_config", None):
        return []
    limit = max(1, min(lookup.limit, MAX_RESULTS))
    return list((yield twin(store.search, store.asearch, namespace, query=lookup.query, limit=limit)))


def _merge(found: list[Archived], nearby: Sequence[Archived], lookup: Lookup) -> list[Archived]:
    """Keyword, id and range matches, newest first; then what a vector index ranks close in meaning."""
    seen = {a.key for a in found}
    for extra in nearby:
        if extra.key not in seen and len(found) < lookup.limit:
            found.append(extra)
            seen.add(extra.key)
    return found


def _redacted(items: Sequence[Archived], redactor: Redactor | None) -> list[Archived]:
    # Matched on what would be shown: a query must not test for a redacted secret.
    if redactor is None:
        return list(items)
    return [replace(a, message=redact_message(a.message, redactor)) for a in items]


def recall_from(
    messages: Sequence[BaseMessage], lookup: Lookup, redactor: Redactor | None = None
) -> list[tuple[int, BaseMessage]]:
    """What ``lookup`` asks for in an archive kept as a message list (chat memory's ``archive=``).

    Returns:
        ``(position, message)`` pairs, newest first; positions count ``messages`` from 0.
    """
    items = [Archived(i, _base_key(i, m), to_core(m)) for i, m in enumerate(messages)]
    return [(a.position, messages[a.position]) for a in select(_redacted(items, redactor), lookup)]


def _as_found(pairs: Sequence[tuple[int, BaseMessage]]) -> list[Archived]:
    return [Archived(p, _base_key(p, m), to_core(m)) for p, m in pairs]


@dataclass(frozen=True, slots=True)
class _Recaller:
    """What the recall tool does, sync and async (see ``recall_tool``)."""

    archive: Archive
    redact: Redactor | None
    max_chars: int
    history: Any

    def _answer(self, found: list[Archived]) -> str:
        return render(found, max_chars=self.max_chars, redactor=self.redact)

    def _where(self, runtime: ToolRuntime | None) -> tuple[BaseStore, tuple[str, str]] | str:
        store = runtime.store if runtime is not None else None
        thread = thread_of(runtime.config) if runtime is not None else ""
        if store is None:
            return "No archive: this agent has no LangGraph store."
        if not thread:
            return "No archive: this run has no thread id, so nothing of it was archived."
        return store, self.archive.namespace(thread)

    def _flow(self, lookup: Lookup, runtime: ToolRuntime | None) -> Flow[str]:
        if self.history is not None:
            pairs = yield from self.history.recall_flow(lookup, self.redact)
            return self._answer(_as_found(pairs))
        place = self._where(runtime)
        if isinstance(place, str):
            return place
        store, namespace = place
        items = yield from read_all(store, namespace)
        nearby = yield from _semantic(store, namespace, lookup)
        archived = _redacted([a for a in map(_as_archived, items) if a is not None], self.redact)
        close = _redacted([a for a in map(_as_archived, nearby) if a is not None], self.redact)
        return self._answer(_merge(select(archived, lookup), close, lookup))

    # The tool's functions: the same arguments four times, since LangChain
    # reads a tool's schema from its function's signature; the runtime (a
    # store's thread) is injected by the ToolNode, chat memory needs none.

    def recall(
        self,
        query: str = "",
        ids: list[str] | None = None,
        start: int | None = None,
        end: int | None = None,
        limit: int = 10,
        *,
        runtime: ToolRuntime,
    ) -> str:
        return drive(self._flow(Lookup(query, tuple(ids or ()), start, end, limit), runtime))

    async def arecall(
        self,
        query: str = "",
        ids: list[str] | None = None,
        start: int | None = None,
        end: int | None = None,
        limit: int = 10,
        *,
        runtime: ToolRuntime,
    ) -> str:
        return await adrive(self._flow(Lookup(query, tuple(ids or ()), start, end, limit), runtime))

    def recall_session(
        self,
        query: str = "",
        ids: list[str] | None = None,
        start: int | None = None,
        end: int | None = None,
        limit: int = 10,
    ) -> str:
        return drive(self._flow(Lookup(query, tuple(ids or ()), start, end, limit), None))

    async def arecall_session(
        self,
        query: str = "",
        ids: list[str] | None = None,
        start: int | None = None,
        end: int | None = None,
        limit: int = 10,
    ) -> str:
        return await adrive(self._flow(Lookup(query, tuple(ids or ()), start, end, limit), None))


RECALL_DESCRIPTION = (
    "Read back earlier messages of this conversation that were compacted into the summary. "
    "Look them up by words that must all occur (query), by message id (ids), or by position "
    "range (start, end; 0 is the first message). Returns the newest matches first."
)


def recall_tool(
    archive: Archive | None = None,
    *,
    redact: Redactor | None = None,
    max_chars: int = 4_000,
    name: str = RECALL_TOOL_NAME,
    history: Any = None,
) -> BaseTool:
    """A tool an agent calls to read compacted messages back.

    It looks them up by keyword (every word must occur), by id, or by
    position range, newest first, and returns their text within
    ``max_chars``; with a store created with an ``index`` config and
    ``Archive(index=True)``, a query also finds messages close in meaning.
    It reads only the calling thread's archive: the thread comes from the
    run's config, never from the model's arguments, so no thread can read
    another's messages.

    Args:
        archive: The archive settings the node or middleware writes with
            (``None``: the defaults).
        redact: Applied to every message text returned (pass the same hook
            as ``CompactionOptions(redact=...)``).
        max_chars: The most characters one call returns.
        name: The tool's name.
        history: A ``CompactingChatMessageHistory``: read its ``archive=``
            history instead of a store (its session is the scope).

    Returns:
        A LangChain tool (give it to ``create_agent(tools=...)`` or a ``ToolNode``;
        ``CompactionMiddleware(archive=True)`` registers it itself).

    Raises:
        ConfigurationError: An argument is invalid.
    """
    if isinstance(max_chars, bool) or not isinstance(max_chars, int) or max_chars < 200:
        raise ConfigurationError("max_chars", max_chars, "pass a number of characters (200 or more)")
    if history is not None and (not callable(getattr(history, "recall_flow", None)) or history.archive is None):
        raise ConfigurationError("history", history, "pass a CompactingChatMessageHistory with archive=..., or None")
    recaller = _Recaller(archive if archive is not None else Archive(), redact, max_chars, history)
    if history is not None:
        return StructuredTool.from_function(
            func=recaller.recall_session, coroutine=recaller.arecall_session, name=name, description=RECALL_DESCRIPTION
        )
    return StructuredTool.from_function(
        func=recaller.recall, coroutine=recaller.arecall, name=name, description=RECALL_DESCRIPTION
    )
