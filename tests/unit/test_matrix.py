"""The interaction matrix: every feature in every way a conversation is run.

Each cell is one feature (on top of the defaults) in one setup (a real
LangGraph graph or ``create_agent`` agent, with ``InMemorySaver`` and
``InMemoryStore``), run for about 30-35 turns of a fake agent. Every message
the user and the agent send carries a unique marker (``M0017``); the
summarizer is an *echo*: it writes back every marker it was shown (the
previous summary's included, as the update prompt holds it). At the end of a
cell:

(a) no turn raised;
(b) no marker was lost: each is in the current state (text or tool
    arguments, the summary included) or, with the archive on, in an archive
    item of the current timeline;
(c) every request the model was about to be sent is valid for the Anthropic
    Messages API (``assert_valid_anthropic_request``);
(d) with the archive on, no message is archived twice in the current timeline;
(e) the cell ran what it names: at least two distinct summaries were seen,
    and the feature took part (an output cleared, a prepared summary applied,
    a message pinned, an item archived; a ``/compact`` command compacted;
    the model overflowed at least twice).

Markers that must be nowhere in a conversation are checked too: a sub-agent's
state and archive never hold the other sub-agent's markers (nor does its recall
tool return them), and a fork's branch never holds the abandoned branch's (g);
a subgraph that shares the parent's messages keeps the parent small, with one
summary (f).
A failure message lists every problem of the cell, labelled with its letter.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar, TypedDict

import pytest
from conftest import assert_valid_anthropic_request
from langchain.agents import create_agent
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.exceptions import ContextOverflowError
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    BaseMessage,
    HumanMessage,
    ToolMessage,
    messages_from_dict,
)
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import BaseTool, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode
from langgraph.store.memory import InMemoryStore
from pydantic import Field

from langchain_compaction import CompactionMiddleware, CompactionNode, CompactionOptions
from langchain_compaction._lc.conversation import thread_label
from langchain_compaction.features import (
    Archive,
    ClearToolOutputs,
    Feature,
    PrepareAhead,
    default_features,
)
from langchain_compaction.graph import COMPACTION_EVENT, CompactionState, route_after_compaction
from langchain_compaction.tokens import estimate_message_tokens

MARKER = re.compile(r"M\d{4}")
MARK_KEY = "langchain_compaction"
ARCHIVE_PREFIX = "compaction_archive"
THREAD = "matrix"
TURNS = 35

RECURSION_LIMIT = 100
OVERFLOW_ABOVE = 2_500
"""The fake provider rejects a request (when an overflow is due) only above this estimate."""

OPTIONS = CompactionOptions(context_window=6_000, reserve_tokens=600, keep_recent_tokens=800, summary_max_tokens=1_500)

USER_FILLER = "please go on with the quarterly report, the outlook and the risks section "
AGENT_FILLER = "the figures rose again and the outlook section is now drafted in full "

FEATURES = ["facts", "pins", "clearing", "prepare", "prepare_in_store", "archive"]
SETUPS = [
    "one_worker",
    "two_workers",
    "compact_command",
    "overflow_retry",
    "time_travel_fork",
    "subgraph_to_parent",
    "graph_in_node_function",
    "sub_agents_one_thread",
    "restart",
    "beside_a_branch",
]


def cell_features(feature: str) -> list[Feature]:
    """Fresh feature objects (each adapter instance gets its own: nothing shared in memory)."""
    extra: dict[str, Callable[[], Feature]] = {
        "clearing": lambda: ClearToolOutputs(min_tokens=10, keep_tool_uses=1),
        "prepare": lambda: PrepareAhead(at=0.7, wait=2.0),
        "prepare_in_store": lambda: PrepareAhead(at=0.7, wait=2.0, in_store=True),
        "archive": Archive,
    }
    make = extra.get(feature)
    return [*default_features(), make()] if make is not None else default_features()


# -- the pieces every cell uses -----------------------------------------------------------


class Echo:
    """The summarizer: writes back every marker it was shown."""

    def __init__(self) -> None:
        self.calls = 0
        self.last = ""

    def __call__(self, prompt: str) -> str:
        self.calls += 1
        self.last = "## Goal\n- " + " ".join(sorted(set(MARKER.findall(prompt))))
        return self.last


class Ledger:
    """Every marker handed out: who it belongs to (a sub-agent) and in which turn."""

    def __init__(self) -> None:
        self.owner: dict[str, str] = {}
        self.turn_of: dict[str, int] = {}
        self.turn = 0
        self._lock = threading.Lock()

    def new(self, owner: str = "main") -> str:
        with self._lock:
            marker = f"M{len(self.owner):04d}"
            self.owner[marker] = owner
            self.turn_of[marker] = self.turn
            return marker

    def markers(self, owner: str = "main", turns: Callable[[int], bool] = lambda t: True) -> set[str]:
        return {m for m, o in self.owner.items() if o == owner and turns(self.turn_of[m])}


def is_summary(message: BaseMessage) -> bool:
    mark = message.additional_kwargs.get(MARK_KEY)
    return isinstance(mark, dict) and mark.get("kind") == "summary"


def text_of(message: BaseMessage) -> str:
    content = message.content if isinstance(message.content, str) else json.dumps(message.content)
    calls = [json.dumps(c.get("args")) for c in getattr(message, "tool_calls", None) or []]
    return " ".join([content, *calls])


class Requests:
    """What the model was about to be sent: the invalid requests, and the summaries seen."""

    def __init__(self) -> None:
        self.count = 0
        self.invalid: list[str] = []
        self.summaries: set[str | None] = set()
        self.last: list[BaseMessage] = []

    def check(self, messages: Sequence[BaseMessage], where: str) -> None:
        self.count += 1
        self.last = list(messages)
        # (By text: a summary written message by message keeps the place, and the id, of the one it replaces.)
        self.summaries.update(text_of(m) for m in messages if is_summary(m))
        try:
            assert_valid_anthropic_request(list(messages))
        except Exception as error:  # recorded, reported at the end
            kinds = [type(m).__name__[0] for m in messages]
            self.invalid.append(f"{where} request #{self.count}: {type(error).__name__}: {error} {''.join(kinds)}")


@dataclass
class Script:
    """The fake agent: one reply per call, from the conversation's last message and the turn's plan."""

    cell: Cell
    owner: str = "main"

    def reply(self, messages: Sequence[BaseMessage]) -> AIMessage:
        ledger = self.cell.ledger
        turn = ledger.turn
        marker = ledger.new(self.owner)
        last = messages[-1] if messages else None
        plan = self.cell.tool_plan(turn) if isinstance(last, HumanMessage) else None
        if plan is not None:
            name, args = plan
            call = {"name": name, "args": args, "id": f"call-{marker}", "type": "tool_call"}
            return AIMessage(f"{marker} calling {name} for turn {turn}", id=f"ai-{marker}", tool_calls=[call])
        return AIMessage(f"{marker} answer to turn {turn}: " + AGENT_FILLER * self.cell.size(turn), id=f"ai-{marker}")


def make_tools(big: bool) -> list[BaseTool]:
    repeat = 150 if big else 6

    @tool
    def lookup(topic: str) -> str:
        """Look a topic up in the notes."""
        return f"notes on {topic}: " + "revenue up, costs flat, margins steady. " * repeat

    @tool
    def write_todos(todos: list[str]) -> str:
        """Write the todo list."""
        return f"Updated the todo list ({len(todos)} items)."

    return [lookup, write_todos]


class Results(BaseCallbackHandler):
    """Every compaction's record, as the adapters announce it (the custom event ``COMPACTION_EVENT``)."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []

    def on_custom_event(self, name: str, data: Any, **kwargs: Any) -> None:
        if name == COMPACTION_EVENT:
            self.records.append(data)


