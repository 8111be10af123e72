"""Why no cut falls in a conversation, in words: what ``inspect`` and ``compact`` say (``why_no_cut``).

The reason is read off the budget cut's own walk (``core.plan.budget_walk``),
so it names what the rule met: the messages the keep budget holds, a tool
exchange that must stay together, or too few messages to summarize. A fix is
named only for a conversation over its threshold, and only the one that helps:
a smaller keep budget when it is what holds everything, a larger window when
the newest messages alone are what must be kept.
"""

from __future__ import annotations

from collections.abc import Sequence

from langchain_compaction.core.cut import Walk
from langchain_compaction.core.options import Budget
from langchain_compaction.core.plan import budget_walk
from langchain_compaction.core.types import Message

WINDOW = "a larger --context-window is the fix"
KEEP = "a smaller --keep-recent-tokens is the fix"


def why_no_cut(
    messages: Sequence[Message], counts: Sequence[int], budget: Budget, *, over: bool, forced: bool = False
) -> str:
    """Why ``plan_compaction`` found no cut, with the figures, and the fix when ``over`` the threshold.

    Args:
        messages: The conversation.
        counts: Token count per message.
        budget: The budget the cut was planned with (its keep, and what kept messages may hold).
        over: Whether the conversation is over its threshold (a fix is named only then).
        forced: Whether the cut was forced (a manual compaction: no window).

    Returns:
        One clause, lower case, with no final stop.
    """
    walk = budget_walk(messages, counts, budget.keep, most=budget.most_kept)
    if walk.why == "alone":
        return _alone(messages, counts, walk.start, over)
    if forced:
        # (A manual cut keeps the last valid message on; here not even that leaves two messages before it.)
        answers = " with the tool call it answers" if messages and messages[-1].is_result else ""
        return (
            f"a manual cut keeps at least the last message{answers}, and fewer than two messages come before "
            "what it keeps: nothing to summarize"
        )
    if walk.why in ("few", "cut"):
        # ("cut": one falls where the region starts, after the earlier summaries: nothing new before it.)
        return _few(messages, counts, walk, budget.keep, over)
    kept = sum(counts[walk.start :])
    said = f"everything fits the keep budget of {budget.keep:,} tokens (it takes ~{kept:,}): nothing to summarize"
    return f"{said}; {KEEP}" if over else said


def _span(first: int, last: int) -> str:
    return f"message {first}" if first == last else f"messages {first} to {last}"


def _alone(messages: Sequence[Message], counts: Sequence[int], start: int, over: bool) -> str:
    """Fewer than two messages may be summarized at all."""
    if start >= len(messages):
        said = "no message follows the leading system messages and earlier summary: nothing to summarize"
    else:
        said = (
            f"message {start} (~{counts[start]:,} tokens) is the newest, which is always kept, and nothing comes "
            "before it to summarize"
        )
    return f"{said}; {WINDOW}" if over else said


def _few(messages: Sequence[Message], counts: Sequence[int], walk: Walk, keep: int, over: bool) -> str:
    """The cut found leaves fewer than two messages before it: which messages it keeps, and why."""
    last, kept = len(messages) - 1, sum(counts[walk.kept_from :])
    if walk.whole:
        held = (
            f"{_span(walk.kept_from, last)} must stay together (a tool call is never separated from its "
            f"results) and take ~{kept:,} tokens, over the keep budget of {keep:,}"
        )
    elif kept > keep:
        held = f"the last message (~{kept:,} tokens) is over the keep budget of {keep:,}, and the newest is always kept"
    else:
        held = f"the keep budget of {keep:,} tokens holds {_span(walk.kept_from, last)} (~{kept:,} tokens)"
    them = "it" if walk.kept_from == last else "them"
    if walk.kept_from <= walk.start:
        before = f"nothing comes before {them} to summarize"
    else:
        span, tokens = _span(walk.start, walk.kept_from - 1), sum(counts[walk.start : walk.kept_from])
        before = f"only {span} (~{tokens:,} tokens) comes before {them}, too few to summarize"
    said = f"{held}; {before}"
    if not over:
        return said
    # (Only the keep budget can be made to let go of messages it holds; a tool exchange or the newest message stays.)
    return f"{said}; {WINDOW if walk.whole or kept > keep else KEEP}"
