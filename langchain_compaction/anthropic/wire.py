"""LangChain messages in the Messages API's request format.

``to_api`` is the library's own converter: counting uses it with the SDK's
public ``count_tokens``, so no upstream change can break a count.
``chat_anthropic_format`` is what ``ChatAnthropic`` would send, byte for byte,
made by langchain-anthropic's private ``_format_messages`` (the library's only
use of a private helper): a cache-aligned summary request hits the agent's
prompt cache only with an exact copy of its prefix. What makes a request valid
lives in ``anthropic.validity``.
"""

from __future__ import annotations

import functools
import importlib
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, ChatMessage, FunctionMessage, SystemMessage, ToolMessage
from langchain_core.utils.function_calling import convert_to_openai_tool

from langchain_compaction._lc.convert import json_text
from langchain_compaction.anthropic.validity import (
    ApiMessage,
    merged,
    sanitize,
    tool_use,
    valid_sequence,
)

logger = logging.getLogger("langchain_compaction")

SystemParam = str | list[dict[str, Any]]
"""The ``system`` parameter of a request: one text, or text blocks."""

_PRIVATE_FORMATTER = ("langchain_anthropic.chat_models", "_format_messages")
# Blocks of other providers with no input form in the Messages API.
_FOREIGN_BLOCKS = frozenset({"reasoning", "function_call", "tool_call", "refusal"})


def _text_of(content: Any) -> str:
    """The text of a message's content: its text blocks joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        pieces = [b if isinstance(b, str) else b.get("text") for b in content if isinstance(b, (str, dict))]
        return "\n".join(p for p in pieces if isinstance(p, str))
    return "" if content is None else json_text(content)


# --- the own converter ----------------------------------------------------------


def _image_source(block: Mapping[str, Any], media_type: str = "image/png") -> dict[str, Any] | None:
    """The API's ``source`` of an image (or a file's, given its default type): each of LangChain's block forms."""
    source = block.get("source")
    if isinstance(source, dict):
        return dict(source)
    # (LangChain's standard block holds "base64"; its v0.3 form, "source_type" and "data".)
    data = block.get("base64")
    if data is None and block.get("source_type") == "base64":
        data = block.get("data")
    if isinstance(data, str):
        return {"type": "base64", "media_type": block.get("mime_type") or media_type, "data": data}
    url = block.get("url")
    if block.get("type") == "image_url":
        image_url = block.get("image_url")
        url = image_url.get("url") if isinstance(image_url, dict) else image_url
    if not isinstance(url, str):
        return None
    if url.startswith("data:") and ";base64," in url:
        head, data = url[5:].split(";base64,", 1)
        return {"type": "base64", "media_type": head or "image/png", "data": data}
    return {"type": "url", "url": url}


def _api_block(block: Any, skip_tool_use: frozenset[str]) -> dict[str, Any] | None:
    """One content block in the API's format, or ``None`` to leave it out."""
    if isinstance(block, str):
        return {"type": "text", "text": block} if block.strip() else None
    if not isinstance(block, dict):
        return {"type": "text", "text": str(block)}
    kind = block.get("type")
    if kind == "text" or (kind is None and isinstance(block.get("text"), str)):
        return {"type": "text", "text": str(block["text"])} if str(block.get("text", "")).strip() else None
    if kind in ("image", "image_url"):
        source = _image_source(block)
        return None if source is None else {"type": "image", "source": source}
    if kind == "file" and (source := _image_source(block, "application/pdf")) is not None:
        return {"type": "document", "source": source}  # (as ChatAnthropic sends a PDF: counted as one, not as text)
    if kind in ("thinking", "redacted_thinking"):
        keep = ("type", "thinking", "signature") if kind == "thinking" else ("type", "data")
        return {k: v for k, v in block.items() if k in keep}
    if kind == "tool_use":
        if str(block.get("id")) in skip_tool_use:
            return None  # the same call is in ``tool_calls``: sent once, from there
        return tool_use(str(block.get("id")), str(block.get("name")), block.get("input"))
    if kind in _FOREIGN_BLOCKS:
        return None
    if kind in ("tool_result", "document", "search_result"):
        return dict(block)
    # A block the API may not know: its JSON as text rather than a 400 for the whole request.
    return {"type": "text", "text": json_text(block)}


def _api_blocks(content: Any, skip_tool_use: frozenset[str] = frozenset()) -> list[dict[str, Any]]:
    items = [content] if isinstance(content, str) or not isinstance(content, list) else content
    blocks = (_api_block(item, skip_tool_use) for item in items)
    return [b for b in blocks if b is not None]


def _own_convert(message: BaseMessage) -> ApiMessage:
    content = message.content
    # String content stays a string, as ChatAnthropic sends it.
    plain = content if isinstance(content, str) else _api_blocks(content)
    if isinstance(message, AIMessage):
        if not message.tool_calls:
            return {"role": "assistant", "content": plain}
        ids = frozenset(str(c.get("id")) for c in message.tool_calls if c.get("id"))
        calls = [tool_use(str(c.get("id")), c["name"], c.get("args")) for c in message.tool_calls]
        return {"role": "assistant", "content": [*_api_blocks(content, ids), *calls]}
    if isinstance(message, (ToolMessage, FunctionMessage)):
        call_id = message.tool_call_id if isinstance(message, ToolMessage) else (message.name or "function")
        result: dict[str, Any] = {"type": "tool_result", "tool_use_id": str(call_id), "content": plain}
        if isinstance(message, ToolMessage):
            result["is_error"] = message.status == "error"
        return {"role": "user", "content": [result]}
    assistant = isinstance(message, ChatMessage) and message.role in ("assistant", "ai")
    return {"role": "assistant" if assistant else "user", "content": plain}


