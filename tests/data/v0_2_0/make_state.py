"""How the saved 0.2.0 states in this folder were made (run once, with 0.2.0 installed).

python tests/data/v0_2_0/make_state.py

It is kept as the record of what the files hold; the tests only read them.
- ``graph_state.json``: a LangGraph thread after several compactions by
  ``CompactionNode(..., archive=True)`` with 0.2's checked facts and pins:
  ``messages`` (``messages_to_dict``: system prompt, the summary with its mark
  (facts, positions, compaction number), a pinned ``write_todos`` exchange,
  the recent messages) and the ``compaction`` result key in 0.2's flat form.
- ``store.json``: the graph's LangGraph store: the archive items 0.2 wrote
  (``("compaction_archive", "old-thread")``, keyed by message id) and one
  prepared summary (``("compaction_prepared", "old-thread")``) in 0.2's form.
- ``history.json`` / ``history_archive.json``: a chat-memory session compacted
  by 0.2 with an archive.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from langchain_community.chat_message_histories import FileChatMessageHistory
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage, messages_to_dict
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph
from langgraph.store.memory import InMemoryStore

import langchain_compaction
from langchain_compaction import CompactingChatMessageHistory, CompactionNode, CompactionOptions, ExtractiveSummarizer
from langchain_compaction.graph import CompactionState

HERE = Path(__file__).resolve().parent
assert langchain_compaction.__version__ == "0.2.0"


def agent(state: CompactionState) -> dict:
    last = next(m for m in reversed(state["messages"]) if isinstance(m, HumanMessage) and str(m.id).startswith("user-"))
    turn = int(str(last.id).split("-")[1])
    if turn == 2:
        call = {"name": "write_todos", "args": {"todos": ["port the parser", "ship"]}, "id": "todos-2"}
        return {
            "messages": [
                AIMessage("", tool_calls=[call], id="todo-call"),
                ToolMessage("Updated", tool_call_id="todos-2", id="todo-result"),
            ]
        }
    return {
        "messages": [AIMessage(f"Done with step {turn}: edited src/mod_{turn}.py. " + "details " * 30, id=f"ai-{turn}")]
    }


def make_graph() -> None:
    options = CompactionOptions(context_window=3_000, reserve_tokens=600, keep_recent_tokens=700, prepare_at=0.7)
    node = CompactionNode(ExtractiveSummarizer(), options, result_key="compaction", archive=True, prepare_in_store=True)
    builder = StateGraph(CompactionState)
    builder.add_node("compact", node)
    builder.add_node("agent", agent)
    builder.add_edge(START, "compact")
    builder.add_edge("compact", "agent")
    store = InMemoryStore()
    graph = builder.compile(checkpointer=InMemorySaver(), store=store)
    config = {"configurable": {"thread_id": "old-thread"}}
    graph.update_state(config, {"messages": [SystemMessage("You port parsers.", id="system-prompt")]}, as_node="agent")
    for turn in range(40):
        text = (
            f"Step {turn}: port module mod_{turn}. "
            + ("Never touch vendor/. Booking ref QX7-2210. " if turn == 1 else "")
            + "words " * 30
        )
        graph.invoke({"messages": [HumanMessage(text, id=f"user-{turn}")]}, config)
        time.sleep(0.05)
    state = graph.get_state(config).values
    (HERE / "graph_state.json").write_text(
        json.dumps({"messages": messages_to_dict(state["messages"]), "compaction": state["compaction"]}, indent=1)
    )
    items = [
        {"namespace": list(item.namespace), "key": item.key, "value": item.value}
        for prefix in ("compaction_archive", "compaction_prepared")
        for item in store.search((prefix,), limit=10_000)
    ]
    (HERE / "store.json").write_text(json.dumps(items, indent=1))


def make_history() -> None:
    for name in ("history.json", "history_archive.json"):
        (HERE / name).unlink(missing_ok=True)
    history = CompactingChatMessageHistory(
        FileChatMessageHistory(str(HERE / "history.json")),
        ExtractiveSummarizer(),
        CompactionOptions(context_window=2_000, reserve_tokens=500, keep_recent_tokens=300),
        archive=FileChatMessageHistory(str(HERE / "history_archive.json")),
    )
    for i in range(60):
        history.add_messages(
            [HumanMessage(f"question {i} " * 8, id=f"q-{i}"), AIMessage(f"answer {i} " * 12, id=f"a-{i}")]
        )


if __name__ == "__main__":
    make_graph()
    make_history()
