"""The LangGraph node: compaction as one step of any ``StateGraph``.

``CompactionNode`` sits before the model node. On each turn it reads the
message list, decides from cached per-message token counts (anchored on the
provider's reported usage when there is one) whether the context is over
``context_window - reserve_tokens``, and if so replaces the list with
``[leading system messages, summary, (bridge), *recent]`` through
``RemoveMessage(id=REMOVE_ALL_MESSAGES)``, so the checkpoint really shrinks.
The bridge is the one-line user turn ``finish`` puts after the summary when
the kept messages start otherwise (an agent compacted mid-loop keeps its tool
call first); the next compaction replaces it with the summary.

Like every adapter it has no compaction logic of its own: it converts, calls
``prepare`` / ``run_flow`` (or ``arun_flow``) / ``finish`` from
``adapters.messages`` and builds the state update. ``compact_thread`` and the
opt-in ``/compact`` command force a compaction through the same path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.callbacks import (
    AsyncCallbackManagerForChainRun,
    CallbackManagerForChainRun,
    adispatch_custom_event,
    dispatch_custom_event,
)
from langchain_core.messages import BaseMessage, HumanMessage, RemoveMessage, ToolMessage
from langchain_core.runnables import Runnable, RunnableConfig
from langgraph.constants import END
from langgraph.graph import MessagesState
from langgraph.graph.message import REMOVE_ALL_MESSAGES
from langgraph.pregel import Pregel

from langchain_compaction.adapters._cache import DEFAULT_CACHE_SIZE, TokenCountCache
from langchain_compaction.adapters.messages import Prepared, context_tokens, finish, prepare
from langchain_compaction.core.engine import DriverReport, Summarizer, arun_flow, run_flow
from langchain_compaction.core.options import CompactionOptions
from langchain_compaction.core.result import CompactionRecord, CompactionResult
from langchain_compaction.errors import ConfigurationError, InvalidMessagesError
from langchain_compaction.summarizers.chat_model import as_summarizer

__all__ = [
    "COMPACTION_EVENT",
    "COMPACT_COMMAND",
    "CompactionNode",
    "CompactionState",
    "acompact_thread",
    "compact_thread",
    "parse_compact_command",
    "route_after_compaction",
]

COMPACTION_EVENT = "langchain_compaction"
"""Name of the LangChain custom event dispatched after each compaction.

Its data is the ``CompactionRecord`` (``CompactionResult.to_dict()``).
"""

COMPACT_COMMAND = "/compact"
"""The chat command that forces a compaction when ``enable_compact_command`` is set."""

"""Key in the summary's mark: the id of the last message when it was written.

A kept AI message carries usage from before the compaction; only an AI message
that comes after this one reports the compacted context.
"""

_DEFAULT_OPTIONS = CompactionOptions()


class CompactionState(MessagesState, total=False):
    """``MessagesState`` plus the key ``CompactionNode(result_key="compaction")`` writes.

    Example:
        >>> from langgraph.graph import StateGraph
        >>> builder = StateGraph(CompactionState)
        >>> sorted(CompactionState.__annotations__)
        ['compaction', 'messages']
    """

    compaction: CompactionRecord
    """The last compaction's figures (plain JSON data, safe in any checkpointer)."""


def parse_compact_command(message: object) -> str | None:
    """The instructions of a ``/compact [instructions]`` human message.

    Args:
        message: Any message.

    Returns:
        The instructions (``""`` for a bare ``/compact``), or ``None`` when
        ``message`` is not a human message holding the command.

    Example:
        >>> from langchain_core.messages import HumanMessage
        >>> parse_compact_command(HumanMessage("/compact keep the API design"))
        'keep the API design'
        >>> parse_compact_command(HumanMessage("/compactify")) is None
        True
    """
    if not isinstance(message, HumanMessage):
        return None
    text = message.text.strip()
    if not text.startswith(COMPACT_COMMAND):
        return None
    rest = text[len(COMPACT_COMMAND) :]
    if rest and not rest[0].isspace():
        return None  # "/compactify" is not the command
    return rest.strip()


