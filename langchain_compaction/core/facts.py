"""Checked summaries: the facts a continuing agent needs, found without a model.

A summarizer may drop a file path, a booking code or the user's "never touch
X"; a poor one drops most of them. So the library finds those facts itself,
deterministically, in the messages a compaction removes, and after the
summarizer answers it checks the summary against them: each fact the summary
does not state (compared after folding case and whitespace) goes into a section
the library writes under the summary, in priority order, within its own budget
(``Budget.facts_max``) plus what the summarizer left unused of the summary's.

What counts as a fact (the rules were chosen on the real transcripts in
``../shared/data/transcripts`` and the synthetic sessions of ``bench/``):

- constraint: a sentence of the user's own that says never / always / don't /
  must / only / avoid / keep / from now on / please answer in ..., or corrects
  the agent ("No, ...", "Actually, ...", "I meant ...");
- request: the user's newest requests in the compacted part (``REQUESTS_KEPT``);
- identifier: what the user gave that a model cannot guess: ids and codes
  that mix letters and digits, amounts, dates, versions, long numbers, file
  paths, URLs and e-mail addresses;
- modified_file / read_file: the paths of file tools (``Write``, ``Edit``,
  ``str_replace_editor create``, ``read_file``, ``open`` ...); a file read and
  later changed is a modified file;
- error: the last error line of each command or tool whose result failed;
  a later run of the same command that succeeds resolves it;
- done_call: tool calls already made (the tool and its key argument), so they
  are not made again.

Facts carried by an earlier summary (recorded in its mark) are carried on and
superseded by the same rules, so a constraint given in the first hour survives
the fifth compaction. Supersession also looks at the messages kept after the
cut: an error fixed there is not reported as open.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from langchain_compaction.core.extract import (
    SHELL,
    call_arguments,
    clip,
    constraints,
    error_line,
    file_use,
    identifiers,
    key_argument,
    normalize,
    prose,
)
from langchain_compaction.core.tokens import estimate_tokens
from langchain_compaction.core.types import Fact, FactKind, Message, ToolCall

__all__ = [
    "PRIORITY",
    "SECTION_HEADING",
    "SECTION_NOTE",
    "FactCheck",
    "check_summary",
    "constraints",
    "error_line",
    "gather",
    "identifiers",
    "normalize",
    "render_section",
]

PRIORITY: tuple[FactKind, ...] = (
    "constraint",
    "request",
    "identifier",
    "modified_file",
    "error",
    "done_call",
    "read_file",
)
"""The order in which facts get the section's budget (the first kinds first)."""

SECTION_HEADING = "## Checked facts"
SECTION_NOTE = "(kept by langchain-compaction: the summary above did not state them)"

_TITLES: dict[FactKind, str] = {
    "constraint": "User constraints",
    "request": "The user's latest requests",
    "identifier": "Identifiers the user gave",
    "modified_file": "Files modified",
    "error": "Unresolved errors",
    "done_call": "Tool calls already made",
    "read_file": "Files read",
}
REQUESTS_KEPT = 2
"""How many of the user's newest requests are facts."""
_EARLIER_REQUEST_CHARS = 120


@dataclass
class _Tracker:
    """The facts in force, in order of appearance, as messages are read in order."""

    facts: dict[tuple[FactKind, str], Fact] = field(default_factory=dict)
    calls: dict[str, tuple[ToolCall, dict[str, object]]] = field(default_factory=dict)
    last_opened: str | None = None
    requests: list[tuple[FactKind, str]] = field(default_factory=list)

    def add(self, fact: Fact) -> None:
        if not fact.text.strip():
            return
        key = (fact.kind, fact.key or normalize(fact.text))
        self.facts.pop(key, None)  # a fact seen again moves to the end: it is the newest
        self.facts[key] = fact
        if fact.kind == "request":
            self.requests = [*(k for k in self.requests if k != key), key]

    def drop(self, kind: FactKind, key: str) -> None:
        self.facts.pop((kind, key), None)

    def read(self, message: Message, *, record: bool) -> None:
        """Take what ``message`` says; with ``record=False`` (a kept message) only resolve and supersede."""
        if message.is_summary:
            return
        if message.role == "user" and record:
            self._user(message.text)
        elif message.role == "assistant":
            for call in message.tool_calls:
                self._call(call, record=record)
        elif message.role == "tool":
            self._result(message, record=record)

    def _user(self, text: str) -> None:
        for sentence in constraints(text):
            self.add(Fact("constraint", sentence))
        for value in identifiers(text):
            self.add(Fact("identifier", value))
        request = clip(prose(text))
        if not request:
            return
        # The newest requests: what the user is after now in full, and, shorter,
        # the one before (the task it continues); older ones are the summary's.
        # (Requests are few: kept in order beside the facts, not found by scanning them.)
        requests = [key for key in self.requests if key in self.facts]
        cut = max(len(requests) - (REQUESTS_KEPT - 1), 0)
        for key in requests[:cut]:
            del self.facts[key]
        for key in requests[cut:]:
            earlier = self.facts[key]
            self.facts[key] = replace(earlier, text=clip(earlier.text, _EARLIER_REQUEST_CHARS))
        self.requests = requests[cut:]
        self.add(Fact("request", request, key=f"request:{normalize(request)}"))

    def _call(self, call: ToolCall, *, record: bool) -> None:
        args = call_arguments(call)
        if call.id:
            self.calls[call.id] = (call, args)
        use = file_use(call, args, self.last_opened)
        if use is not None:
            kind, path = use
            self.last_opened = path
            if kind == "modified":
                self.drop("read_file", path)  # read, then rewritten: one fact, the newer
                if record:
                    self.add(Fact("modified_file", path, key=path))
            elif record and ("modified_file", path) not in self.facts:
                self.add(Fact("read_file", path, key=path))
            return
        argument = key_argument(call, args)
        if record and argument and call.name:
            self.add(Fact("done_call", argument, key=f"{call.name}\x00{argument}", detail=call.name))

    def _result(self, message: Message, *, record: bool) -> None:
        found = self.calls.get(message.tool_call_id or "")
        if found is None:
            return
        call, args = found
        # Keyed by what the call was about: a later clean run of the same
        # command, or a later successful write of the same file, resolves it.
        command = key_argument(call, args) or call.name
        key = command
        text = message.text.strip()
        # A command's output reports its errors anywhere; another tool's result
        # (a file's content) may mention an error without being one, so there
        # only a first or last line that reports one counts.
        lines = text.splitlines()
        edges = "\n".join(lines[:1] + lines[-1:]) if lines else ""
        line = error_line(text if SHELL.search(call.name) else edges)
        if message.is_error and not line:
            line = clip(lines[-1]) if lines else "failed"
        if not line:
            self.drop("error", key)  # the command ran cleanly: its earlier error is resolved
        elif record:
            self.add(Fact("error", line, key=key, detail=command))


