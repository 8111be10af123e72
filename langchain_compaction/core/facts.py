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

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from langchain_compaction.core.tokens import estimate_tokens
from langchain_compaction.core.types import Fact, FactKind, Message, ToolCall

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

_MAX_FACT_CHARS = 240
REQUESTS_KEPT = 2
"""How many of the user's newest requests are facts."""
_EARLIER_REQUEST_CHARS = 120
_MAX_KEY_CHARS = 160
_SHORT_ARGUMENT = 80

# A user's rule or preference, or a correction of the agent.
_CONSTRAINT = re.compile(
    r"\b(?:never|always|don'?t|do not|must|mustn'?t|only|avoid|make sure|should(?:n'?t| not)|no longer|"
    r"instead of|keep|prefer|not allowed|forbidden|from now on|going forward|"
    r"please (?:answer|reply|respond|write|use|call|name))\b",
    re.IGNORECASE,
)
_CONSTRAINT_WORDS = (
    "never",
    "always",
    "don",
    "do not",
    "must",
    "only",
    "avoid",
    "make sure",
    "should",
    "no longer",
    "instead of",
    "keep",
    "prefer",
    "not allowed",
    "forbidden",
    "from now on",
    "going forward",
    "please",
)
_CORRECTION = re.compile(r"^(?:no\b[,.!]?|actually\b|wait\b|sorry\b|i meant\b|correction\b|that'?s wrong\b)", re.I)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")
_FENCED = re.compile(r"```.*?(?:```|\Z)", re.DOTALL)
# Pasted material rather than the user's words: a numbered listing ("1535: ..."),
# an indented code line, a file viewer's banner.
_LISTING = re.compile(r"^(?:\s*\d+[:|]|    |\t|\s*[\[(](?:File|Open file|Current directory)\b).*$", re.MULTILINE)

# Identifiers are matched token by token (whitespace-separated words, trimmed
# of brackets and punctuation), so a pathological input stays linear.
_URL = re.compile(r"https?://[^\s)>\]\"'`]+")
_TOKEN = re.compile(
    r"""
      [\w.+-]+@[\w-]+(?:\.[\w-]+)+                         # e-mail addresses
    | [\w.~@/-]*/[\w.@/-]+                                 # paths (checked by _is_path)
    | [\w-]+\.(?:py|pyi|js|ts|tsx|jsx|json|ya?ml|toml|md|txt|csv|c|h|cc|cpp|hpp|go|rs|java|kt|rb|php|sh|sql
        |html|css|cfg|ini|lock|xml|ipynb|env|pony)         # bare file names
    | [$€£¥]\d[\d,]*(?:\.\d+)?                             # amounts
    | \d{4}-\d{2}-\d{2}                                    # dates
    | v?\d+\.\d+(?:\.\d+)+                                 # versions
    | (?=[A-Za-z_-]*\d)(?=[\d_-]*[A-Za-z])[A-Za-z0-9][A-Za-z0-9_-]{3,}  # codes mixing letters and digits
    | \d[\d,]{3,}(?:\.\d+)?                                # long numbers
    """,
    re.VERBOSE,
)
_MAX_TOKEN_CHARS = 200
# camelCase, PascalCase with an inner capital, snake_case; tried at word starts only.
_CODE_NAME = re.compile(
    r"\b(?:[a-z]+[A-Z][A-Za-z0-9]*|[A-Z][a-z0-9]+[A-Z][A-Za-z0-9]*|[A-Za-z][A-Za-z0-9]*_[A-Za-z0-9_]+)\b"
)
# Tried only where a word starts, and it scans that word once: linear.
_MAYBE_IDENTIFIER = re.compile(r"(?<!\S)(?=\S*[\d/.@$€£¥])\S+")

# Which argument says what a call was about, most telling first.
_PATH_KEYS = ("file_path", "path", "filename", "file", "target_file", "notebook_path")
_KEY_ARGS = (*_PATH_KEYS, "command", "cmd", "url", "query", "pattern", "expression")

