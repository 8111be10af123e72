"""An offline, deterministic summarizer that copies facts instead of writing prose.

``ExtractiveSummarizer`` fills the same checkpoint sections as the LLM prompt
from the messages themselves: the goal from the user's requests, constraints
from what the user asked for or forbade, progress from the tool calls and their
results (failures marked), decisions from what the assistant said it would do,
next steps from the latest request, and critical context copied verbatim (file
paths, identifiers, commands, error lines, URLs, numbers the user gave).

It is bounded: the summary stays within ``max_tokens``. When it updates a
previous summary it parses that summary's sections, adds the new items after
the old ones and, when over budget, drops the oldest items of the largest
section first, so the newest facts win.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeGuard

from langchain_compaction.core.calls import CallReading, Unresolved, read_call
from langchain_compaction.core.effects import breathe, compute_off_loop
from langchain_compaction.core.extract import (
    constraints,
    own_rule,
    revoked_subjects,
    revokes,
    without_revoked,
)
from langchain_compaction.core.identifiers import identifiers as core_identifiers
from langchain_compaction.core.lines import one_line, quoted
from langchain_compaction.core.options import check_int
from langchain_compaction.core.readings import error_lines, failure_in, feedback
from langchain_compaction.core.types import Message, SummaryRequest, ToolCall
from langchain_compaction.core.voice import own_words
from langchain_compaction.errors import ConfigurationError
from langchain_compaction.summarizers.checkpoint import HEADINGS, SECTIONS, Checkpoint

if TYPE_CHECKING:
    from langchain_core.messages import BaseMessage

__all__ = ["ExtractiveSummarizer"]

# A sentence ends at . ! ? followed by a space or the end, so "fields.py" stays whole.
_SENTENCE = re.compile(r"(?:[^.!?\n]|[.!?](?=\S))+(?:[.!?]+(?=\s|$)|$)", re.MULTILINE)
_DECISION = re.compile(
    r"\b(I'll|I will|I'm going to|let's|let me|we'll|we will|decided|decide|instead|switch(?:ed)? to|"
    r"chose|choose|the fix is|the cause is|the issue is|root cause|plan is|"
    # What an agent did or promised for the user (a support desk's refund, a booking): it must not be done twice.
    r"(?:I|we) (?:promise|guarantee)|(?:I|we)(?:'ve| have) (?:\w+ )?(?:issued|refunded|credited|scheduled|booked|"
    r"cancell?ed|reserved|ordered|arranged|escalated|processed|applied))\b",
    re.IGNORECASE,
)
# Announcing the next tool call or offering help is not a decision.
_FILLER = re.compile(
    r"(?i)^(?:(?:now|first|next|then|ok(?:ay)?|great|alright)\b[,.]?\s+)*"
    r"(?:let me|let's|i'll|i will|i'm going to)\s+(?:help|check|look|see|view|explore|verify|examine|open|read|"
    r"find|search|run|try|start|first|navigate|inspect|list|take a look|use the|create this)\b"
    r"|\blet me know\b|\bi can help\b|:$"
)
_NEXT_PREFIX = "Continue with the latest request: "
# A turn that only greets, thanks or says go on sets no goal.
_COURTESY = frozenset(
    {"hi", "hello", "hey", "thanks", "thank", "you", "ok", "okay", "yes", "no", "sure", "great", "good", "fine"}
    | {"cool", "go", "on", "continue", "please", "bye"}
)
# A message's error lines in Critical Context (its last ones: the problem comes last).
_ERRORS_SHOWN = 2
_INLINE_CODE = re.compile(r"`([^`\n]{2,160})`")
_IDENT = re.compile(
    r"\b(?:[A-Za-z_][A-Za-z0-9]*_[A-Za-z0-9_]+"  # snake_case
    r"|[a-z]+(?:[A-Z][a-z0-9]+){1,}"  # camelCase
    r"|[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]+)+"  # PascalCase
    r"|[A-Za-z_]\w*(?:\.[A-Za-z_]\w*){1,}\(?)\b"  # dotted.names
)
_ITEM_CHARS = 240
_CONTEXT_CHARS = 300
# A request already in Goal, named again as done: a reminder, not a copy.
_BRIEF_CHARS = 80


def _clip(text: str, limit: int = _ITEM_CHARS) -> str:
    text = one_line(text, len(text))  # the facts' rule: one line, no control characters
    if len(text) <= limit:
        return text
    return text[: limit - 1].rstrip() + "…"


def _sentences(text: str) -> Iterable[str]:
    for match in _SENTENCE.finditer(text):
        sentence = match.group().strip()
        if len(sentence) > 3:
            yield sentence


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""


# The arguments that say what a call was about, in the order a brief looks for them.
_BRIEF_KEYS = ("command", "cmd", "path", "file_path", "query", "url", "pattern")


def _args_brief(arguments: str) -> str:
    """A short, readable form of a tool call's JSON arguments."""
    try:
        value = json.loads(arguments)
    except (ValueError, TypeError):
        return _clip(arguments, 120)
    if isinstance(value, dict):
        if not value:
            return ""
        for key in _BRIEF_KEYS:
            if isinstance(value.get(key), str):
                return _clip(f"{key}={value[key]}", 160)
        return _clip(", ".join(f"{k}={v}" for k, v in value.items()), 160)
    return _clip(str(value), 120)