def settle() -> None:
    """Wait for background preparations to finish (a preparation runs in its own thread)."""
    for thread in threading.enumerate():
        if thread.name == "langchain-compaction-prepare":
            thread.join(timeout=2.0)


@dataclass
class Cell:
    """One cell's shared state: its feature, summarizers, markers and request log."""

    feature: str
    setup: str
    ledger: Ledger = field(default_factory=Ledger)
    requests: dict[str, Requests] = field(default_factory=dict)
    echoes: dict[str, Echo] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    results: Results = field(default_factory=Results)
    archived: int = 0  # archive items of the current timeline(s) at the end
    commands: int = 0  # /compact commands that compacted

    @property
    def archive_on(self) -> bool:
        return self.feature == "archive"

    @property
    def pins_exercised(self) -> bool:
        return self.feature != "facts"

    def echo(self, owner: str = "main") -> Echo:
        return self.echoes.setdefault(owner, Echo())

    def log(self, owner: str = "main") -> Requests:
        return self.requests.setdefault(owner, Requests())

    def tool_plan(self, turn: int) -> tuple[str, dict[str, Any]] | None:
        if self.pins_exercised and turn in (1, 17):
            return "write_todos", {"todos": [f"draft part {turn}", f"check part {turn}", "send the report"]}
        # With clearing, a lookup (a large output) every turn where the messages are short.
        if (self.feature == "clearing" and self.size(turn) < 10) or turn % 4 == 3:
            return "lookup", {"topic": f"topic {turn}"}
        return None

    def size(self, turn: int) -> int:
        """How long (in filler phrases) a message of ``turn`` is: with clearing, short in stretches
        where the tool outputs dominate (so clearing alone lands), long elsewhere (so summaries happen)."""
        if self.feature == "clearing" and (turn // 8) % 2 == 0:
            return 2
        return 10

    def tools(self) -> list[BaseTool]:
        return make_tools(big=self.feature == "clearing")

    def human(self, turn: int, owner: str = "main") -> HumanMessage:
        marker = self.ledger.new(owner)
        pinned = self.pins_exercised and turn == 2
        kwargs = {"compaction_pin": True} if pinned else {}
        filler = "keep this pinned note. " if pinned else USER_FILLER * self.size(turn)
        text = f"{marker} {owner} user turn {turn}: " + filler
        return HumanMessage(text, id=f"h-{marker}", additional_kwargs=kwargs)

    def context(self) -> HumanMessage:
        """What a retrieval step beside the compaction adds to the turn (``node_graph(beside=True)``)."""
        marker = self.ledger.new()
        return HumanMessage(f"{marker} retrieved context: " + USER_FILLER * 2, id=f"c-{marker}")

    def node(self, owner: str = "main", **kwargs: Any) -> CompactionNode:
        return CompactionNode(self.echo(owner), OPTIONS, features=cell_features(self.feature), **kwargs)


@dataclass
class View:
    """One conversation to check: its markers, its current messages, its archive items (current timeline)."""

    name: str
    markers: set[str]
    messages: list[BaseMessage]
    items: list[Any]
    summaries_seen: set[str | None]
    foreign: set[str] = field(default_factory=set)  # markers that must be nowhere in it (state, summary, archive)


# -- reading the archive ---------------------------------------------------------------------


def current_mark(messages: Sequence[BaseMessage]) -> dict[str, Any] | None:
    marks = [m.additional_kwargs[MARK_KEY] for m in messages if is_summary(m)]
    return marks[-1] if marks else None


def timeline_items(store: Any, thread: str, messages: Sequence[BaseMessage]) -> list[Any]:
    """The archive items of the current timeline of the conversation ``messages`` is the state of."""
    mark = current_mark(messages)
    if mark is None:
        return []
    namespace = (ARCHIVE_PREFIX, thread_label(thread), *(thread_label(p) for p in mark.get("namespace") or ()))
    lineage = set(mark.get("lineage") or ())
    items = [i for i in store.search(namespace, limit=100_000) if tuple(i.namespace) == namespace]
    return [i for i in items if i.value.get("lineage") in lineage or i.value.get("cleared") is True]


def item_text(item: Any) -> str:
    return text_of(messages_from_dict([item.value["message"]])[0])


# -- the agents --------------------------------------------------------------------------------


def node_graph(
    cell: Cell,
    *,
    owner: str = "main",
    key: str = "messages",
    state: Any = CompactionState,
    command: bool = False,
    nested: str = "parent",
    beside: bool = False,
    **compile_kwargs: Any,
) -> tuple[Any, CompactionNode, Script]:
    """START -> compact -> agent -> (tools -> compact ...) -> END, the agent a fake model checking its input.

    ``beside``: START also runs a node that adds a message of its own in the
    compaction's step (a retrieval step), named so that LangGraph applies its
    write first; both lead to the agent, and the tools lead back to the agent.
    """
    node = cell.node(owner, messages_key=key, nested=nested, enable_compact_command=command)
    script = Script(cell, owner)
    log = cell.log(owner)

    def agent(values: dict[str, Any]) -> dict[str, Any]:
        messages = values[key]
        log.check(messages, f"{owner} agent")
        reply = script.reply(messages)
        return {key: [reply]}

    def after_agent(values: dict[str, Any]) -> str:
        last = values[key][-1]
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else END

    builder = StateGraph(state)
    builder.add_node("compact", node)  # type: ignore[call-overload]
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode(cell.tools(), messages_key=key))
    builder.add_edge(START, "compact")
    if beside:
        # (It writes in the step the compaction does: a replacement of the whole list would wipe its message.)
        builder.add_node("a_context", lambda values: {key: [cell.context()]})
        builder.add_edge(START, "a_context")
        builder.add_edge(["a_context", "compact"], "agent")
        builder.add_conditional_edges("agent", after_agent, {"tools": "tools", END: END})
        builder.add_edge("tools", "agent")
        return builder.compile(**compile_kwargs), node, script
    if command:
        builder.add_conditional_edges(
            "compact",
            lambda values: route_after_compaction(values, goto="agent", messages_key=key),
            {"agent": "agent", END: END},
        )
    else:
        builder.add_edge("compact", "agent")
    builder.add_conditional_edges("agent", after_agent, {"tools": "tools", END: END})
    builder.add_edge("tools", "compact")
    return builder.compile(**compile_kwargs), node, script


