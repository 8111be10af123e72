"""What a model request carries besides the state's messages: its tools (``sent_tools``), messages added.

The middleware adds them, with the system prompt, to the size the trigger
compares with the threshold (``_lc.schemas.ToolSchemas`` counts the tools); a
message an outer middleware adds to one call (``added_messages``) counts too,
and one it edited (``held_as_sent``) keeps the request's compaction out of the
state. (Read by the middleware alone, so ``langchain`` is installed: a
structured output's tools are made by it.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain.agents.structured_output import OutputToolBinding, ToolStrategy
from langchain_core.messages import BaseMessage

from langchain_compaction._lc.identity import same_message
from langchain_compaction._lc.schemas import TOOLS_REMEMBERED
from langchain_compaction.core.bounded import Bounded


def held_as_sent(sent: Sequence[BaseMessage], held: Sequence[BaseMessage], compacted: Sequence[BaseMessage]) -> bool:
    """Whether a request is the state's messages, those it takes out as the state holds them (the summary saw those)."""
    if [m.id for m in sent] != [m.id for m in held]:
        return False
    kept = {m.id for m in compacted}
    # An outer middleware's copy may differ in any field the model is sent
    # (tool-call arguments, a tool result's status, a provider's kwargs), not
    # only the content: it is the state's own when it is the same message.
    return all(a is b or a.id in kept or same_message(a, b) for a, b in zip(sent, held, strict=True))


def added_messages(sent: Sequence[BaseMessage], held: Sequence[BaseMessage]) -> list[BaseMessage]:
    """The messages of a request (``sent``) the state does not hold (``held``): an outer middleware's, for one call."""
    if len(sent) <= len(held) and (not sent or (sent[0].id == held[0].id and sent[-1].id == held[-1].id)):
        return []  # (every call: the common case is told without building the state's ids)
    ids = {m.id for m in held}
    return [m for m in sent if m.id is None or m.id not in ids]


def sent_tools(request: Any) -> tuple[Any, ...]:
    """The tools a request goes out with: its own, and a ``ToolStrategy``'s structured-output tools.

    ``create_agent`` binds those after every middleware has run, so the
    request does not list them; they are sent, counted and read by a prompt
    cache all the same (a cache-aligned summary request sends them too).
    """
    tools = tuple(getattr(request, "tools", ()) or ())
    strategy = getattr(request, "response_format", None)
    if not isinstance(strategy, ToolStrategy):
        return tools
    return (*tools, *map(_output_tool, strategy.schema_specs))


def _output_tool(spec: Any) -> Any:
    """The structured-output tool of ``spec``, made once per spec (the same object each call: counted once)."""
    known = _OUTPUT_TOOLS.get(id(spec))
    if known is not None and known[0] is spec:
        return known[1]
    tool = OutputToolBinding.from_schema_spec(spec).tool
    _OUTPUT_TOOLS.put(id(spec), (spec, tool))
    return tool


_OUTPUT_TOOLS: Bounded[tuple[Any, Any]] = Bounded(TOOLS_REMEMBERED)
"""Structured-output tools made, by their schema spec (held, so that its id is not reused)."""
