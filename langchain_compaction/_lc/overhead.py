"""What a model request carries besides the state's messages: its tools (``sent_tools``), messages added.

The middleware adds them, with the system prompt, to the size the trigger
compares with the threshold (``_lc.schemas.ToolSchemas`` counts the tools); a
message an outer middleware adds to one call (``added_messages``) counts too,
and one it edited (``held_as_sent``) keeps the request's compaction out of the
state. (Read by the middleware alone, so ``langchain`` is installed: a
structured output's tools are made by it, and it says which models get them.)
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Sequence
from typing import Any

from langchain.agents.structured_output import AutoStrategy, OutputToolBinding, ProviderStrategy, ToolStrategy
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
    """The tools a request goes out with: its own, and its structured output's when that is sent as tools.

    ``create_agent`` binds those after every middleware has run, so the
    request does not list them; they are sent, counted and read by a prompt
    cache all the same (a cache-aligned summary request sends them too).
    """
    tools = tuple(getattr(request, "tools", ()) or ())
    strategy = _tool_strategy(request)
    if strategy is None:
        return tools
    return (*tools, *(_once(spec, _output_tool) for spec in strategy.schema_specs))


def _tool_strategy(request: Any) -> ToolStrategy[Any] | None:
    """The ``ToolStrategy`` a request's structured output is sent as, if any, resolved as ``create_agent`` resolves it.

    A bare schema, or the ``AutoStrategy`` ``create_agent`` wraps it in, is
    the provider's structured output for a model LangChain says takes it, and
    a tool for any other (``factory._get_bound_model``).
    """
    strategy = getattr(request, "response_format", None)
    if strategy is None or isinstance(strategy, (ToolStrategy, ProviderStrategy)):
        return strategy if isinstance(strategy, ToolStrategy) else None
    if _native(request):
        return None
    schema = strategy.schema if isinstance(strategy, AutoStrategy) else strategy
    strategy = _once(schema, ToolStrategy)
    return strategy if isinstance(strategy, ToolStrategy) else None


def _native(request: Any) -> bool:
    """Whether LangChain sends a request's bare schema as the provider's structured output; when unsure, no.

    The answer is LangChain's own (a private helper, whose arguments changed
    in 1.x): a tool counted that is not sent costs the trigger a few hundred
    tokens, one sent and not counted takes the request over the window.
    """
    if _SUPPORTS_PROVIDER_STRATEGY is None:
        return False
    tools = {"tools": list(getattr(request, "tools", ()) or ())} if _TAKES_TOOLS else {}
    try:
        return _SUPPORTS_PROVIDER_STRATEGY(getattr(request, "model", None), **tools) is True
    except Exception:  # a model this LangChain cannot judge: counted as a tool
        return False


def _output_tool(spec: Any) -> Any:
    """The structured-output tool of ``spec``, as ``create_agent`` makes it."""
    return OutputToolBinding.from_schema_spec(spec).tool


def _once(source: Any, make: Callable[[Any], Any]) -> Any:
    """``make(source)``, made once per ``source`` object (the same tools each call: counted once)."""
    key = (make, id(source))
    known = _MADE.get(key)
    if known is not None and known[0] is source:
        return known[1]
    made = make(source)
    _MADE.put(key, (source, made))
    return made


_MADE: Bounded[tuple[Any, Any]] = Bounded(TOOLS_REMEMBERED)
"""Structured-output strategies and tools made, by what they were made of (held, so that its id is not reused)."""

_SUPPORTS_PROVIDER_STRATEGY: Callable[..., Any] | None = getattr(
    importlib.import_module("langchain.agents.factory"), "_supports_provider_strategy", None
)
_TAKES_TOOLS = (
    _SUPPORTS_PROVIDER_STRATEGY is not None and "tools" in inspect.signature(_SUPPORTS_PROVIDER_STRATEGY).parameters
)