class ScriptedModel(GenericFakeChatModel):
    """A fake chat model for ``create_agent``: checks each request, replies from the script, overflows on demand."""

    script: Any = None
    log: Any = None
    overflow_due: bool = False
    overflows: int = 0
    messages: Any = Field(default_factory=lambda: iter(()))

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedModel:
        return self

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        # Due once every ten turns, it fires on the first request large enough that a provider
        # could plausibly reject it (never on a context just compacted to a fraction of the window).
        if self.overflow_due and estimate_message_tokens(messages) > OVERFLOW_ABOVE:
            self.overflow_due = False
            self.overflows += 1
            msg = "prompt is too long: 210000 tokens > 200000 maximum"
            raise ContextOverflowError(msg)
        self.log.check(messages, "model")
        return ChatResult(generations=[ChatGeneration(message=self.script.reply(messages))])


# -- the drivers: one per setup ----------------------------------------------------------------


class Driver:
    """Runs one setup: ``turn(n)`` sends the user's n-th message; ``views()`` are what to check."""

    def __init__(self, cell: Cell) -> None:
        self.cell = cell
        self.saver = InMemorySaver()
        self.store = InMemoryStore()
        # A turn takes a dozen steps at most: a loop fails fast instead of running to LangGraph's 10,000.
        self.config: dict[str, Any] = {
            "configurable": {"thread_id": THREAD},
            "callbacks": [cell.results],
            "recursion_limit": RECURSION_LIMIT,
        }

    def turn(self, n: int) -> None:
        raise NotImplementedError

    def final_state(self) -> list[BaseMessage]:
        raise NotImplementedError

    def archive_items(self) -> list[Any]:
        return timeline_items(self.store, THREAD, self.final_state())

    def expected(self) -> set[str]:
        return self.cell.ledger.markers()

    def views(self) -> list[View]:
        state = self.final_state()
        seen = self.cell.log().summaries | {text_of(m) for m in state if is_summary(m)}
        return [View("main", self.expected(), state, self.archive_items(), seen)]


