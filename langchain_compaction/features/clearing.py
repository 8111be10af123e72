"""The cheapest step first: clear stale tool outputs before asking any model.

Old tool results are often the bulk of an agent's context (file dumps, test
logs, search results) and the least needed later. Clearing replaces the
content of tool results that lie outside the keep budget, and are older than
the last ``keep_tool_uses`` tool results, with a one-line placeholder that
names the tool and what was cleared. The tool calls, their arguments and the
call/result pairing stay intact. When that alone brings the conversation well
under the threshold, no summary call is made at all.

A tool result is a tool message, or one ``tool_result`` block of a user turn
in Anthropic's block form (``Message.results``: an Anthropic-SDK history
through ``convert_to_messages``); each block is cleared on its own, and the
rest of its turn (the other blocks, the user's own text) stays.

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
from langchain_compaction.core.tokens import MESSAGE_OVERHEAD_TOKENS, estimate_message, estimate_tokens
from langchain_compaction.core.types import Message
from langchain_compaction.features.base import Feature

CLEARED_PREFIX = "[Tool output cleared to save context:"
"""How a cleared tool result's content begins (recognized as already cleared)."""


def placeholder(message: Message, tokens: int, tool: str | None = None) -> str:
    """The content that replaces a cleared tool result.

    Args:
        message: The tool result (a tool message, or one of a user turn's ``results``).
        tokens: About how many tokens its output had.
        tool: The tool's name when the result does not carry it (the call it answers has it).

    Returns:
        A one-line placeholder naming the tool and what was cleared.
    """
    tool = message.name or tool or "the tool"
    call = f" (call {message.tool_call_id})" if message.tool_call_id else ""
    status = " It had reported an error." if message.is_error else ""
    return (
        f"{CLEARED_PREFIX} {tool}{call} returned about {tokens:,} tokens here.{status} "
        "The call and its arguments are kept; run it again if the output is needed.]"
    )


def is_cleared(message: Message) -> bool:
    """Whether ``message`` is a tool result cleared earlier."""
    return message.role == "tool" and message.text.startswith(CLEARED_PREFIX)


Target = tuple[int, int | None]
"""A tool result: its message's position, and which of that user turn's ``results`` it is (``None``: the message)."""


@dataclass(frozen=True, slots=True)
class ClearingPlan:
    """Which tool results to clear, and what that saves.

    Attributes:
        indices: Positions of the messages holding the tool results to clear,
            one per result, oldest first (a user turn's repeats for each of
            its ``tool_result`` blocks cleared).
        contents: The placeholder for each, in the same order.
        saved_tokens: Tokens the conversation loses by it.
        blocks: For each, which of its user turn's ``results`` it is (the
            ``tool_result`` blocks in their order), ``None`` for a tool
            message; empty when every one is a tool message.
    """

    indices: tuple[int, ...]
    contents: tuple[str, ...]
    saved_tokens: int
    blocks: tuple[int | None, ...] = ()

    @property
    def messages(self) -> tuple[int, ...]:
        """The positions of the messages it rewrites, each once, in order."""
        return tuple(sorted(set(self.indices)))

    def by_message(self) -> dict[int, dict[int | None, str]]:
        """Per message it rewrites, the placeholder of each result it clears (``None``: the whole tool message)."""
        blocks = self.blocks or (None,) * len(self.indices)
        out: dict[int, dict[int | None, str]] = {}
        for index, block, text in zip(self.indices, blocks, self.contents):
            out.setdefault(index, {})[block] = text
        return out


def _keep_boundary(counts: Sequence[int], keep_recent_tokens: int) -> int:
    """The first index inside the keep budget (counted back from the end)."""
    boundary = len(counts)
    kept = 0
    while boundary > 0 and kept + counts[boundary - 1] <= keep_recent_tokens:
        boundary -= 1
        kept += counts[boundary]
    return boundary


def _results(messages: Sequence[Message]) -> list[Target]:
    """The conversation's tool results that could be cleared, in order.

    Each tool message not pinned, and each result block of a user turn or of a reply
    that continues a paused one, but those with no output to replace (a
    pinned block: an MCP approval, the tools a search loaded, a server
    tool's result): they are never cleared, so they do not count among the
    last ``keep_tool_uses`` either.
    """
    out: list[Target] = []
    for index, message in enumerate(messages):
        if message.role == "tool":
            if not message.pinned:  # (a pinned tool message is never cleared: see ``_eligible``)
                out.append((index, None))
        else:
            out.extend((index, block) for block, result in enumerate(message.results) if not result.pinned)
    return out


