"""A prepared compaction and where it is kept: in memory, and in a LangGraph store for every worker.

``PreparedSummary`` is what a preparation made (``features.prepare``): the
summary it wrote and the positions of what it kept, so it applies to the
caller's current objects. With ``PrepareAhead(in_store=True)`` it is also
kept in the graph's store under ``("compaction_prepared", <thread>,
<namespace>...)``, keyed by the digest of the messages it was made from.
"""

from __future__ import annotations

import logging
import operator
import weakref
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass, field, replace
from typing import Any

from langchain_core.messages import BaseMessage, messages_from_dict, messages_to_dict

from langchain_compaction._lc.conversation import Conversation
from langchain_compaction._lc.identity import content_size, leading, prefix_digest, unchanged_since
from langchain_compaction._lc.storable import storable, stored
from langchain_compaction.core.effects import Flow, twin
from langchain_compaction.core.result import CompactionResult

logger = logging.getLogger("langchain_compaction")

APPLIED_KEY = "applied"
"""Set on a stored preparation once a compaction applied it (its calls are in that result)."""

STORE_NAMESPACE = "compaction_prepared"
"""First label of the store namespace prepared summaries are kept under."""

_STORED = 20
"""Prepared summaries looked at per conversation in a store (there is normally one)."""


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
        shared: Whether it was kept in the store, where any worker may apply
            it (and report its calls): the worker that made it never counts
            it as discarded.
    """

    size: int
    digest: str
    head: tuple[int, ...]
    written: tuple[BaseMessage, ...]
    kept: tuple[int, ...]
    result: CompactionResult
    written_tokens: int = 0
    shared: bool = False
    # The messages last found to match (weakly held) and their content sizes then: every turn
    # between a preparation and the threshold asks ``matches``, and a digest of the whole prefix
    # costs milliseconds at a few thousand messages.
    _matched: list[tuple[tuple[weakref.ref[BaseMessage], ...], tuple[int, ...]]] = field(
        default_factory=list, init=False, repr=False, compare=False
    )

    @classmethod
    def of(
        cls,
        snapshot: Sequence[BaseMessage],
        result: CompactionResult,
        output: Sequence[BaseMessage],
        written_tokens: int,
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
        """Whether ``messages`` starts with the very messages it was made from.

        By the token cache's rule (``TokenCountCache``): the objects last found
        to match match again, and so do copies of them equal field for field
        whose contents have the sizes those had (a checkpoint's copies, read
        anew each turn); anything else is checked by the digest of the prefix.
        """
        if len(messages) < self.size:
            return False
        prefix = list(messages[: self.size])
        if self._matched and self._matched_again(prefix, *self._matched[-1]):
            return True
        if prefix_digest(prefix) != self.digest:
            return False
        self._remember(prefix)
        return True

    def _matched_again(
        self, prefix: list[BaseMessage], refs: tuple[weakref.ref[BaseMessage], ...], sizes: tuple[int, ...]
    ) -> bool:
        """Whether ``prefix`` is the messages last matched (``refs``), or equal copies of them of ``sizes``."""
        before: list[Any] = [ref() for ref in refs]  # (None for one collected since)
        same = leading(map(operator.is_, before, prefix))
        if same == len(prefix):
            return True
        if unchanged_since(prefix, before, sizes, same) < len(prefix):
            return False
        self._remember(prefix)
        return True

    def _remember(self, prefix: list[BaseMessage]) -> None:
        """Keep ``prefix`` (weakly) as the messages last found to match, until its newest message is collected.

        The references cost about a tenth of the messages they point to, and
        only while someone else holds those: a preparation left by a
        conversation that ended (kept until the cache lets it go) keeps none.
        """
        memo = self._matched
        if not prefix:
            return

        def forget(_: object) -> None:
            if memo and memo[-1] is entry:  # (not one remembered since: a later turn's copies)
                memo.clear()

        with suppress(TypeError):  # (an object that takes no weak reference: the digest each time)
            refs = (*map(weakref.ref, prefix[:-1]), weakref.ref(prefix[-1], forget))
            entry = (refs, tuple(map(content_size, prefix)))
            memo[:] = [entry]

    def output_for(self, messages: Sequence[BaseMessage]) -> list[BaseMessage]:
        """The compacted conversation over ``messages``' own objects, then what came after (``matches`` first)."""
        return [
            *(messages[i] for i in self.head),
            *self.written,
            *(messages[i] for i in self.kept),
            *messages[self.size :],
        ]

    def tokens_for(self, counts: Sequence[int]) -> int:
        """What ``output_for`` would count, from per-message ``counts`` of a conversation it ``matches``."""
        kept = sum(counts[i] for i in self.head) + sum(counts[i] for i in self.kept)
        return kept + self.written_tokens + sum(counts[self.size :])

    def to_value(self) -> dict[str, Any]:
        """The JSON value kept in a LangGraph store (any store: ``storable``)."""
        return {
            "size": self.size,
            "digest": self.digest,
            "head": list(self.head),
            **storable("written", messages_to_dict(list(self.written))),
            "kept": list(self.kept),
            **storable("result", self.result.to_dict()),
            "written_tokens": self.written_tokens,
        }

    @classmethod
    def from_value(cls, value: dict[str, Any]) -> PreparedSummary:
        """Read back ``to_value``; raises ``KeyError``/``TypeError``/``ValueError`` on a foreign value."""
        result = dict(stored(value, "result"))
        return cls(
            size=int(value["size"]),
            digest=str(value["digest"]),
            head=tuple(int(i) for i in value["head"]),
            written=tuple(messages_from_dict(stored(value, "written"))),
            kept=tuple(int(i) for i in value["kept"]),
            result=CompactionResult(**result),
            written_tokens=int(value.get("written_tokens", 0)),
        )


