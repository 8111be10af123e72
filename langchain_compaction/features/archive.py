"""The archive: every compacted original kept in a LangGraph store, and read back.

With the ``Archive`` feature and a store on the graph (``compile(store=...)``,
``create_agent(store=...)``), each message a compaction takes out of the state
is written to the store before the summary is asked for (or a prepared one
applied), under ``(prefix, <thread>, <namespace>...)`` (the conversation's
labels, ``_lc.conversation``: a sub-agent with its own history files its own
archive), one item per message, with:

- ``position``: its ordinal in the whole conversation, zero-padded so a store
  that compares values as text orders it right (``core.record`` numbers it);
- ``compaction`` and ``lineage``: the number and the id of the compaction that
  removed it, as the summary's record has them;
- ``role``, ``id`` and ``message`` (LangChain's message dict).

An item's key is the compaction's id and the position, so a retried
compaction (a crash, a second worker) writes the same keys and nothing twice,
and two branches of a fork that compact differently never overwrite each
other. The store is shared by every checkpoint of a thread and is never
rolled back, so what the recall tool returns is decided by the record of the
checkpoint it runs on: an item counts when its compaction is in that
record's lineage. Retention (``max_messages``) only ever drops the oldest
items of the current timeline; another branch's items are left to the store's
TTL. Items written by 0.2 (keyed by message id, no lineage) count when their
compaction number is not past the record's.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Literal

from langchain_core.messages import BaseMessage, message_to_dict, messages_from_dict
from langchain_core.tools import BaseTool, StructuredTool
from langgraph.prebuilt import ToolRuntime
from langgraph.store.base import BaseStore, GetOp, Item, PutOp

from langchain_compaction._lc.conversation import Conversation, namespace_of, thread_label, thread_of
from langchain_compaction._lc.convert import fingerprint, to_core, to_core_list
from langchain_compaction.core.effects import Flow, adrive, drive, twin
from langchain_compaction.core.options import CompactionOptions
from langchain_compaction.core.prompts import RECALL_NOTE
from langchain_compaction.core.recall import MAX_RESULTS, Archived, Lookup, render, select
from langchain_compaction.core.record import LINEAGE_KEY, NAMESPACE_KEY, NUMBER_KEY, numbering
from langchain_compaction.core.redact import Redactor, redact_message
from langchain_compaction.core.tokens import estimate_tokens
from langchain_compaction.core.transcript import message_body
from langchain_compaction.errors import ConfigurationError, StoreError
from langchain_compaction.features.base import Addition, Commit, Draft, Feature

logger = logging.getLogger("langchain_compaction")

ARCHIVE_NAMESPACE = "compaction_archive"
"""First label of the store namespace compacted messages are archived under, by default."""

RECALL_TOOL_NAME = "recall_messages"
"""The recall tool's name, by default."""

_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""What the model providers accept as a tool's name."""

_PAGE = 1_000
"""Items a first read of an archive asks for (grown until the archive fits)."""

_WIDTH = 12
"""Digits of a zero-padded position."""


def _padded(position: int) -> str:
    return str(position).zfill(_WIDTH)


