"""Checked summaries: the facts a continuing agent needs, found without a model.

A summarizer may drop a file path, a booking code or the user's "never touch X";
a poor one drops most of them. So the library finds those facts itself, in the
messages a compaction removes, and checks the summary against them: each fact it
does not state (case and whitespace folded) goes into a section under the summary,
in priority order, within the section's budget (``CheckedFacts.room``).

What counts as a fact (the rules were chosen on the real transcripts in
``../shared/data/transcripts`` and the synthetic sessions of ``bench/``):

- constraint: a sentence of the user's own that says never / always / don't /
  must / only / avoid / keep / from now on / please answer in ..., or corrects
  the agent ("No, ...", "Actually, ...", "I meant ...");
  Only the user's own voice counts: not a quoted line (``>``), a forwarded
  message, a fenced block, a tool's output or the system prompt. A later
  message that takes a rule back ("forget what I said about tabs", "tabs are
  fine now", "you may use tabs") drops the rules on that subject, and only those
  (of "never A, and never B", a permission for B leaves "never A");
- rule: the rules of a pasted document (``core.extract.own_rule``: a prompt or a
  policy lays down dozens, which would crowd out everything else) but its first
  and its last: kept and revoked as constraints are, but last in line for room;
- task: the user's first substantive request (the task statement), kept for good;
- request: the user's newest requests in the compacted part (``REQUESTS_KEPT``);
- earlier: the requests before those that ask for something of their own
  (not "do that"), shortened (``EARLIER_KEPT``; past it, one that names an
  identifier, "send it to Bahnhofstrasse 12, 8001 Zurich", outlives small talk), last in line;
- identifier: what the user gave that a model cannot guess: ids and codes
  that mix letters and digits, amounts, dates, versions, long numbers, file
  paths, URLs and e-mail addresses;
- modified_file / read_file: the paths of file tools (``Write``, ``Edit``, ``read_file``,
  ``open`` ...) and of aider's report ("Applied edit to PATH": its edits are written in
  the assistant's text); a file read and later changed is a modified file;
- error: the last error line of each command or tool whose result failed; a later clean
  run of the same program on a target that holds the failed one (flags aside), or a later
  successful call of the same tool on the same target, resolves it;
- done_call: tool calls already made (the tool and its key argument), so they
  are not made again;
- name: the code names (``camelCase``, ``snake_case``, ``UPPER_CASE``) the agent's own words
  keep using (in two or more of its messages), which a summary paraphrases; when room is left;
- term: the words the user keeps using for the task (in two or more of their
  messages), when room is left.

Every fact is data: one line, clipped, control characters removed, and what a
tool returned is shown quoted, with the tool it came from; the section never
holds a heading or an instruction of anyone's but the library's.

Facts carried by an earlier summary (recorded in its mark) are carried on and
superseded by the same rules, so a constraint given in the first hour survives
the fifth compaction. Supersession also looks at the messages kept after the
cut: an error fixed there is not reported as open.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, fields
from itertools import islice
from typing import Any

from langchain_compaction.core.bounded import Bounded
from langchain_compaction.core.calls import (
    SHELL,
    CallReading,
    Unresolved,
    command_target,
    ran_as,
    read_call,
    run_on,
    written_files,
)
from langchain_compaction.core.effects import breathe
from langchain_compaction.core.extract import (
    DOCUMENT_CHARS,
    RULES_PER_MESSAGE,
    constraints,
    revokes,
    rule_words,
    without_revoked,
)
from langchain_compaction.core.identifiers import identifiers, identifiers_in
from langchain_compaction.core.lines import clip, compared, normalize, one_line
from langchain_compaction.core.readings import (
    UserSays,
    agent_names,
    error_line,
    failure_in,
    said_in,
    says_nothing_alone,
)
from langchain_compaction.core.section import (
    PRIORITY,
    SECTION_HEADING,
    SECTION_NOTE,
    render_section,
)
from langchain_compaction.core.subjects import Naming
from langchain_compaction.core.types import Fact, FactKind, Message, ToolCall

__all__ = [
    "DOCUMENT_CHARS",
    "PRIORITY",
    "RULES_PER_MESSAGE",
    "SECTION_HEADING",
    "SECTION_NOTE",
    "constraints",
    "error_line",
    "gather",
    "identifiers",
    "normalize",
    "render_section",
]

REQUESTS_KEPT = 2
"""How many of the user's newest requests are facts."""
EARLIER_KEPT = 10
"""How many older requests are kept, shortened, after those."""
_SHORT_REQUEST_CHARS = 120
"""What is kept of an older request."""
TERMS_KEPT = 12
"""How many of the user's repeated words are kept (the most repeated)."""
NAMES_KEPT = 8
"""How many of the code names the agent keeps using are kept (those met last)."""
_REPEATED: frozenset[FactKind] = frozenset({"name", "term"})
"""Kept once met in two messages or more: the code names met last, the words the user repeated most."""
COUNTED: frozenset[FactKind] = frozenset({"task", "request", "earlier", *_REPEATED})
"""The kinds whose number is bounded (``REQUESTS_KEPT``, ``EARLIER_KEPT``, ``NAMES_KEPT``, ``TERMS_KEPT``, one task)."""


