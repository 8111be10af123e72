"""What the Messages API accepts as a request: the rules, and the padding that meets them.

``valid_sequence`` pads a run of API messages into a valid request (for
counting: padding only adds tokens); ``is_valid_request`` says by the same
rules whether a run already is one (a cache-aligned request is sent unchanged
or not at all).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

ApiMessage = dict[str, Any]
"""One message in the Messages API's request format (``role`` and ``content``)."""


def is_kind(block: Any, kind: str) -> bool:
    """Whether ``block`` is a content block of type ``kind``."""
    return isinstance(block, dict) and block.get("type") == kind


def tool_use(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    """A ``tool_use`` block."""
    return {"type": "tool_use", "id": call_id, "name": name, "input": arguments or {}}


def _empty_results(call_ids: Sequence[str]) -> list[dict[str, Any]]:
    return [{"type": "tool_result", "tool_use_id": i, "content": ""} for i in call_ids]


def placeholder_user() -> ApiMessage:
    """The smallest user turn the API accepts: one character."""
    return {"role": "user", "content": "."}


def _as_blocks(content: Any) -> list[Any]:
    return list(content) if isinstance(content, list) else [{"type": "text", "text": str(content)}]


def _ids(message: ApiMessage | None, kind: str, key: str) -> list[str]:
    content = message.get("content") if message else None
    if not isinstance(content, list):
        return []
    return [str(b.get(key)) for b in content if is_kind(b, kind)]


def merged(messages: Sequence[ApiMessage]) -> list[ApiMessage]:
    """Consecutive turns of one role joined into one, as the API does."""
    out: list[ApiMessage] = []
    for message in messages:
        if out and out[-1]["role"] == message["role"]:
            content = [*_as_blocks(out[-1]["content"]), *_as_blocks(message["content"])]
            out[-1] = {"role": message["role"], "content": content}
        else:
            out.append(dict(message))
    return out


def _answered(turn: ApiMessage, previous: ApiMessage | None, tool_names: Mapping[str, str]) -> list[ApiMessage]:
    """A user turn after ``previous``, with stub calls or empty results added where needed.

    Returns the turns that replace ``previous`` and ``turn``.
    """
    calls = _ids(previous, "tool_use", "id")
    results = _ids(turn, "tool_result", "tool_use_id")
    orphans = [i for i in results if i not in calls]
    unanswered = [i for i in calls if i not in results]
    head = [] if previous is None else [previous]
    if orphans:
        stubs = [tool_use(i, tool_names.get(i) or "tool", {}) for i in orphans]
        blocks = [*_as_blocks(previous["content"]), *stubs] if previous else stubs
        head = [{"role": "assistant", "content": blocks}]
    content = _as_blocks(turn["content"])
    # Results first: the API wants them at the start of the turn.
    results_first = sorted(content, key=lambda b: not is_kind(b, "tool_result"))  # a stable sort
    ordered = [*_empty_results(unanswered), *results_first]
    return [*head, turn if ordered == content else {"role": "user", "content": ordered}]


def valid_sequence(messages: Sequence[ApiMessage], tool_names: Mapping[str, str]) -> list[ApiMessage]:
    """Pad a message run into a request the API accepts (padding only adds tokens).

    Turns of one role are joined; a first turn that is not a plain user turn
    gets a placeholder user turn before it; a tool result without its call
    gets a stub call; a call without its result gets an empty one; results
    go first in their turn; a final assistant turn is answered (a placeholder
    user turn, or its calls' empty results): no request ends in a prefill.

    Args:
        messages: API messages, in order.
        tool_names: Tool names by call id, for stub calls.

    Returns:
        The padded run; ``merged(messages)`` itself when nothing was missing.

    Example:
        >>> valid_sequence([{"role": "assistant", "content": "hi"}], {})
        [{'role': 'user', 'content': '.'}, {'role': 'assistant', 'content': 'hi'}, {'role': 'user', 'content': '.'}]
    """
    turns = merged(messages)
    if turns and (turns[0]["role"] == "assistant" or _ids(turns[0], "tool_result", "tool_use_id")):
        turns.insert(0, placeholder_user())
    out: list[ApiMessage] = []
    for index, turn in enumerate(turns):
        if turn["role"] != "user" or index == 0:
            out.append(turn)
            continue
        previous = out.pop() if out and out[-1]["role"] == "assistant" else None
        out += _answered(turn, previous, tool_names)
    if out and out[-1]["role"] == "assistant":
        pending = _ids(out[-1], "tool_use", "id")
        out.append({"role": "user", "content": _empty_results(pending)} if pending else placeholder_user())
    return out or [placeholder_user()]


def is_valid_request(messages: Sequence[ApiMessage]) -> bool:
    """Whether ``messages`` is a request the API accepts as it is.

    The rules are those ``valid_sequence`` pads and ``_sanitize`` enforces: a
    non-empty run that starts with a plain user turn and ends with a user
    turn, every tool result right after its call, every call answered before
    the next assistant turn, no unsigned thinking, no empty turn; and no call
    id twice (the API refuses repeated ``tool_use`` ids).

    Example:
        >>> orphan = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "gone", "content": "ok"}]}
        >>> is_valid_request([orphan]), is_valid_request([{"role": "user", "content": "hi"}])
        (False, True)
    """
    clean = sanitize(messages)
    as_sent = [{"role": m.get("role"), "content": m.get("content")} for m in messages]
    calls = [i for message in clean for i in _ids(message, "tool_use", "id")]
    unique = len(calls) == len(set(calls))
    return bool(clean) and unique and clean == as_sent and valid_sequence(clean, {}) == merged(clean)


def sanitize(messages: Sequence[ApiMessage]) -> list[ApiMessage]:
    """Drop what the API rejects in input: unsigned thinking and empty turns."""
    clean: list[ApiMessage] = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            content = [b for b in content if not (is_kind(b, "thinking") and not b.get("signature"))]
        if not content or (isinstance(content, str) and not content.strip()):
            continue
        clean.append({"role": message.get("role", "user"), "content": content})
    return clean
