"""The archive: compacted messages kept in a LangGraph store, exactly once, and recalled by the agent."""

from __future__ import annotations

import itertools
import logging
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Annotated, Any

import pytest
from archive_sessions import (
    FACT,
    OPTIONS,
    GraphSession,
    agent_middleware,
    agent_script,
    archived_messages,
    assert_each_message_once,
    graph_session,
    lookup,
    summarize,
    user_text,
)
from conftest import compaction_graph
from helpers_turns import (
    SMALL_WINDOW,
    SUMMARY,
    ToolCallingFake,
    archive_graph_with_recall,
    archive_items,
    archived,
    cfg,
    chat,
    graph_with,
    short_summary,
    words,
)
from langchain.agents import create_agent
from langchain_core.chat_history import BaseChatMessageHistory, InMemoryChatMessageHistory
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage, message_to_dict
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode
from langgraph.store.base import BaseStore, PutOp, SearchOp
from langgraph.store.memory import InMemoryStore
from typing_extensions import TypedDict

from langchain_compaction import CompactingChatMessageHistory, CompactionMiddleware, CompactionNode, CompactionOptions
from langchain_compaction._lc.conversation import Conversation
from langchain_compaction._lc.convert import SUMMARY_MARK, is_compaction_message, is_summary_message
from langchain_compaction.archive import Archive, recall_tool
from langchain_compaction.core.effects import drive
from langchain_compaction.core.layout import summary_body
from langchain_compaction.errors import CompactionError, ConfigurationError, StoreError
from langchain_compaction.features import Commit, Pins, default_features
from langchain_compaction.features.archive import archived_message
from langchain_compaction.graph import CompactionState, acompact_thread, compact_thread


def with_archive(archive: Archive | None = None) -> list[Any]:
    return [*default_features(), archive or Archive()]


class FailingStore(InMemoryStore):
    """An in-memory store whose writes fail (reads work): a database that went read-only."""

    def batch(self, ops: Any) -> list[Any]:
        ops = list(ops)
        if any(type(op).__name__ == "PutOp" for op in ops):
            raise ConnectionError("the store is read-only")
        return super().batch(ops)


def first_error(turn: Callable[[int], object], turns: int) -> Exception:
    """Run ``turn(0)``, ``turn(1)``, ... until one raises; what it raised."""
    for number in range(turns):
        try:
            turn(number)
        except Exception as error:
            return error
    raise AssertionError(f"none of {turns} turns failed")


def compactions(state: list[BaseMessage]) -> int:
    summary = next(m for m in state if is_summary_message(m))
    return int(summary.additional_kwargs["langchain_compaction"]["compaction"])


# -- the graph node ------------------------------------------------------------------


def test_a_200_turn_graph_session_keeps_every_message_once_and_recalls_turn_3() -> None:
    store = InMemoryStore()
    session = graph_session(store, InMemorySaver(), "user.42")
    for number in range(200):
        out = session.turn(number)
    state = out["messages"]
    assert compactions(state) >= 5
    archived = assert_each_message_once(session.sent, state, store, "user.42")
    assert archived > 300
    # The summary tells the agent the archive exists; the next summarizer never sees that line.
    summary = next(m for m in state if is_summary_message(m))
    assert "recall_messages" in str(summary.content)
    assert "recall_messages" not in summary_body(str(summary.content))
    # Turn 3, many compactions ago, comes back by keyword, by id and by position.
    by_word = session.recall(store, query=FACT)
    assert user_text("user.42", 3) in by_word
    assert "#6 [User] id=user.42-h3" in by_word
    assert user_text("user.42", 3) in session.recall(store, ids=["user.42-h3"])
    by_range = session.recall(store, start=6, end=7)
    assert by_range.index("#7 [Assistant]") < by_range.index("#6 [User]")  # newest first


def test_positions_continue_across_compactions_and_record_the_compaction() -> None:
    store = InMemoryStore()
    session = graph_session(store, InMemorySaver(), "t")
    for number in range(60):
        session.turn(number)
    items = archived_messages(store, "t")
    by_position = sorted(items, key=lambda item: item[1]["position"])
    # Position n is the n-th message ever sent.
    assert [m.id for _, _, m in by_position] == [m.id for m in session.sent[: len(by_position)]]
    numbers = [v["compaction"] for _, v, _ in by_position]
    assert numbers == sorted(numbers)
    assert numbers[0] == 1
    assert {v["role"] for _, v, _ in items} == {"human", "ai"}


async def test_the_async_path_archives_the_same_way() -> None:
    store = InMemoryStore()
    session = graph_session(store, InMemorySaver(), "async")
    for number in range(60):
        message = HumanMessage(user_text("async", number), id=f"async-h{number}")
        session.sent.append(message)
        out = await session.graph.ainvoke({"messages": [message]}, session.config)
        session.sent.append(out["messages"][-1])
    assert compactions(out["messages"]) >= 2
    assert_each_message_once(session.sent, out["messages"], store, "async")


def test_two_threads_never_read_each_others_archive() -> None:
    store = InMemoryStore()
    saver = InMemorySaver()
    mine = graph_session(store, saver, "alice")
    theirs = graph_session(store, saver, "bob")
    for number in range(50):
        mine.turn(number)
        theirs.turn(number)
    assert FACT in mine.recall(store, query=FACT)
    # Bob's tool, whatever it is asked, reads Bob's archive only.
    assert "No archived message matches" in theirs.recall(store, query="alice")
    assert "No archived message matches" in theirs.recall(store, ids=["alice-h3", "alice-h0"])
    everything = theirs.recall(store, start=0, end=10**9, limit=50)
    assert "bob turn" in everything
    assert "alice" not in everything


def test_a_store_that_fails_on_write_leaves_the_state_unchanged() -> None:
    store = FailingStore()
    session = graph_session(store, InMemorySaver(), "t")
    error = first_error(session.turn, 60)
    assert isinstance(error, StoreError)
    assert "archiving the compacted messages failed" in str(error)
    state = session.graph.get_state(session.config).values["messages"]
    assert not any(is_summary_message(m) for m in state)
    # The state holds every message it was sent (the failed turn's question too).
    assert [m.id for m in state] == [m.id for m in session.sent]


def test_on_error_warn_holds_back_without_paying_for_a_summary_and_never_passes_the_window(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A store that cannot be written: with on_error="warn" the compaction is
    # held back (no summary asked for) while the context fits the window with
    # half the reserve to spare, then made without archiving, and said so.
    store = FailingStore()
    calls: list[str] = []

    def counted(prompt: str) -> str:
        calls.append(prompt)
        return summarize(prompt)

    node = CompactionNode(counted, OPTIONS, result_key="compaction", features=with_archive(Archive(on_error="warn")))
    graph = compaction_graph(node, checkpointer=InMemorySaver(), store=store)
    config = {"configurable": {"thread_id": "t"}}
    made: dict[str, int] = {}  # summary id -> the summary calls its compaction made
    largest = 0
    with caplog.at_level(logging.WARNING, logger="langchain_compaction"):
        for number in range(200):
            state = graph.invoke({"messages": [HumanMessage(user_text("t", number), id=f"h{number}")]}, config)
            summary = next((m for m in state["messages"] if is_summary_message(m)), None)
            if summary is not None and summary.id not in made:
                made[str(summary.id)] = state["compaction"]["summarizer_calls"]
            largest = max(largest, node.context_tokens(graph.get_state(config).values["messages"]))
    assert len(made) >= 3
    assert len(calls) == sum(made.values())  # every summary call made was used
    assert largest <= OPTIONS.context_window
    assert "archiving failed" in caplog.text
    assert "kept only in the summary" in caplog.text


def _commit(removed: list[tuple[int, BaseMessage]], compaction: str = "c1", number: int = 1) -> Commit:
    return Commit(removed, {"lineage": [compaction], "compaction": number}, Conversation("t"), None)


def test_archiving_again_after_a_retry_writes_nothing_twice() -> None:
    store = InMemoryStore()
    before: list[BaseMessage] = [HumanMessage(f"m{i}", id=f"m{i}") for i in range(6)]
    commit = Commit(list(enumerate(before[:4])), {"lineage": ["c1"], "compaction": 1}, Conversation("t"), store)
    assert drive(Archive().commit(commit)) == {"archived": 4, "present": 0}
    assert drive(Archive().commit(commit)) == {"archived": 0, "present": 4}  # a retry, or a restarted process
    items = archived_messages(store, "t")
    assert sorted(m.id for _, _, m in items) == ["m0", "m1", "m2", "m3"]


def test_a_reused_id_never_overwrites_the_earlier_message() -> None:
    store = InMemoryStore()
    first = HumanMessage("the first message", id="same")
    later = HumanMessage("a different message under the same id", id="same")
    drive(Archive().commit(Commit([(0, first)], {"lineage": ["c1"], "compaction": 1}, Conversation("t"), store)))
    drive(Archive().commit(Commit([(9, later)], {"lineage": ["c1", "c2"], "compaction": 2}, Conversation("t"), store)))
    contents = sorted(str(m.content) for _, _, m in archived_messages(store, "t"))
    assert contents == ["a different message under the same id", "the first message"]


def test_retention_by_count_keeps_the_newest() -> None:
    store = InMemoryStore()
    session = graph_session(store, InMemorySaver(), "t", archive=Archive(max_messages=25))
    for number in range(80):
        session.turn(number)
    positions = sorted(int(v["position"]) for _, v, _ in archived_messages(store, "t"))
    assert 0 < len(positions) <= 25
    assert positions[-1] - positions[0] < 25


def test_without_a_store_the_archive_is_refused_with_the_fix() -> None:
    node = CompactionNode(summarize, OPTIONS, features=with_archive())
    graph = compaction_graph(node, checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "t"}}
    turns: list[int] = []

    def turn(number: int) -> None:
        turns.append(number)
        graph.invoke({"messages": [HumanMessage(user_text("t", number), id=f"h{number}")]}, config)

    error = first_error(turn, 80)
    assert isinstance(error, ConfigurationError)
    assert "compile(store=InMemoryStore())" in str(error)
    # Said on the first turn (a server attaches its store at run time, so
    # construction cannot tell), not at the first compaction, turns later.
    assert turns == [0]
    assert len(graph.get_state(config).values["messages"]) == len(turns)


