"""The ten reported defects of 0.2 (ac710e2), ported to the features API: what users need of each.

Each test asserts the correct behaviour the original reproduction asserted
(scratch ``test_repro.py``), through the public API only: real LangGraph graphs
with ``InMemorySaver`` / ``InMemoryStore``, ``create_agent`` with fake chat
models, plain-function or recording summarizers; no mock of the library and no
private attribute. Background preparations are waited for through the public
``PrepareAhead.running`` / ``finished`` of ``adapter.features``.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter
from collections.abc import Sequence
from typing import Annotated, Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain_core.exceptions import ContextOverflowError
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.errors import GraphRecursionError
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode
from langgraph.store.memory import InMemoryStore
from test_prepared import wait_for
from typing_extensions import TypedDict

from langchain_compaction import (
    CompactionError,
    CompactionMiddleware,
    CompactionNode,
    CompactionOptions,
    acompact,
    compact,
)
from langchain_compaction._lc.conversation import Conversation, conversation_of, thread_label
from langchain_compaction._lc.convert import SUMMARY_MARK, is_compaction_message, is_summary_message
from langchain_compaction.core.types import SummaryRequest
from langchain_compaction.errors import SummaryTimeoutError
from langchain_compaction.features import Archive, CacheAligned, PrepareAhead, default_features
from langchain_compaction.graph import CompactionState, acompact_thread, compact_thread, route_after_compaction

ARCHIVE_NS = "compaction_archive"
OPTIONS = CompactionOptions(context_window=3_000)
PREPARE_OPTS = CompactionOptions(
    context_window=4_000, reserve_tokens=500, keep_recent_tokens=400, summary_input_tokens=50_000
)


# -- helpers ----------------------------------------------------------------------------


def summarize(prompt: str) -> str:
    return "## Goal\n- x"


def words(label: str, n: int = 60) -> str:
    return f"{label} " + "word " * n


def cfg(thread: object) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}}


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


def prepared(**kw: Any) -> list[Any]:
    """The default features, and summaries prepared past 70% of the threshold."""
    return [*default_features(), PrepareAhead(at=0.7, **kw)]


def archived(**kw: Any) -> list[Any]:
    """The default features, and the archive."""
    return [*default_features(), Archive(**kw)]


def prepare_of(adapter: Any) -> PrepareAhead:
    """The adapter's PrepareAhead feature (public: ``adapter.features``)."""
    return next(f for f in adapter.features if isinstance(f, PrepareAhead))


def settle(*adapters: Any, thread: object = None, messages: Sequence[BaseMessage] = (), seconds: float = 3.0) -> None:
    """Wait until the adapters' background preparations of one conversation have finished."""
    conversation = conversation_of(cfg(thread) if thread is not None else None, messages)
    features = [prepare_of(a) for a in adapters]
    wait_for(lambda: not any(f.running(conversation) for f in features), seconds)
    time.sleep(0.01)  # and handed their result back


