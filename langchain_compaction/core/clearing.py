"""The cheapest step first: clear stale tool outputs before asking any model.

Old tool results are often the bulk of an agent's context (file dumps, test
logs, search results) and the least needed later. Clearing replaces the
content of tool results that lie outside the keep budget, and are older than
the last ``keep_tool_uses`` tool results, with a one-line placeholder that
names the tool and what was cleared. The tool calls, their arguments and the
call/result pairing stay intact. When that alone brings the conversation well
under the threshold, no summary call is made at all.

It is off by default (``CompactionOptions(clear_tool_outputs=True)`` turns it
on) because it trades coverage for cost: a cleared output is gone for the
summary that comes later, while a summary would have been shown it
(``bench/cost.py`` measures both).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from langchain_compaction.core.tokens import MESSAGE_OVERHEAD_TOKENS, estimate_tokens
from langchain_compaction.core.types import Message

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


def plan_clearing(
    messages: Sequence[Message],
    counts: Sequence[int],
    *,
    keep_recent_tokens: int,
    target_tokens: int,
    keep_tool_uses: int = 3,
    exclude_tools: Collection[str] = (),
    min_tokens: int = 100,
) -> ClearingPlan | None:
    """Plan the clearing that brings the conversation down to ``target_tokens``.

    Clears the oldest eligible tool results first and stops as soon as the
    target is reached. A result is eligible when it lies before the keep
    budget's boundary, is not among the last ``keep_tool_uses`` results, is
    not from an excluded tool, is not cleared already, and is worth it
    (``min_tokens`` or more).

    Args:
        messages: The conversation.
        counts: Token count per message.
        keep_recent_tokens: The keep budget (its messages are never cleared).
        target_tokens: The size to bring the conversation down to.
        keep_tool_uses: The most recent tool results always kept.
        exclude_tools: Tools whose output must stay.
        min_tokens: Results smaller than this are not worth clearing.

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
    protected = set(results[-keep_tool_uses:]) if keep_tool_uses > 0 else set()
    # A result often carries no tool name: the call it answers has it.
    called = {c.id: c.name for m in messages for c in m.tool_calls if c.id} if exclude_tools else {}
    chosen: list[int] = []
    contents: list[str] = []
    saved = 0
    for index in results:
        if index >= boundary or saved >= needed:
            break
        message = messages[index]
        if (
            index in protected
            or message.pinned
            or (message.name or called.get(message.tool_call_id or "")) in exclude_tools
            or counts[index] < min_tokens
            or is_cleared(message)
        ):
            continue
        text = placeholder(message, counts[index])
        gain = _gain(message, counts[index], text)
        if gain > 0:
            chosen.append(index)
            contents.append(text)
            saved += gain
    if saved < needed:
        return None
    return ClearingPlan(tuple(chosen), tuple(contents), saved)
