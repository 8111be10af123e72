"""What a graph's checkpoint of the running step says about the step: which nodes it runs, and how.

A node cannot see the other tasks of its step, but the checkpoint the step
started from holds their triggers. A subgraph asks it of its parent's
(``Delivery``), a node at the top of its own graph of its graph's: writes of
nodes running beside it land in the same step as a compaction, and a
replacement of the whole list applied after theirs would wipe them.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Mapping
from typing import Any

from langgraph.constants import CONFIG_KEY_CHECKPOINTER

from langchain_compaction.core.effects import Flow, twin
from langchain_compaction.errors import ConfigurationError

_CHECKPOINT_WAIT = 2.0
"""How long a node waits for the checkpoint of its step while it is written in the background."""
_CHECKPOINT_POLL = 0.01
CONFIG_KEY_DURABILITY = "__pregel_durability"
"""Where LangGraph tells a task its run's durability (``"sync"``, ``"async"``, ``"exit"``)."""
_SENT = "__pregel_push"
"""What LangGraph's task metadata puts first in the path of a task sent with ``Send`` (or called, functional API)."""
CONFIG_KEY_READ = "__pregel_read"
"""Where LangGraph gives every task of a run its reader of the state's channels (no public name for it)."""


def configurable_of(config: Any) -> dict[str, Any]:
    """A run's ``configurable`` (``{}`` when its config has none)."""
    configurable = config.get("configurable") if isinstance(config, dict) else None
    return configurable if isinstance(configurable, dict) else {}


