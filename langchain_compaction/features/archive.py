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

import contextlib
import logging
import re
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from langchain_core.messages import BaseMessage, message_to_dict, messages_from_dict
from langgraph.store.base import BaseStore, GetOp, Item, PutOp
from langgraph.store.memory import InMemoryStore

from langchain_compaction._lc.conversation import Conversation, thread_label
from langchain_compaction._lc.convert import to_core
from langchain_compaction._lc.identity import fingerprint
from langchain_compaction._lc.storable import storable, stored
from langchain_compaction.core.effects import Flow, twin
from langchain_compaction.core.options import CompactionOptions
from langchain_compaction.core.prompts import RECALL_NOTE
from langchain_compaction.core.record import LINEAGE_KEY, NUMBER_KEY
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


def check_tool_name(name: str, value: object) -> None:
    """Refuse a tool name the model providers refuse (``_TOOL_NAME``), saying what to pass."""
    if not isinstance(value, str) or not _TOOL_NAME.fullmatch(value):
        raise ConfigurationError(name, value, "pass a tool name of letters, digits, _ or - (64 at most)")


def _padded(position: int) -> str:
    return str(position).zfill(_WIDTH)


def _fix_for(error: Exception) -> str:
    """What to do about a store error whose cause is known ("" otherwise)."""
    if "transaction within a transaction" in str(error):
        # sqlite3.connect(path) opens each write's transaction itself, and SqliteStore opens its own.
        return (
            "; a SqliteStore on a plain sqlite3.connect(path) cannot write: build it with "
            "SqliteStore.from_conn_string(path), or on sqlite3.connect(path, isolation_level=None)"
        )
    return ""


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
        # (Finite, and at most ten years: a store converts it to an integer time, which NaN and infinity are not.)
        if ttl is not None and (
            isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not 0 < ttl <= _MAX_TTL_MINUTES
        ):
            raise ConfigurationError(
                "ttl_minutes", self.ttl_minutes, f"pass minutes (more than 0, at most {_MAX_TTL_MINUTES:,}), or None"
            )
        if self.on_error not in ("raise", "warn"):
            raise ConfigurationError("on_error", self.on_error, "pass 'raise' or 'warn'")
        check_tool_name("tool", self.tool)

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
                f"the state was not changed and no summary was asked for{_fix_for(error)}"
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
            PutOp(namespace, key, self._value(position, message, sid, number), index=self._index(store), ttl=ttl)
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
        for batch in _apart(puts) if isinstance(store, InMemoryStore) else [puts]:
            yield twin(store.batch, store.abatch, batch)
        if self.max_messages is not None:
            items = yield from read_all(store, namespace)
            stale = _beyond(items, _Timeline.of(set(lineage), number, commit.ids, items), self.max_messages)
            if stale:
                yield twin(store.batch, store.abatch, [PutOp(namespace, i.key, None) for i in stale])
        return len(puts)

    def _index(self, store: BaseStore) -> list[str] | Literal[False]:
        if not self.index:
            return False
        if getattr(store, "index_config", True) is None and _first_time(store):
            # (Said once a store: LangGraph's stores keep their index config there, None without one.)
            logger.warning(
                "Archive(index=True): the store was created without an index config, so archived messages "
                "are found by their words only; create it with one, e.g. InMemoryStore(index={'dims': ..., "
                "'embed': ...}), for semantic recall"
            )
        return ["text"]

    def _value(self, position: int, message: Any, sid: str, number: int) -> dict[str, Any]:
        value: dict[str, Any] = {
            "position": _padded(position),
            "role": message.type,
            "id": message.id,
            "compaction": number,
            "lineage": sid,
            **storable("message", message_to_dict(message)),
        }
        if self.index:
            value["text"] = message_body(to_core(message)).replace("\x00", "")  # (only searched)
        return value


def archived_message(value: Mapping[str, Any]) -> BaseMessage:
    """The message an archived item holds (``storable``); raises ``KeyError``, ``TypeError`` or ``ValueError``."""
    return messages_from_dict([stored(value, "message")])[0]


_MAX_TTL_MINUTES = 10 * 366 * 24 * 60
"""The longest ``ttl_minutes``: ten years."""

_UNINDEXED: weakref.WeakSet[Any] = weakref.WeakSet()
"""The stores ``Archive(index=True)`` said have no index config (held weakly: a store gone is forgotten)."""


def _first_time(store: Any) -> bool:
    """Whether ``store`` is not in ``_UNINDEXED`` yet (now it is); a store that cannot be held weakly: always."""
    if store in _UNINDEXED:
        return False
    with contextlib.suppress(TypeError):
        _UNINDEXED.add(store)
    return True


def _ttl(archive: Archive, store: BaseStore) -> float | None:
    if archive.ttl_minutes is not None:
        return archive.ttl_minutes
    config = getattr(store, "ttl_config", None) or {}
    default = config.get("default_ttl") if isinstance(config, dict) else None
    return float(default) if isinstance(default, (int, float)) and getattr(store, "supports_ttl", False) else None


def _apart(puts: Sequence[PutOp]) -> list[list[PutOp]]:
    """``puts`` as batches none of which holds one text to embed twice: a single batch when the texts all differ.

    LangGraph's ``InMemoryStore`` embeds each distinct text of a batch once but
    expects a vector per item, so one batch with two equal texts (a user who
    said "go on" twice) fails every time. A text seen before goes to the
    first batch that does not hold it yet. (Only for that store: a short tool
    output repeated hundreds of times would make as many round trips to a
    store that takes a batch whole, as ``PostgresStore`` does.)
    """
    batches: list[list[PutOp]] = []
    texts: list[set[str]] = []
    for put in puts:
        text = put.value.get("text") if put.value is not None and put.index is not False else None
        at = next((i for i, held in enumerate(texts) if text not in held), len(texts)) if isinstance(text, str) else 0
        if at == len(batches):
            batches.append([])
            texts.append(set())
        batches[at].append(put)
        if isinstance(text, str):
            texts[at].add(text)
    return batches


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


__all__ = ["ARCHIVE_NAMESPACE", "RECALL_TOOL_NAME", "Archive", "archived_message", "read_all", "thread_label"]
