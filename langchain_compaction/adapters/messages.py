"""Compaction of a LangChain message list: ``compact`` and ``acompact``.

This is the base adapter the others build on. It converts the caller's
messages, lets the core plan and summarize, and slices the caller's own list:
the output is ``[leading system messages, summary, (a one-line user turn when
the recent part does not start with one), *recent]`` where every message but
the summary and that user turn is the caller's object.
"""

from __future__ import annotations

import logging
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from langchain_core.messages import AIMessage, BaseMessage, ChatMessage, HumanMessage, SystemMessage

from langchain_compaction.adapters._cache import checked_count
from langchain_compaction.adapters._convert import (
    SUMMARY_MARK,
    bridge_message,
    is_summary_message,
    summary_message,
    to_core,
    to_core_list,
)
from langchain_compaction.core.clearing import ClearingPlan, plan_clearing
from langchain_compaction.core.engine import (
    DriverReport,
    Outcome,
    Plan,
    Summarizer,
    arun_flow,
    compaction_flow,
    plan_compaction,
    run_flow,
)
from langchain_compaction.core.options import DEFAULT_KEEP_RECENT_TOKENS, CompactionOptions
from langchain_compaction.core.result import CompactionResult
from langchain_compaction.core.tokens import estimate_message
from langchain_compaction.core.types import Message, SummaryRequest
from langchain_compaction.errors import ConfigurationError, InvalidMessagesError
from langchain_compaction.summarizers.chat_model import as_summarizer

logger = logging.getLogger("langchain_compaction")

_DEFAULT_OPTIONS = CompactionOptions()


def _counts(messages: Sequence[BaseMessage], core: Sequence[Message], options: CompactionOptions) -> list[int]:
    counter = options.token_counter
    if counter is None:
        return [estimate_message(m) for m in core]
    # A counter that can count a whole conversation at once (the Anthropic
    # counter: one request, exact sum) does; any other is asked per message.
    count_each = getattr(counter, "count_each", None)
    values = list(count_each(messages)) if callable(count_each) else [counter([m]) for m in messages]
    if len(values) != len(messages):
        msg = f"token_counter.count_each returned {len(values)} counts for {len(messages)} messages"
        raise InvalidMessagesError(msg)
    return [checked_count(value, index) for index, value in enumerate(values)]


def estimate_message_tokens(messages: Sequence[BaseMessage]) -> int:
    """Estimate the tokens of a message list with the built-in estimate.

    Counts text, reasoning, tool-call names and arguments, tool results,
    structured blocks, a fixed cost per image and a per-message overhead.

    Args:
        messages: LangChain messages.

    Returns:
        The estimated total.

    Example:
        >>> from langchain_core.messages import HumanMessage
        >>> estimate_message_tokens([HumanMessage("a" * 400)])
        104
    """
    return sum(estimate_message(to_core(m, i)) for i, m in enumerate(messages))


def should_compact(messages: Sequence[BaseMessage], context_window: int, reserve_tokens: int) -> bool:
    """Whether automatic compaction should fire (the reference's rule).

    Args:
        messages: The conversation.
        context_window: The model's window; 0 or less means unknown.
        reserve_tokens: Tokens to keep free for the reply; 0 or less turns
            automatic compaction off.

    Returns:
        ``estimate_message_tokens(messages) > context_window - reserve_tokens``,
        or false when either number is 0 or less.
    """
    if context_window <= 0 or reserve_tokens <= 0:
        return False
    return estimate_message_tokens(messages) > context_window - reserve_tokens


def find_cut_point(messages: Sequence[BaseMessage], keep_recent_tokens: int = DEFAULT_KEEP_RECENT_TOKENS) -> int:
    """The index that separates summarized messages from kept ones.

    Walks back from the end until ``keep_recent_tokens`` is filled, keeps the
    last message even when it alone exceeds the budget, and never cuts on a
    tool result or between a tool call and its results. Leading system
    messages are never summarized.

    Args:
        messages: The conversation.
        keep_recent_tokens: The keep budget; 0 means the default (20,000),
            as in the reference.

    Returns:
        The cut index, or 0 when everything fits, when fewer than two messages
        would be summarized, or when no valid cut exists.

    Raises:
        ConfigurationError: ``keep_recent_tokens`` is negative.
    """
    if keep_recent_tokens < 0:
        raise ConfigurationError(
            "keep_recent_tokens", keep_recent_tokens, "pass a positive budget, or 0 for the default 20000"
        )
    keep = keep_recent_tokens or DEFAULT_KEEP_RECENT_TOKENS
    core = to_core_list(messages)
    # The same plan compact() makes (earlier summaries, their user turn and
    # provider compaction blocks included), without forcing.
    plan = plan_compaction(core, [estimate_message(m) for m in core], keep, force=False)
    return 0 if plan is None else plan.cut