_RULES: frozenset[FactKind] = frozenset({"constraint", "rule"})
"""The user's rules: their own and a pasted document's first and last, and the rest (``DOCUMENT_CHARS``)."""


def _cleaned(fact: Fact) -> Fact | None:
    """``fact`` as one clean line (``None`` when nothing is left); an error recorded by 0.2 keyed as errors are now."""
    # Nothing a message holds can make a fact more than one line.
    text = one_line(fact.text)
    if not text:
        return None
    detail = fact.detail
    if "\x00" in detail:  # an error's "tool\x00command": each part one line, the separator kept
        detail = "\x00".join(one_line(part) for part in detail.split("\x00"))
    elif detail:
        detail = one_line(detail)
    if text is not fact.text or detail is not fact.detail:  # (a clean line comes back as itself)
        fact = Fact(fact.kind, text, fact.key, detail)
    if fact.kind == "error":
        fact = _keyed_as_now(fact)
    return fact


def _keyed_as_now(error: Fact) -> Fact:
    """A carried error keyed as errors are now (0.2 keyed it by the whole command, 0.3 by its target as written)."""
    if "\x00" not in error.key:
        program, target = command_target(error.key or error.detail)
        return Fact("error", error.text, f"{program}\x00{target}", f"{program}\x00{error.detail}")
    program, _, target = error.key.partition("\x00")
    # (Only a command's target is read so: another tool's is its key argument, as written.)
    if SHELL.search(error.detail.partition("\x00")[0]) and run_on(target) != target:
        return Fact("error", error.text, f"{program}\x00{run_on(target)}", error.detail)
    return error


