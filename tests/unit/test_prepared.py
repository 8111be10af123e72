"""Prepared summaries: made in the background past ``PrepareAhead(at=...)``, applied at the threshold without waiting."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import time
from dataclasses import replace
from typing import Any

import pytest
from helpers_turns import (
    PREPARE_OPTS,
    ToolCallingFake,
    cfg,
    graph_with,
    long_history,
    prepare_of,
    prepared,
    short_summary,
    wait_for,
    wait_for_preparations,
    words,
)
from langchain.agents import create_agent
from langchain_core.chat_history import InMemoryChatMessageHistory
from langchain_core.exceptions import ContextOverflowError
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    messages_from_dict,
    messages_to_dict,
)
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph
from langgraph.store.memory import InMemoryStore

from langchain_compaction import (
    CompactingChatMessageHistory,
    CompactionMiddleware,
    CompactionNode,
    CompactionOptions,
    acompact,
    auto_compact,
    compact,
)
from langchain_compaction._lc.conversation import Conversation, thread_label
from langchain_compaction._lc.convert import SUMMARY_MARK, is_compaction_message, is_summary_message
from langchain_compaction._lc.events import PREPARE_EVENT
from langchain_compaction._lc.identity import prefix_digest
from langchain_compaction.archive import ARCHIVE_NAMESPACE
from langchain_compaction.core.types import SummaryRequest
from langchain_compaction.errors import ConfigurationError
from langchain_compaction.features import Archive, PrepareAhead
from langchain_compaction.features.prepared import STORE_NAMESPACE, PreparedSummary
from langchain_compaction.graph import CompactionState, compact_thread
from langchain_compaction.history import FileLock
from langchain_compaction.tokens import estimate_message_tokens

# One summary request per compaction (a large summarizer input), so calls count compactions.
OPTIONS = PREPARE_OPTS


class Recorder:
    """A summarizer that records each request, the thread that ran it, and when."""

    def __init__(
        self, *, fail_first: bool = False, gate: threading.Event | None = None, gated: int = 1, hold: float = 2.0
    ) -> None:
        self.requests: list[SummaryRequest] = []
        self.threads: list[str] = []
        self.fail_first = fail_first
        self.gate = gate
        self.gated = gated  # how many of the first calls wait for the gate
        self.hold = hold  # and for how long at most
        self.finished = 0

    @property
    def name(self) -> str:
        return "recorder"

    def summarize(self, request: SummaryRequest) -> str:
        self.requests.append(request)
        self.threads.append(threading.current_thread().name)
        if self.gate is not None and len(self.requests) <= self.gated:
            self.gate.wait(self.hold)
        self.finished += 1
        if self.fail_first and len(self.requests) == 1:
            raise RuntimeError("the summary model is overloaded")
        return f"## Goal\n- summary {len(self.requests)}"

    async def asummarize(self, request: SummaryRequest) -> str:
        self.requests.append(request)
        self.threads.append("task")
        if self.gate is not None and len(self.requests) <= self.gated:
            await asyncio.to_thread(self.gate.wait, self.hold)
        self.finished += 1
        if self.fail_first and len(self.requests) == 1:
            raise RuntimeError("the summary model is overloaded")
        return f"## Goal\n- summary {len(self.requests)}"


def graph(node: CompactionNode, store: Any = None) -> Any:
    def agent(state: dict[str, Any]) -> dict[str, Any]:
        return {"messages": [AIMessage(words("answer"), id=f"a{len(state['messages'])}")]}

    builder = StateGraph(CompactionState)
    builder.add_node("compact", node)
    builder.add_node("agent", agent)
    builder.add_edge(START, "compact")
    builder.add_edge("compact", "agent")
    return builder.compile(checkpointer=InMemorySaver(), store=store)


class Started(logging.Handler):
    """Counts the preparations adapters report starting (they log it in the turn that starts one)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        if "preparing the next summary in the background" in record.getMessage():
            self.count += 1


STARTED = Started()


@pytest.fixture(autouse=True)
def _count_started() -> Any:
    logger = logging.getLogger("langchain_compaction")
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(STARTED)
    STARTED.count = 0
    yield
    logger.removeHandler(STARTED)
    logger.setLevel(level)


def settle(summarizer: Recorder) -> None:
    """Wait until every preparation started so far has finished its summary call."""
    wait_for(lambda: summarizer.finished >= STARTED.count)
    time.sleep(0.02)  # and handed its result back


def until_preparing(app: Any, config: Any) -> int:
    """Run turns until a preparation starts; the number of the next turn."""
    number = 0
    while not STARTED.count:
        app.invoke({"messages": [HumanMessage(words(f"q{number}"), id=f"h{number}")]}, config)
        number += 1
    return number


def until_compaction(app: Any, config: Any, summarizer: Recorder, start: int = 0) -> tuple[int, dict[str, Any], int]:
    """Run turns until one compacts; before each turn, let a running preparation finish.

    Returns:
        The turn, the compaction's record and the summary calls made before that turn began.
    """
    for number in range(start, start + 80):
        # A background call that started is given time to finish, as an
        # agent's own model call (seconds) would give it.
        settle(summarizer)
        calls_before = len(summarizer.requests)
        out = app.invoke({"messages": [HumanMessage(words(f"q{number}"), id=f"h{number}")]}, config)
        if out.get("compaction"):
            return number, out["compaction"], calls_before
    raise AssertionError("no compaction in 80 turns")


# -- options -----------------------------------------------------------------------------


def test_a_preparation_matches_its_messages_their_copies_and_nothing_edited() -> None:
    # Every turn before the threshold asks whether the preparation still matches: the
    # messages it last matched, and copies of them (a checkpoint's, read anew each turn),
    # are taken without a digest of the whole prefix; an edit, in a copy or in place, is not.
    messages: list[BaseMessage] = []
    for i in range(30):
        messages += [HumanMessage(f"question {i} " * 30, id=f"h{i}"), AIMessage(f"answer {i} " * 30, id=f"a{i}")]
    result, output = compact(lambda prompt: "## Goal\n- go on", messages, CompactionOptions(keep_recent_tokens=300))
    assert result is not None
    prepared = PreparedSummary.of(messages, result, output, 10)
    later = [*messages, HumanMessage("next", id="n")]
    assert prepared.matches(later)
    assert prepared.matches(list(later))  # the same objects again
    copies = messages_from_dict(messages_to_dict(later))
    assert prepared.matches(copies)
    edited = [*copies]
    edited[3] = edited[3].model_copy(update={"content": "changed"})
    assert not prepared.matches(edited)
    assert not prepared.matches(later[:20])  # (shorter than what it was made from)
    # Copies edited in place after they matched, and read anew with the edit: equal to
    # the objects remembered, but not of the size they had when they matched.
    read = messages_from_dict(messages_to_dict(later))
    assert prepared.matches(read)
    again = messages_from_dict(messages_to_dict(later))
    for copy in (read[5], again[5]):
        copy.content = str(copy.content) + " and more"
    assert not prepared.matches(again)
    assert prepared.matches(messages_from_dict(messages_to_dict(later)))  # (the digest still knows the original)