def _result(messages: Sequence[Message], target: Target) -> Message:
    """The tool result ``target`` names."""
    index, block = target
    return messages[index] if block is None else messages[index].results[block]


def _tokens(messages: Sequence[Message], counts: Sequence[int], target: Target) -> int:
    """A tool result's tokens: a tool message's count; a ``tool_result`` block's share of its user turn's count.

    The share is the block's part of the turn's estimate, so the estimate's
    own count is the block's estimate exactly, and another counter's count
    is divided in the same proportion.
    """
    index, block = target
    if block is None:
        return counts[index]
    message = messages[index]
    share = estimate_message(message.results[block]) - MESSAGE_OVERHEAD_TOKENS
    return counts[index] * share // max(estimate_message(message), 1)


def _gain(result: Message, tokens: int, text: str, *, block: bool) -> int:
    """What replacing the output of ``result`` with ``text`` saves.

    A tool message keeps its overhead and call id; a ``tool_result`` block
    keeps its call id, its turn the overhead.
    """
    overhead = 0 if block else MESSAGE_OVERHEAD_TOKENS
    return tokens - estimate_tokens(text) - overhead - estimate_tokens(result.tool_call_id or "")


def _eligible(
    message: Message,
    target: Target,
    *,
    protected: Collection[int],
    untouched: Collection[Target],
    exclude: Collection[str],
    tool: str | None,
) -> bool:
    """Whether a tool result may be cleared (see ``plan_clearing``); ``message`` is the one that holds it."""
    if target[0] in protected or target in untouched or message.pinned or tool in exclude:
        return False
    return not is_cleared(message if target[1] is None else message.results[target[1]])


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
    and worth it (``min_tokens`` or more). A user turn's ``tool_result``
    blocks are results each (``Message.results``), its turn's position theirs.

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
    results = _results(messages)
    # The last ``keep_tool_uses`` results, however few there are.
    untouched = frozenset(results[-keep_tool_uses:] if keep_tool_uses > 0 else ())
    candidates = [(t, n) for t in results if t[0] < boundary and (n := _tokens(messages, counts, t)) >= min_tokens]
    plan = _cleared(messages, candidates, needed, protected=protected, untouched=untouched, exclude_tools=exclude_tools)
    return plan if plan.saved_tokens >= needed else None


def _cleared(
    messages: Sequence[Message],
    candidates: Sequence[tuple[Target, int]],
    needed: int,
    *,
    protected: Collection[int],
    untouched: Collection[Target],
    exclude_tools: Collection[str],
) -> ClearingPlan:
    """The oldest eligible results cleared until ``needed`` tokens are saved (or none is left)."""
    # A result often carries no tool name (a tool_result block never does): the call it answers has it.
    called = {c.id: c.name for m in messages for c in m.tool_calls if c.id}
    chosen: list[Target] = []
    contents: list[str] = []
    saved = 0
    for target, tokens in candidates:
        if saved >= needed:
            break
        result = _result(messages, target)
        tool = result.name or called.get(result.tool_call_id or "")
        eligible = _eligible(
            messages[target[0]], target, protected=protected, untouched=untouched, exclude=exclude_tools, tool=tool
        )
        if not eligible:
            continue
        text = placeholder(result, tokens, tool)
        gain = _gain(result, tokens, text, block=target[1] is not None)
        if gain > 0:
            chosen.append(target)
            contents.append(text)
            saved += gain
    blocks = tuple(b for _, b in chosen) if any(b is not None for _, b in chosen) else ()
    return ClearingPlan(tuple(i for i, _ in chosen), tuple(contents), saved, blocks)


@dataclass(frozen=True, slots=True)
class ClearToolOutputs(Feature):
    """Before summarizing, clear old tool outputs; when that is enough, no summary is made.

    The content of tool results outside the keep budget and older than the
    last ``keep_tool_uses`` is replaced by a placeholder naming the tool (the
    calls and their arguments stay); when that alone brings the context to
    the landing target, no summary call is made. A user turn's
    ``tool_result`` blocks (Anthropic's block form) are tool results each:
    a cleared block keeps its ``tool_use_id``, ``is_error`` and place, and
    the turn's other blocks stay as they are. With an archive, a cleared
    output is archived in full first (its whole message, the first time).

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
        """The figures of a compaction that only cleared old tool outputs (no summary, no call).

        ``placeholder_tokens``: what the messages it rewrote (``plan.messages``) count now.
        """
        before = sum(counts)
        after = before - sum(counts[i] for i in plan.messages) + placeholder_tokens
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