@dataclass(frozen=True, slots=True)
class Archive(Feature):
    """Keep every message a compaction removes in the graph's LangGraph store, and let the agent read it back.

    Attributes:
        prefix: First label of the namespace (``("compaction_archive", <thread>, ...)``).
        index: Also index each message's text for semantic search (the store
            must be created with an ``index`` config; embedding every
            archived message costs money, so it is off by default).
        max_messages: Keep at most this many archived messages per
            conversation, dropping the oldest of the current timeline after
            each compaction (``None``: all).
        ttl_minutes: Let each archived message expire after this many
            minutes, where the store supports TTL (``PostgresStore`` with a
            TTL config and its sweeper; ``InMemoryStore`` has none). ``None``
            uses the store's own default TTL, if any.
        tool: The recall tool's name, as the summary's line names it
            (``recall_tool`` takes it from here).
        on_error: ``"raise"``: a failed archive write fails the compaction
            with ``StoreError`` before the summary is asked for, and the state
            is left as it was. ``"warn"``: the failure is logged and the turn
            goes on uncompacted (no summary call is paid for) while the
            context still fits the window with half the reserve to spare;
            past that it compacts without archiving, and says so.

    Its record in ``CompactionResult.parts["archive"]``: ``archived`` (items
    written), ``present`` (already there from an earlier try of the same
    compaction), and ``skipped`` when the compaction went ahead without
    archiving (no thread, or a failed write with ``on_error="warn"`` once the
    context no longer fit).

    Example:
        >>> Archive(max_messages=500).namespace(Conversation("user.1"))
        ('compaction_archive', 'user%2E1')
    """

    name: ClassVar[str] = "archive"
    prefix: str = ARCHIVE_NAMESPACE
    index: bool = False
    max_messages: int | None = None
    ttl_minutes: float | None = None
    on_error: Literal["raise", "warn"] = "raise"
    tool: str = RECALL_TOOL_NAME

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
        if not isinstance(self.tool, str) or not _TOOL_NAME.fullmatch(self.tool):
            raise ConfigurationError("tool", self.tool, "pass a tool name of letters, digits, _ or - (64 at most)")

    @classmethod
    def of(cls, value: object) -> Archive | None:
        """What a 0.2 ``archive=`` argument means: ``None`` (off), or the archive's settings."""
        if value is None or value is False:
            return None
        if value is True:
            return cls()
        if isinstance(value, Archive):
            return value
        raise ConfigurationError("archive", value, "pass True, False or Archive(...)")

    def namespace(self, conversation: Conversation) -> tuple[str, ...]:
        """The store namespace of a conversation's archive."""
        return (self.prefix, *conversation.labels())

    # -- seams ----------------------------------------------------------------------------

    def add(self, draft: Draft) -> Addition:
        """The line that tells the agent earlier messages can be read back."""
        return Addition(section=RECALL_NOTE.format(tool=self.tool))

    def reserve(self, options: CompactionOptions) -> int:
        """What the line costs."""
        return estimate_tokens(RECALL_NOTE.format(tool=self.tool)) + 2

    def require(self, store: Any) -> None:
        """Raise when there is no store to archive into (checked on every turn, before any model call).

        A server attaches its store at run time, so a node cannot know at
        construction; the first turn says so, not the first compaction.

        Raises:
            ConfigurationError: ``store`` is ``None``.
        """
        if store is None:
            raise ConfigurationError(
                "archive",
                self,
                "the graph has no LangGraph store to archive into; compile(store=InMemoryStore()) (or "
                "create_agent(store=...)), or leave Archive out of features",
            )

    def commit(self, commit: Commit) -> Flow[Mapping[str, Any] | None]:
        """Archive what the compaction removes, before anything else happens; ``None`` holds it back."""
        store, conversation = commit.store, commit.conversation
        self.require(store)
        if conversation.thread is None:
            logger.warning(
                "Archive is on but the run has no thread_id in its config, so the compacted messages of this run "
                "are not archived (a run without a thread has no conversation to file them under)"
            )
            return {"archived": 0, "present": 0, "skipped": True}
        if not commit.removed:
            return {"archived": 0, "present": 0}
        try:
            written = yield from self._write(store, self.namespace(conversation), commit)
        except Exception as error:
            if self.on_error == "warn":
                logger.warning("archiving failed (%s: %s)", type(error).__name__, error)
                return None
            msg = (
                f"archiving the compacted messages failed ({type(error).__name__}: {error}); "
                "the state was not changed and no summary was asked for"
            )
            raise StoreError(msg, operation="archive") from error
        present = len(commit.removed) - written
        logger.info("archived %d compacted message(s) (%d already there)", written, present)
        return {"archived": written, "present": present}

    def _write(self, store: BaseStore, namespace: tuple[str, ...], commit: Commit) -> Flow[int]:
        mark = commit.mark
        lineage = [i for i in mark.get(LINEAGE_KEY) or () if isinstance(i, str)]
        sid, number = (lineage[-1] if lineage else ""), int(mark.get(NUMBER_KEY) or 0)
        keys = [_key(sid, p, m) for p, m in commit.removed]
        found: list[Item | None] = yield twin(store.batch, store.abatch, [GetOp(namespace, k) for k in keys])
        ttl = _ttl(self, store)
        puts = [
            PutOp(namespace, key, self._value(position, message, sid, number), index=self._index(), ttl=ttl)
            for key, existing, (position, message) in zip(keys, found, commit.removed)
            if existing is None  # archived by an earlier try of this very compaction: exactly once
        ]
        # An output cleared earlier was archived then, under no summary: this
        # one's record says it is of this timeline now that it leaves the state.
        puts += [
            PutOp(namespace, f"{sid}:{_padded(p)}", _adopted(p, message_id, sid, number), index=False, ttl=ttl)
            for p, message_id in commit.cleared
            if sid
        ]
        if puts:
            yield twin(store.batch, store.abatch, puts)
        if self.max_messages is not None:
            items = yield from read_all(store, namespace)
            stale = _beyond(items, _Timeline.of(set(lineage), number, commit.ids, items), self.max_messages)
            if stale:
                yield twin(store.batch, store.abatch, [PutOp(namespace, i.key, None) for i in stale])
        return len(puts)

    def _index(self) -> list[str] | Literal[False]:
        return ["text"] if self.index else False

    def _value(self, position: int, message: Any, sid: str, number: int) -> dict[str, Any]:
        value: dict[str, Any] = {
            "position": _padded(position),
            "role": message.type,
            "id": message.id,
            "compaction": number,
            "lineage": sid,
            **_stored(message),
        }
        if self.index:
            value["text"] = message_body(to_core(message)).replace("\x00", "")  # (only searched)
        return value


