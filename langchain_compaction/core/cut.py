"""Where to cut a conversation: the token budget and the tool-pair rule.

The cut is an index ``c``: messages before it are summarized, messages from it
on are kept verbatim. pi's compaction walks back from the end until the keep
budget is filled and then moves forward past tool results. That alone can
still split a tool call from its results (parallel calls, results that arrive
late, repeated call ids), so here a boundary is valid only when it is not a
tool result *and* no call/result pair spans it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from langchain_compaction.core.types import Message

MIN_SUMMARIZED = 2
"""Fewer messages than this before the cut make no meaningful summary."""


def tool_pairs(messages: Sequence[Message]) -> list[tuple[int, int]]:
    """Pair each tool result with the assistant message that called it.

    A result answers the nearest earlier assistant message that made a call
    with its id, so an id that repeats later in the conversation (real traffic
    has them) pairs with its own turn. Results with no such call (orphans) and
    calls never answered form no pair.

    Args:
        messages: The conversation.

    Returns:
        ``(call_index, result_index)`` pairs, in result order.
    """
    latest_call: dict[str, int] = {}
    pairs: list[tuple[int, int]] = []
    for index, message in enumerate(messages):
        # (A reply that continues a paused turn answers its server tool's call, and may make calls of its own.)
        for answered in message.answers:
            caller = latest_call.get(answered) if answered else None
            if caller is not None:
                pairs.append((caller, index))
        if message.role == "assistant":
            for call in message.tool_calls:
                if call.id:
                    latest_call[call.id] = index
    return pairs


def valid_boundaries(messages: Sequence[Message]) -> list[bool]:
    """For each index ``c``, whether cutting before ``messages[c]`` is allowed.

    A boundary is invalid on a tool result (it must stay with its call, as in
    pi's compaction), wherever a call/result pair spans it, and inside a tool
    loop in progress that opened with Claude's thinking (``thinking_loop_opening``)
    but before a reply that opens with thinking of its own.

    Args:
        messages: The conversation.

    Returns:
        A list of ``len(messages) + 1`` flags; the last (cut after everything)
        is always true.
    """
    count = len(messages)
    # Difference array over boundaries: a pair (i, j) blocks cuts i+1 .. j.
    spans = [0] * (count + 2)
    for call_index, result_index in tool_pairs(messages):
        if result_index > call_index:
            spans[call_index + 1] += 1
            spans[result_index + 1] -= 1
    valid: list[bool] = []
    open_pairs = 0
    for index in range(count):
        open_pairs += spans[index]
        valid.append(open_pairs == 0 and not messages[index].is_result)
    valid.append(True)
    opening = thinking_loop_opening(messages)
    if opening is not None:
        # Inside the loop, the kept part may start only where a reply opens with its own thinking.
        for index in range(opening + 1, count):
            valid[index] = valid[index] and _thinks(messages[index])
    return valid


def _thinks(message: Message) -> bool:
    """Whether ``message`` is a reply that opens with Claude's thinking (signed, or redacted)."""
    first = message.parts[0] if message.parts else None
    return message.role == "assistant" and first is not None and first.kind == "reasoning" and first.signed


def kept_start_fits(messages: Sequence[Message], start: int) -> bool:
    """Whether a kept part may start at ``start`` under the thinking rule (a prepared compaction, applied later).

    A summary prepared in the middle of a tool loop of Claude's thinking may
    have taken the loop whole; the replies that came since would open it
    without its thinking block.
    """
    return thinking_loop_opening(messages) is None or valid_boundaries(messages)[start]


def thinking_loop_opening(messages: Sequence[Message]) -> int | None:
    """The first assistant message of the tool loop in progress, when it opens with Claude's thinking; else ``None``.

    With extended thinking, Claude opens a turn with a signed thinking block
    and then calls tools, reply after reply; a request whose tool loop in
    progress (the assistant turn after the last user message) does not start
    with that block is rejected. A cut inside such a loop would leave it
    without its opening, unless the reply it keeps first opens with thinking
    of its own (``valid_boundaries``); otherwise the loop is kept whole or
    summarized whole (``find_cut``, ``forced_cut``). A finished turn (it ends
    on an answer without tool calls) is not in progress.

    Example:
        >>> from langchain_compaction.core.types import Part, ToolCall
        >>> think = Message("assistant", (Part("reasoning", "plan", signed=True),), (ToolCall("c1", "read", "{}"),))
        >>> result = Message("tool", (Part("text", "ok"),), tool_call_id="c1")
        >>> thinking_loop_opening([Message("user", (Part("text", "go"),)), think, result])
        1
    """
    if not _in_progress(messages):
        return None
    start = next((i for i in range(len(messages) - 1, -1, -1) if messages[i].asks), -1) + 1
    opening = next((i for i in range(start, len(messages)) if messages[i].role == "assistant"), None)
    if opening is None or not _thinks(messages[opening]):
        return None
    return opening


@dataclass(frozen=True, slots=True)
class Walk:
    """Where the keep budget's walk (``walk_cut``) stopped: the cut, or what kept one from falling.

    Attributes:
        cut: The cut; 0 when none falls.
        start: The first index that may be summarized.
        kept_from: The first message kept: the cut, or the boundary found with
            too few messages before it to summarize; ``start`` when no cut was looked for.
        why: ``"cut"``; ``"alone"``: fewer than two messages may be summarized
            at all; ``"fits"``: everything from ``start`` on fits the keep budget;
            ``"few"``: fewer than two messages come before ``kept_from``.
        whole: Whether ``kept_from`` moved back before the budget's boundary to
            keep a tool exchange together (there was no valid boundary after it).
    """

    cut: int
    start: int
    kept_from: int
    why: Literal["cut", "alone", "fits", "few"]
    whole: bool = False


def find_cut(
    messages: Sequence[Message],
    counts: Sequence[int],
    keep_recent_tokens: int,
    *,
    start: int = 0,
    credit: int = 0,
    valid: Sequence[bool] | None = None,
    most: int | None = None,
) -> int:
    """Find the budget cut, as pi's ``FindCutPoint`` does, with the tool-pair rule.

    Walks back from the end adding up token counts until they exceed ``keep_recent_tokens``; the message that
    crossed the budget is the first one summarized. If the last message alone exceeds the budget it is kept
    anyway. The cut then moves forward to the next valid boundary; if there is none (the conversation ends
    inside a tool exchange, as an agent's does mid-loop) it moves back to the nearest valid boundary before,
    keeping the exchange whole, where pi's compaction gave up; an exchange larger than ``most`` (a tool's output
    larger than a request may hold) is summarized whole instead, and the model goes on from the summary. One
    message larger than ``most`` is worth a summary alone (pi summarized no fewer than two: a first message
    larger than the window stayed forever).

    Args:
        messages: The conversation.
        counts: The token count of each message.
        keep_recent_tokens: The budget of recent tokens to keep.
        start: The first index that may be summarized (after the leading
            system messages).
        credit: Messages already counted as summarized (an earlier summary
            counts as one, as it did in pi's list).
        valid: Precomputed ``valid_boundaries(messages)``, if at hand.
        most: The most the messages kept after the summary may hold (``None``: no bound).

    Returns:
        The cut index, or 0 when everything fits, when fewer than two
        messages (not larger than ``most``) would be summarized, or when no
        valid cut exists.
    """
    walk = walk_cut(messages, counts, keep_recent_tokens, start=start, credit=credit, valid=valid, most=most)
    return walk.cut


def walk_cut(
    messages: Sequence[Message],
    counts: Sequence[int],
    keep_recent_tokens: int,
    *,
    start: int = 0,
    credit: int = 0,
    valid: Sequence[bool] | None = None,
    most: int | None = None,
) -> Walk:
    """``find_cut``, with where its walk stopped and why no cut fell there (the arguments are ``find_cut``'s)."""
    total = len(messages)
    if total - start + credit < MIN_SUMMARIZED:
        return Walk(0, start, start, "alone")
    flags = valid if valid is not None else valid_boundaries(messages)
    accumulated = 0
    for index in range(total - 1, start - 1, -1):
        accumulated += counts[index]
        if accumulated <= keep_recent_tokens:
            continue
        cut = min(index + 1, total - 1)
        forward = next((c for c in range(cut, total) if flags[c]), None)
        whole = forward is None
        if forward is None:
            # (No boundary before either: the exchange opens the region, as after one summarized whole.)
            back = next((c for c in range(cut - 1, start, -1) if flags[c]), start)
            forward = _whole_exchange(
                messages, counts, _whole_loop(messages, counts, back, keep_recent_tokens * 2), most
            )
        if _too_few(counts, start, forward, credit, most):
            return Walk(0, start, forward, "few", whole)
        return Walk(forward, start, forward, "cut", whole)
    return Walk(0, start, start, "fits")


def _too_few(counts: Sequence[int], start: int, cut: int, credit: int, most: int | None) -> bool:
    """Whether ``[start, cut)`` is not worth a summary: fewer than two messages, that a request could hold."""
    return cut - start + credit < MIN_SUMMARIZED and (most is None or sum(counts[start:cut]) <= most)


def whole_if_over(
    messages: Sequence[Message], counts: Sequence[int], cut: int, most: int, flags: Sequence[bool]
) -> int:
    """``cut``, or the end when it keeps only the tool exchange in progress, all answered, and that is over ``most``.

    (``plan_compaction`` asks again with what the pinned messages written back take from ``most``.)
    """
    if cut >= len(messages) or any(flags[cut + 1 : len(messages)]):
        return cut
    return _whole_in_progress(messages, counts, cut, most)


def _whole_in_progress(messages: Sequence[Message], counts: Sequence[int] | None, cut: int, most: int | None) -> int:
    """``_whole_exchange`` when ``messages`` end inside a tool exchange (and ``counts`` are given); else ``cut``."""
    if counts is None or not _in_progress(messages):
        return cut
    return _whole_exchange(messages, counts, cut, most)


def _whole_exchange(messages: Sequence[Message], counts: Sequence[int], cut: int, most: int | None) -> int:
    """``cut``, or the end when what it keeps (the tool exchange in progress) is larger than ``most``.

    Only an exchange whose calls are all answered: a result still to come
    (chat memory stores them one at a time) would follow a summary without its call.
    """
    if most is None or sum(counts[cut:]) <= most:
        return cut
    return len(messages) if _answered(messages[cut:]) else cut


def _whole_loop(messages: Sequence[Message], counts: Sequence[int], cut: int, room: int) -> int:
    """``cut``, or the end when it keeps a tool loop in progress (opened with Claude's thinking) larger than ``room``.

    Such a loop cannot be cut inside (``thinking_loop_opening``): kept whole,
    it could outgrow the window itself, so past ``room`` it is summarized whole,
    once its calls are all answered (as ``_whole_exchange``: a result still to
    come would follow the summary without its call).
    """
    opening = thinking_loop_opening(messages)
    if opening is None or cut > opening or sum(counts[opening:]) <= room or not _answered(messages[opening:]):
        return cut
    return len(messages)


def _answered(messages: Sequence[Message]) -> bool:
    """Whether every tool call in ``messages`` has its result among them."""
    calls = {c.id for m in messages for c in m.tool_calls}
    return calls <= {answered for m in messages for answered in m.answers}


def forced_cut(
    messages: Sequence[Message],
    *,
    start: int = 0,
    credit: int = 0,
    valid: Sequence[bool] | None = None,
    counts: Sequence[int] | None = None,
    most: int | None = None,
) -> int:
    """The cut for a manual compaction: keep only the last valid message on (a thinking loop in progress: none).

    Used when ``find_cut`` returns 0 but the caller asked to compact anyway.

    Args:
        messages: The conversation.
        start: The first index that may be summarized.
        credit: Messages already counted as summarized (see ``find_cut``).
        valid: Precomputed ``valid_boundaries(messages)``, if at hand.
        counts: The token count of each message (with ``most``).
        most: The most the messages kept after the summary may hold: a
            tool exchange in progress larger than that (an overflow retry
            after a tool's huge output) is summarized whole.

    Returns:
        The last valid boundary with at least two messages before it (counted
        from ``start``), or 0 if there is none.
    """
    flags = valid if valid is not None else valid_boundaries(messages)
    lowest = max(start + MIN_SUMMARIZED - credit, start + 1)
    opening = thinking_loop_opening(messages)
    for cut in range(len(messages) - 1, lowest - 1, -1):
        if flags[cut]:
            # A thinking loop in progress that could only be kept whole goes whole: as small as it gets
            # (once its calls are all answered: a result still to come would follow the summary alone).
            if opening is not None and cut <= opening:
                return len(messages) if _answered(messages[opening:]) else cut
            return _whole_in_progress(messages, counts, cut, most)
    if opening is not None and len(messages) >= lowest and _answered(messages[opening:]):
        return len(messages)
    # An exchange that opens the region (after one summarized whole) has no boundary past its start.
    return len(messages) if _whole_in_progress(messages, counts, start, most) == len(messages) else 0


def _in_progress(messages: Sequence[Message]) -> bool:
    """Whether ``messages`` end inside a tool exchange (on a tool result, or a reply that calls tools)."""
    last = messages[-1] if messages else None
    return last is not None and (last.is_result or (last.role == "assistant" and bool(last.tool_calls)))


def unread_exchange(messages: Sequence[Message], cut: int) -> int | None:
    """The assistant turn whose tool results a cut at ``cut`` took into the summary before the model answered them.

    The conversation ends with tool results (the model has not answered them
    yet) and the cut took them all: an exchange larger than a request may
    keep (``core.cut.find_cut``'s ``most``), summarized whole. What they said
    reaches the model only through the summary, and a model not told so
    calls the tool again, for an output as large, turn after turn.
    """
    if cut < len(messages) or not messages or not messages[-1].is_result:
        return None
    start = len(messages) - 1
    while start > 0 and messages[start].is_result:
        start -= 1
    return start


def unread_tools(messages: Sequence[Message], counts: Sequence[int], start: int) -> tuple[str, int]:
    """The tools called at ``start`` (``unread_exchange``) and the tokens of the exchange, the call with its results."""
    names = dict.fromkeys(call.name for call in messages[start].tool_calls if call.name)
    return ", ".join(names) or "a tool", sum(counts[start:])
