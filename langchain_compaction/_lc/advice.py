"""What a conversation is told about its own setup: each warning once, with its figures and its fix.

A warning that would come again on every turn (the fixed part of a request
leaves compaction no room, a compaction came back too soon, the kept messages
alone are over budget) is said once per conversation: ``Told`` remembers what
was said to which, within a bound.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Sequence
from dataclasses import replace

from langchain_compaction.core.bounded import Bounded
from langchain_compaction.core.cut import unread_exchange, unread_tools
from langchain_compaction.core.options import MIN_ROOM_TOKENS, Budget
from langchain_compaction.core.result import CompactionResult
from langchain_compaction.core.types import Message

logger = logging.getLogger("langchain_compaction")

NO_ROOM = (
    "the system prompt, tool schemas and leading system messages take %d tokens of the %d a request may "
    "hold before compacting (context_window %d minus reserve_tokens %d): no compaction can bring the context "
    "under that, so none is made and requests will outgrow the window; use a model with a larger window, a "
    "shorter system prompt or fewer tools"
)
FIXED = (
    "the system prompt, tool schemas and leading system messages take %d tokens, over half of the %d a "
    "request may hold before compacting: compactions land at %d tokens keeping %d recent ones, and come "
    "often; a larger window, a shorter system prompt, fewer tools or a smaller keep_recent_tokens make them rarer"
)
REPEATED = (
    "compaction fired again soon after the previous one: the recent messages it kept (up to %d tokens) were too "
    "large to land under the target, so this one keeps half as many; if it happens often, lower keep_recent_tokens"
)

OVER_BUDGET = (
    "the compacted context is still over budget: %d tokens > %d%s. The %d messages kept verbatim are too large: "
    "the newest ones stay whole (a tool call is never separated from its results), so a very large recent "
    "message, such as a long tool output, stays until newer messages follow it and the next compaction "
    "summarizes it. If this is frequent: a model with a larger context_window, or tools that return less "
    "(a file read in ranges, a command's output truncated)"
)
SUMMARY_OVER = (
    "the compacted context is still over budget: %d tokens > %d%s. Most of it is not the %d messages kept after "
    "the summary (%d tokens) but what comes before them: the summary (up to %d tokens, summary_max_tokens) with "
    "the leading system messages and pinned messages written back beside it, %d tokens; use a model with a "
    "larger context_window, or pin less"
)

UNREAD = (
    "a tool's output was summarized before the model read it: the tool exchange in progress (%s, %d tokens) is "
    "larger than the %d tokens a request may hold past the system prompt, tool schemas and summary, so the model "
    "goes on from the summary and may call the tool again; make the tool return less (a page, a range, a "
    "truncated output) or use a model with a larger context_window"
)


def no_room(budget: Budget) -> bool:
    """Whether the fixed part leaves a compaction no room: less than ``MIN_ROOM_TOKENS`` of the landing above it.

    At a tiny window the bound is a quarter of the threshold: there the window
    is what is small, not the room the fixed part leaves.
    """
    if not budget.fixed or budget.threshold is None or budget.room is None:
        return False
    return budget.room < min(MIN_ROOM_TOKENS, budget.threshold // 4)


class Told:
    """What was said to which conversation (at most ``size`` conversations remembered)."""

    def __init__(self, size: int = 1024) -> None:
        self._said: Bounded[bool] = Bounded(size)

    def first(self, conversation: Hashable, what: str) -> bool:
        """Whether ``what`` is said to ``conversation`` for the first time (and now it is)."""
        key = (conversation, what)
        if self._said.get(key):
            return False
        self._said.put(key, True)
        return True

    def once(self, conversation: Hashable, text: str, *figures: object) -> None:
        """Warn ``text % figures``, once per conversation."""
        if self.first(conversation, text):
            logger.warning(text, *figures)

    def standing(
        self,
        conversation: Hashable,
        result: CompactionResult,
        budget: Budget,
        overhead: int,
        read: tuple[Sequence[Message], Sequence[int]] = ((), ()),
    ) -> CompactionResult:
        """``result`` with where the next request stands, and what that calls for told (each once).

        The next request holds the messages left and what it sends besides
        them (``overhead``: the system prompt and tool schemas), whether the
        compaction was prepared or made on the spot. ``read`` is what was
        compacted, with its counts: a tool's output too large to keep, summarized
        before the model read it, is told too (the model may call the tool again).
        """
        messages, counts = read
        start = unread_exchange(messages, result.cut_index)
        unread = None if start is None else unread_tools(messages, counts, start)
        if unread is not None and unread[1] > (budget.most_kept or 0):
            self.once(conversation, UNREAD, *unread, budget.most_kept or 0)
        context = result.compacted_tokens + overhead
        result = replace(
            result,
            over_budget=budget.threshold is not None and context > budget.threshold,
            above_landing=budget.landing is not None and context > budget.landing,
        )
        if result.repeated:
            self.once(conversation, REPEATED, budget.keep)
        if result.over_budget:
            # What must be kept is over the threshold (one huge recent message):
            # nothing more can be summarized without touching it. Or, at a tiny
            # window, the summary itself is.
            sent = (
                f" ({overhead} of them the system prompt and tool schemas sent with every request)" if overhead else ""
            )
            if not self.first(conversation, OVER_BUDGET):  # (one warning of the two kinds, once)
                return result
            after = sum(counts[result.cut_index :])
            before = result.compacted_tokens - after  # (the summary, its user turn, what is written back with it)
            if counts and before > after:
                figures = (len(counts) - result.cut_index, after, budget.summary_max, before)
                logger.warning(SUMMARY_OVER, context, budget.threshold, sent, *figures)
            else:
                logger.warning(OVER_BUDGET, context, budget.threshold, sent, result.messages_kept)
        return result