class OneWorker(Driver):
    def __init__(self, cell: Cell) -> None:
        super().__init__(cell)
        self.graph = self.build()

    def build(self, **kwargs: Any) -> Any:
        return node_graph(self.cell, checkpointer=self.saver, store=self.store, **kwargs)[0]

    def turn(self, n: int) -> None:
        self.graph.invoke({"messages": [self.cell.human(n)]}, self.config)

    def final_state(self) -> list[BaseMessage]:
        return list(self.graph.get_state(self.config).values["messages"])


class TwoWorkers(OneWorker):
    def __init__(self, cell: Cell) -> None:
        super().__init__(cell)
        self.graphs = [self.graph, self.build()]  # two CompactionNode instances, one saver, one store

    def turn(self, n: int) -> None:
        self.graphs[n % 2].invoke({"messages": [self.cell.human(n)]}, self.config)


class CompactCommand(OneWorker):
    def build(self, **kwargs: Any) -> Any:
        return super().build(command=True)

    def turn(self, n: int) -> None:
        # Every fourteenth turn: far enough apart that automatic compactions (and prepared ones) happen too.
        if n % 14 == 13:
            command = HumanMessage("/compact keep the markers", id=f"command-{n}")
            before = len(self.cell.results.records)
            out = self.graph.invoke({"messages": [command]}, self.config)
            if any(m.id == command.id for m in out["messages"]):
                self.cell.problems.append(f"(e) turn {n}: the /compact command message is still in the state")
            self.cell.commands += len(self.cell.results.records) > before
        else:
            super().turn(n)


