"""LangChain messages into the core's message form (inbound only), and the marks.

Nothing here builds a LangChain message except what a compaction writes (the
summary, and the user turn that may follow it): the kept messages are always
the caller's own objects, sliced from the caller's list.

What makes a message the same message (its fingerprint) is ``_lc.identity``'s.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    RemoveMessage,
    SystemMessage,
    ToolMessage,
)

from langchain_compaction._lc.attachments import ATTACHMENT_BLOCKS, attachment_part, lifted
from langchain_compaction._lc.call_blocks import CALL_BLOCKS, answering, block_calls, output_key
from langchain_compaction.core.effects import breathe
from langchain_compaction.core.layout import BRIDGE_REQUEST_KEY
from langchain_compaction.core.prompts import LANGCHAIN_SUMMARY_PREFIX, SUMMARY_HEADER
from langchain_compaction.core.record import ANCHOR_KEY, KEPT_BEFORE_KEY, KEPT_FROM_KEY
from langchain_compaction.core.tokens import estimate_tokens
from langchain_compaction.core.types import Message, Part, Role, ToolCall
from langchain_compaction.errors import InvalidMessagesError

SUMMARY_MARK = "langchain_compaction"
"""Key in ``additional_kwargs`` that marks a message this library wrote."""

PIN_KEY = "compaction_pin"
"""Key in a message's ``additional_kwargs`` that pins it: ``{"compaction_pin": True}`` keeps it verbatim."""

_REASONING_BLOCKS = frozenset({"thinking", "reasoning", "redacted_thinking", "reasoning_content"})
"""Reasoning as providers write it: Anthropic's (``thinking``, ``redacted_thinking``), LangChain's v1
``reasoning``, Bedrock Converse's ``reasoning_content`` (its text and signature one level down)."""
_TEXT_BLOCKS = frozenset({"text", "input_text", "output_text"})
_TOOL_USE_BLOCKS = CALL_BLOCKS.keys() | {"tool_call", "function_call", "custom_tool_call"}
"""Block types that may repeat a call of ``tool_calls`` (the content blocks of calls, and the ones LangChain and
OpenAI write for a function call)."""
_CHAT_ROLES: dict[str, Role] = {
    "user": "user",
    "human": "user",
    "assistant": "assistant",
    "ai": "assistant",
    "model": "assistant",
    "system": "system",
    "developer": "system",
    "tool": "tool",
    "function": "tool",
}


def json_text(value: Any, *, sort_keys: bool = True, tight: bool = False) -> str:
    """``value`` as JSON text, keys sorted unless told, without spaces if ``tight`` (``str(value)`` if no JSON data).

    Raises:
        InvalidMessagesError: The value is nested too deeply to write (about
            a thousand levels: ``json.dumps`` gives up, as a provider's client would).
    """
    try:
        return json.dumps(
            value, ensure_ascii=False, sort_keys=sort_keys, default=str, separators=(",", ":") if tight else None
        )
    except RecursionError:
        msg = "a value (in a message or a tool's schema) is nested too deeply to write as JSON, which no provider "
        msg += "can be sent: flatten it"
        raise InvalidMessagesError(msg) from None
    except (TypeError, ValueError):
        return str(value)


def _reasoning_block(block: dict[str, Any], kind: str | None) -> dict[str, Any] | None:
    """The reasoning block ``block`` is or wraps (LangChain's v1 ``non_standard`` block); ``None`` for another block.

    In v1 content (``output_version="v1"``, ``content_blocks``) Claude's
    redacted thinking, and its thinking on a message that names no provider,
    is a ``non_standard`` block holding Anthropic's own block as its ``value``.
    """
    if kind in _REASONING_BLOCKS:
        return block
    value = block.get("value") if kind == "non_standard" else None
    return value if isinstance(value, dict) and value.get("type") in _REASONING_BLOCKS else None