def test_without_a_store_the_agent_is_told_before_its_model_is_called() -> None:
    """``create_agent`` with the middleware and an archive but no store: the first turn raises, no model call made."""
    model = GenericFakeChatModel(messages=iter([AIMessage("never asked")]))
    agent = create_agent(model, middleware=[CompactionMiddleware(summarize, OPTIONS, features=with_archive())])
    with pytest.raises(ConfigurationError, match="no LangGraph store"):
        agent.invoke({"messages": [HumanMessage("hello")]})
    assert next(model.messages, None) is not None  # its one answer was never taken


def test_without_a_thread_id_it_compacts_and_says_nothing_was_archived(caplog: pytest.LogCaptureFixture) -> None:
    store = InMemoryStore()
    node = CompactionNode(summarize, OPTIONS, features=with_archive())
    graph = compaction_graph(node, store=store)
    history = [HumanMessage(user_text("t", n), id=f"h{n}") for n in range(80)]
    with caplog.at_level(logging.WARNING, logger="langchain_compaction"):
        out = graph.invoke({"messages": history})
    assert is_summary_message(out["messages"][0])
    assert "no thread_id" in caplog.text
    assert store.search(("compaction_archive",)) == []


@pytest.mark.parametrize("value", ["yes", 1, Archive])
def test_features_are_checked(value: object) -> None:
    with pytest.raises(ConfigurationError, match="features"):
        CompactionNode(summarize, OPTIONS, features=[*default_features(), value])  # type: ignore[list-item]


def test_the_0_2_archive_argument_still_works_with_a_deprecation_warning() -> None:
    with pytest.warns(DeprecationWarning, match="Archive"):
        node = CompactionNode(summarize, OPTIONS, archive=True)
    assert node.archive == Archive()
    with pytest.warns(DeprecationWarning, match="Archive"), pytest.raises(ConfigurationError, match="archive"):
        CompactionNode(summarize, OPTIONS, archive="yes")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"prefix": "a.b"}, "prefix"), ({"max_messages": 0}, "max_messages"), ({"ttl_minutes": -1}, "ttl_minutes")],
)
def test_archive_settings_are_checked(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigurationError, match=field):
        Archive(**kwargs)


# -- the agent middleware ---------------------------------------------------------------


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_200_turn_agent_session_recalls_turn_3_through_its_own_tool(mode: str) -> None:
    store = InMemoryStore()
    turns = 200
    model = ToolCallingFake(messages=agent_script(turns))
    middleware = agent_middleware()
    assert [t.name for t in middleware.tools] == ["recall_messages"]
    agent = create_agent(model, tools=[lookup], middleware=[middleware], checkpointer=InMemorySaver(), store=store)
    config = {"configurable": {"thread_id": "agent.1"}}
    # Every message the conversation ever held: each question, and what each
    # turn added (tool calls, their results, answers), as the state showed it.
    seen: dict[str, BaseMessage] = {}
    for number in range(turns + 1):
        question = HumanMessage(user_text("agent.1", number), id=f"q{number}")
        seen[f"q{number}"] = question
        payload = {"messages": [question]}
        out = agent.invoke(payload, config) if mode == "sync" else await agent.ainvoke(payload, config)
        state = out["messages"]
        for message in state:
            if message.id is not None and not is_compaction_message(message):
                seen.setdefault(message.id, message)
    assert compactions(state) >= 5
    assert_each_message_once(list(seen.values()), state, store, "agent.1")
    roles = {v["role"] for _, v, _ in archived_messages(store, "agent.1")}
    assert roles == {"human", "ai", "tool"}
    recalled = next(m for m in reversed(state) if isinstance(m, ToolMessage) and m.name == "recall_messages")
    assert user_text("agent.1", 3) in str(recalled.content)
    assert state[-1].content == f"The booking code was {FACT}."


class UnreadableStore(InMemoryStore):
    """An in-memory store whose searches fail once told to: a database gone away between two turns."""

    fails = False

    def _searched(self, ops: Any) -> list[Any]:
        ops = list(ops)
        if self.fails and any(isinstance(op, SearchOp) for op in ops):
            raise OSError("store unreachable")
        return ops

    def batch(self, ops: Any) -> list[Any]:
        return super().batch(self._searched(ops))

    async def abatch(self, ops: Any) -> list[Any]:
        return await super().abatch(self._searched(ops))


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_recall_whose_store_fails_tells_the_model_and_the_turn_goes_on(
    mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="langchain_compaction")
    store = UnreadableStore()
    call = {"name": "recall_messages", "args": {"query": FACT}, "id": "recall-1", "type": "tool_call"}
    model = ToolCallingFake(messages=iter([AIMessage("", tool_calls=[call]), AIMessage("I could not look it up.")]))
    agent = create_agent(model, middleware=[agent_middleware()], checkpointer=InMemorySaver(), store=store)
    config = {"configurable": {"thread_id": "agent.1"}}
    store.fails = True
    payload = {"messages": [HumanMessage("What was my booking code?")]}
    # (A store's error used to come out of the ToolNode and end the user's turn.)
    out = agent.invoke(payload, config) if mode == "sync" else await agent.ainvoke(payload, config)
    answer = out["messages"][-2]
    assert isinstance(answer, ToolMessage)
    assert answer.status == "error"
    assert "could not be read" in str(answer.content)
    assert "OSError" in str(answer.content)
    assert out["messages"][-1].content == "I could not look it up."
    said = [r.getMessage() for r in caplog.records if "recall tool could not read" in r.getMessage()]
    assert len(said) == 1
    assert "store unreachable" in said[0]
    # The node's tool (through a ToolNode) answers the same.
    session = graph_session(store, InMemorySaver(), "t")
    store.fails = False
    for number in range(40):
        session.turn(number)
    store.fails = True
    assert "could not be read" in session.recall(store, query=FACT)


class UnreadableHistory(BaseChatMessageHistory):
    """A chat history whose reads fail once told to."""

    def __init__(self) -> None:
        self.kept: list[BaseMessage] = []
        self.fails = False

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        if self.fails:
            raise OSError("history unreachable")
        return list(self.kept)

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        self.kept.extend(messages)

    def clear(self) -> None:
        self.kept = []


def test_a_recall_over_chat_memory_whose_archive_fails_tells_the_model() -> None:
    archive = UnreadableHistory()
    memory = CompactingChatMessageHistory(InMemoryChatMessageHistory(), summarize, OPTIONS, archive=archive)
    for number in range(60):
        memory.add_messages([HumanMessage(user_text("s", number), id=f"h{number}"), AIMessage(f"ok {number}")])
    assert archive.kept
    archive.fails = True
    with pytest.raises(StoreError, match="history unreachable"):
        memory.recall(FACT)  # chat memory's own look-up raises, as documented
    message = recall_tool(history=memory).invoke(
        {"type": "tool_call", "name": "recall_messages", "args": {"query": FACT}, "id": "r1"}
    )
    assert isinstance(message, ToolMessage)
    assert message.status == "error"
    assert "could not be read" in str(message.content)


# -- chat memory ---------------------------------------------------------------------


def test_chat_memory_recalls_from_its_archive_the_same_way() -> None:
    archive = InMemoryChatMessageHistory()
    memory = CompactingChatMessageHistory(InMemoryChatMessageHistory(), summarize, OPTIONS, archive=archive)
    for number in range(60):
        memory.add_messages([HumanMessage(user_text("s", number), id=f"h{number}"), AIMessage(f"ok {number}")])
    found = memory.recall(FACT)
    assert [(p, m.id) for p, m in found] == [(6, "h3")]
    assert [m.id for _, m in memory.recall(start=0, end=1)] == [archive.messages[1].id, "h0"]
    tool = recall_tool(history=memory)
    answer = tool.invoke({"query": FACT})
    assert user_text("s", 3) in answer
    assert "No archived message matches" in tool.invoke({"query": "nothing like this"})


async def test_chat_memory_recall_async() -> None:
    memory = CompactingChatMessageHistory(
        InMemoryChatMessageHistory(), summarize, OPTIONS, archive=InMemoryChatMessageHistory()
    )
    for number in range(60):
        await memory.aadd_messages([HumanMessage(user_text("s", number), id=f"h{number}"), AIMessage("ok")])
    assert [m.id for _, m in await memory.arecall(FACT)] == ["h3"]
    assert user_text("s", 3) in await recall_tool(history=memory).ainvoke({"query": FACT})


