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

_CHECKPOINT_WAIT = 2.0
"""How long a node waits for the checkpoint of its step while it is written in the background."""
_CHECKPOINT_POLL = 0.01
CONFIG_KEY_DURABILITY = "__pregel_durability"
"""Where LangGraph tells a task its run's durability (``"sync"``, ``"async"``, ``"exit"``)."""
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
    if saver is None or step is None:
        return None, False
    parent = {"thread_id": configurable.get("thread_id"), "checkpoint_ns": ""}
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
