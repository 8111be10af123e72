"""What preparations cost, reported exactly, and where they cannot run (found by an exploratory probe)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph

from langchain_compaction import CompactionNode, CompactionOptions
from langchain_compaction.features import PrepareAhead, default_features
from langchain_compaction.graph import CompactionState

OPTIONS = CompactionOptions(
    context_window=4_000, reserve_tokens=500, keep_recent_tokens=400, summary_input_tokens=50_000
)


class SlowSummary(BaseChatModel):
    """An async-only summary model that takes ``seconds`` and counts the requests it got and answered."""

    seconds: float = 0.5
    sent: int = 0
    answered: int = 0

    @property
    def _llm_type(self) -> str:
        return "slow-summary"

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        raise NotImplementedError

    async def _agenerate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        self.sent += 1
        await asyncio.sleep(self.seconds)
        self.answered += 1
        return ChatResult(generations=[ChatGeneration(message=AIMessage(f"## Goal\n- summary {self.sent}"))])


def _graph(summarizer: SlowSummary, prepare: PrepareAhead) -> Any:
    async def agent(state: CompactionState) -> dict[str, Any]:
        await asyncio.sleep(0.01)
        return {"messages": [AIMessage("answer " + "word " * 60, id=f"a{time.monotonic_ns()}")]}

    builder = StateGraph(CompactionState)
    builder.add_node(
        "compact", CompactionNode(summarizer, OPTIONS, result_key="compaction", features=[*default_features(), prepare])
    )
    builder.add_node("agent", agent)
    builder.add_edge(START, "compact")
    builder.add_edge("compact", "agent")
    return builder.compile(checkpointer=InMemorySaver())


def _turn(n: int) -> dict[str, Any]:
    return {"messages": [HumanMessage(f"q{n} " + "word " * 60, id=f"h{n}")]}


def test_a_preparation_the_threshold_stopped_waiting_for_is_reported_by_the_next_compaction(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """It goes on and sends its request: the next compaction's figures include it (only the last is pending).

    The warning gives the wait as it was set (it said 0.1 s for 0.05).
    """
    summarizer = SlowSummary(seconds=0.6)
    graph = _graph(summarizer, PrepareAhead(at=0.7, wait=0.05))

    async def session() -> list[dict[str, Any]]:
        records: list[dict[str, Any]] = []
        for n in range(80):
            out = await graph.ainvoke(_turn(n), {"configurable": {"thread_id": "slow"}})
            record = out.get("compaction")
            if record and (not records or record != records[-1]):
                records.append(record)
            if len(records) == 3:
                break
        await asyncio.sleep(0.8)  # (the last one abandoned finishes, reported by no compaction yet)
        return records

    with caplog.at_level(logging.WARNING, logger="langchain_compaction"):
        records = asyncio.run(session())
    assert len(records) == 3
    assert any("not ready within 0.05 s" in r.getMessage() for r in caplog.records)
    reported = sum(r["summarizer_calls"] for r in records)
    assert summarizer.answered - reported <= 1
    assert sum(r["parts"]["prepared"]["discarded_calls"] for r in records) >= 1


def test_asyncio_run_per_turn_stops_preparing_a_conversation_after_its_loop_closed_under_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Each turn's loop cancels the preparation it started: preparing again every turn only paid for requests."""
    summarizer = SlowSummary(seconds=0.3)
    graph = _graph(summarizer, PrepareAhead(at=0.7))
    compactions: list[dict[str, Any]] = []
    with caplog.at_level(logging.WARNING, logger="langchain_compaction"):
        for n in range(60):
            out = asyncio.run(graph.ainvoke(_turn(n), {"configurable": {"thread_id": "per-turn"}}))
            record = out.get("compaction")
            if record and (not compactions or record != compactions[-1]):
                compactions.append(record)
    assert len(compactions) >= 3
    # One preparation cancelled with its loop, then one summary per compaction.
    assert summarizer.sent <= len(compactions) + 1
    assert sum("run its turns on one event loop" in r.getMessage() for r in caplog.records) == 1


def test_a_preparation_cancelled_while_its_loop_runs_is_made_again(caplog: pytest.LogCaptureFixture) -> None:
    """Its task cancelled, not its loop closed: the next turns prepare again, and the warning says what happened.

    (Any cancellation was taken for a closed loop: preparing ahead stopped for the conversation for the life of
    the process, with the warning "its event loop closed ... (asyncio.run per turn?)".)
    """
    summarizer = SlowSummary(seconds=0.05)
    graph = _graph(summarizer, PrepareAhead(at=0.7))

    def preparations() -> list[asyncio.Task[Any]]:
        return [t for t in asyncio.all_tasks() if "PrepareAhead._astart" in t.get_coro().__qualname__]

    async def session() -> tuple[int | None, int]:
        cancelled, applied, before = None, 0, None
        for n in range(60):
            out = await graph.ainvoke(_turn(n), {"configurable": {"thread_id": "cancelled"}})
            record = out.get("compaction") or {}
            running = preparations()
            if running and cancelled is None:
                for task in running:
                    task.cancel()  # (as a program may: the loop runs on)
                cancelled, before = n, record
            elif cancelled is not None and record != before:  # a compaction since
                applied += bool(record.get("parts", {}).get("prepared", {}).get("applied"))
                if applied:
                    break
            await asyncio.sleep(0.1)
        return cancelled, applied

    with caplog.at_level(logging.WARNING, logger="langchain_compaction"):
        cancelled, applied = asyncio.run(session())
    said = [r.getMessage() for r in caplog.records]
    assert cancelled is not None
    assert applied == 1
    assert sum("cancelled (its task, not its event loop" in m for m in said) == 1
    assert not any("asyncio.run per turn" in m for m in said)


def test_in_store_on_a_graph_without_a_store_says_so_once(caplog: pytest.LogCaptureFixture) -> None:
    summarizer = SlowSummary(seconds=0.0)
    graph = _graph(summarizer, PrepareAhead(at=0.7, in_store=True))

    async def session() -> None:
        for n in range(40):
            await graph.ainvoke(_turn(n), {"configurable": {"thread_id": "no-store"}})

    with caplog.at_level(logging.WARNING, logger="langchain_compaction"):
        asyncio.run(session())
    said = [r.getMessage() for r in caplog.records if "without a LangGraph store" in r.getMessage()]
    assert len(said) == 1
    assert "compile(store=...)" in said[0]
