"""CompactingChatMessageHistory against real stores: in memory, file, SQLite (sync and async).

What is checked throughout: after every operation, each message ever written
is either in the store or in the archive, exactly once.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import subprocess
import sys
import textwrap
import threading
import time
import uuid
import warnings
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from conftest import assert_bridge, split_compacted
from helpers_turns import SUMMARY
from langchain_core.chat_history import BaseChatMessageHistory, InMemoryChatMessageHistory
from langchain_core.language_models.fake_chat_models import FakeListChatModel, GenericFakeChatModel
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    message_to_dict,
    messages_from_dict,
)
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables import RunnableLambda
from langchain_core.runnables.history import RunnableWithMessageHistory
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

from langchain_compaction._lc.convert import BRIDGE_TEXT, is_bridge_message, is_compaction_message, is_summary_message
from langchain_compaction.core.layout import summary_body
from langchain_compaction.core.options import CompactionOptions
from langchain_compaction.errors import (
    CompactionError,
    ConfigurationError,
    EmptySummaryError,
    InvalidMessagesError,
    StoreError,
    SummarizationError,
    SummaryTimeoutError,
)
from langchain_compaction.history import (
    CompactingChatMessageHistory,
    FileLock,
    InProcessLock,
    PostgresAdvisoryLock,
    stores,
)
from langchain_compaction.history.locks import advisory_key
from langchain_compaction.summarizers.extractive import ExtractiveSummarizer

with warnings.catch_warnings():
    # langchain-community warns on import that it is being sunset.
    warnings.simplefilter("ignore", DeprecationWarning)
    from langchain_community.chat_message_histories import FileChatMessageHistory, SQLChatMessageHistory
    from langchain_community.chat_message_histories.sql import DefaultMessageConverter

# InMemoryChatMessageHistory itself warns when instantiated (deprecated in
# langchain-core 1.6.4); its subclasses and our wrapper do not.
pytestmark = pytest.mark.filterwarnings("ignore:The class `InMemoryChatMessageHistory`:DeprecationWarning")

# A small window so that compaction fires every few dozen messages.
OPTIONS = CompactionOptions(context_window=3000, reserve_tokens=1000, keep_recent_tokens=600)
PAD = " lorem ipsum dolor" * 6  # ~30 tokens a message
PG_URL = "postgresql://postgres@127.0.0.1:5432/chat"  # never connected to: constructions only


def memory() -> InMemoryChatMessageHistory:
    return InMemoryChatMessageHistory()


class Summaries:
    """A summarizer function that numbers its summaries and keeps the prompts."""

    def __init__(self) -> None:
        self.prompts: list[str] = []
        self._guard = threading.Lock()

    def __call__(self, prompt: str) -> str:
        with self._guard:
            self.prompts.append(prompt)
            return f"## Goal\n- summary number {len(self.prompts)}"


def contents(messages: list[BaseMessage]) -> list[str]:
    """The originals' contents: what this library wrote (summary, bridge) left out."""
    return [str(m.content) for m in messages if not is_compaction_message(m)]


def assert_store_layout(store: list[BaseMessage]) -> None:
    """At most one summary; if any, at most one bridge, right after it, and only when needed."""
    bridges = [m for m in store if is_bridge_message(m)]
    if not any(is_summary_message(m) for m in store):
        assert not bridges, "a bridge without its summary"
        return
    parts = split_compacted(store)
    if parts.bridge is not None:
        # Only in front of a kept part that does not start with the user.
        assert not parts.recent or not isinstance(parts.recent[0], HumanMessage)


def assert_nothing_lost(expected: list[str], store: list[BaseMessage], archive: list[BaseMessage]) -> None:
    # The archive holds originals only: never a summary, never a bridge.
    assert not [m for m in archive if is_compaction_message(m)], "the archive holds a summary or a bridge"
    assert_store_layout(store)
    seen = Counter(contents(store) + contents(archive))
    missing = [c for c in expected if seen[c] == 0]
    twice = {c: n for c, n in seen.items() if n > 1}
    assert not missing, f"{len(missing)} messages lost, e.g. {missing[:3]}"
    assert not twice, f"messages stored twice: {list(twice.items())[:3]}"
    assert set(seen) == set(expected)


def summaries_in(messages: list[BaseMessage]) -> list[BaseMessage]:
    return [m for m in messages if is_summary_message(m)]


def turn(i: int) -> list[BaseMessage]:
    return [HumanMessage(f"q{i}{PAD}", id=f"h{i}"), AIMessage(f"a{i}{PAD}", id=f"a{i}")]


# ---------------------------------------------------------------------------
# Stores
# ---------------------------------------------------------------------------


def chat(turns: int) -> list[BaseMessage]:
    """``turns`` short question/answer pairs (ids h0, a0, ...)."""
    messages: list[BaseMessage] = []
    for i in range(turns):
        messages += [HumanMessage(f"q{i} " * 50, id=f"h{i}"), AIMessage(f"a{i} " * 50, id=f"a{i}")]
    return messages


def sqlite_url(tmp_path: Path, name: str = "chat.db") -> str:
    return f"sqlite:///{tmp_path / name}"


SYNC_STORES: dict[str, Callable[[Path, str], BaseChatMessageHistory]] = {
    "memory": lambda tmp, name: memory(),
    "file": lambda tmp, name: FileChatMessageHistory(str(tmp / f"{name}.json")),
    "sql": lambda tmp, name: SQLChatMessageHistory(session_id=name, connection=sqlite_url(tmp)),
}


@pytest.fixture(params=sorted(SYNC_STORES))
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[str], BaseChatMessageHistory]:
    factory = SYNC_STORES[request.param]
    return lambda name: factory(tmp_path, name)


@pytest.fixture
async def async_sql(tmp_path: Path) -> AsyncIterator[Callable[[str], SQLChatMessageHistory]]:
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'async.db'}")
    yield lambda name: SQLChatMessageHistory(session_id=name, connection=engine)
    # Disposed on the test's own loop: its connections cannot be closed from another one, and one
    # left open warns when it is collected, in whichever test is running then.
    await engine.dispose()


# ---------------------------------------------------------------------------
# Construction
# ---------------------------------------------------------------------------


def test_rewrite_strategy_per_store(tmp_path: Path) -> None:
    class Subclass(InMemoryChatMessageHistory):
        def add_message(self, message: BaseMessage) -> None:
            super().add_message(message)

    picked = {
        name: repr(CompactingChatMessageHistory(factory(tmp_path, name), Summaries(), OPTIONS))
        for name, factory in SYNC_STORES.items()
    }
    assert "rewrite='memory'" in picked["memory"]
    assert "rewrite='file'" in picked["file"]
    assert "rewrite='sql'" in picked["sql"]
    # A subclass that overrides a write method gets the journaled path that calls it.
    assert "rewrite='journal'" in repr(CompactingChatMessageHistory(Subclass(), Summaries(), OPTIONS))


def test_no_deprecation_warning_of_its_own(tmp_path: Path) -> None:
    store = FileChatMessageHistory(str(tmp_path / "w.json"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = CompactingChatMessageHistory(store, Summaries(), OPTIONS)
        for i in range(40):
            history.add_messages(turn(i))
        history.compact()
    assert summaries_in(history.messages)
    assert [str(w.message) for w in caught] == []


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"on_error": "ignore"}, "on_error"),
        ({"archive": "not a history"}, "archive"),
        ({"lock": object()}, "lock"),
        ({"options": {"context_window": 10}}, "options"),
    ],
)
def test_configuration_errors_name_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        CompactingChatMessageHistory(memory(), Summaries(), **kwargs)
    assert info.value.field == field
    assert field in str(info.value)


def test_archive_cannot_be_the_store_itself() -> None:
    store = memory()
    with pytest.raises(ConfigurationError, match="archive"):
        CompactingChatMessageHistory(store, Summaries(), OPTIONS, archive=store)


def test_a_journal_cannot_be_the_archive(tmp_path: Path) -> None:
    # Every rewrite clears the journal: as the archive, it lost each compacted original.
    shared, path = memory(), tmp_path / "archive.json"
    for archive, journal in ((shared, shared), (FileChatMessageHistory(str(path)), FileChatMessageHistory(str(path)))):
        with pytest.raises(ConfigurationError, match="not the archive itself") as info:
            CompactingChatMessageHistory(memory(), Summaries(), OPTIONS, archive=archive, journal=journal)
        assert info.value.field == "journal"
    with pytest.raises(ConfigurationError, match="not the inner store itself") as info:
        CompactingChatMessageHistory(shared, Summaries(), OPTIONS, archive=memory(), journal=shared)
    assert info.value.field == "journal"


