"""Per-message token counts, cached so a hot loop pays only for new messages.

A graph node sees the whole history on every turn, and LangGraph hands it
freshly deserialized message objects each run, so the cache is keyed by the
message id (``add_messages`` gives every message one) and checked by a content
fingerprint. The fingerprint hashes the content, tool calls and the fields the
estimate reads; hashing is far cheaper than estimating, and it catches a
message replaced under the same id. Within one run the node sees the very same
objects again, so a prefix of the previous call's objects is reused without
even a fingerprint. The cost: an in-place edit of a message object already seen
(``message.content = ...``, which LangGraph never does: ``add_messages``
replaces a message with a new object) goes unnoticed until the message
arrives as a new object, for example after a checkpoint load.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ChatMessage, ToolMessage

from langchain_compaction.adapters._convert import to_core
from langchain_compaction.core.options import CompactionOptions
from langchain_compaction.core.tokens import estimate_message
from langchain_compaction.core.types import Message
from langchain_compaction.errors import InvalidMessagesError

DEFAULT_CACHE_SIZE = 200_000
"""Messages remembered per cache before the oldest quarter is dropped."""


def fingerprint(message: BaseMessage) -> int:
    """A hash of everything in ``message`` that a token count depends on.

    Args:
        message: A LangChain message.

    Returns:
        An int that changes when the message's content, tool calls, tool
        result fields, name or type change.
    """
    # Runs once per message per turn, so it stays in C where it can: text is
    # hashed as is, structured content and tool calls through ``repr`` (their
    # values are JSON-like, so equal reprs mean equal values).
    content = message.content
    body = content if type(content) is str else repr(content)
    extra: Any = None
    if isinstance(message, AIMessage):
        if message.tool_calls or message.invalid_tool_calls:
            extra = repr(message.tool_calls) + repr(message.invalid_tool_calls)
    elif isinstance(message, ToolMessage):
        extra = (message.tool_call_id, message.status)
    elif isinstance(message, ChatMessage):
        extra = message.role
    return hash((type(message), message.name, body, extra))


def count_message(message: BaseMessage, index: int, options: CompactionOptions, core: Message | None = None) -> int:
    """Count one message with the counter ``options`` names (or the estimate).

    Args:
        message: The message.
        index: Its position, for the error message.
        options: The options in force.
        core: Its core form, if already converted.

    Returns:
        The token count.

    Raises:
        InvalidMessagesError: The custom counter returned something other than
            a non-negative int, or ``message`` is not a message.
    """
    counter = options.token_counter
    if counter is None:
        return estimate_message(core if core is not None else to_core(message, index))
    return checked_count(counter([message]), index)


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


class TokenCountCache:
    """Token counts per message id, recounted only when a message changes.

    Messages without an id are counted every time (nothing safe to key them
    by). The cache is bounded: past ``max_entries`` the oldest quarter is
    dropped, so a long-lived server does not grow without limit; a dropped
    message is simply counted again the next time it is seen.

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
        self._entries: dict[str, tuple[int, int, Message]] = {}
        self._lock = threading.Lock()
        # The previous call's messages, counts and core forms: within one
        # graph run (and in an agent loop) the node sees the same message
        # objects again plus a few new ones, so an identity check of the
        # prefix, done in C, skips even the fingerprints. One tuple, so
        # threads swap it atomically.
        self._last: tuple[list[BaseMessage], list[int], list[Message]] = ([], [], [])
        self.misses = 0
        """Messages counted (cache misses) since the cache was made."""

    def __len__(self) -> int:
        return len(self._entries)

    def counts(self, messages: Sequence[BaseMessage]) -> list[int]:
        """The token count of each message, from the cache where it is current.

        Args:
            messages: The conversation.

        Returns:
            One count per message, in order.
        """
        return self.counts_and_core(messages)[0]

    def counts_and_core(self, messages: Sequence[BaseMessage]) -> tuple[list[int], list[Message]]:
        """Token counts and core forms of ``messages``, cached together.

        The core forms are what ``prepare(core=...)`` takes, so a compaction
        does not convert the whole history again.

        Args:
            messages: The conversation.

        Returns:
            One count and one core message per message, in order.
        """
        last, last_counts, last_core = self._last
        known = len(last)
        if len(messages) >= known and all(map(operator.is_, messages[:known], last)):
            reused = known  # the common case: the same history plus new messages
        else:
            same = list(map(operator.is_, messages, last))
            reused = same.index(False) if False in same else len(same)
        out = last_counts[:reused]
        core = last_core[:reused]
        entries = self._entries
        fresh: list[tuple[str, tuple[int, int, Message]]] = []
        for index in range(reused, len(messages)):
            message = messages[index]
            if not isinstance(message, BaseMessage):
                to_core(message, index)  # raises InvalidMessagesError naming the index
            key = message.id
            if key is None:
                converted = to_core(message, index)
                self.misses += 1
                out.append(count_message(message, index, self._options, converted))
                core.append(converted)
                continue
            mark = fingerprint(message)
            hit = entries.get(key)
            if hit is not None and hit[0] == mark:
                out.append(hit[1])
                core.append(hit[2])
                continue
            self.misses += 1
            converted = to_core(message, index)
            value = count_message(message, index, self._options, converted)
            fresh.append((key, (mark, value, converted)))
            out.append(value)
            core.append(converted)
        if fresh:
            with self._lock:
                entries.update(fresh)
                if len(entries) > self._max_entries:
                    # dicts keep insertion order: the first keys are the oldest.
                    for stale in list(entries)[: max(len(entries) // 4, len(entries) - self._max_entries)]:
                        del entries[stale]
        self._last = (list(messages), out, core)
        return list(out), list(core)
