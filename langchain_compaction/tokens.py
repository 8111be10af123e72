"""Token estimates that need no tokenizer, for LangChain messages.

``estimate_tokens`` prices a piece of text by character class (prose at about
four characters per token; code, JSON, CJK text and base64 charged more, so
they are not undercounted); ``estimate_message_tokens`` adds up everything a
provider bills for a list of messages. They are the library's built-in count,
used wherever ``CompactionOptions.token_counter`` is not set.
``estimate_tool_tokens`` prices the tool schemas a request sends with every
call, as the middleware and the command line count them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.messages import BaseMessage

from langchain_compaction._lc.convert import to_core_list
from langchain_compaction.core import tokens as _core
from langchain_compaction.core.tokens import estimate_message

__all__ = ["estimate_message_tokens", "estimate_tokens", "estimate_tool_tokens"]


def estimate_message_tokens(messages: Sequence[BaseMessage]) -> int:
    """Estimate the tokens of a message list with the built-in estimate.

    Counts text, reasoning, tool-call names and arguments, tool results,
    structured blocks, a fixed cost per image and a per-message overhead.

    Args:
        messages: LangChain messages.

    Returns:
        The estimated total.

    Example:
        >>> from langchain_core.messages import HumanMessage
        >>> estimate_message_tokens([HumanMessage("a" * 400)])
        104
    """
    return sum(estimate_message(m) for m in to_core_list(messages))


def estimate_tokens(text: str) -> int:
    """Estimate the tokens in a piece of text (see ``langchain_compaction.core.tokens.estimate_tokens``).

    Raises:
        TypeError: ``text`` is not a string (for messages: ``estimate_message_tokens``).

    Example:
        >>> estimate_tokens("hello world")
        2
    """
    if not isinstance(text, str):
        kind = type(text).__name__
        msg = f"estimate_tokens takes text (a str), not a {kind}; for messages use estimate_message_tokens"
        raise TypeError(msg)
    return _core.estimate_tokens(text)


def estimate_tool_tokens(tools: Sequence[Any]) -> int:
    """Estimate the tokens tool schemas take in a request, as the middleware and the command line count them.

    Each schema is priced as a provider receives it (name, description and
    JSON-schema parameters, as JSON text), plus a per-tool framing. A request
    sends them with every call: pass the estimate as ``overhead_tokens`` to
    ``auto_compact`` (or ``compact``, ``should_compact``) so that the
    compacted messages fit the window with them.

    Args:
        tools: LangChain tools (``BaseTool``, ``@tool`` functions) or schema
            dicts in any provider's shape.

    Returns:
        The estimated total.

    Example:
        >>> estimate_tool_tokens([{"name": "ls", "description": "List a folder.", "input_schema": {"type": "object"}}])
        32
    """
    from langchain_compaction._lc.schemas import ToolSchemas  # (langchain_core's tool module, loaded on use)

    return ToolSchemas().tokens(tools)
