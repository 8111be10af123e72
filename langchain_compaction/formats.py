"""Conversation files: read and write the formats the command line accepts.

Four formats, detected from the content:

- ``langchain``: LangChain's ``messages_to_dict`` JSON, a list of
  ``{"type": ..., "data": {...}}`` (the shared transcripts' format).
- ``openai``: a list of ``{"role": ..., "content": ...}`` with OpenAI-style
  ``tool_calls`` and ``tool`` messages.
- ``anthropic``: a list of ``{"role": "user"|"assistant", "content": [blocks]}``
  with ``tool_use`` / ``tool_result`` blocks, or ``{"system": ..., "messages": [...]}``.
- ``jsonl``: one message per line in any of the above shapes.

Every problem is reported as one ``ConversationFileError`` (in
``langchain_compaction.errors``) that says what is wrong and where, never as a
traceback from deep inside.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    convert_to_openai_messages,
    messages_from_dict,
    messages_to_dict,
)

from langchain_compaction._lc.convert import is_summary_message
from langchain_compaction._lc.request_file import anthropic_request
from langchain_compaction.errors import ConversationFileError

__all__ = ["Conversation", "ConversationFileError", "Format", "dump_conversation", "parse_conversation"]

Format = Literal["langchain", "openai", "anthropic"]
"""The shape of each message in a file."""


@dataclass(frozen=True, slots=True)
class Conversation:
    """A conversation read from a file.

    Attributes:
        messages: The messages.
        format: The shape of each message.
        jsonl: Whether the file had one message per line.
        originals: For each message, the file's item it was read from (its
            index, -1 for a top-level ``system``, and the item), so messages
            written back whole are written as they were read
            (``dump_conversation``).
    """

    messages: list[BaseMessage]
    format: Format
    jsonl: bool = False
    originals: tuple[tuple[int, object], ...] = ()
    request: dict[str, Any] | None = None
    """For a file that holds an object with its messages under ``messages`` (a whole request), its other
    fields (``model``, ``tools``...; maybe none), written back with it; ``None`` for a list of messages."""


def _shape(item: object, where: str) -> Format:
    if not isinstance(item, dict):
        msg = f"expected a message object, found {type(item).__name__}"
        raise ConversationFileError(msg, where=where)
    if "type" in item and isinstance(item.get("data"), dict):
        return "langchain"
    if "role" in item:
        content = item.get("content")
        if isinstance(content, list) and any(_anthropic_block(b) for b in content):
            return "anthropic"
        return "openai"
    msg = 'a message needs "role" (OpenAI/Anthropic style) or "type" and "data" (LangChain style)'
    raise ConversationFileError(msg, where=where)


# Blocks only Anthropic's format has (OpenAI's are "text", "image_url",
# "input_audio" and "file"; an image with a "source" is Anthropic's).
_ANTHROPIC_BLOCKS = frozenset(
    {"tool_use", "tool_result", "thinking", "redacted_thinking", "document", "search_result", "container_upload"}
    | {"compaction"}  # (Claude's server-side compaction block: what the API wrote for the turns it summarized)
    # Anthropic's server tools (web search and fetch, code execution, MCP): a transcript may hold no other.
    | {"server_tool_use", "mcp_tool_use", "mcp_tool_result", "web_search_tool_result", "web_fetch_tool_result"}
    | {"code_execution_tool_result", "bash_code_execution_tool_result", "text_editor_code_execution_tool_result"}
)


def _openai_only(item: dict[str, Any]) -> bool:
    """Whether ``item`` has what only OpenAI's messages have (a ``tool`` role, ``tool_calls``): the file is OpenAI's."""
    return item.get("role") == "tool" or "tool_calls" in item or "tool_call_id" in item


def _anthropic_block(block: object) -> bool:
    if not isinstance(block, dict):
        return False
    kind = block.get("type")
    if not isinstance(kind, str):
        return False  # (a list or a dict there is no block type: the format is found by other means, or refused)
    return kind in _ANTHROPIC_BLOCKS or (kind == "image" and isinstance(block.get("source"), dict))


def _from_langchain(item: dict[str, Any], where: str) -> BaseMessage:
    try:
        return messages_from_dict([item])[0]
    except Exception as exc:  # pydantic and KeyError messages are clear enough
        msg = f"not a valid LangChain message: {type(exc).__name__}: {str(exc).splitlines()[0]}"
        raise ConversationFileError(msg, where=where) from exc


def _text_of(content: object, where: str) -> str | list[Any]:
    if content is None:
        return ""
    if isinstance(content, (str, list)):
        return content
    msg = f'"content" must be a string or a list of blocks, found {type(content).__name__}'
    raise ConversationFileError(msg, where=where)


def _from_openai(item: dict[str, Any], where: str) -> BaseMessage:
    role = item.get("role")
    content = _text_of(item.get("content"), where)
    if role in ("system", "developer"):
        return SystemMessage(content=content)
    if role == "user":
        return HumanMessage(content=content)
    if role == "assistant":
        calls = []
        for number, call in enumerate(item.get("tool_calls") or []):
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                msg = f'tool_calls[{number}] needs "function": {{"name": ..., "arguments": ...}}'
                raise ConversationFileError(msg, where=where)
            raw = function.get("arguments") or "{}"
            try:
                args = json.loads(raw) if isinstance(raw, str) else raw
            except json.JSONDecodeError:
                args = {"__raw__": raw}
            if not isinstance(args, dict):
                args = {"value": args}
            calls.append({"name": function["name"], "args": args, "id": call.get("id"), "type": "tool_call"})
        if not content:
            # What the assistant said lives elsewhere when it refused, or answered by voice.
            audio = item.get("audio")
            said = item.get("refusal") or (audio.get("transcript") if isinstance(audio, dict) else None)
            content = said if isinstance(said, str) else content
        return AIMessage(content=content, tool_calls=calls)
    if role == "tool":
        call_id = item.get("tool_call_id")
        if not isinstance(call_id, str):
            msg = 'a "tool" message needs a string "tool_call_id"'
            raise ConversationFileError(msg, where=where)
        return ToolMessage(content=content, tool_call_id=call_id, name=item.get("name"))
    msg = f'unknown role {role!r}; use "system", "user", "assistant" or "tool"'
    raise ConversationFileError(msg, where=where)


def _from_anthropic(item: dict[str, Any], where: str) -> list[BaseMessage]:
    role = item.get("role")
    content = _text_of(item.get("content"), where)
    if role == "system":
        return [SystemMessage(content=content)]
    if role not in ("user", "assistant"):
        msg = f'unknown role {role!r}; Anthropic messages are "user" or "assistant"'
        raise ConversationFileError(msg, where=where)
    if isinstance(content, str):
        return [HumanMessage(content=content) if role == "user" else AIMessage(content=content)]
    if role == "assistant":
        calls = [
            {"name": str(b.get("name")), "args": b.get("input") or {}, "id": b.get("id"), "type": "tool_call"}
            for b in content
            if isinstance(b, dict) and b.get("type") == "tool_use"
        ]
        return [AIMessage(content=content, tool_calls=calls)]
    out: list[BaseMessage] = []
    rest: list[Any] = []
    for block in content:
        if isinstance(block, dict) and block.get("type") == "tool_result":
            out.append(
                ToolMessage(
                    content=block.get("content") or "",
                    tool_call_id=str(block.get("tool_use_id")),
                    status="error" if block.get("is_error") else "success",
                )
            )
        else:
            rest.append(block)
    if rest or not out:  # (an empty turn stays one: nothing read is dropped)
        out.append(HumanMessage(content=rest))
    return out


def _convert(item: dict[str, Any], actual: Format, where: str) -> list[BaseMessage]:
    if actual == "langchain":
        return [_from_langchain(item, where)]
    if actual == "anthropic":
        return _from_anthropic(item, where)
    return [_from_openai(item, where)]


def _parses(line: str) -> bool:
    try:
        json.loads(line)
    except (ValueError, RecursionError):  # (JSONDecodeError is a ValueError)
        return False
    return True


def _text(data: bytes | str, name: str) -> str:
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
        text = text.removeprefix("\ufeff")  # the byte-order mark Windows editors write
    except UnicodeDecodeError as exc:
        msg = f"not UTF-8 text (byte {exc.start}); save the file as UTF-8 JSON"
        raise ConversationFileError(msg, where=name) from exc
    if not text.strip():
        raise ConversationFileError("the file is empty; expected a JSON list of messages", where=name)
    return text


def _json_lines(text: str, name: str) -> list[tuple[object, str]]:
    items: list[tuple[object, str]] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{name}: line {number}"
        try:
            items.append((json.loads(line), where))
        except RecursionError as deep:
            raise ConversationFileError("the JSON is nested too deeply to be a message", where=where) from deep
        except json.JSONDecodeError as exc:
            raise ConversationFileError(f"invalid JSON at column {exc.colno}: {exc.msg}", where=where) from exc
        except ValueError as exc:
            raise ConversationFileError(_unreadable(exc), where=where) from exc
    return items


def _unreadable(error: ValueError) -> str:
    """What a JSON document that parses but cannot be read says (a number of more digits than Python converts)."""
    return f"a value cannot be read ({str(error).split(':', 1)[0]}); a number that long is no message field: remove it"


def _items(text: str, name: str) -> tuple[list[tuple[object, str]], object, bool, dict[str, Any] | None]:
    """The file's messages, each with where it is; its top-level system; whether it is JSON Lines; a request's fields.

    A file may hold a whole request (``{"model": ..., "tools": ..., "messages": [...]}``): its other
    fields are kept to be written back.
    """
    stripped = text.strip()
    try:
        document = json.loads(stripped)
    except RecursionError as exc:
        raise ConversationFileError("the JSON is nested too deeply to be a conversation", where=name) from exc
    except json.JSONDecodeError as exc:
        if "\n" not in stripped or not _parses(stripped.splitlines()[0]):
            msg = f"invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"
            raise ConversationFileError(msg, where=name) from exc
        return _json_lines(text, name), None, True, None
    except ValueError as exc:
        raise ConversationFileError(_unreadable(exc), where=name) from exc
    system: object = None
    request: dict[str, Any] | None = None
    if isinstance(document, dict) and isinstance(document.get("messages"), list):
        system = document.get("system")
        request = {k: v for k, v in document.items() if k not in ("messages", "system")}
        document = document["messages"]
    if isinstance(document, dict) and ("role" in document or "type" in document):
        return [(document, f"{name}: line 1")], None, True, None  # JSON Lines of one message
    if not isinstance(document, list):
        msg = f'expected a JSON list of messages (or {{"messages": [...]}}), found {type(document).__name__}'
        raise ConversationFileError(msg, where=name)
    return [(item, f"{name}: message {number}") for number, item in enumerate(document, 1)], system, False, request


def _file_shape(items: list[tuple[object, str]]) -> tuple[Format, list[Format]]:
    shapes = [_shape(item, where) for item, where in items]
    shape = shapes[0]
    for actual, (_, where) in zip(shapes, items):
        if (actual == "langchain") != (shape == "langchain"):
            msg = f"this message is {actual}-style but the file started {shape}-style; use one style per file"
            raise ConversationFileError(msg, where=where)
    return shape, shapes


def _system_messages(system: object, name: str) -> list[SystemMessage]:
    """The top-level ``system`` of an Anthropic-style file: the system prompt, and a summary written there apart.

    ``compact`` writes a summary as a block of its own: read back as part of
    the system prompt, it would be kept word for word, and the next summary
    added beside it, not made its update.
    """
    if not isinstance(system, (str, list)) or (
        isinstance(system, list) and not all(isinstance(b, (str, dict)) for b in system)
    ):
        raise ConversationFileError('"system" must be a string or a list of text blocks', where=name)
    if isinstance(system, str):
        return [SystemMessage(content=system)]
    out: list[SystemMessage] = []
    prompt: list[Any] = []
    for block in system:
        text = block if isinstance(block, str) else block.get("text")
        if isinstance(text, str) and is_summary_message(SystemMessage(content=text)):
            if prompt:
                out.append(SystemMessage(content=prompt))
                prompt = []
            out.append(SystemMessage(content=text))
        else:
            prompt.append(block)
    if prompt:
        out.append(SystemMessage(content=prompt))
    return out


def _converted(item: dict[str, Any], kind: Format, where: str) -> list[BaseMessage]:
    try:
        return _convert(item, kind, where)
    except ConversationFileError:
        raise
    except (TypeError, ValueError, AttributeError, KeyError) as exc:
        # A field of the wrong type (pydantic's validation error, a number
        # where a list belongs): one line that says where.
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConversationFileError(f"not a valid {kind}-style message: {first}", where=where) from exc


def parse_conversation(data: bytes | str, *, name: str = "input") -> Conversation:
    """Read a conversation from the bytes of a file.

    Args:
        data: The file's content.
        name: The file's name, for error messages.

    Returns:
        The conversation.

    Raises:
        ConversationFileError: The content is not a conversation in any of
            the accepted formats; the message says what and where.
    """
    items, system, jsonl, request = _items(_text(data, name), name)
    if not items:
        raise ConversationFileError("the file holds no messages", where=name)
    shape, shapes = _file_shape(items)
    messages: list[BaseMessage] = [] if system is None else [*_system_messages(system, name)]
    originals: list[tuple[int, object]] = [(-1, system)] * len(messages)
    # (Claude's thinking blocks kept in an OpenAI file's replies, as convert_to_openai_messages writes them.)
    openai = any(isinstance(item, dict) and _openai_only(item) for item, _ in items)
    if (system is not None or "anthropic" in shapes or anthropic_request(request)) and not openai:
        shape = "anthropic"
    elif openai:
        shape, shapes = "openai", ["openai" if kind == "anthropic" else kind for kind in shapes]
    for number, (actual, (item, where)) in enumerate(zip(shapes, items)):
        assert isinstance(item, dict)  # _shape checked it
        kind: Format = "anthropic" if shape == "anthropic" and actual != "langchain" else actual
        read = _converted(item, kind, where)
        messages.extend(read)
        originals += [(number, item)] * len(read)
    return Conversation(messages, shape, jsonl, tuple(originals), request)


def _to_anthropic(messages: Sequence[BaseMessage], *, inline: bool = False) -> list[dict[str, Any]] | dict[str, Any]:
    """Anthropic's shape: system messages go to a top-level ``system`` list (``inline``: stay lines of their own)."""
    out: list[dict[str, Any]] = []
    system: list[Any] = []
    for message in messages:
        if isinstance(message, SystemMessage) and inline:
            out.append({"role": "system", "content": message.content})
        elif isinstance(message, SystemMessage):
            content = message.content
            system += ([{"type": "text", "text": content}] if content else []) if isinstance(content, str) else content
        elif isinstance(message, ToolMessage):
            block = {
                "type": "tool_result",
                "tool_use_id": message.tool_call_id,
                "content": message.content,
                "is_error": message.status == "error",
            }
            if out and out[-1]["role"] == "user" and isinstance(out[-1]["content"], list):
                out[-1]["content"].append(block)
            else:
                out.append({"role": "user", "content": [block]})
        elif isinstance(message, AIMessage):
            blocks: list[Any] = (
                [{"type": "text", "text": message.content}]
                if isinstance(message.content, str) and message.content
                else [b for b in message.content if not (isinstance(b, dict) and b.get("type") == "tool_use")]
                if isinstance(message.content, list)
                else []
            )
            blocks += [
                {"type": "tool_use", "id": c["id"], "name": c["name"], "input": c["args"]} for c in message.tool_calls
            ]
            out.append({"role": "assistant", "content": blocks})
        else:
            out.append({"role": "user", "content": message.content})
    return {"system": system, "messages": out} if system else out


