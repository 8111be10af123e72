"""How the saved 0.1.0 states in this folder were made (run once, with 0.1.0 installed).

python tests/data/v0_1_0/make_state.py

It is kept as the record of what the files hold; the tests only read them.
- ``graph_state.json``: the state of a LangGraph thread after three compactions
  by CompactionNode: ``messages`` (``messages_to_dict``: system prompt, marked
  summary, bridge user turn, kept tool exchanges, AI replies carrying
  usage_metadata) and the ``compaction`` result key.
- ``history.json`` / ``history_archive.json``: a FileChatMessageHistory session
  compacted twice by CompactingChatMessageHistory with an archive: the summary
  carries the archive counter (``archived``).
"""

from __future__ import annotations

import json
from pathlib import Path

from langchain_community.chat_message_histories import FileChatMessageHistory
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage, messages_to_dict
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph

import langchain_compaction
from langchain_compaction import CompactingChatMessageHistory, CompactionNode, CompactionOptions, ExtractiveSummarizer
from langchain_compaction.graph import CompactionState

HERE = Path(__file__).resolve().parent
assert langchain_compaction.__version__ == "0.1.0"


def turn_messages(turn: int) -> list:
    call = {"name": "read_file", "args": {"path": f"src/mod_{turn}.py"}, "id": f"call_{turn}"}
    usage = {"input_tokens": 900 + 120 * turn, "output_tokens": 40, "total_tokens": 940 + 120 * turn}
    return [
        AIMessage(f"Reading src/mod_{turn}.py.", tool_calls=[call], id=f"ai-call-{turn}", usage_metadata=usage),
        ToolMessage(f"def handler_{turn}():\n    return {turn}\n" * 12, tool_call_id=f"call_{turn}", id=f"tool-{turn}"),
    ]


def make_graph() -> None:
    options = CompactionOptions(context_window=3_000, reserve_tokens=600, keep_recent_tokens=700)
    node = CompactionNode(ExtractiveSummarizer(), options, result_key="compaction")

    def agent(state: CompactionState) -> dict:
        last = state["messages"][-1]
        if isinstance(last, HumanMessage):
            turn = int(str(last.id).split("-")[-1])
            return {"messages": turn_messages(turn)}
        return {}

    builder = StateGraph(CompactionState)
    builder.add_node("compact", node)
    builder.add_node("agent", agent)
    builder.add_edge(START, "compact")
    builder.add_edge("compact", "agent")
    graph = builder.compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "old-thread"}}
    graph.invoke({"messages": [SystemMessage("You are a careful coding agent.", id="system-prompt")]}, config)
    summaries: set[str] = set()
    turn = 0
    while len(summaries) < 3:
        text = f"Step {turn}: never edit tests/fixtures.json; fix mod_{turn}."
        state = graph.invoke({"messages": [HumanMessage(text, id=f"user-{turn}")]}, config)
        summaries |= {m.id for m in state["messages"] if m.additional_kwargs.get("langchain_compaction")}
        turn += 1
    saved = {"messages": messages_to_dict(state["messages"]), "compaction": state["compaction"]}
    (HERE / "graph_state.json").write_text(json.dumps(saved, indent=1), encoding="utf-8")


def make_history() -> None:
    for name in ("history.json", "history_archive.json"):
        (HERE / name).unlink(missing_ok=True)
    history = CompactingChatMessageHistory(
        FileChatMessageHistory(str(HERE / "history.json")),
        ExtractiveSummarizer(),
        CompactionOptions(context_window=2_000, reserve_tokens=500, keep_recent_tokens=300),
        archive=FileChatMessageHistory(str(HERE / "history_archive.json")),
    )
    compactions = 0
    i = 0
    while compactions < 2:
        before = len(history.archive.messages)
        history.add_messages(
            [
                HumanMessage(f"question {i}: keep order id ORD-{1000 + i} " * 6, id=f"hq-{i}"),
                AIMessage(f"answer {i} " * 12, id=f"ha-{i}"),
            ]
        )
        if len(history.archive.messages) > before:
            compactions += 1
        i += 1


if __name__ == "__main__":
    make_graph()
    make_history()
