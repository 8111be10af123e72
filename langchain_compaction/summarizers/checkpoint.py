"""The offline summarizer's document: the checkpoint sections, their items, and the trim that keeps them in budget.

``Checkpoint`` holds the items of each section in order (oldest first), so
adding, moving and dropping one is O(1); ``Checkpoint.trim`` drops the oldest
items of the section that weighs most until the text fits its budget.
"""

from __future__ import annotations

import heapq
import re
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from langchain_compaction.core.tokens import estimate_tokens
from langchain_compaction.core.transcript import shorten

__all__ = ["HEADINGS", "SECTIONS", "Checkpoint"]

SECTIONS = (
    "Goal",
    "Constraints & Preferences",
    "Done",
    "In Progress",
    "Blocked",
    "Key Decisions",
    "Next Steps",
    "Critical Context",
)
HEADINGS = {
    "goal": "Goal",
    "constraints & preferences": "Constraints & Preferences",
    "constraints": "Constraints & Preferences",
    "done": "Done",
    "in progress": "In Progress",
    "blocked": "Blocked",
    "key decisions": "Key Decisions",
    "next steps": "Next Steps",
    "critical context": "Critical Context",
}
_EMPTY = {"(none)", "none", "-", "n/a"}


_BULLET = re.compile(r"^(?:[-*•]\s+|\d+[.)]\s+|\[[ xX]\]\s+)+")

_WS = re.compile(r"\s+")


@dataclass(slots=True)
class _Item:
    text: str
    order: int
    precious: bool = False


@dataclass(slots=True)
class Checkpoint:
    """The sections of a checkpoint summary being written, each an ordered set of items."""

    # Per section, items by their normalized text, oldest first (dicts keep
    # insertion order): adding, moving and dropping an item are O(1).
    sections: dict[str, dict[str, _Item]] = field(default_factory=lambda: {s: {} for s in SECTIONS})
    order: int = 0

    def add(self, section: str, text: str, *, precious: bool = False) -> None:
        """Add ``text`` to ``section`` as its newest item (a repeated item moves there); ``precious`` goes last."""
        text = _BULLET.sub("", text.strip())  # the section writes its own bullet
        if not text or text.lower() in _EMPTY:
            return
        key = _WS.sub(" ", text).lower()
        items = self.sections[section]
        # A repeated fact is news again: it moves to the newest position.
        items.pop(key, None)
        self.order += 1
        items[key] = _Item(text, self.order, precious)

    def revise(self, section: str, revised: Callable[[str], str]) -> None:
        """Rewrite the items of ``section`` with ``revised``; an item it empties goes."""
        items = self.sections[section]
        for key, item in list(items.items()):
            text = revised(item.text)
            if not text:
                del items[key]
            elif text != item.text:
                item.text = text

    def take(self, section: str, prefix: str) -> list[str]:
        """Remove and return the items of ``section`` that start with ``prefix`` (without it)."""
        items = self.sections[section]
        taken = [key for key, item in items.items() if item.text.startswith(prefix)]
        return [items.pop(key).text[len(prefix) :] for key in taken]

    def render(self) -> str:
        """The summary's text: every section under its heading, ``(none)`` for an empty one."""

        def items(section: str, prefix: str = "- ") -> str:
            entries = self.sections[section].values()
            if not entries:
                return "- (none)"
            return "\n".join(f"{prefix}{e.text}" for e in entries)

        steps = list(self.sections["Next Steps"].values())
        next_steps = "\n".join(f"{i}. {e.text}" for i, e in enumerate(steps, 1)) if steps else "1. (none)"
        return (
            f"## Goal\n{items('Goal')}\n\n"
            f"## Constraints & Preferences\n{items('Constraints & Preferences')}\n\n"
            f"## Progress\n### Done\n{items('Done', '- [x] ')}\n\n"
            f"### In Progress\n{items('In Progress', '- [ ] ')}\n\n"
            f"### Blocked\n{items('Blocked')}\n\n"
            f"## Key Decisions\n{items('Key Decisions')}\n\n"
            f"## Next Steps\n{next_steps}\n\n"
            f"## Critical Context\n{items('Critical Context')}"
        )

    def trim(self, max_tokens: int) -> str:
        """Drop items until the summary fits ``max_tokens``: O(n log n) in the items.

        The item dropped is always the oldest of the section that weighs most,
        weighted by how much its facts are worth keeping: sections stay
        balanced, constraints and errors outlive chatter, and within each
        section the newest facts win (what the user said and error lines go
        after every other item of their section). The task (the first goal)
        goes after every other item.
        """
        # Each item costs its text plus the bullet and line break; the fixed
        # part is the headings and the "(none)" placeholders.
        queues: dict[str, deque[tuple[str, int]]] = {}
        weight: dict[str, int] = {}
        for section in SECTIONS:
            ranked = sorted(self.sections[section].items(), key=lambda kv: (kv[1].precious, kv[1].order))
            queues[section] = deque((key, estimate_tokens(item.text) + 2) for key, item in ranked)
            weight[section] = sum(cost for _, cost in queues[section])
        total = sum(weight.values()) + 60  # about the headings, and a few "(none)" placeholders
        tasks = {key for key, item in self.sections["Goal"].items() if item.precious}

        def rank(section: str) -> float:
            # The task (the first goal) goes after everything else: the summary is about it.
            if section == "Goal" and queues[section][0][0] in tasks:
                return 0.0
            return -weight[section] * _SECTION_WEIGHT[section]

        heap = [(rank(s), n, s) for n, s in enumerate(SECTIONS) if queues[s]]
        heapq.heapify(heap)
        while True:
            while total > max_tokens and heap:
                _, number, section = heapq.heappop(heap)
                key, cost = queues[section].popleft()
                del self.sections[section][key]
                weight[section] -= cost
                total -= cost
                if queues[section]:
                    heapq.heappush(heap, (rank(section), number, section))
            text = self.render()
            if not heap or estimate_tokens(text) <= max_tokens:
                break
            # The items' costs add up to a little less than the text: one more goes, and
            # only an empty template is ever cut (a cut line could start a heading).
            total = max_tokens + 1
        return _fit(text, max_tokens)


_CUT = " [...]"


def _fit(text: str, max_tokens: int) -> str:
    """``text`` within ``max_tokens``: as it is, else head and tail with a marker, else cut at a word, marked."""
    if estimate_tokens(text) <= max_tokens:
        return text
    short = shorten(text, max_tokens)
    if estimate_tokens(short) <= max_tokens:
        return short
    # A budget too small even for the headings: whole words while they fit.
    words = text.split(" ")
    kept: list[str] = []
    room = max_tokens - estimate_tokens(_CUT)
    for word in words:
        if estimate_tokens(" ".join([*kept, word])) > room:
            break
        kept.append(word)
    return " ".join(kept) + _CUT


# How readily a section gives up items when the summary is over budget
# (higher gives up sooner).
_SECTION_WEIGHT = {
    "Goal": 0.8,
    "Constraints & Preferences": 0.4,
    "Done": 1.2,
    "In Progress": 1.0,
    "Blocked": 0.6,
    "Key Decisions": 1.4,
    "Next Steps": 1.0,
    "Critical Context": 0.8,
}