async def test_add_messages_of_no_list_says_to_pass_a_list() -> None:
    # None was a bare TypeError; one message was iterated as its fields ("messages[0]=('content', 'hi')").
    inner = memory()
    history = CompactingChatMessageHistory(inner, Summaries(), OPTIONS)
    for wrong, said in ((None, "NoneType, not a list"), (HumanMessage("hi"), r"one HumanMessage.*pass \[message\]")):
        with pytest.raises(InvalidMessagesError, match=said):
            history.add_messages(wrong)  # type: ignore[arg-type]
        with pytest.raises(InvalidMessagesError, match=said):
            await history.aadd_messages(wrong)  # type: ignore[arg-type]
    history.add_message(HumanMessage("hi"))  # the one-message method
    assert [m.content for m in inner.messages] == ["hi"]


# ---------------------------------------------------------------------------
# Behaviour on each sync store
# ---------------------------------------------------------------------------


def test_auto_compaction_layout_and_ids(make_store: Callable[[str], BaseChatMessageHistory]) -> None:
    store = make_store("layout")
    history = CompactingChatMessageHistory(store, Summaries(), OPTIONS, archive=make_store("layout-archive"))
    history.add_messages([SystemMessage("You are terse.", id="sys")])
    written = ["You are terse."]
    for i in range(60):
        history.add_messages(turn(i))
        written += [f"q{i}{PAD}", f"a{i}{PAD}"]
    stored = store.messages
    assert stored[0].content == "You are terse."
    assert stored[0].id == "sys"
    assert is_summary_message(stored[1])
    assert stored[1].id
    assert len(summaries_in(stored)) == 1  # updated, never nested
    assert not any(is_summary_message(m) for m in stored[2:])
    # The recent messages are the last ones written, in order, ids intact
    # (after a bridge when they start with the assistant's reply).
    parts = split_compacted(stored)
    recent = parts.recent
    assert (parts.bridge is not None) is isinstance(recent[0], AIMessage)
    assert [m.content for m in recent] == written[-len(recent) :]
    assert recent[-1].id == "a59"
    assert history.messages == stored
    assert_nothing_lost(written, stored, history.archive.messages)  # type: ignore[union-attr]


def test_iterative_summary_updates_the_previous_one(make_store: Callable[[str], BaseChatMessageHistory]) -> None:
    summaries = Summaries()
    history = CompactingChatMessageHistory(make_store("iter"), summaries, OPTIONS)
    for i in range(12):
        history.add_messages(turn(i))
    first = history.compact()
    assert first is not None
    assert not first.updated_previous_summary
    for i in range(12, 24):
        history.add_messages(turn(i))
    (previous,) = summaries_in(history.messages)
    previous_text = summary_body(str(previous.content)).splitlines()[-1]
    calls_before = len(summaries.prompts)
    second = history.compact(custom_instructions="keep the question numbers")
    assert second is not None
    assert second.updated_previous_summary
    # The first request (of one per chunk) was shown the summary in the store, to update it.
    requests = summaries.prompts[calls_before:]
    assert len(requests) == second.summarizer_calls
    assert previous_text in requests[0]
    assert all("keep the question numbers" in r for r in requests)
    (latest,) = summaries_in(history.messages)  # one summary: updated, not nested
    assert summary_body(str(latest.content)).endswith(f"summary number {len(summaries.prompts)}")
    assert latest.id != previous.id


def test_manual_compact_forces_and_returns_result(make_store: Callable[[str], BaseChatMessageHistory]) -> None:
    history = CompactingChatMessageHistory(
        make_store("manual"), Summaries(), CompactionOptions(keep_recent_tokens=5000)
    )
    assert history.compact() is None  # empty: nothing to compact
    for i in range(3):
        history.add_messages(turn(i))
    result = history.compact()
    assert result is not None
    assert result.forced
    assert result.messages_removed == 5
    stored = history.messages
    # Only the last reply is kept: a bridge puts the user's turn first.
    assert [is_summary_message(m) for m in stored] == [True, False, False]
    assert_bridge(stored[1])
    assert stored[-1].id == "a2"
    assert split_compacted(stored).recent == [stored[-1]]
    # Compacting again has nothing to do: the bridge is no message to summarize.
    assert history.compact() is None
    assert history.messages == stored


def test_no_window_means_no_automatic_compaction(make_store: Callable[[str], BaseChatMessageHistory]) -> None:
    summaries = Summaries()
    history = CompactingChatMessageHistory(make_store("nowin"), summaries, CompactionOptions())
    for i in range(80):
        history.add_messages(turn(i))
    assert len(history.messages) == 160
    assert summaries.prompts == []


def test_archive_receives_each_original_exactly_once(make_store: Callable[[str], BaseChatMessageHistory]) -> None:
    archive = make_store("once-archive")
    history = CompactingChatMessageHistory(make_store("once"), Summaries(), OPTIONS, archive=archive)
    written = []
    for i in range(120):
        history.add_messages(turn(i))
        written += [f"q{i}{PAD}", f"a{i}{PAD}"]
    history.compact()
    archived = archive.messages
    assert not summaries_in(archived)  # only originals, never summaries
    assert not any(is_bridge_message(m) for m in archived)  # nor a bridge
    assert BRIDGE_TEXT not in [m.content for m in archived]
    assert contents(archived) == written[: len(archived)]  # in order, each once
    assert_nothing_lost(written, history.messages, archived)
    # The summary records how long the archive was after its compaction.
    summary = summaries_in(history.messages)[0]
    assert summary.additional_kwargs["langchain_compaction"]["archived"] == len(archived)


def test_one_message_object_added_many_times_is_archived_each_time() -> None:
    # An in-memory store keeps the objects it is given: a constant "continue"
    # turn is the same object every time. Each time it is a message of its own:
    # those compacted reach the archive, as many times as they were added.
    store, archive = InMemoryChatMessageHistory(), InMemoryChatMessageHistory()
    history = CompactingChatMessageHistory(store, Summaries(), OPTIONS, archive=archive)
    again = HumanMessage(f"continue please{PAD}")
    for i in range(60):
        history.add_messages([again, AIMessage(f"a{i}{PAD}")])
    history.compact()
    archived, recent = archive.messages, split_compacted(history.messages).recent
    assert archived
    assert recent
    assert len(archived) + len(recent) == 120
    assert sum(m is again for m in archived) + sum(m is again for m in recent) == 60
    assert contents(archived) + contents(recent) == [c for i in range(60) for c in (again.content, f"a{i}{PAD}")]


def test_parallel_results_stored_one_at_a_time_never_lose_their_call() -> None:
    # The first result alone is over what a request may hold; the exchange is
    # not summarized whole while the second result is still to come.
    history = CompactingChatMessageHistory(InMemoryChatMessageHistory(), Summaries(), OPTIONS)
    calls = [{"name": "read_log", "args": {"path": f"{n}.log"}, "id": f"c{n}", "type": "tool_call"} for n in (1, 2)]
    history.add_messages([HumanMessage("q0"), AIMessage("a0"), HumanMessage("read both logs")])
    history.add_messages([AIMessage("", tool_calls=calls)])
    history.add_messages([ToolMessage("ERROR x " * 3_000, tool_call_id="c1")])
    waiting = history.messages
    assert [m.type for m in waiting[-2:]] == ["ai", "tool"]  # kept whole while c2 is unanswered
    history.add_messages([ToolMessage("b.log: no errors", tool_call_id="c2")])
    stored = history.messages
    called = {c["id"] for m in stored if isinstance(m, AIMessage) for c in m.tool_calls}
    assert {m.tool_call_id for m in stored if isinstance(m, ToolMessage)} <= called  # no result without its call