def test_a_preparation_lets_go_of_the_messages_it_matched_once_they_are_collected() -> None:
    # What it remembers of the messages it matched lives as long as they do: a preparation
    # a finished conversation left in the cache holds nothing of them.
    messages: list[BaseMessage] = [HumanMessage(f"question {i} " * 30, id=f"h{i}") for i in range(40)]
    result, output = compact(lambda prompt: "## Goal\n- go on", messages, CompactionOptions(keep_recent_tokens=300))
    assert result is not None
    prepared = PreparedSummary.of(messages, result, output, 10)
    saved = messages_to_dict(messages)
    copies = messages_from_dict(saved)
    assert prepared.matches(copies)
    assert prepared._matched  # (remembered: the next turn's check is quick)
    del copies, output
    messages.clear()
    gc.collect()
    assert prepared._matched == []
    assert prepared.matches(messages_from_dict(saved))  # (by the digest, as before)


@pytest.mark.parametrize("share", [0.5, 0.2, 1.0, 1.5, 0, True, "0.7"])
def test_the_share_must_lie_above_the_landing(share: Any) -> None:
    with pytest.raises(ConfigurationError, match="at="):
        PrepareAhead(at=share)


def test_the_share_sets_the_preparation_mark() -> None:
    options = CompactionOptions(context_window=200_000)
    mark = PrepareAhead(at=0.7).bind(options).mark
    assert mark == round(options.budget.threshold * 0.7)  # type: ignore[operator]
    assert mark > options.budget.landing  # type: ignore[operator]


def test_the_functions_that_compact_at_once_refuse_it() -> None:
    messages = [HumanMessage("hi"), AIMessage("hello"), HumanMessage("bye")]
    for run in (
        lambda: compact(lambda p: "## Goal\n- x", messages, OPTIONS, features=prepared()),
        lambda: auto_compact(lambda p: "## Goal\n- x", messages, OPTIONS, features=prepared()),
        lambda: asyncio.run(acompact(lambda p: "## Goal\n- x", messages, OPTIONS, features=prepared())),
    ):
        with pytest.raises(ConfigurationError, match="PrepareAhead cannot be used here"):
            run()


def test_the_feature_checks_the_wait() -> None:
    with pytest.raises(ConfigurationError, match="wait"):
        PrepareAhead(wait=-1)


def test_the_0_2_keywords_still_work_with_a_deprecation_warning() -> None:
    with pytest.warns(DeprecationWarning, match="PrepareAhead"):
        options = CompactionOptions(context_window=4_000, reserve_tokens=500, keep_recent_tokens=400, prepare_at=0.7)
    with pytest.warns(DeprecationWarning, match=r"PrepareAhead\(wait=\.\.\.\)"):
        node = CompactionNode(lambda p: "x", options, prepare_wait=0.5)
    prepare = next(f for f in node.features if isinstance(f, PrepareAhead))
    assert (prepare.at, prepare.wait) == (0.7, 0.5)
    with pytest.warns(DeprecationWarning, match="PrepareAhead"), pytest.raises(ConfigurationError, match="at="):
        CompactionNode(lambda p: "x", CompactionOptions(context_window=200_000, prepare_at=1.5))


# -- the node ------------------------------------------------------------------------------


def test_the_node_applies_a_summary_prepared_in_the_background() -> None:
    summarizer = Recorder()
    node = CompactionNode(summarizer, OPTIONS, result_key="compaction", features=prepared())
    app = graph(node)
    config = {"configurable": {"thread_id": "t1"}}
    turn, record, calls_before = until_compaction(app, config, summarizer)
    assert record["parts"]["prepared"]["applied"] is True
    # The summary was made before the threshold turn, in a background thread:
    # the turn itself called no model.
    assert len(summarizer.requests) == calls_before == 1
    assert summarizer.threads == ["langchain-compaction-prepare"]
    state = app.get_state(config).values["messages"]
    assert is_summary_message(state[0])
    assert "summary 1" in str(state[0].content)
    # Nothing lost: every message is in the state or was covered by the summary.
    assert record["messages_removed"] + record["messages_kept"] == 2 * turn + 1


def test_a_grown_conversation_is_never_summarized_on_the_threshold_turn() -> None:
    summarizer = Recorder()
    node = CompactionNode(summarizer, OPTIONS, result_key="compaction", features=prepared())
    app = graph(node)
    config = {"configurable": {"thread_id": "fold"}}
    # Reach the preparation mark, let the preparation finish ...
    number = until_preparing(app, config)
    settle(summarizer)
    # ... then the agent goes on (in one big step) past the threshold.
    many = [HumanMessage(words(f"late{i}"), id=f"late{i}") for i in range(12)]
    out = app.invoke({"messages": many}, config)
    record = out["compaction"]
    assert record["parts"]["prepared"]["applied"] is True
    assert len(summarizer.requests) == record["summarizer_calls"] == 1  # no call on the threshold turn
    assert all(t == "langchain-compaction-prepare" for t in summarizer.threads)
    # What came since the preparation stays verbatim after the prepared summary.
    state = out["messages"]
    assert [m.id for m in state if str(m.id).startswith("late")] == [f"late{i}" for i in range(12)]
    # Later turns prepare the next compaction on top of it, in the background.
    for later in range(number, number + 60):
        settle(summarizer)
        app.invoke({"messages": [HumanMessage(words(f"q{later}"), id=f"h{later}")]}, config)
        if len(summarizer.requests) > 1:
            break
    update = summarizer.requests[1]
    assert summarizer.threads[1] == "langchain-compaction-prepare"
    assert update.previous_summary is not None
    assert "summary 1" in update.previous_summary  # the prepared summary, updated, not redone


