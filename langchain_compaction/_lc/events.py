"""Telling whoever listens: the custom events and stream of a compaction, and the update that writes it.

Every compaction logs at INFO on the ``langchain_compaction`` logger, sends the
custom event ``COMPACTION_EVENT`` with its ``CompactionRecord`` to callbacks
(and ``astream_events``), and writes ``{"langchain_compaction": record}`` to a
graph's ``stream_mode="custom"``. A turn that starts a preparation sends
``PREPARE_EVENT`` the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.callbacks import adispatch_custom_event, dispatch_custom_event
from langchain_core.messages import BaseMessage
from langchain_core.runnables import RunnableConfig, RunnableLambda
from langchain_core.runnables.config import ensure_config, get_callback_manager_for_config
from langgraph.graph.message import REMOVE_ALL_MESSAGES, add_messages

from langchain_compaction._lc.convert import as_dict, is_compaction_message
from langchain_compaction.core.effects import adrive, drive, twin

COMPACTION_EVENT = "langchain_compaction"
"""Name of the LangChain custom event dispatched after each compaction.

Its data is the ``CompactionRecord`` (``CompactionResult.to_dict()``).
"""

PREPARE_EVENT = "langchain_compaction_prepare"
"""Name of the custom event (and custom-stream key) a turn that starts a preparation sends."""


def _listening(config: RunnableConfig | None) -> bool:
    # dispatch_custom_event raises outside a run (a hook called directly, as in
    # a unit test of the hook); there is then no one to tell.
    return get_callback_manager_for_config(ensure_config(config)).parent_run_id is not None


def _to_custom_stream(name: str, data: Any) -> None:
    # Inside a graph, ``stream_mode="custom"`` shows it too.
    try:
        from langgraph.config import get_stream_writer

        writer = get_stream_writer()
    except (ImportError, RuntimeError, KeyError):
        return  # not inside a graph: nobody streams
    writer({name: data})


def tell(name: str, data: Any, config: RunnableConfig | None = None) -> None:
    """Tell whoever listens: the callbacks' custom event ``name``, and a graph's custom stream."""
    _to_custom_stream(name, data)
    if _listening(config):
        dispatch_custom_event(name, data, config=config)


async def atell(name: str, data: Any, config: RunnableConfig | None = None) -> None:
    """The async twin of ``tell``."""
    _to_custom_stream(name, data)
    if _listening(config):
        await adispatch_custom_event(name, data, config=config)


def replacement(messages: Sequence[BaseMessage]) -> list[BaseMessage | dict[str, Any]]:
    """The state update that replaces a message list with ``messages`` (an ``add_messages`` list).

    What this library wrote (the summary, the bridge, the removal of the old
    list) goes as plain message dicts, which the ``add_messages`` reducer turns
    back into messages: LangGraph's ``messages`` stream emits every message
    object a node returns that was not in its input, and a chat UI should not
    show a compaction's internals. Kept messages stay the caller's objects
    (they were in the input, so they are not emitted again either).
    """
    remove: dict[str, Any] = {"type": "remove", "id": REMOVE_ALL_MESSAGES, "content": ""}
    return [remove, *(as_dict(m) if is_compaction_message(m) else m for m in messages)]


def in_place(
    current: Sequence[BaseMessage], target: Sequence[BaseMessage]
) -> list[BaseMessage | dict[str, Any]] | None:
    """The update that turns ``current`` into ``target`` message by message, not by removing the whole list.

    ``add_messages`` keeps a message whose id the list holds in its place and
    appends the others: each message the compaction wrote (the summary, the
    bridge) takes the place, and the id, of one it takes out, and the rest
    are removed by id. A message another node adds in the same step (a
    parallel branch) is then neither removed nor moved, whichever update
    LangGraph applies first. ``None`` when ``target`` cannot be reached so
    (a message written where nothing is taken out, ids missing or repeated).
    """
    places = {m.id: i for i, m in enumerate(current) if isinstance(m, BaseMessage) and m.id is not None}
    if len(places) != len(current):
        return None
    wanted = [places.get(m.id) if m.id is not None else None for m in target]
    taken = set(wanted)
    free = [i for i in range(len(current)) if i not in taken]
    update: list[Any] = []
    ids: list[str | None] = []
    last = -1
    for index, written in enumerate(target):
        place, message = wanted[index], written
        if place is None:
            # The compaction's own messages go into the last places it frees before the next kept
            # message (a node trimming the oldest messages beside it is least likely to touch those).
            run = next((k for k, p in enumerate(wanted[index:]) if p is not None), len(target) - index)
            bound = next((p for p in wanted[index + 1 :] if p is not None), len(current))
            places_left = [i for i in free if last < i < bound]
            if len(places_left) < run:
                return None
            place = places_left[-run]
            free.remove(place)
            message = written.model_copy(update={"id": current[place].id})
        elif place <= last:
            return None
        last = place
        ids.append(message.id)
        if message is not current[place]:
            update.append(as_dict(message) if is_compaction_message(message) else message)
    for i in free:
        # (Sent again before its removal: a node beside it that removed it first does not make the removal raise.)
        update += [current[i], {"type": "remove", "id": current[i].id, "content": ""}]
    merged: Any = add_messages(list[Any](current), update)
    return update if [getattr(m, "id", None) for m in merged] == ids else None


RUN_NAME = "langchain_compaction"
"""The name of the run a node's compaction runs in (its summary calls are runs inside it)."""


def in_run(state: Any, flow: Any, config: RunnableConfig | None) -> Any:
    """A step that runs ``flow(run_config)`` inside a run of its own: traces show it, and its events have a parent.

    Its name is not the node's: LangGraph's ``messages`` stream emits the
    messages in the output of a run named after the node, and a compaction's
    internals are not for a chat UI.
    """

    def run(_value: Any, config: RunnableConfig) -> Any:
        return drive(flow(config))

    async def arun(_value: Any, config: RunnableConfig) -> Any:
        return await adrive(flow(config))

    runnable: RunnableLambda[Any, Any] = RunnableLambda(run, afunc=arun, name=RUN_NAME)
    return twin(runnable.invoke, runnable.ainvoke, state, config)