def namespace(conversation: Conversation) -> tuple[str, ...]:
    """The store namespace of a conversation's prepared summaries."""
    return (STORE_NAMESPACE, *conversation.labels())


def read_prepared(
    store: Any, conversation: Conversation, messages: Sequence[BaseMessage], *, prune: bool = False
) -> Flow[tuple[PreparedSummary | None, tuple[int, int]]]:
    """The stored preparation for ``messages`` (``_read_store``), a failure logged (the store is never needed)."""
    try:
        found: tuple[PreparedSummary | None, tuple[int, int]] = yield from _read_store(
            store, conversation, messages, prune=prune
        )
    except Exception as exc:
        logger.warning("could not read prepared summaries from the store (%s: %s)", type(exc).__name__, exc)
        return None, (0, 0)
    return found


def mark_applied(store: Any, conversation: Conversation, prepared: PreparedSummary) -> Flow[None]:
    """Mark the stored copy of ``prepared`` applied (its calls are in this compaction's result), a failure logged."""
    value = {**prepared.to_value(), APPLIED_KEY: True}
    try:
        yield twin(store.put, store.aput, namespace(conversation), prepared.digest, value, index=False)
    except Exception as exc:
        logger.warning("could not mark a stored prepared summary applied (%s: %s)", type(exc).__name__, exc)


def _read_store(
    store: Any, conversation: Conversation, messages: Sequence[BaseMessage], *, prune: bool = False
) -> Flow[tuple[PreparedSummary | None, tuple[int, int]]]:
    """The stored preparation made from a prefix of ``messages`` (the longest); with ``prune``, the others go.

    The one that matches stays until the conversation moves past it: a worker
    killed after the archive wrote but before the checkpoint did, retried,
    applies the same preparation again (one marked applied wins over a larger
    one stored since), so the compaction has the same id and its archive items
    are not written twice. Once applied, the messages it was
    made from are gone, and the next read prunes it. Also returned: what the
    pruned ones never applied cost (calls, tokens sent), for the next result.
    """
    if conversation.thread is None:
        return None, (0, 0)
    where = namespace(conversation)
    items = yield twin(store.search, store.asearch, where, limit=_STORED)
    found: list[tuple[bool, PreparedSummary]] = []
    calls = sent = 0
    for item in items:
        if tuple(item.namespace) != where:
            continue  # a search reads the namespaces under this one too: a sub-agent's are its own
        try:
            prepared = replace(PreparedSummary.from_value(item.value), shared=True)
        except (KeyError, TypeError, ValueError) as exc:
            logger.warning("ignored a stored prepared summary this version cannot read: %s", exc)
            continue
        if prepared.matches(messages):
            found.append((bool(item.value.get(APPLIED_KEY)), prepared))
        elif prune:
            yield twin(store.delete, store.adelete, where, item.key)  # made from messages no longer there
            if not item.value.get(APPLIED_KEY):
                calls += prepared.result.summarizer_calls
                sent += prepared.result.summarizer_input_tokens
    # The same choice in every worker. One already applied that still matches was applied by a turn whose
    # checkpoint never landed (killed, cancelled): its retry applies it again, not a larger one stored since,
    # so the compaction keeps its id and the archive items that turn wrote.
    best = max(found, key=lambda f: (f[0], f[1].size, f[1].digest), default=None)
    return (best[1] if best else None), (calls, sent)


def write_prepared(store: Any, conversation: Conversation, prepared: PreparedSummary) -> Flow[None]:
    """Keep ``prepared`` in the store, where every worker of the thread finds it."""
    if conversation.thread is None:
        return
    yield twin(store.put, store.aput, namespace(conversation), prepared.digest, prepared.to_value(), index=False)