@dataclass(frozen=True, slots=True)
class Prepared:
    """A compaction planned over a LangChain list, ready to be driven.

    Attributes:
        messages: The caller's list.
        core: Its core form.
        counts: Token count per message.
        plan: The plan (nothing summarized when ``cleared`` is set).
        flow: The summary flow for the plan.
        cleared: When clearing old tool outputs is enough: which, and their
            placeholders; the flow then makes no summarizer call.
    """

    messages: Sequence[BaseMessage]
    core: list[Message]
    counts: list[int]
    plan: Plan
    flow: Generator[SummaryRequest, str, Outcome]
    cleared: ClearingPlan | None = None


def _no_summary() -> Generator[SummaryRequest, str, Outcome]:
    """A flow that asks for nothing (clearing tool outputs was enough)."""
    return Outcome(summary="", calls=0, chunks=0, input_tokens=0, shortened=0, updated_previous=False)
    yield  # makes this a generator  # pragma: no cover


def _clearing(core: Sequence[Message], counts: Sequence[int], options: CompactionOptions) -> ClearingPlan | None:
    if not options.clear_tool_outputs or not options.context_window:
        return None
    threshold = options.context_window - options.reserve_tokens
    # Aim halfway between the keep budget and the threshold, so the next
    # turns do not clear (and rewrite the history) again at once.
    target = options.keep_recent_tokens + (threshold - options.keep_recent_tokens) // 2
    return plan_clearing(
        core,
        counts,
        keep_recent_tokens=options.keep_recent_tokens,
        target_tokens=target,
        keep_tool_uses=options.keep_tool_uses,
        exclude_tools=options.clear_exclude_tools,
        min_tokens=options.clear_min_tokens,
    )


def prepare(
    messages: Sequence[BaseMessage],
    options: CompactionOptions,
    custom_instructions: str = "",
    *,
    force: bool = True,
    counts: Sequence[int] | None = None,
    core: Sequence[Message] | None = None,
) -> Prepared | None:
    """Plan a compaction of ``messages``; ``None`` if there is nothing to do.

    Shared by every adapter: they differ only in where the result goes.

    Args:
        messages: The conversation.
        options: The options in force.
        custom_instructions: Appended to the summary prompt.
        force: Whether to force a cut when everything fits the keep budget.
        counts: Token counts per message, when the caller has them cached.
        core: The core form of each message, when the caller has it cached.

    Returns:
        The prepared compaction, or ``None``.
    """
    if not isinstance(custom_instructions, str):
        raise ConfigurationError("custom_instructions", custom_instructions, "pass a string ('' for none)")
    if not isinstance(options, CompactionOptions):
        raise ConfigurationError("options", options, "pass CompactionOptions(...) (or leave it out for the defaults)")
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        msg = (
            f"messages is a {type(messages).__name__}, not a list of messages; pass a list of "
            "LangChain messages (convert_to_messages converts dicts, tuples and strings)"
        )
        raise InvalidMessagesError(msg)
    converted = list(core) if core is not None and len(core) == len(messages) else to_core_list(messages)
    sizes = list(counts) if counts is not None else _counts(messages, converted, options)
    if not force and (clearing := _clearing(converted, sizes, options)) is not None:
        nothing = Plan(keep_head=(), start=0, cut=0, previous_summaries=(), forced=False)
        return Prepared(messages, converted, sizes, nothing, _no_summary(), clearing)
    plan = plan_compaction(converted, sizes, options.keep_recent_tokens, force=force)
    if plan is None:
        return None
    flow = compaction_flow(
        converted, plan, options, custom_instructions.strip(), originals=tuple(messages), counts=sizes
    )
    return Prepared(messages, converted, sizes, plan, flow)


