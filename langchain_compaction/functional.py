"""Compaction as plain functions over a LangChain message list.

``compact`` / ``acompact`` compact now; ``auto_compact`` / ``aauto_compact``
compact only when the conversation is over the threshold (the step the
adapters take before each model call); ``should_compact`` answers that
question alone; ``find_cut_point`` says where the cut would fall. The output is
``[leading system messages, summary, (a one-line user turn when the kept part
does not start with one), *kept]``, where every message but the summary and
that user turn is the caller's object.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.messages import BaseMessage

from langchain_compaction._lc.conversation import Conversation
from langchain_compaction._lc.convert import to_core_list
from langchain_compaction._lc.counting import counts_and_core
from langchain_compaction._lc.turn import Outcome, Place, Trigger, Turn
from langchain_compaction.core.context import needs_compaction, over_threshold
from langchain_compaction.core.effects import Flow, adrive, drive
from langchain_compaction.core.options import DEFAULT_KEEP_RECENT_TOKENS, CompactionOptions, check_int
from langchain_compaction.core.plan import plan_compaction
from langchain_compaction.core.result import CompactionResult
from langchain_compaction.core.tokens import estimate_message
from langchain_compaction.errors import ConfigurationError
from langchain_compaction.features import Feature

__all__ = ["aauto_compact", "acompact", "auto_compact", "compact", "find_cut_point", "should_compact"]


def should_compact(
    messages: Sequence[BaseMessage],
    context_window: int | CompactionOptions | None = None,
    reserve_tokens: int | None = None,
    *,
    options: CompactionOptions | None = None,
    overhead_tokens: int = 0,
) -> bool:
    """Whether automatic compaction should fire: exactly what the adapters decide.

    Called as pi's ``ShouldCompact(messages, window, reserve)``, it compares
    the context with ``context_window - reserve_tokens`` (false when either is
    0 or less), counting with the built-in estimate. Called with ``options=``,
    it counts with the options' ``token_counter``, as the node, the middleware
    and chat memory do. Either way the context size is anchored on the last
    reply's reported usage when it can be trusted (see ``core.context``).

    Args:
        messages: The conversation.
        context_window: The model's window; or the options, given second as
            ``compact`` takes them (``should_compact(messages, options)``).
        reserve_tokens: Tokens kept free for the reply.
        options: The options in force, instead of the two numbers.
        overhead_tokens: Tokens every request sends besides ``messages``
            (see ``auto_compact``), added to the context.

    Returns:
        True when the context exceeds the threshold.

    Example:
        >>> from langchain_core.messages import HumanMessage
        >>> should_compact([HumanMessage("a" * 4_000)], 1_000, 200)
        True
        >>> should_compact([HumanMessage("a" * 4_000)], options=CompactionOptions(context_window=200_000))
        False
        >>> should_compact(
        ...     [HumanMessage("a" * 4_000)], options=CompactionOptions(context_window=200_000), overhead_tokens=190_000
        ... )
        True
    """
    overhead = _overhead(overhead_tokens)
    if isinstance(context_window, CompactionOptions) and options is None and reserve_tokens is None:
        # The options given second, as compact(), auto_compact() and acompact() take them.
        context_window, options = None, context_window
    if options is None:
        window, reserve = _window_and_reserve(context_window, reserve_tokens)
        if window <= 0 or reserve <= 0:
            return False
        counts, core = counts_and_core(messages, CompactionOptions())
        return over_threshold(core, counts, window - reserve, overhead)
    if context_window is not None or reserve_tokens is not None:
        name, value = (
            ("context_window", context_window) if context_window is not None else ("reserve_tokens", reserve_tokens)
        )
        raise ConfigurationError(
            name, value, "pass the options (second, or as options=) or context_window and reserve_tokens, not both"
        )
    counts, core = counts_and_core(messages, _required(options))
    return needs_compaction(core, counts, options, overhead)


def find_cut_point(
    messages: Sequence[BaseMessage], keep_recent_tokens: int | CompactionOptions = DEFAULT_KEEP_RECENT_TOKENS
) -> int:
    """The index that separates summarized messages from kept ones.

    Walks back from the end until ``keep_recent_tokens`` is filled, keeps the
    last message even when it alone exceeds the budget, and never cuts on a
    tool result or between a tool call and its results. Leading system
    messages are never summarized.

    Args:
        messages: The conversation.
        keep_recent_tokens: The keep budget; 0 means the default (20,000),
            as in pi's compaction. ``CompactionOptions`` instead: their keep
            budget, counting with their ``token_counter``, as ``compact`` does.

    Returns:
        The cut index, or 0 when everything fits, when fewer than two messages
        would be summarized, or when no valid cut exists.

    Raises:
        ConfigurationError: ``keep_recent_tokens`` is negative.
    """
    if isinstance(keep_recent_tokens, CompactionOptions):
        # Options in the budget's place, as compact() and should_compact() take them.
        keep = keep_recent_tokens.budget.keep
        counts, core = counts_and_core(messages, keep_recent_tokens)
    else:
        keep = CompactionOptions(keep_recent_tokens=keep_recent_tokens).budget.keep
        core = to_core_list(messages)
        counts = [estimate_message(m) for m in core]
    # The same plan compact() makes (earlier summaries, their user turn and
    # provider compaction blocks included), without forcing.
    plan = plan_compaction(core, counts, keep, force=False)
    return 0 if plan is None else plan.cut


def _compaction(
    model: Any,
    messages: Sequence[BaseMessage],
    options: object,
    fallback: Any,
    instructions: str,
    *,
    trigger: Trigger,
    features: Sequence[Feature] | None,
    overhead: object,
) -> Flow[tuple[CompactionResult | None, list[BaseMessage]]]:
    turn = Turn.build(model, options, fallback, features, where="function")
    place = Place(Conversation(None), overhead=_overhead(overhead))
    outcome: Outcome = yield from turn.run(messages, place, trigger=trigger, instructions=instructions)
    if outcome.result is None or outcome.messages is None:
        return None, messages if isinstance(messages, list) else list(messages)
    return outcome.result, outcome.messages


def compact(
    model: Any,
    messages: Sequence[BaseMessage],
    options: CompactionOptions | None = None,
    custom_instructions: str = "",
    *,
    fallback: Any = None,
    features: Sequence[Feature] | None = None,
    overhead_tokens: int = 0,
) -> tuple[CompactionResult | None, list[BaseMessage]]:
    """Summarize the older messages and keep the recent ones.

    Like pi's ``Compact``, this always compacts when called: when nothing is
    over the keep budget it forces a cut that keeps only the last message (use
    ``auto_compact``, or ``should_compact`` first, for automatic compaction).

    Args:
        model: A chat model, Runnable, function from prompt to text, or
            summarizer (``ExtractiveSummarizer()`` works offline).
        messages: The conversation; it is never modified.
        options: Budgets and prompts (``None`` for the defaults).
        custom_instructions: Appended to the summary prompt as additional
            instructions, e.g. ``"keep the API design decisions"``.
        fallback: A summarizer used if ``model`` fails; the result then says
            ``fallback_used=True``.
        features: The features (``langchain_compaction.features``; checked
            facts and pins when ``None``).
        overhead_tokens: Tokens every request sends besides ``messages``
            (see ``auto_compact``): the cut is planned over them, so the
            compacted messages leave them room.

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
    return drive(
        _compaction(
            model,
            messages,
            options,
            fallback,
            custom_instructions,
            trigger="force",
            features=features,
            overhead=overhead_tokens,
        )
    )