def test_an_edited_prefix_discards_the_prepared_summary() -> None:
    summarizer = Recorder()
    node = CompactionNode(summarizer, OPTIONS, result_key="compaction", features=prepared())
    app = graph(node)
    config = {"configurable": {"thread_id": "edit"}}
    number = until_preparing(app, config)
    settle(summarizer)
    first = len(summarizer.requests)
    # The user edits their first message (same id, new content).
    app.update_state(config, {"messages": [HumanMessage("an edited first question", id="h0")]})
    turn, record, calls_before = until_compaction(app, config, summarizer, start=number)
    # The summary made before the edit is never applied: the one in the state
    # was made (prepared again, or on the spot) from the edited conversation.
    later = summarizer.requests[first:]
    assert later
    assert any("an edited first question" in r.prompt for r in later)
    state = app.get_state(config).values["messages"]
    assert is_summary_message(state[0])
    assert f"summary {first}" not in str(state[0].content)


@pytest.mark.parametrize("in_store", [False, True], ids=["memory", "store"])
def test_a_discarded_preparation_is_reported_once(in_store: bool) -> None:
    """Made, then found stale (the user edited what it covers): its call is in the next result, once.

    Kept in the store, where any worker might still apply it, it is counted
    when it is pruned from there unapplied; the results then add up to the
    calls made.
    """
    summarizer = Recorder()
    node = CompactionNode(summarizer, OPTIONS, result_key="compaction", features=prepared(in_store=in_store))
    app = graph(node, store=InMemoryStore() if in_store else None)
    config = {"configurable": {"thread_id": "counted"}}
    number = until_preparing(app, config)
    settle(summarizer)
    app.update_state(config, {"messages": [HumanMessage("an edited first question", id="h0")]})
    _, record, _ = until_compaction(app, config, summarizer, start=number)
    settle(summarizer)
    assert record["parts"]["prepared"]["discarded_calls"] >= 1
    # The stale one and the one that compacted, and no call twice.
    assert 2 <= record["summarizer_calls"] <= len(summarizer.requests)


def test_a_preparation_still_running_is_waited_for_only_up_to_the_bound() -> None:
    gate = threading.Event()
    summarizer = Recorder(gate=gate)
    node = CompactionNode(summarizer, OPTIONS, result_key="compaction", features=prepared(wait=0.0))
    app = graph(node)
    config = {"configurable": {"thread_id": "slow"}}
    try:
        for number in range(80):
            out = app.invoke({"messages": [HumanMessage(words(f"q{number}"), id=f"h{number}")]}, config)
            if out.get("compaction"):
                break
        record = out["compaction"]
        # The preparation is blocked; the threshold compacted on the spot.
        assert record["parts"]["prepared"]["applied"] is False
    finally:
        gate.set()
    assert summarizer.threads[0] == "langchain-compaction-prepare"
    assert summarizer.threads[-1] != "langchain-compaction-prepare"
    time.sleep(0.1)
    # The abandoned preparation's result is never applied later: the state has one summary.
    state = app.get_state(config).values["messages"]
    assert sum(1 for m in state if is_summary_message(m)) == 1


def test_a_failed_preparation_never_surfaces_and_is_tried_again_in_the_background() -> None:
    summarizer = Recorder(fail_first=True)
    node = CompactionNode(summarizer, OPTIONS, result_key="compaction", features=prepared())
    app = graph(node)
    config = {"configurable": {"thread_id": "fail"}}
    turn, record, calls_before = until_compaction(app, config, summarizer)
    # The threshold turn found the failure, started again in the background
    # and went on (the request still fit); a later turn applied the retry.
    assert record["parts"]["prepared"]["applied"] is True
    assert len(summarizer.requests) == 2  # the failed preparation, then its retry
    assert summarizer.threads == ["langchain-compaction-prepare"] * 2
    assert "summary 2" in str(app.get_state(config).values["messages"][0].content)


def test_the_turn_that_starts_a_preparation_says_so() -> None:
    summarizer = Recorder()
    node = CompactionNode(summarizer, OPTIONS, features=prepared())
    app = graph(node)
    config = {"configurable": {"thread_id": "events"}}
    seen: list[Any] = []
    for number in range(40):
        for chunk in app.stream(
            {"messages": [HumanMessage(words(f"q{number}"), id=f"h{number}")]}, config, stream_mode="custom"
        ):
            seen.append(chunk)
        if seen:
            break
    assert seen == [{PREPARE_EVENT: {"thread": "events", "messages": 2 * number + 1}}]


def test_async_node_prepares_in_a_task() -> None:
    summarizer = Recorder()
    node = CompactionNode(summarizer, OPTIONS, result_key="compaction", features=prepared())
    app = graph(node)
    config = {"configurable": {"thread_id": "async"}}

    async def session() -> dict[str, Any]:
        for number in range(80):
            calls_before = len(summarizer.requests)
            out = await app.ainvoke({"messages": [HumanMessage(words(f"q{number}"), id=f"h{number}")]}, config)
            if out.get("compaction"):
                return {**out["compaction"], "calls_before": calls_before}
            await asyncio.sleep(0.02)  # the agent's own model call: the task runs meanwhile
        raise AssertionError("no compaction")

    record = asyncio.run(session())
    assert record["parts"]["prepared"]["applied"] is True
    assert summarizer.threads == ["task"]
    assert record["calls_before"] == 1


def test_a_program_that_ends_while_a_preparation_runs_is_told_nothing(caplog: pytest.LogCaptureFixture) -> None:
    # Every turn on one event loop, as the README says; the loop closes at the program's end with a
    # preparation still running (its summary held back): no turn of it came on another loop.
    gate = threading.Event()
    summarizer = Recorder(gate=gate, hold=0.5)
    node = CompactionNode(summarizer, OPTIONS, result_key="compaction", features=prepared(wait=0.0))
    app = graph(node)
    config = {"configurable": {"thread_id": "ending"}}

    async def session() -> None:
        for number in range(80):
            await app.ainvoke({"messages": [HumanMessage(words(f"q{number}"), id=f"h{number}")]}, config)
            if summarizer.requests:
                return  # a preparation is running: the program ends here

    with caplog.at_level(logging.WARNING, logger="langchain_compaction"):
        try:
            asyncio.run(session())
        finally:
            gate.set()
    assert summarizer.requests
    assert not [r for r in caplog.records if "event loop closed" in r.getMessage()]


def test_a_loop_closing_under_a_pending_preparation_breaks_nothing(caplog: pytest.LogCaptureFixture) -> None:
    gate = threading.Event()
    # The gated preparation is still pending when its turn's loop closes (the close waits out the hold).
    summarizer = Recorder(gate=gate, hold=0.5)
    node = CompactionNode(summarizer, OPTIONS, result_key="compaction", features=prepared(wait=0.0))
    app = graph(node)
    config = {"configurable": {"thread_id": "closing"}}
    records = []
    try:
        for number in range(80):
            # asyncio.run per turn: the loop that holds the preparation closes.
            out = asyncio.run(app.ainvoke({"messages": [HumanMessage(words(f"q{number}"), id=f"h{number}")]}, config))
            if out.get("compaction"):
                records.append(out["compaction"])
                if len(records) == 2:
                    break
    finally:
        gate.set()
    assert records
    assert all(r["parts"]["prepared"]["applied"] is False for r in records)
    # Said once, by the turn that found its preparation's loop closed.
    assert len([r for r in caplog.records if "event loop closed" in r.getMessage()]) == 1
    messages = app.get_state(config).values["messages"]
    assert sum(1 for m in messages if is_summary_message(m)) == 1


