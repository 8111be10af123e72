"""CompactionNode in real StateGraphs: checkpointers, sync/async, restarts, commands, events."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import operator
import sqlite3
import tracemalloc
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, TypedDict

import pytest
from conftest import as_state, assert_compacted, assert_valid_anthropic_request, compaction_graph, split_compacted
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.exceptions import ContextOverflowError
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.messages.utils import count_tokens_approximately
from langchain_core.outputs import ChatResult
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Send
from pydantic import Field

from langchain_compaction import CompactionError, CompactionOptions, compact
from langchain_compaction._lc.convert import BRIDGE_TEXT, is_summary_message
from langchain_compaction._lc.counting import _MAX_HELD_TOKENS, DEFAULT_CACHE_SIZE, TokenCountCache
from langchain_compaction.core.context import context_tokens
from langchain_compaction.core.types import SummaryRequest
from langchain_compaction.errors import ConfigurationError, InvalidMessagesError, SummarizationError
from langchain_compaction.features import PrepareAhead, default_features
from langchain_compaction.graph import (
    COMPACTION_EVENT,
    CompactionNode,
    CompactionState,
    acompact_thread,
    compact_thread,
    parse_compact_command,
    route_after_compaction,
)
from langchain_compaction.tokens import estimate_message_tokens

# A large summarizer budget keeps each compaction to one summary call.
SMALL = CompactionOptions(context_window=2_000, reserve_tokens=400, keep_recent_tokens=500, summary_input_tokens=50_000)


# -- fakes implementing the real interfaces ------------------------------------------


class PathSummarizer:
    """A ``Summarizer`` that records which path (sync/async) wrote each summary."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[str] = []
        self.requests: list[SummaryRequest] = []
        self.fail = fail

    @property
    def name(self) -> str:
        return "path"

    def _reply(self, request: SummaryRequest, path: str) -> str:
        self.calls.append(path)
        self.requests.append(request)
        if self.fail:
            msg = "model overloaded"
            raise RuntimeError(msg)
        return f"## Goal\n- summary {len(self.calls)}\n\n## Critical Context\n- (none)"

    def summarize(self, request: SummaryRequest) -> str:
        return self._reply(request, "sync")

    async def asummarize(self, request: SummaryRequest) -> str:
        return self._reply(request, "async")


class ToolCallingFakeModel(GenericFakeChatModel):
    """GenericFakeChatModel with bind_tools, the inputs it saw, and reported usage.

    Usage is what a provider would bill: the estimate of the input plus a fixed
    cost for the system prompt and tool schemas that the state does not hold.
    """

    seen: list[list[BaseMessage]] = Field(default_factory=list)
    overhead_tokens: int = 300

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ToolCallingFakeModel:
        return self

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any):  # type: ignore[override]
        self.seen.append(list(messages))
        result = super()._generate(messages, stop, run_manager, **kwargs)
        reply = result.generations[0].message
        assert isinstance(reply, AIMessage)
        usage_in = estimate_message_tokens(messages) + self.overhead_tokens
        usage_out = estimate_message_tokens([reply])
        reply.usage_metadata = {
            "input_tokens": usage_in,
            "output_tokens": usage_out,
            "total_tokens": usage_in + usage_out,
        }
        return ChatResult(generations=result.generations)


def agent_script(turns: int) -> Iterator[AIMessage]:
    """Per turn: a tool call, then an answer."""
    for turn in range(turns):
        yield AIMessage(
            content="",
            tool_calls=[
                {"name": "lookup", "args": {"query": f"topic {turn}"}, "id": f"call_{turn}", "type": "tool_call"}
            ],
        )
        yield AIMessage(content=f"Answer {turn}: " + "the lookup says the design holds; " * 6)


@tool
def lookup(query: str) -> str:
    """Look something up."""
    return f"result for {query}: " + "a fact about the system under study. " * 8


class Handler(BaseCallbackHandler):
    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def on_custom_event(self, name: str, data: Any, **kwargs: Any) -> None:
        self.events.append((name, data))


def build_agent(
    node: CompactionNode,
    model: ToolCallingFakeModel,
    checkpointer: Any,
    state: type[Any] = MessagesState,
    key: str = "messages",
    **compile_kwargs: Any,
) -> Any:
    bound = model.bind_tools([lookup])

    def call_model(s: dict[str, Any]) -> dict[str, Any]:
        return {key: [bound.invoke(s[key])]}

    async def acall_model(s: dict[str, Any]) -> dict[str, Any]:
        return {key: [await bound.ainvoke(s[key])]}

    from langchain_core.runnables import RunnableLambda

    builder = StateGraph(state)
    builder.add_node("compact", node)
    builder.add_node("model", RunnableLambda(call_model, afunc=acall_model))
    builder.add_node("tools", ToolNode([lookup], messages_key=key))
    builder.add_edge(START, "compact")
    builder.add_conditional_edges("compact", lambda s: route_after_compaction(s, messages_key=key), ["model", END])
    builder.add_conditional_edges("model", lambda s: tools_condition(s, messages_key=key), ["tools", END])
    builder.add_edge("tools", "compact")
    return builder.compile(checkpointer=checkpointer, **compile_kwargs)


def build_plain(node: Any, checkpointer: Any, state: type[Any] = MessagesState) -> Any:
    """START -> compact -> END: the node on its own, as a graph step."""
    builder = StateGraph(state)
    builder.add_node("compact", node)
    builder.add_edge(START, "compact")
    builder.add_edge("compact", END)
    return builder.compile(checkpointer=checkpointer)


def history(turns: int, size: int = 400) -> list[BaseMessage]:
    out: list[BaseMessage] = [SystemMessage("You are a careful assistant.", id="sys")]
    for turn in range(turns):
        out.append(HumanMessage(f"question {turn} " + "x" * size, id=f"h{turn}"))
        out.append(AIMessage(f"answer {turn} " + "y" * size, id=f"a{turn}"))
    return out


def summaries(messages: Sequence[BaseMessage]) -> list[BaseMessage]:
    return [m for m in messages if is_summary_message(m)]


def thread(name: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": name}}


# -- the node on a state ------------------------------------------------------------


def test_no_write_when_under_budget_or_when_off() -> None:
    node = CompactionNode(PathSummarizer(), SMALL)
    assert node({"messages": history(1)}) == {}
    off = CompactionNode(PathSummarizer(), CompactionOptions(context_window=0))
    big = history(60)
    assert estimate_message_tokens(big) > 10_000
    assert off({"messages": big}) == {}
    assert off.context_tokens(big) == estimate_message_tokens(big)


def test_update_removes_all_and_keeps_recent_ids() -> None:
    summarizer = PathSummarizer()
    node = CompactionNode(summarizer, SMALL)
    msgs = history(10)
    update = node({"messages": msgs})
    new = as_state(update["messages"])
    assert new[0].type == "remove"
    assert new[0].id == "__remove_all__"
    assert new[1] is msgs[0]  # the system prompt, the caller's object
    assert is_summary_message(new[2])
    tail = new[3:]
    assert [m.id for m in tail] == [m.id for m in msgs[-len(tail) :]]
    assert estimate_message_tokens(new[1:]) <= SMALL.context_window - SMALL.reserve_tokens
    assert summarizer.calls == ["sync"]


def test_node_name_and_configuration_errors() -> None:
    builder = StateGraph(MessagesState)
    builder.add_node(CompactionNode(PathSummarizer()))
    assert "compact" in builder.nodes
    with pytest.raises(ConfigurationError, match="result_key"):
        CompactionNode(PathSummarizer(), result_key="messages")
    with pytest.raises(ConfigurationError, match="messages_key"):
        CompactionNode(PathSummarizer(), messages_key="")
    with pytest.raises(ConfigurationError, match="options"):
        CompactionNode(PathSummarizer(), options={"context_window": 1})  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="model"):
        CompactionNode(42)


# -- real graphs, sync and async ----------------------------------------------------


def test_graph_invoke_runs_sync_path_and_shrinks_checkpoint() -> None:
    summarizer = PathSummarizer()
    graph = build_plain(CompactionNode(summarizer, SMALL), InMemorySaver())
    before = history(10)
    out = graph.invoke({"messages": before}, thread("s"))
    stored = graph.get_state(thread("s")).values["messages"]
    assert stored == out["messages"]
    assert len(stored) < len(before)
    assert [m.id for m in stored[2:]] == [m.id for m in before[-(len(stored) - 2) :]]
    assert summarizer.calls == ["sync"]


async def test_graph_ainvoke_runs_async_path() -> None:
    summarizer = PathSummarizer()
    graph = build_plain(CompactionNode(summarizer, SMALL), InMemorySaver())
    await graph.ainvoke({"messages": history(10)}, thread("a"))
    stored = (await graph.aget_state(thread("a"))).values["messages"]
    assert len(summaries(stored)) == 1
    assert summarizer.calls == ["async"]


class CustomState(TypedDict, total=False):
    history: Annotated[list[AnyMessage], add_messages]
    compaction: dict[str, Any]
    user: str


def test_custom_state_with_result_key() -> None:
    node = CompactionNode(PathSummarizer(), SMALL, messages_key="history", result_key="compaction")
    graph = build_plain(node, InMemorySaver(), CustomState)
    graph.invoke({"history": history(10), "user": "ana"}, thread("c"))
    values = graph.get_state(thread("c")).values
    record = values["compaction"]
    assert values["user"] == "ana"
    assert json.loads(json.dumps(record)) == record  # plain data
    assert record["messages_removed"] > 0
    assert record["compacted_tokens"] < record["original_tokens"]
    assert len(summaries(values["history"])) == 1


def test_result_key_missing_from_schema_is_dropped() -> None:
    graph = build_plain(CompactionNode(PathSummarizer(), SMALL, result_key="compaction"), InMemorySaver())
    graph.invoke({"messages": history(10)}, thread("d"))
    values = graph.get_state(thread("d")).values
    assert "compaction" not in values
    assert len(summaries(values["messages"])) == 1


