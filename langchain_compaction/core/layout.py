"""What a compaction writes: the summary message's text, the output's order, the figures.

Three things every adapter needs and none computes on its own:

- ``compose_summary`` / ``summary_body``: the one layout of a summary message
  (header, the notice that it is data, the summarizer's text, then any section
  the library itself adds), and how to read the summarizer's text back from a
  summary written by this or any earlier version.
- ``layout``: the order of the compacted conversation, as indices into the
  caller's list: ``[leading system messages, summary, (bridge), *kept]``,
  where the bridge is a one-line user turn put after the summary when the kept
  part does not open with one. Each adapter maps the indices back to its own
  objects, so kept messages are the caller's, never rebuilt.
- ``compaction_result`` / ``clearing_result``: the token arithmetic of the
  result.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from langchain_compaction.core import prompts
from langchain_compaction.core.facts import SECTION_HEADING, SECTION_NOTE
from langchain_compaction.core.options import CompactionOptions
from langchain_compaction.core.plan import Layout, Plan
from langchain_compaction.core.result import CompactionResult
from langchain_compaction.core.types import Message

_NOTE_START = prompts.RECALL_NOTE.split("{", 1)[0]

if TYPE_CHECKING:
    from langchain_compaction.core.clearing import ClearingPlan
    from langchain_compaction.core.engine import DriverReport
    from langchain_compaction.core.facts import FactCheck


def compose_summary(summary: str, sections: Sequence[str] = ()) -> str:
    """The content of a summary message.

    Args:
        summary: The summarizer's text.
        sections: Sections the library adds after it, each with its own heading.

    Returns:
        The header line, the notice, the summary, then the sections.

    Example:
        >>> compose_summary("## Goal\\n- ship").splitlines()[0]
        '[Conversation summary — earlier messages were compacted]'
    """
    pieces = [f"{prompts.SUMMARY_HEADER}\n{prompts.SUMMARY_NOTICE}", summary.strip(), *(s.strip() for s in sections)]
    return "\n\n".join(p for p in pieces if p)


def summary_body(content: str) -> str:
    """The summarizer's text of a summary message, without the header, the notice and what the library added.

    The library's "Checked facts" section and its archive note are left out:
    the facts are recorded in the summary's mark and checked again at the
    next compaction, so a summarizer updating the summary never copies the
    library's lines into its own text.

    Args:
        content: A summary message's text.

    Returns:
        What ``compose_summary`` was given as ``summary``.
    """
    body = content.strip()
    for line in (prompts.SUMMARY_HEADER, prompts.SUMMARY_NOTICE, prompts.LANGCHAIN_SUMMARY_PREFIX):
        if body.startswith(line):
            body = body[len(line) :].lstrip()
    added = [body.find(f"{SECTION_HEADING}\n{SECTION_NOTE}"), body.find(_NOTE_START)]
    found = [i for i in added if i >= 0]
    return body[: min(found)].rstrip() if found else body


def layout(messages: Sequence[Message], plan: Plan, options: CompactionOptions) -> Layout:
    """The order of the compacted conversation for ``plan``.

    Args:
        messages: The conversation.
        plan: The plan.
        options: The options in force (``ensure_user_turn``).

    Returns:
        The layout.
    """
    kept = (*plan.provider_prefix, *plan.pinned, *range(plan.cut, len(messages)))
    # Anthropic's API rejects a conversation whose first turn is not the
    # user's, and an agent compacted mid-loop keeps its tool call first.
    bridge = options.ensure_user_turn and bool(kept) and messages[kept[0]].role != "user"
    return Layout(plan.keep_head, bridge, kept)


def compaction_result(
    plan: Plan,
    shape: Layout,
    counts: Sequence[int],
    written_tokens: int,
    *,
    report: DriverReport,
    options: CompactionOptions,
    facts: FactCheck | None = None,
) -> CompactionResult:
    """The figures of one summary compaction.

    Args:
        plan: The plan it followed.
        shape: Its layout.
        counts: Token count per message of the input.
        written_tokens: Tokens of what the library wrote (summary and bridge).
        report: What the summary flow and its driver reported.
        options: The options in force.
        facts: The check of the summary against the facts, if made.

    Returns:
        The result.
    """
    outcome, usage = report.outcome, report.usage
    compacted = sum(counts[i] for i in (*shape.head, *shape.kept)) + written_tokens
    threshold, landing = options.budget.threshold, options.budget.landing
    return CompactionResult(
        summary=outcome.summary,
        original_tokens=sum(counts),
        compacted_tokens=compacted,
        messages_removed=plan.removed,
        cut_index=plan.cut,
        messages_kept=len(shape.head) + len(shape.kept),
        summarizer_calls=outcome.calls,
        chunks=outcome.chunks,
        updated_previous_summary=outcome.updated_previous,
        forced=plan.forced,
        fallback_used=report.fallback_used,
        summarizer=report.summarizer,
        summarizer_input_tokens=outcome.input_tokens,
        shortened_messages=outcome.shortened,
        over_budget=threshold is not None and compacted > threshold,
        above_landing=landing is not None and compacted > landing,
        messages_pinned=len(plan.pinned),
        pinned_over_cap=plan.pinned_over_cap,
        summarizer_billed_input_tokens=usage.input_tokens,
        summarizer_output_tokens=usage.output_tokens,
        summarizer_cache_read_tokens=usage.cache_read_input_tokens,
        summarizer_cache_write_tokens=usage.cache_creation_input_tokens,
        facts_found=facts.found if facts is not None else 0,
        facts_in_summary=facts.in_summary if facts is not None else 0,
        facts_added=facts.added if facts is not None else 0,
        facts_dropped=facts.dropped if facts is not None else 0,
        facts_section=facts.section if facts is not None else "",
    )


def clearing_result(clearing: ClearingPlan, counts: Sequence[int], placeholder_tokens: int) -> CompactionResult:
    """The figures of a compaction that only cleared old tool outputs.

    Args:
        clearing: What was cleared.
        counts: Token count per message of the input.
        placeholder_tokens: Tokens of the cleared messages as rewritten.

    Returns:
        The result (no summary, no summarizer call).
    """
    before = sum(counts)
    after = before - sum(counts[i] for i in clearing.indices) + placeholder_tokens
    return CompactionResult(
        summary="",
        original_tokens=before,
        compacted_tokens=after,
        messages_removed=0,
        cut_index=0,
        messages_kept=len(counts),
        summarizer_calls=0,
        chunks=0,
        summarizer="none",
        tool_outputs_cleared=len(clearing.indices),
    )
