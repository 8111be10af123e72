"""A quiet turn of the node in a checkpointed graph: its CPU at 1,000 and 10,000 messages.

python bench/checkpointed_turn.py

A checkpointer hands the node the history as new objects on every run, so the
token cache cannot know them by identity (``bench/run.py`` calls the node on the
same objects). Replies carry no usage (the case where the node counts the
history). Two figures a turn, the median of ten warm turns: the node's own
work, with the previous turn's copies kept alive by the script; and the same
with them freed in the node, where the node's cache lets go of them (it holds
the previous read until the next one; without it they are freed at the end of
the previous run, in LangGraph's time).
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph

from langchain_compaction import CompactionNode, CompactionOptions
from langchain_compaction.graph import CompactionState


def median_turn_ms(size: int, *, hold: bool) -> float:
    node = CompactionNode(lambda prompt: "## Goal\n- x", CompactionOptions(context_window=10_000_000))
    held: list[Any] = []
    seconds: list[float] = []
    run = node.invoke

    def timed(state: Any, *args: Any, **kwargs: Any) -> Any:
        if hold:
            held.append(state["messages"])
        start = time.process_time()
        out = run(state, *args, **kwargs)
        seconds.append(time.process_time() - start)
        return out

    builder = StateGraph(CompactionState)
    node.invoke = timed  # type: ignore[method-assign]  (the node in the graph, timed)
    builder.add_node("compact", node)
    builder.add_node("agent", lambda state: {"messages": [AIMessage("ok")]})
    builder.add_edge(START, "compact")
    builder.add_edge("compact", "agent")
    graph = builder.compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "bench"}}
    history: list[BaseMessage] = []
    for i in range(size // 2):
        history += [HumanMessage(f"question {i}"), AIMessage(f"answer {i}")]
    graph.update_state(config, {"messages": history}, as_node="agent")
    for i in range(12):
        graph.invoke({"messages": [HumanMessage(f"more {i}")]}, config)
    warm = sorted(seconds[2:])
    return 1000 * warm[len(warm) // 2]


def main() -> None:
    logging.disable(logging.WARNING)
    print("| messages | the node's own work (ms) | with the previous copies freed in it (ms) |")
    print("|---|---|---|")
    for size in (1_000, 10_000):
        print(f"| {size:,} | {median_turn_ms(size, hold=True):.2f} | {median_turn_ms(size, hold=False):.2f} |")


if __name__ == "__main__":
    main()