def test_compaction_state_holds_the_record() -> None:
    graph = build_plain(
        CompactionNode(PathSummarizer(), SMALL, result_key="compaction"), InMemorySaver(), CompactionState
    )
    graph.invoke({"messages": history(10)}, thread("e"))
    assert graph.get_state(thread("e")).values["compaction"]["summarizer"] == "path"


def test_a_graph_on_compaction_state_has_json_schemas() -> None:
    """Studio reads a graph's schemas from the Agent Server: pydantic refuses a typing.TypedDict below 3.12."""
    graph = build_plain(
        CompactionNode(PathSummarizer(), SMALL, result_key="compaction"), InMemorySaver(), CompactionState
    )
    for schema in (graph.get_input_jsonschema(), graph.get_output_jsonschema()):
        assert {"messages", "compaction"} <= set(schema["properties"])
        assert "summarizer" in schema["$defs"]["CompactionRecord"]["properties"]


# -- restarts: SQLite on a file --------------------------------------------------------


def _turns(graph: Any, config: dict[str, Any], start: int, stop: int) -> None:
    for turn in range(start, stop):
        graph.invoke({"messages": [HumanMessage(f"q{turn} " + "x" * 300), AIMessage(f"a{turn} " + "y" * 300)]}, config)


def test_sqlite_restart_shows_compacted_state_and_updates_summary(tmp_path: Any) -> None:
    path = tmp_path / "checkpoints.sqlite"
    config = thread("restart")
    first = PathSummarizer()
    conn = sqlite3.connect(path, check_same_thread=False)
    graph = build_plain(CompactionNode(first, SMALL, result_key="compaction"), SqliteSaver(conn), CompactionState)
    graph.invoke({"messages": [SystemMessage("You are terse.", id="sys")]}, config)
    _turns(graph, config, 0, 12)
    assert first.calls, "the first process never compacted"
    before = graph.get_state(config).values["messages"]
    conn.close()

    # A new process: new connection, new graph, new node (empty cache).
    second = PathSummarizer()
    conn = sqlite3.connect(path, check_same_thread=False)
    graph = build_plain(CompactionNode(second, SMALL, result_key="compaction"), SqliteSaver(conn), CompactionState)
    reopened = graph.get_state(config).values["messages"]
    assert [m.id for m in reopened] == [m.id for m in before]
    assert len(summaries(reopened)) == 1
    old_summary = summaries(reopened)[0].content
    _turns(graph, config, 12, 24)
    assert second.calls
    after = graph.get_state(config).values
    assert after["messages"][0].id == "sys"
    stored = summaries(after["messages"])
    assert len(stored) == 1, "the summary was nested instead of updated"
    assert stored[0].content != old_summary
    assert str(stored[0].content).count("[Conversation summary") == 1
    assert after["compaction"]["updated_previous_summary"] is True
    # The summarizer was shown the stored summary to update.
    assert second.requests[0].previous_summary is not None
    assert "summary" in second.requests[0].previous_summary
    conn.close()


async def test_async_sqlite_restart(tmp_path: Any) -> None:
    path = str(tmp_path / "async.sqlite")
    config = thread("arestart")
    first = PathSummarizer()
    async with AsyncSqliteSaver.from_conn_string(path) as saver:
        graph = build_plain(CompactionNode(first, SMALL), saver)
        for turn in range(12):
            await graph.ainvoke({"messages": [HumanMessage(f"q{turn} " + "x" * 300), AIMessage("y" * 300)]}, config)
        before = (await graph.aget_state(config)).values["messages"]
    assert first.calls
    assert set(first.calls) == {"async"}
    second = PathSummarizer()
    async with AsyncSqliteSaver.from_conn_string(path) as saver:
        graph = build_plain(CompactionNode(second, SMALL), saver)
        assert [m.id for m in (await graph.aget_state(config)).values["messages"]] == [m.id for m in before]
        for turn in range(12, 24):
            await graph.ainvoke({"messages": [HumanMessage(f"q{turn} " + "x" * 300), AIMessage("y" * 300)]}, config)
        after = (await graph.aget_state(config)).values["messages"]
    assert second.calls
    assert len(summaries(after)) == 1
    assert second.requests[0].previous_summary is not None


# -- per-turn cost: O(k) counts ----------------------------------------------------


class CountingCounter:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, messages: Sequence[BaseMessage]) -> int:
        self.calls += 1
        return count_tokens_approximately(messages)


def test_turn_adding_k_messages_costs_k_counts() -> None:
    counter = CountingCounter()
    options = CompactionOptions(context_window=10_000_000, reserve_tokens=1_000, token_counter=counter)
    graph = build_plain(CompactionNode(PathSummarizer(), options), InMemorySaver())
    config = thread("cost")
    graph.invoke({"messages": history(100)}, config)  # 201 messages, counted once
    assert counter.calls == 201
    per_turn = []
    for turn in range(30):
        counter.calls = 0
        new = [HumanMessage(f"more {turn}"), AIMessage(f"reply {turn}"), HumanMessage(f"again {turn}")]
        graph.invoke({"messages": new}, config)
        per_turn.append(counter.calls)
    assert per_turn == [3] * 30  # k = 3 per turn, whatever the history length (201 .. 291)
    assert len(graph.get_state(config).values["messages"]) == 291

    # An edit in place under the same id is recounted (and only it).
    stored = graph.get_state(config).values["messages"]
    edited = stored[5].model_copy(update={"content": "rewritten"})
    graph.update_state(config, {"messages": [edited]}, as_node="compact")
    counter.calls = 0
    graph.invoke({"messages": [HumanMessage("last")]}, config)
    assert counter.calls == 2


def test_cache_catches_in_place_edit_of_the_same_object() -> None:
    counter = CountingCounter()
    cache = TokenCountCache(CompactionOptions(token_counter=counter))
    msg = AIMessage("short", id="m", tool_calls=[{"name": "t", "args": {"q": "a"}, "id": "c"}])
    first = cache.counts([msg])
    assert cache.counts([msg]) == first
    assert counter.calls == 1
    # The cache trusts an object it has just seen (that is what makes a turn
    # O(new messages)); an edit is caught as soon as the message arrives as a
    # new object, as LangGraph delivers it after add_messages or a checkpoint
    # load, even under the same id.
    msg.content = "much longer content " * 50
    assert cache.counts([msg]) == first
    assert cache.counts([msg.model_copy()])[0] > first[0]
    assert counter.calls == 2
    msg.tool_calls[0]["args"]["q"] = "b" * 400
    cache.counts([msg.model_copy()])
    assert counter.calls == 3
    cache.counts([HumanMessage("no id")] * 2)
    assert counter.calls == 5  # messages without ids are never cached


def test_cache_reuses_equal_copies_and_recounts_changed_ones_in_the_middle() -> None:
    """The previous call's prefix is reused when its messages are the same objects or equal copies, never otherwise."""
    cache = TokenCountCache(CompactionOptions())
    history = [HumanMessage(f"message {i} " * 30, id=f"m{i}") for i in range(50)]
    cache.counts(history)
    # An equal copy in the middle (no ids needed: nothing is looked up) costs nothing.
    anonymous = [m.model_copy(update={"id": None}) for m in history]
    cache.counts(anonymous)
    before = cache.misses
    same = [*anonymous[:20], anonymous[20].model_copy(), *anonymous[21:], HumanMessage("new")]
    assert cache.counts(same) == TokenCountCache(CompactionOptions()).counts(same)
    assert cache.misses - before == 1
    # A changed copy in the middle, with the first and last messages the same objects, is counted again.
    changed = [*same[:20], same[20].model_copy(update={"content": "rewritten " * 300}), *same[21:]]
    assert cache.counts(changed) == TokenCountCache(CompactionOptions()).counts(changed)
    assert cache.misses - before == 1 + 31  # the changed message and the 30 after it (no ids: no lookup)


def test_cache_stays_bounded() -> None:
    cache = TokenCountCache(CompactionOptions(), max_entries=100)
    cache.counts([HumanMessage(str(i), id=str(i)) for i in range(250)])
    assert len(cache) <= 100


def test_a_compaction_lets_the_token_cache_drop_what_it_summarized() -> None:
    options = CompactionOptions(context_window=2_000, reserve_tokens=500, keep_recent_tokens=300)
    node = CompactionNode(lambda prompt: "## Goal\n- keep going", options)
    messages: list[BaseMessage] = [
        HumanMessage(f"q{i} " * 60, id=f"m{i}") if i % 2 == 0 else AIMessage(f"a{i} " * 60, id=f"m{i}")
        for i in range(30)
    ]
    update = node.invoke({"messages": messages})
    kept = {m.id for m in update["messages"] if isinstance(m, BaseMessage)} & {m.id for m in messages}
    assert 0 < len(kept) < 30
    cache = node._turn.cache
    assert len(cache) == len(kept)  # the summarized messages' counts and core forms are no longer held
    assert cache._held == sum(estimate_message_tokens([m]) for m in messages if m.id in kept)