def route_after_compaction(state: Any, *, goto: str = "model", messages_key: str = "messages") -> str:
    """A conditional edge for after the compaction node: call the model only if needed.

    The model runs when the last message asks for an answer (a human message
    or a tool result). After a ``/compact`` command the command message is
    gone and the last message is the previous reply, so the run ends without
    a model call.

    Args:
        state: The graph state.
        goto: The model node's name.
        messages_key: The state key holding the messages.

    Returns:
        ``goto`` or ``END``.

    Example:
        >>> from langchain_core.messages import AIMessage, HumanMessage
        >>> route_after_compaction({"messages": [HumanMessage("hi")]})
        'model'
        >>> route_after_compaction({"messages": [HumanMessage("hi"), AIMessage("hello")]})
        '__end__'
    """
    messages = _read_messages(state, messages_key)
    if messages and isinstance(messages[-1], (HumanMessage, ToolMessage)):
        return goto
    return END


def _read_messages(state: Any, key: str) -> list[BaseMessage]:
    value = state.get(key) if isinstance(state, Mapping) else getattr(state, key, None)
    if value is None:
        return []
    if isinstance(value, BaseMessage) or not isinstance(value, Sequence) or isinstance(value, str):
        msg = f"state[{key!r}] is a {type(value).__name__}, not a list of messages; pass messages_key= naming the list"
        raise InvalidMessagesError(msg)
    return list(value)


@dataclass(frozen=True, slots=True)
class _Pending:
    """A compaction decided on, waiting for its summary."""

    prepared: Prepared
    head: int