# -- across workers: the store --------------------------------------------------------------


def test_another_worker_applies_the_summary_from_the_store() -> None:
    store = InMemoryStore()
    saver = InMemorySaver()
    summarizer = Recorder()
    first = CompactionNode(summarizer, OPTIONS, result_key="compaction", features=prepared(in_store=True))

    def build(node: CompactionNode) -> Any:
        def agent(state: dict[str, Any]) -> dict[str, Any]:
            return {"messages": [AIMessage(words("answer"), id=f"a{len(state['messages'])}")]}

        builder = StateGraph(CompactionState)
        builder.add_node("compact", node)
        builder.add_node("agent", agent)
        builder.add_edge(START, "compact")
        builder.add_edge("compact", "agent")
        return builder.compile(checkpointer=saver, store=store)

    config = {"configurable": {"thread_id": "user.123"}}  # a '.' is not a valid namespace label
    worker_a = build(first)
    number = until_preparing(worker_a, config)
    namespace = (STORE_NAMESPACE, thread_label("user.123"))
    wait_for(lambda: bool(store.search(namespace)))
    # The next turns run on another worker, which has nothing in memory.
    other = Recorder()
    worker_b = build(CompactionNode(other, OPTIONS, result_key="compaction", features=prepared(in_store=True)))
    for later in range(number, number + 80):
        out = worker_b.invoke({"messages": [HumanMessage(words(f"q{later}"), id=f"h{later}")]}, config)
        if out.get("compaction"):
            break
    assert out["compaction"]["parts"]["prepared"]["applied"] is True
    assert other.requests == [] or other.threads[0] == "langchain-compaction-prepare"
    compacted = worker_b.get_state(config).values["messages"]
    assert "summary 1" in str(compacted[0].content)
    # The applied preparation stays until the conversation moves past it (a
    # worker killed before its checkpoint was written, retried, applies it
    # again: the same compaction, archived once); it can never match again.
    stale = [PreparedSummary.from_value(item.value) for item in store.search(namespace)]
    assert not any(p.matches(compacted) for p in stale)


def test_a_retried_threshold_turn_applies_the_preparation_its_first_try_applied() -> None:
    """A turn whose checkpoint never landed, run again, makes the same compaction, not one stored since.

    The first try applied the stored preparation (marking it applied) and
    archived what it removes; a larger preparation then reached the store
    (another worker's, without a lease). The retry, from the same checkpoint,
    applies the first one again: the compaction keeps its id, so the archive
    items the first try wrote are the retry's, not a second copy.
    """
    store = InMemoryStore()
    summarizer = Recorder()
    node = CompactionNode(summarizer, OPTIONS, result_key="compaction", features=[*prepared(in_store=True), Archive()])
    app = graph(node, store=store)
    thread = "user.7"
    config = cfg(thread)
    number = until_preparing(app, config)
    namespace = (STORE_NAMESPACE, thread_label(thread))
    wait_for(lambda: bool(store.search(namespace)))
    # Turns until the one that compacts; the checkpoint before it is where a retry starts.
    for turn in range(number, number + 80):
        before = app.get_state(config)
        ask = HumanMessage(words(f"q{turn}"), id=f"h{turn}")
        first = app.invoke({"messages": [ask]}, config)
        if first.get("compaction"):
            break
    assert first["compaction"]["parts"]["prepared"]["applied"] is True
    first_mark = next(m for m in first["messages"] if is_summary_message(m)).additional_kwargs[SUMMARY_MARK]
    archived = store.search((ARCHIVE_NAMESPACE, thread_label(thread)), limit=1_000)
    assert archived
    assert {i.value["lineage"] for i in archived} == {first_mark["lineage"][-1]}
    # A larger preparation of the same messages reaches the store after the first try applied its own.
    (applied,) = [PreparedSummary.from_value(i.value) for i in store.search(namespace)]
    messages = [*before.values["messages"], ask]
    larger = replace(
        applied,
        size=len(messages),
        digest=prefix_digest(messages),
        written=tuple(m.model_copy(update={"content": "## Goal\n- a larger preparation"}) for m in applied.written),
        kept=tuple(range(applied.kept[-1] + 1, len(messages))),  # its cut is later: it removes more
    )
    store.put(namespace, larger.digest, larger.to_value())
    retry = app.invoke({"messages": [ask]}, before.config)
    assert retry["compaction"]["parts"]["prepared"]["applied"] is True
    mark = next(m for m in retry["messages"] if is_summary_message(m)).additional_kwargs[SUMMARY_MARK]
    assert mark["lineage"] == first_mark["lineage"]
    assert retry["compaction"]["parts"]["archive"] == {"archived": 0, "present": len(archived)}
    assert len(store.search((ARCHIVE_NAMESPACE, thread_label(thread)), limit=1_000)) == len(archived)


def test_two_workers_prepare_a_thread_once_under_a_lease(tmp_path: Any) -> None:
    # Each worker opens its own lease file descriptor, as separate processes do.
    gate = threading.Event()
    summarizer = Recorder(gate=gate)

    def lease(thread: str) -> FileLock:
        return FileLock(tmp_path / f"{thread_label(thread)}.lock")

    nodes = [CompactionNode(summarizer, OPTIONS, features=prepared(lease=lease)) for _ in range(2)]
    messages: list[BaseMessage] = []
    for number in range(40):
        messages += [HumanMessage(words(f"q{number}"), id=f"h{number}"), AIMessage(words("a"), id=f"a{number}")]
        if nodes[0].context_tokens(messages) > PrepareAhead(at=0.7).bind(OPTIONS).mark:  # type: ignore[operator]
            break
    config = {"configurable": {"thread_id": "shared"}}
    try:
        for node in nodes:
            assert node.invoke({"messages": messages}, config) == {}
        wait_for(lambda: len(summarizer.requests) >= 1)
        time.sleep(0.1)
        assert len(summarizer.requests) == 1  # the second worker did not get the lease
    finally:
        gate.set()


# -- the middleware and chat memory -----------------------------------------------------------


