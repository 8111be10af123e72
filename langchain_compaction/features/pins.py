"""Pinned context: messages written back verbatim after every summary, never paraphrased.

The latest call of each tool named in ``tools`` (the todo list of deepagents
and LangChain's planning middleware by default) and every message marked
``additional_kwargs={"compaction_pin": True}`` are kept after the summary with
their whole exchange (the assistant message and every result of its calls),
within ``max_tokens``; the oldest over it are summarized after all.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import ClassVar

from langchain_compaction.core.cut import thinking_loop_opening
from langchain_compaction.core.options import CompactionOptions, check_int, check_names
from langchain_compaction.core.types import Message
from langchain_compaction.features.base import Addition, Draft, Feature

logger = logging.getLogger("langchain_compaction")


def _exchanges(messages: Sequence[Message], start: int, cut: int) -> dict[int, tuple[int, ...]]:
    """Each message in ``[start, cut)`` mapped to its whole exchange (a call's message and all its results)."""
    owner: dict[str, int] = {}
    groups: dict[int, list[int]] = {}
    for i in range(start, cut):
        message = messages[i]
        # (A reply that continues a paused turn answers a call and may call again: one exchange with its caller.)
        if (caller := next((owner[a] for a in message.answers if a in owner), None)) is not None:
            groups[caller].append(i)
        if message.role == "assistant" and message.tool_calls:
            if caller is None:
                caller = i
                groups[i] = [i]
            owner.update((c.id, caller) for c in message.tool_calls if c.id)
    out: dict[int, tuple[int, ...]] = {}
    for group in groups.values():
        whole = tuple(group)  # one tuple an exchange, shared by its messages (thousands of parallel calls)
        out.update(dict.fromkeys(whole, whole))
    return out


@dataclass(frozen=True, slots=True)
class Pins(Feature):
    """Keep pinned messages and the latest call of pinned tools verbatim after the summary.

    Attributes:
        tools: Tools whose latest call, with its results, is never summarized.
        max_tokens: The most tokens pinned messages may keep; ``None``: half
            the keep budget. The oldest exchanges over it are summarized,
            with a warning.

    Its record in ``CompactionResult.parts["pins"]``: ``pinned`` (messages
    kept that way) and ``over_cap`` (exchanges summarized for the cap).

    Example:
        >>> Pins().limit(CompactionOptions(context_window=200_000))
        10000
    """

    name: ClassVar[str] = "pins"
    tools: tuple[str, ...] = ("write_todos",)
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "tools", check_names("tools", self.tools))
        if self.max_tokens is not None:
            check_int("max_tokens", self.max_tokens, minimum=0, advice="0 or more tokens, or None for half the keep")

    def limit(self, options: CompactionOptions) -> int:
        """The most pinned tokens under ``options``."""
        return self.max_tokens if self.max_tokens is not None else options.budget.keep // 2

    def bind(self, options: CompactionOptions) -> Pins:
        """Pins with the cap worked out for ``options``."""
        return replace(self, max_tokens=self.limit(options))

    def protect(self, messages: Sequence[Message], counts: Sequence[int], start: int, cut: int) -> tuple[object, ...]:
        """The messages in ``[start, cut)`` kept verbatim (newest first, within the cap); the exchanges left out.

        None while the kept part opens inside a tool loop of Claude's thinking:
        written back after the summary, a pinned call would open the loop in
        progress without its thinking block, which Claude refuses (``core.cut``).
        """
        opening = thinking_loop_opening(messages)
        if opening is not None and cut >= opening:
            return (), 0
        exchange = _exchanges(messages, start, cut)
        chosen: list[tuple[int, ...]] = []
        for name in self.tools:
            latest = next(
                (
                    i
                    for i in range(len(messages) - 1, start - 1, -1)
                    if any(c.name == name for c in messages[i].tool_calls)
                ),
                None,
            )
            if latest is not None and latest < cut:
                chosen.append(exchange.get(latest, (latest,)))
        chosen += [
            exchange.get(i, (i,)) for i in range(start, cut) if messages[i].pinned and not messages[i].is_summary
        ]
        if not chosen:
            return (), 0
        cap = self.max_tokens or 0
        kept: set[int] = set()
        used = over = 0
        for group in sorted(set(chosen), key=max, reverse=True):
            size = sum(counts[i] for i in group if i not in kept)
            if used + size > cap:
                over += 1
                continue
            kept.update(group)
            used += size
        return tuple(sorted(kept)), over

    def add(self, draft: Draft) -> Addition:
        """Nothing written: the figures of what was pinned (and a warning when the cap left some out)."""
        over = draft.plan.pinned_over_cap
        if over:
            logger.warning(
                "%d pinned exchange(s) were summarized: the pinned messages would pass Pins(max_tokens=%d) "
                "(raise it, or pin less)",
                over,
                self.max_tokens or 0,
            )
        return Addition(record={"pinned": len(draft.plan.pinned), "over_cap": over})