class CompactionNode(Runnable[Any, dict[str, Any]]):
    """A LangGraph node that keeps the message list inside the context window.

    Add it before the model node of any ``StateGraph`` whose message list uses
    the ``add_messages`` reducer (``MessagesState`` or a custom state).
    ``graph.invoke`` runs it on the sync path and ``graph.ainvoke`` on the
    async one. When the context (cached per-message estimates, or the last
    reply's reported ``usage_metadata`` plus the estimate of what came after)
    exceeds ``options.context_window - options.reserve_tokens``, it returns
    ``{messages_key: [RemoveMessage(id=REMOVE_ALL_MESSAGES), *leading system
    messages, summary, (bridge), *recent]}`` (the bridge user turn only when
    the recent part does not start with one); otherwise an empty update. Automatic
    compaction is off when ``context_window`` (or ``reserve_tokens``) is 0:
    the node then compacts only on ``/compact`` or ``compact_thread``. The
    summary it writes records the id of the last message at that moment, so
    the stale usage on a kept reply is not mistaken for the new context size.

    Each compaction logs at INFO on the ``langchain_compaction`` logger,
    dispatches the custom event ``COMPACTION_EVENT`` with the result's dict,
    and, with ``result_key``, writes that dict into the state (a key the state
    schema does not declare is dropped by LangGraph). A summary failure raises
    ``SummarizationError`` (a ``CompactionError``) and writes nothing, so the
    checkpoint keeps every message, unless ``fallback`` is given.

    Args:
        model: Writes the summaries: a chat model, Runnable, function from
            prompt text to text, or summarizer.
        options: Budgets and prompts.
        messages_key: The state key holding the messages.
        result_key: A state key to write the ``CompactionRecord`` into, if any.
        fallback: A summarizer used when ``model`` fails.
        enable_compact_command: Treat a final human message
            ``/compact [instructions]`` as a forced compaction and remove it,
            so it never reaches the model (route with
            ``route_after_compaction``).
        name: The node's name when added without one.
        cache_size: Messages whose token counts are remembered.

    Raises:
        ConfigurationError: An argument is invalid.

    Example:
        >>> from langchain_core.messages import AIMessage, HumanMessage
        >>> node = CompactionNode(
        ...     lambda prompt: "## Goal\\n- finish the report",
        ...     CompactionOptions(context_window=1_000, reserve_tokens=200, keep_recent_tokens=100),
        ... )
        >>> history = [HumanMessage("hi", id="1"), AIMessage("x" * 4_000, id="2"), HumanMessage("go on", id="3")]
        >>> [m.type for m in node({"messages": history})["messages"]]
        ['remove', 'system', 'human']
        >>> node({"messages": history[-1:]})
        {}
    """

    def __init__(
        self,
        model: Any,
        options: CompactionOptions = _DEFAULT_OPTIONS,
        *,
        messages_key: str = "messages",
        result_key: str | None = None,
        fallback: Any = None,
        enable_compact_command: bool = False,
        name: str = "compact",
        cache_size: int = DEFAULT_CACHE_SIZE,
    ) -> None:
        if not isinstance(options, CompactionOptions):
            raise ConfigurationError("options", options, "pass a CompactionOptions(...)")
        if not isinstance(messages_key, str) or not messages_key:
            raise ConfigurationError("messages_key", messages_key, "pass the state key of the message list")
        if result_key is not None and (not isinstance(result_key, str) or not result_key or result_key == messages_key):
            raise ConfigurationError(
                "result_key", result_key, "pass a state key other than messages_key (e.g. 'compaction'), or None"
            )
        if isinstance(cache_size, bool) or not isinstance(cache_size, int) or cache_size < 1:
            raise ConfigurationError("cache_size", cache_size, f"pass a positive number (default {DEFAULT_CACHE_SIZE})")
        self.summarizer: Summarizer = as_summarizer(model)
        self.fallback: Summarizer | None = None if fallback is None else as_summarizer(fallback, field="fallback")
        self.options = options
        self.messages_key = messages_key
        self.result_key = result_key
        self.enable_compact_command = bool(enable_compact_command)
        self.name = name
        self._cache = TokenCountCache(options, max_entries=cache_size)

    # -- the pure half: decide, then build the update ---------------------------------

    def context_tokens(self, messages: Sequence[BaseMessage]) -> int:
        """The context size the trigger compares with the threshold.

        The last AI message's reported input+output tokens plus the estimate
        of the messages after it, when it reports usage and came after the
        last compaction; otherwise the sum of the cached estimates.

        Args:
            messages: The conversation.

        Returns:
            The context size in tokens.
        """
        return self._context_tokens(messages, self._cache.counts(messages))

    @staticmethod
    def _context_tokens(messages: Sequence[BaseMessage], counts: Sequence[int]) -> int:
        return context_tokens(messages, counts)

    @property
    def _auto(self) -> bool:
        # The reference's ShouldCompact: a window or reserve of 0 turns it off.
        return self.options.context_window > 0 and self.options.reserve_tokens > 0

    def _over_budget(self, messages: Sequence[BaseMessage], counts: Sequence[int]) -> bool:
        threshold = self.options.context_window - self.options.reserve_tokens
        return self._auto and self._context_tokens(messages, counts) > threshold

    def _begin(self, state: Any, *, manual: str | None) -> _Pending | dict[str, Any]:
        """Decide what to do with ``state``: an update to return now, or a compaction."""
        messages = _read_messages(state, self.messages_key)
        instructions, force, command = "", False, None
        if manual is not None:
            instructions, force = manual, True
        elif self.enable_compact_command and messages:
            parsed = parse_compact_command(messages[-1])
            if parsed is not None:
                command, messages = messages[-1], messages[:-1]
                instructions, force = parsed, True
        if not force and not self._auto:
            return {}  # automatic compaction is off: do not even count
        counts, core = self._cache.counts_and_core(messages)
        if not force and not self._over_budget(messages, counts):
            return {}
        prepared = prepare(messages, self.options, instructions, force=force, counts=counts, core=core)
        if prepared is None:
            # Nothing to summarize; a command message is still consumed.
            if command is not None and command.id is not None:
                return {self.messages_key: [RemoveMessage(id=command.id)]}
            return {}
        return _Pending(prepared, len(prepared.plan.keep_head))

    def _complete(self, pending: _Pending, report: DriverReport) -> tuple[CompactionResult, dict[str, Any]]:
        result, output = finish(pending.prepared, report, self.options)
        update: dict[str, Any] = {self.messages_key: [RemoveMessage(id=REMOVE_ALL_MESSAGES), *output]}
        if self.result_key is not None:
            update[self.result_key] = result.to_dict()
        return result, update

    # -- the drivers: only the summary call and the event differ ----------------------

    def _run(
        self,
        state: Any,
        run_manager: CallbackManagerForChainRun,
        config: RunnableConfig,
        *,
        manual: str | None = None,
        summarizer: Summarizer | None = None,
        pending: _Pending | None = None,
    ) -> tuple[CompactionResult | None, dict[str, Any]]:
        step = pending or self._begin(state, manual=manual)
        if isinstance(step, dict):
            return None, step
        report = run_flow(
            step.prepared.flow, summarizer or self.summarizer, fallback=self.fallback, timeout=self.options.timeout
        )
        result, update = self._complete(step, report)
        dispatch_custom_event(COMPACTION_EVENT, result.to_dict(), config=config)
        return result, update

    async def _arun(
        self,
        state: Any,
        run_manager: AsyncCallbackManagerForChainRun,
        config: RunnableConfig,
        *,
        manual: str | None = None,
        summarizer: Summarizer | None = None,
        pending: _Pending | None = None,
    ) -> tuple[CompactionResult | None, dict[str, Any]]:
        step = pending or self._begin(state, manual=manual)
        if isinstance(step, dict):
            return None, step
        report = await arun_flow(
            step.prepared.flow, summarizer or self.summarizer, fallback=self.fallback, timeout=self.options.timeout
        )
        result, update = self._complete(step, report)
        await adispatch_custom_event(COMPACTION_EVENT, result.to_dict(), config=config)
        return result, update

    # -- the Runnable surface ---------------------------------------------------------

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> dict[str, Any]:
        """Run the node on a state (what ``graph.invoke`` calls).

        Args:
            input: The graph state (a dict, or an object with the messages
                attribute).
            config: The run's config (callbacks, tags).
            **kwargs: Ignored.

        Returns:
            The state update: ``{}`` or the compacted list (and result key).

        Raises:
            SummarizationError: The summary failed and there is no fallback.
            InvalidMessagesError: The state's message list cannot be read.
        """
        # Decide first: the common turn, nothing to do, returns at once
        # without opening a run of its own (no trace span, no callbacks).
        step = self._begin(input, manual=None)
        if isinstance(step, dict):
            return step

        def node(state: Any, run_manager: CallbackManagerForChainRun, config: RunnableConfig) -> dict[str, Any]:
            return self._run(state, run_manager, config, pending=step)[1]

        return self._call_with_config(node, input, config)

    async def ainvoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> dict[str, Any]:
        """The async twin of ``invoke`` (what ``graph.ainvoke`` calls)."""
        step = self._begin(input, manual=None)
        if isinstance(step, dict):
            return step

        async def node(
            state: Any, run_manager: AsyncCallbackManagerForChainRun, config: RunnableConfig
        ) -> dict[str, Any]:
            return (await self._arun(state, run_manager, config, pending=step))[1]

        return await self._acall_with_config(node, input, config)

    def __call__(self, state: Any, config: RunnableConfig | None = None) -> dict[str, Any]:
        """Run the node on a state dict; see ``invoke``."""
        return self.invoke(state, config)

    def compact_now(
        self,
        state: Any,
        *,
        instructions: str = "",
        model: Any = None,
        config: RunnableConfig | None = None,
    ) -> tuple[CompactionResult | None, dict[str, Any]]:
        """Force a compaction of ``state`` now, whatever the budget says.

        Args:
            state: The graph state.
            instructions: Custom instructions for the summary.
            model: Summarizes instead of the node's model, if given.
            config: Callbacks and tags for the run (the event goes to them).

        Returns:
            The result (``None`` when there is nothing to summarize) and the
            state update to write.
        """
        summarizer = None if model is None else as_summarizer(model)

        outcome: list[CompactionResult | None] = [None]

        def run(value: Any, run_manager: CallbackManagerForChainRun, config: RunnableConfig) -> dict[str, Any]:
            outcome[0], update = self._run(value, run_manager, config, manual=instructions, summarizer=summarizer)
            return update

        # A run of its own, so the custom event has a parent and traces show it.
        update = self._call_with_config(run, state, _named(config, "compact_thread"))
        return outcome[0], update

    async def acompact_now(
        self,
        state: Any,
        *,
        instructions: str = "",
        model: Any = None,
        config: RunnableConfig | None = None,
    ) -> tuple[CompactionResult | None, dict[str, Any]]:
        """The async twin of ``compact_now``."""
        summarizer = None if model is None else as_summarizer(model)

        outcome: list[CompactionResult | None] = [None]

        async def run(
            value: Any, run_manager: AsyncCallbackManagerForChainRun, config: RunnableConfig
        ) -> dict[str, Any]:
            outcome[0], update = await self._arun(
                value, run_manager, config, manual=instructions, summarizer=summarizer
            )
            return update

        update = await self._acall_with_config(run, state, _named(config, "acompact_thread"))
        return outcome[0], update