def _stored(message: BaseMessage) -> dict[str, Any]:
    """A message as an item holds it: LangChain's dict, or that dict as JSON text when it holds a NUL.

    PostgreSQL's ``jsonb`` refuses a NUL character in a string (a binary
    file's header read by a tool, say): every later write of the thread
    would fail. As JSON text, the NUL is the six characters ``\\u0000``.
    """
    data = message_to_dict(message)
    text = json.dumps(data)
    return {"message_json": text} if "\\u0000" in text else {"message": data}


def archived_message(value: Mapping[str, Any]) -> BaseMessage:
    """The message an archived item holds (``_stored``); raises ``KeyError``, ``TypeError`` or ``ValueError``."""
    data = value.get("message")
    if data is None:
        data = json.loads(value["message_json"])
    return messages_from_dict([data])[0]


def _ttl(archive: Archive, store: BaseStore) -> float | None:
    if archive.ttl_minutes is not None:
        return archive.ttl_minutes
    config = getattr(store, "ttl_config", None) or {}
    default = config.get("default_ttl") if isinstance(config, dict) else None
    return float(default) if isinstance(default, (int, float)) and getattr(store, "supports_ttl", False) else None


def _key(sid: str, position: int, message: BaseMessage) -> str:
    """An item's key: the compaction's id and the position; a tool output only cleared, its position and message.

    A clearing writes no summary, so it has no id of its own: two branches of
    a fork that clear different outputs at one position file them apart.
    """
    if sid:
        return f"{sid}:{_padded(position)}"
    return f":{_padded(position)}:{message.id or fingerprint(message)}"


@dataclass(frozen=True, slots=True)
class _Timeline:
    """Which archived items belong to the timeline a record (and its messages) describe.

    An item a summary archived belongs when the summary is in the record's
    lineage. An item with lineage "" is a tool output only cleared (no
    summary, so no compaction id): it belongs when its message does, in the
    conversation (the cleared copy keeps the id) or archived by a summary of
    this timeline. Items written by 0.2 (no lineage) belong when their
    compaction number is not past the record's.
    """

    lineage: set[str]
    number: int
    ids: set[str]

    @classmethod
    def of(cls, lineage: set[str], number: int, present: Iterable[str], items: Iterable[Item]) -> _Timeline:
        """The timeline of a record, whose conversation holds the ids ``present``, over the archive's ``items``."""
        ids = set(present)
        ids.update(
            i.value["id"] for i in items if i.value.get("lineage") in lineage and isinstance(i.value.get("id"), str)
        )
        return cls(lineage, number, ids)

    def holds(self, value: Mapping[str, Any]) -> bool:
        """Whether the item whose value is ``value`` belongs to this timeline."""
        sid = value.get("lineage")
        if isinstance(sid, str):
            if sid:
                return sid in self.lineage
            message = value.get("id")
            return not isinstance(message, str) or message in self.ids
        compaction = value.get("compaction")  # written by 0.2: no lineage, numbered
        return isinstance(compaction, int) and compaction <= self.number