def _reasoning_part(block: dict[str, Any], kind: str) -> Part | None:
    """A reasoning block's part; ``signed`` when it is Claude's, which the cut keeps with its tool loop.

    Claude's thinking carries a signature (Anthropic's block, a v1 block's
    extras, Bedrock's nested block) or is redacted; another provider's
    thinking (Gemini's unsigned ``thinking``) and OpenAI's reasoning have no
    such rule. Claude's thinking may have no readable text (redacted, or
    shown as ``display: "omitted"``: an empty text, the signature carrying
    it), but it opens a turn as thinking does (core.cut): its part is kept,
    empty; an unsigned block with no text leaves none.
    """
    nested = block.get("reasoning_content")
    inner: dict[str, Any] = nested if isinstance(nested, dict) else {}
    extras = block.get("extras")
    extra: dict[str, Any] = extras if isinstance(extras, dict) else {}
    text = block.get("thinking") or block.get("reasoning") or block.get("text") or inner.get("text") or ""
    if not text and isinstance(block.get("summary"), list):
        text = " ".join(str(s.get("text", "")) for s in block["summary"] if isinstance(s, dict))
    redacted = kind == "redacted_thinking" or bool(inner.get("redacted_content") or extra.get("redacted_content"))
    signed = redacted or bool(block.get("signature") or inner.get("signature") or extra.get("signature"))
    return Part("reasoning", str(text), signed=signed) if text or signed else None


def _block_part(block: Any, skip_ids: frozenset[str]) -> Part | None:
    if isinstance(block, str):
        return Part("text", block)
    if not isinstance(block, dict):
        return Part("data", str(block))
    kind = block.get("type")
    if kind is not None and not isinstance(kind, str):
        return Part("data", json_text(block))  # (a list or a dict there is no block type: shown, not looked up)
    # (OpenAI's Responses API writes a message's text as input_text and output_text parts.)
    if kind in _TEXT_BLOCKS or (kind is None and isinstance(block.get("text"), str)):
        text = block.get("text")
        return Part("text", "" if text is None else str(text))  # (a block with no text is not the word "None")
    if (reasoning := _reasoning_block(block, kind)) is not None:
        return _reasoning_part(reasoning, str(reasoning["type"]))
    if kind in ATTACHMENT_BLOCKS:
        return attachment_part(block, str(kind))
    if kind == "image_generation_call" and block.get("result"):
        # An image OpenAI's Responses API generated: an image's cost, never its base64 as text.
        media = f"image/{block['output_format']}" if block.get("output_format") else None
        return attachment_part({"type": "image", "base64": block["result"], "mime_type": media}, "image")
    if kind in _TOOL_USE_BLOCKS and (str(block.get("id")) in skip_ids or str(block.get("call_id")) in skip_ids):
        # The same call is in ``tool_calls``: count it once. (OpenAI's Responses
        # API names the call by ``call_id``; its ``id`` is the output item's.)
        return None
    if kind == "compaction":
        return Part("compaction", str(block.get("content") or block.get("text") or ""))
    return Part("data", json_text(block))


def _block_parts(block: Any, skip_ids: frozenset[str]) -> tuple[Part, ...]:
    """``_block_part``, and an unknown block's nested attachments as parts of their own (``lifted``)."""
    part = _block_part(block, skip_ids)
    if part is None:
        return ()
    kind = block.get("type") if isinstance(block, dict) else None
    if part.kind == "text" and isinstance(block, dict):
        cited = _sources(block)
        return (part, Part("data", f"sources: {cited}")) if cited else (part,)
    if part.kind != "data" or not isinstance(block, dict) or (isinstance(kind, str) and kind in ATTACHMENT_BLOCKS):
        return (part,)
    nested: list[Part] = []
    inner = lifted(block, nested)
    return (Part("data", json_text(inner)), *nested) if nested else (part,)


def _sources(block: dict[str, Any]) -> str:
    """The sources a text block cites ("title <url>", each once); "" when it cites none.

    LangChain's ``citation`` and OpenAI's ``url_citation`` annotations,
    Anthropic's ``citations``: without them a summary cannot say where a fact
    came from.
    """
    found: dict[str, None] = {}
    for key in ("annotations", "citations"):
        notes = block.get(key)
        for note in notes if isinstance(notes, list) else ():
            if not isinstance(note, dict):
                continue
            where = note.get("url") or note.get("source")
            title = note.get("title") or note.get("document_title")
            if isinstance(where, str) and where:
                found[f"{title} <{where}>" if isinstance(title, str) and title else where] = None
            elif isinstance(title, str) and title:
                found[title] = None
    return "; ".join(found)


def _parts(content: Any, skip_ids: frozenset[str] = frozenset()) -> tuple[Part, ...]:
    if isinstance(content, str):
        return (Part("text", content),) if content else ()
    if isinstance(content, list):
        return tuple(part for block in content for part in _block_parts(block, skip_ids))
    if content is None:
        return ()
    return (Part("data", json_text(content)),)


def is_summary_message(message: BaseMessage) -> bool:
    """Whether ``message`` is a summary written by this library."""
    if not isinstance(message, SystemMessage):
        return False
    if message.additional_kwargs.get(SUMMARY_MARK):
        return True
    content = message.content
    return isinstance(content, str) and content.startswith(SUMMARY_HEADER)