def _named(config: RunnableConfig | None, run_name: str) -> RunnableConfig:
    # Only callbacks, tags and metadata matter to the compaction's own run; the
    # thread's ``configurable`` is for the checkpointer.
    base = config or {}
    named = RunnableConfig(run_name=run_name)
    for key in ("callbacks", "tags", "metadata"):
        if key in base:
            named[key] = base[key]
    return named


def _locate(
    graph: Pregel[Any, Any, Any, Any], node: str | None, model: Any, options: CompactionOptions | None
) -> tuple[str | None, CompactionNode]:
    """The graph's compaction node (and its name), or a stand-in built from ``model``."""
    found = {name: spec.bound for name, spec in graph.nodes.items() if isinstance(spec.bound, CompactionNode)}
    if node is not None:
        if node not in found:
            raise ConfigurationError(
                "node", node, f"this graph's compaction nodes are {sorted(found)}; pass one of them, or None"
            )
        return node, found[node]
    if len(found) == 1:
        name, bound = next(iter(found.items()))
        return name, bound
    if len(found) > 1:
        raise ConfigurationError("node", None, f"this graph has several compaction nodes {sorted(found)}; name one")
    if model is None:
        raise ConfigurationError(
            "model", None, "this graph has no CompactionNode; pass model=... (and options=...) to compact it"
        )
    return None, CompactionNode(model, options or _DEFAULT_OPTIONS)


