"""What a revocation is about and what a rule names: the words compared to tell whether one takes back the other.

``core.extract`` reads a revocation's subject and a rule's words with
``subject_words``; a rule is taken back when it ``named`` every word of the subject.
``Naming`` finds the rules that may, without comparing every rule with every revocation.
``task_terms`` reads the words a user's message may name the task by.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Iterable
from dataclasses import dataclass, field
from itertools import filterfalse
from typing import Generic, TypeVar

_K = TypeVar("_K", bound=Hashable)

_STOP_WORDS = frozenset(
    {
        *("a", "an", "the", "and", "or", "of", "to", "in", "on", "at", "for", "with", "about", "what", "i"),
        # (Not "me": whom a permission is about is its subject, "you can email me" is not about customers.)
        *("you", "my", "it", "is", "are", "be", "was", "were", "this", "that", "these", "those", "now"),
        *("again", "after", "all", "fine", "ok", "okay", "allowed", "said", "told", "use", "using", "just"),
        *("please", "any", "some"),
        # Adverbs that qualify a permission without naming what it is about.
        *("directly", "simply", "also", "still", "really", "even", "here", "there", "anymore", "more", "go", "ahead"),
    }
)


def subject_words(text: str) -> frozenset[str]:
    """The content words of ``text``, lower-cased and singular, that say what it is about."""
    # (A word's closing dot or slash is the sentence's or the path's, not the word's: "tabs." is "tab".)
    words = [w.rstrip("./-") for w in re.findall(r"[a-z0-9][a-z0-9_./-]*", text.lower())]
    return frozenset(singular(w) for w in words if w and w not in _STOP_WORDS)


def singular(word: str) -> str:
    """``word`` (lower-cased) without a plural's closing "s": "tabs" is "tab", "has" stays."""
    return word[:-1] if word.endswith("s") and len(word) > 3 else word


# What turns a word into another form of itself ("run" -> "running", "test" -> "tested").
_INFLECTIONS = frozenset({"s", "es", "d", "ed", "ing", "er", "ers", "ning", "ting", "ping", "ming"})


def named(word: str, words: frozenset[str]) -> bool:
    """Whether ``word`` is one of ``words``, in this or another form ("run", "running"; "README", "README.md")."""
    if word in words:
        return True
    # The same word in another form ("tab" and "table" are two words), or the
    # same file named with and without its folder or extension.
    return any(_inflected(word, w) or _inflected(w, word) or _same_file(word, w) for w in words)


def _inflected(stem: str, word: str) -> bool:
    if len(stem) < 3 or not word.startswith(stem[:-1]):
        return False
    # "write" -> "writing": a final e goes before the ending.
    return (
        word[len(stem) :] in _INFLECTIONS
        if word.startswith(stem)
        else stem[-1] == "e" and word[len(stem) - 1 :] in {"ing", "ed", "er", "ers"}
    )


def _same_file(a: str, b: str) -> bool:
    """Whether two words name one file: folders left out unless both give them, an extension unless both do."""
    if not ({"/", "."} & (set(a) | set(b))):
        return False
    if not ("/" in a and "/" in b):
        a, b = a.rsplit("/", 1)[-1], b.rsplit("/", 1)[-1]
    if "." in a.rsplit("/", 1)[-1] and "." in b.rsplit("/", 1)[-1]:
        return a == b  # index.md and index.ts are two files
    return a.split(".", 1)[0] == b.split(".", 1)[0] != ""


def index_keys(word: str) -> tuple[str, ...]:
    """Keys to find ``word`` by: two words ``named`` reads as one share one of them.

    Another form of a word starts with its first two letters (``_inflected``);
    one file has one name before its extension, with its folders when both
    words give them (``_same_file``).

    Example:
        >>> index_keys("tabs"), index_keys("src/app.py")
        (('wta', 'ftabs'), ('wsr', 'fapp', 'psrc/app'))
    """
    base = word.rsplit("/", 1)[-1]
    keys = ("w" + word[:2], "f" + (base.split(".", 1)[0] or base))
    return (*keys, "p" + (word.split(".", 1)[0] or word)) if "/" in word else keys


@dataclass
class Naming(Generic[_K]):
    """Items (rules) by the words they name: those that may name every word of a subject, found from its rarest word.

    Example:
        >>> rules = Naming[str]()
        >>> rules.add("no-tabs", {"never", "tab", "makefile"}); rules.add("no-push", {"never", "push", "main"})
        >>> sorted(rules.naming(frozenset({"tabs"}))), sorted(rules.naming(frozenset({"tab", "python"})))
        (['no-tabs'], [])
    """

    by_key: dict[str, set[_K]] = field(default_factory=dict)

    def add(self, item: _K, words: Iterable[str]) -> None:
        """File ``item`` under the words it names."""
        for word in words:
            for key in index_keys(word):
                self.by_key.setdefault(key, set()).add(item)

    def naming(self, subject: frozenset[str]) -> set[_K]:
        """The items that may name every word of ``subject``: all that do (each is to be checked with ``named``)."""
        held = [[self.by_key.get(key, set()) for key in index_keys(word)] for word in subject]
        if not held:
            return set()
        held.sort(key=lambda sets: sum(map(len, sets)))
        found = set().union(*held[0])
        return {item for item in found if all(any(item in s for s in sets) for sets in held[1:])}

    def copy(self) -> Naming[_K]:
        """An independent copy."""
        return Naming({key: set(items) for key, items in self.by_key.items()})


_COMMON_WORDS = """
    about above after again against also always another anything around because been before being below
    between both cannot could does doing done down during each else even every first from further have
    having here however into itself just know like make many more most much must need never next only
    other ours over please really same should show since some something still such sure take than thank
    thanks that their them then there these they thing things think this those though through under
    until upon very want well were what when where which while will with within without would your yours
    fine good great okay also able look looks going goes give given used uses using work works working
    help file files code change changes line lines test tests time let's can't don't it's i'm
"""
_COMMON = frozenset(_COMMON_WORDS.split())


def task_terms(text: str) -> set[str]:
    """The words of ``text`` that may name what the task is about (not common words), lower-cased.

    Example:
        >>> sorted(task_terms("Please add a legend to the time-line of the chart"))
        ['chart', 'legend', 'time-line']
    """
    low = text.lower()
    if not low.isascii():
        return {w for w in _TERM.findall(low) if (len(w) >= 5 or "-" in w) and w not in _COMMON}
    # The runs of letters, digits and hyphens, split in C (each once): a run of
    # letters is one word, and only the few others are read by the pattern.
    runs = set(low.encode("ascii").translate(_TERM_CHARACTERS).decode("ascii").split())
    terms = {run for run in runs if len(run) >= 5 and run.isalpha()}
    for run in filterfalse(str.isalpha, runs):
        if len(run) >= 5 or "-" in run:  # (a word is part of its run: a shorter one holds none)
            terms.update(w for w in _TERM.findall(run) if len(w) >= 5 or "-" in w)
    return terms - _COMMON


_TERM = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*")
_TERM_CHARACTERS = bytes(code if chr(code) in "abcdefghijklmnopqrstuvwxyz0123456789-" else 32 for code in range(256))
"""A ``bytes.translate`` table: what ``_TERM`` may read kept, any other character a space."""
