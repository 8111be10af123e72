"""Where a node sits among graphs: the graph levels around it, and its parent graph's node one level up.

A node's ``checkpoint_ns`` names every task around it, outermost first
(``parent:<task id>|node:<task id>``): each task of a parent graph that runs
a subgraph is one level, except a task of LangGraph's functional API, which
runs in the graph of the task that called it (``graph_levels``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from langchain_compaction._lc.steps import configurable_of

TOO_DEEP = "\x00too deep"
"""What ``parent_node`` says of a subgraph nested more than one level down."""

IN_TASK = "\x00in a task"
"""What ``parent_node`` says of a graph one level down run inside a task of the functional API (``@task``)."""


def recast(part: str) -> str:
    """A namespace segment without its task id (``node:<id>`` is ``node``)."""
    return part.split(":", 1)[0]


def graph_levels(config: Any) -> tuple[tuple[str, bool], ...]:
    """The tasks that run the graphs around the running node, outermost first, each with whether it is a ``@task``.

    A node's ``checkpoint_ns`` names every task around it (``parent:<id>|node:<id>``),
    but a task of LangGraph's functional API runs in the graph of the task that
    called it (an ``@entrypoint``'s function, a node's): the caller is no graph
    level. ``checkpoint_map`` tells, mapping each namespace that started tasks
    to the checkpoint of the graph that ran them: a caller maps to its own
    graph's, the checkpoint before it. (With no map, as in an async hook before
    Python 3.11, every segment is a level.)
    """
    configurable = configurable_of(config)
    found = configurable.get("checkpoint_map")
    checkpoints = found if isinstance(found, Mapping) else {}
    parts = str(configurable.get("checkpoint_ns") or "").split("|")[:-1]  # (the last: the running node)
    levels: list[tuple[str, bool]] = []
    graph, called = checkpoints.get(""), False
    for end, part in enumerate(parts, 1):
        here = checkpoints.get("|".join(parts[:end]))
        if here is not None and here == graph:
            called = True  # it called the next task in its own graph
            continue
        if part and not part.isdigit():
            levels.append((recast(part), called))
        graph, called = here, False
    return tuple(levels)


def parent_node(config: Any) -> str | None:
    """The parent graph's node that runs this subgraph one level down (``IN_TASK``: a ``@task``); else ``TOO_DEEP``.

    ``None`` at the top. ``Command(graph=Command.PARENT)`` reaches exactly one
    level up, and from a graph run inside a ``@task`` it reaches the task, not
    a graph's state.
    """
    levels = graph_levels(config)
    if not levels:
        return None
    if len(levels) > 1:
        return TOO_DEEP
    node, called = levels[0]
    return IN_TASK if called else node
