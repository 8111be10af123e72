"""What one message says, as checked facts read it: a user's message (``user_says``) and a tool's result.

The rules are ``core.extract``'s (a tool's error line is read here:
``error_line``); this module applies them to one message and
keeps what a user's message says and an assistant's code names, since the same
text is read again and again: the kept messages at every compaction, then as
the next one's region; a preparation, then the threshold compaction; a retried
turn. A reading is a pure function of the text, so it is kept under a 128-bit
digest of the text (``READINGS_KEPT`` of each kind, the most recently used):
the text itself is not held once its conversation lets it go.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from langchain_compaction.core.bounded import Bounded
from langchain_compaction.core.extract import own_rule, revoked_subjects, rules_in
from langchain_compaction.core.identifiers import CJK_LETTERS, identifiers_in, names_in_code
from langchain_compaction.core.lines import MAX_FACT_CHARS, clip, holds_any, normalize, one_line
from langchain_compaction.core.subjects import task_terms
from langchain_compaction.core.types import FactKind, Message
from langchain_compaction.core.voice import prose_and_own_words

CODE_NAMES_PER_MESSAGE = 12
"""How many code names (``camelCase``, ``snake_case``) one user message may give (the first); values are not capped."""
TASK_CHARS = 200
"""What is kept of the request that states the task."""
_R = TypeVar("_R")

READINGS_KEPT = 8192
"""How many readings of each kind are kept (the most recently used): user messages', assistants' code names."""


@dataclass(frozen=True, slots=True)
class UserSays:
    """What one user message says, as checked facts read it.

    Its facts are read once, each one clean line (``core.lines.one_line``),
    and shared by every conversation that holds the text. They are kept as
    strings and made facts when gathered: strings and tuples of them are no
    objects the garbage collector follows, and a server holds thousands.

    Attributes:
        revoked: The subjects of the rules it takes back.
        rules: Its rules, preferences and corrections, each with its kind (``constraint``,
            or ``rule`` for a pasted document's middle ones: ``own_rule``) and its compared form.
        identifiers: Its ids, amounts, paths and URLs, each with its compared form, all of them
            (twenty booking codes are twenty facts), and its first
            ``CODE_NAMES_PER_MESSAGE`` code names (dozens are a paste, a
            prompt or a listing: the summary's to carry).
        terms: Its words that may name what the task is about.
        request: What it asks for, clipped, and its key (the compared form);
            ``None`` for a harness's feedback or a slash command.
        asked: What it asks for, clipped, as written ("" for no request): ``task`` reads it.
    """

    revoked: tuple[frozenset[str], ...]
    rules: tuple[tuple[FactKind, str, str], ...]
    identifiers: tuple[tuple[str, str], ...]
    terms: tuple[str, ...]
    request: tuple[str, str] | None
    asked: str
    known_task: str | None = field(default=None, init=False, compare=False, repr=False)

    @property
    def task(self) -> str:
        """The request again, if it states a task (``TASK_CHARS``), else "".

        Read when first asked, not with the rest: only the messages read before
        a conversation's task is known are asked (most of a long one's are not).
        """
        known = self.known_task
        if known is None:
            request = self.asked
            states = _states_a_task(request, set(self.terms)) and not feedback(request)
            known = one_line(clip(request, TASK_CHARS)) if states else ""
            object.__setattr__(self, "known_task", known)
        return known


def user_says(text: str) -> UserSays:
    """Read a user message's text: see ``UserSays`` (kept: a text read before is not read again)."""
    return _once(_SAID, _read, text)


def said_in(message: Message) -> UserSays:
    """``user_says`` of a user message's text, kept on the message too (no digest when it is read again)."""
    known = message.known_reading
    if isinstance(known, UserSays):
        return known
    said = user_says(message.text)
    object.__setattr__(message, "known_reading", said)
    return said


def _read(text: str) -> UserSays:
    prose, words = prose_and_own_words(text)
    values = [one_line(value) for value in identifiers_in(prose, max_code_names=CODE_NAMES_PER_MESSAGE)]
    found = tuple([(value, normalize(value)) for value in values if value])
    rules = rules_in(words)
    request = clip(words)
    if not request or feedback(words) or request.startswith("/"):
        request = ""  # a harness's feedback on a call, or a slash command, is no request (and never the task)
    terms = task_terms(words)
    return UserSays(
        revoked=tuple(revoked_subjects(text)),
        rules=tuple(
            ("constraint" if own_rule(text, n, len(rules)) else "rule", line, normalize(line))
            for n, rule in enumerate(rules)
            if (line := one_line(rule))
        ),
        identifiers=found,
        terms=tuple(sorted(terms)),
        request=(line, f"request:{normalize(request)}") if (line := one_line(request)) else None,
        asked=request,
    )


# What a harness says in the user's turn when a call went wrong: an error
# pasted back, or a tool's arguments refused. (Anchored at the line's start or
# on literal words: linear on long lines.)
_FEEDBACK = re.compile(
    r"\s*(?:Traceback|[A-Z]\w*(?:Error|Exception)\b|ERROR\b|FAILED\b|fatal:|panic:)"
    r"|.{0,120}?\b(?i:is expected to be|must be one of|is not a valid|invalid (?:value|argument|parameter)"
    r"|missing (?:\d+ )?required|unknown (?:tool|function|parameter|argument)|tool call failed)"
)


def feedback(text: str) -> bool:
    """Whether a user turn is a harness's feedback on a call (an error or refused arguments), not a request.

    Example:
        >>> feedback("Parameter 'command' is expected to be one of ['view', 'create']."), feedback("Add a test")
        (True, False)
    """
    first = next((line for line in text.splitlines() if line.strip()), "")
    return holds_any(first, _FEEDBACK_WORDS) and _FEEDBACK.match(first) is not None


# Every feedback line holds one of these (lowercased: ``holds_any``).
_FEEDBACK_WORDS = (
    *("traceback", "error", "exception", "failed", "fatal:", "panic:", "expected to be", "must be one of"),
    *("not a valid", "invalid ", "missing ", "unknown ", "tool call failed"),
)


def says_nothing_alone(request: str) -> bool:
    """Whether ``request`` asks for nothing once its context is gone: "do that", "ok, go ahead", "yes please".

    Every word of it is a go-ahead, an acknowledgement or a pointer back
    (``_GO_AHEAD``); a request with one word of its own ("Fix the tests",
    "Also in CSV", "Now for Q3") says something.

    Example:
        >>> says_nothing_alone("ok, do that"), says_nothing_alone("Fix the tests")
        (True, False)
    """
    # (Word by word: a request's first words usually settle it, and a long one is not read whole.)
    said = False
    for word in _WORD.finditer(request):
        if word.group().lower() not in _GO_AHEAD:
            return False
        said = True
    return said


_WORD = re.compile(r"\w+")
_GO_AHEAD = frozenset(
    [
        "do",
        "it",
        "that",
        "this",
        "so",
        "same",
        "go",
        "ahead",
        "yes",
        "yep",
        "yeah",
        "ok",
        "okay",
        "sure",
        "please",
        "pls",
        "thanks",
        "thank",
        "you",
        "thx",
        "continue",
        "proceed",
        "again",
        "fine",
        "right",
        "now",
        "then",
        "sounds",
        "looks",
        "good",
        "great",
        "perfect",
        "cool",
        "nice",
        "lgtm",
        "agreed",
        "and",
        "keep",
        "going",
        "on",
    ]
)


def _states_a_task(request: str, terms: set[str]) -> bool:
    """Whether a request states a task, not a greeting or an acknowledgement.

    It names something the task is about in two words or more ("Fix the
    login bug."), or says five words or more. What opens with a greeting or
    an acknowledgement states one only in what follows it: "Sure, now add a
    retry to the fetcher" does, "Good morning!" and "Thanks, that looks good
    to me!" do not.
    """
    opening = _ACKNOWLEDGEMENT.match(request)
    if opening is not None:
        rest = request[opening.end() :]
        return _words(rest) >= 2 and bool(task_terms(rest))
    words = _words(request)
    return (words >= 2 and bool(terms)) or words >= 5


# Greetings and acknowledgements, one after another ("Thanks, perfect!", "ok, got it").
_ACKNOWLEDGEMENT = re.compile(
    r"(?:\W*(?:thanks|thank you|thx|ok(?:ay)?|great|perfect|nice|cool|awesome|excellent|lgtm|yes|yep|sure|got it"
    r"|(?:looks|sounds) (?:good|great|fine)|good(?: (?:morning|afternoon|evening|job|work))?|hi|hello|hey|there"
    r"|continue|go on)\b)+",
    re.IGNORECASE,
)

# Chinese and Japanese are written without spaces: about two characters a word.
_CJK_LETTER = re.compile(f"[{CJK_LETTERS}]")


def _words(text: str) -> int:
    """About how many words ``text`` holds, in any script."""
    return len(text.split()) + (0 if text.isascii() else len(_CJK_LETTER.findall(text)) // 2)


# -- a tool's output: the error it reports --------------------------------------------------

# An exception or a compiler's "error:" (rustc's "error[E0308]:", tsc's "error TS2322:") says what went
# wrong; a failure count or an exit status only that something did.
# (No pattern starts with a repeated class: each text position is tried once.)
_SPECIFIC_ERROR = r"(?:Error|Exception)(?:\b|\w*:)|\berror(?:\[\w+\]| TS\d+)?:|\bfatal:|\bpanic:"
# (A tally of none is a clean run's: "3 passed; 0 failed", "Failed:     0, Passed: 3". Go's test runner
# says "--- FAIL: TestX", "FAIL<tab>package" or FAIL alone; npm says "npm ERR!" or "npm error".)
# (The lookahead names every branch's first character: the other positions of a
# long output are passed at one test, not at each of the thirteen branches; 3x faster.)
_ERROR = re.compile(
    rf"(?=[EFNPcefnp-])(?:{_SPECIFIC_ERROR}|\bERROR\b|(?<!; 0 )(?<!, 0 )\b(?:FAILED|[Ff]ailed)\b(?!:\s+0(?:,|\s*$))"
    r"|command not found|No such file or directory|[Pp]ermission denied|exit (?:code|status) [1-9]"
    r"|^--- FAIL: \w|^FAIL(?:\t\S|$)|\bnpm (?:ERR!|error)\s)",
    re.MULTILINE,
)
_SPECIFIC = re.compile(rf"(?=[Eefp])(?:{_SPECIFIC_ERROR})")  # (the same lookahead: 3x faster)
# Every error line holds one of these (lowercased): a cheap test before the regex.
_ERROR_WORDS = (
    "error",
    "err!",
    "exception",
    "fatal:",
    "panic:",
    "fail",
    "not found",
    "no such file",
    "exit code",
    "exit status",
    "permission denied",
)
# Lines that name an error without reporting one: a traceback's banner, code
# that raises, a diff's changed line.
_NOT_AN_ERROR = re.compile(r"Traceback \(most recent call last\)|[+-](?!-- FAIL: )|\s*(?:raise|throw|except|catch)\b")


# Line breaks other than "\n" that ``str.splitlines`` also splits at.
_OTHER_BREAKS = re.compile("[\r\x0b\x0c\x1c-\x1e\x85\u2028\u2029]")
_ASCII_BREAKS = "\r\x0b\x0c\x1c\x1d\x1e"


def _error_lines(text: str, held: list[int] | None = None) -> list[str]:
    """The lines of ``text`` (stripped) that hold an ``_ERROR`` match, in order.

    One scan of the whole text finds them; each match is widened to its line
    (nothing in ``_ERROR`` reads across a line break). Text with line breaks
    other than "\\n" is split line by line, as ``str.splitlines`` splits it.
    ``held``: where a match may start in ASCII ``text`` (``_error_words``): the
    pattern is tried there alone (far fewer positions than a scan tries,
    unless they are thick on the ground).
    """
    # (In ASCII text, the six such breaks ASCII holds are found by plain scans.)
    if _OTHER_BREAKS.search(text) if held is None else any(map(text.__contains__, _ASCII_BREAKS)):
        return [line.strip() for line in text.splitlines() if _ERROR.search(line)]
    lines: list[str] = []
    end = -1
    if held is None or len(held) * 32 > len(text):
        for found in _ERROR.finditer(text):
            if found.start() > end:  # (not another match on a line already taken)
                end = _take_line(text, found.start(), found.end(), lines)
        return lines
    for at in sorted(set(held)):
        match = _ERROR.match(text, at) if at > end else None  # (the first match after a line taken starts a new one)
        if match is not None:
            end = _take_line(text, at, match.end(), lines)
    return lines


def _take_line(text: str, start: int, stop: int, lines: list[str]) -> int:
    """Add the line of ``text`` that holds ``start:stop`` to ``lines`` (stripped); where it ends."""
    end = text.find("\n", stop)
    end = len(text) if end < 0 else end
    lines.append(text[text.rfind("\n", 0, start) + 1 : end].strip())
    return end


def _error_words(text: str) -> list[int] | None:
    """Where an ``_ERROR`` match may start in ``text``; ``None`` for text not ASCII.

    Where each of ``_ERROR_WORDS`` stands (lower-cased), every time, or what
    leads to it in a match (``_LEADS``): every match holds one of the words, at
    its start but for those. (In ASCII text the lower-cased form keeps every
    position: it is the ``caseless`` one ``holds_any`` reads.)
    """
    if not text.isascii():
        return None
    low = text.lower()
    held: list[int] = []
    for word in _ERROR_WORDS:
        at = low.find(word)
        lead = _LEADS.get(word, "") if at >= 0 else ""
        while at >= 0:
            held.append(at)
            if lead and at >= len(lead) and low.startswith(lead, at - len(lead)):
                held.append(at - len(lead))
            at = low.find(word, at + 1)
    return held


_LEADS = {"error": "npm ", "err!": "npm ", "fail": "--- ", "not found": "command "}
"""The words of ``_ERROR_WORDS`` a match may start before, and what comes first ("npm ERR!", "--- FAIL")."""


def error_lines(text: str) -> list[str]:
    """The lines of ``text`` (stripped) that report an error, in order.

    Example:
        >>> error_lines("Traceback (most recent call last):\\n    raise ValueError(x)\\nValueError: bad offset 14")
        ['ValueError: bad offset 14']
    """
    held = _error_words(text)
    if not (holds_any(text, _ERROR_WORDS) if held is None else held):
        return []  # the common case, found by plain substring scans
    return [line for line in _error_lines(text, held) if line and not _NOT_AN_ERROR.match(line)]


def error_line(text: str) -> str:
    """The last line of ``text`` that reports an error ("" if none does).

    Example:
        >>> error_line("collected 3 items\\nE   ValueError: bad offset 14\\n1 failed")
        'E ValueError: bad offset 14'
    """
    lines = error_lines(text)
    # A summary line ("1 failed, 2 passed") says less than the exception above it.
    specific = [line for line in lines if _SPECIFIC.search(line)]
    line = (specific or lines or [""])[-1]
    found = _ERROR.search(line) if len(line) > MAX_FACT_CHARS else None
    if found is not None and found.start() > _ERROR_LEAD:
        # A long line (one-line JSON) is shown from just before what reports the error, not from its start.
        line = "..." + line[found.start() - _ERROR_LEAD :]
    return clip(line)


_ERROR_LEAD = 60
"""How much of a long line is shown before what reports its error."""


def error_in(message: Message, *, whole: bool) -> str:
    """``result_error`` of a tool result's text, kept on the message (read again at every compaction)."""
    known = message.known_reading
    if isinstance(known, tuple) and known[0] is whole:
        return known[1]  # type: ignore[no-any-return]
    line = result_error(message.text.strip(), whole=whole)
    object.__setattr__(message, "known_reading", (whole, line))
    return line


def result_error(text: str, *, whole: bool) -> str:
    """The error a tool's result reports, "" if none: a command's output (``whole``) anywhere, others at an edge.

    Another tool's result (a file's content) may mention an error without
    being one: there only a first or last line that reports one counts.
    """
    if whole:
        return error_line(text)
    lines = text.splitlines()
    return error_line("\n".join(lines[:1] + lines[-1:]) if lines else "")


def failure_in(message: Message, *, whole: bool) -> str:
    """The failure a tool's result reports, "" if none: ``error_in``, or its last line when the tool marked it an error.

    One rule for checked facts (its unresolved errors) and the offline
    summary (its Blocked section): they never disagree on whether a call failed.
    """
    line = error_in(message, whole=whole)
    if message.is_error and not line:
        text = message.text.strip()
        line = clip(text.splitlines()[-1]) if text else "failed"
    return line


def agent_names(text: str) -> tuple[str, ...]:
    """The code names an assistant message's own text uses, each once, in order (kept as ``user_says``)."""
    return _once(_NAMES, _names, text)


def _names(text: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(names_in_code(text)))


def _once(kept: Bounded[_R], read: Callable[[str], _R], text: str) -> _R:
    """``read(text)``, kept in ``kept`` under the text's digest: a text read before is not read again."""
    key = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest()
    found = kept.get(key)
    if found is None:
        found = read(text)
        kept.put(key, found)
    return found


_SAID: Bounded[UserSays] = Bounded(READINGS_KEPT)
_NAMES: Bounded[tuple[str, ...]] = Bounded(READINGS_KEPT)


def kept() -> int:
    """How many readings are kept now (both kinds)."""
    return len(_SAID) + len(_NAMES)


def forget() -> None:
    """Drop every kept reading (benchmarks use it to time reading messages never read before)."""
    _SAID.clear()
    _NAMES.clear()
