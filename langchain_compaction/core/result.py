"""What a compaction reports: a frozen value and its JSON form."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TypedDict


class CompactionRecord(TypedDict):
    """The JSON form of a ``CompactionResult`` (what goes into graph state)."""

    summary: str
    """The summarizer's text (without the header; the library's section is ``facts_section``)."""
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
    """Summary calls made (one per chunk, plus retries)."""
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
    """True if the compacted context is still above ``window - reserve``."""
    summarizer_billed_input_tokens: int
    """Uncached input tokens the summarizer calls were billed (0 if not reported)."""
    summarizer_output_tokens: int
    """Output tokens the summarizer calls were billed (0 if not reported)."""
    summarizer_cache_read_tokens: int
    """Input tokens served from the provider's prompt cache (0 if not reported)."""
    summarizer_cache_write_tokens: int
    """Input tokens written to the provider's prompt cache (0 if not reported)."""
    tool_outputs_cleared: int
    """Old tool results whose content was cleared instead of summarizing (0 when summarized)."""
    facts_found: int
    """Checked facts in force: found in the compacted messages, or carried by an earlier summary."""
    facts_in_summary: int
    """Of those, how many the summarizer's text states."""
    facts_added: int
    """Of those, how many the library added in its "Checked facts" section."""
    facts_dropped: int
    """Of those, how many were left out for the section's budget (``Budget.facts_max``)."""
    facts_section: str
    """The "Checked facts" section the library wrote under the summary ("" if none was needed)."""
    from_prepared: bool
    """Whether it applied a summary prepared in the background (``prepare_at``) rather than one made on the spot."""
    wait_seconds: float
    """How long the turn waited for it: the whole summary made on the spot, or the wait for a prepared one."""
    above_landing: bool
    """True if what had to be kept left the context above the landing target (half the threshold)."""
    repeated: bool
    """True if it came a few turns after the previous compaction, which kept too much: it kept half as much."""
    messages_pinned: int
    """Messages before the cut kept verbatim after the summary: pinned, or a pinned tool's latest exchange."""
    pinned_over_cap: int
    """Pinned exchanges summarized after all because the pinned total would pass ``Budget.pinned_max``."""


@dataclass(frozen=True, slots=True)
class CompactionResult:
    """Statistics of one compaction.

    Attributes mirror ``CompactionRecord``; ``to_dict()`` gives that form.

    Example:
        >>> r = CompactionResult(summary="s", original_tokens=10, compacted_tokens=4,
        ...                      messages_removed=3, cut_index=3)
        >>> r.to_dict()["messages_removed"]
        3
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
    tool_outputs_cleared: int = 0
    facts_found: int = 0
    facts_in_summary: int = 0
    facts_added: int = 0
    facts_dropped: int = 0
    facts_section: str = ""
    from_prepared: bool = False
    wait_seconds: float = 0.0
    above_landing: bool = False
    repeated: bool = False
    messages_pinned: int = 0
    pinned_over_cap: int = 0

    def to_dict(self) -> CompactionRecord:
        """The result as plain JSON-serializable data."""
        record: CompactionRecord = asdict(self)  # type: ignore[assignment]
        return record
