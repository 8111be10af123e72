"""What a message's text says, read without a model: the rules checked facts are found by.

``constraints`` (the user's rules, preferences and corrections, and the ways they
are taken back), what the user says in their own voice (``core.voice``); ``core.identifiers``
finds ids, codes, amounts, dates, versions, paths, URLs and code names; the line of a
tool's output that reports an error is ``core.readings.error_line``, what a tool
call was about ``core.calls``'. Every rule is a linear scan or regex:
the real transcripts in ``../shared/data/transcripts`` and the synthetic
sessions of ``bench/`` chose them. ``core.facts`` turns what they find into
facts; the extractive summarizer copies identifiers by the same rule.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from functools import cache

from langchain_compaction.core.lines import caseless, clip, holds_any
from langchain_compaction.core.subjects import named, subject_words
from langchain_compaction.core.voice import own_words, sentences

# A user's rule or preference, or a correction of the agent (matched lower-cased, ``_lays_down``).
_CONSTRAINT = re.compile(
    r"\b(?:never(?![^\S\n]+mind\b)|always|don['\u2019]?t|do not|must|mustn['\u2019]?t|only|avoid|make sure|"
    r"should(?:n['\u2019]?t| not)|no longer|"
    r"instead of|keep|prefer|not allowed|forbidden|from now on|going forward|under no circumstances|"
    r"please (?:answer|reply|respond|write|use|call|name)|"
    # "never" and "always" in the languages users most often write to agents in; only the
    # unambiguous words (a bare "no", "ne", "не" or "لا" is every other sentence).
    r"nunca|siempre|jamás|jamais|toujours|niemals|immer|никогда|всегда|нельзя|أبدا|دائما)\b"
    # (Chinese, Japanese and Korean are written without spaces: no word boundary to anchor on.)
    r"|不要|永远|总是|必须|禁止|别再|絶対|しないで|必ず|절대|항상"
)
_CONSTRAINT_WORDS = (
    *("never", "always", "don", "do not", "must", "only", "avoid", "make sure", "should", "no longer"),
    *("instead of", "keep", "prefer", "not allowed", "forbidden", "from now on", "going forward", "please"),
    "under no circumstances",
    *("nunca", "siempre", "jamás", "jamais", "toujours", "niemals", "immer", "никогда", "всегда", "нельзя"),
    *("أبدا", "دائما", "不要", "永远", "总是", "必须", "禁止", "别再", "絶対", "しないで", "必ず", "절대", "항상"),
)
_ASCII_RULE_WORDS = tuple(word for word in _CONSTRAINT_WORDS if word.isascii())
# Where a sentence turns to a new point: what a revocation's subject stops at.
# (A run of spaces is entered at its start only: tried from each of its
# spaces, it was rescanned from each, quadratic in a padded line.)
_CONTRAST = re.compile(r",?(?<!\s)\s+(?:but|however|though|yet)\s+|;\s*", re.IGNORECASE)
# Where a sentence may add a rule to what it allows ("It's okay to refactor, just don't touch
# the API", "... as long as you never add a GPL one"): a condition or an aside, which only
# narrows a permission (it does not end its subject: "you can push - to your branch, that is").
_CLAUSE = re.compile(
    rf"{_CONTRAST.pattern}|,?(?<!\s)\s+(?:(?:as|so) long as|provided(?: that)?)\s+|,\s+just\s+"
    r"|(?<!\s)\s+[-\u2013\u2014]+\s+",
    re.IGNORECASE,
)
# A guess, not a rule: "someone must have pushed to main", "that must've worked" (a rule
# says whose duty it is: "you must have", "each commit must have").
_GUESS = re.compile(
    r"\b(?:someone|somebody|something|that|it|this|they|he|she|there|which|who)\s+must(?:\s+have|['\u2019]ve)\b"
)  # (lower-cased text: ``_lays_down``)


def _lays_down(text: str, held: Sequence[str] = _CONSTRAINT_WORDS) -> bool:
    """Whether ``text`` holds a rule's word (``_CONSTRAINT``), a guess ("it must have") apart.

    ``held``: the words of ``_CONSTRAINT_WORDS`` that lower-cased ``text`` may
    hold (at least all it holds; all of them when not known).
    """
    low = text.lower()
    if "must" in low:
        return _CONSTRAINT.search(_GUESS.sub(" ", low)) is not None
    # Every match starts where one of the words does: the pattern is tried
    # there alone (a search tried its forty words at every position).
    for word in held:
        at = low.find(word)
        while at >= 0:
            if _CONSTRAINT.match(low, at):
                return True
            at = low.find(word, at + 1)
    return False


_CORRECTION = re.compile(r"^(?:no\b[,.!]?|actually\b|wait\b|sorry\b|i meant\b|correction\b|that'?s wrong\b)", re.I)
# Markdown emphasis around words: **bold**, __bold__, *it*, `code` markers at the edges.
_EMPHASIS = re.compile(r"(\*\*|__)(.+?)\1")
# A revocation: the user takes a rule back ("forget what I said about tabs",
# "tabs are fine now", "you may use tabs", "never mind the tabs rule").
# (Not after a "don't" or a "never": "don't forget the voucher rule" is a reminder.)
_NOT = r"(?<!don't )(?<!don\u2019t )(?<!dont )(?<!do not )(?<!never )"
# Each alternative of ``_REVOKE`` with the words it cannot match without (lower-cased, one of them):
# a text is scanned only with the alternatives whose words it holds (``_revocations``), since the
# scan tries every alternative at every position (the "no longer applies" one alone took 40%).
_VERBS = ("forget", "ignore", "disregard", "scratch", "drop")
_REVOKE_PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        rf"{_NOT}\b(?:forget|ignore|disregard|scratch|drop)\s+(?:what (?:i (?:said|told you)|the \w+ (?:said|says))"
        r"|(?:my|the|our) (?:earlier |previous |last )?(?:rule|instruction|request|constraint|policy|guideline"
        r"|preference)s?)"
        r"\s+(?:about|on|regarding|for)\s+(?P<a>[^.;!?\n]+)",
        _VERBS,
    ),
    # "forget the voucher rule", "ignore that policy about refunds" (a subject of at most 80 characters).
    (
        rf"{_NOT}\b(?:forget|ignore|disregard|scratch|drop)\s+(?:the|my|our|that)\s+(?P<e>[^.;!?,\n]{{1,80}}?)\s+"
        r"(?:rule|policy|instruction|requirement|guideline|preference)s?\b",
        _VERBS,
    ),
    (
        r"\b(?P<f>[\w'./-][\w'./ -]{0,38}?[\w'./-])\s+(?:rule|policy|requirement|preference)s?"
        r"\s+no longer appl(?:y|ies)\b",
        ("no longer appl",),
    ),
    # Permissions: "it's okay to ...", "feel free to ...", "you're allowed to ...", "you no longer need to ...".
    (
        r"\b(?:it['\u2019]?s|it is) (?:ok|okay|fine|alright|allowed) (?:now |again )?to (?P<g>[^.;!?\n]+)",
        ("ok", "fine", "alright", "allowed"),
    ),
    (r"\bfeel free to (?P<h>[^.;!?\n]+)", ("feel free to",)),
    (r"\byou(?:['\u2019]re| are) (?:now |again )?allowed to (?P<i>[^.;!?\n]+)", ("allowed to",)),
    (
        r"\byou (?:no longer (?:need|have) to|don['\u2019]?t (?:need|have) to (?=[^.;!?\n]{0,120}\bany ?more\b))"
        r"(?P<j>[^.;!?\n]+)",
        ("need to", "have to"),
    ),
    # (A subject of at most 80 characters: unbounded, each "never mind" read on to the sentence's end.)
    (
        r"\bnever ?mind\s+(?:about\s+)?(?:the\s+|my\s+)?(?P<b>[^.;!?,\n]{1,80}?)\s+(?:rule|thing|instruction|part)\b",
        ("mind",),
    ),
    # (Subjects start and end with a non-space: a run of spaces around one is
    # read one way, not split every way between the subject and the spaces.)
    # (After a colon too: "I changed my mind: new dependencies are fine"; a leading "actually" is no subject.)
    (
        r"(?:^|[.;:!?,]\s*)(?:(?:actually|well|so|also|oh|and)\s+)?"
        r"(?P<c>[\w'./-][\w'./ -]{0,38}?[\w'./-])\s+(?:is|are)\s+(?:fine|ok|okay|allowed|acceptable)"
        r"(?:\s+(?:now|again|after all|with me|by me))?"
        # (Where it is fine is part of the subject: "tabs are fine in Python files" is not about Makefiles.)
        r"(?:\s+(?P<p>(?:in|inside|within|under|on)\s+(?!(?:general|principle|me|us)\b)[^.;!?,\n]{1,60}))?\b",
        ("fine", "ok", "allowed", "acceptable"),
    ),
    # ("You can forget the X rule" is the forgetting above, not a permission to forget.)
    # ("You may never ...", "You can only ..." lay a rule down.)
    # "Don't worry about pandas". (Not "stop using tabs" or "no need for tabs": after "never use tabs" they
    # say it again, and a revocation takes back a rule whichever way it went.)
    (r"\bdon['\u2019]?t worry about (?P<m>[^.;!?\n]+)", ("worry about",)),
    (
        r"\byou (?:may|can) (?:now |again |go ahead and )?"
        r"(?!(?:forget|ignore|disregard|scratch|drop|never|not|only|no longer|no)\b)(?P<d>[^.;!?\n]+)",
        ("you may", "you can"),
    ),
)
_REVOKE = re.compile("|".join(part for part, _ in _REVOKE_PARTS), re.IGNORECASE)


@cache
def _revoke_with(parts: tuple[int, ...]) -> re.Pattern[str]:
    """``_REVOKE`` of those alternatives only (in order: a text's matches are the same, leftmost first)."""
    return re.compile("|".join(_REVOKE_PARTS[i][0] for i in parts), re.IGNORECASE)


def _revocations(text: str) -> re.Pattern[str] | None:
    """``_REVOKE`` without the alternatives ``text`` lacks the words of (``None``: it holds none)."""
    low = caseless(text)
    parts = tuple(i for i, (_, words) in enumerate(_REVOKE_PARTS) if any(word in low for word in words))
    return _revoke_with(parts) if parts else None


# Saying the opposite of a rule: "stop adding type hints", "no need for type hints anymore". What it is
# about follows the verb ("type hints": adding and writing them is one thing to stop), and it takes back
# only a rule that calls for that (``Reversal``): after "never use tabs", "stop using tabs" says the rule
# again. "No need to V X" keeps its verb ("no need to explain the tests" is not about running them).
# (A subject ends at "and": "stop everything and run the tests" is no reversal of running them.)
_UP_TO_AND = r"(?:(?!\band\b)[^.;!?,\n]){1,80}"  # (a reversal's subject)
_REVERSE = re.compile(
    rf"{_NOT}\b(?:stop|quit)\s+(?!(?:every|any|no|some)thing\b)\w+ing\s+(?P<r>{_UP_TO_AND})"
    rf"|\bno need for\s+(?P<s>{_UP_TO_AND})|\bno need to\s+(?P<t>{_UP_TO_AND})",
    re.IGNORECASE,
)
_REVERSE_WORDS = ("stop", "quit", "no need")
"""One of them is in every reversal (lower-cased): a text without any is not scanned for one."""
# A negation before a reversal, in its sentence ("should not stop", "don't ever stop", "never, ever stop").
_NEGATED = re.compile(r"(?:\b(?:not|never|dont)|n['\u2019]t)\b[^.;:!?\n]*$", re.IGNORECASE)
# What a rule that forbids something says (a reversal leaves it: it may say the same, "always use spaces
# instead of tabs" and "stop using tabs"). When in doubt the rule stays.
_FORBIDS = re.compile(
    r"\b(?:never|don['\u2019]?t|do not|avoid|no longer|not allowed|forbidden|mustn['\u2019]?t|must not"
    r"|shouldn['\u2019]?t|should not|under no circumstances|stop|instead of|rather than|out of|without|not|no)\b",
    re.IGNORECASE,
)
# A sentence that opens with praise or thanks, up to where it goes on: what follows is a report ("Thanks, the
# build is OK now"); "OK, tabs are fine" concedes.
_PRAISE = re.compile(
    r"(?:^|[.!?]\s+)\W*(?:great|good|nice|perfect|cool|awesome|excellent|thanks|thank you|yay|phew|looks good"
    r"|lgtm|well done)\W*$",
    re.IGNORECASE,
)
# What makes a permission none, said before it in its sentence: a condition ("even if you think it's fine
# to ...", "if the CI is green, you can ..."), a negation ("doesn't mean it's okay to", "I never said
# tabs are fine") or someone else's saying it ("the style guide says you may ..."; "I say" is the user's).
_NOT_GRANTED = re.compile(
    r"\b(?:even if|just because|only because|unless|whether)\b|\bif\b(?![-_])(?! you (?:want|like|wish|prefer)\b)"
    r"|(?:\b(?:not|never|dont|doesnt|didnt|stop)|n['\u2019]t)\s+(?:\w+\s+){0,4}?"
    r"(?:mean|meant|say|said|tell|told|imply|assume|assuming|think|thinking|take)\b"
    r"|(?<!\bi )\b(?:says?|said|wr[io]tes?|claim(?:s|ed)?|think|thinks|thought|believes?|suggest(?:s|ed)?)\b",
    re.IGNORECASE,
)
# A permission whose object is a pronoun approves one thing at hand, not a kind of thing.
_POINTERS = "it|this|that|them|these|those"  # (a thing at hand, said before: here and in ``_PRONOUN``)
_ONE_OFF = re.compile(rf"\b(?:{_POINTERS})(?:\s+(?:now|too|again|today|then|anyway))?\W*$", re.I)
# A condition after a permission, in its sentence: "voicemails are fine if it's urgent".
_CONDITION = re.compile(r"\b(?:if|as long as|so long as|provided|providing|unless|when|whenever|once)\b", re.I)
_LEAD_START = re.compile(r"[.!?]\s+|\n")
_END = re.compile(r"[.!?](?=\s|$)|\n")


def _permissions(text: str, pattern: re.Pattern[str] | None = None) -> Iterator[re.Match[str]]:
    """The revocations ``pattern`` finds in ``text`` that grant something: not asked, negated, conditional or quoted.

    ``pattern``: ``_REVOKE`` (the default, without the alternatives ``text``
    lacks the words of) or ``_REVERSE``.

    Example:
        >>> [bool(list(_permissions(t))) for t in ("Tabs are fine now.", "I never said tabs are fine.")]
        [True, False]
    """
    if pattern is None:
        pattern = _revocations(text)
    elif pattern is _REVERSE and not holds_any(text, _REVERSE_WORDS):
        pattern = None
    for match in pattern.finditer(text) if pattern is not None else ():
        # What leads to it in its sentence, past a turn ("the guide says X, but you can ..." grants);
        # an "is fine"'s subject is read with it ("I never said tabs").
        anchor = match.end("c") if match.groupdict().get("c") else match.start()
        lead = _CONTRAST.split(_LEAD_START.split(text[max(anchor - 200, 0) : anchor])[-1])[-1]
        end = _END.search(text, match.end(), match.end() + 400)
        quoted = lead.count('"') % 2 or lead.count("\u201c") > lead.count("\u201d")
        if not (quoted or (end is not None and end.group() == "?") or _NOT_GRANTED.search(lead)):
            yield match


def _permits(text: str) -> bool:
    """Whether ``text`` grants something (``_permissions``): takes a rule back."""
    return next(_permissions(text), None) is not None


# Every revocation holds one of these (lowercased): a cheap test before the regex.
_REVOKE_WORDS = (
    *("forget", "ignore", "disregard", "scratch", "drop", "mind", " fine", " ok", "allowed", "acceptable"),
    *("you may", "you can", "free to", "no longer", "anymore", "any more", "worry", "stop", "quit", "no need"),
)


def _may_revoke(text: str) -> bool:
    """Whether ``text`` holds a revocation word (``_REVOKE`` reads only those that do)."""
    return holds_any(text, _REVOKE_WORDS)


def revoked_subjects(text: str) -> list[frozenset[str]]:
    """What the user takes back in ``text``: for each revocation, the words of its subject (stemmed).

    Example:
        >>> revoked_subjects("Forget what I said about tabs, tabs are fine.")
        [frozenset({'tab'})]
        >>> revoked_subjects("forget the last file, use b.py")
        []
    """
    if not _may_revoke(text):
        return []  # the common case, found by plain substring scans
    found: list[frozenset[str]] = []
    said = own_words(text)
    for match in (*_permissions(said), *_permissions(said, _REVERSE)):
        if match.re is _REVERSE and _NEGATED.search(said, max(match.start() - 30, 0), match.start()):
            continue  # "you should not stop adding type hints", "never, ever stop ..." say the rule again
        if (match.groupdict().get("c") or match.re is _REVERSE) and _PRAISE.search(said, 0, match.start()):
            continue  # "Great, the tests are fine now" reports on the work; "tabs are fine now" permits them
        # The subject ends where a new rule starts ("tabs are fine, but never in Makefiles",
        # "forget what I said about the window seat, give me an aisle").
        # (Only "is fine" has two parts: what is fine and where, "p".)
        subject = _CONTRAST.split(" ".join(group for group in match.groups() if group), 1)[0].split(",", 1)[0]
        if _ONE_OFF.search(subject) or _CONDITION.search(_END.split(said[match.end() : match.end() + 300], 1)[0]):
            continue  # "you can merge it" (this once), "layovers are fine as long as ..." (on a condition)
        words = subject_words(subject)
        if words:
            found.append(Reversal(words) if match.re is _REVERSE else words)
    return found


class Reversal(frozenset[str]):
    """The subject of a revocation that says the opposite ("stop adding type hints").

    It takes back only a rule that calls for it ("Always write type hints"),
    not one that forbids it ("Never add type hints"): that one it says again.
    """

    __slots__ = ()


def revokes(subjects: Iterable[frozenset[str]], rule: str) -> bool:
    """Whether a revocation of ``subjects`` (``revoked_subjects``) takes back ``rule``: it names all of one subject.

    Every word of a subject must be in the rule, in this or another form
    ("running" and "run", "README" and "README.md"): a permission about one
    thing ("you can run the tests", "the frontend config") does not take back
    a rule that shares words with it ("never run the migrations", "the
    backend config"). When in doubt the rule stays: a rule kept too long is
    safer than one dropped.

    Example:
        >>> revokes(revoked_subjects("Tabs are fine now."), "Never use tabs in src/app.py.")
        True
        >>> revokes(revoked_subjects("You can run the tests now."), "Never run the migrations in production.")
        False
        >>> revokes(revoked_subjects("Feel free to refactor."), "It's okay to refactor, just don't touch the API.")
        False
    """
    words = rule_words(rule)
    return any(
        subject
        and all(named(word, words) for word in subject)
        and not (type(subject) is Reversal and _FORBIDS.search(rule))
        for subject in subjects
    )


def rule_words(rule: str) -> frozenset[str]:
    """The words of the part of ``rule`` that lays it down (``_ruling``): a revocation takes it back by naming them."""
    return subject_words(_ruling(rule))


def _ruling(rule: str) -> str:
    """The part of ``rule`` that lays it down: a permission it opens with ("It's okay to refactor, just ...") is not."""
    clauses = _CLAUSE.split(rule)
    return " ".join(clauses[1:]) if len(clauses) > 1 and _permits(clauses[0]) else rule


def without_revoked(text: str, subjects: Sequence[frozenset[str]]) -> str:
    """``text`` without the rules a revocation of ``subjects`` takes back; its other sentences kept.

    Example:
        >>> without_revoked("Set up the formatter. Never use tabs in app.py.", revoked_subjects("tabs are fine"))
        'Set up the formatter.'
    """
    if not subjects:
        return text
    kept = [s.strip() for s in sentences(text) if s.strip()]
    return " ".join(filter(None, (_unrevoked(s, subjects) if constraints(s) else s for s in kept)))


# Where a sentence joins a second rule to its first: "Never use tabs, and never commit to main."
_RULE_JOIN = re.compile(r",?(?<!\s)\s+and\s+(?=(?:never|always|don['\u2019]?t|do not|avoid|only)\b)|;\s*", re.I)


def _unrevoked(rule: str, subjects: Sequence[frozenset[str]]) -> str:
    """What ``rule`` still lays down once ``subjects`` are taken back: the rules it joins that do not name them."""
    if not revokes(subjects, rule):
        return rule
    clauses = _RULE_JOIN.split(rule)
    kept = [c for c in clauses if not revokes(subjects, c)]
    if any(_PRONOUN.search(c) for c in kept):
        return ""  # "never write to it from tests" leans on the clause taken back
    left = ", and ".join(kept).rstrip(",.; ")
    return f"{left}." if left and len(left) < len(rule) - 1 and rules_in(left) else ""


_PRONOUN = re.compile(rf"\b(?:{_POINTERS}|there)\b", re.I)


RULES_PER_MESSAGE = 3
"""How many of a pasted document's rules are the user's own: its first ones, and its
last one besides (what the user adds after a paste: "... and above all, never ...")."""
DOCUMENT_CHARS = 1_000
"""A message longer than this that lays down more rules than ``RULES_PER_MESSAGE`` and a
last one is a pasted document (a prompt, a policy, a task template); in a shorter one
every rule is the user's own."""


def own_rule(text: str, index: int, count: int) -> bool:
    """Whether the ``index``-th of the ``count`` rules ``constraints(text)`` found is the user's own.

    A pasted document lays down dozens, which would crowd out everything else:
    only its first and its last are (checked facts list the others last, the
    offline summary lets them go for room).
    """
    document = count > RULES_PER_MESSAGE + 1 and len(text) > DOCUMENT_CHARS
    return not document or index < RULES_PER_MESSAGE or index == count - 1


def constraints(text: str) -> list[str]:
    """The user's rules, preferences and corrections in ``text``, one sentence each.

    Example:
        >>> constraints("Fix the crash. Never edit tests/fixtures.json. Thanks!")
        ['Never edit tests/fixtures.json.']
    """
    return rules_in(own_words(text))


def rules_in(words: str) -> list[str]:
    """``constraints`` of a text's ``own_words``, already read."""
    found = []
    # Plain substring scans first: most messages hold no rule at all, and a
    # sentence of one that does is looked for only the rule words it holds.
    low = words.lower()
    # (Emphasis taken out of a sentence may join words: "do **not**", "you **may**".)
    emphasis = "**" in words or "__" in words
    # (An ASCII text holds none of the other languages' words: half the scans.)
    words_of = _ASCII_RULE_WORDS if low.isascii() else _CONSTRAINT_WORDS
    held = _CONSTRAINT_WORDS if emphasis else tuple(word for word in words_of if word in low)
    for raw in sentences(words):
        sentence = (_EMPHASIS.sub(r"\2", raw) if emphasis and ("**" in raw or "__" in raw) else raw).strip(" -*+\t")
        # (A sentence holds no word its text does not: ``held`` is all it may hold.)
        rule = (held and _lays_down(sentence, held)) or _CORRECTION.match(sentence)
        if not (8 <= len(sentence) <= 400 and rule):
            continue
        # Taking a rule back is not a rule, but what follows a "but" in the
        # same sentence may be one: "Tabs are fine now, but never in Makefiles."
        # (kept whole: the new rule is read with what it narrows).
        if not (_may_revoke(sentence) and _permits(sentence)) or any(
            _lays_down(clause) and not _permits(clause) for clause in _CLAUSE.split(sentence)[1:]
        ):
            found.append(clip(sentence))
    return found