def test_the_middleware_applies_a_prepared_summary() -> None:
    from langchain.agents import create_agent
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel

    summarizer = Recorder()
    results: list[Any] = []
    middleware = CompactionMiddleware(summarizer, OPTIONS, on_compaction=results.append, features=prepared())
    replies = iter([AIMessage(words("reply")) for _ in range(200)])
    agent = create_agent(GenericFakeChatModel(messages=replies), middleware=[middleware], checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "agent"}}
    for number in range(80):
        calls_before = len(summarizer.requests)
        agent.invoke({"messages": [HumanMessage(words(f"q{number}"))]}, config)
        if results:
            break
        settle(summarizer)
    assert results[0].part("prepared")["applied"] is True
    assert calls_before == len(summarizer.requests) == 1


def test_chat_memory_commits_a_prepared_summary_and_keeps_what_came_after() -> None:
    summarizer = Recorder()
    archive = InMemoryChatMessageHistory()
    history = CompactingChatMessageHistory(
        InMemoryChatMessageHistory(), summarizer, OPTIONS, archive=archive, features=prepared()
    )
    sent: list[BaseMessage] = []
    for number in range(80):
        pair = [HumanMessage(words(f"q{number}"), id=f"h{number}"), AIMessage(words("a"), id=f"a{number}")]
        sent += pair
        calls_before = len(summarizer.requests)
        history.add_messages(pair)
        if any(is_summary_message(m) for m in history.messages):
            break
        settle(summarizer)
    assert calls_before == len(summarizer.requests) == 1
    assert summarizer.threads == ["langchain-compaction-prepare"]
    stored = history.messages
    # Nothing lost: every message sent is in the store or in the archive, once.
    ids = [m.id for m in stored if not is_compaction_message(m)] + [m.id for m in archive.messages]
    assert sorted(i for i in ids if i) == sorted(m.id for m in sent if m.id)


# -- another compaction between a preparation and the threshold --------------------------------------


class Calls:
    """A plain-function summarizer that records which thread made each call."""

    def __init__(self) -> None:
        self.threads: list[str] = []

    def __call__(self, prompt: str) -> str:
        self.threads.append(threading.current_thread().name)
        return "## Goal\n- x"

    @property
    def background(self) -> int:
        """Calls made by background preparations."""
        return sum(1 for name in self.threads if name == "langchain-compaction-prepare")


def no_index_error(app: Any, text: str, config: dict[str, Any]) -> Any:
    """One turn of ``app``; a bare IndexError (a stale preparation measured against a shorter list) fails the test."""
    try:
        return app.invoke({"messages": [HumanMessage(text)]}, config)
    except IndexError as error:
        pytest.fail(f"a turn raised a bare IndexError: {error!r}")


@pytest.mark.parametrize("in_store", [False, True], ids=["local", "in_store"])
def test_two_node_instances_alternating_turns_never_raise_index_error(in_store: bool) -> None:
    """Two workers serving one thread: a preparation made before the other's compaction never breaks a turn."""
    saver = InMemorySaver()
    store = InMemoryStore() if in_store else None
    calls = Calls()
    a = CompactionNode(calls, PREPARE_OPTS, result_key="compaction", features=prepared(wait=0.5, in_store=in_store))
    b = CompactionNode(calls, PREPARE_OPTS, result_key="compaction", features=prepared(wait=0.5, in_store=in_store))
    ga, gb = graph_with(a, saver=saver, store=store), graph_with(b, saver=saver, store=store)
    config = cfg("workers")
    compacted = False
    for turn in range(90):
        graph = ga if turn % 2 == 0 else gb
        # Short turns until the first compaction, longer ones after it (real turns vary), so the
        # preparation mark is passed again with fewer messages than the stale preparation was made from.
        size = 250 if compacted else 40
        state = no_index_error(graph, words(f"q{turn}", size), config)
        wait_for_preparations(a, b, thread="workers")
        compacted = compacted or any(is_summary_message(m) for m in state["messages"])
    assert compacted
    assert calls.background, "no summary was ever prepared in the background: nothing stale was exercised"


def test_compact_command_between_preparation_and_threshold() -> None:
    """A /compact after a preparation finished never makes a later turn fail on the stale preparation."""
    node = CompactionNode(
        short_summary, PREPARE_OPTS, result_key="compaction", features=prepared(wait=0.5), enable_compact_command=True
    )
    graph = graph_with(node, route=True)
    config = cfg("cmd")
    prepare = prepare_of(node)
    commanded = False
    for turn in range(70):
        messages = graph.get_state(config).values.get("messages", [])
        if not commanded and messages and prepare.finished(Conversation("cmd"), messages) is not None:
            before = len(messages)
            state = graph.invoke({"messages": [HumanMessage("/compact")]}, config)
            assert len(state["messages"]) < before  # the command compacted
            commanded = True
        size = 250 if commanded else 40
        no_index_error(graph, words(f"q{turn}", size), config)
        wait_for_preparations(node, thread="cmd")
    assert commanded, "no preparation ever finished, so /compact never came between one and the threshold"


def test_compact_thread_between_preparation_and_threshold() -> None:
    """compact_thread after a preparation finished never makes a later turn fail on the stale preparation."""
    node = CompactionNode(short_summary, PREPARE_OPTS, result_key="compaction", features=prepared(wait=0.5))
    graph = graph_with(node)
    config = cfg("manual")
    prepare = prepare_of(node)
    done = False
    for turn in range(70):
        messages = graph.get_state(config).values.get("messages", [])
        if not done and messages and prepare.finished(Conversation("manual"), messages) is not None:
            assert compact_thread(graph, config) is not None
            done = True
        size = 250 if done else 40
        no_index_error(graph, words(f"q{turn}", size), config)
        wait_for_preparations(node, thread="manual")
    assert done, "no preparation ever finished, so compact_thread never came between one and the threshold"


class OverflowOnce(ToolCallingFake):
    """A fake chat model that rejects one request as too long when `overflow` is set."""

    overflow: bool = False

    def _generate(self, *args: Any, **kwargs: Any) -> Any:
        if self.overflow:
            self.overflow = False
            raise ContextOverflowError("prompt is too long")
        return super()._generate(*args, **kwargs)