def gather(
    carried: Iterable[Fact],
    messages: Sequence[Message],
    region: Iterable[int],
    kept: Iterable[int],
) -> list[Fact]:
    """The facts in force after a compaction, oldest first.

    Args:
        carried: The facts earlier summaries recorded (carried on).
        messages: The conversation.
        region: Indices of the messages being summarized, in order.
        kept: Indices of the messages kept after the cut, in order (they
            resolve and supersede, but add nothing: they stay in the context).

    Returns:
        The facts.
    """
    tracker = _Tracker()
    for fact in carried:
        tracker.add(fact)
    for index in region:
        tracker.read(messages[index], record=True)
    for index in kept:
        tracker.read(messages[index], record=False)
    return list(tracker.facts.values())


@dataclass(frozen=True, slots=True)
class FactCheck:
    """What checking a summary against the facts found.

    Attributes:
        facts: Every fact in force, to record with the summary and carry on
            (those the summary states and those the section adds).
        section: The section the library adds ("" when the summary states every fact).
        found: Facts in force.
        in_summary: Of those, stated by the summary.
        added: Added by the library in ``section``.
        dropped: Left out for the section's budget.
    """

    facts: tuple[Fact, ...]
    section: str
    found: int
    in_summary: int
    added: int
    dropped: int


def _line(fact: Fact) -> str:
    if fact.kind == "error" and fact.detail:
        return f"- {fact.text} (from `{fact.detail}`)"
    if fact.kind == "done_call" and fact.detail:
        return f"- {fact.detail}: {fact.text}"
    return f"- {fact.text}"


def render_section(facts: Sequence[Fact]) -> str:
    """The section that lists ``facts`` under their kinds, in priority order."""
    if not facts:
        return ""
    lines = [SECTION_HEADING, SECTION_NOTE]
    for kind in PRIORITY:
        of_kind = [f for f in facts if f.kind == kind]
        if of_kind:
            lines.append(f"{_TITLES[kind]}:")
            lines += [_line(f) for f in of_kind]
    return "\n".join(lines)


def check_summary(summary: str, facts: Sequence[Fact], budget: int) -> FactCheck:
    """Check ``summary`` against ``facts``; the section that adds what it misses, within ``budget`` tokens.

    Args:
        summary: The summarizer's text.
        facts: The facts in force, oldest first.
        budget: The most tokens the section may take.

    Returns:
        The check.

    Example:
        >>> facts = [Fact("constraint", "Never edit tests/fixtures.json."), Fact("identifier", "JG7FMM")]
        >>> check = check_summary("## Goal\\n- rebook JG7FMM", facts, 200)
        >>> (check.in_summary, check.added), check.section.splitlines()[-1]
        ((1, 1), '- Never edit tests/fixtures.json.')
    """
    stated = normalize(summary)
    norm = {id(f): normalize(f.text) for f in facts}
    missing = [f for f in facts if norm[id(f)] not in stated]
    chosen: list[Fact] = []
    shown = ""
    used = estimate_tokens(f"{SECTION_HEADING}\n{SECTION_NOTE}")
    for kind in PRIORITY:
        title = estimate_tokens(_TITLES[kind]) + 2
        # The newest of a kind first: when the budget runs out, the oldest go.
        for fact in reversed([f for f in missing if f.kind == kind]):
            line = _line(fact)
            # No character costs less than a quarter token: a line that cannot
            # fit by that bound is dropped before anything costlier is done.
            if used + len(line) // 4 + 1 + title > budget:
                continue  # dropped for the budget
            if norm[id(fact)] in shown:
                continue  # already in the section (a path inside a constraint)
            cost = estimate_tokens(line) + 1 + title
            if used + cost > budget:
                continue  # dropped for the budget
            chosen.append(fact)
            used += cost
            title = 0  # the kind's title is paid once
            shown += "\n" + normalize(line)
    order = {id(f): i for i, f in enumerate(facts)}
    chosen.sort(key=lambda f: (PRIORITY.index(f.kind), order[id(f)]))
    # Added: listed, or stated by another fact's line (a path inside a constraint).
    added = [f for f in missing if norm[id(f)] in shown]
    dropped = {id(f) for f in missing} - {id(f) for f in added}
    kept = tuple(f for f in facts if id(f) not in dropped)
    return FactCheck(
        facts=kept,
        section=render_section(chosen),
        found=len(facts),
        in_summary=len(facts) - len(missing),
        added=len(added),
        dropped=len(missing) - len(added),
    )
