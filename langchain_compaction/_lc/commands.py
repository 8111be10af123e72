"""The ``/compact`` chat command, and the edge that skips the model after it.

With ``CompactionNode(enable_compact_command=True)`` a final human message
``/compact [instructions]`` forces a compaction and is removed, so it never
reaches the model; ``route_after_compaction`` then ends the run (the last
message is the previous reply, not a question).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.messages import BaseMessage, HumanMessage, ToolMessage
from langgraph.constants import END

from langchain_compaction.errors import InvalidMessagesError

COMPACT_COMMAND = "/compact"
"""The chat command that forces a compaction when ``enable_compact_command`` is set."""


def parse_compact_command(message: object) -> str | None:
    """The instructions of a ``/compact [instructions]`` human message.

    Args:
        message: Any message.

    Returns:
        The instructions (``""`` for a bare ``/compact``), or ``None`` when
        ``message`` is not a human message holding the command.

    Example:
        >>> from langchain_core.messages import HumanMessage
        >>> parse_compact_command(HumanMessage("/compact keep the API design"))
        'keep the API design'
        >>> parse_compact_command(HumanMessage("/compactify")) is None
        True
    """
    if not isinstance(message, HumanMessage):
        return None
    text = message.text.strip()
    if not text.startswith(COMPACT_COMMAND):
        return None
    rest = text[len(COMPACT_COMMAND) :]
    if rest and not rest[0].isspace():
        return None  # "/compactify" is not the command
    return rest.strip()


def route_after_compaction(state: Any, *, goto: str = "model", messages_key: str = "messages") -> str:
    """A conditional edge for after the compaction node: call the model only if needed.

    The model runs when the last message asks for an answer (a human message
    or a tool result). After a ``/compact`` command the command message is
    gone and the last message is the previous reply, so the run ends without
    a model call.

    Args:
        state: The graph state.
        goto: The model node's name.
        messages_key: The state key holding the messages.

    Returns:
        ``goto`` or ``END``.

    Example:
        >>> from langchain_core.messages import AIMessage, HumanMessage
        >>> route_after_compaction({"messages": [HumanMessage("hi")]})
        'model'
        >>> route_after_compaction({"messages": [HumanMessage("hi"), AIMessage("hello")]})
        '__end__'
    """
    messages = read_messages(state, messages_key)
    if messages and isinstance(messages[-1], (HumanMessage, ToolMessage)):
        return goto
    return END


def read_messages(state: Any, key: str) -> list[BaseMessage]:
    """The message list under ``key`` of a graph state (a dict or an object), checked."""
    value = state.get(key) if isinstance(state, Mapping) else getattr(state, key, None)
    if value is None:
        return []
    if isinstance(value, BaseMessage) or not isinstance(value, Sequence) or isinstance(value, str):
        msg = f"state[{key!r}] is a {type(value).__name__}, not a list of messages; pass messages_key= naming the list"
        raise InvalidMessagesError(msg)
    return list(value)
