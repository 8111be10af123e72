"""Manual compaction of a checkpointed thread (``graph.compact_thread``): what compacts it, and the flow.

What compacts it is the graph's top-level ``CompactionNode``; else, in a
``create_agent`` graph, a stand-in for its ``CompactionMiddleware`` (its
summarizer, options and features: an ``Archive`` archives); else a stand-in
made from the ``model=`` given. A compaction with an archive further down (a
subgraph's node, a sub-agent's middleware) is refused: a stand-in would
remove messages without archiving them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from langgraph.pregel import Pregel
from langgraph.types import Command

from langchain_compaction._lc.commands import idle_thread, thread_run_config, write_compaction
from langchain_compaction._lc.turn import Adapter
from langchain_compaction.core.effects import Flow
from langchain_compaction.core.options import CompactionOptions
from langchain_compaction.core.result import CompactionResult
from langchain_compaction.errors import ConfigurationError
from langchain_compaction.features import Archive
from langchain_compaction.summarizers.chat_model import as_summarizer

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig

    from langchain_compaction.graph import CompactionNode


def _node_type() -> type[CompactionNode]:
    """``CompactionNode``, imported when first asked for (``graph.py``, which defines it, imports this module)."""
    from langchain_compaction.graph import CompactionNode

    return CompactionNode


def _compactors_within(graph: Pregel[Any, Any, Any, Any], path: tuple[str, ...] = ()) -> list[str]:
    """Where compaction with an archive runs below the top level: an agent's middleware, a subgraph's node."""
    found: list[str] = []
    for name, spec in graph.nodes.items():
        owner, bound = _owner(spec.bound), spec.bound
        where = " > ".join((*path, name))
        archived = isinstance(owner, Adapter) and any(isinstance(f, Archive) for f in owner.features)
        if archived and (path or not isinstance(owner, _node_type())):
            found.append(f"{where!r} ({type(owner).__name__})")
        elif isinstance(bound, Pregel) and len(path) < 4:
            found += _compactors_within(bound, (*path, name))
    return found


def _agent_stand_in(
    graph: Pregel[Any, Any, Any, Any], model: Any, options: CompactionOptions | None
) -> CompactionNode | None:
    """A stand-in for the one ``CompactionMiddleware`` at the graph's top level (``create_agent``), if it has one.

    It compacts as the middleware would: with its features (an ``Archive``
    archives), and its summarizer and options unless others are given.
    """
    owners = {id(o): o for spec in graph.nodes.values() if isinstance(o := _owner(spec.bound), Adapter)}
    if len(owners) != 1 or isinstance(agent := next(iter(owners.values())), _node_type()):
        return None
    turn = agent._turn
    summarizer = turn.summarizer if model is None else model
    return _node_type()(summarizer, options or turn.options, fallback=turn.fallback, features=turn.given)


def _owner(bound: Any) -> Any:
    """What a graph node runs: a ``CompactionNode``, or the object whose method it calls (an agent's middleware)."""
    return bound if isinstance(bound, _node_type()) else getattr(getattr(bound, "func", None), "__self__", None)


def _locate(
    graph: Pregel[Any, Any, Any, Any], node: str | None, model: Any, options: CompactionOptions | None, key: str | None
) -> tuple[str | None, CompactionNode]:
    """The graph's compaction node (and its name), or a stand-in built from ``model`` (reading ``key``)."""
    node_type = _node_type()
    found = {name: spec.bound for name, spec in graph.nodes.items() if isinstance(spec.bound, node_type)}
    if node is not None and node not in found:
        raise ConfigurationError("node", node, f"this graph's compaction nodes are {sorted(found)}; pass one of them")
    if node is None and len(found) > 1:
        raise ConfigurationError("node", None, f"this graph has several compaction nodes {sorted(found)}; name one")
    if found:
        name = node if node is not None else next(iter(found))
        if key is not None and found[name].messages_key != key:
            raise ConfigurationError("messages_key", key, f"node {name!r} reads {found[name].messages_key!r}")
        return name, found[name]
    if (agent := _agent_stand_in(graph, model, options)) is not None:
        return None, agent
    within = _compactors_within(graph)
    if within:
        raise ConfigurationError(
            "graph",
            type(graph).__name__,
            f"its compaction runs inside {', '.join(within)}, with an Archive that compact_thread cannot reach "
            "(a stand-in would remove messages without archiving them); call compact_thread on the graph that "
            "holds the CompactionNode at its top level, or let the agent compact when its window fills",
        )
    if model is None:
        raise ConfigurationError(
            "model", None, "this graph has no CompactionNode; pass model=... (and options=...) to compact it"
        )
    return None, node_type(model, options, messages_key=key or "messages")


def thread_flow(
    graph: Pregel[Any, Any, Any, Any],
    config: RunnableConfig,
    instructions: str,
    *,
    model: Any,
    node: str | None,
    options: CompactionOptions | None,
    key: str | None,
) -> Flow[CompactionResult | None]:
    if not isinstance(graph, Pregel):
        hint = "builder.compile(checkpointer=...)" if hasattr(graph, "compile") else "one with a checkpointer"
        raise ConfigurationError("graph", graph, f"pass the compiled graph, {hint}")
    name, compactor = _locate(graph, node, model, options, key)
    snapshot, failed = yield from idle_thread(graph, config)
    summarizer = None if model is None else as_summarizer(model)
    # Outside a run, the graph's store is the one the node would see inside it.
    flow = compactor._flow(snapshot.values, thread_run_config(config), instructions, summarizer, store=graph.store)
    result, update = yield from flow
    if result is not None or isinstance(update, Command):
        key = getattr(compactor, "messages_key", "messages")
        yield from write_compaction(graph, config, snapshot, update, key=key, node=name, resume=failed)
    return result