def compact_thread(
    graph: Pregel[Any, Any, Any, Any],
    config: RunnableConfig,
    *,
    instructions: str = "",
    model: Any = None,
    node: str | None = None,
    options: CompactionOptions | None = None,
) -> CompactionResult | None:
    """Compact a checkpointed thread now, with optional custom instructions.

    Reads the thread with ``graph.get_state``, forces a compaction through the
    graph's ``CompactionNode`` (the same path the node takes) and writes it
    with ``graph.update_state(..., as_node=<that node>)``, so the checkpoint
    records it as the node's own update and what runs next follows that
    node's edges (with ``route_after_compaction``, an idle thread stays idle).

    Args:
        graph: A compiled graph with a checkpointer.
        config: Names the thread (``{"configurable": {"thread_id": ...}}``);
            its callbacks receive the ``COMPACTION_EVENT``.
        instructions: Appended to the summary prompt, e.g. ``"keep the API
            design"``.
        model: Summarizes instead of the node's model; required when the
            graph has no ``CompactionNode``.
        node: The compaction node's name, when the graph has several.
        options: Options when the graph has no ``CompactionNode``.

    Returns:
        The result, or ``None`` when there was nothing to compact (nothing is
        written then).

    Raises:
        ConfigurationError: No compaction node can be found or built.
        SummarizationError: The summary failed; the thread is unchanged.

    Example:
        >>> from langgraph.checkpoint.memory import InMemorySaver
        >>> from langgraph.graph import START, StateGraph
        >>> from langchain_core.messages import AIMessage, HumanMessage
        >>> builder = StateGraph(CompactionState)
        >>> _ = builder.add_node(CompactionNode(lambda prompt: "## Goal\\n- ship it"))
        >>> _ = builder.add_edge(START, "compact")
        >>> graph = builder.compile(checkpointer=InMemorySaver())
        >>> config = {"configurable": {"thread_id": "t"}}
        >>> turns = [HumanMessage("plan"), AIMessage("done"), HumanMessage("thanks")]
        >>> _ = graph.invoke({"messages": turns}, config)
        >>> compact_thread(graph, config, instructions="keep the plan").messages_removed
        2
    """
    name, compactor = _locate(graph, node, model, options)
    snapshot = graph.get_state(config)
    result, update = compactor.compact_now(snapshot.values, instructions=instructions, model=model, config=config)
    if result is None:
        return None
    graph.update_state(config, update, as_node=name)
    return result


async def acompact_thread(
    graph: Pregel[Any, Any, Any, Any],
    config: RunnableConfig,
    *,
    instructions: str = "",
    model: Any = None,
    node: str | None = None,
    options: CompactionOptions | None = None,
) -> CompactionResult | None:
    """The async twin of ``compact_thread`` (``aget_state`` / ``aupdate_state``)."""
    name, compactor = _locate(graph, node, model, options)
    snapshot = await graph.aget_state(config)
    result, update = await compactor.acompact_now(
        snapshot.values, instructions=instructions, model=model, config=config
    )
    if result is None:
        return None
    await graph.aupdate_state(config, update, as_node=name)
    return result