def test_a_prepared_compaction_applied_lets_the_token_cache_drop_what_it_took_out() -> None:
    """Applied at the threshold, a preparation's removed messages leave the cache as an on-the-spot one's do.

    (Forgotten by the preparation itself, while still in the state, they were counted again by the next turns and
    kept: 1,297 of the 1,806 messages such compactions removed over 300 threads.)
    """
    node = CompactionNode(
        lambda prompt: "## Goal\n- answer",
        CompactionOptions(context_window=2_000, reserve_tokens=300, keep_recent_tokens=300),
        features=[*default_features(), PrepareAhead(at=0.6)],
        result_key="compaction",
    )
    builder = StateGraph(CompactionState)
    builder.add_node("compact", node)
    builder.add_node("agent", lambda s: {"messages": [AIMessage("an answer " * 40, id=f"a-{s['messages'][-1].id}")]})
    builder.add_edge(START, "compact")
    builder.add_edge("compact", "agent")
    graph = builder.compile(checkpointer=InMemorySaver())

    async def session(thread: str) -> tuple[set[str], bool]:
        sent, applied, config = set(), False, {"configurable": {"thread_id": thread}}
        for turn in range(10):
            question = HumanMessage(f"question {turn} " * 50, id=f"{thread}-{turn}")
            out = await graph.ainvoke({"messages": [question]}, config)
            sent |= {question.id, f"a-{question.id}"}
            applied |= bool(out.get("compaction", {}).get("parts", {}).get("prepared", {}).get("applied"))
            await asyncio.sleep(0.02)  # (the preparation started this turn finishes)
        return sent - {m.id for m in out["messages"]}, applied

    removed, applied = asyncio.run(session("t"))
    assert applied
    assert len(removed) >= 6
    assert not removed & set(node._turn.cache._entries)


def test_cache_stays_bounded_in_the_text_it_holds() -> None:
    # Bounded by count only, 1,500 finished threads of 100 KB each kept 151 MB of their text.
    cache = TokenCountCache(CompactionOptions())
    cache._max_held = 200_000  # (the default, 2 million tokens, is slow to fill)
    large = "word " * 20_000  # about 20,000 tokens
    for thread in range(30):
        cache.counts_and_core([HumanMessage(large, id=f"t{thread}")], key=thread)
    assert 0 < cache._held <= 200_000
    assert len(cache) <= 10


def _held_per_token_and_message(make: Callable[[], list[BaseMessage]]) -> tuple[float, float]:
    """The memory a cache filled with ``make()``'s messages holds (measured by emptying it), per token and message."""
    cache = TokenCountCache(CompactionOptions())
    tracemalloc.start()
    try:
        cache.counts_and_core(make())  # (made under tracemalloc, and let go of: the cache holds what it keeps)
        cache._last.clear()
        gc.collect()
        tokens, entries, before = cache._held, len(cache), tracemalloc.get_traced_memory()[0]
        cache._entries.clear()
        cache._cores.clear()
        gc.collect()
        freed = before - tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    return freed / tokens, freed / entries


def test_the_token_cache_at_its_bound_holds_35_mb_at_most() -> None:
    """Whichever bound it meets first, a cache holds 35 MB at most (``bench/cache_memory.py`` measures it in full).

    (8 million tokens and 200,000 messages, documented as about 32 MB of text, held about 120 MB: an entry
    keeps a core form and dict slots, not only the text.)
    """

    def session() -> list[BaseMessage]:
        out: list[BaseMessage] = []
        for i in range(300):
            call = {"name": "bash", "args": {"command": f"pytest tests/test_{i}.py"}, "id": f"c{i}"}
            out += [
                HumanMessage(f"Please fix the bug in src/mod_{i}.py; never change handle_{i}(). " * 4, id=f"h{i}"),
                AIMessage(f"I'll run the tests for mod_{i} first.", tool_calls=[call], id=f"a{i}"),
                ToolMessage(
                    f"FAILED tests/test_{i}.py - ValueError: bad offset {i}\n" * 3, tool_call_id=f"c{i}", id=f"t{i}"
                ),
                AIMessage(f"Fixed src/mod_{i}.py: the offset is checked before the write. " * 3, id=f"f{i}"),
            ]
        summaries = [
            compact(lambda prompt: "## Goal\n- fix `src/app.py`", out[j : j + 40])[1][0] for j in range(0, 1200, 40)
        ]
        assert len(summaries) == 30
        return [*out, *(m.model_copy(update={"id": f"s{i}"}) for i, m in enumerate(summaries))]

    per_token, _ = _held_per_token_and_message(session)
    _, per_message = _held_per_token_and_message(
        lambda: [ToolMessage("ok", tool_call_id="c", id=f"w{i}") for i in range(5_000)]
    )
    assert per_token * _MAX_HELD_TOKENS < 40e6
    assert per_message * DEFAULT_CACHE_SIZE < 40e6


def test_the_token_cache_reads_the_previous_call_once() -> None:
    """The token count cache reads its record of the previous call once: never another thread's counts."""
    # Another thread swapping the cache's memory of the previous call in the
    # middle of a call must not hand this call the other conversation's counts.
    cache = TokenCountCache(CompactionOptions())
    mine = [HumanMessage("a" * 40, id=f"a{i}") for i in range(5)]
    theirs = [HumanMessage("b" * 4000, id=f"b{i}") for i in range(5)]
    cache.counts_and_core(mine)
    truth = TokenCountCache(CompactionOptions()).counts(mine)
    reused = cache._reused

    def other_thread_runs_meanwhile(messages: Any, last: Any) -> int:
        count = reused(messages, last)
        cache._last.put(None, (theirs, *TokenCountCache(CompactionOptions()).counts_and_core(theirs)))
        return count

    cache._reused = other_thread_runs_meanwhile  # type: ignore[method-assign]
    counts, core = cache.counts_and_core(mine)
    assert list(counts) == truth
    assert all(m.text.startswith("a") for m in core)


def test_interleaved_conversations_each_keep_their_previous_call() -> None:
    """A server's conversations take turns on one node: each turn counts only that conversation's new messages."""
    cache = TokenCountCache(CompactionOptions())
    # Messages without ids cannot be found by id: only the memory of each
    # conversation's previous call spares counting them again.
    talks = {key: [HumanMessage(f"{key} says {i} " * 20) for i in range(200)] for key in ("a", "b", "c")}
    for key, messages in talks.items():
        cache.counts_and_core(messages, key)
    before = cache.misses
    for turn in range(3):
        for key, messages in talks.items():
            messages.append(HumanMessage(f"{key} turn {turn}"))
            counts, _ = cache.counts_and_core(messages, key)
            assert list(counts) == TokenCountCache(CompactionOptions()).counts(messages)
    assert cache.misses - before == 9  # the nine new messages, nothing else


def test_a_conversation_read_again_from_an_earlier_point_sums_its_own_counts() -> None:
    """A fork (a shorter history, then other messages) and the longer read before it each keep their own sums."""
    cache = TokenCountCache(CompactionOptions())
    history = [HumanMessage(f"message {i} " * (i + 1), id=f"m{i}") for i in range(12)]
    long_counts, long_core = cache.counts_and_core(history, "t")
    on = [*history, HumanMessage("the first branch goes on", id="m12")]
    on_counts, on_core = cache.counts_and_core(on, "t")  # (grows the sums the first read holds, in place)
    fork = [*history[:5], HumanMessage("another way " * 30, id="f1"), HumanMessage("and on", id="f2")]
    fork_counts, fork_core = cache.counts_and_core(fork, "t")
    for messages, counts, core in (
        (history, long_counts, long_core),
        (fork, fork_counts, fork_core),
        (on, on_counts, on_core),
    ):
        plain = TokenCountCache(CompactionOptions()).counts(messages)
        assert list(counts) == plain
        assert context_tokens(core, counts) == context_tokens(core, plain) == sum(plain)


# -- usage anchoring ----------------------------------------------------------------


def _usage(input_tokens: int, output_tokens: int) -> dict[str, int]:
    return {"input_tokens": input_tokens, "output_tokens": output_tokens, "total_tokens": input_tokens + output_tokens}


def test_usage_anchor_is_reported_tokens_plus_estimate_after() -> None:
    options = CompactionOptions(context_window=10_000, reserve_tokens=1_000, keep_recent_tokens=200)
    node = CompactionNode(PathSummarizer(), options)
    # About 6,100 tokens of messages; the request billed 9,150 (its system prompt and tools, unseen, the rest).
    msgs = history(10, size=1_200)
    msgs[-1] = AIMessage("answer", id="a-last", usage_metadata=_usage(9_100, 50))  # type: ignore[arg-type]
    after = [ToolMessage("r" * 80, tool_call_id="x", id="t1"), HumanMessage("next", id="h-next")]
    full = [*msgs, *after]
    assert node.context_tokens(full) == 9_150 + estimate_message_tokens(after)
    assert estimate_message_tokens(full) < 9_000  # the estimate alone would not fire
    update = node({"messages": full})
    assert update, "the reported usage should have triggered a compaction"

    # Reported usage below the threshold wins over a larger estimate.
    heavy = history(60, size=400)
    assert estimate_message_tokens(heavy) > 9_000
    heavy[-1] = AIMessage("ok", id="a-ok", usage_metadata=_usage(6_000, 20))  # type: ignore[arg-type]
    assert node({"messages": heavy}) == {}


def test_stale_usage_on_a_kept_message_is_ignored_after_compaction() -> None:
    options = CompactionOptions(context_window=10_000, reserve_tokens=1_000, keep_recent_tokens=300)
    summarizer = PathSummarizer()
    node = CompactionNode(summarizer, options)
    graph = build_plain(node, InMemorySaver())
    config = thread("stale")
    msgs = history(10, size=1_200)  # (about 6,100 tokens of messages: the rest of the 9,550 billed is unseen)
    msgs[-1] = AIMessage("answer", id="a-last", usage_metadata=_usage(9_500, 50))  # type: ignore[arg-type]
    graph.invoke({"messages": msgs}, config)
    stored = graph.get_state(config).values["messages"]
    assert stored[-1].id == "a-last"  # kept, still carrying the old usage
    assert summarizer.calls == ["sync"]
    # Next turn: the old 9,550 no longer describes the context; no second compaction.
    graph.invoke({"messages": [HumanMessage("and now?")]}, config)
    assert summarizer.calls == ["sync"]
    now = graph.get_state(config).values["messages"]
    assert node.context_tokens(now) == estimate_message_tokens(now)
    # A fresh reply reports the compacted context again.
    graph.invoke({"messages": [AIMessage("fresh", usage_metadata=_usage(700, 10))]}, config)  # type: ignore[arg-type]
    assert node.context_tokens(graph.get_state(config).values["messages"]) == 710