_WRITES = re.compile(r"write|edit|create|patch|replace|insert|append|apply|undo|rename|move|delete", re.I)
_READS = re.compile(r"read|view|open|show|cat\b|load", re.I)
_SHELL = re.compile(r"bash|shell|terminal|exec|run|command|console|python|cmd", re.I)

# An exception or a compiler's "error:" says what went wrong; a failure count
# or an exit status only that something did.
# (No pattern starts with a repeated class: each text position is tried once.)
_SPECIFIC_ERROR = r"(?:Error|Exception)(?:\b|\w*:)|\berror(?:\[\w+\])?:|\bfatal:|\bpanic:"
_ERROR = re.compile(
    rf"{_SPECIFIC_ERROR}|\bFAILED\b|\bfailed\b|command not found|No such file or directory|exit (?:code|status) [1-9]"
)
_SPECIFIC = re.compile(_SPECIFIC_ERROR)
# Every error line holds one of these (lowercased): a cheap test before the regex.
_ERROR_WORDS = (
    "error",
    "exception",
    "fatal:",
    "panic:",
    "failed",
    "not found",
    "no such file",
    "exit code",
    "exit status",
)


def normalize(text: str) -> str:
    """``text`` as facts are compared: case folded, runs of whitespace made one space."""
    return " ".join(text.split()).casefold()


