"""Reading the archive back: the recall tool an agent calls, and chat memory's look-up.

What recall returns is decided by the checkpoint it runs on (``_timeline``):
the archive's items of that timeline (``features.archive``), of the calling
conversation only, matched by ``core.recall`` and shown within a budget.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from langchain_core.messages import BaseMessage
from langchain_core.tools import BaseTool, StructuredTool, ToolException
from langgraph.prebuilt import ToolRuntime
from langgraph.store.base import BaseStore, Item

from langchain_compaction._lc.conversation import Conversation, namespace_of
from langchain_compaction._lc.convert import to_core, to_core_list
from langchain_compaction._lc.steps import thread_of
from langchain_compaction.core.effects import Flow, adrive, drive, twin
from langchain_compaction.core.options import check_callable
from langchain_compaction.core.recall import MAX_RESULTS, Archived, Lookup, render, select
from langchain_compaction.core.record import NAMESPACE_KEY, numbering
from langchain_compaction.core.redact import Redactor, redact_message
from langchain_compaction.errors import ConfigurationError, StoreError
from langchain_compaction.features.archive import (
    Archive,
    _padded,
    _Timeline,
    archived_message,
    check_tool_name,
    read_all,
)

logger = logging.getLogger("langchain_compaction")


def _as_archived(item: Item) -> Archived | None:
    value = item.value
    try:
        message = archived_message(value)
        position = int(str(value["position"]))
    except (KeyError, TypeError, ValueError, IndexError):
        return None  # not an item this library wrote: skipped
    return Archived(position, message.id or item.key, to_core(message))


def _semantic(store: BaseStore, namespace: tuple[str, ...], lookup: Lookup) -> Flow[list[Item]]:
    """What a vector index ranks close to the query, when the store has one."""
    if not lookup.query or not getattr(store, "index_config", None):
        return []
    limit = max(1, min(lookup.limit, MAX_RESULTS))
    found: list[Item] = yield twin(store.search, store.asearch, namespace, query=lookup.query, limit=limit)
    return [i for i in found if tuple(i.namespace) == namespace]


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
    items = [Archived(i, m.id or f"position-{_padded(i)}", to_core(m)) for i, m in enumerate(messages)]
    return [(a.position, messages[a.position]) for a in select(_redacted(items, redactor), lookup)]


def _timeline(state: Any, messages_key: str) -> tuple[set[str], int, tuple[str, ...] | None, set[str]]:
    """The lineage, compaction number and archive namespace the state's record gives, and its messages' ids."""
    value = state.get(messages_key) if isinstance(state, Mapping) else getattr(state, messages_key, None)
    messages = [m for m in value or () if isinstance(m, BaseMessage)]
    lead = 0
    while lead < len(messages) and messages[lead].type == "system":
        lead += 1
    core = to_core_list(messages[: lead + 1])
    seen = numbering(core)
    marks = [m.mark for m in core if m.carries_summary]
    recorded = marks[-1].get(NAMESPACE_KEY) if marks else None
    where = tuple(p for p in recorded if isinstance(p, str)) if isinstance(recorded, list) else None
    return set(seen.lineage), seen.number, where, {m.id for m in messages if m.id}


def _unreadable(error: Exception) -> ToolException:
    """What the tool answers when the archive fails to read: an error tool message, the run goes on.

    A tool the model calls reports its failure to the model (LangChain's
    ``ToolException``, which the tool turns into a tool message with status
    "error"), as the model would be told of a failed search: raised, the
    store's exception would end the user's turn. The model is told the kind
    of failure only; the log has the whole of it.
    """
    logger.warning("the recall tool could not read the archive (%s: %s)", type(error).__name__, error)
    return ToolException(
        f"The archive of earlier messages could not be read just now ({type(error).__name__}). "
        "Go on without it, or try the look-up again later."
    )


@dataclass(frozen=True, slots=True)
class _Recaller:
    """What the recall tool does, sync and async (see ``recall_tool``)."""

    archive: Archive
    redact: Redactor | None
    max_chars: int
    history: Any
    messages_key: str

    def _flow(self, lookup: Lookup, runtime: ToolRuntime | None) -> Flow[str]:
        if self.history is not None:
            try:
                pairs = yield from self.history.recall_flow(lookup, self.redact)
            except StoreError as error:  # (the memory's own, naming the store and what failed)
                raise _unreadable(error) from error
            found = [Archived(p, m.id or f"position-{_padded(p)}", to_core(m)) for p, m in pairs]
            return render(found, max_chars=self.max_chars, redactor=self.redact)
        store = runtime.store if runtime is not None else None
        thread = thread_of(runtime.config) if runtime is not None else None
        if store is None:
            return "No archive: this agent has no LangGraph store."
        if thread is None:
            return "No archive: this run has no thread id, so nothing of it was archived."
        assert runtime is not None
        lineage, number, recorded, present = _timeline(runtime.state, self.messages_key)
        # The thread always comes from the run's config, never from the model
        # or the state; the state's record says which graph's archive it is.
        conversation = Conversation(thread, recorded if recorded is not None else namespace_of(runtime.config))
        namespace = self.archive.namespace(conversation)
        try:
            every = yield from read_all(store, namespace)
            ranked = yield from _semantic(store, namespace, lookup)
        except Exception as error:
            raise _unreadable(error) from error
        timeline = _Timeline.of(lineage, number, present, every)
        items = [i for i in every if timeline.holds(i.value)]
        nearby = [i for i in ranked if timeline.holds(i.value)]
        archived = _redacted([a for a in map(_as_archived, items) if a is not None], self.redact)
        close = _redacted([a for a in map(_as_archived, nearby) if a is not None], self.redact)
        found = select(archived, lookup)
        seen = {(a.position, a.key) for a in found}
        found += [a for a in close if (a.position, a.key) not in seen][: max(lookup.limit - len(found), 0)]
        return render(found, max_chars=self.max_chars, redactor=self.redact)

    # The tool's functions: the same arguments four times, since LangChain
    # reads a tool's schema from its function's signature; the runtime (a
    # store's thread and the state's record) is injected by the ToolNode,
    # chat memory needs none.

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


def _named(name: str | None, archive: Archive, history: Any) -> str:
    """The tool's name: the one the summary gives it (``Archive.tool``), unless told otherwise, which is said."""
    if name is None:
        return archive.tool
    if name != archive.tool and history is None:
        logger.warning(
            "the recall tool is named %r but the summary tells the model to call %r; pass Archive(tool=%r) to the "
            "node or middleware so both say the same",
            name,
            archive.tool,
            name,
        )
    return name