def test_mid_loop_compaction_bridges_and_the_stale_usage_on_the_kept_call_is_ignored() -> None:
    options = CompactionOptions(context_window=10_000, reserve_tokens=1_000, keep_recent_tokens=300)
    summarizer = PathSummarizer()
    node = CompactionNode(summarizer, options)
    graph = build_plain(node, InMemorySaver())
    config = thread("mid-loop")
    msgs = history(10, size=1_200)  # (about 6,100 tokens of messages: the rest of the 9,520 billed is unseen)
    call = AIMessage(
        "",
        id="call",
        tool_calls=[{"name": "lookup", "args": {"query": "q"}, "id": "c-q", "type": "tool_call"}],
        usage_metadata=_usage(9_500, 20),  # type: ignore[arg-type]
    )
    result = ToolMessage("r" * 1_150, tool_call_id="c-q", id="res")
    msgs += [HumanMessage("look it up", id="ask"), call, result]
    graph.invoke({"messages": msgs}, config)
    assert summarizer.calls == ["sync"]
    stored = graph.get_state(config).values["messages"]
    # [system, summary, bridge, the call with its old usage, its result]
    parts = assert_compacted(stored, msgs, len(msgs) - 2, same_objects=False)
    assert parts.bridge is not None
    assert [m.id for m in stored] == ["sys", parts.summary.id, parts.bridge.id, "call", "res"]
    assert_valid_anthropic_request(stored)
    # The kept call's 9,520 tokens describe the old context: no anchoring, no second compaction.
    assert node.context_tokens(stored) == estimate_message_tokens(stored)
    graph.invoke({"messages": [HumanMessage("and now?", id="now")]}, config)
    assert summarizer.calls == ["sync"]
    now = graph.get_state(config).values["messages"]
    assert node.context_tokens(now) == estimate_message_tokens(now) < 9_000
    # A fresh reply reports the compacted context again.
    graph.invoke({"messages": [AIMessage("fresh", usage_metadata=_usage(700, 10))]}, config)  # type: ignore[arg-type]
    assert node.context_tokens(graph.get_state(config).values["messages"]) == 710
    # The summarizer never saw the bridge: it did not exist yet, and later it is replaced.
    assert all(BRIDGE_TEXT not in r.prompt for r in summarizer.requests)


# -- manual compaction and the /compact command --------------------------------------


def _idle_agent(enable: bool = True) -> tuple[Any, PathSummarizer, ToolCallingFakeModel]:
    summarizer = PathSummarizer()
    model = ToolCallingFakeModel(messages=agent_script(50))
    node = CompactionNode(summarizer, CompactionOptions(), result_key="compaction", enable_compact_command=enable)
    graph = build_agent(node, model, InMemorySaver(), CompactionState)
    return graph, summarizer, model


def test_compact_thread_forces_a_compaction_with_instructions() -> None:
    graph, summarizer, model = _idle_agent()
    config = thread("manual")
    graph.invoke({"messages": [SystemMessage("Be brief.", id="sys"), HumanMessage("look up x")]}, config)
    graph.invoke({"messages": [HumanMessage("and y")]}, config)
    assert not summarizer.calls  # context_window=0: automatic compaction is off
    before = graph.get_state(config).values["messages"]
    handler = Handler()
    result = compact_thread(graph, {**config, "callbacks": [handler]}, instructions="keep the API design")
    assert result is not None
    assert result.forced
    assert "keep the API design" in summarizer.requests[-1].prompt
    state = graph.get_state(config)
    messages = state.values["messages"]
    assert messages[0].id == "sys"
    assert len(summaries(messages)) == 1
    assert messages[-1].id == before[-1].id
    assert state.values["compaction"] == result.to_dict()
    assert state.next == ()  # an idle thread stays idle
    assert handler.events == [(COMPACTION_EVENT, result.to_dict())]
    # The thread carries on normally from the compacted state.
    calls = len(model.seen)
    graph.invoke({"messages": [HumanMessage("and z")]}, config)
    assert len(model.seen) == calls + 2
    assert is_summary_message(model.seen[-1][1])


def test_compact_thread_keeps_a_turn_another_worker_answered_while_its_summary_was_made() -> None:
    """The summary call takes seconds, and another process answers the thread meanwhile: its turn stays.

    The compaction was written over the thread as it had read it: the turn
    answered meanwhile was in neither the state nor the archive.
    """
    graph, _, _ = _idle_agent()
    config = thread("raced")
    for said in ("look up x", "and y", "and z"):
        graph.invoke({"messages": [HumanMessage(said)]}, config)

    def summarize_while_a_worker_answers(prompt: str) -> str:
        if not answered:
            answered.append(graph.invoke({"messages": [HumanMessage("late turn", id="late")]}, config))
        return "## Goal\n- look things up"

    answered: list[Any] = []
    result = compact_thread(graph, config, model=summarize_while_a_worker_answers)
    assert result is not None
    assert answered
    messages = graph.get_state(config).values["messages"]
    assert len(summaries(messages)) == 1
    assert "late" in [m.id for m in messages]
    assert messages[-1].id == answered[0]["messages"][-1].id  # (the late turn's reply, last)


class _RacedSaver(InMemorySaver):
    """An in-memory checkpointer under which another worker's turn commits right after a read: when ``armed``."""

    armed: Callable[[], None] | None = None

    def get_tuple(self, config: Any) -> Any:
        found = super().get_tuple(config)
        turn, self.armed = self.armed, None
        if turn is not None:
            turn()  # (committed after that read was taken: the reader does not see it)
        return found


def test_compact_thread_keeps_a_turn_committed_between_its_last_read_and_its_write() -> None:
    """LangGraph applies the compaction to the thread's latest checkpoint: a turn committed in between stays.

    Written as a replacement of the whole list, the compaction wiped it: it
    was in neither the state nor the archive (about a tenth of the messages
    with two processes on one PostgreSQL thread).
    """
    saver = _RacedSaver()
    node = CompactionNode(PathSummarizer(), CompactionOptions(), result_key="compaction")
    graph = build_agent(node, ToolCallingFakeModel(messages=agent_script(50)), saver, CompactionState)
    config = thread("raced-write")
    for said in ("look up x", "and y", "and z"):
        graph.invoke({"messages": [HumanMessage(said)]}, config)

    def summarize_then_arm(prompt: str) -> str:
        # The next read is compact_thread's last look at the thread; the turn lands right after it.
        saver.armed = lambda: answered.append(graph.invoke({"messages": [HumanMessage("late", id="late")]}, config))
        return "## Goal\n- look things up"

    answered: list[Any] = []
    assert compact_thread(graph, config, model=summarize_then_arm) is not None
    assert answered
    messages = graph.get_state(config).values["messages"]
    assert len(summaries(messages)) == 1
    ids = [m.id for m in messages]
    assert "late" in ids
    assert answered[0]["messages"][-1].id in ids  # (the late turn's reply too)
    assert ids.index("late") > ids.index(summaries(messages)[0].id)


def test_compact_thread_leaves_a_pause_committed_between_its_last_read_and_its_write() -> None:
    """The turn that lands in that window paused for approval of a tool call: the pause stays, and it says so.

    The write's end step cleared it: the thread was left idle on an unanswered tool call.
    """
    saver = _RacedSaver()
    node = CompactionNode(PathSummarizer(), CompactionOptions(), result_key="compaction")
    model = ToolCallingFakeModel(messages=agent_script(50))
    graph = build_agent(node, model, saver, CompactionState, interrupt_before=["tools"])
    config = thread("raced-pause")
    graph.invoke({"messages": [HumanMessage("hello")]}, config)  # (the script's first reply calls a tool)
    graph.invoke(None, config)
    for said in ("and y", "and z"):
        graph.invoke({"messages": [HumanMessage(said)]}, config)
        while graph.get_state(config).next:
            graph.invoke(None, config)

    def summarize_then_arm(prompt: str) -> str:
        saver.armed = lambda: graph.invoke({"messages": [HumanMessage("look up q", id="paused")]}, config)
        return "## Goal\n- look things up"

    with pytest.raises(CompactionError, match="back as that run left it"):
        compact_thread(graph, config, model=summarize_then_arm)
    state = graph.get_state(config)
    assert state.next == ("tools",)
    assert state.values["messages"][-1].tool_calls
    assert "paused" in [m.id for m in state.values["messages"]]


def test_compact_thread_refuses_to_write_over_a_message_edited_in_place_meanwhile() -> None:
    graph, _, _ = _idle_agent()
    config = thread("edited")
    for said in ("look up x", "and y", "and z"):
        graph.invoke({"messages": [HumanMessage(said)]}, config)
    last = graph.get_state(config).values["messages"][-1]

    def summarize_while_someone_edits(prompt: str) -> str:
        graph.update_state(config, {"messages": [last.model_copy(update={"content": "edited meanwhile"})]})
        return "## Goal\n- look things up"

    with pytest.raises(CompactionError, match="compact it again once it is idle"):
        compact_thread(graph, config, model=summarize_while_someone_edits)
    assert graph.get_state(config).values["messages"][-1].content == "edited meanwhile"


def test_compact_thread_refuses_to_write_over_a_thread_another_writer_compacted_meanwhile() -> None:
    graph, _, _ = _idle_agent()
    config = thread("compacted-twice")
    for said in ("look up x", "and y", "and z"):
        graph.invoke({"messages": [HumanMessage(said)]}, config)

    def summarize_while_another_compacts(prompt: str) -> str:
        if not inner:
            inner.append(compact_thread(graph, config, model=lambda p: "## Goal\n- the other one"))
        return "## Goal\n- this one"

    inner: list[Any] = []
    with pytest.raises(CompactionError, match="compact it again once it is idle"):
        compact_thread(graph, config, model=summarize_while_another_compacts)
    messages = graph.get_state(config).values["messages"]
    assert len(summaries(messages)) == 1
    assert "the other one" in str(summaries(messages)[0].content)


