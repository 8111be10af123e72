"""A request file's fields besides its messages: what every call sends, and whose API the request is for.

A conversation file may hold a whole request (``formats.Conversation.request``
keeps its fields but ``messages`` and ``system``). With every call, the model
is sent besides the messages the request's tool schemas (``tools``; OpenAI's
older ``functions``), a structured output's schema (OpenAI's
``response_format``, the Responses API's ``text.format``, Anthropic's
``output_config.format`` and its beta ``output_format``) and a system prompt
given apart (the Responses API's ``instructions``). Anthropic's top-level
``system`` is not among them: it is read as the leading system messages, and
counted as such. The command line counts these as the request's fixed part, as
the middleware counts an agent's tools and system prompt. (A Responses API body
holds its messages under ``input``, which ``formats`` does not read: its
fields count in a file that holds them beside ``messages``.)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from langchain_core.messages import SystemMessage

from langchain_compaction._lc.counting import counts_and_core
from langchain_compaction._lc.schemas import ToolSchemas
from langchain_compaction.core.options import CompactionOptions

__all__ = ["anthropic_request", "request_overhead", "sent_schemas"]


def sent_schemas(request: Mapping[str, Any]) -> list[Any]:
    """The schemas ``request`` sends with every call: its tools, and a structured output's JSON schema."""
    schemas = [tool for key in ("tools", "functions") if isinstance(request.get(key), list) for tool in request[key]]
    given = (
        request.get("response_format"),
        _inner(request, "text", "format"),
        _inner(request, "output_config", "format"),
        request.get("output_format"),
    )
    # (A "json_object" or "text" format is a switch, not a schema the model reads.)
    return schemas + [f for f in given if isinstance(f, Mapping) and f.get("type") == "json_schema"]


def request_overhead(request: Mapping[str, Any] | None, options: CompactionOptions) -> int:
    """The tokens ``request`` sends with every call besides its messages (0 for a file of messages alone).

    The schemas are estimated as the middleware estimates an agent's tools
    (``ToolSchemas``), ``instructions`` as a system message, with the options'
    ``token_counter`` if any.
    """
    if not request:
        return 0
    total = ToolSchemas().tokens(sent_schemas(request))
    instructions = request.get("instructions")
    if isinstance(instructions, str) and instructions:
        total += counts_and_core([SystemMessage(instructions)], options)[0][0]
    return total


def anthropic_request(request: Mapping[str, Any] | None) -> bool:
    """Whether a request's own fields say it is for Anthropic's Messages API, whatever its messages are.

    A tool given with ``input_schema`` (OpenAI's have ``parameters``), or an
    ``anthropic_version`` (the body Bedrock and Vertex AI take). A text-only
    request with neither (and no ``system``) reads the same in both formats.
    """
    if not request:
        return False
    tools = request.get("tools")
    return "anthropic_version" in request or (
        isinstance(tools, list) and any(isinstance(tool, Mapping) and "input_schema" in tool for tool in tools)
    )


def _inner(request: Mapping[str, Any], field: str, key: str) -> object:
    """``request[field][key]``, or ``None``."""
    outer = request.get(field)
    return outer.get(key) if isinstance(outer, Mapping) else None