def test_chat_memory_without_an_archive_says_how_to_get_one() -> None:
    memory = CompactingChatMessageHistory(InMemoryChatMessageHistory(), summarize, OPTIONS)
    with pytest.raises(ConfigurationError, match="archive="):
        memory.recall(FACT)


def test_what_the_tool_returns_goes_through_redact() -> None:
    memory = CompactingChatMessageHistory(
        InMemoryChatMessageHistory(), summarize, OPTIONS, archive=InMemoryChatMessageHistory()
    )
    for number in range(60):
        memory.add_messages([HumanMessage(user_text("s", number), id=f"h{number}"), AIMessage("ok")])
    tool = recall_tool(history=memory, redact=lambda text: text.replace(FACT, "[code]"))
    answer = tool.invoke({"ids": ["h3"]})
    assert "[code]" in answer
    assert FACT not in answer


def test_recall_ranks_whole_word_matches_before_parts_of_words() -> None:
    from langchain_compaction.core.recall import Archived, Lookup, select
    from langchain_compaction.core.types import Message, Part

    said = [
        Archived(n, f"m{n}", Message("user", (Part("text", f"Please look into ticket T-{n} and the booking"),)))
        for n in range(1, 40)
    ]
    # T-1 is older than T-10 ... T-19, which hold "T-1" inside a longer word: it comes first.
    assert [a.position for a in select(said, Lookup(query="ticket T-1", limit=3))] == [1, 19, 18]
    # A part of a word still matches ("book" in "booking"), newest first.
    assert [a.position for a in select(said, Lookup(query="book", limit=2))] == [39, 38]
    assert [a.position for a in select(said, Lookup(query="T-3", limit=5))] == [3, 39, 38, 37, 36]


@pytest.mark.parametrize("query", ["booking code?", "JG7FMM,", "(JG7FMM)", "booking code: JG7FMM", "'JG7FMM'"])
def test_recall_ignores_the_punctuation_a_model_writes_around_its_words(query: str) -> None:
    # "booking code?" found nothing in "My booking code is JG7FMM.": each word was matched with its mark.
    from langchain_compaction.core.recall import Archived, Lookup, select
    from langchain_compaction.core.types import Message, Part

    said = [Archived(0, "m0", Message("user", (Part("text", "My booking code is JG7FMM."),)))]
    said += [Archived(n, f"m{n}", Message("user", (Part("text", f"note {n}"),))) for n in range(1, 5)]
    assert [a.position for a in select(said, Lookup(query=query))] == [0]


def test_a_long_query_reads_each_archived_message_once() -> None:
    # Each message was folded again for every word of the query (a 150-word query over 3,000 messages: 5 s).
    from langchain_compaction.core import recall
    from langchain_compaction.core.recall import Archived, Lookup, select
    from langchain_compaction.core.types import Message, Part

    said = [Archived(n, f"m{n}", Message("user", (Part("text", f"note {n} about the export"),))) for n in range(300)]
    folded = []
    searched = recall._searched
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(recall, "_searched", lambda item: folded.append(item) or searched(item))
        select(said, Lookup(query=" ".join(["note", "about", "the", "export"] * 30)))
    assert len(folded) == len(said)


def test_recall_of_long_messages_shows_the_whole_word_match_though_all_matches_fit_the_limit() -> None:
    """Eight long messages match "T-1": all within the limit of ten, not within 4,000 characters.

    Whole-word matches came first only when more matched than the limit, so
    the rendering cut the old "Ticket T-1" for the newer T-13 ... T-16.
    """
    from langchain_compaction.core.recall import Archived, Lookup, render, select
    from langchain_compaction.core.types import Message, Part

    said = [
        Archived(n, f"m{n}", Message("user", (Part("text", f"Ticket T-{n}: " + "the printer jams again. " * 40),)))
        for n in (1, *range(10, 17))
    ]
    shown = render(select(said, Lookup(query="T-1")), max_chars=4_000)
    assert "Ticket T-1:" in shown
    assert "more match(es) left out for size" in shown


# -- the command line ------------------------------------------------------------------