def test_compact_thread_refuses_a_thread_paused_mid_run_and_one_it_cannot_name() -> None:
    """A thread paused at an interrupt keeps its pause: compacting it would drop the pending tool call's turn."""
    from langgraph.types import Command, interrupt

    def model(state: CompactionState) -> dict[str, Any]:
        if state["messages"][-1].type == "human":
            call = {"name": "deploy", "args": {}, "id": f"call-{len(state['messages'])}", "type": "tool_call"}
            return {"messages": [AIMessage("", tool_calls=[call])]}
        return {"messages": [AIMessage("Deployed.")]}

    def approval(state: CompactionState) -> dict[str, Any]:
        interrupt({"approve": state["messages"][-1].tool_calls[0]})
        return {}

    def tools(state: CompactionState) -> dict[str, Any]:
        return {"messages": [ToolMessage("deploy ok", tool_call_id=state["messages"][-1].tool_calls[0]["id"])]}

    builder = StateGraph(CompactionState)
    builder.add_node("compact", CompactionNode(lambda p: "## Goal\n- deploy", CompactionOptions()))
    builder.add_node("model", model)
    builder.add_node("approval", approval)
    builder.add_node("tools", tools)
    builder.add_edge(START, "compact")
    builder.add_conditional_edges("compact", route_after_compaction, ["model", END])
    builder.add_conditional_edges("model", lambda s: "approval" if s["messages"][-1].tool_calls else END)
    builder.add_edge("approval", "tools")
    builder.add_edge("tools", "compact")
    graph = builder.compile(checkpointer=InMemorySaver())
    config = thread("paused")
    for turn in range(3):
        graph.invoke({"messages": [HumanMessage(f"deploy build {turn} " * 30)]}, config)
        graph.invoke(Command(resume=True), config)
    graph.invoke({"messages": [HumanMessage("deploy the release")]}, config)
    before = graph.get_state(config)
    assert before.next == ("approval",)
    with pytest.raises(ConfigurationError, match="paused mid-run") as paused:
        compact_thread(graph, config)
    assert str(paused.value).startswith("thread_id='paused' is invalid")  # (the thread named as such, not as config)
    assert graph.get_state(config).next == ("approval",)
    assert graph.get_state(config).values["messages"] == before.values["messages"]
    graph.invoke(Command(resume=True), config)
    assert compact_thread(graph, config) is not None  # once the run has ended
    with pytest.raises(ConfigurationError, match="thread_id"):
        compact_thread(graph, {"configurable": {"thread": "paused"}})


def test_compact_thread_refuses_a_thread_a_run_is_going_on_without_calling_it_paused() -> None:
    # Another process's turn in progress was called "paused mid-run", and told to resume it: resumed
    # meanwhile, the run's step would be taken twice.
    import threading

    from langchain_compaction.errors import CompactionError

    entered, release = threading.Event(), threading.Event()

    def agent(state: CompactionState) -> dict[str, Any]:
        entered.set()
        release.wait(10)
        return {"messages": [AIMessage("done " * 30)]}

    node = CompactionNode(lambda p: "## Goal\n- deploy", CompactionOptions())
    graph = compaction_graph(node, agent, checkpointer=InMemorySaver())
    config = thread("running")
    turn = threading.Thread(
        target=graph.invoke, args=({"messages": [HumanMessage("deploy " * 40)]}, config), kwargs={"durability": "sync"}
    )
    turn.start()
    try:
        assert entered.wait(10)
        with pytest.raises(CompactionError, match="another run is going on it") as refused:
            compact_thread(graph, config)
        assert not isinstance(refused.value, ConfigurationError)
    finally:
        release.set()
        turn.join(10)
    assert graph.get_state(config).next == ()
    compact_thread(graph, config, instructions="keep the deploy")  # once the run has ended: no refusal


def test_compact_thread_rescues_a_thread_a_failed_step_stopped_and_the_run_resumes() -> None:
    # The model refused the request as too long: the run stopped at the model
    # with the error (no interrupt). Compacted, the thread resumes there.
    refused = []

    def model(state: CompactionState) -> dict[str, Any]:
        if estimate_message_tokens(state["messages"]) > 3_000:
            refused.append(True)
            raise ContextOverflowError("prompt is too long")
        return {"messages": [AIMessage("Answered.")]}

    builder = StateGraph(CompactionState)
    builder.add_node("compact", CompactionNode(lambda p: "## Goal\n- answer", CompactionOptions()))
    builder.add_node("model", model)
    builder.add_edge(START, "compact")
    builder.add_edge("compact", "model")
    graph = builder.compile(checkpointer=InMemorySaver())
    config = thread("refused")
    history = [HumanMessage(f"q{i} " * 300) if i % 2 == 0 else AIMessage(f"a{i} " * 300) for i in range(12)]
    with pytest.raises(ContextOverflowError):
        graph.invoke({"messages": [*history, HumanMessage("and now?")]}, config)
    assert graph.get_state(config).next == ("model",)
    result = compact_thread(graph, config)
    assert result is not None
    assert graph.get_state(config).next == ("model",)  # the failed step runs again on resume
    out = graph.invoke(None, config)
    assert out["messages"][-1].content == "Answered."
    assert is_summary_message(out["messages"][0])
    assert out["messages"][-2].content == "and now?"


def test_compact_thread_on_a_thread_a_failed_tool_stopped_resumes_at_the_tool_not_the_model() -> None:
    # compact -> model -> tools -> compact: the tool raised. Written as the
    # compaction node's update, the model would run next, its call unanswered.
    down = [True]
    seen: list[list[BaseMessage]] = []

    def model(state: CompactionState) -> dict[str, Any]:
        seen.append(list(state["messages"]))
        if isinstance(state["messages"][-1], HumanMessage) and "build" in str(state["messages"][-1].content):
            call = {"name": "bash", "args": {"cmd": "make"}, "id": f"c{len(state['messages'])}", "type": "tool_call"}
            return {"messages": [AIMessage("", tool_calls=[call])]}
        return {"messages": [AIMessage("answer " * 60)]}

    def tools(state: CompactionState) -> dict[str, Any]:
        if down[0]:
            raise RuntimeError("tool service down")
        calls = state["messages"][-1].tool_calls
        return {"messages": [ToolMessage("built", tool_call_id=c["id"]) for c in calls]}

    builder = StateGraph(CompactionState)
    builder.add_node("compact", CompactionNode(lambda p: "## Goal\n- build", CompactionOptions(context_window=4_000)))
    builder.add_node("model", model)
    builder.add_node("tools", tools)
    builder.add_edge(START, "compact")
    builder.add_edge("compact", "model")
    builder.add_conditional_edges("model", lambda s: "tools" if s["messages"][-1].tool_calls else END)
    builder.add_edge("tools", "compact")
    graph = builder.compile(checkpointer=InMemorySaver())
    config = thread("tool-down")
    for turn in range(8):
        graph.invoke({"messages": [HumanMessage(f"question {turn} " + "filler " * 40)]}, config)
    with pytest.raises(RuntimeError, match="tool service down"):
        graph.invoke({"messages": [HumanMessage("please run the build")]}, config)
    assert graph.get_state(config).next == ("tools",)
    assert compact_thread(graph, config) is not None
    assert graph.get_state(config).next == ("tools",)  # the failed step runs again on resume
    down[0] = False
    calls = len(seen)
    out = graph.invoke(None, config)
    assert isinstance(out["messages"][-2], ToolMessage)  # the tool ran first, then the model answered
    for request in seen[calls:]:
        assert_valid_anthropic_request(request)


def test_compact_thread_refuses_a_step_that_failed_beside_finished_tasks_and_says_why() -> None:
    # A fan-out of three Send workers, one failed: the two results wait in the
    # checkpoint for the run to resume; a compaction would start the step anew.
    class State(CompactionState, total=False):
        results: Annotated[list[int], operator.add]

    down = [True]

    def worker(state: dict[str, Any]) -> dict[str, Any]:
        if down[0] and state["item"] == 2:
            raise RuntimeError("worker 2 down")
        return {"results": [state["item"]]}

    builder = StateGraph(State)
    builder.add_node("compact", CompactionNode(lambda p: "## Goal\n- fan out", CompactionOptions(context_window=4_000)))
    builder.add_node("model", lambda s: {"messages": [AIMessage("answer " * 60)]})
    builder.add_node("worker", worker)
    builder.add_node("join", lambda s: {"messages": [AIMessage(f"joined {sorted(s.get('results', []))}")]})
    builder.add_edge(START, "compact")
    builder.add_edge("compact", "model")
    builder.add_conditional_edges("model", lambda s: [Send("worker", {"item": i}) for i in range(3)], ["worker"])
    builder.add_edge("worker", "join")
    graph = builder.compile(checkpointer=InMemorySaver())
    config = thread("fan-out")
    down[0] = False
    for turn in range(6):
        graph.invoke({"messages": [HumanMessage(f"question {turn} " + "filler " * 40)]}, config)
    done = len(graph.get_state(config).values["results"])
    down[0] = True
    with pytest.raises(RuntimeError, match="worker 2 down"):
        graph.invoke({"messages": [HumanMessage("again " + "filler " * 40)]}, config)
    before = graph.get_state(config)
    with pytest.raises(
        ConfigurationError, match=r"failed \(worker: .*worker 2 down.*other tasks of the same step finished"
    ):
        compact_thread(graph, config)
    assert graph.get_state(config).values == before.values
    down[0] = False
    out = graph.invoke(None, config)
    assert sorted(out["results"][done:]) == [0, 1, 2]  # the two kept, the failed one run again