def dump_conversation(
    messages: Sequence[BaseMessage], shape: Format, *, jsonl: bool = False, read: Conversation | None = None
) -> str:
    """Write messages in ``shape`` (the input's format, for round trips).

    Args:
        messages: The messages.
        shape: The format to write.
        jsonl: One message per line instead of one JSON list.
        read: The conversation ``messages`` were made from: its messages
            that are written back whole (every message read from one item of
            the file, in order) are written as the file had them, byte for
            byte in meaning (a "developer" role, a name, raw tool arguments).

    Returns:
        The file's text.
    """
    items: Any = messages_to_dict(list(messages)) if shape == "langchain" else _written(messages, shape, read)
    if read is not None and read.request is not None and not jsonl:
        # A whole request (model, tools, ...; or just its messages): written back as an object, its messages compacted.
        items = {**read.request, **(items if isinstance(items, dict) else {"messages": items})}
    if jsonl:
        if isinstance(items, dict):  # JSON Lines has no place for a top-level system
            items = [{"role": "system", "content": items["system"]}, *items["messages"]]
        return "".join(_json(item) + "\n" for item in items)
    return _json(items, indent=2) + "\n"


def _written(messages: Sequence[BaseMessage], shape: Format, read: Conversation | None) -> list[Any] | dict[str, Any]:
    """The items of an OpenAI- or Anthropic-style file: the file's own where a whole item is written back."""
    origin = {id(m): (m, *o) for m, o in zip(read.messages, read.originals)} if read is not None else {}
    sizes = Counter(number for number, _ in read.originals) if read is not None else Counter()
    system: list[Any] = []
    out: list[Any] = []
    fresh: list[BaseMessage] = []
    # A file that gives its system prompt as a line (JSON Lines, or a "system" item) gets a summary as a line
    # of its own, in its place: hoisted to a top-level "system", it went before the prompt and was not read back.
    inline = read is not None and (
        read.jsonl or any(n >= 0 and isinstance(m, SystemMessage) for m, (n, _) in zip(read.messages, read.originals))
    )

    def flush() -> None:
        converted = convert_to_openai_messages(fresh) if shape == "openai" else _to_anthropic(fresh, inline=inline)
        if isinstance(converted, dict):
            system.extend(converted["system"])
            converted = converted["messages"]
        out.extend(converted)
        fresh.clear()

    index = 0
    while index < len(messages):
        whole = _whole_item(messages, index, origin, sizes)
        if whole is None:
            fresh.append(messages[index])
            index += 1
            continue
        if fresh:
            flush()
        count, item = whole
        out.append(item)
        index += count
    if fresh:
        flush()
    return {"system": system, "messages": out} if system else out


def _whole_item(
    messages: Sequence[BaseMessage],
    index: int,
    origin: dict[int, tuple[BaseMessage, int, object]],
    sizes: Counter[int],
) -> tuple[int, object] | None:
    """``(how many messages, the item)`` when ``messages[index:]`` starts with all of one item's, else ``None``."""
    found = origin.get(id(messages[index]))
    if found is None or found[0] is not messages[index] or found[1] < 0:
        return None  # a new message, or the top-level system prompt (written to "system")
    number, item = found[1], found[2]
    count = sizes[number]
    run = messages[index : index + count]
    if len(run) < count or any((o := origin.get(id(m))) is None or o[0] is not m or o[1] != number for m in run):
        return None
    return count, item


def _json(value: Any, indent: int | None = None) -> str:
    """``value`` as JSON that UTF-8 can write: text as it is, or escaped when it holds a lone surrogate.

    (JSON may escape one, ``"\\ud800"``, and Python reads it; UTF-8 cannot hold it.)
    """
    text = json.dumps(value, ensure_ascii=False, indent=indent)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return json.dumps(value, ensure_ascii=True, indent=indent)
    return text
