"""What a compaction reports: a frozen value and its JSON form.

The result keeps the figures every compaction has; each feature that took
part adds its own record under its name in ``parts`` (``"facts"``, ``"pins"``,
``"clearing"``, ``"prepared"``, ``"archive"``), so a feature's figures live
with the feature. The 0.2 attribute names of those figures (``facts_found``,
``messages_pinned``, ``from_prepared`` ...) still read them for one release,
with a ``DeprecationWarning``.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

# TypedDict from typing_extensions, not from typing: pydantic builds no JSON schema from the latter
# below Python 3.12, and a graph's state schema (CompactionState holds this record) must have one.
from typing_extensions import TypedDict


class CompactionRecord(TypedDict):
    """The JSON form of a ``CompactionResult`` (what goes into graph state)."""

    summary: str
    """The summarizer's text (without the header and what the library added)."""
    original_tokens: int
    """Tokens before compaction."""
    compacted_tokens: int
    """Tokens after compaction."""
    messages_removed: int
    """Messages replaced by the summary (previous summaries included)."""
    cut_index: int
    """Index, in the input list, of the first kept message."""
    messages_kept: int
    """Messages kept verbatim (leading system messages included)."""
    summarizer_calls: int
    """Summary calls made for it (one per chunk, plus retries; a preparation's and a fold's included)."""
    chunks: int
    """Chunks the compacted region was split into."""
    updated_previous_summary: bool
    """Whether a previous summary was updated rather than a new one made."""
    forced: bool
    """Whether the cut was forced (manual compaction, nothing over budget)."""
    fallback_used: bool
    """Whether the fallback summarizer wrote (part of) the summary."""
    summarizer: str
    """Which summarizer wrote the summary."""
    summarizer_input_tokens: int
    """Estimated tokens sent to the summarizer, over all calls."""
    shortened_messages: int
    """Oversize messages shortened (head and tail kept) in the transcript."""
    over_budget: bool
    """True if the next request is still above ``window - reserve``: the messages left (``compacted_tokens``)
    and, through an adapter that knows them, the system prompt and tool schemas it sends besides."""
    summarizer_billed_input_tokens: int
    """Uncached input tokens the summarizer calls were billed (0 if not reported)."""
    summarizer_output_tokens: int
    """Output tokens the summarizer calls were billed (0 if not reported)."""
    summarizer_cache_read_tokens: int
    """Input tokens served from the provider's prompt cache (0 if not reported)."""
    summarizer_cache_write_tokens: int
    """Input tokens written to the provider's prompt cache (0 if not reported)."""
    wait_seconds: float
    """How long the turn waited for it: the summary made on the spot, or the wait for a prepared one."""
    above_landing: bool
    """True if what had to be kept left the next request above the landing target (see ``over_budget``)."""
    repeated: bool
    """True if it came a few turns after the previous compaction, which kept too much: it kept half as much."""
    parts: dict[str, dict[str, Any]]
    """Each feature's own figures, under its name (see ``langchain_compaction.features``)."""


# The 0.2 names of figures that now belong to a feature: (feature, key).
_MOVED: dict[str, tuple[str, str, Any]] = {
    "facts_found": ("facts", "found", 0),
    "facts_in_summary": ("facts", "in_summary", 0),
    "facts_added": ("facts", "added", 0),
    "facts_dropped": ("facts", "dropped", 0),
    "facts_section": ("facts", "section", ""),
    "messages_pinned": ("pins", "pinned", 0),
    "pinned_over_cap": ("pins", "over_cap", 0),
    "tool_outputs_cleared": ("clearing", "cleared", 0),
    "from_prepared": ("prepared", "applied", False),
}


@dataclass(frozen=True, slots=True)
class CompactionResult:
    """Statistics of one compaction.

    Attributes mirror ``CompactionRecord``; ``to_dict()`` gives that form.
    ``parts`` maps a feature's name to its own figures, e.g.
    ``result.parts["facts"]["added"]`` or ``result.parts["prepared"]["applied"]``.

    Example:
        >>> r = CompactionResult(summary="s", original_tokens=10, compacted_tokens=4,
        ...                      messages_removed=3, cut_index=3, parts={"pins": {"pinned": 1, "over_cap": 0}})
        >>> r.to_dict()["messages_removed"], r.part("pins")["pinned"], r.part("facts")
        (3, 1, {})
    """

    summary: str
    original_tokens: int
    compacted_tokens: int
    messages_removed: int
    cut_index: int
    messages_kept: int = 0
    summarizer_calls: int = 1
    chunks: int = 1
    updated_previous_summary: bool = False
    forced: bool = False
    fallback_used: bool = False
    summarizer: str = ""
    summarizer_input_tokens: int = 0
    shortened_messages: int = 0
    over_budget: bool = False
    summarizer_billed_input_tokens: int = 0
    summarizer_output_tokens: int = 0
    summarizer_cache_read_tokens: int = 0
    summarizer_cache_write_tokens: int = 0
    wait_seconds: float = 0.0
    above_landing: bool = False
    repeated: bool = False
    parts: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def part(self, name: str) -> Mapping[str, Any]:
        """The figures of feature ``name`` (empty when it took no part in this compaction)."""
        return self.parts.get(name, {})

    def with_part(self, name: str, **figures: Any) -> CompactionResult:
        """This result with ``figures`` added to feature ``name``'s record."""
        merged = {**self.parts, name: {**self.parts.get(name, {}), **figures}}
        return replace(self, parts=merged)

    def to_dict(self) -> CompactionRecord:
        """The result as plain JSON-serializable data."""
        record: CompactionRecord = asdict(self)  # type: ignore[assignment]
        record["parts"] = {name: dict(figures) for name, figures in self.parts.items()}
        return record

    def __getattr__(self, name: str) -> Any:
        moved = _MOVED.get(name)
        if moved is None:
            msg = f"{type(self).__name__!r} object has no attribute {name!r}"
            raise AttributeError(msg)
        feature, key, default = moved
        warnings.warn(
            f"CompactionResult.{name} is deprecated and will be removed in 0.4; read "
            f"result.parts[{feature!r}][{key!r}] (present when that feature took part)",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.part(feature).get(key, default)
