"""What makes a LangChain message the same message: its fingerprint, kept across stores and processes.

``fingerprint`` is the one identity of a message's content the library uses:
the token cache checks a cached count with it, chat memory compares a store's
messages with a snapshot by it, and the Anthropic counter keys its counts by
it. ``content_size`` tells a content replaced in place from the one counted.
"""

from __future__ import annotations

import hashlib
import operator
from collections.abc import Iterable, Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ChatMessage, ToolMessage

from langchain_compaction._lc.convert import SUMMARY_MARK, json_text
from langchain_compaction.core.effects import breathe


def content_size(message: object) -> int:
    """A message's content size, as it is counted (a content replaced in place later differs).

    Text: its length. Blocks: their number, and the length of each one's
    text (an image or a file: its data's).
    """
    content = getattr(message, "content", None)
    if isinstance(content, str):
        return len(content)
    if not isinstance(content, list):
        return -1
    size = len(content)
    for block in content:
        if isinstance(block, str):
            size += len(block)
        elif isinstance(block, dict):
            for field in ("text", "thinking", "reasoning", "data", "base64", "content", "input", "args"):
                value = block.get(field)
                size += len(value) if isinstance(value, (str, bytes, list, dict)) else 0
    return size


def canonical(value: Any) -> str:
    """``value`` as key-sorted JSON: the same text for the same value, whatever the order of its keys."""
    return json_text(value, tight=True)


def fingerprint(message: BaseMessage) -> str:
    """A stable digest of everything that makes ``message`` this message.

    It covers the type, id, name, content, tool calls and tool-result fields,
    a chat role and this library's mark, and is the same in every process
    (a store round trip keeps it).

    Args:
        message: A LangChain message.

    Returns:
        A 32-character hex digest.
    """
    breathe()
    # Structured values go through key-sorted JSON, so a store that reorders
    # keys (JSONB, a sorted dump) gives the same identity back.
    content = message.content
    body = content if type(content) is str else canonical(content)
    extra = ""
    if isinstance(message, AIMessage):
        if message.tool_calls or message.invalid_tool_calls:
            extra = canonical([message.tool_calls, message.invalid_tool_calls])
        if message.usage_metadata:
            extra += canonical(message.usage_metadata)
    elif isinstance(message, ToolMessage):
        extra = f"{message.tool_call_id}\x00{message.status}"
    elif isinstance(message, ChatMessage):
        extra = message.role
    kwargs = message.additional_kwargs
    if kwargs:
        # The mark and a pin change what the message is to the library. (The
        # mark alone is digested as 0.2 did, so its journals still reconcile.)
        mark = kwargs.get(SUMMARY_MARK)
        if mark:
            extra += canonical(mark)
        rest = {k: v for k, v in kwargs.items() if k != SUMMARY_MARK} if mark is not None else kwargs
        if rest:
            extra += canonical(rest)
    digest = hashlib.blake2b(digest_size=16)
    digest.update(f"{message.type}\x00{message.id}\x00{message.name}\x00{extra}\x00".encode("utf-8", "surrogatepass"))
    digest.update(body.encode("utf-8", "surrogatepass"))
    return digest.hexdigest()


def same_fields(a: BaseMessage, b: BaseMessage) -> bool:
    """Whether ``a`` holds what ``b`` holds, field for field (a checkpoint's copy of it), compared in C.

    Equal fields make an equal fingerprint, but for values Python holds equal
    across types (``1``, ``1.0`` and ``True`` in a call's arguments): this is
    ``same_message``'s cheap first test (a hundredth of a fingerprint's time),
    not a rule of its own, and takes such an edit for no change.
    """
    try:
        return a.__dict__ == b.__dict__ and a.id is not None
    except Exception:  # an odd payload's own ``__eq__``: taken as changed
        return False


def same_message(a: BaseMessage, b: BaseMessage) -> bool:
    """Whether ``a`` and ``b`` are one message (the same object, or the same after a store or checkpoint round trip)."""
    return a is b or same_fields(a, b) or fingerprint(a) == fingerprint(b)


def leading(flags: Iterable[bool]) -> int:
    """How many of ``flags`` are true before the first false one."""
    same = list(flags)
    return same.index(False) if False in same else len(same)


def unchanged_since(messages: Sequence[Any], last: Sequence[Any], sizes: Sequence[int], start: int = 0) -> int:
    """How many leading ``messages`` are ``last``'s, unchanged: the first ``start`` (its very objects), then copies.

    A copy (a checkpoint's, read anew) is compared with the message it copies
    field for field (in C, no digest), and with the size its content had when
    ``last`` was read (``sizes``): one of ``last``'s objects edited in place
    since equals its copy, but not in size. A ``None`` in ``last`` (an
    object collected since) is the same as nothing.
    """
    end = min(len(messages), len(last))
    count = start + leading(map(same_fields, messages[start:end], last[start:end]))
    return start + leading(map(operator.eq, map(content_size, messages[start:count]), sizes[start:count]))


def starts_with(messages: Sequence[BaseMessage], prefix: Sequence[BaseMessage]) -> bool:
    """Whether ``messages`` begins with ``prefix``."""
    return len(messages) >= len(prefix) and all(same_message(a, b) for a, b in zip(messages, prefix))


def prefix_digest(messages: Sequence[BaseMessage]) -> str:
    """The identity of a list of messages: a digest of their fingerprints, in order."""
    digest = hashlib.blake2b(digest_size=16)
    for message in messages:
        digest.update(fingerprint(message).encode("ascii"))
    return digest.hexdigest()