def test_bridge_round_trips_through_the_store_and_is_replaced_not_archived(
    make_store: Callable[[str], BaseChatMessageHistory],
) -> None:
    summaries = Summaries()
    archive = make_store("bridge-archive")
    options = CompactionOptions(keep_recent_tokens=5000)
    history = CompactingChatMessageHistory(make_store("bridge"), summaries, options, archive=archive)
    written: list[str] = []
    for i in range(3):
        history.add_messages(turn(i))
        written += [f"q{i}{PAD}", f"a{i}{PAD}"]
    assert history.compact() is not None  # forced: only the last reply is kept
    first = split_compacted(history.messages)  # read back from the store
    assert first.bridge is not None
    assert [m.id for m in first.recent] == ["a2"]
    for i in range(3, 6):
        history.add_messages(turn(i))
        written += [f"q{i}{PAD}", f"a{i}{PAD}"]
    second_result = history.compact()
    assert second_result is not None
    assert second_result.updated_previous_summary
    stored = history.messages
    second = split_compacted(stored)
    assert second.bridge is not None
    assert second.bridge.id != first.bridge.id
    assert sum(1 for m in stored if is_bridge_message(m)) == 1
    assert [m.id for m in second.recent] == ["a5"]
    assert BRIDGE_TEXT not in summaries.prompts[-1]
    # Every original but the kept one went to the archive once, in order; the bridge never did.
    assert contents(archive.messages) == written[:-1]
    assert_nothing_lost(written, stored, archive.messages)


async def test_bridge_with_the_async_api(async_sql: Callable[[str], SQLChatMessageHistory]) -> None:
    archive = async_sql("abridge-archive")
    history = CompactingChatMessageHistory(
        async_sql("abridge"), Summaries(), CompactionOptions(keep_recent_tokens=5000), archive=archive
    )
    written: list[str] = []
    for round_number in range(2):
        for i in range(3 * round_number, 3 * round_number + 3):
            await history.aadd_messages(turn(i))
            written += [f"q{i}{PAD}", f"a{i}{PAD}"]
        assert await history.acompact() is not None
        stored = await history.aget_messages()
        parts = split_compacted(stored)
        assert parts.bridge is not None
        assert [m.id for m in parts.recent] == [f"a{3 * round_number + 2}"]
        assert_nothing_lost(written, stored, await archive.aget_messages())
    assert contents(await archive.aget_messages()) == written[:-1]


def test_clear_passes_through_and_keeps_archive(make_store: Callable[[str], BaseChatMessageHistory]) -> None:
    archive = make_store("clear-archive")
    history = CompactingChatMessageHistory(make_store("clear"), Summaries(), OPTIONS, archive=archive)
    for i in range(40):
        history.add_messages(turn(i))
    archived = len(archive.messages)
    assert archived > 0
    history.clear()
    assert history.messages == []
    assert len(archive.messages) == archived
    # A new conversation after the clear is archived in full too.
    for i in range(100, 140):
        history.add_messages(turn(i))
    fresh = [c for c in contents(archive.messages) if c.startswith(("q1", "a1")) and c[1:4].isdigit()]
    assert fresh
    assert len(contents(archive.messages)) == len(set(contents(archive.messages)))


# ---------------------------------------------------------------------------
# Chat memory: RunnableWithMessageHistory and a LangGraph node
# ---------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:RunnableWithMessageHistory is deprecated:DeprecationWarning")
def test_runnable_with_message_history(tmp_path: Path) -> None:
    seen: list[list[BaseMessage]] = []

    def record(value: Any) -> Any:
        seen.append(value.to_messages())
        return value

    prompt = ChatPromptTemplate.from_messages(
        [("system", "You are helpful."), MessagesPlaceholder("history"), ("human", "{input}")]
    )
    chat = FakeListChatModel(responses=[f"reply{PAD}"])
    summarizer = FakeListChatModel(responses=["## Goal\n- answer the user's numbered questions"])

    def history_for(session_id: str) -> CompactingChatMessageHistory:
        store = SQLChatMessageHistory(session_id=session_id, connection=sqlite_url(tmp_path))
        return CompactingChatMessageHistory(store, summarizer, OPTIONS)

    chain = RunnableWithMessageHistory(
        prompt | RunnableLambda(record) | chat,
        history_for,
        input_messages_key="input",
        history_messages_key="history",
    )
    config = {"configurable": {"session_id": "user-1"}}
    for i in range(40):
        reply = chain.invoke({"input": f"question {i}{PAD}"}, config=config)
        assert reply.content.startswith("reply")
    stored = history_for("user-1").messages
    assert is_summary_message(stored[0])
    assert stored[-2].content == f"question 39{PAD}"
    assert stored[-1].content == f"reply{PAD}"
    # The chat model saw the summary as memory on later turns.
    assert any(is_summary_message(m) for m in seen[-1])
    # Another session is untouched.
    assert history_for("user-2").messages == []


@pytest.mark.filterwarnings("ignore:RunnableWithMessageHistory is deprecated:DeprecationWarning")
async def test_runnable_with_message_history_async(async_sql: Callable[[str], SQLChatMessageHistory]) -> None:
    prompt = ChatPromptTemplate.from_messages([MessagesPlaceholder("history"), ("human", "{input}")])
    chat = FakeListChatModel(responses=[f"reply{PAD}"])

    async def summarize(text: str) -> str:
        await asyncio.sleep(0)
        return "## Goal\n- async summary"

    def history_for(session_id: str) -> CompactingChatMessageHistory:
        return CompactingChatMessageHistory(async_sql(session_id), summarize, OPTIONS)

    chain = RunnableWithMessageHistory(
        prompt | chat, history_for, input_messages_key="input", history_messages_key="history"
    )
    for i in range(40):
        await chain.ainvoke({"input": f"question {i}{PAD}"}, config={"configurable": {"session_id": "s"}})
    stored = await history_for("s").aget_messages()
    assert is_summary_message(stored[0])
    assert "async summary" in str(stored[0].content)
    assert stored[-1].content == f"reply{PAD}"


class TurnState(TypedDict):
    question: str
    answer: str


def build_graph(history_for: Callable[[str], CompactingChatMessageHistory], chat: Any) -> Any:
    def respond(state: TurnState, config: Any) -> dict[str, str]:
        history = history_for(config["configurable"]["thread_id"])
        question = HumanMessage(state["question"])
        reply = chat.invoke([*history.messages, question])
        history.add_messages([question, reply])
        return {"answer": str(reply.content)}

    async def arespond(state: TurnState, config: Any) -> dict[str, str]:
        history = history_for(config["configurable"]["thread_id"])
        question = HumanMessage(state["question"])
        reply = await chat.ainvoke([*(await history.aget_messages()), question])
        await history.aadd_messages([question, reply])
        return {"answer": str(reply.content)}

    graph = StateGraph(TurnState)
    graph.add_node("respond", RunnableLambda(respond, arespond))
    graph.add_edge(START, "respond")
    graph.add_edge("respond", END)
    return graph.compile(checkpointer=InMemorySaver())


def test_langgraph_node_uses_history_as_memory(tmp_path: Path) -> None:
    replies = iter([AIMessage(f"answer {i}{PAD}") for i in range(40)])
    chat = GenericFakeChatModel(messages=replies)

    def history_for(thread: str) -> CompactingChatMessageHistory:
        store = FileChatMessageHistory(str(tmp_path / f"{thread}.json"))
        return CompactingChatMessageHistory(store, Summaries(), OPTIONS)

    app = build_graph(history_for, chat)
    config = {"configurable": {"thread_id": "t1"}}
    for i in range(40):
        out = app.invoke({"question": f"q{i}{PAD}", "answer": ""}, config)
        assert out["answer"] == f"answer {i}{PAD}"
    stored = history_for("t1").messages
    assert is_summary_message(stored[0])
    assert [m.content for m in stored[-2:]] == [f"q39{PAD}", f"answer 39{PAD}"]
    assert app.get_state(config).values["answer"] == f"answer 39{PAD}"


async def test_langgraph_node_async(async_sql: Callable[[str], SQLChatMessageHistory]) -> None:
    chat = GenericFakeChatModel(messages=iter([AIMessage(f"answer {i}{PAD}") for i in range(40)]))
    app = build_graph(lambda thread: CompactingChatMessageHistory(async_sql(thread), Summaries(), OPTIONS), chat)
    for i in range(40):
        await app.ainvoke({"question": f"q{i}{PAD}", "answer": ""}, {"configurable": {"thread_id": "t"}})
    stored = await async_sql("t").aget_messages()
    assert is_summary_message(stored[0])
    assert stored[-1].content == f"answer 39{PAD}"


