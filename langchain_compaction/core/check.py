"""The check of a summary against the facts in force, and the section that adds what it misses."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from langchain_compaction.core.facts import COUNTED
from langchain_compaction.core.lines import compared, normalize
from langchain_compaction.core.section import Within, carried_over, fitting, line_of, render_section
from langchain_compaction.core.types import Fact


@dataclass(frozen=True, slots=True)
class FactCheck:
    """What checking a summary against the facts found.

    Attributes:
        facts: Every fact in force, to record with the summary and carry on
            (those the summary states, those the section adds, the requests
            and repeated words left out for room, bounded by count, and the
            newest of the other facts left out, within the section's budget again).
        section: The section the library adds ("" when the summary states every fact).
        found: Facts in force.
        in_summary: Of those, stated by the summary.
        added: Added by the library in ``section``.
        dropped: Left out for the section's budget (some carried on all the same).
    """

    facts: tuple[Fact, ...]
    section: str
    found: int
    in_summary: int
    added: int
    dropped: int


def check_summary(summary: str, facts: Sequence[Fact], budget: int) -> FactCheck:
    """Check ``summary`` against ``facts``; the section that adds what it misses, within ``budget`` tokens.

    Args:
        summary: The summarizer's text.
        facts: The facts in force, oldest first.
        budget: The most tokens the section may take.

    Returns:
        The check.

    Example:
        >>> facts = [Fact("constraint", "Never edit tests/fixtures.json."), Fact("identifier", "RZ8KPW")]
        >>> check = check_summary("## Goal\\n- rebook RZ8KPW", facts, 200)
        >>> (check.in_summary, check.added), check.section.splitlines()[-1]
        ((1, 1), '- "Never edit tests/fixtures.json."')
    """
    stated = normalize(summary)
    norm = {id(f): compared(f) for f in facts}
    missing = [f for f in facts if norm[id(f)] not in stated]
    chosen = fitting(missing, norm, budget)
    # Added: listed, or stated by another fact's line (a path inside a constraint).
    listed = {id(f) for f in chosen}
    within = Within("\n".join(normalize(line_of(f)) for f in chosen))
    added = [f for f in missing if id(f) in listed or within(norm[id(f)])]
    dropped = {id(f) for f in missing} - {id(f) for f in added}
    # What is left out may fit under a later summary (a cut that keeps less leaves more room).
    dropped -= carried_over([f for f in missing if id(f) in dropped and f.kind not in COUNTED], budget)
    kept = tuple(f for f in facts if id(f) not in dropped or f.kind in COUNTED)
    return FactCheck(
        facts=kept,
        section=render_section(chosen),
        found=len(facts),
        in_summary=len(facts) - len(missing),
        added=len(added),
        dropped=len(missing) - len(added),
    )
