"""Token counts of LangChain messages, with the options' counter, cached per message.

``count_messages`` counts a whole list the way the options say: the built-in
estimate over the core form, or the user's ``token_counter`` (a counter that
can count a whole conversation at once, such as the Anthropic counter, is
asked once; any other, per message). Every count a user's counter returns is
checked by ``checked_count``.

``TokenCountCache`` makes a hot loop pay only for new messages. A graph node sees the whole history on every
turn. Within one run it sees the very same objects again, so a prefix of the previous call's objects is reused
without even a fingerprint. A checkpointer hands it freshly deserialized copies each run: a prefix of copies
equal to the previous call's messages field for field (compared in C, no digest) and of the content size
counted is reused too. Anything else is looked up by the message id (``add_messages`` gives every message one)
and checked by the message's ``fingerprint``, which catches a message replaced under the same id. The cost: an
in-place edit of a message object already seen (``message.content = ...``, which LangGraph never does:
``add_messages`` replaces a message with a new object) goes unnoticed while the same object comes back, and,
in an older message, as long as it keeps its content's size.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable, Iterable, Sequence
from contextlib import suppress
from itertools import repeat
from typing import Any, TypeVar, cast

from langchain_core.messages import AIMessage, BaseMessage, SystemMessage

from langchain_compaction._lc.convert import is_bridge_message, is_langchain_summary, to_core, to_core_list
from langchain_compaction._lc.identity import content_size, fingerprint, leading, unchanged_since
from langchain_compaction.core.bounded import Bounded
from langchain_compaction.core.context import FOREIGN_USAGE, LOOK_BACK, follows, inflated, trusted_usage
from langchain_compaction.core.effects import Call, blocking, computing, inline, twin
from langchain_compaction.core.options import CompactionOptions
from langchain_compaction.core.tokens import estimate_message
from langchain_compaction.core.types import Counts, Message, Scanned
from langchain_compaction.errors import InvalidMessagesError

_T = TypeVar("_T")

# A cache at its bound, whichever comes first, holds 15-35 MB by the messages (``bench/cache_memory.py``): an
# entry keeps the message's core form (its text, what the library read in it) and two dict slots, 7-17 bytes a
# token on realistic messages (a summary's marks and checked facts weigh most) and about 600 bytes a message of
# a word. (8 million tokens and 200,000 messages held about 120 MB per node or middleware.) A message dropped is
# counted again when its conversation comes back: 180-200 ns a token, 30-35 ms for a 200k window's 180,000.
DEFAULT_CACHE_SIZE = 50_000
"""Messages remembered per cache before the oldest quarter is dropped (about 30 MB of messages of a word)."""
_MAX_HELD_TOKENS = 2_000_000
"""The most tokens of messages a ``TokenCountCache`` holds (15-35 MB, by the messages; ten full 200k windows)."""
LAST_CALLS_REMEMBERED = 64
"""Conversations whose last counted history a ``TokenCountCache`` keeps, most recent first.

Outside the bounds above: each holds its conversation's messages and their core forms as last read, however
many tokens they are (64 conversations near a 200k window: some hundred MB at 7-17 bytes a token)."""
_Read = tuple[list[BaseMessage], Counts, Scanned, list[int]]
"""A conversation's previous read: its messages, their counts, core forms and sizes as counted (``content_size``)."""
_NOTHING: _Read = ([], Counts(), Scanned(), [])


_FINGERPRINTED_COPIES = 8
"""Of a checkpoint's copies equal to the previous read, the newest this many are checked by fingerprint too."""


# Up to this many messages are counted on the event loop itself (with the
# built-in estimate: microseconds each); more go to a worker thread.
_INLINE_NEW_MESSAGES = 64


def checked_count(value: object, index: int) -> int:
    """``value`` as a token count, or the error that says what the counter got wrong.

    Args:
        value: What a custom ``token_counter`` returned for ``messages[index]``.
        index: The message's position, for the error message.

    Returns:
        The count.

    Raises:
        InvalidMessagesError: ``value`` is not a non-negative int.
    """
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        msg = (
            f"token_counter returned {value!r} for messages[{index}]; it must return a "
            "non-negative int (count_tokens_approximately is a ready one)"
        )
        raise InvalidMessagesError(msg, index=index)
    return value