def test_compact_thread_on_a_graph_without_a_checkpointer_says_to_compile_it_with_one() -> None:
    builder = StateGraph(CompactionState)
    builder.add_node("compact", CompactionNode(lambda p: "## Goal\n- x", CompactionOptions()))
    builder.add_edge(START, "compact")
    with pytest.raises(ConfigurationError, match=r"no checkpointer.*compile it with one"):
        compact_thread(builder.compile(), thread("none"))


def test_compact_thread_with_nothing_to_compact_writes_nothing() -> None:
    graph, _summarizer, _ = _idle_agent()
    config = thread("tiny")
    graph.update_state(config, {"messages": [HumanMessage("hi")]}, as_node="model")
    checkpoints = len(list(graph.get_state_history(config)))
    assert compact_thread(graph, config) is None
    assert len(list(graph.get_state_history(config))) == checkpoints


async def test_acompact_thread_and_model_override() -> None:
    graph, summarizer, _ = _idle_agent()
    config = thread("amanual")
    await graph.ainvoke({"messages": [HumanMessage("look up x")]}, config)
    other = PathSummarizer()
    result = await acompact_thread(graph, config, instructions="focus on x", model=other)
    assert result is not None
    assert other.calls == ["async"]
    assert not summarizer.calls
    assert "focus on x" in other.requests[0].prompt
    assert len(summaries((await graph.aget_state(config)).values["messages"])) == 1


def test_compact_thread_needs_a_node_or_a_model() -> None:
    builder = StateGraph(MessagesState)
    builder.add_node("echo", lambda s: {})
    builder.add_edge(START, "echo")
    graph = builder.compile(checkpointer=InMemorySaver())
    config = thread("plain")
    graph.invoke({"messages": [HumanMessage("a"), AIMessage("b"), HumanMessage("c")]}, config)
    with pytest.raises(ConfigurationError, match="no CompactionNode"):
        compact_thread(graph, config)
    result = compact_thread(graph, config, model=lambda prompt: "## Goal\n- c")
    assert result is not None
    assert result.messages_removed == 2
    assert len(graph.get_state(config).values["messages"]) == 2


class _HistoryState(TypedDict):
    history: Annotated[list[AnyMessage], add_messages]