BRIDGE_TEXT = "(The conversation continues here; the summary above covers what came before.)"
"""Content of the user turn put after the summary when the kept part starts otherwise."""
BRIDGE_REQUEST_INTRO = "The request being worked on, in the user's words:"
"""What introduces the user's request in a bridge that repeats it."""


def is_bridge_message(message: BaseMessage) -> bool:
    """Whether ``message`` is the user turn this library put after a summary."""
    if not isinstance(message, HumanMessage):
        return False
    mark = message.additional_kwargs.get(SUMMARY_MARK)
    return isinstance(mark, dict) and mark.get("kind") == "bridge"


def is_langchain_summary(message: BaseMessage) -> bool:
    """Whether ``message`` is the summary LangChain's ``SummarizationMiddleware`` wrote (a user turn)."""
    if not isinstance(message, HumanMessage):
        return False
    if message.additional_kwargs.get("lc_source") == "summarization":
        return True
    content = message.content
    return isinstance(content, str) and content.startswith(LANGCHAIN_SUMMARY_PREFIX)


def is_compaction_message(message: BaseMessage) -> bool:
    """Whether ``message`` was written by this library (a summary or its bridge)."""
    return is_summary_message(message) or is_bridge_message(message)


def _usage_total(message: AIMessage, parts: tuple[Part, ...]) -> int:
    """What the reply's usage says the next request starts from: its input, and its output as it is sent back.

    Reasoning tokens (``output_token_details.reasoning``: OpenAI's o-series
    and GPT-5, Gemini's thinking, Claude's thinking) are billed as output but
    not sent again as such: only the reasoning the reply carries is, counted
    here by its text.
    """
    usage = message.usage_metadata
    if not usage:
        return 0
    output = int(usage.get("output_tokens") or 0)
    details = usage.get("output_token_details") or {}
    reasoning = int(details.get("reasoning") or 0) if isinstance(details, Mapping) else 0
    if reasoning:
        carried = sum(estimate_tokens(p.text) for p in parts if p.kind == "reasoning" and not p.unsent)
        output = max(output - reasoning, 0) + min(carried, reasoning)
    return int(usage.get("input_tokens") or 0) + output


def _assistant(message: AIMessage) -> Message:
    calls = tuple(
        # In the model's order: it names what a call is about first (``core.calls.key_argument``).
        ToolCall(call.get("id"), str(call.get("name") or ""), json_text(call.get("args", {}), sort_keys=False))
        for call in message.tool_calls
    ) + tuple(
        ToolCall(call.get("id"), str(call.get("name") or ""), str(call.get("args") or ""))
        for call in message.invalid_tool_calls
    )
    skip = frozenset(str(c.id) for c in calls if c.id)
    own, results = _answers(message.content)
    if isinstance(own, list):  # (most replies are a string: nothing to look through)
        # A call only a block writes (``_lc.call_blocks``): answered by a user turn's block (``_user``), or
        # by the reply that continues a paused turn (its server tool's result: this reply's ``results``).
        calls += tuple(
            ToolCall(ident, name, arguments if isinstance(arguments, str) else json_text(arguments, sort_keys=False))
            for ident, name, arguments in block_calls(own, skip)
        )
        skip = frozenset(str(c.id) for c in calls if c.id)
    parts = _parts(own, skip)
    legacy = message.additional_kwargs.get("function_call")
    if isinstance(legacy, dict) and not calls:
        # OpenAI's legacy function calling: the call is shown and counted (a part, not a tool call: its
        # result, a FunctionMessage, carries no call id to pair it by).
        parts = (*parts, Part("data", f"function_call {legacy.get('name', '')}({legacy.get('arguments', '')})"))
    thought = message.additional_kwargs.get("reasoning_content")
    if isinstance(thought, str) and thought.strip():
        parts = (Part("reasoning", thought, unsent=True), *parts)  # (thought before it answered)
    refusal = message.additional_kwargs.get("refusal")
    if isinstance(refusal, str) and refusal.strip():
        parts = (*parts, Part("text", refusal))  # (ChatOpenAI keeps a refusal there, the content empty)
    used = _usage_total(message, parts)
    return Message("assistant", parts, calls, name=message.name, id=message.id, reported_tokens=used, results=results)


def _text_of(mark: dict[str, Any], key: str) -> str | None:
    value = mark.get(key)
    return value if isinstance(value, str) else None