class ToolCallingFake(GenericFakeChatModel):
    """GenericFakeChatModel with bind_tools, so create_agent can give it tools."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> ToolCallingFake:
        return self


class Recorder:
    """A summarizer (the library's Summarizer protocol) that records every request."""

    def __init__(self, reply: str = "## Goal\n- x") -> None:
        self.reply = reply
        self.requests: list[SummaryRequest] = []

    @property
    def name(self) -> str:
        return "recorder"

    def summarize(self, request: SummaryRequest) -> str:
        self.requests.append(request)
        return self.reply

    async def asummarize(self, request: SummaryRequest) -> str:
        self.requests.append(request)
        return self.reply


def graph_with(node: CompactionNode, *, saver: Any = None, store: Any = None, route: bool = False) -> Any:
    """START -> compact -> agent -> END (the agent answers with a short reply)."""

    def agent(state: dict[str, Any]) -> dict[str, Any]:
        return {"messages": [AIMessage(words("answer", 20), id=f"a-{time.monotonic_ns()}")]}

    builder = StateGraph(CompactionState)
    builder.add_node("compact", node)
    builder.add_node("agent", agent)
    builder.add_edge(START, "compact")
    if route:
        builder.add_conditional_edges("compact", lambda s: route_after_compaction(s, goto="agent"), ["agent", END])
    else:
        builder.add_edge("compact", "agent")
    builder.add_edge("agent", END)
    return builder.compile(checkpointer=saver if saver is not None else InMemorySaver(), store=store)


def archive_items(store: Any, thread: object) -> list[Any]:
    """Every archived item of a thread (its own graph's and its sub-agents')."""
    return store.search((ARCHIVE_NS, thread_label(thread)), limit=100_000)


def no_index_error(app: Any, text: str, config: dict[str, Any]) -> Any:
    """One turn of ``app``; a bare IndexError (a stale preparation measured against a shorter list) fails the test."""
    try:
        return app.invoke({"messages": [HumanMessage(text)]}, config)
    except IndexError as error:
        pytest.fail(f"a turn raised a bare IndexError: {error!r}")


def _long_history(n: int = 40, size: int = 60) -> list[BaseMessage]:
    out: list[BaseMessage] = []
    for i in range(n):
        out.append(
            HumanMessage(words(f"q{i}", size), id=f"h{i}")
            if i % 2 == 0
            else AIMessage(words(f"a{i}", size), id=f"a{i}")
        )
    return out


# == 1. a preparation made before a compaction the preparer did not make =====================


@pytest.mark.parametrize("in_store", [False, True], ids=["local", "in_store"])
def test_item_1_two_node_instances_alternating_turns_never_raise_index_error(in_store: bool) -> None:
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
        settle(a, b, thread="workers")
        compacted = compacted or any(is_summary_message(m) for m in state["messages"])
    assert compacted
    assert calls.background, "no summary was ever prepared in the background: nothing stale was exercised"


def test_item_1_compact_command_between_preparation_and_threshold() -> None:
    """A /compact after a preparation finished never makes a later turn fail on the stale preparation."""
    node = CompactionNode(
        summarize, PREPARE_OPTS, result_key="compaction", features=prepared(wait=0.5), enable_compact_command=True
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
        settle(node, thread="cmd")
    assert commanded, "no preparation ever finished, so /compact never came between one and the threshold"


def test_item_1_compact_thread_between_preparation_and_threshold() -> None:
    """compact_thread after a preparation finished never makes a later turn fail on the stale preparation."""
    node = CompactionNode(summarize, PREPARE_OPTS, result_key="compaction", features=prepared(wait=0.5))
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
        settle(node, thread="manual")
    assert done, "no preparation ever finished, so compact_thread never came between one and the threshold"


class OverflowOnce(ToolCallingFake):
    """A fake chat model that rejects one request as too long when `overflow` is set."""

    overflow: bool = False

    def _generate(self, *args: Any, **kwargs: Any) -> Any:
        if self.overflow:
            self.overflow = False
            raise ContextOverflowError("prompt is too long")
        return super()._generate(*args, **kwargs)


def test_item_1_context_overflow_in_the_middleware_between_preparation_and_threshold() -> None:
    """An overflow compaction in the middleware after a preparation finished never breaks a later call."""
    middleware = CompactionMiddleware(summarize, PREPARE_OPTS, features=prepared(wait=0.5))
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
        settle(middleware, thread="overflow")
    assert overflowed, "no preparation ever finished, so no overflow came between one and the threshold"
    assert not model.overflow  # the overflow happened and was recovered


# == 2. nested="parent" from inside a parent node function ===================================


def _sub_agent_graph(kind: str) -> Any:
    if kind == "middleware":
        model = ToolCallingFake(messages=iter([AIMessage(words("answer")) for _ in range(200)]))
        middleware = CompactionMiddleware(summarize, OPTIONS)
        return create_agent(model, middleware=[middleware], checkpointer=True)
    node = CompactionNode(summarize, OPTIONS)

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage(words("answer"))]}

    sub_builder = StateGraph(MessagesState)
    sub_builder.add_node("compact", node)
    sub_builder.add_node("agent", agent)
    sub_builder.add_edge(START, "compact")
    sub_builder.add_edge("compact", "agent")
    sub_builder.add_edge("agent", END)
    return sub_builder.compile(checkpointer=True)  # the sub-agent keeps its own conversation