def step_channels(configurable: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The running step's channels, from LangGraph's task reader (no public interface: ``None`` if it differs)."""
    read = configurable.get(CONFIG_KEY_READ)
    channels = read.args[1] if isinstance(read, functools.partial) and len(read.args) > 1 else None
    return channels if isinstance(channels, Mapping) else None


def _starts(channel: str) -> str | None:
    """The node a trigger channel starts: an edge's (``branch:to:<node>``), a fan-in's (``join:<a>+<b>:<node>``)."""
    if channel.startswith("branch:to:"):
        return channel[len("branch:to:") :]
    return channel.rpartition(":")[2] if channel.startswith("join:") else None


def _triggers_another(channel: str, node: str) -> bool:
    """Whether ``channel`` starts a node other than ``node``: an edge's, a fan-in's or the sent tasks'."""
    return channel == "__pregel_tasks" or _starts(channel) not in (None, node)


def live_beside(configurable: Mapping[str, Any], node: str) -> bool | None:
    """Whether the running step starts another node beside ``node``, from its channels; ``None``: cannot tell.

    A trigger is up during the step that it starts (an edge's until the step
    ends, a fan-in's once every node it waits for has written).
    """
    channels = step_channels(configurable)
    if channels is None:
        return None
    for name, channel in channels.items():
        if isinstance(name, str) and _triggers_another(name, node):
            try:
                if channel.is_available():
                    return True
            except Exception:
                continue
    return False


def pulled(checkpoint: Mapping[str, Any], node: str) -> bool:
    """Whether a checkpoint has a trigger waiting for ``node`` (an edge runs it this step, not ``Send``).

    An edge writes ``branch:to:<node>``; an edge that waits for several
    nodes writes ``join:<a>+<b>:<node>``.
    """
    seen = (checkpoint.get("versions_seen") or {}).get(node) or {}
    triggers = ((c, version) for c, version in (checkpoint.get("channel_versions") or {}).items() if _starts(c) == node)
    return any(seen.get(channel) is None or version > seen[channel] for channel, version in triggers)


def beside(checkpoint: Mapping[str, Any], node: str) -> bool:
    """Whether a checkpoint runs other nodes in the step that runs ``node`` (parallel branches, sends).

    Their writes land in the same step as a compaction, which replaces the
    whole list: a sibling's reply would be wiped. A sibling's trigger is
    pending (a trigger is among the checkpoint's values until its node has
    run) and was written with ``node``'s, in the same step (the same
    version); a deferred node's, pending since an earlier step, is not a sibling.
    """
    values = checkpoint.get("channel_values") or {}
    if values.get("__pregel_tasks"):
        return True
    versions = checkpoint.get("channel_versions") or {}
    own = {version for channel, version in versions.items() if _starts(channel) == node}
    # (Only an edge's trigger of another node counts here; the step's channels, ``live_beside``, show a fan-in's.)
    return any(
        channel.startswith("branch:to:") and _starts(channel) != node and versions.get(channel) in own
        for channel in values
    )


def thread_of(config: Any) -> str | None:
    """The thread id of a run's config (``None`` when there is none; 0 and "" are threads, as LangGraph keeps them).

    As text: LangGraph saves a thread's checkpoints under ``str(thread_id)``,
    while a run's config keeps what the caller passed (7 for "7"), which a
    saver asked with it misses.
    """
    value = configurable_of(config).get("thread_id")
    return None if value is None else str(value)


def parent_checkpoint(configurable: Mapping[str, Any]) -> Flow[tuple[Any, bool]]:
    """The top graph's checkpoint of this step and ``True``; else its last one and ``False``; else ``(None, False)``.

    The step's is waited for while it is written in the background
    (durability ``"async"``, the default: a few milliseconds, at most
    ``_CHECKPOINT_WAIT``). Where it is never written (``"exit"``) the last one
    is a run old: its messages lead this run's when it is the parent's
    conversation.
    """
    saver = configurable.get(CONFIG_KEY_CHECKPOINTER)
    step = (configurable.get("checkpoint_map") or {}).get("")
    thread = thread_of({"configurable": configurable})
    if saver is None or step is None or thread is None:
        return None, False
    parent = {"thread_id": thread, "checkpoint_ns": ""}
    exact_config = {"configurable": {**parent, "checkpoint_id": step}}
    found = yield twin(saver.get_tuple, saver.aget_tuple, exact_config)
    waited = 0.0
    background = configurable.get(CONFIG_KEY_DURABILITY, "async") in (None, "async")  # (unset: the default)
    while found is None and background and waited < _CHECKPOINT_WAIT:
        yield twin(time.sleep, asyncio.sleep, _CHECKPOINT_POLL)
        waited += _CHECKPOINT_POLL
        found = yield twin(saver.get_tuple, saver.aget_tuple, exact_config)
    if found is not None:
        return found, True
    return (yield twin(saver.get_tuple, saver.aget_tuple, {"configurable": parent})), False


def runs_beside_others(config: Any) -> Flow[bool]:
    """Whether a node runs beside other nodes of its graph this step (parallel branches, a fan-in, sends).

    Read from the step's channels (``live_beside``); where they cannot be
    read, at the top of the graph from the step's checkpoint, else ``False``.
    """
    configurable = configurable_of(config)
    namespace = str(configurable.get("checkpoint_ns") or "")
    node = namespace.rpartition("|")[2].partition(":")[0]
    if not node:
        return False
    live = live_beside(configurable, node)
    if live is not None or "|" in namespace:
        return bool(live)
    found, exact = yield from parent_checkpoint(configurable)
    return bool(exact and found is not None and beside(found.checkpoint, node))


def sent_to(config: Any) -> str | None:
    """The graph node this run is, when a ``Send`` started it (its input is then the send's payload); else ``None``.

    LangGraph's task metadata gives a sent task the path ``("__pregel_push",
    <the send's index>, ...)``; a functional-API call's path holds its
    caller's path where the index would be.
    """
    metadata = config.get("metadata") if isinstance(config, dict) else None
    if not isinstance(metadata, Mapping):
        return None
    path = metadata.get("langgraph_path")
    if isinstance(path, tuple) and len(path) > 1 and path[0] == _SENT and isinstance(path[1], int):
        return str(metadata.get("langgraph_node") or "")
    return None


def refuse_a_payload(config: Any, messages: list[Any], key: str, who: str) -> None:
    """Refuse to compact a ``Send``'s payload where the graph's state does not hold it.

    A sent task is given the payload, but what it returns is written to its
    graph's state: a compaction of the payload there would replace the
    graph's conversation with the payload's summary. Only a payload that is
    the graph's list itself (the same ids, read from the step's channels) may
    be compacted.

    Raises:
        ConfigurationError: This run is a sent task whose messages are not the graph's.
    """
    node = sent_to(config)
    if node is None:
        return
    channels = step_channels(configurable_of(config))
    channel = None if channels is None else channels.get(key)
    try:
        held = channel.get() if channel is not None and channel.is_available() else []
    except Exception:
        held = None  # (cannot tell: refused, as a payload)
    ids = None if held is None else [getattr(m, "id", None) for m in held]
    if ids is not None and None not in ids and ids == [getattr(m, "id", None) for m in messages]:
        return
    raise ConfigurationError(
        "node",
        node,
        f"{who} is the target of Send({node!r}, ...): it is given the send's payload, not the graph's messages, "
        f"yet what it returns is written to the graph's {key!r}, where a compaction of the payload would replace "
        "the graph's conversation; compact the payload in a worker subgraph (a compiled graph holding the "
        f"CompactionNode and the worker's model, added as node {node!r}: it keeps its own state), or compact the "
        "graph's messages with a CompactionNode before the fan-out (a CompactionNode invoked with the sent node's "
        "config inside its function is taken for the node itself: call compact() on the payload there)",
    )


def current_store() -> Any:
    """The LangGraph store of the graph being run, or ``None`` (none given, or not inside a graph)."""
    try:
        from langgraph.config import get_store

        return get_store()
    except (ImportError, RuntimeError, KeyError):
        return None