def count_messages(messages: Sequence[BaseMessage], core: Sequence[Message], options: CompactionOptions) -> list[int]:
    """The token count of each message, with the counter ``options`` names.

    Args:
        messages: The messages.
        core: Their core forms.
        options: The options in force.

    Returns:
        One count per message.

    Raises:
        InvalidMessagesError: The custom counter returned a bad count.
    """
    counter = options.token_counter
    if counter is None:
        return [estimate_message(m) for m in core]
    # A counter that can count a whole conversation at once (the Anthropic
    # counter: one request, exact sum) does; any other is asked per message.
    count_each = getattr(counter, "count_each", None)
    values = list(count_each(messages)) if callable(count_each) else [counter([m]) for m in messages]
    if len(values) != len(messages):
        msg = f"token_counter.count_each returned {len(values)} counts for {len(messages)} messages"
        raise InvalidMessagesError(msg)
    return [checked_count(value, index) for index, value in enumerate(values)]


def counts_and_core(messages: Sequence[BaseMessage], options: CompactionOptions) -> tuple[list[int], list[Message]]:
    """Core forms and counts of ``messages``, uncached."""
    core = to_core_list(messages)
    return count_messages(messages, core, options), core


class TokenCountCache:
    """Token counts per message id, recounted only when a message changes.

    Messages without an id are counted every time (nothing safe to key them
    by). The cache is bounded: past ``max_entries``, or past messages of
    ``_MAX_HELD_TOKENS`` tokens in all (a core form keeps its message's text
    and what was read in it: 7-17 bytes a token), the oldest are dropped
    until a quarter of the room is free, so a long-lived server holds 15-35
    MB per cache at most; a dropped message is simply counted again the next
    time it is seen.

    Example:
        >>> from langchain_core.messages import HumanMessage
        >>> cache = TokenCountCache(CompactionOptions())
        >>> msg = HumanMessage("a" * 400, id="m1")
        >>> cache.counts([msg]) == cache.counts([msg]) == [104]
        True
        >>> cache.misses
        1
    """

    def __init__(self, options: CompactionOptions, *, max_entries: int = DEFAULT_CACHE_SIZE) -> None:
        self._options = options
        self._max_entries = max(int(max_entries), 1)
        self._max_held = _MAX_HELD_TOKENS
        self._held = 0  # the tokens of the messages held (their core forms keep their text)
        # Per message id, its fingerprint and count, and its core form beside: a pair of a string and a
        # number is no object the garbage collector follows (a triple with the core form was, one a message).
        self._entries: dict[str, tuple[str, int]] = {}
        self._cores: dict[str, Message] = {}
        self._lock = threading.Lock()
        # Per conversation, the previous call's messages, counts and core
        # forms, as one tuple so threads swap it atomically: a server's
        # interleaved conversations each find their own history (one slot for
        # all re-read every message of each, turn after turn).
        self._last: Bounded[_Read] = Bounded(LAST_CALLS_REMEMBERED)
        self.misses = 0
        """Messages counted (cache misses) since the cache was made."""

    def __len__(self) -> int:
        return len(self._entries)

    def forget(self, ids: Iterable[str | None]) -> None:
        """Drop the messages ``ids`` names: a compaction took them out (counted again if they come back).

        Their core forms, thousands of objects, are no longer held for a
        lookup by id. (A conversation's previous read keeps its own until its
        next read: the same messages compacted again are not read again.)
        """
        with self._lock:
            for key in filter(None, ids):
                self._drop(key)

    def forget_taken(self, before: Sequence[BaseMessage], after: Sequence[BaseMessage]) -> None:
        """Drop the messages of ``before`` that ``after`` no longer holds: a compaction took them out of the state.

        Called once a compaction is committed, whether made on the spot or
        prepared in the background and applied (``Turn._compaction``): a
        preparation's messages are still in the state until then, and counted
        on every turn.
        """
        kept = {m.id for m in after}
        self.forget(m.id for m in before if m.id not in kept)

    def _drop(self, key: str) -> None:
        """Drop what is kept of message ``key`` (under the lock)."""
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._held -= entry[1]
            self._cores.pop(key, None)

    def _previous(self, key: Any) -> _Read:
        return self._last.get(key) or _NOTHING

    def quick_check(self, messages: Sequence[BaseMessage], mark: int | None, key: Any = None) -> Call[bool | None]:
        """The effect that asks :func:`due_by_usage` on a cold cache.

        A warm cache counts only what is new, so there the answer is ``None``
        (count as usual) and nothing is converted twice.

        Args:
            messages: The conversation.
            mark: The first size anything happens at (the preparation mark,
                else the threshold; ``None``: never).
            key: The conversation (``Conversation.key``; ``None``: one shared slot).

        Returns:
            A call answering over/under the mark, or ``None`` when only a
            full count can say.
        """
        last = self._previous(key)[0]
        warm = bool(last) and len(messages) >= len(last) and messages[len(last) - 1] is last[-1]
        return counting(self._options, _undecided if warm else due_by_usage, messages, self._options, mark)

    def counts(self, messages: Sequence[BaseMessage]) -> list[int]:
        """The token count of each message, from the cache where it is current.

        Args:
            messages: The conversation.

        Returns:
            One count per message, in order.
        """
        return list(self.counts_and_core(messages)[0])

    @staticmethod
    def _reused(messages: Sequence[BaseMessage], last: Sequence[BaseMessage]) -> int:
        """How many leading messages are the very objects of ``last`` (the previous call's)."""
        known = len(last)
        # The common case: the same history plus new messages. A list
        # comparison passes identical items in C without calling their
        # ``__eq__`` (a tenth of a pairwise ``is``); the ends are checked
        # first so that a history read anew (a checkpoint's copies) is not
        # compared field by field. An item that is only equal counts the same.
        if 0 < known <= len(messages) and messages[0] is last[0] and messages[known - 1] is last[-1]:
            with suppress(Exception):  # an odd payload's own ``__eq__``: the pairwise check decides
                if messages[:known] == last:
                    return known
        return leading(map(operator.is_, messages, last))

    def _renewed(
        self, messages: Sequence[BaseMessage], last: Sequence[BaseMessage], sizes: Sequence[int], start: int
    ) -> int:
        """How many leading messages are ``last``'s read anew (a checkpoint's copies), unchanged.

        Copies are taken as ``unchanged_since`` takes them (in C, no digest: a
        turn on a checkpointed graph, new objects every run, costs little more
        than what it adds; ``sizes`` may run on, a later read grows it). The
        newest few are also checked by ``fingerprint``, which sees into everything.
        """
        count = unchanged_since(messages, last, sizes, start)
        entries = self._entries
        for index in range(max(start, count - _FINGERPRINTED_COPIES), count):
            message = messages[index]
            hit = entries.get(message.id) if message.id is not None else None
            if hit is None or hit[0] != fingerprint(message):
                return index
        return count

    def counts_and_core(self, messages: Sequence[BaseMessage], key: Any = None) -> tuple[Counts, Scanned]:
        """Token counts and core forms of ``messages``, cached together.

        Args:
            messages: The conversation.
            key: The conversation (``Conversation.key``; ``None``: one shared slot).

        Returns:
            One count and one core message per message, in order.
        """
        # One read of the previous call: another thread may swap it meanwhile.
        previous = self._previous(key)
        return self._counted(messages, key, previous, self._known(messages, previous))

    def _known(self, messages: Sequence[BaseMessage], previous: _Read) -> int:
        """How many leading messages ``previous`` (a conversation's previous read) counted as they are now."""
        last, _, _, sizes = previous
        reused = self._reused(messages, last)
        return self._renewed(messages, last, sizes, reused) if reused < len(last) else reused

    def _counted(
        self, messages: Sequence[BaseMessage], key: Any, previous: _Read, reused: int
    ) -> tuple[Counts, Scanned]:
        """``counts_and_core`` past the first ``reused`` messages, which ``previous`` counted."""
        _, last_counts, last_core, last_sizes = previous
        out: list[int] = []  # (the counts and core forms past ``reused``)
        core: list[Message] = []
        missing: list[tuple[int, str]] = []
        entries, cores = self._entries, self._cores
        for index in range(reused, len(messages)):
            message = messages[index]
            known = message.id if isinstance(message, BaseMessage) else None
            mark = fingerprint(message) if known is not None else ""
            hit = entries.get(known) if known is not None else None
            found = cores.get(known) if known is not None and hit is not None and hit[0] == mark else None
            if hit is not None and found is not None:  # (no core form: dropped meanwhile)
                out.append(hit[1])
                core.append(found)
                continue
            missing.append((index, mark))
            out.append(0)  # (counted below, with the others missing)
            core.append(to_core(message, index))  # raises InvalidMessagesError naming the index
        if missing:
            self._count_missing(messages, missing, out, core, reused)
        counts, scanned = Counts.grown(last_counts, reused, out), Scanned.grown(last_core, reused, core)
        self._last.put(key, (list(messages), counts, scanned, self._grown(last_sizes, reused, messages)))
        return counts, scanned

    def _grown(self, sizes: list[int], reused: int, messages: Sequence[BaseMessage]) -> list[int]:
        """The sizes of ``messages`` as counted: ``sizes`` (the previous read's) for the first ``reused``, grown.

        The common turn adds to the end: the list grows in place (an older
        read knows its own length and never reads past it), so a turn costs
        what it adds.
        """
        new = list(map(content_size, messages[reused:]))
        with self._lock:
            if reused == len(sizes) and sizes is not _NOTHING[3]:
                sizes.extend(new)
                return sizes
        return [*sizes[:reused], *new]

    def _count_missing(
        self,
        messages: Sequence[BaseMessage],
        missing: list[tuple[int, str]],
        out: list[int],
        core: list[Message],
        start: int,
    ) -> None:
        """Count the ``missing`` messages (index, fingerprint) into ``out``; it and ``core`` start at ``start``."""
        self.misses += len(missing)
        batch = [messages[i] for i, _ in missing]
        values = count_messages(batch, [core[i - start] for i, _ in missing], self._options)
        fresh: list[tuple[str, str, int, Message]] = []
        for (index, mark), value in zip(missing, values):
            out[index - start] = value
            key = messages[index].id
            if key is not None:
                fresh.append((key, mark, value, core[index - start]))
        self._remember(fresh)

    def count(self, messages: Sequence[BaseMessage], key: Any = None) -> Call[tuple[Counts, Scanned]]:
        """``counts_and_core`` as a step of a flow: in place, or awaited (``acounts_and_core``)."""
        return twin(self.counts_and_core, self.acounts_and_core, messages, key)

    async def acounts_and_core(self, messages: Sequence[BaseMessage], key: Any = None) -> tuple[Counts, Scanned]:
        """``counts_and_core`` without blocking the event loop.

        A few new messages under the built-in estimate are counted in place;
        a custom counter (it may make a network call) or a long unseen history
        is counted in a worker thread.
        """
        previous = self._previous(key)
        reused = self._known(messages, previous)
        if self._options.token_counter is None and len(messages) - reused <= _INLINE_NEW_MESSAGES:
            return self._counted(messages, key, previous, reused)  # (compared once, not again)
        return await working(self._options, self.counts_and_core, messages, key).arun()

    def _remember(self, fresh: list[tuple[str, str, int, Message]]) -> None:
        if not fresh:
            return
        with self._lock:
            entries, cores = self._entries, self._cores
            for key, mark, value, core in fresh:
                old = entries.pop(key, None)  # (a key seen again moves to the end: the newest)
                self._held += value - (old[1] if old is not None else 0)
                entries[key] = (mark, value)
                cores[key] = core
            if len(entries) > self._max_entries or self._held > self._max_held:
                # dicts keep insertion order: the first keys are the oldest. A quarter of the room is freed.
                keep_entries, keep_held = self._max_entries * 3 // 4, self._max_held * 3 // 4
                for stale in list(entries):
                    if len(entries) <= keep_entries and self._held <= keep_held:
                        break
                    self._drop(stale)