class OverflowRetry(Driver):
    def __init__(self, cell: Cell) -> None:
        super().__init__(cell)
        self.model = ScriptedModel(script=Script(cell), log=cell.log())
        middleware = CompactionMiddleware(cell.echo(), OPTIONS, features=cell_features(cell.feature))
        self.agent = create_agent(
            self.model,
            tools=cell.tools(),
            system_prompt="You write the quarterly report.",
            middleware=[middleware],
            checkpointer=self.saver,
            store=self.store,
        )

    def turn(self, n: int) -> None:
        if n % 10 == 5:
            self.model.overflow_due = True
        self.agent.invoke({"messages": [self.cell.human(n)]}, self.config)

    def final_state(self) -> list[BaseMessage]:
        return list(self.agent.get_state(self.config).values["messages"])

    def views(self) -> list[View]:
        if self.model.overflows < 2:
            self.cell.problems.append(f"(e) the model overflowed only {self.model.overflows} time(s)")
        return super().views()


class TimeTravelFork(OneWorker):
    FORK_AT = 20

    def __init__(self, cell: Cell) -> None:
        super().__init__(cell)
        self.fork_turn: int | None = None

    def turn(self, n: int) -> None:
        if n != self.FORK_AT:
            return super().turn(n)
        snapshot = self.pick()
        self.graph.invoke(
            {"messages": [self.cell.human(n)]}, {**self.config, "configurable": snapshot.config["configurable"]}
        )

    def pick(self) -> Any:
        """An end-of-turn checkpoint from the middle, before the last compaction (after an earlier one if any)."""

        def number(messages: Sequence[BaseMessage]) -> int:
            mark = current_mark(messages)
            return int(mark.get("compaction") or 0) if mark else 0

        final = number(self.final_state())
        candidates = []
        for snapshot in self.graph.get_state_history(self.config):
            messages = snapshot.values.get("messages") or []
            if snapshot.next or not messages or not isinstance(messages[-1], AIMessage):
                continue
            found = MARKER.findall(str(messages[-1].content))
            if not found:
                continue
            candidates.append((self.cell.ledger.turn_of[found[0]], number(messages), snapshot))
        assert final >= 1, "harness: no compaction in the first 20 turns to fork before"
        before = [c for c in candidates if c[1] < final]
        preferred = [c for c in before if c[1] >= 1] or before
        assert preferred, "harness: no checkpoint before the last compaction"
        turn, _, snapshot = min(preferred, key=lambda c: abs(c[0] - 12))
        self.fork_turn = turn
        return snapshot

    def expected(self) -> set[str]:
        fork = self.fork_turn
        assert fork is not None
        return self.cell.ledger.markers(turns=lambda t: t <= fork or t >= self.FORK_AT)

    def views(self) -> list[View]:
        (view,) = super().views()
        view.foreign = self.cell.ledger.markers() - view.markers  # the abandoned branch's
        return [view]