def _system(message: SystemMessage) -> Message:
    if not is_summary_message(message):
        return Message("system", _parts(message.content), id=message.id)
    raw = message.additional_kwargs.get(SUMMARY_MARK)
    mark = raw if isinstance(raw, dict) else {}
    kept = mark.get(KEPT_BEFORE_KEY)
    return Message(
        "system",
        _parts(message.content),
        is_summary=True,
        id=message.id,
        written_after=_text_of(mark, ANCHOR_KEY),
        kept_from=_text_of(mark, KEPT_FROM_KEY),
        kept_before=tuple(v for v in kept if isinstance(v, str)) if isinstance(kept, list) else (),
        mark=mark,
    )


def to_core(message: object, index: int = 0) -> Message:
    """Convert one LangChain message into the core's form.

    Args:
        message: A ``BaseMessage``.
        index: Its position, for the error message.

    Returns:
        The core message.

    Raises:
        InvalidMessagesError: ``message`` is not a ``BaseMessage``.
    """
    breathe()  # called per message: on the worker thread, let the event loop in
    if not isinstance(message, BaseMessage):
        if isinstance(message, dict) and (message.get("type") == "remove" or SUMMARY_MARK in str(message)):
            # A compaction's own update, appended as it was written: only the
            # add_messages reducer turns it into messages (and removes the old list).
            msg = (
                f"messages[{index}] is a compaction's update kept as a dict: the state's messages key does "
                "not use the add_messages reducer; declare it Annotated[list[AnyMessage], add_messages] "
                "(langgraph.graph.message) or use MessagesState"
            )
            raise InvalidMessagesError(msg, index=index)
        msg = (
            f"messages[{index}] is a {type(message).__name__}, not a LangChain message; "
            "pass BaseMessage objects (langchain_core.messages.convert_to_messages converts "
            "dicts, tuples and strings)"
        )
        raise InvalidMessagesError(msg, index=index)
    if isinstance(message, RemoveMessage):
        msg = (
            f"messages[{index}] is a RemoveMessage: an instruction to the add_messages reducer, not a message of the "
            "conversation; apply it first (langgraph.graph.message.add_messages(messages, [...])), then compact"
        )
        raise InvalidMessagesError(msg, index=index)
    core = _convert(message)
    extra = message.additional_kwargs
    if not extra or core.mark:
        return core
    mark = extra.get(SUMMARY_MARK)
    pinned = extra.get(PIN_KEY) is True
    if pinned or isinstance(mark, dict):
        return replace(core, pinned=pinned, mark=mark if isinstance(mark, dict) else {})
    return core


def _convert(message: BaseMessage) -> Message:
    if isinstance(message, AIMessage):
        return _assistant(message)
    if isinstance(message, SystemMessage):
        return _system(message)
    if isinstance(message, HumanMessage):
        if is_bridge_message(message):
            # Part of the previous compaction's output: replaced, never summarized.
            mark = message.additional_kwargs[SUMMARY_MARK]
            return Message("user", _parts(message.content), is_summary=True, label="bridge", id=message.id, mark=mark)
        if is_langchain_summary(message):
            # Users migrate from LangChain's middleware: its summary is updated, not read as the user's goal.
            label = "langchain summary"
            return Message("user", _parts(message.content), is_summary=True, label=label, id=message.id)
        return _user(message)
    if isinstance(message, ToolMessage):
        return Message(
            "tool",
            _parts(message.content),
            tool_call_id=message.tool_call_id,
            name=message.name,
            is_error=message.status == "error",
            id=message.id,
        )
    if isinstance(message, FunctionMessage):
        # A legacy function result: it must stay with the call before it.
        return Message("tool", _parts(message.content), name=message.name, id=message.id)
    if isinstance(message, ChatMessage):
        role = _CHAT_ROLES.get(message.role.lower(), "other")
        return Message(role, _parts(message.content), label=message.role, id=message.id)
    return Message("other", _parts(message.content), label=message.type, id=message.id)


def _user(message: HumanMessage) -> Message:
    """A user turn; its blocks that answer calls (``_lc.call_blocks``) are its ``results``, shown as the tools'."""
    own, results = _answers(message.content)
    return Message("user", _parts(own), name=message.name, id=message.id, results=results)


def _answers(content: Any) -> tuple[Any, tuple[Message, ...]]:
    """``content`` without its blocks that answer another message's calls (``answering``), and those as results."""
    found = answering(content) if isinstance(content, list) else []
    if not found:
        return content, ()
    taken = {id(block) for block, _ in found}
    return [b for b in content if id(b) not in taken], tuple(_block_result(block, ident) for block, ident in found)


