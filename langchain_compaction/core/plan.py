"""What one compaction keeps and what it summarizes.

``plan_compaction`` reads the conversation in three parts: the leading system
block (the application's prompt, kept; earlier summaries in it, updated), the
region a provider-side compaction block fences off (kept verbatim: the
provider reads the history from that block on), and the rest, which the budget
cut splits into summarized and kept messages (``core.cut``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from operator import attrgetter
from typing import TypeVar

from langchain_compaction.core.cut import Walk, find_cut, forced_cut, valid_boundaries, walk_cut, whole_if_over
from langchain_compaction.core.record import KEPT_NOTHING_KEY
from langchain_compaction.core.types import Message, Scanned

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Layout:
    """A compacted (or reordered) conversation, as positions in the caller's list.

    Attributes:
        head: Leading system messages (and summaries) kept, in order.
        bridge: Whether a user turn of the library's follows ``head``.
        kept: Messages kept after it, in order.
        request: What the bridge repeats of the user's request a tool loop
            still works on, when the compaction took it into the summary
            (``core.layout.open_request``); "" for the one-line bridge.
        bridge_after: How many of ``kept`` come before the bridge: the
            provider's fenced prefix, when what follows it does not open
            with the user's turn (0: the bridge follows the summary).
        note: What the bridge tells the model besides: that the summary took a
            tool's output it had not answered (``core.layout.unread_note``).
    """

    head: tuple[int, ...]
    bridge: bool
    kept: tuple[int, ...]
    request: str = ""
    bridge_after: int = 0
    note: str = ""

    def arranged(self, messages: Sequence[_T], written: Sequence[_T]) -> list[_T]:
        """The compacted list: ``written`` (the summary, then the bridge if any) among ``messages`` kept."""
        kept, after = [messages[i] for i in self.kept], self.bridge_after
        return [*(messages[i] for i in self.head), *written[:1], *kept[:after], *written[1:], *kept[after:]]


@dataclass(frozen=True, slots=True)
class Plan:
    """What one compaction keeps and summarizes.

    Attributes:
        keep_head: Indices of leading system messages kept verbatim.
        start: First index of the region after the leading system block.
        cut: First kept message after the summary.
        previous_summaries: Indices of earlier summaries to update.
        forced: Whether the cut was forced (nothing was over the keep budget).
        provider_prefix: Messages kept verbatim between the summary and the
            recent ones: everything up to the last provider-side compaction
            block, which the summary must not reach across.
        pinned: Messages before the cut kept verbatim after the summary
            (pinned by the user, or the latest call of a pinned tool, with
            its whole exchange).
        pinned_over_cap: Pinned exchanges summarized after all, for the cap.
    """

    keep_head: tuple[int, ...]
    start: int
    cut: int
    previous_summaries: tuple[int, ...]
    forced: bool
    provider_prefix: tuple[int, ...] = ()
    pinned: tuple[int, ...] = ()
    pinned_over_cap: int = 0

    @property
    def removed(self) -> int:
        """Messages the summary replaces."""
        return self.cut - self.start - len(self.pinned) + sum(1 for i in self.previous_summaries if i < self.start)

    @property
    def region(self) -> Sequence[int]:
        """The indices between the start and the cut, but the pinned ones (earlier summaries among them are updated)."""
        if not self.pinned:
            return range(self.start, self.cut)
        pinned = set(self.pinned)
        return tuple(i for i in range(self.start, self.cut) if i not in pinned)


_IS_SUMMARY = attrgetter("is_summary")


def leading_block(messages: Sequence[Message]) -> int:
    """The length of the leading run of system messages (summaries included)."""
    index = 0
    while index < len(messages) and messages[index].role == "system":
        index += 1
    return index


def summary_block(messages: Sequence[Message]) -> int:
    """The length of the leading block plus the summaries written as user turns right after it."""
    index = leading_block(messages)
    while index < len(messages) and messages[index].is_summary:
        index += 1
    return index


def _head(messages: Sequence[Message]) -> tuple[tuple[int, ...], list[int], int]:
    """The kept system prompt, the earlier summaries before the region, and where it starts."""
    start = leading_block(messages)
    head = tuple(i for i in range(start) if not messages[i].is_summary)
    earlier = [i for i in range(start) if messages[i].is_summary]
    # The user turn an earlier compaction put after its summary belongs to
    # that output (replaced with it, counting as no message); a summary another
    # compactor wrote as a user turn (LangChain's) is an earlier summary too.
    while start < len(messages) and messages[start].is_summary and messages[start].role != "system":
        earlier.append(start)
        start += 1
    return head, earlier, start


def _after_provider_block(messages: Sequence[Message], start: int, flags: Sequence[bool]) -> int:
    """Where the region starts when a provider compaction block fences off what precedes it."""
    blocks = [i for i in range(start, len(messages)) if messages[i].has_compaction_block]
    if not blocks:
        return start
    # The first valid boundary after the block, so a tool call the block's
    # message makes keeps its results.
    return next(c for c in range(blocks[-1] + 1, len(messages) + 1) if flags[c])


Protect = Callable[[Sequence[Message], Sequence[int], int, int], tuple[tuple[int, ...], int]]
"""What may not be cut: given the conversation, its counts and the region ``[start, cut)``, the
indices kept verbatim after the summary and how many were left out for a cap (``features.Pins``)."""


def plan_compaction(
    messages: Sequence[Message],
    counts: Sequence[int],
    keep_recent_tokens: int,
    *,
    force: bool = True,
    protect: Protect | None = None,
    most: int | None = None,
) -> Plan | None:
    """Decide the cut for one compaction.

    Leading system messages (the application's prompt) are never summarized;
    earlier summaries among them are updated, not kept. The cut follows
    ``find_cut``; when nothing is over the keep budget and ``force`` is set (a
    manual compaction, as pi's ``Compact`` does), the cut keeps only the last
    valid message.

    Args:
        messages: The conversation.
        counts: Token count per message.
        keep_recent_tokens: Recent tokens to keep.
        force: Whether to force a cut when everything fits the keep budget.
        protect: What may not be cut (kept verbatim after the summary); nothing when ``None``.
        most: The most the messages kept after the summary may hold: a tool
            exchange in progress larger than that is summarized whole (``None``: no bound).

    Returns:
        The plan, or ``None`` when there is nothing to compact.
    """
    head, earlier, start, region_start, flags, credit = _region(messages)
    cut = find_cut(messages, counts, keep_recent_tokens, start=region_start, credit=credit, valid=flags, most=most)
    forced = False
    if cut == 0 and force:
        cut = forced_cut(messages, start=region_start, credit=credit, valid=flags, counts=counts, most=most)
        forced = cut > 0
    if cut <= region_start:
        return None
    inside = [i for i in range(region_start, cut) if messages[i].is_summary]
    cut, pinned, over = _protected(messages, counts, (region_start, cut), protect, most=most, flags=flags)
    if pinned and len(pinned) + len(inside) >= cut - region_start:
        return None  # everything before the cut is pinned: nothing to summarize
    return Plan(
        keep_head=head,
        start=region_start,
        cut=cut,
        previous_summaries=(*earlier, *inside),
        forced=forced,
        provider_prefix=tuple(range(start, region_start)),
        pinned=pinned,
        pinned_over_cap=over,
    )


def _region(messages: Sequence[Message]) -> tuple[tuple[int, ...], list[int], int, int, list[bool], int]:
    """What every cut plans over: the head, the region and its boundaries.

    The kept system prompt, the earlier summaries, where the region after them
    starts, where the budget cut's region starts (after a provider block), the
    valid boundaries, and the credit the earlier summaries give.
    """
    head, earlier, start = _head(messages)
    flags = valid_boundaries(messages)
    # An earlier summary counts as one summarized message, as in pi, where the
    # summary was simply the first message of the list.
    credit = sum(1 for i in earlier if messages[i].carries_summary)
    return head, earlier, start, _after_provider_block(messages, start, flags), flags, credit


def budget_walk(
    messages: Sequence[Message], counts: Sequence[int], keep_recent_tokens: int, *, most: int | None = None
) -> Walk:
    """Where ``plan_compaction``'s budget cut falls (unforced), or what keeps one from falling (``walk_cut``)."""
    _, _, _, region_start, flags, credit = _region(messages)
    return walk_cut(messages, counts, keep_recent_tokens, start=region_start, credit=credit, valid=flags, most=most)


def _protected(
    messages: Sequence[Message],
    counts: Sequence[int],
    region: tuple[int, int],
    protect: Protect | None,
    *,
    most: int | None,
    flags: Sequence[bool],
) -> tuple[int, tuple[int, ...], int]:
    """The cut, what may not be cut before it (pinned) and how many were left out for a cap.

    Written back after the summary, the pinned messages take from what the
    kept tool exchange in progress may hold: past that, it goes whole.
    """
    start, cut = region
    if protect is None:
        return cut, (), 0
    pinned, over = protect(messages, counts, start, cut)
    if most is not None and pinned:
        whole = whole_if_over(messages, counts, cut, most - sum(counts[i] for i in pinned), flags)
        if whole != cut:
            return (whole, *protect(messages, counts, start, whole))
    return cut, pinned, over


def narrowed(plan: Plan, until: int) -> Plan:
    """``plan`` with its cut moved back to ``until``: what a summary covering only the region before it replaces.

    ``until`` is a chunk's first message, so a valid boundary: no tool call is
    separated from its results. Pinned messages and earlier summaries after it
    stay where they are, with everything else from ``until`` on.
    """
    return replace(
        plan,
        cut=until,
        pinned=tuple(i for i in plan.pinned if i < until),
        previous_summaries=tuple(i for i in plan.previous_summaries if i < until),
    )


def grown_since_summary(messages: Sequence[Message], counts: Sequence[int]) -> int | None:
    """Tokens added since the newest summary was written; ``None`` without one (or when unknown).

    A summary records the conversation's last message when it was written
    (``Message.written_after``); what follows that message is new. A
    compaction that comes back after much less than the distance from its
    landing to the threshold kept too much to land (see ``Compactor._keep``).
    """
    block = summary_block(messages)
    summaries = [m for m in messages[:block] if m.carries_summary]
    anchor = summaries[-1].written_after if summaries else None
    if anchor is None:
        return None
    # The first message with the anchor's id after the summary: with ids
    # repeated, a later one is not the anchor.
    index = next((i for i in range(block, len(messages)) if messages[i].id == anchor), None)
    return None if index is None else sum(counts[index + 1 :])


def misplaced(messages: Sequence[Message]) -> bool:
    """Whether an earlier summary (or its bridge) sits past the leading block.

    It happens when a subgraph's compacted output is merged into its parent by
    id: the parent keeps what the summary replaced and appends the summary.
    """
    start = summary_block(messages)
    if isinstance(messages, Scanned):  # this runs on every turn: where the summaries are is known
        if not messages.summaries or messages.summaries[-1] < start:
            return False
        found: Sequence[int] = [i for i in messages.summaries if i >= start]
    elif not any(map(_IS_SUMMARY, messages[start:])):  # C-level
        return False
    else:
        found = [i for i in range(start, len(messages)) if messages[i].is_summary]
    if not any(message.carries_summary for message in messages):
        return False  # bridges alone, their summary gone (an application removed it): nothing to order them after
    # (A bridge right after a provider's compaction block opens the loop kept after that fenced part: in place.)
    return not all(messages[i].label == "bridge" and i and messages[i - 1].has_compaction_block for i in found)


def reordered(messages: Sequence[Message], ensure_user_turn: bool = True) -> Layout:
    """Where the summaries found mid-history belong, and what they cover.

    The newest summary was written as an update of every earlier one, and its
    mark says which message it kept first: what lies before that message
    (after the application's leading system messages) is covered, and goes.
    One whose record says it kept nothing (``KEPT_NOTHING_KEY``) covers the
    messages up to the last it was written after (``Message.written_after``).
    When the mark is missing (a summary written by 0.1.0, or by another
    compactor), nothing is dropped: every summary moves to the front and every
    other message stays, in order. Bridges are replaced by one where needed.

    Args:
        messages: The conversation, with a summary somewhere past its leading block.
        ensure_user_turn: Whether a user turn must follow the summary.

    Returns:
        The layout: leading system messages and summaries, a bridge or not, the rest.
    """
    lead = leading_block(messages)
    head = [i for i in range(lead) if not messages[i].is_summary]
    summaries = [i for i, m in enumerate(messages) if m.carries_summary]
    rest = [i for i in range(lead, len(messages)) if not messages[i].is_summary]
    newest = summaries[-1]
    summary = messages[newest]
    covered_until = next((i for i in range(newest) if summary.kept_from and messages[i].id == summary.kept_from), None)
    if covered_until is None and summary.mark.get(KEPT_NOTHING_KEY) is True and summary.written_after is not None:
        # It kept nothing after its cut: it covers all it was written after.
        after = next((i for i in range(newest) if messages[i].id == summary.written_after), None)
        covered_until = None if after is None else after + 1
    if covered_until is None:
        head += summaries
    else:
        head.append(newest)
        # What it kept from before its cut (pinned messages, what precedes a
        # provider block) stays; the rest before the cut is what it covers.
        kept = set(messages[newest].kept_before)
        rest = [i for i in rest if i >= covered_until or messages[i].id in kept]
    bridge = ensure_user_turn and bool(rest) and messages[rest[0]].role != "user"
    return Layout(tuple(head), bridge, tuple(rest))