def test_context_overflow_in_the_middleware_between_preparation_and_threshold() -> None:
    """An overflow compaction in the middleware after a preparation finished never breaks a later call."""
    middleware = CompactionMiddleware(short_summary, PREPARE_OPTS, features=prepared(wait=0.5))
    model = OverflowOnce(messages=iter([AIMessage(words("reply", 20)) for _ in range(300)]))
    agent = create_agent(model, middleware=[middleware], checkpointer=InMemorySaver())
    config = cfg("overflow")
    prepare = prepare_of(middleware)
    overflowed = False
    for turn in range(80):
        messages = agent.get_state(config).values.get("messages", [])
        if not overflowed and messages and prepare.finished(Conversation("overflow"), messages) is not None:
            model.overflow = overflowed = True
        size = 250 if overflowed else 40
        no_index_error(agent, words(f"q{turn}", size), config)
        wait_for_preparations(middleware, thread="overflow")
    assert overflowed, "no preparation ever finished, so no overflow came between one and the threshold"
    assert not model.overflow  # the overflow happened and was recovered


# -- a store that cannot be searched -----------------------------------------------------------------


class FlakySearchStore(InMemoryStore):
    """An InMemoryStore whose search fails (ConnectionError) while `failures` > 0 (-1: always)."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    def _maybe_fail(self) -> None:
        if self.failures:
            self.failures -= 1 if self.failures > 0 else 0
            raise ConnectionError("the store is unreachable")

    def search(self, *args: Any, **kwargs: Any) -> Any:
        self._maybe_fail()
        return super().search(*args, **kwargs)

    async def asearch(self, *args: Any, **kwargs: Any) -> Any:
        self._maybe_fail()
        return await super().asearch(*args, **kwargs)


def test_failing_store_search_never_surfaces_in_a_turn() -> None:
    """A store that cannot be searched never fails a turn of PrepareAhead(in_store=True); the thread compacts."""
    store = FlakySearchStore(failures=-1)
    node = CompactionNode(
        short_summary, PREPARE_OPTS, result_key="compaction", features=prepared(wait=0.5, in_store=True)
    )
    graph = graph_with(node, store=store)
    for turn in range(60):
        try:
            state = graph.invoke({"messages": [HumanMessage(words(f"q{turn}"))]}, cfg("flaky"))
        except ConnectionError as error:
            pytest.fail(f"turn {turn} raised {type(error).__name__}: {error}")
        wait_for_preparations(node, thread="flaky")
    assert state.get("compaction"), "the thread never compacted"


def test_one_transient_search_error_does_not_stall_the_threshold_turn() -> None:
    """One failed store search never makes the threshold turn wait for a preparation that never runs."""
    wait = 1.5
    store = FlakySearchStore(failures=1)
    node = CompactionNode(
        short_summary, PREPARE_OPTS, result_key="compaction", features=prepared(wait=wait, in_store=True)
    )
    graph = graph_with(node, store=store)
    config = cfg("transient")
    prepare = prepare_of(node)
    state: dict[str, Any] = {}
    for turn in range(60):
        started = time.monotonic()
        try:
            state = graph.invoke({"messages": [HumanMessage(words(f"q{turn}"))]}, config)
        except ConnectionError as error:
            pytest.fail(f"turn {turn} raised {type(error).__name__}: {error}")
        elapsed = time.monotonic() - started
        # Short: a preparation that never runs must not be waited for here either.
        deadline = time.monotonic() + 0.5
        while prepare.running(Conversation("transient")) and time.monotonic() < deadline:
            time.sleep(0.01)
        if state.get("compaction"):
            break
    result = state.get("compaction")
    assert result, "the thread never compacted"
    assert store.failures == 0, "the transient failure did not happen"
    applied = result["parts"]["prepared"]["applied"]
    assert applied or elapsed < wait - 0.5, (
        f"the threshold turn took {elapsed:.2f}s waiting for a preparation that never ran "
        f"(applied={applied}, reported wait_seconds={result['wait_seconds']:.3f})"
    )
    assert result["wait_seconds"] >= elapsed * 0.5 or elapsed < 0.2, (
        "wait_seconds does not report the time the turn waited"
    )


# -- the window, and how many preparations are kept --------------------------------------------------


def test_window_from_the_model_profile_reaches_the_cache_and_preparer() -> None:
    """A window learnt from the model's profile is the one preparations are made and applied with."""
    results: list[Any] = []
    middleware = CompactionMiddleware(
        short_summary, CompactionOptions(), features=prepared(wait=1.0), on_compaction=results.append
    )
    model = ToolCallingFake(
        messages=iter([AIMessage(words("reply", 40)) for _ in range(200)]), profile={"max_input_tokens": 4_000}
    )
    agent = create_agent(model, middleware=[middleware], checkpointer=InMemorySaver())
    for turn in range(60):
        agent.invoke({"messages": [HumanMessage(words(f"q{turn}", 40))]}, cfg("profile"))
        wait_for_preparations(middleware, thread="profile")
        if results:
            break
    options = middleware.options
    assert options.context_window == 4_000  # learned
    # The preparation mark follows the learned window ...
    assert prepare_of(middleware).mark == round(options.budget.threshold * 0.7)
    # ... a preparation was made and applied at the threshold ...
    assert results, "nothing was compacted"
    assert results[0].parts["prepared"]["applied"], "the learned window never prepared a summary"
    # ... and what it made was planned for the learned window: it lands near that window's landing target
    # (a prepared compaction also keeps what the turns after its preparation added: up to half the reserve).
    budget = options.budget
    assert results[0].compacted_tokens <= budget.landing + budget.reserve // 2, (results[0].compacted_tokens, budget)


class Counting:
    """A cheap plain-function summarizer that counts its calls (thread-safe)."""

    def __init__(self) -> None:
        self.calls = 0
        self._lock = threading.Lock()

    def __call__(self, prompt: str) -> str:
        with self._lock:
            self.calls += 1
        return "## Goal\n- x"


def test_preparer_does_not_keep_a_summary_for_every_thread_ever_seen() -> None:
    """A process keeps finished preparations for a bounded number of threads, not for every thread ever seen."""
    threads = 1_500
    summarizer = Counting()
    # Only PrepareAhead (no checked facts) and a short history: 1,500 cheap preparations.
    node = CompactionNode(summarizer, PREPARE_OPTS, features=[PrepareAhead(at=0.7, wait=0.5)])
    prepare = prepare_of(node)
    history = long_history(14, 160)
    assert prepare.mark < node.context_tokens(history) < PREPARE_OPTS.budget.threshold
    for n in range(threads):
        node.invoke({"messages": history}, cfg(f"user-{n}"))
    try:
        wait_for(lambda: summarizer.calls >= threads, 2.0)  # every thread's preparation ran
    except AssertionError:
        pytest.fail(f"only {summarizer.calls} of {threads} background preparations ran")
    time.sleep(0.05)
    kept = sum(1 for n in range(threads) if prepare.finished(Conversation(f"user-{n}"), history) is not None)
    assert 0 < kept <= prepare.remember < threads, f"{kept} finished preparations kept for {threads} threads"