def finish(
    prepared: Prepared, report: DriverReport, options: CompactionOptions
) -> tuple[CompactionResult, list[BaseMessage]]:
    """Build the compacted list and its result from a driven flow.

    Args:
        prepared: From ``prepare``.
        report: From ``run_flow`` / ``arun_flow``.
        options: The options in force.

    Returns:
        The result and ``[leading system messages, summary, (user turn), *recent]``.
    """
    if prepared.cleared is not None:
        return _finish_clearing(prepared, prepared.cleared, options)
    plan, outcome, original = prepared.plan, report.outcome, prepared.messages
    summary = summary_message(outcome.summary, last_message_id=original[-1].id if original else None)
    kept = [original[i] for i in plan.keep_head]
    # Pinned messages (up to a provider-side compaction block) come first
    # after the summary, then the recent ones, all the caller's objects.
    recent = [*(original[i] for i in plan.pinned), *original[plan.cut :]]
    written: list[BaseMessage] = [summary]
    if options.ensure_user_turn and recent and not _is_user_turn(recent[0]):
        written.append(bridge_message())
    output: list[BaseMessage] = [*kept, *written, *recent]
    summary_tokens = sum(_counts(written, [to_core(m) for m in written], options))
    compacted = (
        sum(prepared.counts[i] for i in (*plan.keep_head, *plan.pinned))
        + summary_tokens
        + sum(prepared.counts[plan.cut :])
    )
    threshold = options.context_window - options.reserve_tokens
    result = CompactionResult(
        summary=outcome.summary,
        original_tokens=sum(prepared.counts),
        compacted_tokens=compacted,
        messages_removed=plan.removed,
        cut_index=plan.cut,
        messages_kept=len(kept) + len(recent),
        summarizer_calls=outcome.calls,
        chunks=outcome.chunks,
        updated_previous_summary=outcome.updated_previous,
        forced=plan.forced,
        fallback_used=report.fallback_used,
        summarizer=report.summarizer,
        summarizer_input_tokens=outcome.input_tokens,
        shortened_messages=outcome.shortened,
        over_budget=options.context_window > 0 and compacted > threshold,
        summarizer_billed_input_tokens=report.usage.input_tokens,
        summarizer_output_tokens=report.usage.output_tokens,
        summarizer_cache_read_tokens=report.usage.cache_read_input_tokens,
        summarizer_cache_write_tokens=report.usage.cache_creation_input_tokens,
        token_ratio=_learned_ratio(options),
    )
    if result.over_budget:
        # The kept part alone is over the threshold (one huge recent message):
        # nothing more can be summarized without touching what must be kept.
        logger.warning(
            "the compacted context is still over budget: %d tokens > %d (the kept messages alone are too large)",
            compacted,
            threshold,
        )
    logger.info(
        "compacted %d messages into a summary: %d -> %d tokens (cut at %d, %d summarizer call(s)%s)",
        result.messages_removed,
        result.original_tokens,
        result.compacted_tokens,
        result.cut_index,
        result.summarizer_calls,
        ", fallback used" if result.fallback_used else "",
    )
    return result, output


def _is_user_turn(message: BaseMessage) -> bool:
    return isinstance(message, HumanMessage) or (
        isinstance(message, ChatMessage) and message.role.lower() in ("user", "human")
    )


def _as_list(messages: Sequence[BaseMessage]) -> list[BaseMessage]:
    return messages if isinstance(messages, list) else list(messages)


ANCHOR_KEY = "last_message_id"
"""Key in a summary's mark: the id of the last message when it was written."""


def _usage_total(message: AIMessage) -> int:
    usage = message.usage_metadata
    if not usage:
        return 0
    return int(usage.get("input_tokens") or 0) + int(usage.get("output_tokens") or 0)


def usage_anchor(messages: Sequence[BaseMessage]) -> tuple[int, int] | None:
    """The last AI message's index and reported tokens, if they can be trusted.

    A reply's ``usage_metadata`` measures the whole request the provider was
    sent (system prompt and tools included) plus its answer. It is trusted only
    when the reply came after the last compaction: a reply kept from before
    still carries the old, larger figure. Summaries record the id of the last
    message when they were written; one that does not disables anchoring.

    Args:
        messages: The conversation.

    Returns:
        ``(index, reported tokens)``, or ``None``.
    """
    last_ai = next((i for i in range(len(messages) - 1, -1, -1) if isinstance(messages[i], AIMessage)), None)
    if last_ai is None:
        return None
    reported = _usage_total(cast(AIMessage, messages[last_ai]))
    if reported <= 0:
        return None
    # Summaries sit in the leading system block: look there only, so a turn
    # stays O(new messages) on a long history.
    lead = 0
    while lead < last_ai and isinstance(messages[lead], SystemMessage):
        lead += 1
    summaries = [m for m in messages[:lead] if is_summary_message(m)]
    if summaries:
        mark = summaries[-1].additional_kwargs.get(SUMMARY_MARK)
        written_after = mark.get(ANCHOR_KEY) if isinstance(mark, Mapping) else None
        # The reply is fresh only if the message the summary was written
        # after comes before it (the tail after the reply is short).
        if written_after is None or any(m.id == written_after for m in messages[last_ai:]):
            return None
    return last_ai, reported


