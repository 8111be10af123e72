"""A CompactionNode that runs in one step beside other nodes: what they write in that step stays.

LangGraph applies the writes of a step one node after another, in the order
of their names; a replacement of the whole list applied after a sibling's
write would wipe it. Each topology below starts a sibling beside the node
(named to sort first, so its write is applied first), and every message the
sibling wrote must be in the state or in a summary at the end.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, MessagesState, StateGraph

from langchain_compaction import CompactionNode, CompactionOptions
from langchain_compaction._lc.convert import is_summary_message

OPTIONS = CompactionOptions(context_window=2_500, reserve_tokens=300, keep_recent_tokens=400)
MARK = re.compile(r"CTX\d+")


class Run:
    """One topology's run: the sibling's markers handed out, and the summaries seen."""

    def __init__(self) -> None:
        self.markers: list[str] = []
        self.turn_of: dict[str, int] = {}
        self.turn = 0

    def context(self, _: Any) -> dict[str, list[BaseMessage]]:
        marker = f"CTX{len(self.markers)}"
        self.markers.append(marker)
        self.turn_of[marker] = self.turn
        return {"messages": [HumanMessage(f"{marker} retrieved context " + "ctx " * 40, id=f"c-{marker}")]}

    @staticmethod
    def summarize(prompt: str) -> str:
        # An echo of every marker shown, the previous summary's included.
        return "## Goal\n- answer the questions\n## Critical Context\n- " + " ".join(sorted(set(MARK.findall(prompt))))

    @staticmethod
    def agent(state: MessagesState) -> dict[str, list[BaseMessage]]:
        messages = state["messages"]
        systems = [i for i, m in enumerate(messages) if isinstance(m, SystemMessage)]
        assert systems in ([], [0]), f"system messages at {systems}"
        return {"messages": [AIMessage("answer " + "a " * 60)]}

    def node(self) -> CompactionNode:
        return CompactionNode(self.summarize, OPTIONS)


def fan_out(run: Run, builder: StateGraph) -> None:
    builder.add_node("compact", run.node())  # type: ignore[call-overload]
    builder.add_node("a_context", run.context)
    builder.add_node("agent", run.agent)
    builder.add_edge(START, "compact")
    builder.add_edge(START, "a_context")
    builder.add_edge(["a_context", "compact"], "agent")
    builder.add_edge("agent", END)


def fan_in(run: Run, builder: StateGraph) -> None:
    # The sibling is a fan-in ("join:" trigger), started in the node's step.
    builder.add_node("lookup_a", lambda _: {})
    builder.add_node("lookup_b", lambda _: {})
    builder.add_node("a_context", run.context)
    builder.add_node("compact", run.node())  # type: ignore[call-overload]
    builder.add_node("agent", run.agent)
    builder.add_edge(START, "lookup_a")
    builder.add_edge(START, "lookup_b")
    builder.add_edge(["lookup_a", "lookup_b"], "a_context")
    builder.add_edge("lookup_a", "compact")
    builder.add_edge(["a_context", "compact"], "agent")
    builder.add_edge("agent", END)


def in_a_subgraph(run: Run, builder: StateGraph) -> None:
    inner = StateGraph(MessagesState)
    fan_out(run, inner)
    builder.add_node("team", inner.compile())
    builder.add_edge(START, "team")
    builder.add_edge("team", END)


def compiled(topology: Callable[[Run, StateGraph], None], run: Run, checkpointer: bool) -> Any:
    builder = StateGraph(MessagesState)
    topology(run, builder)
    return builder.compile(checkpointer=InMemorySaver() if checkpointer else None)


@pytest.mark.parametrize(
    ("topology", "checkpointer", "durability"),
    [
        (fan_out, True, None),
        (fan_out, False, None),
        (fan_out, True, "exit"),
        (fan_in, True, None),
        (in_a_subgraph, True, None),
    ],
    ids=["fan-out", "no checkpointer", "durability exit", "fan-in", "in a subgraph"],
)
def test_what_a_node_beside_it_writes_in_its_step_is_kept(
    topology: Callable[[Run, StateGraph], None], checkpointer: bool, durability: str | None
) -> None:
    run = Run()
    graph = compiled(topology, run, checkpointer)
    config: dict[str, Any] = {"configurable": {"thread_id": "t"}}
    kwargs = {"durability": durability} if durability else {}
    state: list[BaseMessage] = []
    for turn in range(16):
        run.turn = turn
        question = HumanMessage(f"question {turn} " + "xy " * 150)
        if checkpointer:
            state = graph.invoke({"messages": [question]}, config, **kwargs)["messages"]
        else:
            state = graph.invoke({"messages": [*state, question]}, **kwargs)["messages"]
    summaries = [m for m in state if is_summary_message(m)]
    assert summaries, "no compaction happened"
    shown = " ".join(str(m.content) for m in state)
    lost = [marker for marker in run.markers if marker not in shown]
    if topology is in_a_subgraph:
        # Its compaction goes up to the parent, and the subgraph starts its step over on the compacted
        # list (README): what the sibling wrote in the step left is written again, under a new marker.
        assert len(run.markers) > 16
        lost = [m for m in lost if sum(run.turn_of[other] == run.turn_of[m] for other in run.markers) == 1]
    assert len({run.turn_of[m] for m in run.markers}) == 16
    assert not lost, f"the sibling's messages {lost} are gone"


def test_a_node_beside_it_that_removes_a_message_the_compaction_removes_too_breaks_nothing() -> None:
    # add_messages raises on the removal of an id the list no longer holds: the sibling's removal,
    # applied first, must not make the compaction's fail the step.
    from langchain_core.messages import RemoveMessage

    run = Run()
    builder = StateGraph(MessagesState)
    builder.add_node("compact", run.node())  # type: ignore[call-overload]

    def tidy(state: MessagesState) -> dict[str, Any]:  # drops the oldest message that is no summary, every turn
        messages = [m for m in state["messages"] if not is_summary_message(m)]
        return {"messages": [RemoveMessage(id=str(messages[0].id))]} if len(messages) > 3 else {}

    builder.add_node("a_tidy", tidy)
    builder.add_node("agent", run.agent)
    builder.add_edge(START, "compact")
    builder.add_edge(START, "a_tidy")
    builder.add_edge(["a_tidy", "compact"], "agent")
    builder.add_edge("agent", END)
    graph = builder.compile(checkpointer=InMemorySaver())
    config: dict[str, Any] = {"configurable": {"thread_id": "t"}}
    for turn in range(14):
        graph.invoke({"messages": [HumanMessage(f"question {turn} " + "xy " * 500)]}, config)
    assert any(is_summary_message(m) for m in graph.get_state(config).values["messages"])
