"""The cheapest step first: clear stale tool outputs before asking any model.

Old tool results are often the bulk of an agent's context (file dumps, test
logs, search results) and the least needed later. Clearing replaces the
content of tool results that lie outside the keep budget, and are older than
the last ``keep_tool_uses`` tool results, with a one-line placeholder that
names the tool and what was cleared. The tool calls, their arguments and the
call/result pairing stay intact. When that alone brings the conversation well
under the threshold, no summary call is made at all.

It is off by default (the ``ClearToolOutputs`` feature turns it on) because it
trades coverage for cost: a cleared output is gone for the summary that comes
later, while a summary would have been shown it (``bench/cost.py`` measures
both). Chat memory refuses it: its archive must receive every original.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import ClassVar

from langchain_compaction.core.options import CompactionOptions, check_int, check_names
from langchain_compaction.core.result import CompactionResult
from langchain_compaction.core.tokens import MESSAGE_OVERHEAD_TOKENS, estimate_tokens
from langchain_compaction.core.types import Message
from langchain_compaction.features.base import Feature

CLEARED_PREFIX = "[Tool output cleared to save context:"
"""How a cleared tool result's content begins (recognized as already cleared)."""


def placeholder(message: Message, tokens: int) -> str:
    """The content that replaces a cleared tool result.

    Args:
        message: The tool result.
        tokens: About how many tokens its output had.

    Returns:
        A one-line placeholder naming the tool and what was cleared.
    """
    tool = message.name or "the tool"
    call = f" (call {message.tool_call_id})" if message.tool_call_id else ""
    status = " It had reported an error." if message.is_error else ""
    return (
        f"{CLEARED_PREFIX} {tool}{call} returned about {tokens:,} tokens here.{status} "
        "The call and its arguments are kept; run it again if the output is needed.]"
    )


def is_cleared(message: Message) -> bool:
    """Whether ``message`` is a tool result cleared earlier."""
    return message.role == "tool" and message.text.startswith(CLEARED_PREFIX)


@dataclass(frozen=True, slots=True)
class ClearingPlan:
    """Which tool results to clear, and what that saves.

    Attributes:
        indices: Positions of the tool results to clear, oldest first.
        contents: The placeholder for each, in the same order.
        saved_tokens: Tokens the conversation loses by it.
    """

    indices: tuple[int, ...]
    contents: tuple[str, ...]
    saved_tokens: int


def _keep_boundary(counts: Sequence[int], keep_recent_tokens: int) -> int:
    """The first index inside the keep budget (counted back from the end)."""
    boundary = len(counts)
    kept = 0
    while boundary > 0 and kept + counts[boundary - 1] <= keep_recent_tokens:
        boundary -= 1
        kept += counts[boundary]
    return boundary


def _gain(message: Message, tokens: int, text: str) -> int:
    """What replacing the output of ``message`` with ``text`` saves."""
    return tokens - estimate_tokens(text) - MESSAGE_OVERHEAD_TOKENS - estimate_tokens(message.tool_call_id or "")


def _eligible(
    message: Message, index: int, *, protected: Collection[int], exclude: Collection[str], tool: str | None
) -> bool:
    """Whether a tool result may be cleared (see ``plan_clearing``)."""
    return not (index in protected or message.pinned or tool in exclude or is_cleared(message))


def plan_clearing(
    messages: Sequence[Message],
    counts: Sequence[int],
    *,
    keep_recent_tokens: int,
    target_tokens: int,
    keep_tool_uses: int = 3,
    exclude_tools: Collection[str] = (),
    min_tokens: int = 100,
    protected: Collection[int] = (),
) -> ClearingPlan | None:
    """Plan the clearing that brings the conversation down to ``target_tokens``.

    Clears the oldest eligible tool results first and stops as soon as the
    target is reached. A result is eligible when it lies before the keep
    budget's boundary, is not among the last ``keep_tool_uses`` results, is
    not from an excluded tool, not protected (pinned), not cleared already,
    and worth it (``min_tokens`` or more).

    Args:
        messages: The conversation.
        counts: Token count per message.
        keep_recent_tokens: The keep budget (its messages are never cleared).
        target_tokens: The size to bring the conversation down to.
        keep_tool_uses: The most recent tool results always kept.
        exclude_tools: Tools whose output must stay.
        min_tokens: Results smaller than this are not worth clearing.
        protected: Indices that may not be touched (what the pins keep).

    Returns:
        The plan, or ``None`` when clearing alone cannot reach the target
        (then a summary is needed, and it should see the outputs).
    """
    needed = sum(counts) - target_tokens
    if needed <= 0:
        return None
    boundary = _keep_boundary(counts, keep_recent_tokens)
    results = [i for i, m in enumerate(messages) if m.role == "tool"]
    # The last ``keep_tool_uses`` results, however few there are.
    untouched = {*protected, *(results[-keep_tool_uses:] if keep_tool_uses > 0 else ())}
    candidates = [i for i in results if i < boundary and counts[i] >= min_tokens]
    plan = _cleared(messages, counts, candidates, needed, untouched=untouched, exclude_tools=exclude_tools)
    return plan if plan.saved_tokens >= needed else None


