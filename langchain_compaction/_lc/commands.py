"""The ``/compact`` chat command, and the edge that skips the model after it.

With ``CompactionNode(enable_compact_command=True)`` a final human message
``/compact [instructions]`` forces a compaction and is removed, so it never
reaches the model; ``route_after_compaction`` then ends the run (the last
message is the previous reply, not a question).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import BaseMessage, HumanMessage, RemoveMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.channels.binop import BinaryOperatorAggregate
from langgraph.channels.last_value import LastValue
from langgraph.constants import END
from langgraph.errors import InvalidUpdateError
from langgraph.graph.message import REMOVE_ALL_MESSAGES
from langgraph.types import Command, StateUpdate

from langchain_compaction._lc.conversation import CONFIG_KEY_SEND, opening_length
from langchain_compaction._lc.convert import is_bridge_message, is_summary_message, to_core
from langchain_compaction._lc.identity import starts_with
from langchain_compaction._lc.steps import step_channels, thread_of
from langchain_compaction.core.effects import Flow, twin
from langchain_compaction.errors import CompactionError, ConfigurationError, InvalidMessagesError

COMPACT_COMMAND = "/compact"
"""The chat command that forces a compaction when ``enable_compact_command`` is set."""


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


@dataclass(frozen=True, slots=True)
class Ask:
    """What one run of the node was asked: which messages, and how to compact them."""

    messages: list[BaseMessage]
    instructions: str = ""
    forced: bool = False
    command: BaseMessage | None = None
    stale: tuple[BaseMessage, ...] = ()  # a failed command's, taken out (``stale_commands``)
    held: list[BaseMessage] | None = None  # the messages as the state holds them, when not ``messages``


def asked(messages: list[BaseMessage], manual: str | None, *, commands: bool) -> Ask:
    """What a run over ``messages`` is asked (``manual`` forces one; with ``commands``, a final ``/compact`` does)."""
    if manual is not None:
        return Ask(messages, manual, forced=True)
    if not commands or not messages:
        return Ask(messages)
    parsed = parse_compact_command(messages[-1])
    if parsed is not None:
        return Ask(messages[:-1], parsed, forced=True, command=messages[-1], held=messages)
    stale = stale_commands(messages)
    if not stale:
        return Ask(messages)
    return Ask([m for m in messages if not any(m is s for s in stale)], stale=tuple(stale), held=messages)


def stale_commands(messages: Sequence[BaseMessage]) -> list[BaseMessage]:
    """The ``/compact`` commands among the newest human messages, before the last one.

    A command whose compaction failed stays in the thread (its run raised),
    and the user's next message follows it: taken out then, it never reaches
    the model. Only the trailing human messages are looked at (a turn's cost
    does not grow with the history).
    """
    found = []
    index = len(messages) - 2
    while index >= 0 and isinstance(messages[index], HumanMessage):
        if parse_compact_command(messages[index]) is not None:
            found.append(messages[index])
        index -= 1
    return found


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
    messages = read_messages(state, messages_key)
    if messages and isinstance(messages[-1], (HumanMessage, ToolMessage)):
        return goto
    return END


def check_reducer(messages: list[BaseMessage], config: Any, key: str = "messages") -> None:
    """Refuse, before anything is written, a graph state whose message list is not an ``add_messages`` list.

    In a graph run (``CONFIG_KEY_SEND`` in the config) the reducer of ``key``
    is asked what it makes of a replacement (``reducer_replaces``): another
    reducer (``operator.add``, the tutorials') or none would append a
    compaction's update to the list, or store it as the list, instead of
    applying it. Where the reducer cannot be reached, a newest message without
    an id (which ``add_messages`` gives every message) or one that is no
    message (``add_messages`` converts dicts and tuples) says the same.
    """
    configurable = (config or {}).get("configurable") or {}
    if not messages or CONFIG_KEY_SEND not in configurable:
        return
    replaces = reducer_replaces(configurable, key)
    newest = messages[-1]
    if replaces is False or (replaces is None and (not isinstance(newest, BaseMessage) or newest.id is None)):
        msg = (
            f"the state's {key!r} key does not use the add_messages reducer, so a compaction would be appended "
            "to it or stored as it, not applied; declare it Annotated[list[AnyMessage], add_messages] "
            "(langgraph.graph.message) or use MessagesState"
        )
        raise InvalidMessagesError(msg, index=len(messages) - 1)


_REPLACES: dict[Any, bool] = {}
"""What each reducer met made of a replacement (a handful per process: the reducers of the graphs' message keys)."""


def reducer_replaces(configurable: Mapping[str, Any], key: str) -> bool | None:
    """Whether the running graph's reducer of ``key`` applies a compaction's replacement; ``None``: cannot tell.

    The reducer is asked, once per reducer, on two messages: ``add_messages``,
    and any reducer of the user's own built on it, removes the old list and
    keeps the new; ``operator.add`` appends, and a key without a reducer
    (LangGraph's ``LastValue``) would store the update itself. The channels are
    read from LangGraph's task reader (``steps.step_channels``), not a
    public interface: where its shape differs, the answer is ``None``.
    """
    channels = step_channels(configurable)
    channel = channels.get(key) if channels is not None else None
    if isinstance(channel, LastValue):
        return False
    operator = getattr(channel, "operator", None)
    if not isinstance(channel, BinaryOperatorAggregate) or not callable(operator):
        return None
    try:
        known = _REPLACES.get(operator)
    except TypeError:  # (an unhashable reducer, a dataclass with ``__call__``: asked each time)
        return _replaces(operator)
    if known is None:
        known = _replaces(operator)
        if len(_REPLACES) < 64:
            _REPLACES[operator] = known
    return known


def _replaces(operator: Callable[[Any, Any], Any]) -> bool:
    try:
        old, new = HumanMessage("", id="compaction-probe-old"), HumanMessage("", id="compaction-probe-new")
        probe = operator([old], [RemoveMessage(id=REMOVE_ALL_MESSAGES), new])
        return [getattr(m, "id", None) for m in probe] == [new.id]
    except Exception:  # a reducer that cannot take a removal does not apply one
        return False


def read_messages(state: Any, key: str) -> list[BaseMessage]:
    """The message list under ``key`` of a graph state (a dict or an object), checked."""
    if isinstance(state, (BaseMessage, str, bytes)) or (isinstance(state, Sequence) and not hasattr(state, key)):
        # A message list, or what a functional-API entrypoint returned: it holds no list under ``key``
        # (a graph state is a dict, a dataclass or a model); read as one, it would never be compacted.
        msg = (
            f"the state is of type {type(state).__name__}, not a graph state holding a message list under "
            f"{key!r}: the node reads {{{key!r}: messages}}; a functional-API entrypoint compacts the list it "
            "keeps itself (langchain_compaction.auto_compact)"
        )
        raise InvalidMessagesError(msg)
    value = state.get(key) if isinstance(state, Mapping) else getattr(state, key, None)
    if value is None:
        return []
    if isinstance(value, BaseMessage) or not isinstance(value, Sequence) or isinstance(value, str):
        msg = f"state[{key!r}] is a {type(value).__name__}, not a list of messages; pass messages_key= naming the list"
        raise InvalidMessagesError(msg)
    messages = list(value)
    # What is read before the messages are counted (each new one is checked then): how the
    # conversation opens (``opening``) and the newest.
    for index in {*range(opening_length(messages)), len(messages) - 1} - {-1}:
        if not isinstance(messages[index], BaseMessage):
            to_core(messages[index], index)  # (a dict or a tuple: raises the error that says what to pass)
    return messages


def other_messages_key(state: Any, key: str) -> str | None:
    """The key a state keeps its messages under when it has no ``key`` (a forgotten ``messages_key``), if any."""
    if not isinstance(state, Mapping) or key in state:
        return None
    return next((k for k, v in state.items() if isinstance(v, list) and v and isinstance(v[0], BaseMessage)), None)


# -- compact_thread's reading and writing of a checkpointed thread ------------------------


def thread_run_config(config: Any) -> RunnableConfig:
    """The config of ``compact_thread``'s own run: the caller's callbacks, tags and metadata, and the thread.

    (Which conversation it is; the checkpoint itself is for the checkpointer.)
    """
    base = config or {}
    named = RunnableConfig(run_name="compact_thread")
    for key in ("callbacks", "tags", "metadata"):
        if key in base:
            named[key] = base[key]
    thread = thread_of(base)
    if thread is not None:
        named["configurable"] = {"thread_id": thread}
    return named


def idle_thread(graph: Any, config: Any) -> Flow[tuple[Any, bool]]:
    """The state of the thread ``config`` names, idle or stopped by an error (else the error that says why).

    Returns:
        The thread's state, and whether a step failed there (a model that
        refused a request too long for it): a thread to compact and resume.
    """
    if not isinstance(config, dict) or thread_of(config) is None:
        raise ConfigurationError(
            "config", config, "name the checkpointed thread to compact: {'configurable': {'thread_id': ...}}"
        )
    try:
        snapshot = yield twin(graph.get_state, graph.aget_state, config)
    except ValueError as error:
        if "checkpointer" not in str(error):
            raise
        raise ConfigurationError(
            "graph",
            graph,
            f"it has no checkpointer to read the thread from ({error}): compile it with one, "
            "builder.compile(checkpointer=InMemorySaver()); a subgraph's thread is compacted through its parent",
        ) from error
    named = _checkpoint_id(config)
    if named is not None:
        # A config read from an older state (``get_state_history``) names its checkpoint: written
        # from there, the compaction would fork the thread and leave every later turn off its history.
        latest = yield twin(graph.get_state, graph.aget_state, _thread_only(config))
        if _checkpoint(latest) != named:
            raise ConfigurationError(
                "config",
                named,
                "it names an older checkpoint of the thread, and compact_thread compacts the thread as it is "
                "now: pass {'configurable': {'thread_id': ...}} without checkpoint_id (to branch from an old "
                "checkpoint, update_state it first, then compact)",
            )
    tasks = getattr(snapshot, "tasks", ())
    errors = [t for t in tasks if t.error is not None]
    interrupted = any(t.interrupts for t in tasks)
    failed = bool(tasks) and len(errors) == len(tasks) and not interrupted
    if errors and not failed and not interrupted:
        # Compacted, the thread would start the step anew: what its other
        # tasks returned (kept in the checkpoint until it resumes) would be lost.
        raise ConfigurationError(
            "config",
            thread_of(config),
            f"a step of the thread's last run failed ({errors[0].name}: {errors[0].error!r}) while other tasks of "
            "the same step finished, and their results wait in the checkpoint for the run to resume: resume it "
            "(graph.invoke(None, config)) and compact once the run has ended",
        )
    if snapshot.next and not failed:
        _refuse_mid_run(graph, config, snapshot.next, interrupted)
    return snapshot, failed


def _refuse_mid_run(graph: Any, config: Any, pending: Sequence[str], interrupted: bool) -> None:
    """Refuse a thread a run has not finished: paused (``ConfigurationError``), or running or stopped."""
    # Written as the node's update, the compaction would make what runs next follow the node's edges:
    # a run paused at an interrupt (a tool call awaiting approval) would lose its pause, and the call its result.
    waits = set(getattr(graph, "interrupt_before_nodes", None) or ()) | set(
        getattr(graph, "interrupt_after_nodes", None) or ()
    )
    nodes = ", ".join(pending)
    if interrupted or "*" in waits or waits & set(pending):
        raise ConfigurationError(
            "thread_id",
            thread_of(config),
            f"the thread is paused mid-run (next: {nodes}, at an interrupt); resume it and compact once the run "
            "has ended, or let the graph's CompactionNode compact on its turn",
        )
    # No pause the graph knows of: a run is going on the thread (another process's turn), or one stopped
    # before it ended (a process that died, an interrupt_before given to that run). Resumed now, a run
    # still going would take its step twice.
    msg = (
        f"the thread is mid-run (next: {nodes}): another run is going on it, or one stopped before it ended; "
        "compact it once the run has ended (a run that stopped is finished with graph.invoke(None, config))"
    )
    raise CompactionError(msg)


def onto_current(config: Any, read: Any, now: Any, update: Any, key: str) -> Any:
    """``update``, made from the thread as ``read`` found it, for the thread as it is ``now`` (read again).

    Another process may serve the thread while the summary is made: the
    messages its turns added come after the ones the compaction covers, and
    are kept after its own. A thread compacted, edited or running meanwhile
    is not written over: the error says to compact it again.
    """
    if _checkpoint(now) == _checkpoint(read) or not isinstance(update, dict) or key not in update:
        return update
    before, after = read.values.get(key) or [], now.values.get(key) or []
    if now.next or not starts_with(after, before):
        raise CompactionError(
            f"thread {thread_of(config)!r} changed while its summary was made (a run started, or another writer "
            "compacted or edited its messages), so the compaction was not written and the thread is as that "
            "writer left it; compact it again once it is idle"
        )
    return {**update, key: [*update[key], *after[len(before) :]]}


def _thread_only(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` without the checkpoint it names: the thread (and its namespace) as it is now."""
    configurable = {k: v for k, v in config.get("configurable", {}).items() if k != "checkpoint_id"}
    return {**config, "configurable": configurable}


def _checkpoint(snapshot: Any) -> object:
    return _checkpoint_id(getattr(snapshot, "config", None) or {})


def _checkpoint_id(config: dict[str, Any]) -> object:
    """The checkpoint ``config`` names (``None``: the thread's latest)."""
    return config.get("configurable", {}).get("checkpoint_id")


def write_as_node(graph: Any, config: Any, update: Any, node: str | None, *, resume: bool = False) -> Flow[Any]:
    """Write ``update`` to the thread as ``node``'s own, the thread left idle whatever edge leaves the node.

    The steps that would follow the node are cleared: a static edge to the
    agent would otherwise have it answer again. (A command to a parent graph
    is written as it is; with ``resume``, a thread a failed step stopped, the
    update is written as the node that ran last, whose edges set what runs
    when it is resumed: the failed step again.)

    Returns:
        The config of the checkpoint written last.
    """
    if isinstance(update, Command):
        return (yield twin(graph.update_state, graph.aupdate_state, config, update, as_node=node))
    if resume:
        # Written as the node that ran last (the one whose edges started the
        # failed step), the step is the one to run again on resume; written as
        # the compaction node, its own edges would run instead (the model before the tool it called).
        try:
            return (yield twin(graph.update_state, graph.aupdate_state, config, update, as_node=None))
        except InvalidUpdateError as error:
            raise ConfigurationError(
                "config",
                thread_of(config),
                "the step that failed followed several nodes at once, so a compaction written now could not "
                f"leave it to run again ({error}): resume the run first (graph.invoke(None, config)) and compact "
                "once it has ended",
            ) from error
    steps = [[StateUpdate(update, node)], [StateUpdate(None, END)]]
    return (yield twin(graph.bulk_update_state, graph.abulk_update_state, config, steps))


def write_compaction(
    graph: Any, config: Any, read: Any, update: Any, *, key: str, node: str | None, resume: bool
) -> Flow[None]:
    """``update``, made from the thread as ``read`` found it, written as ``node``'s onto the thread as it is now.

    (``onto_current``, ``write_as_node``, then ``_put_back_raced``.)
    """
    config = _thread_only(config)  # (the latest checkpoint: one named was checked to be it)
    now = yield twin(graph.get_state, graph.aget_state, config)
    update = onto_current(config, read, now, update, key)
    written = yield from write_as_node(graph, config, update, node, resume=resume)
    if not resume and not isinstance(update, Command):
        yield from _put_back_raced(graph, config, written, now, key=key, node=node)


def _put_back_raced(graph: Any, config: Any, written: Any, now: Any, *, key: str, node: str | None) -> Flow[None]:
    """The messages a turn added between the last read (``now``) and the write, which the write wiped, put back.

    LangGraph applies an update to the thread's latest checkpoint when it is
    written, and a compaction replaces the whole list: a turn another process
    committed in between was in neither the state nor the archive. The two
    checkpoints ``write_as_node`` made (the node's update, then the end) say
    what it was applied to (their parent); what that held past ``now`` is
    added after the compaction (a summary another writer made there is not:
    this compaction covers what it covered).
    """
    at = written
    for _ in range(2):
        at = None if not isinstance(at, dict) else (yield twin(graph.get_state, graph.aget_state, at)).parent_config
    if not isinstance(at, dict) or _checkpoint_id(at) == _checkpoint(now):
        return
    base = yield twin(graph.get_state, graph.aget_state, at)
    if base.next:
        # That turn paused there (an interrupt awaiting approval) or was still running, and the write's end
        # step cleared it: the thread goes back to what it left (a copy of that checkpoint, its next steps too).
        yield twin(graph.bulk_update_state, graph.abulk_update_state, at, [[StateUpdate(None, "__copy__")]])
        raise CompactionError(
            f"thread {thread_of(config)!r} had a run pause or go on while the compaction was written, so the "
            "thread is back as that run left it; compact it again once it is idle"
        )
    known = {m.id for m in now.values.get(key) or []}
    wiped = [
        m
        for m in base.values.get(key) or []
        if m.id not in known and not is_summary_message(m) and not is_bridge_message(m)
    ]
    if wiped:
        steps = [[StateUpdate({key: wiped}, node)], [StateUpdate(None, END)]]
        yield twin(graph.bulk_update_state, graph.abulk_update_state, config, steps)
