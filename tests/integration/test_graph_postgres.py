"""CompactionNode with PostgresSaver against a private PostgreSQL server the tests start."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langgraph.graph import END, START, StateGraph
from postgres_server import PostgresServer, postgres_server

from langchain_compaction import CompactionOptions
from langchain_compaction._lc.convert import is_summary_message
from langchain_compaction.core.types import SummaryRequest
from langchain_compaction.features import PrepareAhead, default_features
from langchain_compaction.features.prepared import PreparedSummary
from langchain_compaction.graph import CompactionNode, CompactionState, acompact_thread, compact_thread

pytest.importorskip("langgraph.checkpoint.postgres", reason="pip install langgraph-checkpoint-postgres")
pytest.importorskip("psycopg", reason='pip install "psycopg[binary]"')

from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

pytestmark = [pytest.mark.postgres, pytest.mark.integration]
__all__ = ["postgres_server"]  # the fixture, imported for this module

OPTIONS = CompactionOptions(
    context_window=2_000, reserve_tokens=400, keep_recent_tokens=500, summary_input_tokens=50_000
)


class Numbered:
    """A summarizer that numbers its summaries and keeps what it was asked."""

    def __init__(self) -> None:
        self.requests: list[SummaryRequest] = []

    @property
    def name(self) -> str:
        return "numbered"

    def summarize(self, request: SummaryRequest) -> str:
        self.requests.append(request)
        return f"## Goal\n- summary number {len(self.requests)}"

    async def asummarize(self, request: SummaryRequest) -> str:
        return self.summarize(request)


def build(node: CompactionNode, saver: Any) -> Any:
    builder = StateGraph(CompactionState)
    builder.add_node("compact", node)
    builder.add_edge(START, "compact")
    builder.add_edge("compact", END)
    return builder.compile(checkpointer=saver)


def turn(number: int) -> dict[str, list[BaseMessage]]:
    return {"messages": [HumanMessage(f"q{number} " + "x" * 300), AIMessage(f"a{number} " + "y" * 300)]}


def summaries(messages: list[BaseMessage]) -> list[BaseMessage]:
    return [m for m in messages if is_summary_message(m)]


def test_compaction_persists_and_survives_reconnect(postgres_server: PostgresServer) -> None:
    config = {"configurable": {"thread_id": "pg-sync"}}
    first = Numbered()
    with PostgresSaver.from_conn_string(postgres_server.url) as saver:
        saver.setup()
        graph = build(CompactionNode(first, OPTIONS, result_key="compaction"), saver)
        graph.invoke({"messages": [SystemMessage("You are terse.", id="sys")]}, config)
        for number in range(12):
            graph.invoke(turn(number), config)
        stored = graph.get_state(config).values
    assert first.requests, "nothing was compacted"
    assert len(stored["messages"]) < 25
    assert stored["compaction"]["messages_removed"] > 0

    # A new connection (a restarted process) sees the compacted thread.
    second = Numbered()
    with PostgresSaver.from_conn_string(postgres_server.url) as saver:
        graph = build(CompactionNode(second, OPTIONS, result_key="compaction"), saver)
        reopened = graph.get_state(config).values
        assert [m.id for m in reopened["messages"]] == [m.id for m in stored["messages"]]
        assert reopened["compaction"] == stored["compaction"]
        for number in range(12, 24):
            graph.invoke(turn(number), config)
        after = graph.get_state(config).values
        # A manual compaction goes through update_state into the same tables.
        manual = compact_thread(graph, config, instructions="keep the numbers")
        final = graph.get_state(config).values
    assert second.requests
    assert second.requests[0].previous_summary == f"## Goal\n- summary number {len(first.requests)}"
    assert after["messages"][0].id == "sys"
    assert len(summaries(after["messages"])) == 1
    assert "summary number" in str(summaries(after["messages"])[0].content)
    assert after["compaction"]["updated_previous_summary"] is True
    assert manual is not None
    assert "keep the numbers" in second.requests[-1].prompt
    assert len(summaries(final["messages"])) == 1
    assert final["compaction"] == manual.to_dict()


async def test_async_postgres_saver(postgres_server: PostgresServer) -> None:
    config = {"configurable": {"thread_id": "pg-async"}}
    summarizer = Numbered()
    async with AsyncPostgresSaver.from_conn_string(postgres_server.url) as saver:
        await saver.setup()
        graph = build(CompactionNode(summarizer, OPTIONS, result_key="compaction"), saver)
        for number in range(24):
            await graph.ainvoke(turn(number), config)
        result = await acompact_thread(graph, config)
    assert result is not None
    async with AsyncPostgresSaver.from_conn_string(postgres_server.url) as saver:
        graph = build(CompactionNode(Numbered(), OPTIONS, result_key="compaction"), saver)
        values = (await graph.aget_state(config)).values
    assert len(summaries(values["messages"])) == 1
    assert values["compaction"] == result.to_dict()
    assert len(summarizer.requests) >= 3


@pytest.mark.parametrize("tool_calls", [False, True])
def test_a_summary_prepared_by_one_worker_is_applied_by_another_through_postgres_store(
    postgres_server: PostgresServer, tool_calls: bool
) -> None:
    """With tool calls too: a checked fact's key holds a NUL, which ``jsonb`` refuses as such."""
    import threading
    import time

    from langgraph.store.postgres import PostgresStore

    from langchain_compaction._lc.conversation import thread_label
    from langchain_compaction.features.prepared import STORE_NAMESPACE

    options = CompactionOptions(
        context_window=4_000, reserve_tokens=500, keep_recent_tokens=400, summary_input_tokens=50_000
    )
    in_store = [*default_features(), PrepareAhead(at=0.7, in_store=True)]
    calls: list[str] = []
    done = threading.Event()

    def summarize(prompt: str) -> str:
        calls.append(threading.current_thread().name)
        done.set()
        return "## Goal\n- prepared in worker A"

    def graph(node: CompactionNode, saver: Any, store: Any) -> Any:
        builder = StateGraph(CompactionState)
        builder.add_node("compact", node)
        builder.add_edge(START, "compact")
        builder.add_edge("compact", END)
        return builder.compile(checkpointer=saver, store=store)

    def turn(n: int) -> list[Any]:
        asked = HumanMessage(f"q{n} " + "word " * 60, id=f"h{n}")
        if not tool_calls:
            return [asked]
        call = {"name": "bash", "args": {"command": f"pytest tests/test_{n}.py"}, "id": f"c{n}", "type": "tool_call"}
        return [asked, AIMessage("", tool_calls=[call], id=f"a{n}"), ToolMessage("1 passed", tool_call_id=f"c{n}")]

    thread = f"tenant.7/user.{42 + tool_calls}"  # (the server is the module's: a thread of its own)
    config = {"configurable": {"thread_id": thread}}
    namespace = (STORE_NAMESPACE, thread_label(thread))
    with (
        PostgresSaver.from_conn_string(postgres_server.url) as saver,
        PostgresStore.from_conn_string(postgres_server.url) as store,
    ):
        saver.setup()
        store.setup()
        worker_a = graph(CompactionNode(summarize, options, result_key="compaction", features=in_store), saver, store)
        number = 0
        while not done.is_set():
            worker_a.invoke({"messages": turn(number)}, config)
            number += 1
            assert number < 80, "no preparation started"
        deadline = time.monotonic() + 10
        while not store.search(namespace):
            assert time.monotonic() < deadline, "the prepared summary never reached the store"
            time.sleep(0.02)
    # A restarted process: new connections, a new node with nothing in memory.
    with (
        PostgresSaver.from_conn_string(postgres_server.url) as saver,
        PostgresStore.from_conn_string(postgres_server.url) as store,
    ):
        other: list[str] = []
        worker_b = graph(
            CompactionNode(
                lambda p: other.append(p) or "## Goal\n- made on the spot",
                options,
                result_key="compaction",
                features=in_store,
            ),
            saver,
            store,
        )
        for later in range(number, number + 80):
            out = worker_b.invoke({"messages": turn(later)}, config)
            if out.get("compaction"):
                break
        assert out["compaction"]["parts"]["prepared"]["applied"] is True
        # Worker B at most folded the newer messages into A's summary (an update, never a re-summary).
        assert len(other) <= 1
        assert all("prepared in worker A" in prompt for prompt in other)
        assert "Goal" in str(out["messages"][0].content)
        # Kept until the thread moves past it (a retried turn applies the same compaction); never applicable again.
        stale = [PreparedSummary.from_value(item.value) for item in store.search(namespace)]
        assert not any(p.matches(out["messages"]) for p in stale)