def _cleared(
    messages: Sequence[Message],
    counts: Sequence[int],
    candidates: Sequence[int],
    needed: int,
    *,
    untouched: Collection[int],
    exclude_tools: Collection[str],
) -> ClearingPlan:
    """The oldest eligible results cleared until ``needed`` tokens are saved (or none is left)."""
    # A result often carries no tool name: the call it answers has it.
    called = {c.id: c.name for m in messages for c in m.tool_calls if c.id} if exclude_tools else {}
    chosen: list[int] = []
    contents: list[str] = []
    saved = 0
    for index in candidates:
        if saved >= needed:
            break
        message = messages[index]
        tool = message.name or called.get(message.tool_call_id or "")
        if not _eligible(message, index, protected=untouched, exclude=exclude_tools, tool=tool):
            continue
        text = placeholder(message, counts[index])
        gain = _gain(message, counts[index], text)
        if gain > 0:
            chosen.append(index)
            contents.append(text)
            saved += gain
    return ClearingPlan(tuple(chosen), tuple(contents), saved)


@dataclass(frozen=True, slots=True)
class ClearToolOutputs(Feature):
    """Before summarizing, clear old tool outputs; when that is enough, no summary is made.

    The content of tool results outside the keep budget and older than the
    last ``keep_tool_uses`` is replaced by a placeholder naming the tool (the
    calls and their arguments stay); when that alone brings the context to
    the landing target, no summary call is made. With an archive, a cleared
    output is archived in full first.

    Attributes:
        keep_tool_uses: The most recent tool results never cleared.
        exclude_tools: Tools whose output is never cleared (pinned tools' too).
        min_tokens: Tool results smaller than this are not cleared.

    Its record in ``CompactionResult.parts["clearing"]``: ``cleared``.

    Example:
        >>> ClearToolOutputs(keep_tool_uses=5).keep_tool_uses
        5
    """

    name: ClassVar[str] = "clearing"
    keep_tool_uses: int = 3
    exclude_tools: tuple[str, ...] = ()
    min_tokens: int = 100
    keep: int = field(default=0, init=False, repr=False, compare=False)
    target: int | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        check_int("keep_tool_uses", self.keep_tool_uses, minimum=0, advice="0 or more (default 3)")
        check_int("min_tokens", self.min_tokens, minimum=0, advice="0 or more (default 100)")
        object.__setattr__(self, "exclude_tools", check_names("exclude_tools", self.exclude_tools))

    def bind(self, options: CompactionOptions) -> ClearToolOutputs:
        """Clearing aimed at the landing target of ``options``, never inside their keep budget."""
        bound = replace(self)
        object.__setattr__(bound, "keep", options.budget.keep)
        object.__setattr__(bound, "target", options.budget.landing)
        return bound

    def instead(
        self, messages: Sequence[Message], counts: Sequence[int], protected: frozenset[int]
    ) -> ClearingPlan | None:
        """The clearing that is enough to land, if there is one."""
        if self.target is None:
            return None
        return plan_clearing(
            messages,
            counts,
            keep_recent_tokens=self.keep,
            target_tokens=self.target,
            keep_tool_uses=self.keep_tool_uses,
            exclude_tools=self.exclude_tools,
            min_tokens=self.min_tokens,
            protected=protected,
        )

    @staticmethod
    def result(plan: ClearingPlan, counts: Sequence[int], placeholder_tokens: int) -> CompactionResult:
        """The figures of a compaction that only cleared old tool outputs (no summary, no call)."""
        before = sum(counts)
        after = before - sum(counts[i] for i in plan.indices) + placeholder_tokens
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
            parts={"clearing": {"cleared": len(plan.indices)}},
        )