class SubgraphToParent(Driver):
    def __init__(self, cell: Cell) -> None:
        super().__init__(cell)
        sub, _, _ = node_graph(cell)
        builder = StateGraph(CompactionState)
        builder.add_node("assistant", sub)
        builder.add_edge(START, "assistant")
        builder.add_edge("assistant", END)
        self.graph = builder.compile(checkpointer=self.saver, store=self.store)

    def turn(self, n: int) -> None:
        out = self.graph.invoke({"messages": [self.cell.human(n)]}, self.config)
        parent = out["messages"]
        sub = len(self.cell.log().last) + 1  # the subgraph's state: the agent's last input and its reply
        summaries = sum(1 for m in parent if is_summary(m))
        if summaries > 1:
            self.cell.problems.append(f"(f) turn {n}: the parent's state holds {summaries} summaries")
        if len(parent) > 2 * sub:
            self.cell.problems.append(f"(f) turn {n}: the parent holds {len(parent)} messages, the subgraph {sub}")

    def final_state(self) -> list[BaseMessage]:
        return list(self.graph.get_state(self.config).values["messages"])


class GraphInNodeFunction(Driver):
    NODE = "run_sub"

    def __init__(self, cell: Cell) -> None:
        super().__init__(cell)
        sub, _, _ = node_graph(cell, checkpointer=True)

        def run_sub(values: dict[str, Any]) -> dict[str, Any]:
            out = sub.invoke({"messages": [values["messages"][-1]]})
            return {"messages": [out["messages"][-1]]}

        builder = StateGraph(CompactionState)
        builder.add_node(self.NODE, run_sub)
        builder.add_edge(START, self.NODE)
        builder.add_edge(self.NODE, END)
        self.graph = builder.compile(checkpointer=self.saver, store=self.store)

    def turn(self, n: int) -> None:
        self.graph.invoke({"messages": [self.cell.human(n)]}, self.config)

    def final_state(self) -> list[BaseMessage]:
        """The subgraph's own state, as its checkpointer (the parent's, under its namespace) holds it."""
        config = {"configurable": {"thread_id": THREAD, "checkpoint_ns": self.NODE}}
        found = self.saver.get_tuple(config)
        assert found is not None, "harness: no checkpoint of the subgraph under its namespace"
        return list(found.checkpoint["channel_values"].get("messages") or [])


class AlphaState(TypedDict):
    alpha_messages: Annotated[list[AnyMessage], add_messages]


class BetaState(TypedDict):
    beta_messages: Annotated[list[AnyMessage], add_messages]


class TeamState(TypedDict):
    alpha_messages: Annotated[list[AnyMessage], add_messages]
    beta_messages: Annotated[list[AnyMessage], add_messages]


