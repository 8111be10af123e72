"""Calls and their answers written as content blocks: what ``_lc.convert`` reads as the core's calls and results.

Anthropic's ``tool_use`` blocks, answered by a user turn's ``tool_result``
blocks (an Anthropic-SDK history through ``convert_to_messages``), and the
calls OpenAI's Responses API writes as output items, which langchain-openai
keeps in the reply's content (its built-in tools), answered by the blocks it
sends from a user turn as input items (``non_message_item_types`` in its
``chat_models/base.py``). A call and its answer must stay together
(``core.cut``): the API refuses an answer whose call is not in the request.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

CALL_BLOCKS: dict[str, tuple[str, str, str]] = {
    "tool_use": ("id", "", "input"),
    "apply_patch_call": ("call_id", "apply_patch", "operation"),
    "computer_call": ("call_id", "computer", "action"),
    "tool_search_call": ("call_id", "tool_search", "arguments"),
    "mcp_approval_request": ("id", "", "arguments"),
}
"""Per block type: the key of the id its answer names (an OpenAI item's ``id`` is the item's own, its
``call_id`` the call's; an approval request is answered by its ``id``), the tool's name when the block
names none, the key of its arguments. (A computer call is answered by a tool message.)"""

RESULT_BLOCKS: dict[str, tuple[str, str]] = {
    "tool_result": ("tool_use_id", "content"),
    "apply_patch_call_output": ("call_id", "output"),
    "tool_search_output": ("call_id", ""),
    "mcp_approval_response": ("approval_request_id", ""),
}
"""Per block type of a user turn: the key of the id of the call it answers, the key of the output a clearing
may replace ("": none, the block is sent as it is: an approval, the tools a search loaded)."""


def id_of(block: dict[str, Any], key: str) -> str:
    """A block's id under ``key`` ("" when it has none: such a block pairs with nothing)."""
    value = block.get(key)
    return value if isinstance(value, str) else ""


def result_of(block: dict[str, Any]) -> str:
    """The id of the call ``block`` answers (``RESULT_BLOCKS``); "" for any other block."""
    kind = block.get("type")
    found = RESULT_BLOCKS.get(kind) if isinstance(kind, str) else None
    return id_of(block, found[0]) if found is not None else ""


def output_key(block: dict[str, Any]) -> str:
    """The key of the output a clearing may replace in a block ``result_of`` reads; "" when it has none."""
    return RESULT_BLOCKS[block["type"]][1]


def block_calls(content: list[Any], skip: frozenset[str]) -> Iterator[tuple[str, str, Any]]:
    """The calls only ``content``'s blocks write (``CALL_BLOCKS``), not in ``skip``: each id, name and arguments.

    A call the reply answers itself (a tool search the server ran, its output
    the next item) waits for no answer: it is none here, and shown as a block.
    """
    answered = {result_of(block) for block in content if isinstance(block, dict)}
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        found = CALL_BLOCKS.get(kind) if isinstance(kind, str) else None
        if found is None:
            continue
        ident = id_of(block, found[0])
        if ident and ident not in skip and ident not in answered:
            yield ident, str(block.get("name") or found[1]), block.get(found[2], {})
