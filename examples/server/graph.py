"""An offline agent that compacts its own history, served by LangGraph's Agent Server (see README.md).

The "model" is a deterministic node that needs no API key: it answers each
question in a few sentences and, when asked to look something up, calls the
``lookup`` tool first. A ``CompactionNode`` runs before it with a small window
(6,000 tokens), the archive on (every removed message is kept in the server's
store) and the next summary prepared ahead from 60% of the threshold.

Nothing here is compiled with a checkpointer or a store: the server attaches
its own to every run.
"""

from __future__ import annotations

import uuid
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from langchain_compaction import CompactionOptions, ExtractiveSummarizer
from langchain_compaction.features import Archive, Feature, PrepareAhead, default_features
from langchain_compaction.graph import CompactionNode, CompactionState

OPTIONS = CompactionOptions(context_window=6_000)
EXPLANATION = (
    "The service stays consistent because every change is logged before it is applied; "
    "after a crash the log is replayed from the last checkpoint and nothing acknowledged is lost. "
)


@tool
def lookup(topic: str) -> str:
    """Look up the notes kept on a topic."""
    return f"Notes on {topic}: " + "it keeps a write-ahead log, replays it on restart and checks each record. " * 12


def _text(message: BaseMessage) -> str:
    return message.content if isinstance(message.content, str) else str(message.content)


def agent(state: CompactionState) -> dict[str, Any]:
    """Answer the last question; call ``lookup`` first when the question asks to look something up."""
    last = state["messages"][-1]
    if isinstance(last, ToolMessage):
        return {"messages": [AIMessage(f"From the notes: {_text(last)[:400]}")]}
    question = _text(last) if isinstance(last, HumanMessage) else ""
    if question.lower().startswith("look up "):
        topic = question[len("look up ") :].strip() or "the system"
        call_id = "call_" + uuid.uuid5(uuid.NAMESPACE_URL, f"{last.id}:{topic}").hex[:16]
        call = {"name": "lookup", "args": {"topic": topic}, "id": call_id, "type": "tool_call"}
        return {"messages": [AIMessage("", tool_calls=[call])]}
    # Long on purpose: with the small window, a thread compacts every few turns.
    answer = f"You asked: {question[:200]}. {EXPLANATION * 10}Nothing else needs to change for this."
    return {"messages": [AIMessage(answer)]}


def build(features: list[Feature]) -> Any:
    """The agent graph, compiled without checkpointer or store (the server gives both)."""
    compact = CompactionNode(ExtractiveSummarizer(), OPTIONS, result_key="compaction", features=features)
    builder = StateGraph(CompactionState)
    builder.add_node("compact", compact)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode([lookup]))
    builder.add_edge(START, "compact")
    builder.add_edge("compact", "agent")
    builder.add_conditional_edges("agent", tools_condition, ["tools", END])
    builder.add_edge("tools", "compact")  # compact between a tool's result and the next model call
    return builder.compile()


# Built once, at import: the server reuses this graph (and the preparations
# PrepareAhead keeps in memory) for every run of every thread.
graph = build([*default_features(), Archive(), PrepareAhead(at=0.6, in_store=True)])

# The same agent without preparing ahead: each compaction summarizes on the spot.
graph_unprepared = build([*default_features(), Archive()])