def _clip(text: str, limit: int = _MAX_FACT_CHARS) -> str:
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    cut = text.rfind(" ", 0, limit)
    return text[: cut if cut > limit // 2 else limit]


def _prose(text: str) -> str:
    """The user's own words: code blocks, listings and indented code removed."""
    return _LISTING.sub("", _FENCED.sub(" ", text))


def constraints(text: str) -> list[str]:
    """The user's rules, preferences and corrections in ``text``, one sentence each.

    Example:
        >>> constraints("Fix the crash. Never edit tests/fixtures.json. Thanks!")
        ['Never edit tests/fixtures.json.']
    """
    found = []
    prose = _prose(text)
    low = prose.lower()
    # Plain substring scans first: most messages hold no rule at all.
    rules = any(word in low for word in _CONSTRAINT_WORDS)
    for raw in _SENTENCE_END.split(prose):
        sentence = raw.strip(" -*\t")
        if 8 <= len(sentence) <= 400 and ((rules and _CONSTRAINT.search(sentence)) or _CORRECTION.match(sentence)):
            found.append(_clip(sentence))
    return found


def identifiers(text: str, *, code_names: bool = True) -> list[str]:
    """Ids, codes, amounts, dates, versions, paths, URLs, addresses and code names in ``text``.

    Example:
        >>> identifiers("Rebook JG7FMM for $1,250.50 on 2024-05-21, see docs/booking.md")
        ['JG7FMM', '$1,250.50', '2024-05-21', 'docs/booking.md']
        >>> identifiers("Use the useTodos hook in TodoList and keep max_retries")
        ['useTodos', 'TodoList', 'max_retries']
    """
    prose = _prose(text)
    found: list[str] = []
    for url in _URL.findall(prose):
        _add_new(found, url.rstrip(".,;:!?"))
    # Only words with a digit, a dot, a slash, an @ or a currency sign can be
    # identifiers: one pass finds them, plain words are never looked at.
    for word in _MAYBE_IDENTIFIER.findall(prose):
        token = word.lstrip("([{<\"'`*").rstrip(")]}>\"'`*.,;:!?")
        if len(token) > _MAX_TOKEN_CHARS or "://" in token or not _TOKEN.fullmatch(token):
            continue
        if "/" in token and not _is_path(token):
            continue  # "and/or", "yes/no"
        _add_new(found, token)
    # Names from code the user wrote in prose (camelCase, PascalCase with an
    # inner capital, snake_case): a model paraphrases them into plain words.
    for name in _CODE_NAME.findall(prose) if code_names else ():
        _add_new(found, name)
    return found


def _add_new(found: list[str], value: str) -> None:
    if value and value not in found:
        found.append(_clip(value, _MAX_KEY_CHARS))


def _is_path(value: str) -> bool:
    last = value.rstrip("/").rsplit("/", 1)[-1]
    return value.startswith(("/", "~", "./", "../", "http")) or "." in last or value.count("/") >= 2


def _arguments(call: ToolCall) -> dict[str, object]:
    try:
        value = json.loads(call.arguments) if call.arguments else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def key_argument(call: ToolCall, arguments: dict[str, object] | None = None) -> str:
    """What a call was about: its path, command, URL or query, else an id or its first text argument."""
    args = _arguments(call) if arguments is None else arguments
    for key in _KEY_ARGS:
        value = args.get(key)
        if isinstance(value, str) and value.strip():
            return _clip(value.strip().splitlines()[0], _MAX_KEY_CHARS)
    for key, value in args.items():
        if (key == "id" or key.endswith("_id")) and isinstance(value, (str, int)) and not isinstance(value, bool):
            return _clip(str(value), _MAX_KEY_CHARS)
    # Else a short text argument; a long one is prose (a "think" tool's thought).
    text = next((v.strip() for v in args.values() if isinstance(v, str) and v.strip()), "")
    return text if len(text) <= _SHORT_ARGUMENT and "\n" not in text else ""


def _file_use(call: ToolCall, args: dict[str, object], last_opened: str | None) -> tuple[str, str] | None:
    """``("read" | "modified", path)`` when ``call`` reads or changes a file."""
    command = args.get("command")
    # An editor tool names its operation in "command" (str_replace_editor view/create);
    # a command-line tool (SWE-agent's "open path 293") names itself and the path.
    verb = command if isinstance(command, str) and command.isidentifier() else call.name
    path = next((v for k in _PATH_KEYS if isinstance(v := args.get(k), str) and v.strip()), None)
    own_command = isinstance(command, str) and command.split()[:1] == [call.name]
    if path is None and own_command:
        words = str(command).split()
        path = words[1] if len(words) >= 2 and _is_path(words[1]) else None
    if _WRITES.search(verb):
        if path is None and own_command:
            path = last_opened  # SWE-agent's "edit 1:1" edits the file it opened last
        return ("modified", path) if path else None
    if path and _READS.search(verb):
        return "read", path
    return None


# Lines that name an error without reporting one: a traceback's banner, code
# that raises, a diff's changed line.
_NOT_AN_ERROR = re.compile(r"Traceback \(most recent call last\)|[+-]|\s*(?:raise|throw|except|catch)\b")


def error_line(text: str) -> str:
    """The last line of ``text`` that reports an error ("" if none does).

    Example:
        >>> error_line("collected 3 items\\nE   ValueError: bad offset 14\\n1 failed")
        'E ValueError: bad offset 14'
    """
    low = text.lower()
    if not any(word in low for word in _ERROR_WORDS):
        return ""  # the common case, found by plain substring scans
    lines = [line.strip() for line in text.splitlines() if _ERROR.search(line)]
    lines = [line for line in lines if line and not _NOT_AN_ERROR.match(line)]
    # A summary line ("1 failed, 2 passed") says less than the exception above it.
    specific = [line for line in lines if _SPECIFIC.search(line)]
    return _clip((specific or lines or [""])[-1])


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
        request = _clip(_prose(text))
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
            self.facts[key] = replace(earlier, text=_clip(earlier.text, _EARLIER_REQUEST_CHARS))
        self.requests = requests[cut:]
        self.add(Fact("request", request, key=f"request:{normalize(request)}"))

    def _call(self, call: ToolCall, *, record: bool) -> None:
        args = _arguments(call)
        if call.id:
            self.calls[call.id] = (call, args)
        use = _file_use(call, args, self.last_opened)
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
        line = error_line(text if _SHELL.search(call.name) else edges)
        if message.is_error and not line:
            line = _clip(lines[-1]) if lines else "failed"
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
