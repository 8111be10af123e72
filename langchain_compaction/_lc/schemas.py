"""The tokens tool schemas take in a request: one estimate for the middleware's tools and a request file's.

Needs ``langchain-core`` alone (the command line counts a request file's
tools without the ``[agents]`` extra); the middleware's request reading, which
needs ``langchain``, is ``_lc.overhead``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.utils.function_calling import convert_to_openai_tool

from langchain_compaction._lc.convert import json_text
from langchain_compaction.core.bounded import Bounded
from langchain_compaction.core.tokens import estimate_tokens

TOOLS_REMEMBERED = 512
"""Tool schemas whose token counts a ``ToolSchemas`` keeps."""

TOOL_SCHEMA_OVERHEAD_TOKENS = 8
"""Per-tool framing a provider adds around each schema."""


class ToolSchemas:
    """The tokens the tool schemas of a request take, each tool counted once (bounded).

    A tool object is counted once, and held so that its id is not reused (two
    tools of one name may differ in their parameters: a per-conversation enum
    of files); a dict schema by its text. The schema is estimated as a
    provider receives it (name, description, JSON-schema parameters) as JSON
    text.

    Example:
        >>> schema = {"name": "read_file", "description": "Read a file.", "input_schema": {"type": "object"}}
        >>> ToolSchemas().tokens([schema]) > TOOL_SCHEMA_OVERHEAD_TOKENS
        True
    """

    def __init__(self) -> None:
        self._known: Bounded[tuple[object, int]] = Bounded(TOOLS_REMEMBERED)

    def tokens(self, tools: Sequence[Any]) -> int:
        """The tokens ``tools`` take in a request."""
        total = 0
        for tool in tools:
            # (A dict is a schema already; a tool, a function or a model class is converted as bind_tools would.)
            schema = json_text(tool) if isinstance(tool, Mapping) else None
            key: object = id(tool) if schema is None else schema
            known = self._known.get(key)
            if known is not None and (schema is not None or known[0] is tool):
                total += known[1]
                continue
            text = schema if schema is not None else _converted(tool)
            tokens = TOOL_SCHEMA_OVERHEAD_TOKENS + estimate_tokens(text)
            self._known.put(key, (tool, tokens))
            total += tokens
        return total


def _converted(tool: Any) -> str:
    """The schema of a tool that is no dict, as a provider receives it; its text when it cannot be converted."""
    try:
        return json_text(convert_to_openai_tool(tool))
    except (TypeError, ValueError):
        return json_text(tool)