@pytest.mark.parametrize("kind", ["node", "middleware"])
def test_item_2_subgraph_invoked_inside_a_parent_node_function_finishes(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A sub-agent called from a parent node function finishes, compacts its own state, and says nested='own'."""
    sub = _sub_agent_graph(kind)

    def parent_node(state: MessagesState, config: RunnableConfig) -> dict[str, Any]:
        out = sub.invoke({"messages": [state["messages"][-1]]})
        return {"messages": [out["messages"][-1]]}

    parent = StateGraph(MessagesState)
    parent.add_node("parent_node", parent_node)
    parent.add_edge(START, "parent_node")
    parent.add_edge("parent_node", END)
    graph = parent.compile(checkpointer=InMemorySaver())
    config = {**cfg("nested"), "recursion_limit": 25}
    with caplog.at_level(logging.WARNING, logger="langchain_compaction"):
        for turn in range(30):
            try:
                graph.invoke({"messages": [HumanMessage(words(f"q{turn}"))]}, config)
            except GraphRecursionError as error:
                pytest.fail(f"turn {turn}: the parent node re-ran until {type(error).__name__}")
    # The sub-agent's own conversation (kept under the parent's thread, namespace "parent_node") was compacted.
    saved = graph.checkpointer.get_tuple({"configurable": {"thread_id": "nested", "checkpoint_ns": "parent_node"}})
    assert saved is not None, "the sub-agent's own conversation was not checkpointed"
    sub_messages = saved.checkpoint["channel_values"]["messages"]
    assert any(is_summary_message(m) for m in sub_messages)
    assert len(sub_messages) < 60
    said = [r for r in caplog.records if r.name == "langchain_compaction" and "nested='own'" in r.getMessage()]
    assert len(said) == 1, [r.getMessage() for r in caplog.records]


# == 3. a pin added through update_state after the node saw the message unpinned =============


def test_item_3_pin_added_by_update_state_is_honoured_by_a_warm_node() -> None:
    """A message pinned later (same id, same content) is kept verbatim by a node that counted it unpinned."""
    node = CompactionNode(summarize, OPTIONS, result_key="compaction")
    graph = graph_with(node)
    config = cfg("pin")
    rule_text = "The production database is read-only until Friday."
    graph.invoke({"messages": [HumanMessage(rule_text, id="rule")]}, config)
    for turn in range(3):
        graph.invoke({"messages": [HumanMessage(words(f"q{turn}"))]}, config)
    # The user pins the rule now: same id, same content, pinned.
    pinned = HumanMessage(rule_text, id="rule", additional_kwargs={"compaction_pin": True})
    graph.update_state(config, {"messages": [pinned]})
    assert graph.get_state(config).values["messages"][0].additional_kwargs.get("compaction_pin") is True
    for turn in range(3, 40):
        state = graph.invoke({"messages": [HumanMessage(words(f"q{turn}"))]}, config)
        if state.get("compaction"):
            break
    assert state.get("compaction"), "no compaction happened"
    # Control: a fresh node instance, given the very state the warm one compacted, pins the rule.
    fresh = CompactionNode(summarize, OPTIONS, result_key="compaction")
    before = next(s for s in graph.get_state_history(config) if s.next == ("compact",)).values
    assert fresh.invoke(before, config)["compaction"]["parts"]["pins"]["pinned"] == 1
    assert state["compaction"]["parts"]["pins"]["pinned"] == 1
    assert any(m.id == "rule" for m in state["messages"]), "the pinned rule was summarized"


# == 4. compact_thread with the archive ======================================================


def _archived_graph() -> tuple[Any, Any, dict[str, Any]]:
    store = InMemoryStore()
    node = CompactionNode(summarize, OPTIONS, features=archived())
    graph = graph_with(node, store=store)
    config = cfg("manual-archive")
    for turn in range(6):
        graph.invoke({"messages": [HumanMessage(words(f"q{turn}"))]}, config)
    return graph, store, config


def test_item_4_compact_thread_with_archive_uses_the_graphs_store() -> None:
    """compact_thread on a graph with Archive() archives into the graph's store."""
    graph, store, config = _archived_graph()
    result = compact_thread(graph, config)
    assert result is not None
    assert result.messages_removed > 0
    assert len(archive_items(store, "manual-archive")) == result.messages_removed


async def test_item_4_acompact_thread_with_archive_uses_the_graphs_store() -> None:
    """acompact_thread on a graph with Archive() archives into the graph's store."""
    graph, store, config = _archived_graph()
    result = await acompact_thread(graph, config)
    assert result is not None
    assert result.messages_removed > 0
    assert len(archive_items(store, "manual-archive")) == result.messages_removed


# == 5. a transient request-only message written into the checkpoint ========================


class TransientNote(AgentMiddleware):
    """An outer middleware that adds a note to the model request only (never to the state)."""

    def wrap_model_call(self, request: Any, handler: Any) -> Any:
        return handler(request.override(messages=[*request.messages, HumanMessage("transient note")]))


def test_item_5_transient_request_message_is_not_written_into_the_state() -> None:
    """A message an outer middleware adds to the request only never lands in the checkpoint."""
    middleware = CompactionMiddleware(summarize, OPTIONS)
    model = ToolCallingFake(messages=iter([AIMessage(words("reply", 20)) for _ in range(50)]))
    agent = create_agent(
        model,
        system_prompt="You are careful. " * 200,  # a large prompt: only wrap_model_call sees it
        middleware=[TransientNote(), middleware],
        checkpointer=InMemorySaver(),
    )
    # First call of the thread: a history under the threshold on its own, over it with the prompt.
    history: list[BaseMessage] = []
    for i in range(14):
        history += [HumanMessage(words(f"q{i}")), AIMessage(words(f"a{i}"))]
    history.append(HumanMessage("go on"))
    state = agent.invoke({"messages": history}, cfg("transient"))
    if not any(is_summary_message(m) for m in state["messages"]):
        # The request was not the state's list (the note was added to it): the compaction made in the
        # model call may be left out of the state, for before_model to make on the next call.
        state = agent.invoke({"messages": [HumanMessage("and then?")]}, cfg("transient"))
    assert any(is_summary_message(m) for m in state["messages"]), "the state was never compacted"
    copies = sum(1 for m in state["messages"] if m.content == "transient note")
    assert copies == 0, f"{copies} copies of the request-only note were written into the state"
    saved = [s for s in agent.get_state_history(cfg("transient")) if "messages" in s.values]
    assert not [s for s in saved if any(m.content == "transient note" for m in s.values["messages"])]


# == 6. archive and time travel ==============================================================


def _archive_graph_with_recall(store: Any) -> tuple[Any, CompactionNode]:
    """compact -> agent -> (recall_messages through a ToolNode) in one graph, so recall runs in the branch."""
    node = CompactionNode(summarize, OPTIONS, features=archived(), result_key="compaction")
    tool = node.recall_tool(max_chars=200_000)

    def agent(state: CompactionState) -> dict[str, Any]:
        last = state["messages"][-1]
        if isinstance(last, HumanMessage) and str(last.content).startswith("RECALL "):
            query = str(last.content).split(" ", 1)[1]
            call = {"name": tool.name, "args": {"query": query, "limit": 50}, "id": "recall-1", "type": "tool_call"}
            return {"messages": [AIMessage("", tool_calls=[call])]}
        return {"messages": [AIMessage(words("answer", 30))]}

    builder = StateGraph(CompactionState)
    builder.add_node("compact", node)
    builder.add_node("agent", agent)
    builder.add_node("tools", ToolNode([tool]))
    builder.add_edge(START, "compact")
    builder.add_edge("compact", "agent")
    builder.add_conditional_edges("agent", lambda s: "tools" if s["messages"][-1].tool_calls else END, ["tools", END])
    builder.add_edge("tools", END)
    return builder.compile(checkpointer=InMemorySaver(), store=store), node


def _time_travel_session() -> tuple[Any, Any, dict[str, Any], int]:
    store = InMemoryStore()
    graph, _ = _archive_graph_with_recall(store)
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


def test_item_6a_forked_thread_archives_each_message_once_at_one_position() -> None:
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


def test_item_6b_recall_in_the_new_branch_does_not_return_the_abandoned_branch() -> None:
    """Recall in the new branch returns its own messages, never one only the abandoned branch had."""
    graph, _, config, fork_turn = _time_travel_session()
    state = graph.invoke({"messages": [HumanMessage("RECALL old")]}, config)
    answer = state["messages"][-1]
    assert isinstance(answer, ToolMessage)
    assert "id=old0]" in str(answer.content), str(answer.content)[:200]  # the shared history is recalled
    abandoned = [f"old{t}" for t in range(fork_turn + 1, 30)]
    leaked = [label for label in abandoned if f"id={label}]" in str(answer.content)]
    assert not leaked, f"recall in the new branch returned abandoned-branch messages: {leaked[:5]}"


# == 7. two sub-agents in one thread ==========================================================


def _sub_agent(key: str, archive: Archive) -> tuple[Any, CompactionNode]:
    """A sub-agent keeping its messages under ``key``, with the archive and a recall ToolNode of its own."""

    class SubState(TypedDict):
        pass

    SubState.__annotations__[key] = Annotated[list[BaseMessage], add_messages]
    node = CompactionNode(summarize, OPTIONS, messages_key=key, nested="own", features=[*default_features(), archive])
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


def test_item_7_sub_agents_do_not_read_each_others_archive() -> None:
    """One sub-agent's recall (same thread) returns its own archived messages, never another sub-agent's."""
    graph, store = _two_sub_agents(Archive())
    ids = [i.value["message"]["data"]["id"] for i in archive_items(store, "shared-thread")]
    assert any(i.startswith("alpha-") for i in ids)
    assert any(i.startswith("beta-") for i in ids)
    assert "id=beta-3]" in _beta_recall(graph, "beta-question3")  # control: beta reads its own archive
    answer = _beta_recall(graph, "ALPHASECRET3")
    assert "id=alpha-" not in answer, f"beta's recall returned alpha's archived messages: {answer[:120]!r}"


def test_item_7_retention_of_one_sub_agent_keeps_the_others_archive() -> None:
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


# == 8. PrepareAhead(in_store=True) with a store whose search fails ===========================


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


def test_item_8_failing_store_search_never_surfaces_in_a_turn() -> None:
    """A store that cannot be searched never fails a turn of PrepareAhead(in_store=True); the thread compacts."""
    store = FlakySearchStore(failures=-1)
    node = CompactionNode(summarize, PREPARE_OPTS, result_key="compaction", features=prepared(wait=0.5, in_store=True))
    graph = graph_with(node, store=store)
    for turn in range(60):
        try:
            state = graph.invoke({"messages": [HumanMessage(words(f"q{turn}"))]}, cfg("flaky"))
        except ConnectionError as error:
            pytest.fail(f"turn {turn} raised {type(error).__name__}: {error}")
        settle(node, thread="flaky")
    assert state.get("compaction"), "the thread never compacted"


def test_item_8_one_transient_search_error_does_not_stall_the_threshold_turn() -> None:
    """One failed store search never makes the threshold turn wait for a preparation that never runs."""
    wait = 1.5
    store = FlakySearchStore(failures=1)
    node = CompactionNode(summarize, PREPARE_OPTS, result_key="compaction", features=prepared(wait=wait, in_store=True))
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


# == 9. middleware state, timeouts, cancellation, chunking ====================================


class ThreadRecorder(Recorder):
    """Records each summary request with the thread it was made for."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[str] = []

    def summarize(self, request: SummaryRequest) -> str:
        from langgraph.config import get_config

        self.threads.append(str(get_config()["configurable"].get("thread_id")))
        return super().summarize(request)


def test_item_9a_cache_aligned_summary_uses_its_own_threads_system_prompt() -> None:
    """A cache-aligned summary request of one thread carries that thread's system prompt, never another's."""
    from langchain.agents.middleware import dynamic_prompt
    from langgraph.config import get_config

    @dynamic_prompt
    def per_thread_prompt(request: Any) -> str:
        return f"SYSTEM-PROMPT-OF-{get_config()['configurable']['thread_id']}"

    recorder = ThreadRecorder()
    middleware = CompactionMiddleware(recorder, OPTIONS, features=[*default_features(), CacheAligned()])
    model = ToolCallingFake(messages=iter([AIMessage(words("reply", 40)) for _ in range(200)]))
    agent = create_agent(model, middleware=[per_thread_prompt, middleware], checkpointer=InMemorySaver())
    for turn in range(25):
        for thread in ("A", "B"):
            agent.invoke({"messages": [HumanMessage(words(f"{thread}{turn}", 40))]}, cfg(thread))
    with_prefix = [(t, r) for t, r in zip(recorder.threads, recorder.requests) if r.prefix]
    assert with_prefix, "no cache-aligned request was made"
    mixed = []
    for thread, request in with_prefix:
        systems = [str(m.content) for m in request.prefix if getattr(m, "type", "") == "system"]
        if any("SYSTEM-PROMPT-OF-" in text and text != f"SYSTEM-PROMPT-OF-{thread}" for text in systems):
            mixed.append((thread, systems))
    assert not mixed, f"a summary request for one thread carried another thread's system prompt: {mixed[:2]}"


def test_item_9b_window_from_the_model_profile_reaches_the_cache_and_preparer() -> None:
    """A window learnt from the model's profile is the one preparations are made and applied with."""
    results: list[Any] = []
    middleware = CompactionMiddleware(
        summarize, CompactionOptions(), features=prepared(wait=1.0), on_compaction=results.append
    )
    model = ToolCallingFake(
        messages=iter([AIMessage(words("reply", 40)) for _ in range(200)]), profile={"max_input_tokens": 4_000}
    )
    agent = create_agent(model, middleware=[middleware], checkpointer=InMemorySaver())
    for turn in range(60):
        agent.invoke({"messages": [HumanMessage(words(f"q{turn}", 40))]}, cfg("profile"))
        settle(middleware, thread="profile")
        if results:
            break
    options = middleware.options
    assert options.context_window == 4_000  # learned
    # The preparation mark follows the learned window ...
    assert prepare_of(middleware).mark == round(options.budget.threshold * 0.7)
    # ... a preparation was made and applied at the threshold ...
    assert results, "nothing was compacted"
    assert results[0].parts["prepared"]["applied"], "the learned window never prepared a summary"
    # ... and what it made was planned for the learned window: it lands under that window's landing target.
    assert results[0].compacted_tokens <= options.budget.landing, (results[0].compacted_tokens, options.budget)


class ReadOnlyStore(InMemoryStore):
    """An InMemoryStore whose writes fail: a database gone read-only."""

    def batch(self, ops: Any) -> list[Any]:
        ops = list(ops)
        if any(type(op).__name__ == "PutOp" for op in ops):
            raise ConnectionError("the store is read-only")
        return super().batch(ops)


def test_item_9c_archive_warn_does_not_summarize_and_discard_every_turn() -> None:
    """With Archive(on_error="warn") and a failing store, no summary call is paid for and thrown away."""
    prompts: list[str] = []

    def counting_summarizer(prompt: str) -> str:
        prompts.append(prompt)
        return "## Goal\n- x"

    node = CompactionNode(counting_summarizer, OPTIONS, result_key="compaction", features=archived(on_error="warn"))
    graph = graph_with(node, store=ReadOnlyStore())
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


class SlowToCancel:
    """An async summarizer that hangs, and on cancellation cleans up for a moment (closing a
    connection) before it lets the cancellation through, as HTTP clients do."""

    name = "slow-to-cancel"

    def summarize(self, request: SummaryRequest) -> str:
        raise NotImplementedError

    async def asummarize(self, request: SummaryRequest) -> str:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            await asyncio.sleep(0.4)  # cleanup
            raise
        return "## Goal\n- x"


async def test_item_9d_caller_cancellation_with_timeout_stays_a_cancellation() -> None:
    """A caller's cancellation during a timed-out summary call surfaces as CancelledError, not a timeout."""
    options = CompactionOptions(context_window=3_000, timeout=0.1)
    caller = asyncio.ensure_future(acompact(SlowToCancel(), _long_history(), options))
    await asyncio.sleep(0.25)  # past the 0.1 s deadline: the library is awaiting the cancelled summary call
    caller.cancel()
    outcome = (await asyncio.gather(caller, return_exceptions=True))[0]
    assert isinstance(outcome, asyncio.CancelledError), f"the caller's cancellation became {outcome!r}"


async def test_item_9d_cancelled_background_preparation_task_is_cancelled() -> None:
    """A background preparation task that is cancelled ends cancelled (it does not swallow the cancellation)."""
    node = CompactionNode(SlowToCancel(), PREPARE_OPTS, features=prepared(wait=0.1))
    history = _long_history(48, 40)
    assert prepare_of(node).mark < node.context_tokens(history) < PREPARE_OPTS.budget.threshold
    before = asyncio.all_tasks()
    await node.ainvoke({"messages": history}, cfg("bg"))
    started = asyncio.all_tasks() - before - {asyncio.current_task()}
    assert prepare_of(node).running(Conversation("bg")), "no preparation is running after a turn past the mark"
    assert len(started) == 1, started  # the preparation's task
    (task,) = started
    assert not task.done()
    await asyncio.sleep(0.05)
    task.cancel()
    await asyncio.wait({task}, timeout=2)
    assert task.done()
    assert task.cancelled(), "the cancelled background preparation task returned normally"


def test_item_9e_timed_out_sync_summary_calls_do_not_pile_up_threads() -> None:
    """Summary calls that hang past their timeout leave a bounded number of threads behind."""
    release = threading.Event()

    def hanging(prompt: str) -> str:
        release.wait(30)
        return "## Goal\n- x"

    def alive() -> int:
        return sum(1 for t in threading.enumerate() if t.name == "langchain-compaction-summary" and t.is_alive())

    options = CompactionOptions(context_window=3_000, timeout=0.05)
    baseline = alive()
    try:
        for _ in range(8):
            with pytest.raises(SummaryTimeoutError):
                compact(hanging, _long_history(), options)
        leaked = alive() - baseline
    finally:
        release.set()
    wait_for(lambda: alive() <= baseline, 3.0)  # released: they end
    assert leaked <= 4, f"{leaked} summary threads are still alive after 8 timed-out calls"


def _tool_call(call_id: str) -> dict[str, Any]:
    return {"name": "lookup", "args": {"topic": call_id}, "id": call_id, "type": "tool_call"}


@pytest.mark.parametrize("shape", ["user_message_before_the_result", "interleaved_late_results"])
def test_item_9f_chunks_never_split_a_tool_call_from_its_results(shape: str) -> None:
    """A chunked summary never sends a tool call in one request and its result in another."""
    splits = []
    for filler in range(40, 400, 12):
        history: list[BaseMessage] = []
        for i in range(6):
            history += [HumanMessage(words(f"q{i}", filler), id=f"h{i}"), AIMessage(words(f"a{i}", filler), id=f"a{i}")]
        if shape == "user_message_before_the_result":
            history += [
                HumanMessage("look it up", id="ask"),
                AIMessage("", tool_calls=[_tool_call("c1")], id="call"),
                HumanMessage(words("and hurry, please", 40), id="hurry"),
                ToolMessage(words("result", 60), tool_call_id="c1", id="res1"),
            ]
        else:
            history += [
                HumanMessage("look both up", id="ask"),
                AIMessage("", tool_calls=[_tool_call("c1")], id="call1"),
                AIMessage(words("also", 20), tool_calls=[_tool_call("c2")], id="call2"),
                ToolMessage(words("result one", 40), tool_call_id="c1", id="res1"),
                ToolMessage(words("result two", 40), tool_call_id="c2", id="res2"),
            ]
        for i in range(6, 30):
            history += [HumanMessage(words(f"q{i}", 60), id=f"h{i}"), AIMessage(words(f"a{i}", 60), id=f"a{i}")]
        recorder = Recorder()
        options = CompactionOptions(context_window=6_000, summary_input_tokens=1_000, keep_recent_tokens=500)
        result, _ = compact(recorder, history, options)
        assert result is not None
        assert result.chunks > 1
        where: dict[str, int] = {}
        for number, request in enumerate(recorder.requests):
            for message in request.messages:
                for call in message.tool_calls:
                    where.setdefault(f"call:{call.id}", number)
                if message.role == "tool" and message.tool_call_id:
                    where.setdefault(f"result:{message.tool_call_id}", number)
        for call_id in ("c1", "c2"):
            if f"call:{call_id}" in where and where[f"call:{call_id}"] != where.get(f"result:{call_id}"):
                splits.append((filler, call_id, where[f"call:{call_id}"], where.get(f"result:{call_id}")))
    assert not splits, (
        f"a chunk boundary split a tool call from its result (filler, call, chunk of call, chunk of result): {splits[:3]}"
    )


# == 10. preparation bookkeeping and thread ids ==============================================


class Counting:
    """A cheap plain-function summarizer that counts its calls (thread-safe)."""

    def __init__(self) -> None:
        self.calls = 0
        self._lock = threading.Lock()

    def __call__(self, prompt: str) -> str:
        with self._lock:
            self.calls += 1
        return "## Goal\n- x"


def test_item_10a_preparer_does_not_keep_a_summary_for_every_thread_ever_seen() -> None:
    """A process keeps finished preparations for a bounded number of threads, not for every thread ever seen."""
    threads = 1_500
    summarizer = Counting()
    # Only PrepareAhead (no checked facts) and a short history: 1,500 cheap preparations.
    node = CompactionNode(summarizer, PREPARE_OPTS, features=[PrepareAhead(at=0.7, wait=0.5)])
    prepare = prepare_of(node)
    history = _long_history(14, 160)
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


def test_item_10b_conversations_without_a_thread_do_not_share_one_preparation() -> None:
    """Two conversations without a thread id each get, and apply, their own prepared summary."""
    node = CompactionNode(summarize, PREPARE_OPTS, result_key="compaction", features=prepared(wait=0.5))
    x = _long_history(48, 40)
    y = [HumanMessage(words(f"y{i}", 40), id=f"y{i}") for i in range(48)]
    assert prepare_of(node).mark < node.context_tokens(y) < PREPARE_OPTS.budget.threshold
    node.invoke({"messages": x})  # conversation X passes the preparation mark: its summary is prepared
    settle(node, messages=x)
    node.invoke({"messages": y})  # another conversation (no checkpointer either) passes the mark
    settle(node, messages=y)

    def grown(history: list[BaseMessage], label: str) -> list[BaseMessage]:
        return [*history, *(HumanMessage(words(f"{label}{i}", 40), id=f"{label}{i}") for i in range(20))]

    y_update = node.invoke({"messages": grown(y, "ymore")})  # Y at its threshold
    x_update = node.invoke({"messages": grown(x, "xmore")})  # X at its threshold
    applied = {
        "X": x_update["compaction"]["parts"]["prepared"]["applied"],
        "Y": y_update["compaction"]["parts"]["prepared"]["applied"],
    }
    assert all(applied.values()), f"applied a summary prepared for it: {applied}"


def test_item_10c_thread_id_zero_is_a_thread() -> None:
    """thread_id=0 is a thread like any other: its compacted messages are archived."""
    store = InMemoryStore()
    node = CompactionNode(summarize, OPTIONS, features=archived(), result_key="compaction")
    graph = graph_with(node, store=store)
    for turn in range(30):
        state = graph.invoke({"messages": [HumanMessage(words(f"q{turn}"))]}, cfg(0))
    assert any(is_summary_message(m) for m in state["messages"]), "thread 0 never compacted"
    assert archive_items(store, 0), f"nothing archived for thread 0; namespaces: {store.list_namespaces()}"


def test_item_10d_thread_id_with_nul_raises_only_compaction_errors() -> None:
    """A thread id with a NUL byte never fails a turn with a store's own error (PrepareAhead(in_store=True))."""
    store = InMemoryStore()
    node = CompactionNode(summarize, PREPARE_OPTS, result_key="compaction", features=prepared(wait=0.5, in_store=True))
    graph = graph_with(node, store=store)
    for turn in range(60):
        try:
            graph.invoke({"messages": [HumanMessage(words(f"q{turn}"))]}, cfg("user\x00one"))
        except CompactionError:
            return  # a documented, library error is acceptable
        except Exception as error:
            pytest.fail(f"turn {turn} raised {type(error).__module__}.{type(error).__name__}: {error}")
        settle(node, thread="user\x00one")


def test_item_10d_thread_id_with_nul_archive_can_be_recalled() -> None:
    """A thread id with a NUL byte: what is archived can be recalled."""
    store = InMemoryStore()
    graph, _ = _archive_graph_with_recall(store)
    config = cfg("user\x00two")
    for turn in range(30):
        try:
            state = graph.invoke({"messages": [HumanMessage(words(f"old{turn}", 120), id=f"old{turn}")]}, config)
        except CompactionError:
            return
        except Exception as error:
            pytest.fail(f"turn {turn} raised {type(error).__module__}.{type(error).__name__}: {error}")
        if any(is_summary_message(m) for m in state["messages"]):
            break
    assert any(is_summary_message(m) for m in state["messages"]), "the thread never compacted"
    try:
        state = graph.invoke({"messages": [HumanMessage("RECALL old0")]}, config)
    except CompactionError:
        return
    except Exception as error:
        pytest.fail(f"recall raised {type(error).__module__}.{type(error).__name__}: {error}")
    assert "old0 word" in str(state["messages"][-1].content), str(state["messages"][-1].content)[:200]
