"""Required sections: a summary without every checkpoint heading is asked for again.

Off by default: a custom ``summary_prompt`` or a plain function may rightly
write another format.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from langchain_compaction.core import prompts
from langchain_compaction.core.options import check_names
from langchain_compaction.errors import ConfigurationError
from langchain_compaction.features.base import Feature


@dataclass(frozen=True, slots=True)
class RequireSections(Feature):
    """Reject a summary that lacks any of ``headings``: it is asked for once more, then left to the fallback.

    Attributes:
        headings: The headings every summary must have (the checkpoint's by
            default: Goal, Constraints & Preferences, Progress, Done, In
            Progress, Blocked, Key Decisions, Next Steps, Critical Context).

    Example:
        >>> RequireSections(headings=("## Goal",)).headings
        ('## Goal',)
    """

    name: ClassVar[str] = "sections"
    headings: tuple[str, ...] = prompts.CHECKPOINT_SECTIONS

    def __post_init__(self) -> None:
        advice = "a tuple of section headings, e.g. ('## Goal', '## Next Steps')"
        headings = check_names("headings", self.headings, advice)
        # (A heading with no word in it, "" or "##", is in no summary: every one would be rejected.)
        if not headings or not all(any(c.isalnum() for c in heading) for heading in headings):
            raise ConfigurationError("headings", self.headings, f"pass {advice}, each with a word in it")
        object.__setattr__(self, "headings", headings)