def recall_tool(
    archive: Archive | None = None,
    *,
    redact: Redactor | None = None,
    max_chars: int = 4_000,
    name: str | None = None,
    history: Any = None,
    messages_key: str = "messages",
) -> BaseTool:
    """A tool an agent calls to read compacted messages back.

    It looks them up by keyword (every word must occur), by id, or by
    position range, newest first, and returns their text within
    ``max_chars``; with a store created with an ``index`` config and
    ``Archive(index=True)``, a query also finds messages close in meaning.
    It reads only the calling conversation's archive, and only what the
    checkpoint it runs on compacted: the thread comes from the run's config,
    never from the model's arguments, and the timeline from the state's
    summary (after a fork, the abandoned branch's messages are not returned).

    Args:
        archive: The archive settings the node or middleware writes with
            (``None``: the defaults).
        redact: Applied to every message text returned (pass the same hook
            as ``CompactionOptions(redact=...)``; with ``history``, its own by default).
        max_chars: The most characters one call returns.
        name: The tool's name (``None``: the one the summary names, ``archive.tool``).
        history: A ``CompactingChatMessageHistory``: read its ``archive=``
            history instead of a store (its session is the scope).
        messages_key: The state key holding the messages (where the record is).

    Returns:
        A LangChain tool (give it to ``create_agent(tools=...)`` or a ``ToolNode``;
        ``CompactionMiddleware`` with ``Archive`` registers it itself). A failed
        read answers with an error tool message (and a warning), not a raise.

    Raises:
        ConfigurationError: An argument is invalid.
    """
    if isinstance(max_chars, bool) or not isinstance(max_chars, int) or max_chars < 200:
        raise ConfigurationError("max_chars", max_chars, "pass a number of characters (200 or more)")
    if history is not None and (not callable(getattr(history, "recall_flow", None)) or history.archive is None):
        raise ConfigurationError("history", history, "pass a CompactingChatMessageHistory with archive=..., or None")
    if archive is not None and not isinstance(archive, Archive):
        raise ConfigurationError("archive", archive, "pass the Archive(...) the node or middleware uses, or None")
    if name is not None:
        check_tool_name("name", name)
    check_callable("redact", redact, "pass a function from text to text, e.g. redact_secrets")
    if redact is None and history is not None:
        redact = history.options.redact  # the memory's own hook: what it summarized redacted, recall returns so
    settings = archive if archive is not None else Archive()
    name = _named(name, settings, history)
    recaller = _Recaller(settings, redact, max_chars, history, messages_key)
    # (Chat memory's tool takes no runtime; a failed read is told to the model: ``_unreadable``.)
    sync, coroutine = (
        (recaller.recall, recaller.arecall) if history is None else (recaller.recall_session, recaller.arecall_session)
    )
    return StructuredTool.from_function(
        func=sync, coroutine=coroutine, name=name, description=RECALL_DESCRIPTION, handle_tool_error=True
    )


__all__ = ["RECALL_DESCRIPTION", "recall_from", "recall_tool"]