# -- a large fixed part (a long system prompt) ----------------------------------------------

LONG_PROMPT = "You are a careful assistant; follow every rule of the house style. " * 110  # ~40% of the threshold


def _compactions_and_calls(turn: Any, summarizer: Recorder, results: list[dict[str, Any]], turns: int) -> None:
    """Run ``turns`` turns (a preparation is given time to finish before each); check calls against compactions."""
    for number in range(turns):
        settle(summarizer)
        record = turn(number)
        if record:
            results.append(record)
    assert len(results) >= 4
    # About one summary call per compaction: at most the one being prepared at the end besides.
    assert len(summarizer.requests) <= len(results) + 1, (len(summarizer.requests), len(results))
    assert all(r["parts"]["prepared"]["applied"] for r in results[1:])


def test_a_long_system_prompt_moves_the_preparation_mark_up_with_the_landing() -> None:
    """A fixed part raises where a compaction lands; past the old mark, a preparation started on every turn."""
    options = PREPARE_OPTS
    budget = options.with_fixed(1_400).budget
    feature = PrepareAhead(at=0.7)
    assert feature.mark_for(options.budget) == feature.bind(options).mark
    mark = feature.mark_for(budget)
    assert mark is not None
    assert budget.landing is not None
    assert budget.threshold is not None
    assert budget.landing < mark < budget.threshold
    # The same place between the landing and the threshold as 0.7 of it with nothing fixed.
    assert abs((mark - budget.landing) / (budget.threshold - budget.landing) - 0.4) < 0.01

    summarizer = Recorder()
    node = CompactionNode(summarizer, options, result_key="compaction", features=prepared())
    app = graph(node)
    config = {"configurable": {"thread_id": "long-prompt"}}
    results: list[dict[str, Any]] = []

    def turn(number: int) -> Any:
        first = [SystemMessage(LONG_PROMPT, id="system")] if number == 0 else []
        return app.invoke({"messages": [*first, HumanMessage(words(f"q{number}"), id=f"h{number}")]}, config).get(
            "compaction"
        )

    _compactions_and_calls(turn, summarizer, results, 120)


def test_a_long_agent_system_prompt_prepares_once_per_compaction_in_the_middleware() -> None:
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel

    summarizer = Recorder()
    results: list[dict[str, Any]] = []
    middleware = CompactionMiddleware(
        summarizer, PREPARE_OPTS, on_compaction=lambda r: results.append(r.to_dict()), features=prepared()
    )
    replies = iter([AIMessage(words("reply")) for _ in range(400)])
    agent = create_agent(
        GenericFakeChatModel(messages=replies),
        system_prompt=LONG_PROMPT,
        middleware=[middleware],
        checkpointer=InMemorySaver(),
    )
    config = {"configurable": {"thread_id": "agent-long-prompt"}}

    def turn(number: int) -> None:
        agent.invoke({"messages": [HumanMessage(words(f"q{number}"))]}, config)

    _compactions_and_calls(turn, summarizer, results, 120)


def test_chat_memory_made_per_call_applies_what_the_last_wrapper_prepared() -> None:
    """RunnableWithMessageHistory builds a wrapper (and its features) per call: preparations carry over by session."""
    import itertools

    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.runnables.history import RunnableWithMessageHistory

    from langchain_compaction.features import default_features

    calls = itertools.count()

    def summarizer(prompt: str) -> str:
        next(calls)
        time.sleep(0.02)
        return "## Goal\n- answer the questions"

    store, archive = InMemoryChatMessageHistory(), InMemoryChatMessageHistory()
    options = CompactionOptions(context_window=2_000, reserve_tokens=500, keep_recent_tokens=300)

    def session(session_id: str) -> CompactingChatMessageHistory:
        features = [*default_features(), PrepareAhead(at=0.7)]
        return CompactingChatMessageHistory(store, summarizer, options, archive=archive, features=features)

    model = GenericFakeChatModel(messages=(AIMessage(f"answer {i} " * 20) for i in itertools.count()))
    chain = RunnableWithMessageHistory(model, session)
    for turn in range(60):
        chain.invoke([HumanMessage(f"question {turn} " * 20)], {"configurable": {"session_id": "s"}})
        time.sleep(0.03)  # the next user message takes a moment: a preparation finishes meanwhile
    compactions = store.messages[0].additional_kwargs[SUMMARY_MARK]["compaction"]
    made = next(calls)
    assert compactions >= 8
    assert made <= 1.5 * compactions, f"{made} summary calls for {compactions} compactions"


def test_a_conversation_reads_only_its_own_stored_preparations_not_a_sub_agents_below_it() -> None:
    """A store search reads the namespaces under one too: a sub-agent's preparations are neither its parent's
    to apply, nor to prune, nor to count as discarded."""
    from langchain_compaction.core.effects import drive
    from langchain_compaction.features.prepared import read_prepared

    store = InMemoryStore()
    node = CompactionNode(Recorder(), OPTIONS, result_key="compaction", features=prepared(in_store=True))
    app = graph(node, store=store)
    thread = "user.9"
    until_preparing(app, cfg(thread))
    namespace = (STORE_NAMESPACE, thread_label(thread))
    wait_for(lambda: bool(store.search(namespace)))
    (mine,) = store.search(namespace)
    below = (*namespace, "researcher")
    store.put(below, mine.key, {k: v for k, v in mine.value.items() if k != "applied"})
    store.delete(namespace, mine.key)
    found, discarded = drive(read_prepared(store, Conversation(thread), [], prune=True))
    assert found is None
    assert discarded == (0, 0)
    assert store.search(below), "the sub-agent's preparation stays"


def test_a_prepared_summary_applied_with_a_pin_records_the_first_message_it_kept_not_the_pin() -> None:
    """The pin, written back from before the cut, came first after the summary and was recorded as kept_from.

    Its position then renumbered every kept message from the pin's, and a
    summary put back in place would have taken the wrong span as covered.
    """
    from langchain_compaction.features import CheckedFacts, Pins

    options = CompactionOptions(
        context_window=4_000, reserve_tokens=500, keep_recent_tokens=400, summary_input_tokens=50_000
    )
    summarizer = Recorder()
    history = CompactingChatMessageHistory(
        InMemoryChatMessageHistory(),
        summarizer,
        options,
        archive=InMemoryChatMessageHistory(),
        features=[CheckedFacts(), Pins(), PrepareAhead(at=0.7)],
    )
    history.add_messages(
        [HumanMessage("PIN: always use tabs", id="pin", additional_kwargs={"compaction_pin": True}), AIMessage("ok")]
    )
    summary = None
    for n in range(80):
        history.add_messages([HumanMessage(words(f"q{n}"), id=f"h{n}"), AIMessage(words("a"), id=f"a{n}")])
        summary = next((m for m in history.messages if is_summary_message(m)), None)
        if summary is not None:
            break
        deadline = time.monotonic() + 5
        while any(t.name == "langchain-compaction-prepare" for t in threading.enumerate()):
            assert time.monotonic() < deadline
            time.sleep(0.01)
    assert summary is not None
    assert "langchain-compaction-prepare" in summarizer.threads  # (a prepared summary was applied)
    stored = history.messages
    after = [m.id for m in stored[stored.index(summary) + 1 :] if not is_compaction_message(m)]
    assert after[0] == "pin"
    assert summary.additional_kwargs[SUMMARY_MARK]["kept_from"] == after[1]


