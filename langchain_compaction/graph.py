"""The LangGraph node: compaction as one step of any ``StateGraph``.

``CompactionNode`` sits before the model node. On each turn it reads the
message list, asks the trigger rule (``core.context``) with cached per-message
token counts whether the context is over ``context_window - reserve_tokens``,
and if so replaces the list with ``[leading system messages, summary,
(bridge), *recent]`` through ``RemoveMessage(id=REMOVE_ALL_MESSAGES)``, so the
checkpoint really shrinks. The bridge is the one-line user turn put after the
summary when the kept messages start otherwise (an agent compacted mid-loop
keeps its tool call first); the next compaction replaces it with the summary.

Like every adapter it has no compaction logic of its own: it reads the state,
hands the messages to the shared turn (``_lc.turn.Turn``) and
builds the state update. ``compact_thread`` and the opt-in ``/compact`` command
force a compaction through the same run.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from langchain_core.messages import BaseMessage, RemoveMessage
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.graph import MessagesState
from langgraph.pregel import Pregel
from langgraph.types import Command

from langchain_compaction._lc.commands import (
    COMPACT_COMMAND,
    Ask,
    asked,
    check_reducer,
    other_messages_key,
    parse_compact_command,
    read_messages,
    route_after_compaction,
)
from langchain_compaction._lc.conversation import Delivery, Nesting
from langchain_compaction._lc.counting import DEFAULT_CACHE_SIZE
from langchain_compaction._lc.events import COMPACTION_EVENT, PREPARE_EVENT, replacement
from langchain_compaction._lc.legacy import adapter_keywords
from langchain_compaction._lc.manual import thread_flow
from langchain_compaction._lc.runconfig import current
from langchain_compaction._lc.steps import current_store, refuse_a_payload
from langchain_compaction._lc.turn import Adapter, Outcome, Place, Trigger, Turn
from langchain_compaction.core.context import context_tokens
from langchain_compaction.core.effects import Flow, adrive, drive
from langchain_compaction.core.engine import Summarizer
from langchain_compaction.core.options import CompactionOptions
from langchain_compaction.core.result import CompactionRecord, CompactionResult
from langchain_compaction.errors import ConfigurationError
from langchain_compaction.features import Archive, Feature
from langchain_compaction.features.recall import recall_tool

__all__ = [
    "COMPACTION_EVENT",
    "COMPACT_COMMAND",
    "PREPARE_EVENT",
    "CompactionNode",
    "CompactionRecord",
    "CompactionState",
    "Nesting",
    "acompact_thread",
    "compact_thread",
    "parse_compact_command",
    "route_after_compaction",
]

logger = logging.getLogger("langchain_compaction")


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


class CompactionNode(Runnable[Any, Any], Adapter):
    """A LangGraph node that keeps the message list inside the context window.

    Add it before the model node of any ``StateGraph`` whose message list uses
    the ``add_messages`` reducer (``MessagesState`` or a custom state).
    ``graph.invoke`` runs it on the sync path and ``graph.ainvoke`` on the
    async one, where counting, planning and any blocking summarizer run off
    the event loop. When the context (cached per-message estimates, or the
    last reply's reported ``usage_metadata`` plus the estimate of what came
    after) exceeds ``options.context_window - options.reserve_tokens``, it
    returns ``{messages_key: [RemoveMessage(id=REMOVE_ALL_MESSAGES), *leading
    system messages, summary, (bridge), *recent]}`` (the bridge user turn only
    when the recent part does not start with one); otherwise an empty update.
    What it writes itself (the removal, the summary, the bridge) goes as plain
    message dicts, which ``add_messages`` turns into messages: LangGraph's
    ``messages`` stream then shows a chat UI none of it, while ``values`` shows
    the state as always and ``updates`` shows those dicts.
    With ``context_window=0`` automatic compaction is off and the node
    compacts only on ``/compact`` or ``compact_thread``. The summary it writes
    records the id of the last message at that moment, so the stale usage on
    a kept reply is not mistaken for the new context size.

    Each compaction logs at INFO on the ``langchain_compaction`` logger,
    dispatches the custom event ``COMPACTION_EVENT`` with the result's dict,
    and, with ``result_key``, writes that dict into the state (a key the state
    schema does not declare is dropped by LangGraph). A summary failure raises
    ``SummarizationError`` (a ``CompactionError``) and writes nothing, so the
    checkpoint keeps every message, unless ``fallback`` is given.

    Args:
        model: Writes the summaries: a chat model, Runnable, function from
            prompt text to text, or summarizer.
        options: Budgets and prompts (``None`` for the defaults).
        messages_key: The state key holding the messages.
        result_key: A state key to write the ``CompactionRecord`` into, if any.
        fallback: A summarizer used when ``model`` fails.
        enable_compact_command: Treat a final human message
            ``/compact [instructions]`` as a forced compaction and remove it,
            so it never reaches the model (route with
            ``route_after_compaction``).
        name: The node's name when added without one.
        cache_size: Messages whose token counts are remembered.
        nested: In a subgraph one level down (a compiled graph holding this
            node, added as a node of a parent graph that shares the message
            list), ``"parent"`` (the default) writes each compaction to the
            parent's ``messages_key`` too (``Command.PARENT``) and runs the
            subgraph's node again on the compacted list, so the parent's state
            shrinks and no summary lands mid-history; ``"own"`` writes to this
            graph's state only (for a subgraph whose messages are not the
            parent's under the same key).
        features: The features (``langchain_compaction.features``): checked
            facts and pins by default; add ``Archive()`` to keep every removed
            message in the graph's LangGraph store (``node.recall_tool()``
            reads it back), ``PrepareAhead(at=0.7)`` to prepare the next
            summary in the background, ``ClearToolOutputs()`` to clear old
            tool outputs first.
        **deprecated: The 0.2 keywords ``prepare_wait``, ``prepare_in_store``,
            ``prepare_lease`` and ``archive`` (see ``_lc.legacy``).

    Raises:
        ConfigurationError: An argument is invalid.

    Example:
        >>> from langchain_core.messages import AIMessage, HumanMessage
        >>> node = CompactionNode(
        ...     lambda prompt: "## Goal\\n- finish the report",
        ...     CompactionOptions(context_window=1_000, reserve_tokens=200, keep_recent_tokens=100),
        ... )
        >>> history = [HumanMessage("hi", id="1"), AIMessage("x" * 4_000, id="2"), HumanMessage("go on", id="3")]
        >>> update = node({"messages": history})["messages"]  # what it wrote is plain dicts (see above)
        >>> [m["type"] if isinstance(m, dict) else m.type for m in update]
        ['remove', 'system', 'human']
        >>> node({"messages": history[-1:]})
        {}
    """

    def __init__(
        self,
        model: Any,
        options: CompactionOptions | None = None,
        *,
        messages_key: str = "messages",
        result_key: str | None = None,
        fallback: Any = None,
        enable_compact_command: bool = False,
        name: str = "compact",
        cache_size: int = DEFAULT_CACHE_SIZE,
        nested: Nesting = "parent",
        features: Sequence[Feature] | None = None,
        **deprecated: Any,
    ) -> None:
        if not isinstance(messages_key, str) or not messages_key:
            raise ConfigurationError("messages_key", messages_key, "pass the state key of the message list")
        if result_key is not None and (not isinstance(result_key, str) or not result_key or result_key == messages_key):
            raise ConfigurationError(
                "result_key", result_key, "pass a state key other than messages_key (e.g. 'compaction'), or None"
            )
        legacy = adapter_keywords("CompactionNode", deprecated)
        self._turn = Turn.build(model, options, fallback, features, adapter=legacy, cache_size=cache_size)
        self.messages_key = messages_key
        self.result_key = result_key
        self.enable_compact_command = bool(enable_compact_command)
        self.name = name
        self.nested: Nesting = nested
        self._delivery = Delivery(nested, f"CompactionNode {name!r}")
        self._warned_no_window = False

    @property
    def archive(self) -> Archive | None:
        """The ``Archive`` feature, when it is on."""
        archive: Archive | None = self._turn.feature(Archive)
        return archive

    def context_tokens(self, messages: Sequence[BaseMessage]) -> int:
        """The context size the trigger compares with the threshold.

        Args:
            messages: The conversation.

        Returns:
            The context size in tokens (see ``core.context``).
        """
        counts, core = self._turn.cache.counts_and_core(messages)
        return context_tokens(core, counts, window=self.options.budget.window)

    # -- the run, as one flow for both paths ----------------------------------------

    def _ask(self, state: Any, manual: str | None, config: RunnableConfig | None) -> Ask | None:
        """What this run must do; ``None`` when automatic compaction is off and nothing forces one."""
        messages = read_messages(state, self.messages_key)
        refuse_a_payload(config, messages, self.messages_key, self._delivery.who)
        if not messages:
            self._say_other_key(state)
        ask = asked(messages, manual, commands=self.enable_compact_command)
        if self.options.budget.threshold is None and not (ask.forced or ask.stale):
            self._say_no_window(len(messages))
            return None  # automatic compaction is off: do not even count
        return ask

    def _say_other_key(self, state: Any) -> None:
        """Say once that the state keeps its messages under another key than ``messages_key``."""
        other = other_messages_key(state, self.messages_key)
        if other is not None:
            self._delivery.say(
                "other key",
                f"it reads the messages under {self.messages_key!r}, which the state does not have; it keeps a "
                f"message list under {other!r}, which is never compacted: pass messages_key={other!r}",
            )

    def _say_no_window(self, size: int) -> None:
        if self._warned_no_window or not size:
            return
        self._warned_no_window = True
        logger.warning(
            "CompactionNode %r has no context_window, so it never compacts on its own (only /compact and "
            "compact_thread do); pass CompactionOptions(context_window=<the model's window>), e.g. 200_000 for Claude",
            self.name,
        )

    def _flow(
        self,
        state: Any,
        config: RunnableConfig | None,
        manual: str | None = None,
        model: Summarizer | None = None,
        store: Any = None,
    ) -> Flow[tuple[CompactionResult | None, dict[str, Any] | Command[Any]]]:
        ask = self._ask(state, manual, config)
        if ask is None:
            return None, {}
        check_reducer(ask.held or ask.messages, config, self.messages_key)
        own, conversation, parent = yield from self._delivery.conversation(
            config, ask.held or ask.messages, self.messages_key
        )
        self._delivery.too_deep(config)  # said on the first turn at that depth, before any compaction
        place = Place(conversation, store if store is not None else current_store(), config)
        trigger: Trigger = "force" if ask.forced else "auto"
        outcome: Outcome = yield from self._turn.run(
            ask.messages, place, trigger=trigger, instructions=ask.instructions, summarizer=model, traced=state
        )
        update: dict[str, Any] = {}
        if outcome.messages is not None:
            update[self.messages_key] = replacement(outcome.messages)
            if outcome.result is not None and self.result_key is not None:
                update[self.result_key] = outcome.result.to_dict()
        elif gone := [m.id for m in (ask.command, *ask.stale) if m is not None and m.id is not None]:
            update[self.messages_key] = [RemoveMessage(id=i) for i in gone]
        held, key = ask.held or ask.messages, self.messages_key
        if update and parent is not None:
            sent = None if outcome.messages is None else (own, outcome.messages)
            command = yield from self._delivery.to_parent(config, update, state, parent, sent=sent, held=held, key=key)
            if command is not None:
                return outcome.result, command
            parent = None  # (it stays below: written as a compaction where no parent is written to is)
        if outcome.messages is not None and parent is None:
            self._delivery.stayed(config)
            written = yield from self._delivery.beside(config, held, outcome.messages)
            update[key] = written or update[key]
        return outcome.result, update

    def recall_tool(self, *, max_chars: int = 4_000) -> BaseTool:
        """The tool that reads this node's archive back (give it to the agent's ``ToolNode``).

        Args:
            max_chars: The most characters one call returns.

        Returns:
            The tool (see ``langchain_compaction.archive.recall_tool``); its
            output goes through ``options.redact``.
        """
        if self.archive is None:
            raise ConfigurationError("features", self.features, "the archive is off: add Archive() to features")
        return recall_tool(
            self.archive, redact=self.options.redact, max_chars=max_chars, messages_key=self.messages_key
        )

    # -- the Runnable surface ---------------------------------------------------------

    def invoke(self, input: Any, config: RunnableConfig | None = None, **kwargs: Any) -> dict[str, Any] | Command[Any]:
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
        return drive(self._flow(input, config))[1]

    async def ainvoke(
        self, input: Any, config: RunnableConfig | None = None, **kwargs: Any
    ) -> dict[str, Any] | Command[Any]:
        """The async twin of ``invoke`` (what ``graph.ainvoke`` calls)."""
        with current(config):  # (Python 3.10: LangGraph could not make it current)
            return (await adrive(self._flow(input, config)))[1]

    def __call__(self, state: Any, config: RunnableConfig | None = None) -> dict[str, Any] | Command[Any]:
        """Run the node on a state dict; see ``invoke``."""
        return self.invoke(state, config)


def compact_thread(
    graph: Pregel[Any, Any, Any, Any],
    config: RunnableConfig,
    *,
    instructions: str = "",
    model: Any = None,
    node: str | None = None,
    options: CompactionOptions | None = None,
    messages_key: str | None = None,
) -> CompactionResult | None:
    """Compact a checkpointed thread now, with optional custom instructions.

    Reads the thread with ``graph.get_state``, forces a compaction through the
    graph's ``CompactionNode`` (the same path the node takes; on a
    ``create_agent`` graph, a stand-in for its ``CompactionMiddleware``) and
    writes it as the node's own update (``graph.bulk_update_state``,
    ``as_node=<that node>``), then clears what its edges would run next: an
    idle thread stays idle, whatever edge leaves the node.

    Args:
        graph: A compiled graph with a checkpointer.
        config: Names the thread (``{"configurable": {"thread_id": ...}}``);
            its callbacks receive the ``COMPACTION_EVENT``.
        instructions: Appended to the summary prompt, e.g. ``"keep the API
            design"``.
        model: Summarizes instead of the node's (or the middleware's) model;
            required when the graph has neither.
        node: The compaction node's name, when the graph has several.
        options: Options when the graph has no ``CompactionNode``.
        messages_key: The state key of the message list, when the graph has
            no ``CompactionNode`` (default ``"messages"``).

    Returns:
        The result, or ``None`` when there was nothing to compact (nothing is
        written then).

    Raises:
        ConfigurationError: No compaction node can be found or built, the
            config names no thread, or the thread is paused mid-run (an
            interrupt): compacting it would drop the pause.
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
    flow = thread_flow(graph, config, instructions, model=model, node=node, options=options, key=messages_key)
    return drive(flow)


async def acompact_thread(
    graph: Pregel[Any, Any, Any, Any],
    config: RunnableConfig,
    *,
    instructions: str = "",
    model: Any = None,
    node: str | None = None,
    options: CompactionOptions | None = None,
    messages_key: str | None = None,
) -> CompactionResult | None:
    """The async twin of ``compact_thread`` (``aget_state`` / ``aupdate_state``)."""
    flow = thread_flow(graph, config, instructions, model=model, node=node, options=options, key=messages_key)
    return await adrive(flow)