def context_tokens(messages: Sequence[BaseMessage], counts: Sequence[int], overhead: int = 0) -> int:
    """The context size a trigger compares with ``window - reserve``.

    The last reply's reported input + output tokens plus the estimate of the
    messages after it, when it reports usage from after the last compaction
    (what the provider bills); otherwise the estimates plus ``overhead`` (the
    system prompt and tool schemas not in the list, when known).

    Args:
        messages: The conversation.
        counts: Token count per message.
        overhead: Tokens sent besides the messages (already in reported usage).

    Returns:
        The context size in tokens.
    """
    anchor = usage_anchor(messages)
    if anchor is None:
        return sum(counts) + overhead
    index, reported = anchor
    return reported + sum(counts[index + 1 :])


def _learned_ratio(options: CompactionOptions) -> float | None:
    """The calibration ratio of the token counter in force, if it learns one."""
    ratio = getattr(options.token_counter, "ratio", None)
    if not callable(ratio):
        return None
    try:
        value = ratio()
    except Exception:  # a counter's ratio is informative only: never fail a compaction for it
        return None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _finish_clearing(
    prepared: Prepared, clearing: ClearingPlan, options: CompactionOptions
) -> tuple[CompactionResult, list[BaseMessage]]:
    output = list(prepared.messages)
    for index, text in zip(clearing.indices, clearing.contents):
        message = output[index]
        mark = {"kind": "cleared", "tokens": prepared.counts[index]}
        output[index] = message.model_copy(
            update={"content": text, "additional_kwargs": {**message.additional_kwargs, SUMMARY_MARK: mark}}
        )
    replaced = [output[i] for i in clearing.indices]
    before = sum(prepared.counts)
    after = before - sum(prepared.counts[i] for i in clearing.indices)
    after += sum(_counts(replaced, [to_core(m) for m in replaced], options))
    result = CompactionResult(
        summary="",
        original_tokens=before,
        compacted_tokens=after,
        messages_removed=0,
        cut_index=0,
        messages_kept=len(output),
        summarizer_calls=0,
        chunks=0,
        summarizer="none",
        tool_outputs_cleared=len(clearing.indices),
    )
    logger.info(
        "cleared %d old tool outputs instead of summarizing: %d -> %d tokens",
        len(clearing.indices),
        before,
        after,
    )
    return result, output


@dataclass(frozen=True, slots=True)
class _Job:
    """A compaction ready to drive: what the sync and async entry points share."""

    prepared: Prepared
    summarizer: Summarizer
    fallback: Summarizer | None
    options: CompactionOptions


def _job(
    model: Any,
    messages: Sequence[BaseMessage],
    options: CompactionOptions | None,
    fallback: Any,
    instructions: str,
    *,
    auto: bool,
) -> _Job | list[BaseMessage]:
    """Everything before the summary calls; the messages as a list when there is nothing to do."""
    if options is None and not auto:
        options = _DEFAULT_OPTIONS
    if not isinstance(options, CompactionOptions):
        advice = (
            "pass CompactionOptions(context_window=...)" if auto else "pass CompactionOptions(...) (or leave it out)"
        )
        raise ConfigurationError("options", options, advice)
    summarizer, backup = _resolve(model, fallback)
    if auto and not over_threshold(messages, options):
        return _as_list(messages)
    prepared = prepare(messages, options, instructions, force=not auto)
    if prepared is None:
        return _as_list(messages)
    return _Job(prepared, summarizer, backup, options)


def _resolve(model: object, fallback: object | None) -> tuple[Summarizer, Summarizer | None]:
    return as_summarizer(model), None if fallback is None else as_summarizer(fallback, field="fallback")