class _NotesState(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    notes: Annotated[list[AnyMessage], add_messages]


def test_compact_thread_with_a_model_compacts_the_messages_key_it_is_given() -> None:
    # A graph that keeps its messages under another key and has no node: the
    # stand-in reads that key (the warning it gave before said to pass it, which
    # compact_thread did not take).
    builder = StateGraph(_HistoryState)
    builder.add_node("echo", lambda s: {})
    builder.add_edge(START, "echo")
    graph = builder.compile(checkpointer=InMemorySaver())
    config = thread("history")
    graph.invoke({"history": [HumanMessage("a"), AIMessage("b"), HumanMessage("c")]}, config)
    result = compact_thread(graph, config, model=lambda prompt: "## Goal\n- c", messages_key="history")
    assert result is not None
    assert result.messages_removed == 2
    assert len(graph.get_state(config).values["history"]) == 2
    # With a node, the node's own key is the one read: another is refused, not ignored; its own is fine.
    graph, _summarizer, _ = _idle_agent()
    with pytest.raises(ConfigurationError, match="node 'compact' reads 'messages'"):
        compact_thread(graph, thread("own"), messages_key="history")
    assert compact_thread(graph, thread("own"), messages_key="messages") is None  # (an empty thread)
    # Two nodes: the key is checked against the one named (it was against every one).
    builder = StateGraph(_NotesState)
    builder.add_node("a", CompactionNode(lambda prompt: "## Goal\n- a"))
    builder.add_node("b", CompactionNode(lambda prompt: "## Goal\n- b", messages_key="notes"))
    builder.add_edge(START, "a")
    builder.add_edge("a", "b")
    two = builder.compile(checkpointer=InMemorySaver())
    assert compact_thread(two, thread("two"), node="a", messages_key="messages") is None
    with pytest.raises(ConfigurationError, match="node 'b' reads 'notes'"):
        compact_thread(two, thread("two"), node="b", messages_key="messages")


def test_a_state_that_is_no_graph_state_is_refused_with_the_fix() -> None:
    # The node called on the message list itself, and compact_thread on a
    # functional-API thread (its state is what the entrypoint returned): each
    # read nothing and compacted nothing, silently, however long the list.
    history = [HumanMessage("hello " * 2000, id="1"), AIMessage("x " * 400, id="2"), HumanMessage("go on", id="3")]
    node = CompactionNode(lambda prompt: "## Goal\n- x", CompactionOptions(context_window=1_000))
    assert node({"messages": history})
    with pytest.raises(InvalidMessagesError, match=r"type list, not a graph state.*\{'messages': messages\}"):
        node(history)  # type: ignore[arg-type]
    from langgraph.func import entrypoint

    @entrypoint(checkpointer=InMemorySaver())
    def chat(text: str, *, previous: list[AnyMessage] | None = None) -> entrypoint.final[AIMessage, list[AnyMessage]]:
        kept = [*(previous or []), HumanMessage(text * 500), AIMessage("ok " * 300)]
        return entrypoint.final(value=kept[-1], save=kept)

    config = thread("functional")
    for text in ("a ", "b ", "c "):
        chat.invoke(text, config)
    with pytest.raises(InvalidMessagesError, match=r"type AIMessage.*auto_compact"):
        compact_thread(chat, config, model=lambda prompt: "## Goal\n- x")


def test_compact_command_compacts_and_never_reaches_the_model() -> None:
    graph, summarizer, model = _idle_agent()
    config = thread("cmd")
    graph.invoke({"messages": [SystemMessage("Be brief.", id="sys"), HumanMessage("look up x")]}, config)
    graph.invoke({"messages": [HumanMessage("look up y")]}, config)
    calls = len(model.seen)
    graph.invoke({"messages": [HumanMessage("/compact keep the tool results")]}, config)
    assert len(model.seen) == calls, "the command reached the model"
    messages = graph.get_state(config).values["messages"]
    assert not any(parse_compact_command(m) is not None for m in messages)
    assert len(summaries(messages)) == 1
    assert summarizer.requests[-1].instructions == "keep the tool results"
    assert graph.get_state(config).values["compaction"]["forced"] is True


def test_compact_command_with_nothing_to_compact_only_removes_itself() -> None:
    graph, summarizer, model = _idle_agent()
    config = thread("cmd-empty")
    graph.invoke({"messages": [HumanMessage("/compact")]}, config)
    assert graph.get_state(config).values["messages"] == []
    assert not summarizer.calls
    assert not model.seen


def test_a_compact_command_whose_summary_failed_never_reaches_the_model_on_the_next_turn() -> None:
    # The command's run raised; the user's next message follows it in the thread.
    down = [False]
    seen: list[list[str]] = []

    def summarize(prompt: str) -> str:
        if down[0]:
            raise TimeoutError("summary service down")
        return "## Goal\n- go on"

    builder = StateGraph(CompactionState)
    node = CompactionNode(summarize, CompactionOptions(context_window=8_000), enable_compact_command=True)
    builder.add_node("compact", node)
    builder.add_node(
        "model", lambda s: seen.append([str(m.content) for m in s["messages"]]) or {"messages": [AIMessage("ok")]}
    )
    builder.add_edge(START, "compact")
    builder.add_conditional_edges("compact", route_after_compaction, ["model", END])
    graph = builder.compile(checkpointer=InMemorySaver())
    config = thread("cmd-failed")
    for turn in range(4):
        graph.invoke({"messages": [HumanMessage(f"question {turn} " + "filler " * 20)]}, config)
    down[0] = True
    with pytest.raises(SummarizationError):
        graph.invoke({"messages": [HumanMessage("/compact keep the plan")]}, config)
    down[0] = False
    seen.clear()
    graph.invoke({"messages": [HumanMessage("next question")]}, config)
    assert seen
    assert not any(text.startswith("/compact") for request in seen for text in request)
    messages = graph.get_state(config).values["messages"]
    assert not any(parse_compact_command(m) is not None for m in messages)
    assert messages[-2].content == "next question"


def test_compact_command_is_plain_text_when_disabled() -> None:
    graph, summarizer, model = _idle_agent(enable=False)
    graph.invoke({"messages": [HumanMessage("/compact please")]}, thread("off"))
    assert not summarizer.calls
    assert model.seen[0][-1].content == "/compact please"


def test_parse_compact_command() -> None:
    assert parse_compact_command(HumanMessage("/compact")) == ""
    assert parse_compact_command(HumanMessage("  /compact\nkeep a\nand b ")) == "keep a\nand b"
    assert parse_compact_command(HumanMessage([{"type": "text", "text": "/compact x"}])) == "x"
    assert parse_compact_command(HumanMessage("/compacting")) is None
    assert parse_compact_command(AIMessage("/compact")) is None
    assert parse_compact_command(HumanMessage("please /compact")) is None


# -- observability and errors --------------------------------------------------------


async def test_custom_event_in_astream_events() -> None:
    graph = build_plain(
        CompactionNode(PathSummarizer(), SMALL, result_key="compaction"), InMemorySaver(), CompactionState
    )
    events = [
        e
        async for e in graph.astream_events({"messages": history(10)}, thread("ev"), version="v2")
        if e["event"] == "on_custom_event"
    ]
    assert [e["name"] for e in events] == [COMPACTION_EVENT]
    assert events[0]["data"] == (await graph.aget_state(thread("ev"))).values["compaction"]


def test_custom_event_callback_and_one_info_log(caplog: pytest.LogCaptureFixture) -> None:
    handler = Handler()
    graph = build_plain(CompactionNode(PathSummarizer(), SMALL), InMemorySaver())
    with caplog.at_level(logging.INFO, logger="langchain_compaction"):
        graph.invoke({"messages": history(10)}, {**thread("cb"), "callbacks": [handler]})
    assert [name for name, _ in handler.events] == [COMPACTION_EVENT]
    data = handler.events[0][1]
    records = [r for r in caplog.records if r.name == "langchain_compaction" and r.levelno == logging.INFO]
    assert len(records) == 1
    assert f"{data['original_tokens']} -> {data['compacted_tokens']} tokens" in records[0].getMessage()


def test_direct_call_dispatches_event_too() -> None:
    handler = Handler()
    CompactionNode(PathSummarizer(), SMALL).invoke({"messages": history(10)}, {"callbacks": [handler]})
    assert len(handler.events) == 1


def test_summary_failure_raises_and_leaves_the_checkpoint_whole() -> None:
    graph = build_plain(CompactionNode(PathSummarizer(fail=True), SMALL), InMemorySaver())
    config = thread("fail")
    sent = history(10)
    with pytest.raises(SummarizationError, match="model overloaded") as info:
        graph.invoke({"messages": sent}, config)
    assert isinstance(info.value, CompactionError)
    stored = graph.get_state(config).values["messages"]
    assert [m.id for m in stored] == [m.id for m in sent]
    assert not summaries(stored)


async def test_summary_failure_async_and_fallback() -> None:
    failing = PathSummarizer(fail=True)
    graph = build_plain(CompactionNode(failing, SMALL), InMemorySaver())
    with pytest.raises(SummarizationError):
        await graph.ainvoke({"messages": history(10)}, thread("afail"))
    backup = PathSummarizer()
    graph = build_plain(
        CompactionNode(failing, SMALL, fallback=backup, result_key="compaction"), InMemorySaver(), CompactionState
    )
    await graph.ainvoke({"messages": history(10)}, thread("fb"))
    values = (await graph.aget_state(thread("fb"))).values
    assert values["compaction"]["fallback_used"] is True
    assert backup.calls == ["async"]
    assert len(summaries(values["messages"])) == 1


# -- the long session ----------------------------------------------------------------


@pytest.mark.parametrize("turns", [300])
def test_300_turn_agent_session_stays_valid_and_bounded(turns: int) -> None:
    options = CompactionOptions(context_window=6_000, reserve_tokens=1_500, keep_recent_tokens=1_500)
    summarizer = PathSummarizer()
    node = CompactionNode(summarizer, options, result_key="compaction")
    model = ToolCallingFakeModel(messages=agent_script(turns))
    graph = build_agent(node, model, InMemorySaver(), CompactionState)
    config = thread("long")
    handler = Handler()
    prompt = SystemMessage("You are a research agent. Use lookup before answering.", id="system-prompt")
    states = 0
    records: list[dict[str, Any]] = []
    for turn in range(turns):
        first: list[BaseMessage] = [prompt] if turn == 0 else []
        inputs = {"messages": [*first, HumanMessage(f"Turn {turn}: what about topic {turn}?")]}
        for values in graph.stream(inputs, {**config, "callbacks": [handler]}, stream_mode="values"):
            assert_valid_anthropic_request(values["messages"])
            states += 1
    for request in model.seen:
        assert_valid_anthropic_request(request)
    records = [data for name, data in handler.events if name == COMPACTION_EVENT]
    final = graph.get_state(config).values["messages"]
    assert final[0].id == "system-prompt"
    assert is_summary_message(final[1])
    assert len(summaries(final)) == 1
    assert not any(is_summary_message(m) for m in final[2:])
    parts = split_compacted(final)  # a bridge, if any, right after the summary
    recent = parts.recent
    assert estimate_message_tokens(recent) <= options.context_window - options.reserve_tokens
    assert len(final) < 120  # out of 1,201 messages sent
    seen_turns = {int(m.content.split(":")[0].split()[1]) for m in recent if isinstance(m, HumanMessage)}
    assert seen_turns
    assert min(seen_turns) >= turns - 30  # only recent turns remain verbatim
    assert len(model.seen) == 2 * turns
    assert len(records) >= 10
    # Usage anchoring did not loop: a compaction at most every few turns.
    assert len(records) <= turns // 3
    assert all(r["messages_removed"] >= 4 for r in records)
    assert all(r["updated_previous_summary"] for r in records[1:])
    assert states > 4 * turns
    # Every model call fit the window, counting what the provider bills on top.
    billed = [estimate_message_tokens(request) + model.overhead_tokens for request in model.seen]
    assert max(billed) <= options.context_window


def test_the_documented_system_prompt_pattern_keeps_the_prompt_after_every_compaction():
    # The README's pattern: prepend the prompt on every call. The trap it
    # replaces (prepend only "if the first message is not a SystemMessage")
    # loses the prompt once the summary, a system message, comes first.
    from langchain_core.messages import SystemMessage

    prompt = SystemMessage("You are a careful coding assistant.")
    requests: dict[str, list[list]] = {"pattern": [], "trap": []}

    def build(kind: str):
        def call_model(state: MessagesState):
            messages = state["messages"]
            if kind == "pattern":
                request = [prompt, *messages]
            else:
                request = messages if isinstance(messages[0], SystemMessage) else [prompt, *messages]
            requests[kind].append(request)
            return {"messages": [AIMessage(f"answer {len(messages)} " * 60)]}

        builder = StateGraph(MessagesState)
        options = CompactionOptions(context_window=4_000, reserve_tokens=500, keep_recent_tokens=1_000)
        builder.add_node("compact", CompactionNode(lambda p: "## Goal\n- answer", options))
        builder.add_node("model", call_model)
        builder.add_edge(START, "compact")
        builder.add_edge("compact", "model")
        return builder.compile(checkpointer=InMemorySaver())

    for kind in requests:
        graph = build(kind)
        config = {"configurable": {"thread_id": kind}}
        for turn in range(20):
            graph.invoke({"messages": [HumanMessage(f"question {turn} " * 60)]}, config)
    with_prompt = {kind: sum(1 for r in rs if r[0] is prompt) for kind, rs in requests.items()}
    assert with_prompt["pattern"] == 20
    assert with_prompt["trap"] < 20  # the trap is real: the summary displaced the prompt
    for request in requests["pattern"]:
        systems = [i for i, m in enumerate(request) if isinstance(m, SystemMessage)]
        assert systems == list(range(len(systems)))  # leading and consecutive: a valid request


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_what_each_stream_mode_shows_of_a_compaction(mode: str) -> None:
    # messages: the model's own tokens, none of the compaction's internals (no
    # RemoveMessage, summary or bridge); updates: the node's update, with what
    # it wrote as dicts; values: the compacted state; custom: the result.
    from langchain_core.messages import AIMessageChunk

    from langchain_compaction.graph import COMPACTION_EVENT

    model = GenericFakeChatModel(messages=iter([AIMessage(f"reply number {i} " * 30) for i in range(40)]))

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    async def aagent(state: MessagesState, config: RunnableConfig) -> dict[str, Any]:
        # (The config passed on: before Python 3.11 an async node's is not current, and a chat
        # model called without it streams nothing.)
        return {"messages": [await model.ainvoke(state["messages"], config)]}

    builder = StateGraph(MessagesState)
    builder.add_node("compact", CompactionNode(lambda p: "## Goal\n- SUMMARY-TEXT", SMALL))
    builder.add_node("agent", agent if mode == "sync" else aagent)
    builder.add_edge(START, "compact")
    builder.add_edge("compact", "agent")
    graph = builder.compile(checkpointer=InMemorySaver())
    config = thread(f"streams-{mode}")
    seen: dict[str, list[Any]] = {"messages": [], "updates": [], "values": [], "custom": []}
    for turn in range(8):
        payload = {"messages": [HumanMessage(f"question {turn} " * 40)]}
        modes = ["messages", "updates", "values", "custom"]
        if mode == "sync":
            chunks = list(graph.stream(payload, config, stream_mode=modes))
        else:
            chunks = [c async for c in graph.astream(payload, config, stream_mode=modes)]
        for kind, chunk in chunks:
            seen[kind].append(chunk)
    compactions = [c[COMPACTION_EVENT] for c in seen["custom"] if COMPACTION_EVENT in c]
    assert compactions, "the window should have compacted"
    streamed = [message for message, _ in seen["messages"]]
    tokens = "".join(str(m.content) for m in streamed if isinstance(m, AIMessageChunk))
    assert "reply number" in tokens  # the model's own reply streams, token by token
    assert not any(m.type == "remove" or "SUMMARY-TEXT" in str(m.content) for m in streamed)
    assert not any(m.additional_kwargs.get("langchain_compaction") for m in streamed)
    compact_updates = [u["compact"] for u in seen["updates"] if u.get("compact")]
    assert len(compact_updates) == len(compactions)
    written = compact_updates[0]["messages"]
    assert written[0] == {"type": "remove", "id": "__remove_all__", "content": ""}
    assert any(isinstance(m, dict) and "SUMMARY-TEXT" in str(m["content"]) for m in written)
    final = seen["values"][-1]["messages"]
    assert sum(1 for m in final if is_summary_message(m)) == 1
    assert all(not isinstance(m, dict) for m in final)
    assert len(final) < 2 * 8


class _Appending(TypedDict):
    """A state whose messages key appends (``operator.add``) instead of using ``add_messages``."""

    messages: Annotated[list[AnyMessage], operator.add]


class _Unreduced(TypedDict):
    """A state whose messages key has no reducer: each write replaces the list."""

    messages: list[AnyMessage]


def _trimmed(left: list[AnyMessage], right: list[AnyMessage]) -> list[AnyMessage]:
    """A reducer of the user's own, built on add_messages (it keeps the newest 500)."""
    return add_messages(left, right)[-500:]  # type: ignore[arg-type,return-value]


class _OwnReducer(TypedDict):
    messages: Annotated[list[AnyMessage], _trimmed]


@dataclass
class _KeepLast:
    """A reducer of the user's own as a callable dataclass (unhashable), built on add_messages."""

    most: int

    def __call__(self, left: list[AnyMessage], right: list[AnyMessage]) -> list[AnyMessage]:
        return add_messages(left, right)[-self.most :]  # type: ignore[arg-type,return-value]


class _OwnCallableReducer(TypedDict):
    messages: Annotated[list[AnyMessage], _KeepLast(500)]


@pytest.mark.parametrize("state", [_Appending, _Unreduced])
@pytest.mark.parametrize("with_ids", [False, True])
def test_a_messages_key_without_add_messages_is_named_as_the_cause(state: type, with_ids: bool) -> None:
    """Refused on the first turn, whatever ids the messages carry (an app that tracks them, a model's reply)."""
    builder = StateGraph(state)
    builder.add_node(
        "compact", CompactionNode(lambda prompt: "## Goal\n- answer", CompactionOptions(context_window=3000))
    )

    def agent(values: dict[str, Any]) -> dict[str, Any]:
        reply = AIMessage("answer " * 60, id=f"r{len(values['messages'])}" if with_ids else None)
        return {"messages": [*values["messages"], reply] if state is _Unreduced else [reply]}

    builder.add_node("agent", agent)
    builder.add_edge(START, "compact")
    builder.add_edge("compact", "agent")
    graph = builder.compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "appending"}}

    def turns() -> int:
        for turn in range(30):
            asked = HumanMessage(f"q{turn} " * 60, id=f"q{turn}" if with_ids else None)
            held = graph.get_state(config).values.get("messages", []) if state is _Unreduced else []
            graph.invoke({"messages": [*held, asked]}, config)
        return turn

    with pytest.raises(InvalidMessagesError, match="does not use the add_messages reducer"):
        turns()
    # Refused on the first turn, before anything was written or the model saw the list: nothing lost.
    held = graph.get_state(config).values["messages"]
    assert all(isinstance(m, BaseMessage) for m in held)
    assert [str(m.content).split()[0] for m in held] == ["q0"]


