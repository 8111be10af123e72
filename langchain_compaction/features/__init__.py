"""The features of a compaction, each a part the turn calls at named seams (see ``features.base``).

Pass them to an adapter as a list, the way ``ContextEditingMiddleware`` takes
its edits::

    CompactionNode(model, options, features=[CheckedFacts(), Pins(), Archive(), PrepareAhead(at=0.7)])

``features=None`` (the default) means ``default_features()``: checked facts
and pins (the latest ``write_todos`` call). Every feature owns its options and
its figures in ``CompactionResult.parts[<name>]``:

========================  ==========  =====================================================
feature                   name        what it does
========================  ==========  =====================================================
``CheckedFacts()``        facts       checks each summary against facts found without a model
``Pins()``                pins        keeps pinned messages and tools verbatim after the summary
``ClearToolOutputs()``    clearing    clears old tool outputs first; no summary when enough
``PrepareAhead(at=0.7)``  prepared    prepares the next compaction in the background
``Archive()``             archive     keeps every removed message in the LangGraph store
``CacheAligned()``        (none)      sends the summarizer the conversation's own prefix
``RequireSections()``     (none)      rejects a summary without the checkpoint's headings
========================  ==========  =====================================================
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from langchain_compaction.core.options import CompactionOptions
from langchain_compaction.errors import ConfigurationError
from langchain_compaction.features.archive import Archive
from langchain_compaction.features.base import Addition, Commit, Draft, Feature
from langchain_compaction.features.cache import CacheAligned
from langchain_compaction.features.clearing import ClearToolOutputs
from langchain_compaction.features.facts import CheckedFacts
from langchain_compaction.features.pins import Pins
from langchain_compaction.features.prepare import PrepareAhead
from langchain_compaction.features.sections import RequireSections

__all__ = [
    "Addition",
    "Archive",
    "CacheAligned",
    "CheckedFacts",
    "ClearToolOutputs",
    "Commit",
    "Draft",
    "Feature",
    "Pins",
    "PrepareAhead",
    "RequireSections",
    "default_features",
]

Where = Literal["graph", "history", "function"]
"""Which kind of adapter takes the features (some make no sense everywhere)."""

_REFUSED: dict[Where, dict[type[Feature], str]] = {
    "history": {
        ClearToolOutputs: "chat memory always summarizes, so its archive= history receives every original",
        Archive: "chat memory archives into its archive= history (a BaseChatMessageHistory), not a LangGraph store",
    },
    "function": {
        PrepareAhead: (
            "a summary prepared ahead needs an adapter that sees the conversation grow (CompactionNode, "
            "CompactionMiddleware, CompactingChatMessageHistory); these functions compact at once"
        ),
        Archive: "the functions have no LangGraph store; archive in the node or the middleware",
    },
    "graph": {},
}


def default_features() -> list[Feature]:
    """The features on when none are given: checked facts and pins.

    Example:
        >>> [type(f).__name__ for f in default_features()]
        ['CheckedFacts', 'Pins']
    """
    return [CheckedFacts(), Pins()]


def _as_typed(kind: Any, names: Mapping[str, str], legacy: Mapping[str, Any]) -> Feature:
    """``kind`` made from the 0.2 keywords ``names`` maps to its fields; an invalid one is named as it was typed."""
    try:
        return kind(**{new: legacy[old] for old, new in names.items() if old in legacy})  # type: ignore[no-any-return]
    except ConfigurationError as error:
        typed = next((old for old, new in names.items() if new == error.field), error.field)
        advice = str(error).split(" is invalid: ", 1)[-1]
        raise ConfigurationError(typed, error.value, advice) from error


def from_legacy(legacy: Mapping[str, Any], adapter: Mapping[str, Any]) -> list[Feature]:
    """The features the deprecated 0.2 keywords ask for (``CompactionOptions`` and adapter keywords)."""
    features: list[Feature] = []
    if legacy.get("check_facts", True) is not False:
        features.append(CheckedFacts())
    pinning = {"pin_tools": "tools", "pinned_max_tokens": "max_tokens"}
    features.append(_as_typed(Pins, pinning, {k: v for k, v in legacy.items() if k in pinning and v is not None}))
    if legacy.get("clear_tool_outputs"):
        clearing = {"keep_tool_uses": "keep_tool_uses", "clear_exclude_tools": "exclude_tools"}
        clearing["clear_min_tokens"] = "min_tokens"
        features.append(_as_typed(ClearToolOutputs, clearing, legacy))
    if legacy.get("prepare_at") is not None:
        features.append(PrepareAhead(at=legacy["prepare_at"], **adapter.get("prepare", {})))
    mode = legacy.get("summary_mode", "transcript")
    if mode not in ("transcript", "cache_aligned"):
        raise ConfigurationError("summary_mode", mode, "pass 'transcript' or 'cache_aligned' (or use CacheAligned())")
    if mode == "cache_aligned":
        features.append(CacheAligned())
    if legacy.get("require_sections"):
        features.append(RequireSections())
    archive = Archive.of(adapter.get("archive"))
    if archive is not None:
        features.append(archive)
    return features


def resolve(
    features: Sequence[Feature] | None,
    options: CompactionOptions,
    *,
    where: Where,
    adapter: Mapping[str, Any] | None = None,
) -> tuple[Feature, ...]:
    """The features an adapter runs with: as given, or the defaults (or what deprecated keywords ask for).

    Args:
        features: What the user passed (``None``: the defaults).
        options: The options in force (features are checked against them).
        where: Which kind of adapter takes them.
        adapter: The adapter's deprecated keywords that were given
            (``archive``; ``prepare``: ``PrepareAhead`` keywords).

    Raises:
        ConfigurationError: A feature is not a feature, is given twice, makes
            no sense here, or both ``features`` and deprecated keywords are given.
    """
    adapter = adapter or {}
    if features is None:
        chosen = from_legacy(options.legacy, adapter) if options.legacy or adapter else default_features()
    else:
        if options.legacy or adapter:
            given = sorted({*options.legacy, *adapter})
            raise ConfigurationError(
                "features", features, f"pass either features=[...] or the deprecated keywords {given}, not both"
            )
        if isinstance(features, (str, bytes)) or not isinstance(features, Sequence):
            raise ConfigurationError("features", features, "pass a list of features, e.g. [CheckedFacts(), Pins()]")
        chosen = list(features)
    kinds: set[type[Feature]] = set()
    for feature in chosen:
        if not isinstance(feature, Feature):
            raise ConfigurationError(
                "features", feature, "pass feature objects from langchain_compaction.features (e.g. Archive())"
            )
        kind = next(k for k in type(feature).__mro__ if k in _KINDS)
        if kind in kinds:
            raise ConfigurationError("features", feature, f"{kind.__name__} is given twice; pass it once")
        kinds.add(kind)
        refused = _REFUSED[where].get(kind)
        if refused is not None:
            raise ConfigurationError("features", feature, f"{kind.__name__} cannot be used here: {refused}")
        if where == "history" and isinstance(feature, PrepareAhead) and feature.in_store:
            raise ConfigurationError(
                "in_store",
                True,
                "chat memory has no LangGraph store to keep preparations in: pass PrepareAhead(in_store=False) "
                "(processes sharing a session take turns by its lock=)",
            )
    return tuple(feature.bind(options) for feature in chosen)


_KINDS = (CheckedFacts, Pins, ClearToolOutputs, PrepareAhead, Archive, CacheAligned, RequireSections, Feature)