def _adopted(position: int, message_id: str, sid: str, number: int) -> dict[str, Any]:
    """The item that files an output cleared earlier under the summary that takes its placeholder out (no message)."""
    return {"position": _padded(position), "id": message_id, "compaction": number, "lineage": sid, "adopted": True}


def _beyond(items: Sequence[Item], timeline: _Timeline, keep: int) -> list[Item]:
    """This timeline's items older than its newest ``keep`` (other branches' are never touched)."""
    mine = [i for i in items if timeline.holds(i.value)]
    messages = [i for i in mine if not i.value.get("adopted")]
    positions = sorted((str(i.value.get("position", "")) for i in messages), reverse=True)
    if len(positions) <= keep:
        return []
    oldest_kept = positions[keep - 1]
    return [i for i in mine if str(i.value.get("position", "")) < oldest_kept]


# -- reading back ---------------------------------------------------------------------------


# A conversation's whole archive is read in one search, with a limit grown until
# it is not reached: paging with offsets is not stable (PostgresStore orders by
# update time, and one batch writes many items with the same time).


def read_all(store: BaseStore, namespace: tuple[str, ...]) -> Flow[Sequence[Item]]:
    """Every item under ``namespace`` (a conversation's whole archive), as a flow."""
    limit = _PAGE
    while True:
        found: list[Item] = yield twin(store.search, store.asearch, namespace, limit=limit)
        if len(found) < limit:
            # A search reads the namespaces under this one too: a sub-agent's own archive is not this one's.
            return [i for i in found if tuple(i.namespace) == namespace]
        limit *= 4


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
            pairs = yield from self.history.recall_flow(lookup, self.redact)
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
        every = yield from read_all(store, namespace)
        timeline = _Timeline.of(lineage, number, present, every)
        items = [i for i in every if timeline.holds(i.value)]
        nearby = [i for i in (yield from _semantic(store, namespace, lookup)) if timeline.holds(i.value)]
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
        ``CompactionMiddleware`` with ``Archive`` registers it itself).

    Raises:
        ConfigurationError: An argument is invalid.
    """
    if isinstance(max_chars, bool) or not isinstance(max_chars, int) or max_chars < 200:
        raise ConfigurationError("max_chars", max_chars, "pass a number of characters (200 or more)")
    if history is not None and (not callable(getattr(history, "recall_flow", None)) or history.archive is None):
        raise ConfigurationError("history", history, "pass a CompactingChatMessageHistory with archive=..., or None")
    if redact is None and history is not None:
        redact = history.options.redact  # the memory's own hook: what it summarized redacted, recall returns so
    settings = archive if archive is not None else Archive()
    if name is None:
        name = settings.tool
    elif name != settings.tool and history is None:
        logger.warning(
            "the recall tool is named %r but the summary tells the model to call %r; pass Archive(tool=%r) to the "
            "node or middleware so both say the same",
            name,
            settings.tool,
            name,
        )
    recaller = _Recaller(settings, redact, max_chars, history, messages_key)
    if history is not None:
        return StructuredTool.from_function(
            func=recaller.recall_session, coroutine=recaller.arecall_session, name=name, description=RECALL_DESCRIPTION
        )
    return StructuredTool.from_function(
        func=recaller.recall, coroutine=recaller.arecall, name=name, description=RECALL_DESCRIPTION
    )


__all__ = ["ARCHIVE_NAMESPACE", "RECALL_TOOL_NAME", "Archive", "read_all", "recall_from", "recall_tool", "thread_label"]