_ITEM_PREFIX = re.compile(r"^\s*(?:[-*•]\s*(?:\[[ xX]\]\s*)?|\d+[.)]\s*)")


def _parse_previous(summary: str, into: Checkpoint) -> None:
    """Read a previous checkpoint summary (ours or a model's) into sections."""
    section = "Critical Context"
    loose: list[str] = []
    for raw in summary.splitlines():
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            name = line.lstrip("#").strip().lower()
            section = HEADINGS.get(name, section if name == "progress" else "Critical Context")
            continue
        if _ITEM_PREFIX.match(line):
            # The first goal an earlier summary kept is the task.
            into.add(
                section, _ITEM_PREFIX.sub("", line, count=1), precious=section == "Goal" and not into.sections["Goal"]
            )
        else:
            loose.append(line)
    for line in loose:
        into.add("Critical Context", _clip(line, _CONTEXT_CHARS))


def _context_facts(text: str, *, from_user: bool, identifiers: bool = True) -> list[str]:
    # What counts as an identifier is ``core.facts``' rule (ids, codes,
    # amounts, dates, versions, paths, URLs, addresses), the one the checked
    # facts use; from the agent and its tools only paths, files and URLs of
    # it, plus the code names the agent wrote.
    found = core_identifiers(text, code_names=False)  # the agent's own code names come from _IDENT below
    if not from_user:
        found = [value for value in found if "/" in value or "." in value]
    if from_user or identifiers:
        # (Not a tool's inline code: a span of a tool's output is any sentence, stated unquoted.)
        found += _INLINE_CODE.findall(text)
    if identifiers and not from_user:
        # (Not a part of a value found already: "page_1" of "docs/page_1.md", as ``core.identifiers`` does.)
        values = list(found)
        names = (m.group().rstrip("(") for m in _IDENT.finditer(text))
        found += [name for name in names if not any(name in value for value in values)]
    return found


def _reported(source: str, line: str) -> str:
    """A tool's error line as the summary quotes it, with the tool it came from."""
    return _clip(f"{source} reported: {quoted(line)}", _CONTEXT_CHARS)


def _reads_file(call: ToolCall) -> bool:
    """Whether ``call`` reads a file (its result is the file's content)."""
    use = read_call(call).use
    return use is not None and use[0] == "read"


def _resolve(summary: Checkpoint, clean: CallReading, failures: Unresolved[set[str]]) -> None:
    """A clean call: the earlier failures it resolves (checked facts' rule, ``Unresolved``) leave."""
    gone = set().union(*failures.resolve(clean.program, clean.target))
    if gone:
        for section in ("Blocked", "Critical Context"):
            summary.revise(section, lambda item: "" if item in gone else item)


# A failed call as the Blocked section writes it (``_add_call``): "✗ tool(key=value) failed: "line"".
_BLOCKED_CALL = re.compile(
    rf"^✗ (?P<name>[^\s(]+)\((?P<key>{'|'.join(_BRIEF_KEYS)})=(?P<value>.*)\) failed: \"(?P<problem>.*)\"$"
)


