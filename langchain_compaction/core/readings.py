"""What one message says, as checked facts read it: a user's message (``user_says``) and a tool's result.

The rules are ``core.extract``'s; this module applies them to one message and
keeps what a user's message says and an assistant's code names, since the same
text is read again and again: the kept messages at every compaction, then as
the next one's region; a preparation, then the threshold compaction; a retried
turn. A reading is a pure function of the text, so it is kept under a 128-bit
digest of the text (``READINGS_KEPT`` of each kind, the most recently used):
the text itself is not held once its conversation lets it go.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from langchain_compaction.core.bounded import Bounded
from langchain_compaction.core.extract import (
    clip,
    constraints,
    error_line,
    feedback,
    identifiers,
    names_in_code,
    own_words,
    revoked_subjects,
    task_terms,
)

CODE_NAMES_PER_MESSAGE = 12
"""How many code names (``camelCase``, ``snake_case``) one user message may give (the first); values are not capped."""
TASK_CHARS = 200
"""What is kept of the request that states the task."""
_R = TypeVar("_R")

READINGS_KEPT = 4096
"""How many readings of each kind are kept (the most recently used): user messages', assistants' code names."""


@dataclass(frozen=True, slots=True)
class UserSays:
    """What one user message says, as checked facts read it.

    Attributes:
        revoked: The subjects of the rules it takes back.
        constraints: Its rules, preferences and corrections.
        identifiers: Its ids, amounts, paths and URLs, all of them (twenty
            booking codes are twenty facts), and its first
            ``CODE_NAMES_PER_MESSAGE`` code names (dozens are a paste, a
            prompt or a listing: the summary's to carry).
        terms: Its words that may name what the task is about.
        request: What it asks for, clipped ("" for a harness's feedback or a slash command).
        task: The request again, if it states a task (``TASK_CHARS``), else "".
    """

    revoked: tuple[frozenset[str], ...]
    constraints: tuple[str, ...]
    identifiers: tuple[str, ...]
    terms: tuple[str, ...]
    request: str
    task: str


def user_says(text: str) -> UserSays:
    """Read a user message's text: see ``UserSays`` (kept: a text read before is not read again)."""
    return _once(_SAID, _read, text)


def _read(text: str) -> UserSays:
    words = own_words(text)
    request = clip(words)
    if not request or feedback(words) or request.startswith("/"):
        request = ""  # a harness's feedback on a call, or a slash command, is no request (and never the task)
    # A task is stated in a sentence, not a greeting or an acknowledgement.
    task = clip(request, TASK_CHARS) if len(request.split()) >= 5 and not feedback(request) else ""
    return UserSays(
        revoked=tuple(revoked_subjects(text)),
        constraints=tuple(constraints(text)),
        identifiers=tuple(identifiers(text, max_code_names=CODE_NAMES_PER_MESSAGE)),
        terms=tuple(sorted(task_terms(words))),
        request=request,
        task=task,
    )


def result_error(text: str, *, whole: bool) -> str:
    """The error a tool's result reports, "" if none: a command's output (``whole``) anywhere, others at an edge.

    Another tool's result (a file's content) may mention an error without
    being one: there only a first or last line that reports one counts.
    """
    if whole:
        return error_line(text)
    lines = text.splitlines()
    return error_line("\n".join(lines[:1] + lines[-1:]) if lines else "")


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