# ---------------------------------------------------------------------------
# Async SQLite: real async all the way
# ---------------------------------------------------------------------------


async def test_async_sql_store_compacts_with_async_model(async_sql: Callable[[str], SQLChatMessageHistory]) -> None:
    calls: list[str] = []

    async def summarize(prompt: str) -> str:
        calls.append(prompt)
        await asyncio.sleep(0)
        return "## Goal\n- async"

    store = async_sql("a")
    archive = async_sql("a-archive")
    history = CompactingChatMessageHistory(store, summarize, OPTIONS, archive=archive)
    written = []
    for i in range(60):
        await history.aadd_messages(turn(i))
        written += [f"q{i}{PAD}", f"a{i}{PAD}"]
    before = await store.aget_messages()
    result = await history.acompact()
    assert result is not None
    assert calls
    stored = await store.aget_messages()
    assert is_summary_message(stored[0])
    assert result.messages_removed > 0
    assert stored[-1].id == "a59"
    assert len(stored) == len(before) - result.messages_removed + 1
    assert_nothing_lost(written, stored, await archive.aget_messages())
    # The sync API of an async-engine store fails: wrapped, with the operation named.
    with pytest.raises(StoreError) as info:
        _ = history.messages
    assert info.value.operation == "read"
    await history.aclear()
    assert await history.aget_messages() == []


# ---------------------------------------------------------------------------
# Concurrency: 8 writers x 200 messages with compaction firing
# ---------------------------------------------------------------------------


def run_threads(count: int, target: Callable[[int], None]) -> None:
    errors: list[BaseException] = []

    def wrapped(n: int) -> None:
        try:
            target(n)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=wrapped, args=(n,)) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []


def test_concurrent_writers_lose_nothing(make_store: Callable[[str], BaseChatMessageHistory], tmp_path: Path) -> None:
    summaries = Summaries()
    store = make_store("conc")
    archive = make_store("conc-archive")
    if isinstance(archive, FileChatMessageHistory):
        # FileChatMessageHistory rewrites the whole file for every message it
        # appends: a 1,600-message archive in a file is quadratic. Keep the
        # store a file and the archive in SQLite.
        archive = SQLChatMessageHistory(session_id="conc-archive", connection=sqlite_url(tmp_path, "archive.db"))
    written = [f"w{w}-m{i}{PAD}" for w in range(8) for i in range(200)]

    def writer(w: int) -> None:
        # A wrapper per writer, as a per-request factory makes them: they share
        # the session's in-process lock.
        history = CompactingChatMessageHistory(store, summaries, OPTIONS, archive=archive)
        for i in range(200):
            history.add_messages([HumanMessage(f"w{w}-m{i}{PAD}")])

    run_threads(8, writer)
    stored = store.messages
    assert len(summaries.prompts) >= 10  # compaction fired many times meanwhile
    assert len(summaries_in(stored)) == 1
    assert_nothing_lost(written, stored, archive.messages)
    # Each writer's messages stay in the order it wrote them.
    order = contents(archive.messages) + contents(stored)
    for w in range(8):
        mine = [c for c in order if c.startswith(f"w{w}-")]
        assert mine == [f"w{w}-m{i}{PAD}" for i in range(200)]


async def test_concurrent_async_writers_lose_nothing(async_sql: Callable[[str], SQLChatMessageHistory]) -> None:
    calls = 0

    async def summarize(prompt: str) -> str:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0.01)  # writers append while the summary is made
        return f"## Goal\n- summary {calls}"

    store, archive = async_sql("conc"), async_sql("conc-archive")
    written = [f"w{w}-m{i}{PAD}" for w in range(8) for i in range(200)]

    async def writer(w: int) -> None:
        history = CompactingChatMessageHistory(store, summarize, OPTIONS, archive=archive)
        for i in range(200):
            await history.aadd_messages([HumanMessage(f"w{w}-m{i}{PAD}")])

    await asyncio.gather(*(writer(w) for w in range(8)))
    stored = await store.aget_messages()
    assert calls >= 10
    assert_nothing_lost(written, stored, await archive.aget_messages())


async def test_concurrent_async_writers_in_memory() -> None:
    async def summarize(prompt: str) -> str:
        await asyncio.sleep(0.005)
        return "## Goal\n- s"

    store, archive = memory(), memory()
    history = CompactingChatMessageHistory(store, summarize, OPTIONS, archive=archive)
    written = [f"w{w}-m{i}{PAD}" for w in range(8) for i in range(200)]

    async def writer(w: int) -> None:
        for i in range(200):
            await history.aadd_messages([HumanMessage(f"w{w}-m{i}{PAD}")])

    await asyncio.gather(*(writer(w) for w in range(8)))
    assert_nothing_lost(written, store.messages, archive.messages)


def test_in_process_lock_excludes_threads_and_tasks() -> None:
    lock = InProcessLock()
    inside = 0
    peak = 0

    async def task() -> None:
        nonlocal inside, peak
        async with lock.ahold():
            inside += 1
            peak = max(peak, inside)
            await asyncio.sleep(0.002)
            inside -= 1

    def thread() -> None:
        nonlocal inside, peak
        for _ in range(20):
            with lock.hold():
                inside += 1
                peak = max(peak, inside)
                time.sleep(0.001)
                inside -= 1

    worker = threading.Thread(target=thread)
    worker.start()

    async def main() -> None:
        await asyncio.gather(*(task() for _ in range(20)))

    asyncio.run(main())
    worker.join()
    assert peak == 1


WRITER_SCRIPT = textwrap.dedent(
    """
    import sys, warnings
    warnings.simplefilter("ignore", DeprecationWarning)
    from langchain_community.chat_message_histories import SQLChatMessageHistory
    from langchain_core.messages import HumanMessage
    from langchain_compaction.history import CompactingChatMessageHistory
    from langchain_compaction.history import FileLock
    from langchain_compaction.core.options import CompactionOptions

    url, lock_path, name, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    options = CompactionOptions(context_window=3000, reserve_tokens=1000, keep_recent_tokens=600)
    history = CompactingChatMessageHistory(
        SQLChatMessageHistory(session_id="shared", connection=url),
        lambda prompt: "## Goal\\n- from " + name,
        options,
        archive=SQLChatMessageHistory(session_id="shared-archive", connection=url),
        lock=FileLock(lock_path),
    )
    pad = " lorem ipsum dolor" * 6
    for i in range(count):
        history.add_messages([HumanMessage(f"{name}-m{i}{pad}")])
    """
)


def test_processes_sharing_sqlite_with_file_lock(tmp_path: Path) -> None:
    url = sqlite_url(tmp_path, "shared.db")
    SQLChatMessageHistory(session_id="shared", connection=url)  # create the table once
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER_SCRIPT, url, str(tmp_path / "chat.lock"), f"p{n}", "100"],
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(4)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    store = SQLChatMessageHistory(session_id="shared", connection=url).messages
    archive = SQLChatMessageHistory(session_id="shared-archive", connection=url).messages
    assert summaries_in(store)
    assert_nothing_lost([f"p{n}-m{i}{PAD}" for n in range(4) for i in range(100)], store, archive)


async def test_file_lock_async_and_sync_exclude_each_other(tmp_path: Path) -> None:
    lock = FileLock(tmp_path / "l.lock")
    order: list[str] = []
    with lock.hold():

        async def waiter() -> None:
            async with lock.ahold():
                order.append("async")

        task = asyncio.ensure_future(waiter())
        await asyncio.sleep(0.05)
        order.append("sync-release")
    await task
    assert order == ["sync-release", "async"]


def test_blocking_hold_on_the_loop_thread_while_a_task_holds_the_lock_raises() -> None:
    """A blocking hold on the loop's thread while a task on that loop holds the lock raises, never deadlocks."""
    lock = InProcessLock()

    async def main() -> None:
        async with lock.ahold():
            with pytest.raises(CompactionError, match="deadlock the loop"), lock.hold():
                pass

    asyncio.run(main())
    with lock.hold():  # released: usable again
        pass