def counting(options: CompactionOptions, function: Callable[..., _T], *args: Any) -> Call[_T]:
    """A step that counts tokens: in place, or off the event loop with a user's counter.

    A user's ``token_counter`` may make a network call (a provider's count
    endpoint); the library's own estimate never blocks.
    """
    return (blocking if options.token_counter is not None else inline)(function, *args)


def working(options: CompactionOptions, function: Callable[..., _T], /, *args: Any, **kwargs: Any) -> Call[_T]:
    """A long step that counts tokens on the way (a plan, a finish, a first count) off the event loop.

    With the built-in estimate it is CPU work only, run on the library's one
    worker thread (``computing``); a user's counter may wait on the network,
    so its steps run side by side (``blocking``).
    """
    return (blocking if options.token_counter is not None else computing)(function, *args, **kwargs)


def _undecided(messages: Sequence[BaseMessage], options: CompactionOptions, mark: int | None) -> bool | None:
    return None


def _at_least(message: BaseMessage) -> int:
    """A message's size in tokens for the cold screen: four ASCII characters a token, else one a character.

    (CJK is about a token a character; a text mixing scripts counts high, which only sends the turn to a full count.)
    """
    content = message.content
    if isinstance(content, str):
        return len(content) // 4 if content.isascii() else len(content)
    return content_size(message) // 4