class SubAgentsOneThread(Driver):
    AGENTS: ClassVar[dict[str, Any]] = {"alpha": AlphaState, "beta": BetaState}

    def __init__(self, cell: Cell) -> None:
        super().__init__(cell)
        builder = StateGraph(TeamState)
        self.nodes: dict[str, CompactionNode] = {}
        for name, state in self.AGENTS.items():
            sub, node, _ = node_graph(cell, owner=name, key=f"{name}_messages", state=state, nested="own")
            self.nodes[name] = node
            builder.add_node(name, sub)
            builder.add_edge(START, name)
            builder.add_edge(name, END)
        self.graph = builder.compile(checkpointer=self.saver, store=self.store)

    def turn(self, n: int) -> None:
        update = {f"{name}_messages": [self.cell.human(n, name)] for name in self.AGENTS}
        self.graph.invoke(update, self.config)

    def own_state(self, name: str) -> list[BaseMessage]:
        """The sub-agent's state at the end: its agent's last input, and the reply it wrote."""
        log = self.cell.log(name)
        replies = [m for m in self.final_state_of(name) if isinstance(m, AIMessage)]
        return [*log.last, replies[-1]] if replies else list(log.last)

    def final_state_of(self, name: str) -> list[BaseMessage]:
        return list(self.graph.get_state(self.config).values[f"{name}_messages"])

    def final_state(self) -> list[BaseMessage]:
        return self.own_state("alpha")

    def recall(self, name: str, queries: Sequence[str]) -> list[str]:
        """Ask ``name``'s recall tool (in a ToolNode, on its state, in this thread) for each query."""
        key = f"{name}_messages"
        calls = [
            {"name": "recall_messages", "args": {"query": q, "limit": 50}, "id": f"recall-{i}", "type": "tool_call"}
            for i, q in enumerate(queries)
        ]

        class Asking(TypedDict):
            messages: Annotated[list[AnyMessage], add_messages]
            alpha_messages: Annotated[list[AnyMessage], add_messages]
            beta_messages: Annotated[list[AnyMessage], add_messages]

        builder = StateGraph(Asking)
        builder.add_node("tools", ToolNode([self.nodes[name].recall_tool(max_chars=20_000)]))
        builder.add_edge(START, "tools")
        builder.add_edge("tools", END)
        graph = builder.compile(store=self.store)
        values = {"messages": [AIMessage("", tool_calls=calls)], key: self.own_state(name)}
        out = graph.invoke(values, self.config)
        return [str(m.content) for m in out["messages"] if isinstance(m, ToolMessage)]

    def views(self) -> list[View]:
        views = []
        for name in self.AGENTS:
            state = self.own_state(name)
            other = next(o for o in self.AGENTS if o != name)
            seen = self.cell.log(name).summaries | {text_of(m) for m in state if is_summary(m)}
            items = timeline_items(self.store, THREAD, state)
            views.append(
                View(name, self.cell.ledger.markers(name), state, items, seen, self.cell.ledger.markers(other))
            )
        if self.cell.archive_on:
            beta = sorted(self.cell.ledger.markers("beta"))[::6]
            for answer in self.recall("alpha", beta):
                leaked = set(MARKER.findall(answer)) & set(beta)
                if leaked:
                    self.cell.problems.append(f"(g) alpha's recall returned beta's markers {sorted(leaked)}")
        return views


class Restart(OneWorker):
    AT = 15

    def turn(self, n: int) -> None:
        if n == self.AT:
            self.graph = self.build()  # a new graph and CompactionNode over the same saver and store
        super().turn(n)


class BesideABranch(OneWorker):
    def build(self, **kwargs: Any) -> Any:
        return super().build(beside=True)