def test_archive_in_postgres_store_graph_and_agent_sessions(postgres_server: PostgresServer) -> None:
    """200 turns through the node and through create_agent + middleware on a real PostgreSQL store."""
    from archive_sessions import (
        FACT,
        agent_middleware,
        agent_script,
        archived_messages,
        assert_each_message_once,
        graph_session,
        lookup,
        user_text,
    )
    from helpers_turns import ToolCallingFake
    from langchain.agents import create_agent
    from langchain_core.messages import ToolMessage
    from langgraph.store.postgres import PostgresStore

    from langchain_compaction._lc.conversation import Conversation
    from langchain_compaction._lc.convert import is_compaction_message
    from langchain_compaction.archive import Archive
    from langchain_compaction.core.effects import drive
    from langchain_compaction.features import Commit

    with (
        PostgresSaver.from_conn_string(postgres_server.url) as saver,
        PostgresStore.from_conn_string(postgres_server.url) as store,
    ):
        saver.setup()
        store.setup()
        session = graph_session(store, saver, "tenant.7/graph")
        for number in range(200):
            out = session.turn(number)
        assert assert_each_message_once(session.sent, out["messages"], store, "tenant.7/graph") > 300
        assert user_text("tenant.7/graph", 3) in session.recall(store, query=FACT)

        model = ToolCallingFake(messages=agent_script(200))
        agent = create_agent(model, tools=[lookup], middleware=[agent_middleware()], checkpointer=saver, store=store)
        config = {"configurable": {"thread_id": "tenant.7/agent"}}
        seen: dict[str, BaseMessage] = {}
        for number in range(201):
            question = HumanMessage(user_text("tenant.7/agent", number), id=f"q{number}")
            seen[f"q{number}"] = question
            state = agent.invoke({"messages": [question]}, config)["messages"]
            seen.update({m.id: m for m in state if m.id and not is_compaction_message(m) and m.id not in seen})
        assert_each_message_once(list(seen.values()), state, store, "tenant.7/agent")
        recalled = next(m for m in reversed(state) if isinstance(m, ToolMessage) and m.name == "recall_messages")
        assert user_text("tenant.7/agent", 3) in str(recalled.content)
        # The graph's thread never shows through the agent's tool, and a retry writes nothing twice.
        assert "tenant.7/graph" not in str(recalled.content)
        # The first compaction, committed again as a retry would: its own id, its own messages.
        first = [(int(v["position"]), m, v["lineage"]) for _, v, m in archived_messages(store, "tenant.7/graph")]
        first = [item for item in first if item[0] < 8]
        again = Commit(
            [(p, m) for p, m, _ in first],
            {"lineage": [first[0][2]], "compaction": 1},
            Conversation("tenant.7/graph"),
            store,
        )
        assert drive(Archive().commit(again)) == {"archived": 0, "present": 8}
        assert assert_each_message_once(session.sent, out["messages"], store, "tenant.7/graph") > 300