def test_hold_and_ahold_exclude_each_other_across_threads() -> None:
    """The lock's blocking and async holds exclude each other across threads."""
    lock = InProcessLock()
    inside = threading.Event()
    release = threading.Event()
    order: list[str] = []

    def holder() -> None:
        with lock.hold():
            inside.set()
            release.wait(5)
            order.append("thread out")

    async def main() -> None:
        worker = threading.Thread(target=holder)
        worker.start()
        inside.wait(5)
        waiting = asyncio.ensure_future(_enter(lock, order))
        await asyncio.sleep(0.05)
        assert order == []  # the task waits for the thread
        release.set()
        await waiting
        worker.join()

    asyncio.run(main())
    assert order == ["thread out", "task in"]


async def _enter(lock: InProcessLock, order: list[str]) -> None:
    async with lock.ahold():
        order.append("task in")


async def test_a_blocking_compact_on_the_loop_thread_during_acompact_raises() -> None:
    """A blocking compact() on the loop's thread while acompact() runs raises, never deadlocks."""
    started = asyncio.Event()

    async def slow_summary(prompt: str) -> str:
        started.set()
        await asyncio.sleep(0.2)
        return SUMMARY

    memory = CompactingChatMessageHistory(
        InMemoryChatMessageHistory(messages=chat(6)), slow_summary, CompactionOptions(keep_recent_tokens=100)
    )
    running = asyncio.ensure_future(memory.acompact())
    await started.wait()
    with pytest.raises(CompactionError, match="deadlock the loop"):
        memory.compact()
    assert await running is not None


async def test_a_cancelled_compaction_holds_the_lock_until_its_write_lands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancelled acompact() keeps the lock until its write lands: a later writer's message is never lost."""
    real = stores._file_replace
    writing, landed = threading.Event(), threading.Event()

    def slow_replace(store: Any, messages: Any) -> None:
        if writing.is_set():  # a later writer's append: on a fast disk, so it would land first
            real(store, messages)
            return
        writing.set()
        time.sleep(0.2)  # a slow disk: the write is still running when the caller gives up
        real(store, messages)
        landed.set()

    monkeypatch.setattr(stores, "_file_replace", slow_replace)
    path = tmp_path / "chat.json"
    inner = FileChatMessageHistory(str(path))
    inner.add_messages(chat(6))
    memory = CompactingChatMessageHistory(inner, lambda p: SUMMARY, CompactionOptions(keep_recent_tokens=100))
    task = asyncio.ensure_future(memory.acompact())
    await asyncio.to_thread(writing.wait, 2)  # the rewrite is in its worker thread now
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    other = CompactingChatMessageHistory(FileChatMessageHistory(str(path)), lambda p: SUMMARY, CompactionOptions())
    await other.aadd_messages([HumanMessage("IMPORTANT NEW MESSAGE", id="new")])
    await asyncio.to_thread(landed.wait, 2)  # the write that was in flight has landed
    assert "new" in [m.id for m in FileChatMessageHistory(str(path)).messages]


# ---------------------------------------------------------------------------
# Faults: the model
# ---------------------------------------------------------------------------


class Switch:
    """A summarizer that misbehaves until it is fixed."""

    def __init__(self, fault: Callable[[], str]) -> None:
        self.fault: Callable[[], str] | None = fault

    def __call__(self, prompt: str) -> str:
        if self.fault is not None:
            return self.fault()
        return "## Goal\n- recovered"


def boom() -> str:
    raise RuntimeError("model exploded")


def slow() -> str:
    time.sleep(1.0)
    return "## Goal\n- too late"


def fill(history: CompactingChatMessageHistory, written: list[BaseMessage]) -> None:
    """Add 60 turns, recording each before it is added (the last may raise)."""
    for i in range(60):
        written += turn(i)
        history.add_messages(turn(i))


async def afill(history: CompactingChatMessageHistory, written: list[BaseMessage]) -> None:
    for i in range(60):
        written += turn(i)
        await history.aadd_messages(turn(i))


FAULTS: dict[str, tuple[Callable[[], str], type[Exception]]] = {
    "raises": (boom, SummarizationError),
    "hangs": (slow, SummaryTimeoutError),
    "empty": (lambda: "   ", EmptySummaryError),
}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_model_fault_leaves_store_exactly_as_before(
    make_store: Callable[[str], BaseChatMessageHistory], fault: str
) -> None:
    behaviour, error = FAULTS[fault]
    model = Switch(behaviour)
    options = CompactionOptions(context_window=3000, reserve_tokens=1000, keep_recent_tokens=600, timeout=0.2)
    store = make_store(f"fault-{fault}")
    history = CompactingChatMessageHistory(store, model, options)
    written: list[BaseMessage] = []
    with pytest.raises(error):
        fill(history, written)
    # The add that triggered the failure was stored; nothing else changed.
    assert store.messages == written
    model.fault = None
    history.add_messages(turn(99))
    stored = store.messages
    assert is_summary_message(stored[0])
    assert "recovered" in str(stored[0].content)


def test_on_error_warn_keeps_growing_and_retries(
    make_store: Callable[[str], BaseChatMessageHistory], caplog: pytest.LogCaptureFixture
) -> None:
    model = Switch(boom)
    store = make_store("warn")
    history = CompactingChatMessageHistory(store, model, OPTIONS, on_error="warn")
    with caplog.at_level(logging.WARNING, logger="langchain_compaction"):
        for i in range(60):
            history.add_messages(turn(i))
    assert len(store.messages) == 120  # uncompacted, nothing lost
    assert "automatic compaction failed" in caplog.text
    assert "model exploded" in caplog.text
    model.fault = None
    history.add_messages(turn(60))
    assert is_summary_message(store.messages[0])
    # A manual compaction raises whatever on_error says.
    model.fault = boom
    with pytest.raises(SummarizationError):
        history.compact()


async def test_async_model_hang_times_out_and_leaves_store(
    async_sql: Callable[[str], SQLChatMessageHistory],
) -> None:
    async def hang(prompt: str) -> str:
        await asyncio.sleep(30)
        return "never"

    options = CompactionOptions(context_window=3000, reserve_tokens=1000, keep_recent_tokens=600, timeout=0.2)
    store = async_sql("hang")
    history = CompactingChatMessageHistory(store, hang, options)
    written: list[BaseMessage] = []
    start = time.monotonic()
    with pytest.raises(SummaryTimeoutError):
        await afill(history, written)
    assert time.monotonic() - start < 10
    assert await store.aget_messages() == written


def test_fallback_summarizer_is_used_and_reported() -> None:
    store = memory()
    history = CompactingChatMessageHistory(store, Switch(boom), OPTIONS, fallback=lambda p: "## Goal\n- fallback")
    for i in range(10):
        history.add_messages(turn(i))
    result = history.compact()
    assert result is not None
    assert result.fallback_used
    assert "fallback" in str(store.messages[0].content)


# ---------------------------------------------------------------------------
# Faults: the store
# ---------------------------------------------------------------------------


class FlakyMemory(InMemoryChatMessageHistory):
    """A real in-memory store whose Nth write (after arming) fails."""

    fail_at: int = -1
    fail_clear: bool = False
    writes: int = 0

    def add_message(self, message: BaseMessage) -> None:
        self.writes += 1
        if self.writes == self.fail_at:
            msg = "disk full"
            raise OSError(msg)
        super().add_message(message)

    def clear(self) -> None:
        if self.fail_clear:
            msg = "connection reset"
            raise ConnectionError(msg)
        super().clear()


def test_store_write_failing_halfway_is_repaired_on_next_call() -> None:
    store, archive = FlakyMemory(), memory()
    history = CompactingChatMessageHistory(store, Summaries(), OPTIONS, archive=archive)
    written = []
    for i in range(12):
        history.add_messages(turn(i))
        written += [f"q{i}{PAD}", f"a{i}{PAD}"]
    before = list(store.messages)
    assert not summaries_in(before)
    store.fail_at = store.writes + 3  # the rewrite's third write fails
    with pytest.raises(StoreError) as info:
        history.compact()
    assert info.value.operation == "add_messages"
    assert "disk full" in str(info.value)
    assert isinstance(info.value.__cause__, OSError)
    half = list(store.messages)
    assert len(half) == 2  # the store is half rewritten...
    # ...and the next call, from any wrapper of the session, finishes it.
    other = CompactingChatMessageHistory(store, Summaries(), OPTIONS, archive=archive)
    repaired = other.messages
    assert is_summary_message(repaired[0])
    assert store.messages == repaired
    assert_nothing_lost(written, repaired, archive.messages)
    assert other.repair() is False  # nothing pending any more


