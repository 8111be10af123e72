"""Calls and their answers written as content blocks: what ``_lc.convert`` reads as the core's calls and results.

Anthropic's ``tool_use`` blocks, answered by a user turn's ``tool_result``
blocks (an Anthropic-SDK history through ``convert_to_messages``), and the
calls OpenAI's Responses API writes as output items, which langchain-openai
keeps in the reply's content (its built-in tools), answered by the blocks it
sends from a user turn as input items (``non_message_item_types`` in its
``chat_models/base.py``). And the server tools Claude runs itself
(``server_tool_use``, ``mcp_tool_use``; LangChain's v1 ``server_tool_call``),
whose result block follows in the reply; when Claude pauses its turn
(``stop_reason: "pause_turn"``) the result is in the next reply instead, the
continuation, which is then the answer. A call and its answer must stay
together (``core.cut``): the API refuses an answer whose call is not in the
request.
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
    "server_tool_use": ("id", "", "input"),
    "mcp_tool_use": ("id", "", "input"),
    "server_tool_call": ("id", "", "args"),
}
"""Per block type: the key of the id its answer names (an OpenAI item's ``id`` is the item's own, its
``call_id`` the call's; an approval request is answered by its ``id``), the tool's name when the block
names none, the key of its arguments. (A computer call is answered by a tool message.)"""

RESULT_BLOCKS: dict[str, tuple[str, str]] = {
    "tool_result": ("tool_use_id", "content"),
    "apply_patch_call_output": ("call_id", "output"),
    "tool_search_output": ("call_id", ""),
    "mcp_approval_response": ("approval_request_id", ""),
    "server_tool_result": ("tool_call_id", ""),
    **dict.fromkeys(
        (
            "web_search_tool_result",
            "web_fetch_tool_result",
            "code_execution_tool_result",
            "bash_code_execution_tool_result",
            "text_editor_code_execution_tool_result",
            "tool_search_tool_result",
            "mcp_tool_result",
            "advisor_tool_result",
        ),
        ("tool_use_id", ""),
    ),
}
"""Per block type: the key of the id of the call it answers, the key of the output a clearing may replace
("": none, the block is sent as it is: an approval, the tools a search loaded, a server tool's result, whose
content the API reads as that tool's own blocks and would refuse as a placeholder's text). The server tools'
results are those langchain-anthropic 1.x sends back (``_format_messages``); a newer one is read by its name,
as langchain-anthropic and langchain-core read it (``result_of``)."""

_SERVER_RESULT = ("tool_use_id", "")


def id_of(block: dict[str, Any], key: str) -> str:
    """A block's id under ``key`` ("" when it has none: such a block pairs with nothing)."""
    value = block.get(key)
    return value if isinstance(value, str) else ""


def _result_entry(block: dict[str, Any]) -> tuple[str, str] | None:
    """``block``'s ``RESULT_BLOCKS`` entry; a server tool's result the table does not name yet (``*_tool_result``)."""
    kind = block.get("type")
    if not isinstance(kind, str):
        return None
    found = RESULT_BLOCKS.get(kind)
    return _SERVER_RESULT if found is None and kind.endswith("_tool_result") else found


def result_of(block: dict[str, Any]) -> str:
    """The id of the call ``block`` answers (``RESULT_BLOCKS``); "" for any other block."""
    found = _result_entry(block)
    return id_of(block, found[0]) if found is not None else ""


def output_key(block: dict[str, Any]) -> str:
    """The key of the output a clearing may replace in a block ``result_of`` reads; "" when it has none."""
    found = _result_entry(block)
    return found[1] if found is not None else ""


def answering(content: list[Any]) -> list[tuple[dict[str, Any], str]]:
    """``content``'s blocks that answer a call another message made, each with that call's id.

    A result whose call is in the same content (a server tool Claude ran
    within the reply, a tool search the server ran) is part of its reply,
    no answer: the two are one block pair, as ``block_calls`` reads them.
    """
    made = {_call_id(block) for block in content if isinstance(block, dict)}
    return [
        (block, ident)
        for block in content
        if isinstance(block, dict) and (ident := result_of(block)) and ident not in made
    ]


def _call_entry(block: Any) -> tuple[str, str, str] | None:
    """``block``'s ``CALL_BLOCKS`` entry, if it writes a call."""
    kind = block.get("type") if isinstance(block, dict) else None
    return CALL_BLOCKS.get(kind) if isinstance(kind, str) else None


def _call_id(block: dict[str, Any]) -> str:
    """The id of the call ``block`` writes (``CALL_BLOCKS``); "" for any other block."""
    found = _call_entry(block)
    return id_of(block, found[0]) if found is not None else ""


def block_calls(content: list[Any], skip: frozenset[str]) -> Iterator[tuple[str, str, Any]]:
    """The calls only ``content``'s blocks write (``CALL_BLOCKS``), not in ``skip``: each id, name and arguments.

    A call the reply answers itself (a tool search the server ran, its output
    the next item) waits for no answer: it is none here, and shown as a block.
    """
    answered = {result_of(block) for block in content if isinstance(block, dict)}
    for block in content:
        found = _call_entry(block)
        if found is None:
            continue
        ident = id_of(block, found[0])
        if ident and ident not in skip and ident not in answered:
            yield ident, str(block.get("name") or found[1]), block.get(found[2], {})