def due_by_usage(messages: Sequence[BaseMessage], options: CompactionOptions, mark: int | None) -> bool | None:
    """The trigger's answer from the last reply's reported usage alone, when it can give one.

    A cold worker (a fresh node, nothing cached) would otherwise count the
    whole history to learn what the provider already reported: here only the
    leading block, the last reply and what follows it are converted, by the
    same rule (``core.context.trusted_usage``).

    Returns:
        Whether the context is past ``mark`` (the first size anything happens
        at), or ``None`` when only a full count can say (no trusted usage, or
        a system message past the leading block, which a full pass must put
        back in place). Reported usage already includes what a request
        carries besides its messages.
    """
    threshold = mark
    if threshold is None:
        return None
    last = next((i for i in range(len(messages) - 1, -1, -1) if isinstance(messages[i], AIMessage)), None)
    if last is None or not cast("AIMessage", messages[last]).usage_metadata:
        return None
    lead = 0
    while lead < last and isinstance(messages[lead], SystemMessage):
        lead += 1
    # A bridge, or a summary another compactor wrote as a user turn.
    while lead < last and (is_bridge_message(messages[lead]) or is_langchain_summary(messages[lead])):
        lead += 1
    if any(map(isinstance, messages[lead:], repeat(SystemMessage))):
        return None
    tail = to_core_list(messages[last:])
    head = to_core_list(messages[:lead])
    reported = trusted_usage(head, tail[0], tail[1:])
    if reported is None or reported * FOREIGN_USAGE < sum(map(_at_least, messages[: last + 1])):
        return None  # (maybe another conversation's usage: a full count decides)
    if inflated(reported, options.budget.window) or not _follows(messages, head, last, reported, options):
        return None  # (a usage gone wrong, or another conversation's: a full count decides)
    return reported + sum(count_messages(messages[last + 1 :], tail[1:], options)) > threshold


def _follows(
    messages: Sequence[BaseMessage], head: list[Message], last: int, reported: int, options: CompactionOptions
) -> bool:
    """``core.context.follows`` for the cold screen: over the leading block and the messages since the reply before."""
    lead = len(head)
    prev = next((i for i in range(last - 1, max(last - LOOK_BACK, lead) - 1, -1) if _reports(messages[i])), None)
    if prev is None:
        return True
    between = to_core_list(messages[prev : last + 1])
    counts = [0] * lead + count_messages(messages[prev : last + 1], between, options)
    return follows([*head, *between], counts, lead + last - prev, reported)


def _reports(message: BaseMessage) -> bool:
    return isinstance(message, AIMessage) and bool(message.usage_metadata)
