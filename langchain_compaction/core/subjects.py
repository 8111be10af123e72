"""What a revocation is about and what a rule names: the words compared to tell whether one takes back the other.

``core.extract`` reads a revocation's subject and a rule's words with
``subject_words``; a rule is taken back when it ``named`` every word of the subject.
"""

from __future__ import annotations

import re

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
    return frozenset(w[:-1] if w.endswith("s") and len(w) > 3 else w for w in words if w and w not in _STOP_WORDS)


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
