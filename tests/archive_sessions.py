"""Long sessions with the archive on, shared by the unit tests and the PostgreSQL tests."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from conftest import compaction_graph
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, messages_from_dict
from langchain_core.messages.tool import ToolMessage
from langgraph.graph import END, START, StateGraph
from langgraph.prebuilt import ToolNode

from langchain_compaction import CompactionMiddleware, CompactionNode, CompactionOptions
from langchain_compaction._lc.conversation import thread_label
from langchain_compaction._lc.convert import is_compaction_message
from langchain_compaction.archive import ARCHIVE_NAMESPACE
from langchain_compaction.features import Archive, default_features
from langchain_compaction.graph import CompactionState

FACT = "JG7FMM"
"""The booking code a user gives in turn 3 and the agent must recall much later."""

OPTIONS = CompactionOptions(context_window=3_000, reserve_tokens=500, keep_recent_tokens=500)


def summarize(prompt: str) -> str:
    return "## Goal\n- keep writing the report"


def user_text(thread: str, turn: int, fact: str = FACT) -> str:
    text = f"{thread} turn {turn}: please add a paragraph on the quarterly figures " + "and the outlook " * 6
    if turn == 3:
        text += f" The booking code is {fact}."
    return text


def namespace(thread: str) -> tuple[str, str]:
    return ARCHIVE_NAMESPACE, thread_label(thread)


def archived_messages(store: Any, thread: str) -> list[tuple[str, dict[str, Any], BaseMessage]]:
    """Every item of ``thread``'s archive: key, value, message."""
    # One search: offset pages are not stable on PostgresStore (ordered by update time).
    items = store.search(namespace(thread), limit=100_000)
    return [(i.key, i.value, messages_from_dict([i.value["message"]])[0]) for i in items]


def assert_each_message_once(sent: list[BaseMessage], state: list[BaseMessage], store: Any, thread: str) -> int:
    """Every message ever sent is in the final state or in the archive, exactly once; the archive's size."""
    archive = archived_messages(store, thread)
    where = Counter(m.id for m in state if not is_compaction_message(m))
    where.update(m.id for _, _, m in archive)
    assert {m.id for m in sent} == set(where), "a message is missing, or one was invented"
    assert all(where[m.id] == 1 for m in sent), [i for i, n in where.items() if n != 1]
    by_id = {m.id: m for _, _, m in archive}
    for message in sent:
        if message.id in by_id:
            assert by_id[message.id].content == message.content
    positions = sorted(int(v["position"]) for _, v, _ in archive)
    assert len(set(positions)) == len(positions)
    assert all(len(v["position"]) == 12 for _, v, _ in archive)
    return len(archive)


# -- a graph with the node -------------------------------------------------------


@dataclass
class GraphSession:
    """A graph (compaction node, then an agent node) and every message it was sent or made."""

    graph: Any
    node: CompactionNode
    thread: str
    sent: list[BaseMessage] = field(default_factory=list)

    @property
    def config(self) -> dict[str, Any]:
        return {"configurable": {"thread_id": self.thread}}

    def turn(self, number: int) -> dict[str, Any]:
        message = HumanMessage(user_text(self.thread, number), id=f"{self.thread}-h{number}")
        self.sent.append(message)
        out: dict[str, Any] = self.graph.invoke({"messages": [message]}, self.config)
        self.sent.append(out["messages"][-1])
        return out

    def recall(self, store: Any, **arguments: Any) -> str:
        """Call the node's recall tool through a real ``ToolNode`` in this thread, on the thread's state.

        (An agent's ``ToolNode`` runs in the same graph; here a second graph is
        given the thread's messages, so the tool reads the same record.)
        """
        tool = self.node.recall_tool()
        builder = StateGraph(CompactionState)
        builder.add_node("tools", ToolNode([tool]))
        builder.add_edge(START, "tools")
        builder.add_edge("tools", END)
        tools = builder.compile(store=store)
        call = AIMessage("", tool_calls=[{"name": tool.name, "args": arguments, "id": "recall-1", "type": "tool_call"}])
        state = self.graph.get_state(self.config).values.get("messages", [])
        out = tools.invoke({"messages": [*state, call]}, self.config)
        answer = out["messages"][-1]
        assert isinstance(answer, ToolMessage)
        return str(answer.content)


def graph_session(
    store: Any, saver: Any, thread: str, archive: Archive | None = None, **node_kwargs: Any
) -> GraphSession:
    features = [*default_features(), archive or Archive()]
    node = CompactionNode(summarize, OPTIONS, result_key="compaction", features=features, **node_kwargs)

    def agent(state: CompactionState) -> dict[str, Any]:
        asked = sum(1 for m in state["messages"] if isinstance(m, HumanMessage) and not is_compaction_message(m))
        return {"messages": [AIMessage(f"Here is paragraph {asked}. " + "The figures rose again. " * 5)]}

    return GraphSession(compaction_graph(node, agent, checkpointer=saver, store=store), node, thread)


# -- an agent with the middleware ------------------------------------------------------


def agent_script(turns: int) -> Iterator[AIMessage]:
    """One answer per turn, every fifth turn after a tool call; then a recall of the planted fact."""
    for turn in range(turns):
        if turn % 5 == 4:
            call = {"name": "lookup", "args": {"topic": f"figures {turn}"}, "id": f"call-{turn}", "type": "tool_call"}
            yield AIMessage("", tool_calls=[call])
        yield AIMessage(f"Answer {turn}: " + "the quarterly figures are in the report " * 4)
    recall = {"name": "recall_messages", "args": {"query": FACT}, "id": "recall-1", "type": "tool_call"}
    yield AIMessage("", tool_calls=[recall])
    yield AIMessage(f"The booking code was {FACT}.")


def lookup(topic: str) -> str:
    """Look a topic up in the notes."""
    return f"notes on {topic}: " + "revenue up, costs flat " * 6


def agent_middleware(**kwargs: Any) -> CompactionMiddleware:
    return CompactionMiddleware(summarize, OPTIONS, features=[*default_features(), Archive()], **kwargs)
