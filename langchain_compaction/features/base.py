"""What a feature is: a part of the compaction that plugs into the turn at named seams.

A compaction is one turn flow (``_lc.turn``): check, stage, plan, summarize,
finish, commit. A feature is a small object that owns its options, its key in
the summary's mark and its record in the result, and that the turn calls at
one or more seams, the way LangChain's ``ContextEditingMiddleware`` calls each
of its edits:

- ``protect``: what may not be cut (kept verbatim after the summary);
- ``instead``: a cheaper step than a summary, tried first;
- ``add``: what is added after the summary (a section, keys in its mark);
- ``commit``: what happens when a compaction is committed, before the summary
  is asked for (or a prepared one applied) and before the state or store is
  written; it may hold the compaction back for this turn.

What runs ahead of the threshold (``PrepareAhead``), what the summarizer is
sent (``CacheAligned``) and what its answer must hold (``RequireSections``)
change the turn itself; the turn asks for each by its kind.

A seam a feature does not override costs nothing: the turn calls, at each
seam, only the features that implement it. Removing a feature is removing its
module and its line in ``langchain_compaction.features``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from langchain_compaction.core.options import CompactionOptions
from langchain_compaction.core.plan import Plan
from langchain_compaction.core.types import Message

if TYPE_CHECKING:
    from langchain_compaction.core.effects import Flow


@dataclass(frozen=True, slots=True)
class Draft:
    """A summary as the summarizer wrote it, before the features add theirs.

    Attributes:
        messages: The conversation, in core form.
        plan: The compaction's plan.
        kept: Indices of the messages kept after the summary.
        summary: The summarizer's text.
        options: The options in force.
    """

    messages: Sequence[Message]
    plan: Plan
    kept: Sequence[int]
    summary: str
    options: CompactionOptions


@dataclass(frozen=True, slots=True)
class Addition:
    """What a feature adds to a summary.

    Attributes:
        section: Text written under the summary ("" for none).
        mark: Keys it records in the summary's mark.
        record: Its figures for ``CompactionResult.parts``.
    """

    section: str = ""
    mark: Mapping[str, Any] = field(default_factory=dict)
    record: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Commit:
    """A compaction about to be committed: what it takes out, and where.

    Attributes:
        removed: The caller's messages it takes out of the state (or clears),
            with their positions in the whole conversation, in order.
        mark: The summary's record as it will be written (``core.record``;
            empty for a clearing, which writes no summary).
        conversation: Which conversation (``_lc.conversation.Conversation``).
        store: The graph's LangGraph store, if it has one.
        ids: The ids of the conversation's messages as the compaction reads
            them (what is in this timeline, beside what its summaries cover).
        cleared: The placeholders of outputs cleared earlier (their outputs
            archived then) that it takes out too: their positions and ids.
    """

    removed: Sequence[tuple[int, Any]]
    mark: Mapping[str, Any]
    conversation: Any
    store: Any = None
    ids: frozenset[str] = frozenset()
    cleared: Sequence[tuple[int, str]] = ()


def _made(kind: type[Feature], given: dict[str, Any]) -> Feature:
    """A feature of ``kind`` made with ``given`` (``Feature.__reduce__``: how copies and unpickled ones are made)."""
    return kind(**given)


class Feature:
    """A part of the compaction; subclasses override the seams they plug into.

    Attributes:
        name: Its key in ``CompactionResult.parts`` (and in the mark, if it keeps one).
    """

    name: ClassVar[str] = ""

    def __reduce__(self) -> tuple[Any, ...]:
        """Copied and pickled as made: by the options it was given (what it holds at run time starts afresh)."""
        fields: tuple[dataclasses.Field[Any], ...] = dataclasses.fields(self) if dataclasses.is_dataclass(self) else ()
        given = {f.name: getattr(self, f.name) for f in fields if f.init}
        return (_made, (type(self), given))

    def bind(self, options: CompactionOptions) -> Feature:
        """This feature checked against ``options`` (raises ``ConfigurationError`` when it cannot work)."""
        return self

    def require(self, store: Any) -> None:
        """Raise ``ConfigurationError`` when the turn's place lacks what it needs (run on every turn, first thing)."""

    def reserve(self, options: CompactionOptions) -> int:
        """Tokens of the summary's budget it adds under the summary (the summarizer is asked to leave them)."""
        return 0

    def protect(self, messages: Sequence[Message], counts: Sequence[int], start: int, cut: int) -> tuple[Any, ...]:
        """What in ``[start, cut)`` may not be cut: ``(indices, left out for a cap)``."""
        return (), 0

    def instead(self, messages: Sequence[Message], counts: Sequence[int], protected: frozenset[int]) -> Any:
        """A cheaper step than a summary, or ``None`` when it is not enough."""
        return None

    def add(self, draft: Draft) -> Addition | None:
        """What to add to the summary ``draft``."""
        return None

    def commit(self, commit: Commit) -> Flow[Mapping[str, Any] | None]:
        """Run before the compaction is made and written: its figures, or ``None`` to hold it back this turn."""
        return {}
        yield  # pragma: no cover - makes this a generator

    @classmethod
    def overrides(cls, seam: str) -> bool:
        """Whether this kind of feature plugs into ``seam``."""
        return getattr(cls, seam) is not getattr(Feature, seam)