def test_store_failure_persisting_shows_full_history_then_repairs() -> None:
    store, archive = FlakyMemory(), memory()
    history = CompactingChatMessageHistory(store, Summaries(), OPTIONS, archive=archive)
    written = []
    for i in range(12):
        history.add_messages(turn(i))
        written += [f"q{i}{PAD}", f"a{i}{PAD}"]
    store.fail_at = store.writes + 1
    with pytest.raises(StoreError):
        history.compact()
    assert store.messages == []  # cleared, the first add failed
    # A writer appends while the rewrite is pending: it is kept after the target.
    store.fail_at = -1
    store.fail_clear = True  # and the repair's clear fails for now
    view = history.messages
    assert is_summary_message(view[0])
    assert_nothing_lost(written, view, archive.messages)
    history.add_messages([HumanMessage("while pending")])
    store.fail_clear = False
    assert history.repair() is True
    final = store.messages
    assert final[-1].content == "while pending"
    assert_nothing_lost([*written, "while pending"], final, archive.messages)


def test_store_clear_failing_leaves_store_and_retries() -> None:
    store, archive = FlakyMemory(), memory()
    history = CompactingChatMessageHistory(store, Summaries(), OPTIONS, archive=archive)
    for i in range(12):
        history.add_messages(turn(i))
    before = list(store.messages)
    store.fail_clear = True
    with pytest.raises(StoreError) as info:
        history.compact()
    assert info.value.operation == "clear"
    assert store.messages == before
    store.fail_clear = False
    assert history.repair() is True
    assert is_summary_message(store.messages[0])
    # The originals went to the archive once, though the rewrite ran twice.
    assert len(contents(archive.messages)) == len(set(contents(archive.messages)))


class FailingConverter(DefaultMessageConverter):
    """A real SQL converter that fails on its Nth row once armed."""

    def __init__(self, table_name: str) -> None:
        super().__init__(table_name)
        self.fail_at = -1
        self.rows = 0

    def to_sql_model(self, message: BaseMessage, session_id: str) -> Any:
        self.rows += 1
        if self.rows == self.fail_at:
            msg = "constraint violated"
            raise RuntimeError(msg)
        return super().to_sql_model(message, session_id)


def test_sql_rewrite_failing_halfway_rolls_back(tmp_path: Path) -> None:
    converter = FailingConverter("message_store")
    store = SQLChatMessageHistory(session_id="tx", connection=sqlite_url(tmp_path), custom_message_converter=converter)
    archive = SQLChatMessageHistory(session_id="tx-archive", connection=sqlite_url(tmp_path))
    history = CompactingChatMessageHistory(store, Summaries(), OPTIONS, archive=archive)
    written = []

    def add(i: int) -> None:
        history.add_messages(turn(i))
        written.extend([f"q{i}{PAD}", f"a{i}{PAD}"])

    for i in range(12):
        add(i)
    for attempt in range(2):  # the first compaction, then an update of its summary
        before = store.messages
        converter.fail_at = converter.rows + 3
        with pytest.raises(StoreError) as info:
            history.compact()
        assert info.value.operation == "rewrite"
        assert store.messages == before  # the transaction rolled back
        converter.fail_at = -1
        assert history.compact() is not None
        assert_nothing_lost(written, store.messages, archive.messages)
        for i in range(12 * (attempt + 1), 12 * (attempt + 2)):
            add(i)
    assert_nothing_lost(written, store.messages, archive.messages)


def test_user_append_failure_is_a_store_error() -> None:
    store = FlakyMemory()
    history = CompactingChatMessageHistory(store, Summaries(), OPTIONS)
    store.fail_at = 1
    with pytest.raises(StoreError) as info:
        history.add_messages([HumanMessage("lost?")])
    assert info.value.operation == "add_messages"
    assert "FlakyMemory" in str(info.value)


class SortedJsonStore(BaseChatMessageHistory):
    """Keeps messages as key-sorted JSON (as a JSONB column does); one write may commit, then fail."""

    def __init__(self) -> None:
        self.rows: list[str] = []
        self.fail_after_write = False

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        return messages_from_dict([json.loads(r) for r in self.rows])

    def add_messages(self, messages: Any) -> None:
        self.rows += [json.dumps(message_to_dict(m), sort_keys=True) for m in messages]
        if self.fail_after_write:
            self.fail_after_write = False
            raise TimeoutError("the write committed, but its reply timed out")

    def clear(self) -> None:
        self.rows = []
        self.fail_after_write = True


def test_a_store_that_reorders_keys_is_not_rewritten_twice() -> None:
    """A store that reorders JSON keys (as a JSONB column does) never gets a rewrite applied twice."""
    inner = SortedJsonStore()
    inner.rows = [json.dumps(message_to_dict(m), sort_keys=True) for m in chat(6)]
    memory = CompactingChatMessageHistory(inner, lambda p: SUMMARY, CompactionOptions(keep_recent_tokens=100))
    with pytest.raises(CompactionError):
        memory.compact()  # the rewrite landed, but the store reported a failure
    kinds = [m.type for m in memory.messages]  # the next call finishes (or recognizes) the rewrite
    assert kinds.count("system") == 1
    assert [m.type for m in inner.messages] == kinds


class BlippingStore(BaseChatMessageHistory):
    """No atomic rewrite (the journaled path); the add right after a clear fails once."""

    def __init__(self) -> None:
        self.messages: list[BaseMessage] = []
        self.session_id = "blipping-session"
        self.fail = False

    def add_messages(self, messages: Any) -> None:
        if self.fail:
            self.fail = False
            raise ConnectionError("a database blip")
        self.messages = [*self.messages, *messages]

    def clear(self) -> None:
        self.messages = []
        self.fail = True


def test_an_unfinished_rewrite_outlives_the_wrapper_that_started_it() -> None:
    """A rewrite that failed halfway is finished by the next wrapper over the store (one wrapper per request)."""
    store = BlippingStore()
    store.messages = chat(6)

    def request(action: Any) -> Any:
        # RunnableWithMessageHistory's pattern: a new wrapper per request.
        memory = CompactingChatMessageHistory(store, lambda p: SUMMARY, CompactionOptions(keep_recent_tokens=100))
        return action(memory)

    with pytest.raises(CompactionError):
        request(lambda m: m.compact())
    gc.collect()
    messages = request(lambda m: m.messages)
    # The pending rewrite survived the wrapper: the history is the compacted one, not lost.
    assert messages[0].type == "system"
    assert messages[0].additional_kwargs["langchain_compaction"]["kind"] == "summary"
    assert messages[-1].id == "a5"


# ---------------------------------------------------------------------------
# A real crash in the middle of a journaled rewrite
# ---------------------------------------------------------------------------

CRASH_SCRIPT = textwrap.dedent(
    """
    import os, sys, warnings
    warnings.simplefilter("ignore", DeprecationWarning)
    from langchain_community.chat_message_histories import FileChatMessageHistory
    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_compaction.history import CompactingChatMessageHistory
    from langchain_compaction.core.options import CompactionOptions

    class CrashingFile(FileChatMessageHistory):
        armed = False
        def add_message(self, message):
            mark = message.additional_kwargs.get("langchain_compaction")
            bridge = isinstance(mark, dict) and mark.get("kind") == "bridge"
            if self.armed and message.type == "human" and bridge == (dies_at == "bridge"):
                os._exit(17)  # the process dies mid-rewrite: no cleanup runs
            super().add_message(message)

    folder, dies_at = sys.argv[1], sys.argv[2]
    pad = " lorem ipsum dolor" * 6
    store = CrashingFile(os.path.join(folder, "chat.json"))
    history = CompactingChatMessageHistory(
        store,
        lambda prompt: "## Goal\\n- before the crash",
        CompactionOptions(keep_recent_tokens=600),
        archive=FileChatMessageHistory(os.path.join(folder, "archive.json")),
        journal=FileChatMessageHistory(os.path.join(folder, "journal.json")),
    )
    for i in range(12):
        history.add_messages([HumanMessage(f"q{i}{pad}"), AIMessage(f"a{i}{pad}")])
    store.armed = True
    history.compact()
    """
)