def _carried_failures(summary: Checkpoint, failures: Unresolved[set[str]]) -> None:
    """The failed calls an earlier summary lists under Blocked, filed again: a clean run now takes them back."""
    for item in list(summary.sections["Blocked"].values()):
        found = _BLOCKED_CALL.match(item.text)
        if found is not None:
            reading = read_call(ToolCall(None, found["name"], json.dumps({found["key"]: found["value"]})))
            failures.add(reading.program, reading.target, {item.text, _reported(found["name"], found["problem"])})


def _all_core(messages: object) -> TypeGuard[Sequence[Message]]:
    """Whether ``messages`` is a list of the core's messages (what the library itself passes)."""
    return (
        isinstance(messages, Sequence)
        and not isinstance(messages, str)
        and all(isinstance(m, Message) for m in messages)
    )


@dataclass(frozen=True, slots=True)
class ExtractiveSummarizer:
    """Summarizes without a model: facts copied from the messages, bounded.

    Usable wherever a model is accepted (``compact``, the graph node, the
    history wrapper) and as ``fallback=`` when a model call fails.

    Attributes:
        max_tokens: The most tokens the summary may take (estimated).
        max_context_items: The most critical-context facts taken from one
            message, so one huge tool output cannot crowd out the rest.

    Example:
        >>> from langchain_core.messages import AIMessage, HumanMessage
        >>> from langchain_compaction import compact
        >>> msgs = [HumanMessage("Fix the crash in src/app.py; do not touch tests."),
        ...         AIMessage("I'll patch src/app.py."), HumanMessage("go on")]
        >>> result, out = compact(ExtractiveSummarizer(), msgs)
        >>> "src/app.py" in result.summary
        True
    """

    max_tokens: int = 3000
    max_context_items: int = 12

    def __post_init__(self) -> None:
        check_int("max_tokens", self.max_tokens, minimum=1, advice="the summary's budget in tokens, e.g. 3000")
        check_int("max_context_items", self.max_context_items, minimum=1, advice="how many items, e.g. 12")

    @property
    def name(self) -> str:
        """Always ``"extractive"``."""
        return "extractive"

    def summarize(self, request: SummaryRequest) -> str:
        """Build the checkpoint summary for ``request``, within both budgets.

        The smaller of ``max_tokens`` and the request's summary budget
        applies, so the summary always passes the engine's check.

        Raises:
            ConfigurationError: ``request`` is not a ``SummaryRequest`` (what
                the library sends); ``summarize_messages`` takes messages.
        """
        if not isinstance(request, SummaryRequest):
            # Text or messages passed by hand would fail deep inside with an AttributeError.
            advice = "pass a SummaryRequest (the library builds it); to summarize messages, call summarize_messages"
            raise ConfigurationError("request", request, advice)
        budget = min(self.max_tokens, request.max_tokens)
        return self._summarize(request.messages, request.previous_summary, request.instructions, budget)

    async def asummarize(self, request: SummaryRequest) -> str:
        """Same as ``summarize``, in a worker thread: a large region takes a while."""
        return await compute_off_loop(self.summarize, request)

    def summarize_messages(
        self,
        messages: Sequence[BaseMessage] | Sequence[Message],
        previous_summary: str | None = None,
        instructions: str = "",
    ) -> str:
        """Summarize messages directly, updating ``previous_summary``.

        Args:
            messages: The messages to summarize, in order: LangChain messages
                (read as a compaction reads them), or the library's core ones.
            previous_summary: A summary to update, if any.
            instructions: Custom instructions; recorded as a constraint.

        Returns:
            The checkpoint summary, within ``max_tokens``.

        Raises:
            InvalidMessagesError: ``messages`` is not a list of messages.

        Example:
            >>> from langchain_core.messages import AIMessage, HumanMessage
            >>> summary = ExtractiveSummarizer().summarize_messages(
            ...     [HumanMessage("Fix src/app.py; never touch tests/"), AIMessage("On it.")])
            >>> "src/app.py" in summary
            True
        """
        core: Sequence[Message]
        if _all_core(messages):
            core = messages
        else:
            # Imported here: importing the package loads no framework (tests/unit/test_public_api.py).
            from langchain_compaction._lc.convert import to_core_list

            core = to_core_list(messages)
        return self._summarize(core, previous_summary, instructions, self.max_tokens)

    def _summarize(
        self, messages: Sequence[Message], previous_summary: str | None, instructions: str, budget: int
    ) -> str:
        summary = Checkpoint()
        if previous_summary:
            _parse_previous(previous_summary, summary)
        results: dict[str | None, Message] = {
            r.tool_call_id: r for m in messages for r in (m, *m.results) if r.role == "tool" and r.tool_call_id
        }
        # A result that does not name its tool is its call's (one name for its lines wherever they are said).
        callers: dict[str | None, ToolCall] = {
            c.id: c for m in messages if m.role == "assistant" for c in m.tool_calls if c.id
        }
        failures: Unresolved[set[str]] = Unresolved()  # each failed call's lines, by program and target
        _carried_failures(summary, failures)
        requests: list[str] = []
        answered = False
        for message in messages:
            if self._read(summary, message, results, failures, callers):
                if requests and answered:
                    summary.add("Done", _clip(f"Answered: {requests[-1]}", _BRIEF_CHARS))
                requests.append(own_words(message.text).strip() or _first_line(message.text))
                answered = False
            elif message.role == "assistant" and not message.tool_calls and message.text.strip():
                answered = True
        if requests:
            # Only the open request is next: what an earlier summary had as
            # next was a request that came before these.
            for earlier in summary.take("Next Steps", _NEXT_PREFIX):
                summary.add("Done", _clip(f"Earlier request: {earlier}", _BRIEF_CHARS))
            # The newest stays next even when a reply followed it: the
            # conversation goes on from the kept messages after the summary.
            summary.add("Next Steps", _clip(f"{_NEXT_PREFIX}{requests[-1]}"))
        if instructions:
            # Added last, the newest of its section: what this compaction was asked to keep goes last
            # when the user's own rules fill the room.
            summary.add("Constraints & Preferences", _clip(f"Compaction instructions: {instructions}"), precious=True)
        return summary.trim(budget)

    def _read(
        self,
        summary: Checkpoint,
        message: Message,
        results: dict[str | None, Message],
        failures: Unresolved[set[str]],
        callers: dict[str | None, ToolCall],
    ) -> bool:
        """Add what ``message`` tells to ``summary``; whether it is a user request."""
        breathe()  # called per message: on the library's worker thread, let the event loop in
        for result in message.results:  # (a user turn's tool_result blocks: a tool's output)
            self._read(summary, result, results, failures, callers)
        text = message.text
        if message.role == "user" and text.strip():
            return self._user(summary, text)
        if message.role == "assistant":
            for sentence in _sentences(text):
                # (A question asks, it decides nothing: "What date would you like instead?")
                if _DECISION.search(sentence) and not _FILLER.search(sentence) and not sentence.rstrip().endswith("?"):
                    summary.add("Key Decisions", _clip(sentence))
            for call in message.tool_calls:
                self._add_call(summary, call, results.get(call.id), failures)
            self._add_context(summary, text, from_user=False)
        elif message.role == "tool":
            # Tool output is long and noisy: take its paths, URLs and error
            # lines, not every identifier in it.
            caller = callers.get(message.tool_call_id)
            source = message.name or (caller.name if caller else "") or "a tool"
            # A file read's result is the file: a line of it that says "error" is code, not a failure.
            read = caller is not None and _reads_file(caller)
            self._add_context(summary, text, from_user=False, identifiers=False, source=source, errors=not read)
        elif message.role == "system" and text.strip():
            summary.add("Critical Context", _clip(f"System note: {_first_line(text)}", _CONTEXT_CHARS))
        return False

    def _user(self, summary: Checkpoint, text: str) -> bool:
        """Take a user turn; whether it is a request (a slash command, a greeting or a harness's feedback is not)."""
        first = _first_line(text)
        words = [w.strip(".,!?;:") for w in text.lower().split()]
        if len(words) <= 6 and all(w in _COURTESY for w in words):
            return False
        command = first.startswith("/")
        harness = not command and feedback(first)
        if command:
            # A slash command, or a tool's echo of one: what the user did, not what they want.
            summary.add("Done", _clip(f"The user ran {first}", _BRIEF_CHARS))
        elif harness:
            # An error pasted back or arguments refused (by the user or a
            # harness speaking as the user): what is blocking, not a new goal.
            summary.add("Blocked", _clip(first))
            summary.add("Critical Context", _clip(first, _CONTEXT_CHARS), precious=True)
        elif own_words(text).strip():
            # The first request is the task: it outlives the later ones. (In
            # the user's own words: what they quote or forward is no goal.)
            summary.add("Goal", _clip(own_words(text)), precious=not summary.sections["Goal"])
        # The user's rules are the checked facts' (their own words, not what
        # they quote or forward); a rule they take back leaves the summary.
        revoked = revoked_subjects(text)
        if revoked:
            summary.revise("Constraints & Preferences", lambda rule: "" if revokes(revoked, rule) else rule)
            for section in SECTIONS:
                if section != "Constraints & Preferences":
                    summary.revise(section, lambda item: without_revoked(item, revoked))
        rules = constraints(text)
        for n, sentence in enumerate(rules):
            # A pasted document's other rules may go for room; the user's own may not.
            summary.add("Constraints & Preferences", _clip(sentence), precious=own_rule(text, n, len(rules)))
        self._add_context(summary, text, from_user=True)
        if command and "\n" in text.strip():
            # What the harness answered to the command is read as a tool's output.
            answer = text.strip().split("\n", 1)[1]
            self._add_context(summary, answer, from_user=False, identifiers=False, source=first.split(" ", 1)[0])
        # Neither a command nor a harness's feedback on a call is a request to continue with.
        return not command and not harness

    def _add_call(
        self,
        summary: Checkpoint,
        call: ToolCall,
        result: Message | None,
        failures: Unresolved[set[str]],
    ) -> None:
        name, arguments = call.name, call.arguments
        brief = _args_brief(arguments)
        label = f"{name}({brief})" if brief else name
        if result is None:
            summary.add("In Progress", _clip(f"{label}: no result yet"))
            return
        # Failed or not by checked facts' rule (``failure_in``): the summary's
        # Blocked and the section's unresolved errors never disagree.
        reading = read_call(call)
        problem = failure_in(result, whole=reading.shell)
        if problem:
            # What a tool wrote is quoted, never stated: it may say anything.
            blocked, reported = _clip(f"✗ {label} failed: {quoted(problem)}"), _reported(name, problem)
            summary.add("Blocked", blocked)
            summary.add("Critical Context", reported)
            # What a later clean run takes back: these lines, and the error
            # lines its output adds when it is read (``_add_context``).
            source = result.name or name
            shown = {_reported(source, e) for e in error_lines(result.text)[-_ERRORS_SHOWN:]}
            failures.add(reading.program, reading.target, {blocked, reported, *shown})
        else:
            # What a tool wrote: quoted, as its failures are. A file read's
            # first line is the file's, not an outcome: the path says it all.
            outcome = "" if _reads_file(call) else _first_line(result.text)
            summary.add("Done", _clip(f"{label} → {quoted(outcome)}" if outcome else label))
            _resolve(summary, reading, failures)
        for key in ("command", "cmd"):
            try:
                value = json.loads(arguments).get(key)
            except (ValueError, TypeError, AttributeError):
                value = None
            if isinstance(value, str) and value.strip():
                summary.add("Critical Context", _clip(f"command: {value}", _CONTEXT_CHARS))

    def _add_context(
        self,
        summary: Checkpoint,
        text: str,
        *,
        from_user: bool,
        identifiers: bool = True,
        source: str = "",
        errors: bool = True,
    ) -> None:
        # Error lines first: with the per-message cap they must not be crowded
        # out by paths. A tool's are quoted, with the tool's name.
        found = error_lines(text)[-_ERRORS_SHOWN:] if errors else []
        errors_found = [_reported(source, e) if source else e for e in found]
        facts = errors_found + _context_facts(text, from_user=from_user, identifiers=identifiers)
        taken = 0
        seen: set[str] = set()
        for raw in facts:
            fact = raw.strip().strip(".,;:")
            if len(fact) < 3 or fact in seen:
                continue
            seen.add(fact)
            summary.add("Critical Context", _clip(fact, _CONTEXT_CHARS), precious=from_user or raw in errors_found)
            taken += 1
            if taken >= self.max_context_items:
                break