def _block_result(block: dict[str, Any], ident: str) -> Message:
    """A block that answers call ``ident``, as a tool result: its output; the block itself, pinned, if it has none."""
    failed = block.get("is_error") is True or block.get("status") == "failed"
    if not (key := output_key(block)):
        return Message("tool", _parts([block]), tool_call_id=ident, is_error=failed, pinned=True)
    return Message("tool", _parts(block.get(key)), tool_call_id=ident, is_error=failed)


def cleared_copy(message: BaseMessage, texts: Mapping[int | None, str], tokens: int) -> BaseMessage:
    """A copy of ``message`` (same id) whose tool outputs a clearing names are its placeholders, marked as cleared.

    ``texts``: per output, its placeholder; ``None`` for the whole content (a
    tool message), else a result block's place among the turn's results (as
    ``_answers`` reads them), whose output it becomes (a ``tool_result``'s
    ``content``, an ``apply_patch_call_output``'s ``output``; its call id,
    ``is_error`` and other keys kept, every other block the same object).
    ``tokens``: the message's size, unless it was cleared before (the mark
    keeps its first).
    """
    earlier = message.additional_kwargs.get(SUMMARY_MARK)
    if isinstance(earlier, dict) and earlier.get("kind") == "cleared" and isinstance(earlier.get("tokens"), int):
        tokens = earlier["tokens"]
    content: Any = texts.get(None)
    if content is None:
        content = list(message.content)
        places = {id(block): number for number, (block, _) in enumerate(answering(content))}
        for at, block in enumerate(content):
            if places.get(id(block), -1) in texts and (key := output_key(block)):
                content[at] = {**block, key: texts[places[id(block)]]}
    mark = {"kind": "cleared", "tokens": tokens}
    return message.model_copy(
        update={"content": content, "additional_kwargs": {**message.additional_kwargs, SUMMARY_MARK: mark}}
    )


def to_core_list(messages: Sequence[object]) -> list[Message]:
    """Convert a whole list; see ``to_core``."""
    return [to_core(m, i) for i, m in enumerate(message_list(messages))]


def bridge_message(request: str = "", note: str = "") -> HumanMessage:
    """The user turn that follows a summary when the kept part starts otherwise.

    Anthropic's Messages API rejects a conversation whose first turn is not
    the user's (the summary itself goes into the system prompt), and an agent
    compacted mid-loop keeps an assistant tool call first. With ``request``
    (``core.layout.open_request``), the turn repeats the user's request the
    loop works on, and its mark carries it to the next bridge; ``note`` tells
    the model of a tool's output the summary took unread (``core.layout.unread_note``).
    """
    mark: dict[str, Any] = {"kind": "bridge", "version": 1}
    if request:
        mark[BRIDGE_REQUEST_KEY] = request
    asked = f"{BRIDGE_REQUEST_INTRO}\n{request}" if request else ""
    return HumanMessage(
        content="\n\n".join(text for text in (BRIDGE_TEXT, note, asked) if text),
        id=f"compaction-bridge-{uuid.uuid4().hex}",
        additional_kwargs={SUMMARY_MARK: mark},
    )


def as_dict(message: BaseMessage) -> dict[str, Any]:
    """A message this library wrote, as the dict ``convert_to_messages`` turns back into it."""
    return {
        "type": message.type,
        "content": message.content,
        "id": message.id,
        "additional_kwargs": dict(message.additional_kwargs),
    }


def summary_message(content: str, mark: dict[str, Any] | None = None, message_id: str | None = None) -> SystemMessage:
    """The system message that carries a summary, with its mark (the conversation's record, ``core.record``)."""
    return SystemMessage(
        content=content,
        id=message_id or f"compaction-summary-{uuid.uuid4().hex}",
        additional_kwargs={SUMMARY_MARK: mark if mark is not None else {"kind": "summary", "version": 2}},
    )


def message_list(messages: object) -> Sequence[BaseMessage]:
    """``messages`` if it is a list of messages (a sequence, not text), else the error that says what to pass."""
    if isinstance(messages, BaseMessage):
        msg = f"messages is one {type(messages).__name__}, not a list of messages; pass [message]"
        raise InvalidMessagesError(msg)
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        msg = (
            f"messages is a {type(messages).__name__}, not a list of messages; pass a list of "
            "LangChain messages (convert_to_messages converts dicts, tuples and strings)"
        )
        raise InvalidMessagesError(msg)
    return messages