def to_api(message: BaseMessage) -> list[ApiMessage]:
    """One non-system LangChain message in the API's format (none if it is empty).

    Example:
        >>> from langchain_core.messages import AIMessage, HumanMessage
        >>> to_api(HumanMessage("hello")), to_api(HumanMessage("  "))
        ([{'role': 'user', 'content': 'hello'}], [])
        >>> to_api(AIMessage("", tool_calls=[{"id": "t1", "name": "run", "args": {}}]))[0]["content"]
        [{'type': 'tool_use', 'id': 't1', 'name': 'run', 'input': {}}]
    """
    return sanitize([_own_convert(message)])


def _split(messages: Sequence[BaseMessage]) -> tuple[list[str], list[ApiMessage]]:
    """The leading system texts, and the rest as API messages by ``to_api``."""
    system: list[str] = []
    api: list[ApiMessage] = []
    for message in messages:
        if not isinstance(message, SystemMessage):
            api += to_api(message)
        elif not api:
            system.append(_text_of(message.content))
        elif _text_of(message.content).strip():
            # The API has no system role mid-conversation; the model still reads it.
            api.append({"role": "user", "content": _text_of(message.content)})
    return system, api


def system_param(texts: Sequence[str]) -> SystemParam | None:
    """The ``system`` parameter for ``texts``: one as a string (as ChatAnthropic sends it), more as blocks."""
    texts = [t for t in texts if t]
    if len(texts) <= 1:
        return texts[0] if texts else None
    return [{"type": "text", "text": t} for t in texts]


def counting_request(messages: Sequence[BaseMessage]) -> tuple[list[ApiMessage], list[str]]:
    """The smallest valid request holding ``messages``: its API messages and system texts."""
    system, api = _split(messages)
    names = {m.tool_call_id: m.name for m in messages if isinstance(m, ToolMessage) and m.name}
    return valid_sequence(api, names), system


def convert_tools(tools: Sequence[Any] | None) -> list[dict[str, Any]] | None:
    """Tools in the API's format: dicts pass through, LangChain tools are converted."""
    if not tools:
        return None
    converted: list[dict[str, Any]] = []
    for tool in tools:
        if isinstance(tool, dict) and ("input_schema" in tool or "type" in tool):
            converted.append(dict(tool))
            continue
        try:  # langchain-anthropic's public converter, so the tools match ChatAnthropic's
            module = importlib.import_module("langchain_anthropic.chat_models")
            converted.append(dict(module.convert_to_anthropic_tool(tool)))
        except ImportError:
            function = convert_to_openai_tool(tool)["function"]
            schema = function.get("parameters", {"type": "object", "properties": {}})
            converted.append(
                {"name": function["name"], "description": function.get("description", ""), "input_schema": schema}
            )
    return converted


# --- ChatAnthropic's format, for the cache-aligned prefix -----------------------------


def _own_format(messages: Sequence[BaseMessage]) -> tuple[SystemParam | None, list[ApiMessage]]:
    """``chat_anthropic_format`` by the own converter: the same request, not byte for byte."""
    system, api = _split(messages)
    return system_param(system), merged(api)


@functools.cache
def _private_formatter() -> Callable[..., Any] | None:
    """langchain-anthropic's private ``_format_messages``; ``None`` if it cannot be had (said once)."""
    module_name, name = _PRIVATE_FORMATTER
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return None
    formatter = getattr(module, name, None)
    if callable(formatter):
        return formatter  # type: ignore[no-any-return]
    warning = "%s.%s is gone (langchain-anthropic changed); cache-aligned prefixes may now miss the prompt cache"
    logger.warning(warning, module_name, name)
    return None


def chat_anthropic_format(messages: Sequence[BaseMessage], model: str) -> tuple[SystemParam | None, list[ApiMessage]]:
    """The ``system`` and ``messages`` that ``ChatAnthropic`` would send for ``messages``.

    Only for the prefix of a cache-aligned request. Without langchain-anthropic
    the own converter is used; if its private formatter is gone or fails, too,
    with a warning.

    Args:
        messages: LangChain messages, system messages included.
        model: The model, for langchain-anthropic's warnings.

    Returns:
        The system parameter (``None`` for none) and the API messages.
    """
    formatter = _private_formatter()
    if formatter is None:
        return _own_format(messages)
    try:
        system, formatted = formatter(list(messages), model=model)
        return (system or None), [dict(m) for m in formatted]
    except Exception as exc:  # a private helper: a change in it may cost the cache hit, never the summary
        warning = "langchain-anthropic could not format the cache-aligned prefix (%r); using the built-in converter"
        logger.warning(warning, exc)
        return _own_format(messages)


MOST_BREAKPOINTS = 4
"""The most blocks with ``cache_control`` the Messages API takes in one request (a top-level one included)."""


def cache_breakpoints(system: Any, tools: Iterable[Any], contents: Iterable[Any]) -> int:
    """How many blocks carry ``cache_control``: of a system prompt, tools, and message contents (tool results' too).

    The API's dicts and LangChain's content blocks have the same shape here.

    Example:
        >>> cache_breakpoints([{"type": "text", "text": "s", "cache_control": {}}], [], ["hi", [{"type": "text"}]])
        1
    """
    blocks: list[Any] = [*(system if isinstance(system, list) else ()), *tools]
    for content in contents:
        for block in content if isinstance(content, list) else ():
            blocks.append(block)
            inner = block.get("content") if isinstance(block, dict) and block.get("type") == "tool_result" else None
            blocks += inner if isinstance(inner, list) else ()
    return sum(isinstance(block, dict) and "cache_control" in block for block in blocks)