@pytest.mark.parametrize("state", [_OwnReducer, _OwnCallableReducer])
def test_a_reducer_of_the_users_own_built_on_add_messages_compacts(state: type) -> None:
    builder = StateGraph(state)
    builder.add_node("compact", CompactionNode(lambda p: "## Goal\n- answer", CompactionOptions(context_window=3000)))
    builder.add_node("agent", lambda values: {"messages": [AIMessage("answer " * 60)]})
    builder.add_edge(START, "compact")
    builder.add_edge("compact", "agent")
    graph = builder.compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "own"}}
    for turn in range(30):
        graph.invoke({"messages": [HumanMessage(f"q{turn} " * 60)]}, config)
    held = graph.get_state(config).values["messages"]
    assert sum(is_summary_message(m) for m in held) == 1
    assert all(isinstance(m, BaseMessage) for m in held)


@pytest.mark.parametrize("shape", ["dicts", "tuples", "one dict among messages"])
def test_a_node_called_with_dicts_or_tuples_says_what_to_pass(shape: str) -> None:
    node = CompactionNode(lambda p: "## Goal\n- x", CompactionOptions(context_window=4_000))
    pairs = [("user", "x " * 3000), ("assistant", "y " * 3000)] * 3
    messages: list[Any] = [{"role": r, "content": c} for r, c in pairs] if shape == "dicts" else list(pairs)
    if shape == "one dict among messages":
        messages = [HumanMessage("x " * 3000), {"role": "assistant", "content": "y"}, HumanMessage("z " * 3000)]
    with pytest.raises(InvalidMessagesError, match="convert_to_messages"):
        node({"messages": messages})


class _History(TypedDict):
    history: Annotated[list[Any], add_messages]


def test_a_state_keeping_its_messages_under_another_key_is_named_once(caplog: pytest.LogCaptureFixture) -> None:
    # messages_key forgotten: the node read nothing and never compacted, silently.
    builder = StateGraph(_History)
    builder.add_node("compact", CompactionNode(lambda p: "## Goal\n- x", CompactionOptions(context_window=4_000)))
    builder.add_node("agent", lambda state: {"history": [AIMessage("ok " * 40)]})
    builder.add_edge(START, "compact")
    builder.add_edge("compact", "agent")
    graph = builder.compile(checkpointer=InMemorySaver())
    with caplog.at_level(logging.WARNING, logger="langchain_compaction"):
        for turn in range(3):
            graph.invoke({"history": [HumanMessage(f"question {turn}")]}, {"configurable": {"thread_id": "h"}})
    said = [r.getMessage() for r in caplog.records if "messages_key='history'" in r.getMessage()]
    assert len(said) == 1, said


def test_a_checkpointed_history_edited_under_an_id_is_summarized_as_edited() -> None:
    # A checkpoint hands the node new copies every turn; they are taken by
    # their ids (a turn costs what it adds), and read whole when it compacts.
    prompts: list[str] = []

    def summarize(prompt: str) -> str:
        prompts.append(prompt)
        return "## Goal\n- x"

    node = CompactionNode(summarize, CompactionOptions(context_window=4_000))
    graph = compaction_graph(node, lambda state: {"messages": [AIMessage("noted " * 30)]}, checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "edited"}}
    for turn in range(6):
        graph.invoke({"messages": [HumanMessage(f"ORIGINAL_{turn} " + "word " * 60, id=f"h{turn}")]}, config)
    graph.update_state(config, {"messages": [HumanMessage("EDITED_ONE " + "word " * 60, id="h1")]}, as_node="agent")
    for turn in range(6, 30):
        graph.invoke({"messages": [HumanMessage(f"ORIGINAL_{turn} " + "word " * 60, id=f"h{turn}")]}, config)
        if prompts:
            break
    assert prompts, "nothing compacted: the test proves nothing"
    assert "EDITED_ONE" in prompts[0]
    assert "ORIGINAL_1 " not in prompts[0]


@pytest.mark.parametrize("asynchronous", [False, True])
async def test_compact_thread_leaves_an_idle_thread_idle_with_a_static_edge_to_the_agent(asynchronous: bool) -> None:
    # Written as the node's update, the compaction left the thread due to run
    # the agent (next == ("agent",)), and a second compact_thread was refused as paused.
    node = CompactionNode(lambda p: "## Goal\n- x", CompactionOptions(context_window=4_000))
    graph = compaction_graph(
        node, lambda state: {"messages": [AIMessage("answer " * 40)]}, checkpointer=InMemorySaver()
    )
    config = {"configurable": {"thread_id": "idle"}}
    for turn in range(6):
        graph.invoke({"messages": [HumanMessage(f"question {turn} " * 30)]}, config)
    for instructions in ("keep the question numbers", "and the answers"):
        if asynchronous:
            await acompact_thread(graph, config, instructions=instructions)
        else:
            compact_thread(graph, config, instructions=instructions)
        assert graph.get_state(config).next == ()
    messages = graph.get_state(config).values["messages"]
    assert is_summary_message(messages[0])
    assert isinstance(messages[-1], AIMessage)  # the agent did not answer again


def test_compact_thread_given_the_builder_says_to_compile_it() -> None:
    builder = StateGraph(MessagesState)
    builder.add_node("compact", CompactionNode(lambda p: "## Goal\n- x", CompactionOptions(context_window=4_000)))
    builder.add_edge(START, "compact")
    with pytest.raises(ConfigurationError, match=r"builder\.compile\(checkpointer=\.\.\.\)"):
        compact_thread(builder, {"configurable": {"thread_id": "t"}})  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="the compiled graph"):
        compact_thread(None, {"configurable": {"thread_id": "t"}})  # type: ignore[arg-type]


@pytest.mark.parametrize("blocks", [False, True])
def test_a_message_replaced_in_place_by_a_node_is_counted_anew_on_the_checkpoint_copy(blocks: bool) -> None:
    # A node that rewrites an earlier message object in place (the checkpoint keeps the edit): its
    # copy equals the edited object, so only its size, as counted, tells that it changed (for
    # blocks, their texts' lengths: the number of blocks stays the same).
    edited = {"done": False}

    def agent(state: dict[str, Any]) -> dict[str, Any]:
        if not edited["done"]:
            edited["done"] = True
            page = "page text " * 8_000
            state["messages"][3].content = [{"type": "text", "text": page}] if blocks else page
        return {"messages": [AIMessage("ok")]}

    node = CompactionNode(lambda p: "## Goal\n- x", CompactionOptions(context_window=8_000), result_key="compaction")
    graph = compaction_graph(node, agent, checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "in-place"}}
    first = [
        (HumanMessage if i % 2 == 0 else AIMessage)(
            [{"type": "text", "text": f"m{i}"}] if blocks else f"m{i}", id=f"m{i}"
        )
        for i in range(12)
    ]
    graph.invoke({"messages": first}, config)
    state = graph.invoke({"messages": [HumanMessage("next", id="next")]}, config)
    assert state.get("compaction") is not None


def test_compact_thread_refuses_a_config_naming_an_older_checkpoint() -> None:
    """A config read from the thread's history names its checkpoint: written from there, later turns went."""
    graph, _, _ = _idle_agent()
    config = thread("old-config")
    for said in ("look up x", "and y", "and z"):
        graph.invoke({"messages": [HumanMessage(said)]}, config)
    older = next(s for s in graph.get_state_history(config) if len(s.values.get("messages", [])) == 4)
    before = graph.get_state(config).values["messages"]
    with pytest.raises(ConfigurationError, match="names an older checkpoint"):
        compact_thread(graph, older.config)
    assert graph.get_state(config).values["messages"] == before
    # The latest checkpoint's own config is the thread as it is now: compacted.
    assert compact_thread(graph, graph.get_state(config).config) is not None
    assert [m.id for m in graph.get_state(config).values["messages"]][-1] == before[-1].id