def test_a_message_holding_a_nul_is_archived_in_postgres_and_recalled_word_for_word(
    postgres_server: PostgresServer,
) -> None:
    """PostgreSQL's jsonb refuses a NUL in a string: the archive keeps such a message as JSON text, whole."""
    from langgraph.store.postgres import PostgresStore

    from langchain_compaction.features import Archive

    node = CompactionNode(
        lambda p: "## Goal\n- read files",
        CompactionOptions(context_window=3_000),
        features=[*default_features(), Archive()],
    )
    builder = StateGraph(CompactionState)
    builder.add_node("compact", node)
    builder.add_edge(START, "compact")
    builder.add_edge("compact", END)
    header = "PNG\x00\x00\x00\rIHDR binary header"
    with (
        PostgresSaver.from_conn_string(postgres_server.url) as saver,
        PostgresStore.from_conn_string(postgres_server.url) as store,
    ):
        saver.setup()
        store.setup()
        graph = builder.compile(checkpointer=saver, store=store)
        config = {"configurable": {"thread_id": "nul"}}
        graph.invoke({"messages": [HumanMessage(f"the file starts with {header}", id="nul-0")]}, config)
        for turn in range(1, 30):
            graph.invoke({"messages": [HumanMessage(f"turn {turn} " * 60, id=f"nul-{turn}")]}, config)
        items = store.search(("compaction_archive", "nul"), limit=100)
        held = [i for i in items if i.value.get("id") == "nul-0"]
        assert held, "the message with a NUL was archived"
        from langchain_compaction.features.archive import archived_message

        assert archived_message(held[0].value).content == f"the file starts with {header}"