@pytest.mark.parametrize("dies_at", ["bridge", "original"])
def test_crash_mid_rewrite_is_repaired_from_the_journal(tmp_path: Path, dies_at: str) -> None:
    # The rewrite's target is [summary, bridge, a<k>, q<k+1>, ...]: the process
    # dies writing the bridge, or writing the first original user message.
    done = subprocess.run(
        [sys.executable, "-c", CRASH_SCRIPT, str(tmp_path), dies_at], capture_output=True, text=True, check=False
    )
    assert done.returncode == 17, done.stderr
    store = FileChatMessageHistory(str(tmp_path / "chat.json"))
    half = store.messages
    assert is_summary_message(half[0])  # cleared, then died a few writes in
    assert len(half) < 5
    if dies_at == "bridge":
        assert len(half) == 1
    else:
        assert_bridge(half[1])
        assert isinstance(half[2], AIMessage)
    journal = FileChatMessageHistory(str(tmp_path / "journal.json"))
    # The journal holds the whole target, bridge included.
    target = split_compacted(journal.messages[1:])
    assert target.bridge is not None
    assert isinstance(target.recent[0], AIMessage)
    archive = FileChatMessageHistory(str(tmp_path / "archive.json"))
    # A fresh process (this one) opens the session and finishes the rewrite.
    history = CompactingChatMessageHistory(store, Summaries(), OPTIONS, archive=archive, journal=journal)
    repaired = history.messages
    assert is_summary_message(repaired[0])
    assert "before the crash" in str(repaired[0].content)
    assert store.messages == repaired
    assert journal.messages == []
    assert repaired == [target.summary, target.bridge, *target.recent]
    written = [f"{k}{i}{PAD}" for i in range(12) for k in "qa"]
    assert_nothing_lost(written, repaired, archive.messages)


def test_the_trigger_counts_with_the_options_token_counter():
    # A counter that sees every message as 1,000 tokens makes two messages
    # exceed a 2,000-token window that the built-in estimate says they fit.
    from langchain_core.chat_history import InMemoryChatMessageHistory
    from langchain_core.messages import AIMessage, HumanMessage

    from langchain_compaction import CompactingChatMessageHistory, CompactionOptions

    def heavy(messages):
        return 1_000 * len(messages)

    options = CompactionOptions(context_window=2_000, reserve_tokens=500, keep_recent_tokens=900, token_counter=heavy)
    history = CompactingChatMessageHistory(InMemoryChatMessageHistory(), lambda p: "## Goal\n- x", options)
    history.add_messages([HumanMessage("a", id="1"), AIMessage("b", id="2"), HumanMessage("c", id="3")])
    kinds = [m.additional_kwargs.get("langchain_compaction", {}).get("kind") for m in history.messages]
    assert "summary" in kinds


def test_a_file_history_keeps_its_mode_and_its_symlink(tmp_path: Path) -> None:
    """The atomic replace writes where a symlink points, with the file's own mode (a private history stays private)."""
    import os
    import stat

    target = tmp_path / "private" / "chat.json"
    target.parent.mkdir()
    target.write_text("[]")
    target.chmod(0o600)
    link = tmp_path / "chat-link.json"
    link.symlink_to(target)
    memory = CompactingChatMessageHistory(FileChatMessageHistory(str(link)), lambda p: SUMMARY)
    memory.add_messages([HumanMessage("one", id="1"), AIMessage("two", id="2")])
    assert link.is_symlink(), "the link is still a link"
    assert [m["data"]["id"] for m in json.loads(target.read_text())] == ["1", "2"]
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o600


def test_a_file_lock_on_the_history_file_itself_is_refused(tmp_path: Path) -> None:
    """The file is replaced on every write: a lock on it would hold nothing, and writers would overwrite each other."""
    from langchain_compaction.history import FileLock

    path = tmp_path / "chat.json"
    store = FileChatMessageHistory(str(path))
    with pytest.raises(ConfigurationError, match="lock file of its own"):
        CompactingChatMessageHistory(store, lambda p: SUMMARY, lock=FileLock(path))
    CompactingChatMessageHistory(store, lambda p: SUMMARY, lock=FileLock(f"{path}.lock"))


def test_a_summary_merged_mid_history_is_put_in_front_and_compaction_goes_on() -> None:
    """A compacted session's messages added to a session with messages of its own: nothing lost, and it compacts."""
    from langchain_compaction import ExtractiveSummarizer
    from langchain_compaction.tokens import estimate_message_tokens

    options = CompactionOptions(context_window=2_000, reserve_tokens=500, keep_recent_tokens=300)

    def memory() -> CompactingChatMessageHistory:
        return CompactingChatMessageHistory(
            InMemoryChatMessageHistory(), ExtractiveSummarizer(), options, archive=InMemoryChatMessageHistory()
        )

    old = memory()
    for i in range(20):
        old.add_messages([HumanMessage(f"old question {i} " * 10, id=f"oq{i}"), AIMessage(f"old answer {i} " * 10)])
    assert is_summary_message(old.messages[0])
    new = memory()
    sent = [HumanMessage("Hi, I want to continue my earlier conversation.", id="hi"), AIMessage("Sure.", id="sure")]
    new.add_messages(sent)
    new.add_messages(old.messages)
    assert new.compact() is not None
    for i in range(30):
        turn = [HumanMessage(f"new question {i} " * 10, id=f"nq{i}"), AIMessage(f"new answer {i} " * 10, id=f"na{i}")]
        sent += turn
        new.add_messages(turn)
    assert estimate_message_tokens(new.messages) <= options.context_window
    held = {m.id for m in new.messages} | {m.id for m in new.archive.messages}
    assert not [m.id for m in sent if m.id not in held]


@pytest.mark.parametrize(
    ("arguments", "field"),
    [({"limit": 0}, "limit"), ({"limit": -1}, "limit"), ({"query": None}, "query"), ({"ids": "q3"}, "ids")],
)
def test_recall_names_a_wrong_argument(arguments: dict[str, Any], field: str) -> None:
    """recall(limit=0) returned one message, recall(None) an AttributeError, ids="q3" matched its characters."""
    memory = CompactingChatMessageHistory(
        InMemoryChatMessageHistory(), lambda p: SUMMARY, archive=InMemoryChatMessageHistory()
    )
    with pytest.raises(ConfigurationError, match=f"^{field}="):
        memory.recall(**arguments)
    memory.archive.add_messages([HumanMessage("hi", id="q3")])
    assert [p for p, _ in memory.recall(ids=(i for i in ["q3"]))] == [0]  # a generator is read once


def test_chat_memory_without_a_window_says_once_that_it_never_compacts_on_its_own(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """As the node does: a history that can only grow is said once, however many wrappers and sessions."""
    import langchain_compaction.history as history

    history._TOLD_NO_WINDOW.clear()  # (said once in a process: another test may have said it)
    with caplog.at_level(logging.WARNING, logger="langchain_compaction"):
        for _ in range(3):
            store = InMemoryChatMessageHistory()
            CompactingChatMessageHistory(store, lambda p: SUMMARY).add_messages([HumanMessage("hi")])
    said = [r.getMessage() for r in caplog.records if "context_window" in r.getMessage()]
    assert len(said) == 1, said


@pytest.mark.parametrize("asynchronous", [False, True])
async def test_a_sql_archive_is_counted_not_read_at_every_compaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, asynchronous: bool
) -> None:
    # Each compaction read the whole archive to count it, under the write
    # lock: a long session's adds grew 3x slower as the archive grew.
    from langchain_community.chat_message_histories import SQLChatMessageHistory

    reads: list[int] = []
    read = SQLChatMessageHistory.messages.fget  # type: ignore[attr-defined]
    aread = SQLChatMessageHistory.aget_messages

    def counted(self: Any) -> Any:
        messages = read(self)
        if self.session_id == "archive":
            reads.append(len(messages))
        return messages

    async def acounted(self: Any) -> Any:
        messages = await aread(self)
        if self.session_id == "archive":
            reads.append(len(messages))
        return messages

    monkeypatch.setattr(SQLChatMessageHistory, "messages", property(counted))
    monkeypatch.setattr(SQLChatMessageHistory, "aget_messages", acounted)
    if asynchronous:
        from sqlalchemy.ext.asyncio import create_async_engine

        engine = create_async_engine(f"sqlite+aiosqlite:///{tmp_path / 'chat.db'}")
        inner = SQLChatMessageHistory(session_id="s", connection=engine)
        archive = SQLChatMessageHistory(session_id="archive", connection=engine)
    else:
        url = f"sqlite:///{tmp_path / 'chat.db'}"
        inner = SQLChatMessageHistory(session_id="s", connection=url)
        archive = SQLChatMessageHistory(session_id="archive", connection=url)
    options = CompactionOptions(context_window=2_000, reserve_tokens=500, keep_recent_tokens=300)
    history = CompactingChatMessageHistory(inner, lambda prompt: SUMMARY, options, archive=archive)
    for i in range(60):
        turn = [HumanMessage(f"question {i} " * 10), AIMessage(f"answer {i} " * 10)]
        await history.aadd_messages(turn) if asynchronous else history.add_messages(turn)
    archived = (await archive.aget_messages()) if asynchronous else archive.messages
    assert len(archived) > 40, "little was archived: the test proves nothing"
    if asynchronous:
        await engine.dispose()
    assert reads == [len(archived)]  # the test's own read only
    assert len({m.content for m in archived}) == len(archived)  # each once