def test_a_prepared_summary_applied_over_a_pinned_todo_list_keeps_the_archive_in_conversation_order() -> None:
    """Through the node: the latest write_todos exchange (pinned by default) is written back after the summary.

    The prepared summary recorded the pin as the first message it kept, so
    the count resumed at the pin's old position: later compactions filed
    their messages at positions earlier ones had used (18 of 40 twice), and
    ``Archive(max_messages=...)`` deleted newer messages before older ones.
    """
    from langchain_core.tools import tool
    from langgraph.graph import END
    from langgraph.prebuilt import ToolNode

    from langchain_compaction.features import default_features

    @tool
    def write_todos(todos: list[str]) -> str:
        """Write the todo list."""
        return f"Updated the todo list ({len(todos)} items)."

    sent = [0]

    def marker() -> str:
        sent[0] += 1
        return f"M{sent[0]:04d}"

    def agent(state: dict[str, Any]) -> dict[str, Any]:
        said = marker()
        if sent[0] < 4:
            call = {"name": "write_todos", "args": {"todos": ["a", "b"]}, "id": "todos", "type": "tool_call"}
            return {"messages": [AIMessage(f"{said} todos", id=f"a-{said}", tool_calls=[call])]}
        return {"messages": [AIMessage(f"{said} " + "the outlook is drafted in full " * 20, id=f"a-{said}")]}

    options = CompactionOptions(
        context_window=6_000, reserve_tokens=600, keep_recent_tokens=800, summary_max_tokens=1_500
    )
    node = CompactionNode(
        lambda p: "## Goal\n- write the report",
        options,
        features=[*default_features(), PrepareAhead(at=0.7, wait=2.0), Archive()],
    )
    builder = StateGraph(CompactionState)
    builder.add_node("compact", node)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode([write_todos]))
    builder.add_edge(START, "compact")
    builder.add_edge("compact", "agent")
    builder.add_conditional_edges("agent", lambda v: "tools" if v["messages"][-1].tool_calls else END)
    builder.add_edge("tools", "compact")
    store = InMemoryStore()
    graph = builder.compile(checkpointer=InMemorySaver(), store=store)
    config = {"configurable": {"thread_id": "todos"}}
    for _ in range(30):
        said = marker()
        graph.invoke({"messages": [HumanMessage(f"{said} " + "please go on with the report " * 25)]}, config)
        deadline = time.monotonic() + 5
        while any(t.name == "langchain-compaction-prepare" for t in threading.enumerate()):
            assert time.monotonic() < deadline
            time.sleep(0.01)
    items = sorted(store.search((ARCHIVE_NAMESPACE,), limit=10_000), key=lambda i: i.value["position"])
    assert max(i.value["compaction"] for i in items) >= 2
    positions = [i.value["position"] for i in items]
    assert len(positions) == len(set(positions))
    # In position order, the messages come in the order they were sent.
    markers = [str(i.value["message"]["data"]["content"])[:5] for i in items if i.value["role"] != "tool"]
    assert markers == sorted(markers)


@pytest.mark.parametrize("given", ["features", "deprecated keyword"])
def test_chat_memory_with_a_lock_and_a_slow_preparation_still_compacts_at_the_threshold(
    tmp_path: Any, given: str
) -> None:
    """A preparation that held the lock's lease kept its own process's threshold from summarizing.

    The threshold took the lease as another writer's summary and went on, so
    the stored history outgrew the window (2,875 tokens in a 2,000 window).
    """
    from langchain_compaction.tokens import estimate_message_tokens

    lock = FileLock(str(tmp_path / "chat.lock"))

    def slow(prompt: str) -> str:
        time.sleep(1.0)
        return "## Goal\n- chat"

    options = CompactionOptions(context_window=2_000, reserve_tokens=500, keep_recent_tokens=300)
    if given == "features":
        history = CompactingChatMessageHistory(
            InMemoryChatMessageHistory(), slow, options, lock=lock, features=[PrepareAhead(at=0.7)]
        )
    else:
        with pytest.warns(DeprecationWarning, match="prepare_at"):
            options = replace(options, prepare_at=0.7)  # type: ignore[call-arg]
        history = CompactingChatMessageHistory(InMemoryChatMessageHistory(), slow, options, lock=lock)
    worst = 0
    for i in range(30):
        history.add_messages([HumanMessage(f"question {i} " * 12), AIMessage(f"answer {i} " * 12)])
        worst = max(worst, estimate_message_tokens(history.messages))
    wait_for(lambda: not any(t.name == "langchain-compaction-prepare" for t in threading.enumerate()))
    assert worst <= 2_000


def test_a_prepared_summary_that_would_leave_a_tool_output_too_large_for_the_window_is_made_on_the_spot() -> None:
    # Prepared before the tool ran, the summary would keep its 20,000-token output verbatim after it (a request
    # five times the window, sent to the model); made now, the compaction summarizes the exchange and says so.
    summarizer = Recorder()
    node = CompactionNode(summarizer, OPTIONS, result_key="compaction", features=prepared())
    app = graph(node)
    config = {"configurable": {"thread_id": "huge"}}
    until_preparing(app, config)
    settle(summarizer)
    call = {"name": "read_file", "args": {"path": "dump.log"}, "id": "big1", "type": "tool_call"}
    step = [
        HumanMessage("read the whole log", id="hbig"),
        AIMessage("", tool_calls=[call], id="abig"),
        ToolMessage(words("log-line", 15_000), tool_call_id="big1", id="tbig"),
    ]
    out = app.invoke({"messages": step}, config)
    assert out["compaction"]["parts"]["prepared"]["applied"] is False
    assert estimate_message_tokens(out["messages"]) < OPTIONS.context_window
    assert "too large to keep" in str(out["messages"][1].content)