async def acompact(
    model: Any,
    messages: Sequence[BaseMessage],
    options: CompactionOptions | None = None,
    custom_instructions: str = "",
    *,
    fallback: Any = None,
    features: Sequence[Feature] | None = None,
    overhead_tokens: int = 0,
) -> tuple[CompactionResult | None, list[BaseMessage]]:
    """The async twin of ``compact``: the same flow, awaiting the model, never blocking the loop."""
    return await adrive(
        _compaction(
            model,
            messages,
            options,
            fallback,
            custom_instructions,
            trigger="force",
            features=features,
            overhead=overhead_tokens,
        )
    )


def auto_compact(
    model: Any,
    messages: Sequence[BaseMessage],
    options: CompactionOptions,
    *,
    fallback: Any = None,
    features: Sequence[Feature] | None = None,
    custom_instructions: str = "",
    overhead_tokens: int = 0,
) -> tuple[CompactionResult | None, list[BaseMessage]]:
    """Compact only when the conversation is over the threshold.

    The automatic step the adapters take before each model call: nothing
    when ``should_compact(messages, options=options)`` is false; else, with
    ``clear_tool_outputs``, clearing old tool outputs when that is enough;
    else a summary, with the budget cut.

    Args:
        model: Writes the summary (see ``compact``).
        messages: The conversation; it is never modified.
        options: Budgets; ``context_window`` must be set for anything to happen.
        fallback: A summarizer used if ``model`` fails.
        features: The features (``langchain_compaction.features``; checked
            facts and pins when ``None``), ``ClearToolOutputs`` among them.
        custom_instructions: Appended to the summary prompt when one is made
            (see ``compact``).
        overhead_tokens: Tokens every request sends besides ``messages``: its
            tool schemas, a system prompt given apart, a structured output's
            schema (``CompactionMiddleware`` counts an agent's itself). Added
            to the context compared with the threshold, and held fixed when
            the cut is planned, so the compacted messages fit the window with
            them. 0 (the default): none.

    Returns:
        ``(result, new_messages)``, or ``(None, messages)`` when nothing was needed.
    """
    return drive(
        _compaction(
            model,
            messages,
            _required(options),
            fallback,
            custom_instructions,
            trigger="auto",
            features=features,
            overhead=overhead_tokens,
        )
    )


