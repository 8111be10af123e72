"""Async runs as Python 3.10 makes them: LangGraph cannot make a node's config current.

Before Python 3.11 an asyncio task cannot be started in a given context, so
LangGraph hands an async node its config as an argument only
(``langgraph._internal._runnable.ASYNCIO_ACCEPTS_CONTEXT`` is false there):
``get_config``, ``get_store`` and ``get_stream_writer`` fail inside it. These
tests turn that flag off, as Python 3.10 has it, and run real graphs and
agents through the async paths. (Checked on Python 3.10.13 itself too.)
"""

from __future__ import annotations

import sys
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import MessagesState
from langgraph.store.memory import InMemoryStore

from langchain_compaction import CompactionMiddleware, CompactionNode, CompactionOptions
from langchain_compaction.features import Archive, default_features

OPTIONS = CompactionOptions(context_window=4_000, reserve_tokens=500, keep_recent_tokens=1_000)


@pytest.fixture
def as_on_python_310(monkeypatch: pytest.MonkeyPatch) -> None:
    runnable = sys.modules.get("langgraph._internal._runnable")
    if runnable is None or not hasattr(runnable, "ASYNCIO_ACCEPTS_CONTEXT"):
        pytest.skip("this LangGraph has no ASYNCIO_ACCEPTS_CONTEXT flag to turn off")
    monkeypatch.setattr(runnable, "ASYNCIO_ACCEPTS_CONTEXT", False)


def _archived(store: InMemoryStore, thread: str) -> int:
    return sum(len(store.search(ns, limit=1000)) for ns in store.list_namespaces(prefix=("compaction_archive", thread)))


@pytest.mark.usefixtures("as_on_python_310")
async def test_the_async_node_archives_into_the_graph_s_store() -> None:
    # It raised ConfigurationError ("the graph has no LangGraph store") on the first compaction.
    async def agent(state: MessagesState) -> dict[str, list[BaseMessage]]:
        return {"messages": [AIMessage(f"answer {len(state['messages'])} " * 40)]}

    from conftest import compaction_graph

    node = CompactionNode(lambda prompt: "## Goal\n- answer", OPTIONS, features=[*default_features(), Archive()])
    store = InMemoryStore()
    graph = compaction_graph(node, agent, checkpointer=InMemorySaver(), store=store)
    config: Any = {"configurable": {"thread_id": "t1"}}
    for turn in range(20):
        await graph.ainvoke({"messages": [HumanMessage(f"question {turn} " * 40)]}, config)
    state = (await graph.aget_state(config)).values["messages"]
    assert _archived(store, "t1") + len(state) >= 40  # every question and answer: kept or archived


async def test_an_async_middleware_hook_reads_its_thread_and_store_from_its_runtime() -> None:
    """Called as LangGraph calls it on Python 3.10: no current config, only the ``Runtime`` it is handed.

    It found no thread_id: it compacted without archiving (the messages gone for good) and wrote
    nothing to stream_mode="custom". (On Python 3.10.13 through a whole create_agent run too.)
    """
    from langgraph.runtime import ExecutionInfo, Runtime

    middleware = CompactionMiddleware(
        lambda prompt: "## Goal\n- plan", OPTIONS, features=[*default_features(), Archive()]
    )
    store, written = InMemoryStore(), []
    info = ExecutionInfo(checkpoint_id="c1", checkpoint_ns="", task_id="t1", thread_id="m1")
    runtime: Any = Runtime(store=store, stream_writer=written.append, execution_info=info)
    history: list[BaseMessage] = []
    for turn in range(20):
        history += [
            HumanMessage(f"question {turn} " * 40, id=f"h{turn}"),
            AIMessage(f"answer {turn} " * 40, id=f"a{turn}"),
        ]
    update = await middleware.abefore_model({"messages": history}, runtime)
    assert update is not None
    assert _archived(store, "m1") > 0
    assert any("langchain_compaction" in str(chunk) for chunk in written)