@dataclass
class _Tracker:
    """The facts in force, in order of appearance, as messages are read in order."""

    facts: dict[tuple[FactKind, str], Fact] = field(default_factory=dict)
    calls: dict[str, tuple[ToolCall, CallReading]] = field(default_factory=dict)
    # The fact each call was first to state, by call id: what a rejection of that call takes back.
    first_said: dict[str, tuple[FactKind, str]] = field(default_factory=dict)
    last_opened: str | None = None
    requests: list[tuple[FactKind, str]] = field(default_factory=list)
    earlier: list[tuple[FactKind, str]] = field(default_factory=list)
    # The errors not resolved yet, by program and target (a clean run resolves those its target holds).
    errors: Unresolved[tuple[FactKind, str]] = field(default_factory=Unresolved)
    # In how many messages each code name came, in the order they were last met;
    # in how many each of the user's words came (ranked by count: their order does not matter).
    names: dict[str, int] = field(default_factory=dict)
    terms: Counter[str] = field(default_factory=Counter)
    # Whether each older request names something (an identifier): read once, when it is first weighed.
    named: dict[tuple[FactKind, str], bool] = field(default_factory=dict)
    # The rules by their words (made at the first revocation); the task's and requests' keys (their rules go too).
    rules: Naming[tuple[FactKind, str]] | None = None
    asked: dict[tuple[FactKind, str], None] = field(default_factory=dict)

    def copy(self) -> _Tracker:
        """An independent copy: what either reads next does not change the other (the facts themselves are frozen)."""
        # (Field by field, so a field added later is copied too: each is a dict, a list or
        # a part with a ``copy`` of its own; a string or None is kept as it is.)
        return _Tracker(**{f.name: _copied(getattr(self, f.name)) for f in fields(self)})

    def add(self, fact: Fact) -> None:
        cleaned = _cleaned(fact)
        if cleaned is not None:
            self._keep(cleaned)

    def _keep(self, fact: Fact) -> None:
        """Keep ``fact``, one clean line already (``_cleaned``, or a reading's own)."""
        if fact.kind in _REPEATED:
            count = int(fact.detail) if fact.detail.isdigit() else 1  # carried: its count
            if fact.kind == "name":
                self.name(fact.text, count)
            else:
                self.terms[fact.text] += count
            return
        key = (fact.kind, fact.key or compared(fact))
        if fact.kind in _RULES:
            # One rule is one fact: stated again, it moves to the end, a constraint if either time it was one.
            other_kind: FactKind = "rule" if fact.kind == "constraint" else "constraint"
            other = (other_kind, key[1])
            if self.facts.pop(other, None) is not None and fact.kind == "rule":
                fact, key = Fact("constraint", fact.text, fact.key, fact.detail), other
        self._put(key, fact)
        if fact.kind in ("request", "earlier"):
            order = self.requests if fact.kind == "request" else self.earlier
            if key in order:
                order.remove(key)
            order.append(key)
        elif fact.kind == "error":
            program, _, target = fact.key.partition("\x00")
            self.errors.add(program, target, key)  # (a key superseded meanwhile is looked up and not found)

    def _put(self, key: tuple[FactKind, str], fact: Fact) -> None:
        """Keep ``fact`` under ``key``: a fact seen again moves to the end (it is the newest)."""
        self.facts.pop(key, None)
        self.facts[key] = fact
        if fact.kind in _RULES and self.rules is not None:
            self.rules.add(key, rule_words(fact.text))
        elif fact.kind in ("task", "request", "earlier"):
            self.asked[key] = None

    def name(self, text: str, count: int = 1) -> None:
        """The code name ``text`` (one clean line) met in ``count`` more messages, met last now."""
        self.names[text] = self.names.pop(text, 0) + count

    def read(self, message: Message, *, record: bool) -> None:
        """Take what ``message`` says; with ``record=False`` (a kept message) only resolve and supersede."""
        breathe()  # called per message: on the worker thread, let the event loop in
        if message.is_summary:
            return
        for result in message.results:  # (a user turn's tool_result blocks, a reply's server tools' results)
            self._result(result, record=record)
        if message.role == "user":
            self._user(said_in(message), record=record)
        elif message.role == "assistant":
            for call in message.tool_calls:
                self._call(call, record=record)
            for name in agent_names(message.text) if record else ():
                self.name(name)
        elif message.role == "tool":
            self._result(message, record=record)

    def _user(self, said: UserSays, *, record: bool) -> None:
        for subject in said.revoked:
            self._revoke(subject)
        if not record:
            return
        # (The reading's facts are clean lines already, shared by every
        # conversation that holds the text, and compared once.)
        for kind, text, norm in said.rules:
            self._keep(_compared_as(Fact(kind, text), norm))
        for text, norm in said.identifiers:
            self._put(("identifier", norm), _compared_as(Fact("identifier", text), norm))
        self.terms.update(said.terms)  # (each word once a message: ``task_terms`` is a set)
        if said.request is None:
            return
        request = Fact("request", *said.request)
        self.named[("earlier", request.key)] = bool(said.identifiers)  # (read with the message: when it is older)
        if ("task", "task") not in self.facts and said.task:  # (read only until the task is known)
            self._keep(Fact("task", said.task, "task"))
        # The newest requests: what the user is after now in full, and, shorter,
        # the one before (the task it continues); older ones are the summary's.
        # (Requests are few: kept in order beside the facts, not found by scanning them.)
        requests = [key for key in self.requests if key in self.facts]
        cut = max(len(requests) - (REQUESTS_KEPT - 1), 0)
        for key in requests[:cut]:
            # Older requests stay, shortened and last in line: they say what
            # the task grew into ("... per quarter"). One that asks for nothing
            # of its own ("do that", "yes please") says nothing once its context is gone.
            older = self.facts.pop(key)
            if not says_nothing_alone(older.text):
                self.add(Fact("earlier", clip(older.text, _SHORT_REQUEST_CHARS), key=key[1]))
        self.earlier = [key for key in self.earlier if key in self.facts]
        for key in self._left_out_of_earlier():
            del self.facts[key]
            self.earlier.remove(key)
        for key in requests[cut:]:
            previous = self.facts[key]
            short = clip(previous.text, _SHORT_REQUEST_CHARS)
            if short is not previous.text:
                self.facts[key] = Fact(previous.kind, short, previous.key, previous.detail)
        self.requests = requests[cut:]
        self._keep(request)

    def _left_out_of_earlier(self) -> list[tuple[FactKind, str]]:
        """The older requests past ``EARLIER_KEPT`` to let go: oldest first, those naming nothing first (read once)."""
        excess = len(self.earlier) - EARLIER_KEPT
        if excess <= 0:
            return []
        for key in self.earlier:
            if key not in self.named:
                self.named[key] = bool(identifiers_in(self.facts[key].text))
        gone = [key for key in self.earlier if not self.named[key]][:excess]
        if not gone:
            return self.earlier[:excess]  # (each names something: the oldest go)
        return gone + [key for key in self.earlier if key not in gone][: excess - len(gone)]

    def _revoke(self, subject: frozenset[str]) -> None:
        """Drop the rules the user took back: those about ``subject`` (and only those)."""
        if self.rules is None:
            self.rules = Naming()
            for key, fact in self.facts.items():
                if fact.kind in _RULES:
                    self.rules.add(key, rule_words(fact.text))
        for key in self.rules.naming(subject):  # (those that may name it; gone ones are not found)
            rule = self.facts.get(key)
            if rule is not None and revokes([subject], rule.text):
                left = without_revoked(rule.text, [subject])  # (a rule joined to it stays: "never A, and never B")
                del self.facts[key]
                if left:  # (keyed by what it says now: stated again, it is the same fact)
                    self._put((rule.kind, compared(Fact(rule.kind, left))), Fact(rule.kind, left, "", rule.detail))
        for key in list(self.asked):
            # The request stays; the rule it stated goes.
            said = self.facts.get(key)
            text = without_revoked(said.text, [subject]) if said is not None else ""
            if not text:
                self.facts.pop(key, None)
                del self.asked[key]
            elif said is not None and text != said.text:
                self.facts[key] = Fact(said.kind, text, said.key, said.detail)

    def _call(self, call: ToolCall, *, record: bool) -> None:
        reading = read_call(call)
        if call.id:
            self.calls[call.id] = (call, reading)
        before = len(self.facts)
        self._made(call, reading, record=record)
        if call.id and len(self.facts) > before:
            self.first_said[call.id] = next(reversed(self.facts))

    def _made(self, call: ToolCall, reading: CallReading, *, record: bool) -> None:
        """The facts a call states: the file it read or wrote, or itself, made with its key argument."""
        use = reading.file_use(self.last_opened)
        if use is not None:
            kind, path = use
            path = one_line(path, 400)
            self.last_opened = path
            if kind == "modified":
                self._modified(path, record=record)
            elif record and ("modified_file", path) not in self.facts:
                self.add(Fact("read_file", path, key=path))
            return
        argument = reading.key
        if record and argument and call.name:
            self.add(Fact("done_call", argument, key=f"{call.name}\x00{argument}", detail=call.name))

    def _modified(self, path: str, *, record: bool) -> None:
        self.facts.pop(("read_file", path), None)  # read, then rewritten: one fact, the newer
        if record:
            self.add(Fact("modified_file", path, key=path))

    def _result(self, message: Message, *, record: bool) -> None:
        found = self.calls.get(message.tool_call_id or "")
        if found is None:
            return
        call, reading = found
        ran = ran_as(call, message.text) if record else call
        if ran is not call:
            # A reviewer rejected or replaced it, or a limit stopped it: what it alone said goes (the same
            # call made earlier stays), and the call that ran instead is read, its failure too.
            said = self.first_said.pop(call.id or "", None)
            if said is not None:
                self.facts.pop(said, None)
            if ran is None:
                return
            self._call(ran, record=True)
            call, reading = ran, read_call(ran)
        # Keyed by the program (or tool) and what it ran on: a later clean run
        # of the same program on a target that holds it, or a later successful
        # call of the same tool on the same target, resolves it.
        command, program, target = reading.command, reading.program, reading.target
        line = failure_in(message, whole=reading.shell)
        if not line:
            self._resolve(program, target, command if reading.narrowed else "")
            if reading.use is None:  # a file tool's own result is its file's content
                for path in written_files(message.text.strip()):
                    self._modified(one_line(path, 400), record=record)
        elif record:
            self.add(Fact("error", line, key=f"{program}\x00{target}", detail=f"{call.name}\x00{command}"))

    def _resolve(self, program: str, target: str, only: str = "") -> None:
        """A clean run of ``program`` on ``target``: the errors it covers are resolved (``only``: those it ran)."""
        ran = f"\x00{only}"  # (asked only of the errors it may resolve: a clean run is common, errors are many)
        other = (lambda key: not getattr(self.facts.get(key), "detail", ran).endswith(ran)) if only else None
        for key in self.errors.resolve(program, target, other):
            self.facts.pop(key, None)  # gone already if superseded meanwhile

    def result(self) -> list[Fact]:
        """The facts in force, oldest first; the code names met last, oldest first; the most repeated words first."""
        found = list(self.facts.values())
        # (The newest first, from the end: a long session's agent has used thousands of names.)
        names = list(islice(((t, n) for t, n in reversed(self.names.items()) if n >= 2), NAMES_KEPT))[::-1]
        found += [Fact("name", text, key=text, detail=str(count)) for text, count in names]
        terms = sorted((n, t) for t, n in self.terms.items() if n >= 2)[-TERMS_KEPT:]
        found += [Fact("term", text, key=text, detail=str(count)) for count, text in reversed(terms)]
        return found