class _DownLock:
    """A cross-process lock whose service is down (PostgresAdvisoryLock with its database stopped)."""

    def hold(self) -> Any:
        raise ConnectionError("connection refused")

    def ahold(self) -> Any:
        raise ConnectionError("connection refused")


async def test_a_lock_that_cannot_be_taken_is_a_store_error_and_nothing_is_written() -> None:
    # Its own exception came out raw (psycopg.OperationalError), where a read gives StoreError.
    inner = InMemoryChatMessageHistory()
    history = CompactingChatMessageHistory(inner, lambda prompt: SUMMARY, CompactionOptions(), lock=_DownLock())
    with pytest.raises(StoreError, match="taking the lock _DownLock failed"):
        history.add_messages([HumanMessage("hello")])
    with pytest.raises(StoreError, match="no message was lost"):
        await history.aadd_messages([HumanMessage("hello")])
    assert inner.messages == []


def test_an_advisory_lock_takes_a_session_id_of_any_kind_chat_stores_take() -> None:
    # A UUID or an int session id failed with a bare AttributeError from deep in the key's hash.
    session = uuid.uuid4()
    by_uuid, by_int = PostgresAdvisoryLock(PG_URL, session), PostgresAdvisoryLock(PG_URL, 42)
    assert (by_uuid.name, by_uuid.key) == (str(session), PostgresAdvisoryLock(PG_URL, str(session)).key)
    assert (by_int.name, by_int.key) == ("42", advisory_key("42"))
    for name in (None, True, b"session", ["session"]):
        with pytest.raises(ConfigurationError, match="pass what to lock as a string") as info:
            PostgresAdvisoryLock(PG_URL, name)  # type: ignore[arg-type]
        assert info.value.field == "name"


def test_wrappers_over_one_sqlite_file_named_differently_share_one_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A relative and an absolute URL, a sync and an async driver: one file, one lock, one compaction at a time."""
    from langchain_community.chat_message_histories import SQLChatMessageHistory

    from langchain_compaction.history.session import session_state

    monkeypatch.chdir(tmp_path)
    named = [
        SQLChatMessageHistory("s", connection="sqlite:///chat.db"),
        SQLChatMessageHistory("s", connection=f"sqlite:///{tmp_path / 'chat.db'}"),
        SQLChatMessageHistory("s", connection="sqlite+aiosqlite:///chat.db", async_mode=True),
    ]
    assert len({id(session_state(store)) for store in named}) == 1
    other = SQLChatMessageHistory("s", connection=f"sqlite:///{tmp_path / 'other.db'}")
    assert session_state(other) is not session_state(named[0])


def test_sessions_sharing_one_archive_lose_nothing_and_are_told(caplog: pytest.LogCaptureFixture) -> None:
    """A ``RunnableWithMessageHistory`` factory passing every session one archive: the count was another's growth.

    The archive length each summary recorded said what a failed attempt had
    archived; another session's appends looked like it, and originals were
    skipped: in neither the store nor the archive.
    """
    from langchain_compaction import ExtractiveSummarizer
    from langchain_compaction.history import journal

    journal._SAID_SHARED.clear()
    archive = InMemoryChatMessageHistory()
    stores = {user: InMemoryChatMessageHistory() for user in ("alice", "bob")}
    options = CompactionOptions(context_window=2_000, reserve_tokens=500, keep_recent_tokens=300)
    with caplog.at_level(logging.WARNING, logger="langchain_compaction"):
        for i in range(40):
            for user, store in stores.items():
                history = CompactingChatMessageHistory(store, ExtractiveSummarizer(), options, archive=archive)
                history.add_messages([HumanMessage(f"{user} question {i} " * 8), AIMessage(f"{user} answer {i} " * 8)])
    archived = [str(m.content) for m in archive.messages]
    for user, store in stores.items():
        kept = [str(m.content) for m in store.messages if not is_summary_message(m)]
        said = [text for i in range(40) for text in (f"{user} question {i} " * 8, f"{user} answer {i} " * 8)]
        assert [t for t in said if t not in archived and t not in kept] == [], user
    assert sum("looks shared with another session" in r.getMessage() for r in caplog.records) == 1


def test_chat_memory_refuses_preparations_kept_in_a_store_it_does_not_have() -> None:
    from langchain_compaction import ExtractiveSummarizer
    from langchain_compaction.features import PrepareAhead

    with pytest.raises(ConfigurationError, match=r"PrepareAhead\(in_store=False\)"):
        CompactingChatMessageHistory(
            InMemoryChatMessageHistory(),
            ExtractiveSummarizer(),
            CompactionOptions(context_window=4_000),
            features=[PrepareAhead(in_store=True)],
        )


@pytest.mark.parametrize("session", [0, ""])
def test_a_falsy_session_id_is_one_session_like_any_other(tmp_path: Path, session: object) -> None:
    """Two stores of session 0 are one session: their wrappers share its lock (an id 0 fell back to the object)."""
    from langchain_community.chat_message_histories import SQLChatMessageHistory

    from langchain_compaction.history.stores import session_key

    url = f"sqlite:///{tmp_path}/chat.db"
    one, two = (SQLChatMessageHistory(session_id=session, connection=url) for _ in range(2))
    assert session_key(one) == session_key(two)
    with pytest.raises(ConfigurationError):
        CompactingChatMessageHistory(one, ExtractiveSummarizer(), CompactionOptions(context_window=4_000), archive=two)


def test_add_messages_takes_any_iterable_of_messages_as_every_chat_history_does() -> None:
    history = CompactingChatMessageHistory(
        InMemoryChatMessageHistory(), ExtractiveSummarizer(), CompactionOptions(context_window=4_000)
    )
    history.add_messages(m for m in [HumanMessage("hi", id="h"), AIMessage("hello", id="a")])
    history.add_messages({"x": HumanMessage("and then", id="h2")}.values())
    assert [m.id for m in history.messages] == ["h", "a", "h2"]
    with pytest.raises(InvalidMessagesError, match=r"pass \[message\]"):
        history.add_messages(HumanMessage("one"))  # type: ignore[arg-type]


class _RoleAndText(BaseChatMessageHistory):
    """A hand-written store that keeps each message's role and text only (no atomic rewrite: journaled)."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str]] = []

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        kinds = {"human": HumanMessage, "ai": AIMessage, "system": SystemMessage}
        return [kinds[role](content=text) for role, text in self.rows]

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        self.rows += [(m.type, str(m.content)) for m in messages]

    def clear(self) -> None:
        self.rows = []


def test_a_journal_that_drops_the_marker_is_refused_before_the_store_is_rewritten() -> None:
    """Its marker (in additional_kwargs) gone, the journal read as torn after a crash: the rewrite's target was lost."""
    inner = _RoleAndText()
    history = CompactingChatMessageHistory(
        inner, lambda p: "## Goal\n- chat", CompactionOptions(keep_recent_tokens=300), journal=_RoleAndText()
    )
    for i in range(12):
        history.add_messages([HumanMessage(f"question {i} " * 8), AIMessage(f"answer {i} " * 8)])
    before = list(inner.rows)
    with pytest.raises(ConfigurationError, match="does not give back what was written"):
        history.compact()
    assert inner.rows == before  # nothing rewritten
