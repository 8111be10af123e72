"""How long compaction holds up an asyncio event loop, and how the offline summarizer scales.

python bench/loop_stall.py [--json]

A ticker task wakes every 2 ms and records how late each wake-up is; the
longest delay while a compaction runs is the loop's worst stall (every other
request of a server waits that long); each workload runs 5 times and the
median and the worst of those are reported. Workloads:

- ``await acompact(ExtractiveSummarizer(), 5,000 messages)``;
- a ``CompactionNode`` under ``graph.ainvoke`` with a 5,000-message state (a cold
  node: nothing cached), compacting with the offline summarizer.

- 20 conversations on one async graph (``CompactionNode`` then a quick agent
  node, no checkpointer, window 8,000): each starts from its own 1,000-message
  history, compacts it at once and runs 8 turns, all at the same time; the
  same graph without the node is measured beside it, and both again with the
  histories frozen out of the garbage collector (``gc.freeze()``, as a
  long-lived server does), since one full collection over 21,000 LangChain
  messages takes 100-150 ms whoever triggers it.

And the offline summarizer alone (``ExtractiveSummarizer.summarize_messages``) on
2,500 / 5,000 / 10,000 / 20,000 short messages, CPU seconds: about linear is
the goal.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import gc
import statistics

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langgraph.graph import START, MessagesState, StateGraph

from langchain_compaction import CompactionNode, CompactionOptions, ExtractiveSummarizer, acompact
from langchain_compaction._lc.convert import to_core_list

TICK = 0.002


def session(messages: int) -> list[BaseMessage]:
    out: list[BaseMessage] = []
    for i in range(messages // 4):
        call = {"name": "bash", "args": {"command": f"pytest tests/test_{i}.py"}, "id": f"c{i}"}
        out += [
            HumanMessage(f"turn {i}: fix src/mod_{i % 50}.py; never touch db_{i % 7}.sql", id=f"h{i}"),
            AIMessage(f"I'll run the tests for mod_{i}.", tool_calls=[call], id=f"a{i}"),
            ToolMessage(
                f"FAILED tests/test_{i}.py::t - AssertionError: {i}" if i % 5 == 0 else "ok", tool_call_id=f"c{i}"
            ),
            AIMessage(f"Patched mod_{i}.", id=f"b{i}"),
        ]
    return out


async def worst_stall(work) -> float:
    """The longest lateness of a 2 ms ticker while ``work`` runs, in ms."""
    worst = 0.0
    done = asyncio.Event()

    async def ticker() -> None:
        nonlocal worst
        while not done.is_set():
            start = time.perf_counter()
            await asyncio.sleep(TICK)
            worst = max(worst, time.perf_counter() - start - TICK)

    task = asyncio.ensure_future(ticker())
    await asyncio.sleep(0)
    try:
        await work
    finally:
        done.set()
        await task
    return worst * 1000


async def acompact_stall(messages: list[BaseMessage]) -> float:
    options = CompactionOptions(keep_recent_tokens=2_000)
    return await worst_stall(acompact(ExtractiveSummarizer(), messages, options))


async def node_stall(messages: list[BaseMessage]) -> float:
    options = CompactionOptions(context_window=32_000)
    builder = StateGraph(MessagesState)
    builder.add_node("compact", CompactionNode(ExtractiveSummarizer(), options))
    builder.add_edge(START, "compact")
    graph = builder.compile()
    return await worst_stall(graph.ainvoke({"messages": messages}))


CONVERSATIONS = 20
TURNS = 8


def _agent(state: MessagesState) -> dict[str, list[BaseMessage]]:
    n = len(state["messages"])
    return {"messages": [AIMessage(f"answer {n}: edited src/mod_{n % 50}.py and ran the tests " * 8)]}


def _many_graph(with_node: bool):
    builder = StateGraph(MessagesState)
    builder.add_node("agent", _agent)
    if with_node:
        builder.add_node("compact", CompactionNode(ExtractiveSummarizer(), CompactionOptions(context_window=8_000)))
        builder.add_edge(START, "compact")
        builder.add_edge("compact", "agent")
    else:
        builder.add_edge(START, "agent")
    return builder.compile()


async def many_conversations_stall(with_node: bool, frozen: bool) -> float:
    """The worst lateness of the ticker while 20 conversations run their turns on one async graph, in ms."""
    graph = _many_graph(with_node)
    histories = [[HumanMessage(f"conversation {i}", id=f"conv{i}"), *session(1_000)] for i in range(CONVERSATIONS + 1)]

    async def conversation(messages: list[BaseMessage]) -> None:
        for turn in range(TURNS):
            out = await graph.ainvoke({"messages": [*messages, HumanMessage(f"turn {turn}: fix src/mod_{turn}.py")]})
            messages = out["messages"]

    await conversation(histories.pop())  # warm: first imports and calls are not the loop's lag
    if frozen:
        gc.freeze()
    try:
        return await worst_stall(asyncio.gather(*(conversation(h) for h in histories)))
    finally:
        gc.unfreeze()


def _many(runs: int = 5) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for frozen in (False, True):
        for with_node in (False, True):
            stalls = sorted(asyncio.run(many_conversations_stall(with_node, frozen)) for _ in range(runs))
            name = f"{'with' if with_node else 'without'} the node{', histories frozen' if frozen else ''}"
            out[name] = {"median_ms": round(statistics.median(stalls), 1), "worst_ms": round(stalls[-1], 1)}
    return out


def summarizer_seconds(n: int) -> float:
    core = to_core_list(session(n))
    start = time.process_time()
    ExtractiveSummarizer().summarize_messages(core)
    return time.process_time() - start


def _runs(measure, messages: list[BaseMessage], runs: int = 5) -> dict[str, float]:
    # The worst stall of one run depends on how the OS schedules the worker
    # thread against the loop (the GIL): report the median and the worst of
    # several runs.
    stalls = sorted(asyncio.run(measure(messages)) for _ in range(runs))
    return {"median_ms": round(stalls[len(stalls) // 2], 1), "worst_ms": round(stalls[-1], 1), "runs": runs}


def main() -> None:
    messages = session(5_000)
    figures = {
        "acompact_5000_stall": _runs(acompact_stall, messages),
        "node_ainvoke_5000_stall": _runs(node_stall, messages),
        "twenty_conversations_one_graph_stall": _many(),
        "extractive_cpu_seconds": {n: round(summarizer_seconds(n), 3) for n in (2_500, 5_000, 10_000, 20_000)},
    }
    if "--json" in sys.argv:
        print(json.dumps(figures, indent=2))
        return
    for key, value in figures.items():
        print(f"{key}: {value}")


if __name__ == "__main__":
    main()