def _compared_as(fact: Fact, norm: str) -> Fact:
    """``fact`` knowing its compared form already (``core.lines.compared``: read once, with the message)."""
    object.__setattr__(fact, "known_norm", norm)
    return fact


def gather(
    carried: Iterable[Fact],
    messages: Sequence[Message],
    region: Iterable[int],
    kept: Iterable[int],
) -> list[Fact]:
    """The facts in force after a compaction, oldest first.

    Each message is read once: the facts as read up to the end of the region
    are kept (the last ``FOLDS_KEPT`` regions), and a later compaction whose
    region starts the same way, from the same carried facts (a retry of a
    compaction that failed or was not written, a second worker or a fork
    compacting the same checkpoint), goes on from there instead of reading
    the region again.

    Args:
        carried: The facts earlier summaries recorded (carried on).
        messages: The conversation.
        region: Indices of the messages being summarized, in order.
        kept: Indices of the messages kept after the cut, in order (they
            resolve and supersede, but add nothing: they stay in the context).

    Returns:
        The facts.
    """
    facts = tuple(carried)
    read = [messages[index] for index in region]
    key = (facts, id(read[0])) if read else None  # (the first message is held by the fold: its id is not reused)
    tracker, start = _resumed(facts, read, _FOLDS.get(key))
    for message in read[start:]:
        tracker.read(message, record=True)
    if key is not None and start < len(read):
        _FOLDS.put(key, _Fold(read, tracker.copy()))
    for index in kept:
        tracker.read(messages[index], record=False)
    return tracker.result()


FOLDS_KEPT = 8
"""How many regions' facts, as read to their end, are kept (the newest): a region is compacted again soon or never."""


@dataclass(frozen=True, slots=True)
class _Fold:
    """The facts as read from some carried facts through ``read`` (never changed: it is copied to go on)."""

    read: list[Message]
    tracker: _Tracker


_FOLDS: Bounded[_Fold] = Bounded(FOLDS_KEPT)


def _resumed(carried: tuple[Fact, ...], read: list[Message], fold: _Fold | None) -> tuple[_Tracker, int]:
    """A tracker that has read ``carried`` and the first messages of ``read`` (how many): from ``fold`` if it fits."""
    # (A list compares its items by identity first: the same message objects cost no field comparison.)
    if fold is not None and len(fold.read) <= len(read) and read[: len(fold.read)] == fold.read:
        return fold.tracker.copy(), len(fold.read)
    tracker = _Tracker()
    for fact in carried:
        tracker.add(fact)
    return tracker, 0


def _copied(value: Any) -> Any:
    """``value``, or its copy when it has one (a dict, a list, a counter, ``Unresolved``, ``Naming``)."""
    copy = getattr(value, "copy", None)
    return copy() if copy is not None else value