def compact(
    model: Any,
    messages: Sequence[BaseMessage],
    options: CompactionOptions | None = None,
    custom_instructions: str = "",
    *,
    fallback: Any = None,
) -> tuple[CompactionResult | None, list[BaseMessage]]:
    """Summarize the older messages and keep the recent ones.

    Like the reference's ``Compact``, this always compacts when called: when
    nothing is over the keep budget it forces a cut that keeps only the last
    message (use ``should_compact`` first for automatic compaction).

    Args:
        model: A chat model, Runnable, function from prompt to text, or
            summarizer (``ExtractiveSummarizer()`` works offline).
        messages: The conversation; it is never modified.
        options: Budgets and prompts (``None`` for the defaults).
        custom_instructions: Appended to the summary prompt as additional
            instructions, e.g. ``"keep the API design decisions"``.
        fallback: A summarizer used if ``model`` fails; the result then says
            ``fallback_used=True``.

    Returns:
        ``(result, new_messages)``, or ``(None, messages)`` when there is
        nothing to compact.

    Raises:
        SummarizationError: The summary failed (chained to the cause); the
            caller's list is untouched.
        InvalidMessagesError: ``messages`` holds something that is not a message.

    Example:
        >>> from langchain_core.messages import AIMessage, HumanMessage
        >>> msgs = [HumanMessage("fix bug 1"), AIMessage("done"), HumanMessage("thanks")]
        >>> result, out = compact(lambda prompt: "## Goal\\nFix bug 1", msgs)
        >>> result.messages_removed, out[-1] is msgs[-1]
        (2, True)
    """
    job = _job(model, messages, options, fallback, custom_instructions, auto=False)
    if isinstance(job, list):
        return None, job
    report = run_flow(job.prepared.flow, job.summarizer, fallback=job.fallback, timeout=job.options.timeout)
    return finish(job.prepared, report, job.options)


async def acompact(
    model: Any,
    messages: Sequence[BaseMessage],
    options: CompactionOptions | None = None,
    custom_instructions: str = "",
    *,
    fallback: Any = None,
) -> tuple[CompactionResult | None, list[BaseMessage]]:
    """The async twin of ``compact``: the same flow, awaiting the model."""
    job = _job(model, messages, options, fallback, custom_instructions, auto=False)
    if isinstance(job, list):
        return None, job
    report = await arun_flow(job.prepared.flow, job.summarizer, fallback=job.fallback, timeout=job.options.timeout)
    return finish(job.prepared, report, job.options)


def over_threshold(messages: Sequence[BaseMessage], options: CompactionOptions) -> bool:
    """Whether automatic compaction should fire for ``messages`` under ``options``.

    ``should_compact`` with the options' ``token_counter`` (when set) and
    anchored on reported usage (see ``context_tokens``).

    Args:
        messages: The conversation.
        options: The options in force.

    Returns:
        True when the context exceeds ``context_window - reserve_tokens``.
    """
    if options.context_window <= 0 or options.reserve_tokens <= 0:
        return False
    core = to_core_list(messages)
    size = context_tokens(messages, _counts(messages, core, options))
    return size > options.context_window - options.reserve_tokens


def auto_compact(
    model: Any,
    messages: Sequence[BaseMessage],
    options: CompactionOptions,
    *,
    fallback: Any = None,
) -> tuple[CompactionResult | None, list[BaseMessage]]:
    """Compact only when the conversation is over the threshold.

    The automatic step the adapters take before each model call: nothing
    when ``window - reserve`` is not exceeded (counted with the options'
    ``token_counter``); else, with ``clear_tool_outputs``, clearing old tool
    outputs when that is enough; else a summary, with the budget cut.

    Args:
        model: Writes the summary (see ``compact``).
        messages: The conversation; it is never modified.
        options: Budgets; ``context_window`` must be set for anything to happen.
        fallback: A summarizer used if ``model`` fails.

    Returns:
        ``(result, new_messages)``, or ``(None, messages)`` when nothing was needed.
    """
    job = _job(model, messages, options, fallback, "", auto=True)
    if isinstance(job, list):
        return None, job
    report = run_flow(job.prepared.flow, job.summarizer, fallback=job.fallback, timeout=job.options.timeout)
    return finish(job.prepared, report, job.options)


async def aauto_compact(
    model: Any,
    messages: Sequence[BaseMessage],
    options: CompactionOptions,
    *,
    fallback: Any = None,
) -> tuple[CompactionResult | None, list[BaseMessage]]:
    """The async twin of ``auto_compact``."""
    job = _job(model, messages, options, fallback, "", auto=True)
    if isinstance(job, list):
        return None, job
    report = await arun_flow(job.prepared.flow, job.summarizer, fallback=job.fallback, timeout=job.options.timeout)
    return finish(job.prepared, report, job.options)