async def aauto_compact(
    model: Any,
    messages: Sequence[BaseMessage],
    options: CompactionOptions,
    *,
    fallback: Any = None,
    features: Sequence[Feature] | None = None,
    custom_instructions: str = "",
    overhead_tokens: int = 0,
) -> tuple[CompactionResult | None, list[BaseMessage]]:
    """The async twin of ``auto_compact``."""
    return await adrive(
        _compaction(
            model,
            messages,
            _required(options),
            fallback,
            custom_instructions,
            trigger="auto",
            features=features,
            overhead=overhead_tokens,
        )
    )


def _window_and_reserve(context_window: object, reserve_tokens: object) -> tuple[int, int]:
    """``should_compact``'s two numbers, or the error naming the one passed wrongly and what to pass."""
    numbers = (("context_window", context_window), ("reserve_tokens", reserve_tokens))
    advice = "tokens (0 or less turns the check off, as in pi)"
    for name, value in numbers:
        if isinstance(value, CompactionOptions):
            # Options among the numbers: say where they go rather than asking for a whole number.
            raise ConfigurationError(name, value, "pass the options alone: should_compact(messages, options)")
        if value is None:
            msg = (
                f"pass {name} with the other number ({advice}), or the options alone: should_compact(messages, options)"
            )
            raise ConfigurationError(name, None, msg)
    window, reserve = (
        check_int(name, value, minimum=None, advice=f"{advice}, or CompactionOptions") for name, value in numbers
    )
    return window, reserve


def _overhead(tokens: object) -> int:
    advice = "0 or more: the tokens every request sends besides the messages"
    return check_int("overhead_tokens", tokens, minimum=0, advice=advice)


def _required(options: object) -> CompactionOptions:
    if not isinstance(options, CompactionOptions):
        raise ConfigurationError("options", options, "pass CompactionOptions(context_window=...)")
    return options