def test_the_command_line_lists_and_prints_a_threads_archive_from_a_sqlite_store(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    import io
    import json

    from langgraph.store.sqlite import SqliteStore

    from langchain_compaction.cli import main

    path = tmp_path / "store.db"
    with SqliteStore.from_conn_string(str(path)) as store:
        store.setup()
        session = graph_session(store, InMemorySaver(), "user.42")
        for number in range(40):
            session.turn(number)
        stored = len(archived_messages(store, "user.42"))
    assert stored > 0
    out = io.StringIO()
    assert main(["archive", f"sqlite:///{path}", "user.42"], out) == 0
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("#0 human (compaction 1) user.42-h0: user.42 turn 0")
    assert lines[-1].startswith(f"{stored} archived message(s)")
    out = io.StringIO()
    assert main(["archive", str(path), "user.42", "--show", "6"], out) == 0
    assert user_text("user.42", 3) in out.getvalue()
    out = io.StringIO()
    assert main(["archive", str(path), "user.42", "--json"], out) == 0
    rows = json.loads(out.getvalue())
    assert [r["position"] for r in rows] == list(range(stored))
    out = io.StringIO()
    assert main(["archive", str(path), "someone-else"], out) == 0
    assert "no archived messages" in out.getvalue()


@pytest.mark.parametrize(
    ("url", "says"),
    [("redis://localhost", "pass postgresql://"), ("sqlite:////nowhere/store.db", "no SQLite file")],
)
def test_the_command_line_says_what_is_wrong_with_a_store_url(
    url: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from langchain_compaction.cli import main

    assert main(["archive", url, "t"]) == 2
    assert says in capsys.readouterr().err


def test_the_command_line_refuses_a_file_that_is_no_store_and_writes_nothing_into_it(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    import sqlite3
    from contextlib import closing

    from langchain_compaction.cli import main

    text = tmp_path / "notes.db"
    text.write_text("this is not a database\n" * 10)
    checkpoints = tmp_path / "checkpoints.db"
    with closing(sqlite3.connect(checkpoints)) as db:
        db.execute("create table checkpoints (id text)")
        db.commit()
    tables = "select name from sqlite_master where type = 'table'"
    for path, says in ((text, "is not a SQLite database"), (checkpoints, "holds no LangGraph store")):
        assert main(["archive", f"sqlite:///{path}", "t"]) == 2
        err = capsys.readouterr().err
        assert says in err
        assert "Traceback" not in err
    with closing(sqlite3.connect(checkpoints)) as db:
        assert [row[0] for row in db.execute(tables)] == ["checkpoints"]  # no store tables added to it
    # A PostgreSQL server that is not there: one line, not a traceback.
    assert main(["archive", "postgresql://nobody@127.0.0.1:1/nodb", "t"]) == 2
    assert "connection" in capsys.readouterr().err


def _meaning(texts: list[str]) -> list[list[float]]:
    """A tiny embedding: one dimension per topic, so "reservation" and "booking" land together."""
    topics = (("booking", "reservation", "flight"), ("weather", "rain"), ("report", "paragraph", "figures"))
    return [[float(any(word in text.lower() for word in topic)) + 0.01 for topic in topics] for text in texts]


def test_with_an_indexed_store_the_tool_also_finds_messages_by_meaning() -> None:
    store = InMemoryStore(index={"dims": 3, "embed": _meaning, "fields": ["text"]})
    session = graph_session(store, InMemorySaver(), "t", archive=Archive(index=True))
    for number in range(60):
        session.turn(number)
    # No archived message holds the word, so keyword matching alone finds nothing ...
    plain = graph_session(InMemoryStore(), InMemorySaver(), "t")
    for number in range(60):
        plain.turn(number)
    assert "No archived message matches" in plain.recall(plain.graph.store, query="reservation")
    # ... while the index ranks the booking message close to it.
    found = session.recall(store, query="reservation", limit=3)
    assert "The booking code is JG7FMM" in found
    assert all(item.value.get("text") for item in store.search(("compaction_archive", "t"), limit=5))


class CountingStore(InMemoryStore):
    """An in-memory store that keeps the texts to embed of each batch of writes it is sent."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.writes: list[list[str]] = []

    def batch(self, ops: Any) -> list[Any]:
        ops = list(ops)
        puts = [op for op in ops if isinstance(op, PutOp) and op.value is not None]
        if puts:
            self.writes.append([str(op.value.get("text")) for op in puts if op.index is not False])
        return super().batch(ops)


def go_on_session(store: BaseStore) -> Any:
    """60 turns with an indexed archive on ``store``, every other one the user saying "go on" (one text, many times)."""
    session = graph_session(store, InMemorySaver(), "t", archive=Archive(index=True))
    for number in range(60):
        if number % 2 and number != 3:
            message = HumanMessage("go on", id=f"t-h{number}")
            session.sent += [message, session.graph.invoke({"messages": [message]}, session.config)["messages"][-1]]
        else:
            session.turn(number)
    return session


def test_an_indexed_archive_files_messages_with_the_same_text() -> None:
    # InMemoryStore embeds each distinct text of a batch once but wants a vector per item: a user who
    # said "go on" twice made every compaction fail ("Number of embeddings ... does not match").
    store = CountingStore(index={"dims": 3, "embed": _meaning, "fields": ["text"]})
    session = go_on_session(store)
    state = session.graph.get_state(session.config).values["messages"]
    assert_each_message_once(session.sent, state, store, "t")
    assert sum(1 for _, _, m in archived_messages(store, "t") if m.content == "go on") >= 5
    assert all(len(texts) == len(set(texts)) for texts in store.writes)
    assert "The booking code is JG7FMM" in session.recall(store, query="reservation", limit=3)
    # All texts different: each compaction writes its messages in one batch, as before.
    distinct = CountingStore(index={"dims": 3, "embed": _meaning, "fields": ["text"]})
    plain = graph_session(distinct, InMemorySaver(), "t", archive=Archive(index=True))
    for number in range(60):
        plain.turn(number)
    compactions = {v["compaction"] for _, v, _ in archived_messages(distinct, "t")}
    assert len(distinct.writes) == len(compactions) > 1


class RelayStore(BaseStore):
    """Another kind of store (not an ``InMemoryStore``): keeps each batch of writes it is sent, then passes it on."""

    def __init__(self) -> None:
        self.inner = InMemoryStore()
        self.writes: list[list[str]] = []

    def batch(self, ops: Any) -> list[Any]:
        ops = list(ops)
        puts = [op for op in ops if isinstance(op, PutOp) and op.value is not None and op.index is not False]
        if puts:
            self.writes.append([str(op.value.get("text")) for op in puts])
        return self.inner.batch(ops)

    async def abatch(self, ops: Any) -> list[Any]:
        return self.batch(ops)


def test_another_store_gets_each_compactions_messages_in_one_batch_repeated_texts_and_all() -> None:
    # Only LangGraph's InMemoryStore needs repeated texts apart: another store takes the batch whole
    # (a short tool output repeated hundreds of times would be as many round trips).
    store = RelayStore()
    go_on_session(store)
    assert any(len(texts) != len(set(texts)) for texts in store.writes)
    compactions = {v["compaction"] for _, v, _ in archived_messages(store.inner, "t")}
    assert len(store.writes) == len(compactions)


def test_an_indexed_archive_over_a_store_without_an_index_says_so_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="langchain_compaction")
    plain = graph_session(InMemoryStore(), InMemorySaver(), "t", archive=Archive(index=True))
    for number in range(60):
        plain.turn(number)
    said = [r for r in caplog.records if "without an index config" in r.getMessage()]
    assert len(said) == 1
    assert "No archived message matches" in plain.recall(plain.graph.store, query="reservation")
    caplog.clear()
    del plain
    # Another store, made after the first is gone (it may take the same address): said for it too.
    for _ in range(3):
        caplog.clear()
        again = graph_session(InMemoryStore(), InMemorySaver(), "t", archive=Archive(index=True))
        for number in range(60):
            again.turn(number)
        assert len([r for r in caplog.records if "without an index config" in r.getMessage()]) == 1
        del again
    caplog.clear()
    store = InMemoryStore(index={"dims": 3, "embed": _meaning, "fields": ["text"]})
    indexed = graph_session(store, InMemorySaver(), "t", archive=Archive(index=True))
    for number in range(60):
        indexed.turn(number)
    assert not [r for r in caplog.records if "without an index config" in r.getMessage()]


def test_a_recall_that_matches_more_than_fits_stays_within_its_characters() -> None:
    """The line that counts what was left out fits in the 4,000 characters too."""
    session = graph_session(InMemoryStore(), InMemorySaver(), "t")
    for number in range(60):
        session.turn(number)
    found = session.recall(session.graph.store, query="figures", limit=50)
    assert "left out for size" in found
    assert len(found) <= 4_000


def test_positions_stay_true_when_a_compaction_keeps_a_pinned_exchange() -> None:
    """The kept part has a gap (the pinned todo list, then the recent messages): positions must follow the truth."""
    from archive_sessions import GraphSession

    store = InMemoryStore()
    node = CompactionNode(summarize, OPTIONS, result_key="compaction", features=with_archive())
    turns = [0]

    def agent(state: CompactionState) -> dict[str, Any]:
        turns[0] += 1
        if turns[0] == 2:
            call = {"name": "write_todos", "args": {"todos": ["report"]}, "id": "todo", "type": "tool_call"}
            return {"messages": [AIMessage("", tool_calls=[call]), ToolMessage("Updated todos", tool_call_id="todo")]}
        return {"messages": [AIMessage(f"Here is paragraph {turns[0]}. " + "The figures rose again. " * 5)]}

    session = GraphSession(compaction_graph(node, agent, checkpointer=InMemorySaver(), store=store), node, "t")
    sent: list[BaseMessage] = []
    for number in range(120):
        message = HumanMessage(user_text("t", number), id=f"t-h{number}")
        out = session.graph.invoke({"messages": [message]}, session.config)
        sent.append(message)
        sent += [m for m in out["messages"] if m.id not in {s.id for s in sent} and not is_compaction_message(m)]
    assert compactions(out["messages"]) >= 3
    assert any(m.id == "todo" or getattr(m, "tool_call_id", None) == "todo" for m in out["messages"])
    items = sorted(archived_messages(store, "t"), key=lambda item: item[1]["position"])
    truth = {m.id: i for i, m in enumerate(sent)}
    assert [int(v["position"]) for _, v, _ in items] == [truth[m.id] for _, _, m in items]


def test_the_tool_matches_on_redacted_text_and_needs_an_archive() -> None:
    memory = CompactingChatMessageHistory(
        InMemoryChatMessageHistory(), summarize, OPTIONS, archive=InMemoryChatMessageHistory()
    )
    for number in range(60):
        memory.add_messages([HumanMessage(user_text("s", number), id=f"h{number}"), AIMessage("ok")])
    tool = recall_tool(history=memory, redact=lambda text: text.replace(FACT, "[code]"))
    assert "No archived message matches" in tool.invoke({"query": FACT})  # no yes/no test for a secret
    with pytest.raises(ConfigurationError, match="history"):
        recall_tool(history=CompactingChatMessageHistory(InMemoryChatMessageHistory(), summarize, OPTIONS))


# -- compact_thread with the archive -----------------------------------------------------------------


def _archived_graph() -> tuple[Any, Any, dict[str, Any]]:
    store = InMemoryStore()
    node = CompactionNode(short_summary, SMALL_WINDOW, features=archived())
    graph = graph_with(node, store=store)
    config = cfg("manual-archive")
    for turn in range(6):
        graph.invoke({"messages": [HumanMessage(words(f"q{turn}"))]}, config)
    return graph, store, config


def test_compact_thread_with_archive_uses_the_graphs_store() -> None:
    """compact_thread on a graph with Archive() archives into the graph's store."""
    graph, store, config = _archived_graph()
    result = compact_thread(graph, config)
    assert result is not None
    assert result.messages_removed > 0
    assert len(archive_items(store, "manual-archive")) == result.messages_removed


async def test_acompact_thread_with_archive_uses_the_graphs_store() -> None:
    """acompact_thread on a graph with Archive() archives into the graph's store."""
    graph, store, config = _archived_graph()
    result = await acompact_thread(graph, config)
    assert result is not None
    assert result.messages_removed > 0
    assert len(archive_items(store, "manual-archive")) == result.messages_removed


def test_compact_thread_refuses_a_graph_whose_compaction_runs_inside_a_subgraph() -> None:
    """A subgraph's node with an archive: compact_thread refuses a stand-in and says why.

    (A stand-in would compact without its archive: what it removed would be nowhere.)
    """
    store = InMemoryStore()
    inner = StateGraph(CompactionState)
    inner.add_node("compact", CompactionNode(summarize, OPTIONS, features=[*default_features(), Archive()]))
    inner.add_edge(START, "compact")
    outer = StateGraph(CompactionState)
    outer.add_node("sub", inner.compile())
    outer.add_edge(START, "sub")
    parent = outer.compile(checkpointer=InMemorySaver(), store=store)
    config = cfg("inside-sub")
    parent.invoke({"messages": [HumanMessage(words("q0"), id="q0")]}, config)
    before = parent.get_state(config).values["messages"]
    for model in (None, summarize):
        with pytest.raises(ConfigurationError, match=r"compaction runs inside 'sub > compact' .*, with an Archive"):
            compact_thread(parent, config, instructions="keep the questions", model=model)
    assert parent.get_state(config).values["messages"] == before  # nothing removed


@pytest.mark.parametrize("archive", [True, False])
def test_compact_thread_on_an_agent_compacts_as_its_middleware_would(archive: bool) -> None:
    """``create_agent`` with ``CompactionMiddleware``: compact_thread needs no model, and archives with its Archive.

    It refused an agent whose middleware archives (a stand-in would have
    archived nothing) and asked any other for ``model=``. The stand-in is
    the middleware's summarizer, options and features: what it removes is
    archived where the agent's own compactions are, and the agent goes on.
    """
    asked: list[str] = []

    def summarizer(prompt: str) -> str:
        asked.append(prompt)
        return SUMMARY

    store = InMemoryStore()
    features = [*default_features(), Archive()] if archive else None
    agent = create_agent(
        ToolCallingFake(messages=iter([AIMessage(words(f"answer {n}")) for n in range(40)])),
        middleware=[CompactionMiddleware(summarizer, OPTIONS, features=features)],
        checkpointer=InMemorySaver(),
        store=store,
    )
    config = cfg(f"agent-{archive}")
    agent.invoke({"messages": [HumanMessage(words("q0"), id="q0")]}, config)
    agent.invoke({"messages": [HumanMessage(words("q1"), id="q1")]}, config)
    result = compact_thread(agent, config, instructions="keep the questions")
    assert result is not None
    assert result.messages_removed > 0
    assert len(asked) == 1
    assert "keep the questions" in asked[0]
    state = agent.get_state(config)
    assert not state.next  # left idle
    assert any(is_summary_message(m) for m in state.values["messages"])
    manual = {item.namespace for item in archive_items(store, f"agent-{archive}")}
    assert len(archive_items(store, f"agent-{archive}")) == (result.messages_removed if archive else 0)
    turns = 2
    while len(asked) < 2 and turns < 30:  # the agent goes on until it compacts on its own
        agent.invoke({"messages": [HumanMessage(words(f"q{turns}"), id=f"q{turns}")]}, config)
        turns += 1
    assert len(asked) >= 2
    if archive:
        # The agent's own compaction archives where the manual one did.
        assert {item.namespace for item in archive_items(store, f"agent-{archive}")} == manual
        assert len(manual) == 1


# -- time travel: a forked thread --------------------------------------------------------------------


def _time_travel_session() -> tuple[Any, Any, dict[str, Any], int]:
    store = InMemoryStore()
    graph, _ = archive_graph_with_recall(store)
    config = cfg("travel")
    compaction_turns, previous = [], 0
    for turn in range(30):
        state = graph.invoke({"messages": [HumanMessage(words(f"old{turn}", 120), id=f"old{turn}")]}, config)
        if len(state["messages"]) < previous:
            compaction_turns.append(turn)
        previous = len(state["messages"])
    assert len(compaction_turns) >= 2, compaction_turns
    # Fork: the finished turn just before the last compactions (the second to last one).
    fork_turn = compaction_turns[-2] - 1
    snapshot = next(
        s
        for s in graph.get_state_history(config)
        if not s.next and len(s.values["messages"]) > 1 and s.values["messages"][-2].id == f"old{fork_turn}"
    )
    branch = snapshot.config
    for turn in range(20):
        graph.invoke({"messages": [HumanMessage(words(f"new{turn}", 120), id=f"new{turn}")]}, branch)
        branch = graph.get_state(config).config  # the head of the new branch
    return graph, store, config, fork_turn


def _timeline_items(store: Any, messages: Sequence[BaseMessage]) -> list[Any]:
    """The thread's archived items that belong to the timeline of ``messages``' summary."""
    summary = next(m for m in messages if is_summary_message(m))
    lineage = set(summary.additional_kwargs[SUMMARY_MARK]["lineage"])
    return [i for i in archive_items(store, "travel") if i.value["lineage"] in lineage]


def test_forked_thread_archives_each_message_once_at_one_position() -> None:
    """After a fork, the current timeline holds each message once, each at its own position."""
    graph, store, config, fork_turn = _time_travel_session()
    state = graph.get_state(config).values["messages"]
    items = _timeline_items(store, state)
    ids = Counter(i.value["message"]["data"]["id"] for i in items)
    assert not [k for k, n in ids.items() if n > 1], "a message id is archived more than once in this timeline"
    positions = Counter(i.value["position"] for i in items)
    doubled = sorted(p for p, n in positions.items() if n > 1)
    assert not doubled, f"{len(doubled)} positions of this timeline hold two messages, e.g. {doubled[:3]}"
    # Each message of the branch is in the state or in its timeline's archive, exactly once;
    # none of the abandoned branch is in either.
    where = Counter(m.id for m in state if not is_compaction_message(m))
    where.update(ids)
    branch = [f"old{t}" for t in range(fork_turn + 1)] + [f"new{t}" for t in range(20)]
    assert {label: where[label] for label in branch if where[label] != 1} == {}
    abandoned = [f"old{t}" for t in range(fork_turn + 1, 30)]
    assert not [label for label in abandoned if where[label]], "the abandoned branch is in this timeline"


def test_recall_in_the_new_branch_does_not_return_the_abandoned_branch() -> None:
    """Recall in the new branch returns its own messages, never one only the abandoned branch had."""
    graph, _, config, fork_turn = _time_travel_session()
    state = graph.invoke({"messages": [HumanMessage("RECALL old")]}, config)
    answer = state["messages"][-1]
    assert isinstance(answer, ToolMessage)
    assert "id=old0]" in str(answer.content), str(answer.content)[:200]  # the shared history is recalled
    abandoned = [f"old{t}" for t in range(fork_turn + 1, 30)]
    leaked = [label for label in abandoned if f"id={label}]" in str(answer.content)]
    assert not leaked, f"recall in the new branch returned abandoned-branch messages: {leaked[:5]}"


# -- two sub-agents in one thread --------------------------------------------------------------------


def _sub_agent(key: str, archive: Archive) -> tuple[Any, CompactionNode]:
    """A sub-agent keeping its messages under ``key``, with the archive and a recall ToolNode of its own."""

    class SubState(TypedDict):
        pass

    SubState.__annotations__[key] = Annotated[list[BaseMessage], add_messages]
    node = CompactionNode(
        short_summary, SMALL_WINDOW, messages_key=key, nested="own", features=[*default_features(), archive]
    )
    tool = node.recall_tool(max_chars=200_000)

    def agent(state: dict[str, Any]) -> dict[str, Any]:
        last = state[key][-1]
        if isinstance(last, HumanMessage) and str(last.content).startswith("RECALL "):
            query = str(last.content).split(" ", 1)[1]
            call = {"name": tool.name, "args": {"query": query, "limit": 50}, "id": f"r-{key}", "type": "tool_call"}
            return {key: [AIMessage("", tool_calls=[call])]}
        return {key: [AIMessage(words(f"{key}-answer", 60))]}

    builder = StateGraph(SubState)
    builder.add_node("compact", node)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode([tool], messages_key=key))
    builder.add_edge(START, "compact")
    builder.add_edge("compact", "agent")
    builder.add_conditional_edges("agent", lambda s: "tools" if s[key][-1].tool_calls else END, ["tools", END])
    builder.add_edge("tools", END)
    return builder.compile(), node


class TwoAgents(TypedDict):
    alpha: Annotated[list[BaseMessage], add_messages]
    beta: Annotated[list[BaseMessage], add_messages]


def _two_sub_agents(beta_archive: Archive) -> tuple[Any, Any]:
    store = InMemoryStore()
    alpha, _ = _sub_agent("alpha", Archive())
    beta, _ = _sub_agent("beta", beta_archive)
    builder = StateGraph(TwoAgents)
    builder.add_node("alpha_agent", alpha)
    builder.add_node("beta_agent", beta)
    builder.add_edge(START, "alpha_agent")
    builder.add_edge("alpha_agent", "beta_agent")
    builder.add_edge("beta_agent", END)
    graph = builder.compile(checkpointer=InMemorySaver(), store=store)
    for turn in range(40):
        graph.invoke(
            {
                "alpha": [HumanMessage(words(f"ALPHASECRET{turn}", 60), id=f"alpha-{turn}")],
                "beta": [HumanMessage(words(f"beta-question{turn}", 60), id=f"beta-{turn}")],
            },
            cfg("shared-thread"),
        )
    return graph, store


def _beta_recall(graph: Any, query: str) -> str:
    out = graph.invoke(
        {"alpha": [HumanMessage(words("alpha-idle", 5))], "beta": [HumanMessage(f"RECALL {query}")]},
        cfg("shared-thread"),
    )
    answer = out["beta"][-1]
    assert isinstance(answer, ToolMessage), answer
    return str(answer.content)


def test_sub_agents_do_not_read_each_others_archive() -> None:
    """One sub-agent's recall (same thread) returns its own archived messages, never another sub-agent's."""
    graph, store = _two_sub_agents(Archive())
    ids = [i.value["message"]["data"]["id"] for i in archive_items(store, "shared-thread")]
    assert any(i.startswith("alpha-") for i in ids)
    assert any(i.startswith("beta-") for i in ids)
    assert "id=beta-3]" in _beta_recall(graph, "beta-question3")  # control: beta reads its own archive
    answer = _beta_recall(graph, "ALPHASECRET3")
    assert "id=alpha-" not in answer, f"beta's recall returned alpha's archived messages: {answer[:120]!r}"


def test_retention_of_one_sub_agent_keeps_the_others_archive() -> None:
    """One sub-agent's Archive(max_messages=5) never deletes another sub-agent's archived messages."""

    def alpha_archived(store: Any) -> set[str]:
        return {
            i.value["message"]["data"]["id"]
            for i in archive_items(store, "shared-thread")
            if i.value["message"]["data"]["id"].startswith("alpha-")
        }

    _, control = _two_sub_agents(Archive())  # beta without retention
    expected = alpha_archived(control)
    assert len(expected) > 10  # alpha compacted several times
    _, store = _two_sub_agents(Archive(max_messages=5))
    lost = sorted(expected - alpha_archived(store), key=lambda k: int(k.split("-")[1]))
    # alpha has no retention: every alpha message it compacted must still be in the archive.
    assert not lost, f"beta's Archive(max_messages=5) deleted {len(lost)} of alpha's archived messages, e.g. {lost[:5]}"


# -- a store that cannot be written, with on_error='warn' --------------------------------------------


def test_archive_warn_does_not_summarize_and_discard_every_turn() -> None:
    """With Archive(on_error="warn") and a failing store, no summary call is paid for and thrown away."""
    prompts: list[str] = []

    def counting_summarizer(prompt: str) -> str:
        prompts.append(prompt)
        return "## Goal\n- x"

    node = CompactionNode(
        counting_summarizer, SMALL_WINDOW, result_key="compaction", features=archived(on_error="warn")
    )
    graph = graph_with(node, store=FailingStore())
    over = 0
    used = 0  # summary calls that went into a compaction written to the state
    for turn in range(40):
        for update in graph.stream(
            {"messages": [HumanMessage(words(f"q{turn}"))]}, cfg("readonly"), stream_mode="updates"
        ):
            record = (update.get("compact") or {}).get("compaction")
            if record:
                used += record["summarizer_calls"]
        messages = graph.get_state(cfg("readonly")).values["messages"]
        over += node.context_tokens(messages) > node.options.budget.threshold
    assert over > 1, "the thread never passed the threshold"
    discarded = len(prompts) - used
    assert discarded == 0, f"{discarded} summary calls made and discarded ({over} turns past the threshold)"
    assert len(prompts) <= 5, f"{len(prompts)} summary calls over {over} turns past the threshold"


def _read_file_turn(n: int, branch: str = "") -> list[BaseMessage]:
    """A user asks for a module, the agent reads it: a tool output long enough to be cleared, marked by ``n``."""
    call = {"name": "read_file", "args": {"path": f"src/mod{n}.py"}, "id": f"{branch}call{n}", "type": "tool_call"}
    output = f"UNIQUE{branch}_{n}_CONTENT\n" + "    return compute(value)\n" * 60
    return [
        HumanMessage(f"read module {n}", id=f"{branch}h{n}"),
        AIMessage("", tool_calls=[call], id=f"{branch}a{n}"),
        ToolMessage(output, tool_call_id=f"{branch}call{n}", name="read_file", id=f"{branch}tool{n}"),
    ]


def _cleared_ids(state: Sequence[BaseMessage]) -> list[str | None]:
    return [m.id for m in state if isinstance(m, ToolMessage) and str(m.content).startswith("[Tool output cleared")]


def test_a_tool_output_only_cleared_can_be_recalled() -> None:
    """ClearToolOutputs files the whole output (with no summary, so no compaction id): recall returns it."""
    from archive_sessions import GraphSession

    from langchain_compaction.features import ClearToolOutputs

    store = InMemoryStore()
    features = [*default_features(), ClearToolOutputs(keep_tool_uses=1, min_tokens=50), Archive()]
    node = CompactionNode(summarize, CompactionOptions(context_window=8_000), features=features)
    builder = StateGraph(CompactionState)
    builder.add_node("compact", node)
    builder.add_edge(START, "compact")
    builder.add_edge("compact", END)
    session = GraphSession(builder.compile(checkpointer=InMemorySaver(), store=store), node, "cleared")
    first_cleared = None
    for n in range(60):
        state = session.graph.invoke({"messages": _read_file_turn(n)}, session.config)["messages"]
        cleared = _cleared_ids(state)
        if cleared and first_cleared is None:
            first_cleared = cleared[0]
            assert "UNIQUE_0_CONTENT" in session.recall(store, ids=[first_cleared])  # right after clearing
    assert first_cleared == "tool0"
    state = session.graph.get_state(session.config).values["messages"]
    assert any(is_summary_message(m) for m in state)  # a summary has taken the placeholder since
    assert all(m.id != "tool0" for m in state)
    assert "UNIQUE_0_CONTENT" in session.recall(store, ids=["tool0"])
    assert "UNIQUE_0_CONTENT" in session.recall(store, query="UNIQUE_0_CONTENT")


def test_retention_counts_this_timelines_cleared_outputs_and_leaves_another_branchs() -> None:
    """An output only cleared carries no compaction id: it is this timeline's when its message is."""
    from langchain_compaction.features.archive import _beyond, _Timeline

    store = InMemoryStore()
    for position in range(10):
        value = {"position": f"{position:012d}", "lineage": "b1", "compaction": 1, "id": f"m{position}"}
        store.put(("a",), f"b1:{position:012d}", value)
    for position in range(40, 50):
        value = {"position": f"{position:012d}", "lineage": "", "compaction": 0, "id": f"t{position}"}
        store.put(("a",), f":{position:012d}:t{position}", value)
    items = store.search(("a",), limit=100)
    # t40..t44 are this timeline's (their cleared copies are in the state); t45..t49 another branch's.
    timeline = _Timeline.of({"b1"}, 1, {f"t{p}" for p in range(40, 45)}, items)
    assert _beyond(items, timeline, keep=15) == []
    stale = _beyond(items, timeline, keep=10)
    assert sorted(i.key for i in stale) == [f"b1:{p:012d}" for p in range(5)]
    # A cleared output whose message a summary of this timeline archived since is this timeline's too.
    store.put(("a",), "b1:000000000045", {"position": "000000000045", "lineage": "b1", "compaction": 1, "id": "t45"})
    items = store.search(("a",), limit=100)
    assert _Timeline.of({"b1"}, 1, set(), items).holds({"lineage": "", "id": "t45"})
    assert not _Timeline.of({"b1"}, 1, set(), items).holds({"lineage": "", "id": "t46"})


def test_after_a_fork_each_branchs_cleared_outputs_are_archived_and_recalled_in_their_branch_only() -> None:
    """A clearing has no summary id: its items are filed by position and message, and held by the timeline's ids."""
    from langchain_compaction.features import ClearToolOutputs

    store = InMemoryStore()
    features = [*default_features(), ClearToolOutputs(keep_tool_uses=1, min_tokens=50), Archive()]
    node = CompactionNode(
        lambda p: "## Goal\n- read modules", CompactionOptions(context_window=8_000), features=features
    )
    graph = compaction_graph(node, checkpointer=InMemorySaver(), store=store)
    session = GraphSession(graph, node, "fork-cleared")
    config = session.config

    def turn(branch: str, n: int, cfg: Any) -> list[BaseMessage]:
        return graph.invoke({"messages": _read_file_turn(n, branch)}, cfg)["messages"]

    cleared_ids = _cleared_ids

    def recall(**args):
        return session.recall(store, **args)

    # Branch A: run until the first clearing happens (no summary yet).
    first = None
    for n in range(40):
        state = turn("A", n, config)
        if cleared_ids(state):
            first = n
            break
    assert first is not None, "harness: nothing was cleared"
    assert not any(m.type == "system" for m in state), "harness: a summary was made, want clearing only"
    a_cleared = cleared_ids(state)
    # Fork from the checkpoint right after turn 0 (before A's later outputs existed).
    fork = next(
        s
        for s in graph.get_state_history(config)
        if not s.next and s.values.get("messages") and s.values["messages"][-1].id == "Atool0"
    )
    cfg = fork.config
    for n in range(1, first + 1):
        state = turn("B", n, cfg)
        cfg = graph.get_state(config).config
    assert cleared_ids(state), "harness: nothing cleared in branch B"
    cleared_b = [i for i in cleared_ids(state) if i.startswith("B")]
    problems = []
    lost = [cid for cid in cleared_b if f"UNIQUEB_{cid[5:]}_CONTENT" not in recall(ids=[cid])]
    if lost:
        problems.append(
            f"{len(lost)} of branch B's {len(cleared_b)} cleared tool outputs (e.g. {lost[0]}) are in neither the state "
            "nor the archive: their ':position' key was already taken by branch A's cleared output"
        )
    for aid in a_cleared:
        if aid == "Atool0":
            continue
        n = aid.replace("Atool", "")
        if f"UNIQUEA_{n}_CONTENT" in recall(query=f"UNIQUEA_{n}_CONTENT"):
            problems.append(f"recall in branch B returned the abandoned branch A's output {aid}")
            break
    assert not problems, problems


class _Researcher(TypedDict):
    research: Annotated[list[BaseMessage], add_messages]


class _Supervisor(TypedDict):
    messages: Annotated[list[BaseMessage], add_messages]
    research: Annotated[list[BaseMessage], add_messages]


def test_a_conversations_recall_never_reads_a_sub_agents_archive_below_it() -> None:
    """A store search reads the namespaces under one too: the archive reads only its own."""
    from langchain_compaction.features import ClearToolOutputs

    sub_node = CompactionNode(
        lambda p: "## Goal\n- research",
        CompactionOptions(context_window=8_000),
        messages_key="research",
        nested="own",
        features=[*default_features(), ClearToolOutputs(keep_tool_uses=1, min_tokens=50), Archive()],
    )
    sb = StateGraph(_Researcher)
    sb.add_node("compact", sub_node)
    sb.add_edge(START, "compact")
    sb.add_edge("compact", END)

    top_node = CompactionNode(
        lambda p: "## Goal\n- main", CompactionOptions(context_window=8_000), features=[*default_features(), Archive()]
    )
    recall = top_node.recall_tool(max_chars=100_000)

    def agent(state):
        last = state["messages"][-1]
        if isinstance(last, HumanMessage) and str(last.content).startswith("RECALL "):
            call = {
                "name": recall.name,
                "args": {"query": str(last.content)[7:], "limit": 50},
                "id": "rc",
                "type": "tool_call",
            }
            return {"messages": [AIMessage("", tool_calls=[call])]}
        return {"messages": [AIMessage(f"main answer {len(state['messages'])}")]}

    b = StateGraph(_Supervisor)
    b.add_node("compact", top_node)
    b.add_node("researcher", sb.compile())
    b.add_node("agent", agent)
    b.add_node("tools", ToolNode([recall]))
    b.add_edge(START, "compact")
    b.add_edge("compact", "researcher")
    b.add_edge("researcher", "agent")
    b.add_conditional_edges("agent", lambda s: "tools" if s["messages"][-1].tool_calls else END, ["tools", END])
    b.add_edge("tools", END)
    store = InMemoryStore()
    graph = b.compile(checkpointer=InMemorySaver(), store=store)
    config = {"configurable": {"thread_id": "T"}}
    for n in range(30):
        call = {"name": "fetch", "args": {"url": f"https://example.com/{n}"}, "id": f"c{n}", "type": "tool_call"}
        graph.invoke(
            {
                "messages": [HumanMessage(f"main question {n}", id=f"m{n}")],
                "research": [
                    HumanMessage(f"look up {n}", id=f"s{n}"),
                    AIMessage("", tool_calls=[call], id=f"sa{n}"),
                    ToolMessage(
                        f"SUBAGENTPAGE{n} " + "lorem ipsum dolor sit amet " * 40, tool_call_id=f"c{n}", id=f"st{n}"
                    ),
                ],
            },
            config,
        )
    namespaces = store.list_namespaces(prefix=("compaction_archive",))
    assert ("compaction_archive", "T", "researcher") in namespaces, f"harness: sub-agent archived nothing {namespaces}"
    answer = graph.invoke({"messages": [HumanMessage("RECALL SUBAGENTPAGE3")]}, config)["messages"][-1]
    assert isinstance(answer, ToolMessage), answer
    assert "SUBAGENTPAGE3" not in str(answer.content), "the top-level recall read the sub-agent's archive"
    # The sub-agent's own archive still holds it.
    sub_items = store.search(("compaction_archive", "T", "researcher"), limit=500)
    assert any("SUBAGENTPAGE3" in str(i.value.get("message")) for i in sub_items)


def test_the_summary_names_the_recall_tool_by_the_name_it_was_given(caplog: pytest.LogCaptureFixture) -> None:
    """Archive(tool=...) names the tool in the summary's line and in recall_tool; a name given only to the tool warns."""
    store = InMemoryStore()
    archive = Archive(tool="search_history")
    node = CompactionNode(summarize, CompactionOptions(context_window=3_000), features=[*default_features(), archive])
    graph = compaction_graph(node, checkpointer=InMemorySaver(), store=store)
    config = {"configurable": {"thread_id": "named"}}
    for turn in range(30):
        state = graph.invoke({"messages": [HumanMessage(f"turn {turn} " * 60, id=f"h{turn}")]}, config)
    summary = next(m for m in state["messages"] if is_summary_message(m))
    assert "`search_history`" in str(summary.content)
    assert "recall_messages" not in str(summary.content)
    assert node.recall_tool().name == "search_history"
    with caplog.at_level(logging.WARNING, logger="langchain_compaction"):
        assert recall_tool(Archive(), name="search_history").name == "search_history"
    assert any("Archive(tool=" in r.getMessage() for r in caplog.records)
    with pytest.raises(ConfigurationError, match="tool name"):
        Archive(tool="recall messages")


def test_recall_finds_a_word_whatever_its_unicode_form() -> None:
    """An accented letter is one character (NFC) or a letter and a combining mark (NFD, macOS file names)."""
    import unicodedata

    from langchain_compaction.core.recall import Lookup
    from langchain_compaction.features.recall import recall_from

    stored = [HumanMessage(unicodedata.normalize("NFD", "Attach Résumé_Zoë.pdf for the café"), id="m0")]
    for query in ("Résumé_Zoë.pdf", unicodedata.normalize("NFD", "café"), "CAFÉ"):
        assert [p for p, _ in recall_from(stored, Lookup(unicodedata.normalize("NFC", query)))] == [0], query


def test_with_clearing_and_prepared_summaries_a_tool_output_taken_out_is_recalled() -> None:
    """Clearing, a preparation and the archive together: the first output, taken out by an applied preparation, is
    recalled whole (a cleared copy taken out is filed under the summary too: ``taken_out``)."""
    from langchain_compaction.features import ClearToolOutputs, PrepareAhead

    store = InMemoryStore()
    features = [
        *default_features(),
        ClearToolOutputs(keep_tool_uses=1, min_tokens=50),
        PrepareAhead(at=0.7, wait=5.0),
        Archive(),
    ]
    node = CompactionNode(
        summarize, CompactionOptions(context_window=8_000), features=features, result_key="compaction"
    )
    session = GraphSession(compaction_graph(node, checkpointer=InMemorySaver(), store=store), node, "prepared-cleared")
    applied = False
    for n in range(80):
        out = session.graph.invoke({"messages": _read_file_turn(n)}, session.config)
        applied = applied or bool((out.get("compaction") or {}).get("parts", {}).get("prepared", {}).get("applied"))
        if applied and all(m.id != "tool0" for m in out["messages"]):
            break
        time.sleep(0.02)  # the background preparation finishes meanwhile, as during a model call
    assert applied, "a prepared compaction should have been applied"
    assert all(m.id != "tool0" for m in out["messages"])
    assert "UNIQUE_0_CONTENT" in session.recall(store, ids=["tool0"])


def test_the_command_line_lists_a_sub_agents_archive_apart(tmp_path: Any) -> None:
    """A thread's archive and its sub-agent's (filed below it) are listed apart: --subgraph names the sub-agent."""
    import io

    from langgraph.store.sqlite import SqliteStore

    from langchain_compaction.cli import main
    from langchain_compaction.features.archive import ARCHIVE_NAMESPACE

    path = tmp_path / "store.db"
    with SqliteStore.from_conn_string(str(path)) as store:
        store.setup()
        for labels, text in (((), "main conversation"), (("researcher",), "sub-agent's page")):
            value = {"position": "000000000000", "role": "human", "id": f"m-{len(labels)}", "compaction": 1}
            value |= {"lineage": "c1", "message": message_to_dict(HumanMessage(text, id=f"m-{len(labels)}"))}
            store.put((ARCHIVE_NAMESPACE, "t", *labels), "c1:000000000000", value)
    main_out, sub_out = io.StringIO(), io.StringIO()
    assert main(["archive", str(path), "t"], main_out) == 0
    assert main(["archive", str(path), "t", "--subgraph", "researcher"], sub_out) == 0
    assert "main conversation" in main_out.getvalue()
    assert "sub-agent" not in main_out.getvalue()
    assert "sub-agent's page" in sub_out.getvalue()


def _archived_ids(store: InMemoryStore, thread: str) -> Counter[str]:
    return Counter(item.value.get("id") for item in store.search(("compaction_archive", thread), limit=100_000))


def _replier(state: dict[str, Any]) -> dict[str, Any]:
    return {"messages": [AIMessage(words("answer", 60))]}


def _archiving(summarizer: Any, window: int = 4_000) -> tuple[Any, InMemoryStore]:
    """A checkpointed graph (the node with the archive, then a replier) and its store."""
    store = InMemoryStore()
    node = CompactionNode(summarizer, CompactionOptions(context_window=window), features=with_archive())
    return compaction_graph(node, _replier, checkpointer=InMemorySaver(), store=store), store


class _Outage:
    """A summarizer whose service is down (``down``) until the test says otherwise."""

    def __init__(self) -> None:
        self.down = True

    def __call__(self, prompt: str) -> str:
        if self.down:
            raise RuntimeError("the summary service is down")
        return SUMMARY


def test_a_summarizer_down_for_many_turns_archives_each_message_once() -> None:
    # Each failed turn archived the whole region again under a new compaction
    # id (the region had grown by a turn): 28 failed turns filed 1,010 items
    # for 49 messages. The retry keeps the failed try's id.
    summarizer = _Outage()
    graph, store = _archiving(summarizer)
    failed = 0
    for turn in range(36):
        summarizer.down = turn < 30
        try:
            graph.invoke({"messages": [HumanMessage(words(f"question {turn}", 200), id=f"h{turn}")]}, cfg("down"))
        except CompactionError:
            failed += 1
    archived = _archived_ids(store, "down")
    state = graph.get_state(cfg("down")).values["messages"]
    assert failed >= 20, "the outage never reached a compaction: the test proves nothing"
    assert any(is_summary_message(m) for m in state)
    assert max(archived.values()) == 1, archived.most_common(3)
    ids_kept = {m.id for m in state}
    assert all(f"h{t}" in ids_kept or f"h{t}" in archived for t in range(36))


OUTAGE_CONVERSATIONS = 70
"""More conversations than the 64 whose failed try a node once remembered (the token cache's bound)."""


def test_a_summarizer_down_for_many_conversations_at_once_archives_each_message_once() -> None:
    # The failed try's id was kept beside the token cache's last calls, 64 conversations: with more taking
    # turns in an outage, each one's was pushed out before it retried, and every retry filed its region again
    # under a new id (70 conversations, 3 failed rounds: most messages filed twice).
    summarizer = _Outage()
    graph, store = _archiving(summarizer)
    threads = [f"outage {i}" for i in range(OUTAGE_CONVERSATIONS)]
    for thread in threads:  # each just under the threshold
        graph.invoke({"messages": chat(3, 200)}, cfg(thread))
    failed = 0
    for turn in range(4):
        summarizer.down = turn < 3
        for thread in threads:  # round-robin, as a server's requests come
            try:
                graph.invoke({"messages": [HumanMessage(words(f"question {turn}", 150))]}, cfg(thread))
            except CompactionError:
                failed += 1
    assert failed == 3 * OUTAGE_CONVERSATIONS, "the outage never reached a compaction: the test proves nothing"
    for thread in threads:
        assert any(is_summary_message(m) for m in graph.get_state(cfg(thread)).values["messages"])
        archived = _archived_ids(store, thread)
        assert max(archived.values()) == 1, (thread, archived.most_common(3))


async def test_compactions_cancelled_mid_summary_archive_each_message_once() -> None:
    import asyncio

    async def slow(prompt: str) -> str:
        await asyncio.sleep(0.3)
        return SUMMARY

    graph, store = _archiving(slow)
    cancelled = 0
    for turn in range(24):
        wait = 0.1 if turn < 18 else 5.0
        message = HumanMessage(words(f"question {turn}", 200), id=f"h{turn}")
        try:
            await asyncio.wait_for(graph.ainvoke({"messages": [message]}, cfg("cut")), wait)
        except (TimeoutError, asyncio.TimeoutError):  # (two classes before Python 3.11)
            cancelled += 1
    archived = _archived_ids(store, "cut")
    assert cancelled >= 8, "no compaction was cancelled: the test proves nothing"
    assert max(archived.values()) == 1, archived.most_common(3)


def test_a_sqlite_store_on_a_plain_connection_fails_naming_the_fix(tmp_path: Any) -> None:
    # "cannot start a transaction within a transaction", turn after turn, and nothing said what to do.
    import sqlite3
    from contextlib import closing

    from langgraph.store.sqlite import SqliteStore

    from langchain_compaction.errors import StoreError

    with closing(sqlite3.connect(str(tmp_path / "store.db"), check_same_thread=False)) as connection:
        store = SqliteStore(connection)
        store.setup()
        node = CompactionNode(short_summary, CompactionOptions(context_window=3_000), features=with_archive())
        graph = compaction_graph(
            node,
            lambda state: {"messages": [AIMessage(words("answer", 100))]},
            checkpointer=InMemorySaver(),
            store=store,
        )
        failures = []
        for turn in range(30):
            try:
                graph.invoke({"messages": [HumanMessage(words(f"question {turn}", 100))]}, cfg("plain"))
            except StoreError as error:
                failures.append(str(error))
        assert failures
        assert all("SqliteStore.from_conn_string(path)" in failure for failure in failures)


def test_a_tool_artifact_that_is_not_json_is_archived_as_text_on_sqlite(tmp_path: Any) -> None:
    # Rows with dates from a content-and-artifact tool: the checkpointer takes
    # them, the store's JSON did not, and every compaction raised StoreError.
    import datetime

    from langgraph.store.sqlite import SqliteStore

    calls = itertools.count()

    def agent(state: dict[str, Any]) -> dict[str, Any]:
        n = next(calls)
        # (As DataFrame.to_dict() gives them: keys that are numbers; a grouping's keys are tuples.)
        rows = [{"order": n, "shipped_at": datetime.datetime(2026, 1, 1, 12, n % 60), "by_row": {0: n}}]
        rows.append({("eu", n): 1})
        call = {"id": f"q{n}", "name": "query_orders", "args": {"sql": "select * from orders"}}
        result = ToolMessage(words(f"order {n} shipped", 120), tool_call_id=f"q{n}", artifact=rows, id=f"r{n}")
        return {"messages": [AIMessage("", tool_calls=[call]), result, AIMessage(words("done", 20))]}

    with SqliteStore.from_conn_string(str(tmp_path / "store.db")) as store:
        store.setup()
        node = CompactionNode(short_summary, CompactionOptions(context_window=4_000), features=with_archive())
        graph = compaction_graph(node, agent, checkpointer=InMemorySaver(), store=store)
        for turn in range(16):
            graph.invoke({"messages": [HumanMessage(words(f"turn {turn}", 20))]}, cfg("rows"))
        items = store.search(("compaction_archive", "rows"), limit=10_000)
        first = next(i for i in items if i.value.get("id") == "r0")
        message = archived_message(first.value)
    assert isinstance(message, ToolMessage)
    assert message.artifact == [{"order": 0, "shipped_at": "2026-01-01T12:00:00", "by_row": {"0": 0}}, {"('eu', 0)": 1}]


def test_a_thread_whose_id_is_empty_is_archived_like_any_other() -> None:
    # LangGraph keeps a thread with thread_id "" and continues it; the archive took it for "no thread"
    # and filed nothing: 22 of 30 messages were only in the summary.
    graph, store = _archiving(short_summary, window=3_000)
    for turn in range(15):
        graph.invoke({"messages": [HumanMessage(words(f"question {turn}", 80), id=f"q{turn}")]}, cfg(""))
    kept = {m.id for m in graph.get_state(cfg("")).values["messages"]}
    filed = {item.value.get("id") for item in store.search(("compaction_archive", "%"), limit=1_000)}
    assert len(filed) > 5
    assert all(f"q{t}" in kept or f"q{t}" in filed for t in range(15))


@pytest.mark.parametrize(
    ("argument", "value"),
    [("archive", True), ("name", 5), ("name", "bad name!"), ("name", ""), ("redact", "x")],
)
def test_recall_tool_refuses_what_it_cannot_use(argument: str, value: Any) -> None:
    # Each raised from deep inside, or was taken (a name providers refuse; "" renamed silently).
    with pytest.raises(ConfigurationError, match=f"{argument}="):
        recall_tool(**{argument: value})


def _tool_loop_archive(features: list[Any], turns: int, *, todos_every: int = 0) -> tuple[list[str], Any, Any]:
    """An agent's tool loop after a system prompt, through a node with ``features``: the ids sent, the graph, its store."""
    from langchain_core.messages import SystemMessage
    from langgraph.graph import MessagesState

    from langchain_compaction import ExtractiveSummarizer

    node = CompactionNode(ExtractiveSummarizer(), CompactionOptions(context_window=4_000), features=features)
    reply: dict[str, AIMessage] = {}
    builder = StateGraph(MessagesState)
    builder.add_node("compact", node)
    builder.add_node("agent", lambda state: {"messages": [reply["ai"]]})
    builder.add_edge(START, "compact")
    builder.add_edge("compact", "agent")
    store = InMemoryStore()
    graph = builder.compile(checkpointer=InMemorySaver(), store=store)
    sent: list[str] = []
    inputs: list[BaseMessage] = [
        SystemMessage("You are a coding agent.", id="sys"),
        HumanMessage("Fix the parser bug in src/parse.py please.", id="h0"),
    ]
    for n in range(turns):
        todo = todos_every and n % todos_every == 3
        name, args = ("write_todos", {"todos": [f"step {n} item {k}" for k in range(4)]}) if todo else ("bash", {})
        call = {
            "name": name,
            "args": args or {"command": f"grep -rn token{n} src/"},
            "id": f"c{n}",
            "type": "tool_call",
        }
        reply["ai"] = AIMessage(f"Working on step {n}. " * 8, id=f"a{n}", tool_calls=[call])
        graph.invoke({"messages": inputs}, {"configurable": {"thread_id": "loop"}})
        sent += [m.id for m in inputs if m.id] + [f"a{n}"]
        output = f"src/parse.py:{n}: token{n} = read() # output line " * 30
        inputs = [ToolMessage(output, tool_call_id=f"c{n}", id=f"t{n}")]
    return sent, graph, store


def _archived_items(store: Any) -> list[Any]:
    return [
        item for ns in store.list_namespaces(prefix=("compaction_archive",)) for item in store.search(ns, limit=10_000)
    ]


def test_archived_messages_keep_their_positions_after_a_system_prompt_and_a_bridge() -> None:
    """The summary no longer lists the leading system prompt as kept from before its cut (the next compaction gave
    its position to the first message after the summary, and every later one was one too low)."""
    sent, _, store = _tool_loop_archive([Archive()], 30)
    where = {message_id: position for position, message_id in enumerate(sent)}
    items = _archived_items(store)
    assert len(items) > 20
    for item in items:
        assert int(item.value["position"]) == where[item.value["message"]["data"]["id"]]


def test_a_pinned_exchange_a_newer_call_replaces_is_archived_whole() -> None:
    """Both messages of the old pinned exchange, each at its own position: one key each, none dropped."""
    sent, graph, store = _tool_loop_archive([Pins(tools=("write_todos",)), Archive()], 60, todos_every=10)
    in_state = {m.id for m in graph.get_state({"configurable": {"thread_id": "loop"}}).values["messages"]}
    archived = Counter(item.value["message"]["data"]["id"] for item in _archived_items(store))
    assert [i for i in sent if i not in in_state and archived[i] == 0] == []
    assert [i for i, n in archived.items() if n > 1] == []