DRIVERS: dict[str, type[Driver]] = {
    "one_worker": OneWorker,
    "two_workers": TwoWorkers,
    "compact_command": CompactCommand,
    "overflow_retry": OverflowRetry,
    "time_travel_fork": TimeTravelFork,
    "subgraph_to_parent": SubgraphToParent,
    "graph_in_node_function": GraphInNodeFunction,
    "sub_agents_one_thread": SubAgentsOneThread,
    "restart": Restart,
    "beside_a_branch": BesideABranch,
}


# -- the checks --------------------------------------------------------------------------------


def check_view(cell: Cell, view: View) -> list[str]:
    problems = []
    cell.archived += len(view.items)
    shown = [text_of(m) for m in view.messages]
    archived = [item_text(i) for i in view.items] if cell.archive_on else []
    found = set(MARKER.findall(" ".join([*shown, *archived])))
    lost = sorted(view.markers - found)
    if lost:
        turns = sorted({cell.ledger.turn_of[m] for m in lost})
        problems.append(f"(b) {view.name}: {len(lost)} marker(s) lost {lost[:12]} (turns {turns})")
    summaries = {s for s in view.summaries_seen if s is not None}
    if len(summaries) < 2:
        problems.append(f"(e) {view.name}: only {len(summaries)} compaction(s) seen")
    if cell.archive_on:
        ids = Counter(i.value.get("id") for i in view.items)
        twice = sorted(str(i) for i, n in ids.items() if n > 1)
        if twice:
            problems.append(f"(d) {view.name}: {len(twice)} message(s) archived twice in the timeline: {twice[:8]}")
    leaked = view.foreign & found
    if leaked:
        problems.append(
            f"(g) {view.name}: {len(leaked)} foreign marker(s) in its state or archive: {sorted(leaked)[:8]}"
        )
    return problems


def check_exercised(cell: Cell) -> list[str]:
    """The cell really ran what it names (else it proves nothing)."""
    records = cell.results.records
    parts = [r.get("parts") or {} for r in records]
    wanted = {
        "pins": any((p.get("pins") or {}).get("pinned") for p in parts),
        "clearing": any((p.get("clearing") or {}).get("cleared") for p in parts),
        "prepare": any((p.get("prepared") or {}).get("applied") for p in parts),
        "prepare_in_store": any((p.get("prepared") or {}).get("applied") for p in parts),
        # Archive writes no parts["archive"] record (its docstring says it does): its items are the proof.
        "archive": bool(cell.archived),
    }
    problems = []
    if not wanted.get(cell.feature, True):
        problems.append(f"(e) {cell.feature} took no part in any of the {len(records)} compactions")
    if cell.setup == "compact_command" and not cell.commands:
        problems.append("(e) no /compact command compacted")
    return problems


def run_cell(feature: str, setup: str, turns: int = TURNS) -> Cell:
    cell = Cell(feature, setup)
    driver = DRIVERS[setup](cell)
    for n in range(turns):
        cell.ledger.turn = n
        try:
            driver.turn(n)
        except Exception as error:  # (a): any exception in a turn fails the cell
            cell.problems.insert(0, f"(a) turn {n} raised {type(error).__name__}: {error}")
            break
        settle()
    for owner, log in cell.requests.items():
        cell.problems += [f"(c) {line}" for line in log.invalid[:5]]
        if len(log.invalid) > 5:
            cell.problems.append(f"(c) {owner}: {len(log.invalid)} invalid requests in all")
    try:
        for view in driver.views():
            cell.problems += check_view(cell, view)
    except Exception as error:  # a harness or library failure: reported, not hidden
        cell.problems.append(f"reading the final state raised {type(error).__name__}: {error}")
    cell.problems += check_exercised(cell)
    return cell


@pytest.mark.parametrize("setup", SETUPS)
@pytest.mark.parametrize("feature", FEATURES)
def test_matrix(feature: str, setup: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="langchain_compaction")
    cell = run_cell(feature, setup)
    assert not cell.problems, "\n".join(cell.problems)
