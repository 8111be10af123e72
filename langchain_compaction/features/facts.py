"""Checked facts: every summary is checked against facts found without a model.

The rules that find the facts are ``core.facts``'; this part runs them on
what a compaction removes (with the facts earlier summaries recorded, and the
kept messages resolving and superseding), checks the summarizer's text against
them, and adds what it does not state in a section under it. The facts ride in
the summary's mark under ``facts`` and are carried to the next compaction.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, get_args

from langchain_compaction.core.check import check_summary
from langchain_compaction.core.facts import gather
from langchain_compaction.core.options import CompactionOptions, check_int
from langchain_compaction.core.redact import redact_facts, redact_message
from langchain_compaction.core.section import facts_in_section
from langchain_compaction.core.tokens import estimate_tokens
from langchain_compaction.core.types import Fact, FactKind
from langchain_compaction.features.base import Addition, Draft, Feature

FACTS_KEY = "facts"
"""Key in a summary's mark: the facts it was checked against, as ``[kind, text, key, detail]`` lists."""

MIN_FACTS_TOKENS = 128
"""The smallest budget of the checked-facts section: a few constraints and paths."""

ROOM_FACTS_TOKENS = 512
"""The most the section's floor takes from the room a compaction lands in (a quarter of it), at a small window."""

MAX_FACTS_TOKENS = 2048
"""The largest budget of the checked-facts section derived."""

_KINDS = frozenset(get_args(FactKind))


def recorded_facts(mark: Mapping[str, Any]) -> list[Fact]:
    """The facts a summary's mark records; entries this version cannot read are skipped."""
    raw = mark.get(FACTS_KEY)
    if not isinstance(raw, list):
        return []
    return [
        Fact(entry[0], entry[1], entry[2], entry[3])
        for entry in raw
        if isinstance(entry, list) and len(entry) == 4 and all(isinstance(v, str) for v in entry) and entry[0] in _KINDS
    ]


@dataclass(frozen=True, slots=True)
class CheckedFacts(Feature):
    """Check each summary against the facts a continuing agent needs, and add what it misses.

    The facts (``core.facts``): the user's constraints and corrections, the
    task and their newest requests, identifiers they gave, files modified and
    read, errors not resolved since, tool calls already made, the words they
    keep using. Each one the summary does not state goes into a "Checked
    facts" section under it, within ``max_tokens`` (a floor the summarizer is
    asked to leave, out of the summary's budget) plus what the summary left
    unused of the rest.

    Attributes:
        max_tokens: The section's floor; ``None`` derives it: half of
            the summary's budget, or a quarter of the room the compaction
            lands in (``Budget.room``, up to 512 tokens) when that is more;
            between 128 and 2,048 tokens.

    Its record in ``CompactionResult.parts["facts"]``: ``found``,
    ``in_summary``, ``added``, ``dropped``, ``section``.

    Example:
        >>> CheckedFacts().budget(CompactionOptions(context_window=200_000))
        2048
    """

    name: ClassVar[str] = "facts"
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.max_tokens is not None:
            check_int("max_tokens", self.max_tokens, minimum=0, advice="0 or more tokens, or None to derive it")

    def budget(self, options: CompactionOptions) -> int:
        """The section's own budget under ``options``: its floor, left to it by the summarizer."""
        if self.max_tokens is not None:
            return self.max_tokens
        budget = options.budget
        # At a small window half the summary's budget holds a few paths, where
        # the agent needs the commands it ran and the files it read (forgotten,
        # they are run and read again, and there each output is a large share
        # of the window). A quarter of the room above the fixed part holds
        # them; taken over the room, not the window, so a system prompt and
        # tools that fill most of the window leave the floor small and the
        # compactions as rare as they were.
        share = min((budget.room or 0) // 4, ROOM_FACTS_TOKENS)
        return min(max(budget.summary_max // 2, share, MIN_FACTS_TOKENS), MAX_FACTS_TOKENS)

    def room(self, options: CompactionOptions, summary: str) -> int:
        """The section's budget under a summary: its floor, what the summary left unused, and the landing's slack.

        The slack is what the landing leaves above the fixed part, the recent
        messages kept and a full summary (``Budget.room - keep - summary_max``): at a small window it
        is where most of the facts fit. Past the floor, the section takes at
        most ``MAX_FACTS_TOKENS``.
        """
        floor = self.budget(options)
        budget = options.budget
        unused = max(budget.summary_max - floor - estimate_tokens(summary), 0)
        # (Measured against the keep target: what a turn adds after a
        # preparation, or one large kept output, is not the facts' to pay for.)
        slack = max(budget.room - budget.keep - budget.summary_max, 0) if budget.room is not None else 0
        return max(floor, min(floor + unused + slack, MAX_FACTS_TOKENS))

    def reserve(self, options: CompactionOptions) -> int:
        """The floor: the summarizer is asked to leave it (``SummaryRequest.max_tokens``)."""
        return self.budget(options)

    def add(self, draft: Draft) -> Addition:
        """Check the summary against the facts in force; the section that adds what it misses."""
        messages, plan, options = draft.messages, draft.plan, draft.options
        region = [i for i in plan.region if not messages[i].is_summary]
        redactor = options.redact
        if redactor is not None:
            # Facts are found in what the summarizer was shown: a secret's
            # context ("password=...") is what the redactor recognizes it by.
            view = list(messages)
            for i in (*region, *draft.kept):
                view[i] = redact_message(messages[i], redactor)
            messages = view
        # A summary whose mark was lost (saved in an OpenAI- or Anthropic-style file) carries its facts in its text.
        carried = [
            f
            for i in plan.previous_summaries
            for f in (recorded_facts(messages[i].mark) if messages[i].mark else facts_in_section(messages[i].text))
        ]
        if redactor is not None:  # (recorded before redact= was set, or under another redactor)
            carried = redact_facts(carried, redactor)
        facts = gather(carried, messages, region, draft.kept)
        # The section has a floor of its own (the summarizer was asked to leave
        # it), what the summarizer left unused, and the landing's slack.
        check = check_summary(draft.summary, facts, self.room(options, draft.summary))
        record = {
            "found": check.found,
            "in_summary": check.in_summary,
            "added": check.added,
            "dropped": check.dropped,
            "section": check.section,
        }
        mark = {FACTS_KEY: [[f.kind, f.text, f.key, f.detail] for f in check.facts]} if check.facts else {}
        return Addition(check.section, mark, record)
