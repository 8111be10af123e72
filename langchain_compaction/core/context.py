"""How big the context is, and whether it is time to compact: the one trigger rule.

Every adapter, the command line and the public ``should_compact`` ask
``needs_compaction``; nothing else compares a size with a threshold.

The size is what the provider will bill when it can be known: the last reply's
reported input + output tokens (``Message.reported_tokens``, from
``usage_metadata``) plus the estimate of the messages after it. A reply is
trusted only when it came after the last compaction: a reply kept from before
still carries the old, larger figure. Each summary records the id of the
conversation's last message when it was written (``Message.written_after``);
a reply that does not come after that message is stale. Without a trusted
reply, the size is the sum of the per-message counts plus ``overhead`` (what
the request carries besides the messages: a system prompt and tool schemas
kept outside the list).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import islice
from operator import attrgetter
from typing import Literal

from langchain_compaction.core.options import CompactionOptions
from langchain_compaction.core.plan import leading_block, summary_block
from langchain_compaction.core.tokens import attachment_tokens
from langchain_compaction.core.types import Counts, Message, Scanned

_HAS_BLOCK = attrgetter("has_compaction_block")


def trusted_usage(lead: Sequence[Message], reply: Message, after: Sequence[Message]) -> int | None:
    """The tokens ``reply`` reports, if they measure the conversation as it is now.

    Args:
        lead: The leading block before the reply (where summaries sit).
        reply: The last assistant message.
        after: The messages after it.

    Returns:
        Its reported input + output tokens, or ``None``.
    """
    if reply.reported_tokens <= 0:
        return None
    summaries = [m for m in lead if m.carries_summary]
    if summaries:
        written_after = summaries[-1].written_after
        # The reply is fresh only if the message the summary was written
        # after comes before it (the tail after the reply is short).
        if written_after is None or reply.id == written_after or any(m.id == written_after for m in after):
            return None
    return reply.reported_tokens


def usage_anchor(messages: Sequence[Message]) -> tuple[int, int] | None:
    """The last reply's index and reported tokens, if they can be trusted.

    Args:
        messages: The conversation.

    Returns:
        ``(index, reported tokens)``, or ``None``.
    """
    last = next((i for i in range(len(messages) - 1, -1, -1) if messages[i].role == "assistant"), None)
    if last is None:
        return None
    # Summaries sit in the leading block: look there only, so a turn stays
    # O(new messages) on a long history.
    lead = messages[: min(summary_block(messages), last)]
    reported = trusted_usage(lead, messages[last], messages[last + 1 :])
    return None if reported is None else (last, reported)


def last_block(messages: Sequence[Message]) -> int | None:
    """The index of the last message with a provider-side compaction block, if any."""
    if isinstance(messages, Scanned):
        return messages.blocks[-1] if messages.blocks else None
    # C-level scan first: this runs on every turn and blocks are rare.
    if not any(map(_HAS_BLOCK, messages)):
        return None
    return next(i for i in range(len(messages) - 1, -1, -1) if messages[i].has_compaction_block)


FOREIGN_USAGE = 4
"""A reply whose usage is under a quarter of the estimate of the messages it answered (their images and
files apart: ``_measures``) did not measure this conversation (a sub-agent's reply handed up by a
supervisor, a server that reports its output alone): the estimate stands. (A usage over it is the
provider's count, system prompt and tools included, up to the window: ``inflated``.)"""


def inflated(reported: int, window: int | None) -> bool:
    """Whether a reply's usage is larger than any request of this window: it did not measure one.

    A provider accepts no request larger than its window (input and output),
    so a usage over it is a count gone wrong: a streamed reply whose chunks
    each carried the running total, which LangChain adds up as it merges them
    (80 times the request in a probe), or a wrapper that reports a whole
    session. Trusted, it compacts on every turn, a summary call each, since
    no compaction brings it under the threshold; the estimate stands instead.
    (A window set below the model's, with a system prompt and tools outside
    the state that fill it, reads the same: there no compaction helps either.)

    Args:
        reported: The tokens the reply reports.
        window: The context window (``None`` or 0: unknown, every usage is trusted).
    """
    return window is not None and 0 < window < reported


FOREIGN_GROWTH = 2
"""From one reply to the next, a usage grows by what came between them: at least half their estimate
(``follows``), less ``_GROWTH_SLACK`` for what a count and an estimate differ by on a short turn."""
_GROWTH_SLACK = 256
LOOK_BACK = 64
"""How many messages before the last reply ``follows`` looks through for the one before it."""


def follows(messages: Sequence[Message], counts: Sequence[int], index: int, reported: int) -> bool:
    """Whether the usage the reply at ``index`` reports grew with the conversation since the reply before it.

    A usage is the reply's request and answer, so from one reply to the next
    it grows by what came between them. One that stays put while the
    conversation grows measures another conversation: a worker's answer a
    supervisor hands up each turn with the worker's own usage (40,300 tokens
    turn after turn while the supervisor's messages grew past 85,000 in a
    60,000 window: it never compacted, being more than a quarter of the
    estimate). The estimate stands then. With no reply before it since the
    last summary (within ``LOOK_BACK`` messages), or a provider's compaction
    block between them, there is nothing to compare.
    """
    lead = min(summary_block(messages), index)
    for prev in range(index - 1, max(index - LOOK_BACK, lead) - 1, -1):
        earlier = messages[prev]
        if earlier.has_compaction_block:
            return True
        if earlier.role != "assistant" or earlier.reported_tokens <= 0:
            continue
        if trusted_usage(messages[:lead], earlier, messages[prev + 1 :]) is None:
            return True  # (from before the last summary: not comparable)
        between = islice(messages, prev + 1, index + 1)
        grown = _summed(counts, prev + 1, index + 1) - sum(attachment_tokens(m) for m in between)
        return reported - earlier.reported_tokens >= grown // FOREIGN_GROWTH - _GROWTH_SLACK
    return True


def _measured(messages: Sequence[Message], counts: Sequence[int], window: int | None) -> tuple[int, int] | None:
    """``usage_anchor``, where its usage measures this conversation (the rules above, in one place)."""
    anchor = usage_anchor(messages)
    if anchor is None:
        return None
    index, reported = anchor
    before = _summed(counts, 0, index + 1)
    if not (reported * FOREIGN_USAGE >= before or _measures(messages, index, reported, before)):
        return None
    return None if inflated(reported, window) or not follows(messages, counts, index, reported) else anchor


def sent_besides(messages: Sequence[Message], counts: Sequence[int], known: int, window: int | None) -> int:
    """What a request carries besides its messages: ``known`` (the adapter's count), or what usage says, if more.

    A node does not see the system prompt and tool schemas its model node
    adds, but the last reply's usage counts them: what it reports past the
    estimate of the messages it answered. Planned without it, a compaction
    landed over its target, came back on the next turns and was told to keep
    less (a prompt and tools of 5,000 tokens under a 7,000 threshold: 38
    summary calls in 50 turns, 10 planned with it). A usage that did not measure this
    conversation (``FOREIGN_USAGE``, ``inflated``) says nothing.

    Args:
        messages: The conversation.
        counts: Token count per message.
        known: What the adapter counted of it (the middleware: the agent's
            system prompt and tools; a node: 0).
        window: The context window.
    """
    anchor = _measured(messages, counts, window)
    if anchor is None:
        return known
    index, reported = anchor
    return max(known, reported - _summed(counts, 0, index + 1))


def context_tokens(
    messages: Sequence[Message], counts: Sequence[int], overhead: int = 0, window: int | None = None
) -> int:
    """The context size the trigger compares with the threshold.

    Args:
        messages: The conversation.
        counts: Token count per message.
        overhead: Tokens sent besides the messages (already in reported usage).
        window: The context window, to tell a usage gone wrong (``inflated``; ``None``: not told).

    Returns:
        The context size in tokens.
    """
    anchor = _measured(messages, counts, window)
    if anchor is not None:
        index, reported = anchor
        return reported + _summed(counts, index + 1)
    # A provider-side compaction block (Claude's ``compaction`` content) drops
    # everything before it from what the provider reads: only the system
    # prompt and what follows the last block are billed.
    lead = leading_block(messages)
    block = lead
    last = last_block(messages)
    if last is not None:
        block = max(lead, last)
    return _summed(counts, 0, lead) + _summed(counts, block) + overhead


def _summed(counts: Sequence[int], start: int, end: int | None = None) -> int:
    """``sum(counts[start:end])``: at once from a ``Counts``'s running sums (every turn, the whole history)."""
    if isinstance(counts, Counts):
        return counts.span(start, end)
    return sum(islice(counts, start, end))  # (summed in place, not sliced)


def _measures(messages: Sequence[Message], index: int, reported: int, before: int) -> bool:
    """Whether a usage under a quarter of the estimate (``before``: up to the reply) measured this conversation.

    Images and PDFs are estimated at a fixed cost that a provider may bill far
    under (Gemini about 258 tokens a page): the text before the reply decides.
    """
    attached = sum(attachment_tokens(m) for m in islice(messages, index + 1))
    return attached > 0 and reported * FOREIGN_USAGE >= before - attached


def over_threshold(messages: Sequence[Message], counts: Sequence[int], threshold: int, overhead: int = 0) -> bool:
    """Whether the context is larger than ``threshold`` tokens.

    Args:
        messages: The conversation.
        counts: Token count per message.
        threshold: The size that must not be exceeded.
        overhead: Tokens sent besides the messages.

    Returns:
        ``context_tokens(messages, counts, overhead) > threshold``.
    """
    return context_tokens(messages, counts, overhead) > threshold


def needs_compaction(
    messages: Sequence[Message], counts: Sequence[int], options: CompactionOptions, overhead: int = 0
) -> bool:
    """Whether automatic compaction should fire: the context is over the threshold.

    Args:
        messages: The conversation.
        counts: Token count per message.
        options: The options in force (``context_window=0`` turns it off).
        overhead: Tokens sent besides the messages.

    Returns:
        True when ``context_tokens`` exceeds ``context_window - reserve_tokens``.
    """
    return stage(messages, counts, options, overhead) == "due"


Stage = Literal["fits", "prepare", "due"]
"""Where the context stands: under every mark, past the mark to prepare a summary ahead, over the threshold."""


def stage(
    messages: Sequence[Message],
    counts: Sequence[int],
    options: CompactionOptions,
    overhead: int = 0,
    prepare: int | None = None,
) -> Stage:
    """Where the context stands against the threshold and the mark to prepare ahead (``features.PrepareAhead``).

    Args:
        messages: The conversation.
        counts: Token count per message.
        options: The options in force.
        overhead: Tokens sent besides the messages.
        prepare: The size past which a summary is prepared ahead, if any.

    Returns:
        ``"due"`` over the threshold, ``"prepare"`` past the preparation mark,
        else ``"fits"`` (always, when the window is unknown).
    """
    threshold = options.budget.threshold
    if threshold is None:
        return "fits"
    size = context_tokens(messages, counts, overhead, options.budget.window)
    if size > threshold:
        return "due"
    return "prepare" if prepare is not None and size > prepare else "fits"
