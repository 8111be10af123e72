"""Compaction inside a subgraph whose parent shares the message list.

A parent receives a subgraph's final message list merged by id, not its
``RemoveMessage(REMOVE_ALL_MESSAGES)`` update, so a summary written only in the
subgraph lands in the middle of the parent's history. Every request must stay
valid (checked with ChatAnthropic's own payload builder, which refuses
non-consecutive system messages), and, one level down, the parent must shrink.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import operator
from typing import Annotated, Any, TypedDict

import pytest
from helpers_turns import ToolCallingFake, cfg, chat, short_summary, words
from langchain.agents import create_agent
from langchain_anthropic import ChatAnthropic
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.errors import GraphRecursionError
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Send
from typing_extensions import NotRequired

from langchain_compaction import CompactionMiddleware, CompactionNode, CompactionOptions
from langchain_compaction._lc.convert import is_summary_message, to_core_list
from langchain_compaction.core.plan import misplaced, reordered
from langchain_compaction.errors import ConfigurationError
from tests.conftest import RecordingSummarizer, tool_pairs_of

ANTHROPIC = ChatAnthropic(model="claude-sonnet-4-5", api_key="x")
OPTIONS = CompactionOptions(context_window=3_000)


class Requests:
    """Every request a model was sent, and the problems with each."""

    def __init__(self) -> None:
        self.sent: list[list[BaseMessage]] = []
        self.invalid: list[str] = []

    def check(self, messages: list[BaseMessage]) -> None:
        self.sent.append(list(messages))
        try:
            ANTHROPIC._get_request_payload(messages)  # raises on non-consecutive system messages
        except Exception as error:
            self.invalid.append(str(error)[:120])
            return
        systems = [i for i, m in enumerate(messages) if isinstance(m, SystemMessage)]
        if systems != list(range(len(systems))):
            self.invalid.append(f"system messages at {systems}")
        calls = {c["id"] for m in messages if isinstance(m, AIMessage) for c in m.tool_calls}
        if any(isinstance(m, ToolMessage) and m.tool_call_id not in calls for m in messages):
            self.invalid.append("a tool result without its call")
        if len(tool_pairs_of(messages)) != sum(1 for m in messages if isinstance(m, ToolMessage)):
            self.invalid.append("a tool result separated from its call")


def summaries(messages: list[BaseMessage]) -> int:
    return sum(1 for m in messages if is_summary_message(m))


def node_in_subgraph(requests: Requests, nested: str, summarizer: Any, node: CompactionNode | None = None) -> Any:
    """A parent whose one node is a subgraph: ``node`` (else a CompactionNode of ``summarizer``), then a model."""
    model = GenericFakeChatModel(messages=iter([AIMessage(f"answer {i} " * 50) for i in range(500)]))

    def call_model(state: MessagesState) -> dict[str, Any]:
        request = [SystemMessage("You are helpful."), *state["messages"]]
        requests.check(request)
        return {"messages": [model.invoke(request)]}

    sub = StateGraph(MessagesState)
    sub.add_node("compact", node or CompactionNode(summarizer, OPTIONS, nested=nested))  # type: ignore[arg-type]
    sub.add_node("model", call_model)
    sub.add_edge(START, "compact")
    sub.add_edge("compact", "model")
    parent = StateGraph(MessagesState)
    parent.add_node("agent", sub.compile())
    parent.add_edge(START, "agent")
    return parent.compile(checkpointer=InMemorySaver())


@pytest.mark.parametrize("nested", ["parent", "own"])
def test_a_node_in_a_subgraph_keeps_every_request_valid(nested: str) -> None:
    requests, summarizer = Requests(), RecordingSummarizer()
    graph = node_in_subgraph(requests, nested, summarizer)
    config = {"configurable": {"thread_id": nested}}
    sizes = []
    for turn in range(40):
        state = graph.invoke({"messages": [HumanMessage(f"question {turn} " * 50)]}, config)
        sizes.append(len(state["messages"]))
    assert len(requests.sent) == 40  # one model call per turn, none lost to the re-run
    assert requests.invalid == []
    assert summarizer.prompts, "the window should have compacted"
    # Not re-summarized every turn: as many summary calls as the same graph at the top level makes.
    assert len(summarizer.prompts) <= flat_summary_calls(40)
    final = state["messages"]
    if nested == "parent":
        assert summaries(final) == 1  # the parent's state shrank and holds one summary
        assert max(sizes[10:]) <= 18  # bounded as at the top level (there: 7 to 17 messages)
        assert not misplaced(to_core_list(final))
    else:
        assert sizes[-1] > 40  # documented: the parent keeps growing, the requests stay valid


def flat_summary_calls(turns: int) -> int:
    summarizer = RecordingSummarizer()
    model = GenericFakeChatModel(messages=iter([AIMessage(f"answer {i} " * 50) for i in range(500)]))

    def call_model(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke([SystemMessage("You are helpful."), *state["messages"]])]}

    builder = StateGraph(MessagesState)
    builder.add_node("compact", CompactionNode(summarizer, OPTIONS))
    builder.add_node("model", call_model)
    builder.add_edge(START, "compact")
    builder.add_edge("compact", "model")
    graph = builder.compile(checkpointer=InMemorySaver())
    for turn in range(turns):
        graph.invoke({"messages": [HumanMessage(f"question {turn} " * 50)]}, {"configurable": {"thread_id": "flat"}})
    return len(summarizer.prompts)


def agent_in_subgraph(requests: Requests, nested: str, after: bool = False) -> Any:
    @tool
    def lookup(order: str) -> str:
        """Look an order up."""
        return f"order {order}: shipped " * 20

    class Checking(GenericFakeChatModel):
        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

        def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> Any:
            requests.check(messages)
            return super()._generate(messages, stop=stop, run_manager=run_manager, **kwargs)

    script: list[AIMessage] = []
    for i in range(200):  # a tool call, then the answer, on every turn
        script.append(AIMessage("Looking.", tool_calls=[{"name": "lookup", "args": {"order": str(i)}, "id": f"c{i}"}]))
        script.append(AIMessage(f"answer {i} " * 40))
    middleware = CompactionMiddleware(lambda p: "## Goal\n- answer", OPTIONS, nested=nested)  # type: ignore[arg-type]
    agent = create_agent(
        Checking(messages=iter(script)), tools=[lookup], system_prompt="You are helpful.", middleware=[middleware]
    )
    parent = StateGraph(MessagesState)
    parent.add_node("agent", agent)
    parent.add_edge(START, "agent")
    if after:  # a parent node the agent's static edge leads to
        parent.add_node("after", lambda state: {})
        parent.add_edge("agent", "after")
    return parent.compile(checkpointer=InMemorySaver())


@pytest.mark.parametrize("nested", ["parent", "own"])
def test_create_agent_in_a_subgraph_keeps_every_request_valid(nested: str) -> None:
    requests = Requests()
    graph = agent_in_subgraph(requests, nested)
    config = {"configurable": {"thread_id": nested}}
    counts: list[int] = []
    for turn in range(30):
        state = graph.invoke({"messages": [HumanMessage(f"question {turn} " * 50)]}, config)
        counts.append(summaries(state["messages"]))
    assert len(requests.sent) >= 60
    assert requests.invalid == []
    final = state["messages"]
    assert isinstance(final[-1], AIMessage)
    assert not final[-1].tool_calls  # every turn ended with its answer
    if nested == "parent":
        # A compaction during the model call (where the parent's state cannot
        # be written) leaves its summary mid-history for one turn: the next
        # turn puts it in place, so there are never more than two, and never
        # two turns running.
        assert max(counts) <= 2
        assert 1 in counts
        assert all(not (a == 2 and b == 2) for a, b in itertools.pairwise(counts)), counts
        assert len(final) < 30


def test_an_agent_followed_by_a_parent_node_is_not_told_to_keep_its_compactions(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """After a send-up the parent runs the agent again beside the node its edge leads to (README: "runs once more").

    The re-run's first model call knows the list it sent up; its later ones
    read the parent's checkpoint, found that node's trigger beside the
    agent's, took it for a parallel branch and advised nested='own', which
    would have stopped the parent from shrinking.
    """
    requests = Requests()
    graph = agent_in_subgraph(requests, "parent", after=True)
    config = {"configurable": {"thread_id": "after"}}
    sizes = []
    with caplog.at_level(logging.WARNING, logger="langchain_compaction"):
        for turn in range(30):
            state = graph.invoke({"messages": [HumanMessage(f"question {turn} " * 50)]}, config)
            sizes.append(len(state["messages"]))
    assert requests.invalid == []
    assert [r.getMessage() for r in caplog.records if "nested='own'" in r.getMessage()] == []
    held = graph.get_state(config).values["messages"]
    assert summaries(held) == 1
    assert max(sizes[10:]) < 30  # the parent shrank on every compaction


def test_a_parent_whose_history_already_holds_summaries_mid_way_is_repaired() -> None:
    # A thread written before (or by a subgraph with nested="own"): summaries
    # landed in the middle of the parent's history.
    requests = Requests()
    graph = node_in_subgraph(requests, "parent", RecordingSummarizer())
    config = {"configurable": {"thread_id": "old"}}
    messy: list[BaseMessage] = []
    for i in range(3):
        messy += [HumanMessage(f"old question {i}", id=f"oq{i}"), AIMessage(f"old answer {i}", id=f"oa{i}")]
    first = graph.nodes["agent"].bound  # the compiled subgraph
    assert first is not None
    summary = SystemMessage(
        "[Conversation summary — earlier messages were compacted]\nnotice\n\n## Goal\n- old",
        id="s-old",
        additional_kwargs={"langchain_compaction": {"kind": "summary", "version": 1, "kept_from": "oq2"}},
    )
    messy += [summary, HumanMessage("new question", id="nq")]
    graph.update_state(config, {"messages": messy}, as_node="agent")
    state = graph.invoke({"messages": [HumanMessage("and now?", id="now")]}, config)
    assert requests.invalid == []
    ids = [m.id for m in state["messages"]]
    assert ids[0] == "s-old"  # the summary leads; what it covered is gone
    assert "oq0" not in ids
    assert "oa1" not in ids
    assert ids[1:4] == ["oq2", "oa2", "nq"]


def test_two_levels_down_the_requests_stay_valid_and_the_fix_is_named(caplog: pytest.LogCaptureFixture) -> None:
    requests = Requests()
    inner = node_in_subgraph(requests, "parent", RecordingSummarizer())
    middle = StateGraph(MessagesState)
    middle.add_node("inner", inner.builder.compile())  # no checkpointer of its own
    middle.add_edge(START, "inner")
    outer = StateGraph(MessagesState)
    outer.add_node("middle", middle.compile())
    outer.add_edge(START, "middle")
    graph = outer.compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "deep"}}
    with caplog.at_level(logging.WARNING, logger="langchain_compaction"):
        for turn in range(30):
            graph.invoke({"messages": [HumanMessage(f"question {turn} " * 50)]}, config)
    assert requests.invalid == []
    warnings = [r.getMessage() for r in caplog.records if "nested more than one level" in r.getMessage()]
    assert len(warnings) == 1
    assert "outermost graph" in warnings[0]


def test_two_levels_down_the_warning_comes_on_the_first_turn(caplog: pytest.LogCaptureFixture) -> None:
    """Before any compaction: a user sees the advice while the thread is short, not hundreds of turns later."""
    inner = node_in_subgraph(Requests(), "parent", RecordingSummarizer())
    middle = StateGraph(MessagesState)
    middle.add_node("inner", inner.builder.compile())
    middle.add_edge(START, "inner")
    outer = StateGraph(MessagesState)
    outer.add_node("middle", middle.compile())
    outer.add_edge(START, "middle")
    graph = outer.compile(checkpointer=InMemorySaver())
    with caplog.at_level(logging.WARNING, logger="langchain_compaction"):
        graph.invoke({"messages": [HumanMessage("hello")]}, {"configurable": {"thread_id": "first"}})
    assert any("nested more than one level" in r.getMessage() for r in caplog.records)


def test_the_recommended_setup_keeps_a_deep_thread_bounded_for_300_turns() -> None:
    """What the warning recommends: the compaction in the outermost graph, before the nested agent.

    The agent sits two subgraph levels down; the outer checkpoint, which is
    what the checkpointer keeps, stays bounded and holds one summary.
    """
    requests = Requests()
    model = GenericFakeChatModel(messages=iter([AIMessage(f"answer {i} " * 50) for i in range(400)]))

    def call_model(state: MessagesState) -> dict[str, Any]:
        request = [SystemMessage("You are helpful."), *state["messages"]]
        requests.check(request)
        return {"messages": [model.invoke(request)]}

    inner = StateGraph(MessagesState)
    inner.add_node("model", call_model)
    inner.add_edge(START, "model")
    middle = StateGraph(MessagesState)
    middle.add_node("inner", inner.compile())
    middle.add_edge(START, "inner")
    outer = StateGraph(MessagesState)
    outer.add_node("compact", CompactionNode(RecordingSummarizer(), OPTIONS))
    outer.add_node("middle", middle.compile())
    outer.add_edge(START, "compact")
    outer.add_edge("compact", "middle")
    graph = outer.compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "deep"}}
    sizes = []
    for turn in range(300):
        state = graph.invoke({"messages": [HumanMessage(f"question {turn} " * 50)]}, config)
        sizes.append(len(state["messages"]))
    assert len(requests.sent) == 300
    assert requests.invalid == []
    assert max(sizes[100:]) < 60  # bounded, not growing with the turns
    summaries = [m for m in graph.get_state(config).values["messages"] if is_summary_message(m)]
    assert len(summaries) == 1


# -- the rule itself, on the core form ----------------------------------------------------------


def test_what_a_misplaced_summary_covers_is_dropped_and_the_rest_kept_in_order() -> None:
    summary = SystemMessage(
        "[Conversation summary — earlier messages were compacted]\n\n## Goal\n- x",
        id="s1",
        additional_kwargs={"langchain_compaction": {"kind": "summary", "version": 1, "kept_from": "h2"}},
    )
    messages = [
        SystemMessage("prompt", id="p"),
        HumanMessage("h0", id="h0"),
        AIMessage("a0", id="a0"),
        HumanMessage("h2", id="h2"),
        AIMessage("a2", id="a2"),
        summary,
        AIMessage("reply", id="r"),
    ]
    core = to_core_list(messages)
    assert misplaced(core)
    shape = reordered(core)
    assert [messages[i].id for i in shape.head] == ["p", "s1"]
    assert [messages[i].id for i in shape.kept] == ["h2", "a2", "r"]
    assert shape.bridge is False
    # Without the mark (a 0.1.0 summary), nothing is dropped: the summary moves up.
    unmarked = [*messages[:5], summary.model_copy(update={"additional_kwargs": {}}), *messages[6:]]
    shape = reordered(to_core_list(unmarked))
    assert [unmarked[i].id for i in shape.head] == ["p", "s1"]
    assert [unmarked[i].id for i in shape.kept] == ["h0", "a0", "h2", "a2", "r"]
    # One whose record says it kept nothing covers all it was written after (its anchor), and no more;
    # one of 0.1.0 (an anchor, no kept_from) covers nothing: what it kept verbatim sat after its anchor.
    mark = {"kind": "summary", "version": 1, "last_message_id": "a2"}
    for extra, kept in (({"kept_nothing": True}, ["r"]), ({}, ["h0", "a0", "h2", "a2", "r"])):
        whole = summary.model_copy(update={"additional_kwargs": {"langchain_compaction": {**mark, **extra}}})
        ended = [*messages[:5], whole, *messages[6:]]
        shape = reordered(to_core_list(ended))
        assert [ended[i].id for i in shape.head] == ["p", "s1"]
        assert [ended[i].id for i in shape.kept] == kept


# -- a sub-agent invoked inside a parent's node function ---------------------------------------------


def _sub_agent_graph(kind: str) -> Any:
    if kind == "middleware":
        model = ToolCallingFake(messages=iter([AIMessage(words("answer")) for _ in range(200)]))
        middleware = CompactionMiddleware(short_summary, OPTIONS)
        return create_agent(model, middleware=[middleware], checkpointer=True)
    node = CompactionNode(short_summary, OPTIONS)

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
def test_subgraph_invoked_inside_a_parent_node_function_finishes(kind: str, caplog: pytest.LogCaptureFixture) -> None:
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


def _under_a_parent(agent: Any) -> tuple[Any, Any]:
    """``agent`` as the one node of a parent sharing ``messages``, compiled with a checkpointer and a store."""
    from langgraph.store.memory import InMemoryStore

    parent = StateGraph(MessagesState)
    parent.add_node("agent", agent)
    parent.add_edge(START, "agent")
    parent.add_edge("agent", END)
    store = InMemoryStore()
    return parent.compile(checkpointer=InMemorySaver(), store=store), store


def _archived_ids(store: Any) -> list[str | None]:
    """The ids of every archived message, in every namespace of the store (an agent's filed apart once too)."""
    from langchain_core.messages import messages_from_dict

    return [
        messages_from_dict([item.value["message"]])[0].id
        for namespace in store.list_namespaces(prefix=("compaction_archive",))
        for item in store.search(namespace, limit=10_000)
    ]


def test_an_agent_one_level_down_with_archive_and_preparation_archives_each_message_once() -> None:
    """create_agent (Archive, PrepareAhead) as a node of a parent sharing its messages: once each, none lost.

    Its model call compacts only a request that would not fit (what it makes
    lands mid-history in the parent); a compaction made there as well as in
    ``before_model`` filed messages twice, at two positions.
    """

    from langchain_compaction.features import Archive, PrepareAhead, default_features

    middleware = CompactionMiddleware(
        short_summary,
        CompactionOptions(context_window=3_000),
        features=[*default_features(), Archive(), PrepareAhead(at=0.7, wait=2.0)],
    )
    replies = (AIMessage(f"reply {n} " * 30) for n in itertools.count())
    graph, store = _under_a_parent(
        create_agent(ToolCallingFake(messages=replies), middleware=[middleware], name="agent")
    )
    config = cfg("P")
    sent = [f"h{turn}" for turn in range(60)]
    for turn, message_id in enumerate(sent):
        graph.invoke({"messages": [HumanMessage(f"H{turn:04d} user says {turn} " * 10, id=message_id)]}, config)
    state = [m.id for m in graph.get_state(config).values["messages"]]
    archived = _archived_ids(store)
    assert archived, "the window should have compacted"
    for message_id in sent:
        assert state.count(message_id) + archived.count(message_id) == 1, message_id


def test_an_agent_one_level_down_that_compacts_on_an_overflow_files_with_its_parent() -> None:
    """The provider's limit turns out below the window: the overflow retry's compaction is archived once, where recall looks.

    The model call compacts into the agent's own state (it cannot command the
    parent); it filed under the agent's namespace, and the next
    ``before_model`` filed the same messages again under the parent's, where
    recall then missed the first ones.
    """
    from langchain_core.exceptions import ContextOverflowError

    from langchain_compaction.features import Archive, default_features
    from langchain_compaction.features.recall import recall_tool

    limit = [10**9]

    class Limited(ToolCallingFake):
        def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> Any:
            if sum(len(str(m.content)) for m in messages) > limit[0]:
                raise ContextOverflowError("prompt is too long")
            return super()._generate(messages, *args, **kwargs)

    middleware = CompactionMiddleware(
        short_summary, CompactionOptions(context_window=8_000), features=[*default_features(), Archive()]
    )
    replies = (AIMessage(f"reply {n} " * 30, id=f"a{n}") for n in itertools.count())
    graph, store = _under_a_parent(create_agent(Limited(messages=replies), middleware=[middleware], name="agent"))
    sent = [f"h{turn}" for turn in range(80)]
    for turn, message_id in enumerate(sent):
        limit[0] = 10**9 if turn < 45 else 22_000
        graph.invoke({"messages": [HumanMessage(f"H{turn:04d} says " + "word " * 60, id=message_id)]}, cfg("O"))
    state = graph.get_state(cfg("O")).values["messages"]
    ids = [m.id for m in state]
    archived = _archived_ids(store)
    assert {"h0", "h50"} <= set(archived), "both kinds of compaction should have run"
    assert [m for m in sent if ids.count(m) + archived.count(m) != 1] == []
    runtime = type("Runtime", (), {})()
    runtime.store, runtime.state = store, {"messages": state}
    runtime.config = {"configurable": {"thread_id": "O", "checkpoint_ns": "agent:x|tools:y"}}
    recall = recall_tool(Archive())
    assert [m for m in sent if m not in ids and f"H{int(m[1:]):04d}" not in recall.func(ids=[m], runtime=runtime)] == []


@pytest.mark.parametrize("kind", ["node", "middleware"])
def test_workers_sent_with_send_compact_their_own_state_and_leave_the_parents(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A map-reduce fan-out: each worker runs on its own payload; its compaction must not replace the parent's."""
    calls = itertools.count(1)
    if kind == "node":

        def worker_agent(state: MessagesState) -> dict[str, Any]:
            return {"messages": [AIMessage(f"worker note {len(state['messages'])} " * 40)]}

        sub = StateGraph(MessagesState)
        sub.add_node("compact", CompactionNode(short_summary, CompactionOptions(context_window=3_000)))
        sub.add_node("agent", worker_agent)
        sub.add_edge(START, "compact")
        sub.add_edge("compact", "agent")
        sub.add_conditional_edges("agent", lambda s: END if next(calls) % 30 == 0 else "compact", ["compact", END])
        worker: Any = sub.compile()
    else:
        model = ToolCallingFake(messages=iter([AIMessage("research notes " * 150) for _ in range(10)]))
        middleware = CompactionMiddleware(short_summary, CompactionOptions(context_window=3_000))
        worker = create_agent(model, middleware=[middleware])

    def supervisor(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage("Dispatching two research workers now.", id="sup-1")]}

    def fan_out(state: MessagesState) -> list[Send]:
        def payload(i: int) -> list[BaseMessage]:
            return [
                HumanMessage(f"research topic {i} " + "background " * 600, id=f"topic-{i}"),
                AIMessage("earlier notes " * 600, id=f"notes-{i}"),
                HumanMessage(f"go on with topic {i}", id=f"go-{i}"),
            ]

        return [Send("worker", {"messages": payload(i)}) for i in range(2)]

    parent = StateGraph(MessagesState)
    parent.add_node("supervisor", supervisor)
    parent.add_node("worker", worker)
    parent.add_edge(START, "supervisor")
    parent.add_conditional_edges("supervisor", fan_out, ["worker"])
    parent.add_edge("worker", END)
    graph = parent.compile(checkpointer=InMemorySaver())
    request = HumanMessage("Please research the two topics, budget 4711 EUR.", id="user-1")
    with caplog.at_level(logging.WARNING, logger="langchain_compaction"):
        out = graph.invoke({"messages": [request]}, {**cfg("fan-out"), "recursion_limit": 300})
    ids = [m.id for m in out["messages"]]
    assert ids[:2] == ["user-1", "sup-1"], "the parent's own conversation stays, first"
    assert any(is_summary_message(m) for m in out["messages"]), "the workers compacted"
    said = [r.getMessage() for r in caplog.records if "Send" in r.getMessage()]
    assert len(said) == 1, said


def test_a_send_worker_is_told_apart_while_its_parents_checkpoint_is_still_being_written(tmp_path: Any) -> None:
    """Under the default durability ("async") the parent's checkpoint of the step lands in the background."""
    import time

    from langgraph.checkpoint.sqlite import SqliteSaver

    class RemoteSaver(SqliteSaver):
        """Writes that take as long as a round trip to a database elsewhere."""

        def put(self, *args: Any, **kwargs: Any) -> Any:
            time.sleep(0.1)
            return super().put(*args, **kwargs)

    def worker_agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage("worker done", id=f"done-{len(state['messages'])}")]}

    sub = StateGraph(MessagesState)
    sub.add_node("compact", CompactionNode(short_summary, CompactionOptions(context_window=3_000)))
    sub.add_node("agent", worker_agent)
    sub.add_edge(START, "compact")
    sub.add_edge("compact", "agent")
    sub.add_edge("agent", END)

    def fan_out(state: MessagesState) -> list[Send]:
        # The payload starts with the parent's own messages, then the worker's task and its backlog.
        task = [HumanMessage("topic " + "background " * 1_500, id="topic"), HumanMessage("go on", id="go")]
        return [Send("worker", {"messages": [*state["messages"], *task]})]

    parent = StateGraph(MessagesState)
    parent.add_node("supervisor", lambda state: {"messages": [AIMessage("Dispatching.", id="sup-1")]})
    parent.add_node("worker", sub.compile())
    parent.add_edge(START, "supervisor")
    parent.add_conditional_edges("supervisor", fan_out, ["worker"])
    parent.add_edge("worker", END)
    with RemoteSaver.from_conn_string(str(tmp_path / "checkpoints.db")) as saver:
        graph = parent.compile(checkpointer=saver)
        out = graph.invoke({"messages": [HumanMessage("Research it.", id="user-1")]}, cfg("remote"))
    ids = [m.id for m in out["messages"]]
    assert ids[:2] == ["user-1", "sup-1"], ids
    assert any(is_summary_message(m) for m in out["messages"]), "the worker compacted"


@pytest.mark.parametrize("parent", ["as is", "compacts before its model", "takes the answer only"])
def test_what_a_send_worker_returns_reaches_the_parents_model_as_the_readme_says(parent: str) -> None:
    """LangGraph merges a sent worker's final list into the parent by id: its summary lands after the parent's turn.

    README ("A subgraph reached through `Send`"): the parent's model then gets a
    system message mid-history, unless a CompactionNode before it puts the
    summaries first, or the parent takes only the worker's answer.
    """
    sub = StateGraph(MessagesState)
    sub.add_node("compact", CompactionNode(short_summary, CompactionOptions(context_window=3_000)))
    sub.add_node("model", lambda state: {"messages": [AIMessage(words("worker done", 20))]})
    sub.add_edge(START, "compact")
    sub.add_edge("compact", "model")
    worker = sub.compile()
    requests: list[list[BaseMessage]] = []

    def model(state: MessagesState) -> dict[str, Any]:
        requests.append(state["messages"])
        return {"messages": [AIMessage("collected")]}

    def answer_only(payload: MessagesState) -> dict[str, Any]:
        return {"messages": worker.invoke(payload)["messages"][-1:]}

    def fan_out(state: MessagesState) -> list[Send]:
        return [Send("worker", {"messages": [HumanMessage(words(f"subtask {k}", 400)) for k in range(8)]})] * 2

    builder = StateGraph(MessagesState)
    builder.add_node("worker", answer_only if parent == "takes the answer only" else worker)
    builder.add_node("model", model)
    builder.add_conditional_edges(START, fan_out, ["worker"])
    if parent == "compacts before its model":
        builder.add_node("compact", CompactionNode(short_summary, CompactionOptions(context_window=100_000)))
        builder.add_edge("worker", "compact")
        builder.add_edge("compact", "model")
    else:
        builder.add_edge("worker", "model")
    graph = builder.compile(checkpointer=InMemorySaver())
    for turn in range(3):
        graph.invoke({"messages": [HumanMessage(f"turn {turn}", id=f"user-{turn}")]}, cfg("workers"))
    late = [
        [i for i, m in enumerate(r) if isinstance(m, SystemMessage) and i > 0 and r[i - 1].type != "system"]
        for r in requests
    ]
    assert all(late) if parent == "as is" else not any(late), late
    assert all(f"user-{turn}" in [m.id for m in requests[turn]] for turn in range(3)), "the parent's turns stay"
    if parent == "takes the answer only":
        assert not any(map(is_summary_message, requests[-1]))


def _graph_sending_to_a_compaction_node(payload: Any) -> Any:
    """START sends ``payload(state)`` to a CompactionNode added as node "compact_worker", then a model node."""
    builder = StateGraph(MessagesState)
    node = CompactionNode(short_summary, CompactionOptions(context_window=3_000))
    builder.add_node("compact_worker", node)  # type: ignore[call-overload]
    builder.add_node("model", lambda state: {"messages": [AIMessage(words("answer", 200))]})
    builder.add_conditional_edges(START, lambda state: [Send("compact_worker", payload(state))], ["compact_worker"])
    builder.add_edge("compact_worker", "model")
    return builder.compile(checkpointer=InMemorySaver())


def test_a_compaction_node_sent_a_payload_refuses_it_before_writing_anything() -> None:
    """What a sent task returns is written to its graph's state: a compaction of the payload replaced the graph's.

    Before: the user's turns vanished from the state (and from the summary, made of the payload alone).
    """
    docs = [HumanMessage(words(f"doc {k}", 400)) for k in range(8)]
    graph = _graph_sending_to_a_compaction_node(lambda state: {"messages": docs})
    with pytest.raises(ConfigurationError, match=r"Send\('compact_worker'.*worker subgraph.*before the fan-out"):
        graph.invoke({"messages": [HumanMessage("turn 0 MARK0", id="user-0")]}, cfg("payload"))
    assert [m.id for m in graph.get_state(cfg("payload")).values["messages"]] == ["user-0"], "nothing is lost"


def test_a_compaction_node_sent_the_graphs_own_state_compacts_it() -> None:
    """A payload that is the graph's list itself (the same ids) is the graph's conversation: it is compacted."""
    graph = _graph_sending_to_a_compaction_node(lambda state: state)
    for turn in range(12):
        state = graph.invoke({"messages": [HumanMessage(words(f"turn {turn}", 150), id=f"user-{turn}")]}, cfg("own"))
    messages = state["messages"]
    assert is_summary_message(messages[0])
    assert sum(map(is_summary_message, messages)) == 1
    assert messages[-2].id == "user-11"


@pytest.mark.parametrize("join", [False, True])
def test_a_subgraph_reached_by_an_edge_that_waits_for_several_nodes_writes_to_its_parent(join: bool) -> None:
    """add_edge(["a", "b"], "agent") triggers the node through a join channel: an edge's, not a Send."""
    model = GenericFakeChatModel(messages=iter([AIMessage(f"answer {i} " * 50) for i in range(500)]))

    def call_model(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke([SystemMessage("You are helpful."), *state["messages"]])]}

    sub = StateGraph(MessagesState)
    sub.add_node("compact", CompactionNode(short_summary, CompactionOptions(context_window=3_000)))
    sub.add_node("model", call_model)
    sub.add_edge(START, "compact")
    sub.add_edge("compact", "model")
    parent = StateGraph(MessagesState)
    parent.add_node("agent", sub.compile())
    parent.add_node("check_a", lambda state: {})
    parent.add_edge(START, "check_a")
    if join:
        parent.add_node("check_b", lambda state: {})
        parent.add_edge(START, "check_b")
        parent.add_edge(["check_a", "check_b"], "agent")
    else:
        parent.add_edge("check_a", "agent")
    graph = parent.compile(checkpointer=InMemorySaver())
    for turn in range(30):
        state = graph.invoke({"messages": [HumanMessage(f"question {turn} " * 50)]}, cfg(f"join-{join}"))
    assert sum(map(is_summary_message, state["messages"])) == 1, "the parent's state shrinks: one summary"
    assert len(state["messages"]) < 20


class _Noted(MessagesState):
    notes: Annotated[dict[str, bool], lambda old, new: {**(old or {}), **(new or {})}]


def _noting_subgraph(summarizer: Any = short_summary) -> Any:
    """A ReAct loop (compaction, agent, a tool that writes ``notes``) that compacts right after the tool."""

    def agent(state: _Noted) -> dict[str, Any]:
        last = state["messages"][-1]
        if isinstance(last, HumanMessage):
            key = str(last.content).split()[1]
            return {"messages": [AIMessage("", tool_calls=[{"name": "note", "args": {"key": key}, "id": f"n{key}"}])]}
        return {"messages": [AIMessage(words("noted", 60))]}

    def note(state: _Noted) -> dict[str, Any]:
        call = state["messages"][-1].tool_calls[0]
        return {
            "messages": [ToolMessage(words("ok", 300), tool_call_id=call["id"])],
            "notes": {call["args"]["key"]: True},
        }

    return _noting_loop(agent, note, summarizer)


def _noting_loop(agent: Any, note: Any, summarizer: Any) -> Any:
    """The loop ``_noting_subgraph`` runs (compaction, ``agent``, the ``note`` tool, compaction again), compiled."""
    inner = StateGraph(_Noted)
    inner.add_node("compact", CompactionNode(summarizer, OPTIONS))
    inner.add_node("agent", agent)
    inner.add_node("note", note)
    inner.add_edge(START, "compact")
    inner.add_edge("compact", "agent")
    inner.add_conditional_edges("agent", lambda s: "note" if s["messages"][-1].tool_calls else END, ["note", END])
    inner.add_edge("note", "compact")
    return inner.compile()


def test_what_a_subgraph_run_wrote_to_other_keys_reaches_the_parent_when_it_compacts() -> None:
    # The compaction after the tool ends the subgraph's run with a command to
    # its parent: the tool's note went with it before, 5 of 20 turns lost theirs.
    outer = StateGraph(_Noted)
    outer.add_node("inner", _noting_subgraph())
    outer.add_edge(START, "inner")
    graph = outer.compile(checkpointer=InMemorySaver())
    config = cfg("noted")
    summaries = 0
    for turn in range(20):
        state = graph.invoke({"messages": [HumanMessage(words(f"turn {turn}", 10))]}, config)
        summaries += sum(1 for m in state["messages"] if is_summary_message(m))
    assert summaries, "the subgraph never compacted: the test proves nothing"
    assert sorted(state["notes"], key=int) == [str(t) for t in range(20)]


PARENT_TASKS_AT_ONCE = 70
"""More parent tasks than the 64 whose given state the node once kept in memory between a task's start and its compaction."""


def test_a_subgraph_compacting_beside_many_other_conversations_still_carries_its_writes_up() -> None:
    # What a parent task was given was held in a cache of 64 entries, put at the task's first check and read
    # at its compaction: with more conversations starting meanwhile (a slow summary) it was pushed out, and the
    # command sent up carried none of the run's writes: 6 of 70 threads lost the tool's note of that turn.
    started: list[int] = []
    everyone = asyncio.Event()

    async def slow_summary(prompt: str) -> str:
        started.append(1)
        if len(started) >= PARENT_TASKS_AT_ONCE:  # (every thread has started its compaction)
            everyone.set()
        await asyncio.wait_for(everyone.wait(), 30)
        return short_summary(prompt)

    outer = StateGraph(_Noted)
    outer.add_node("inner", _noting_subgraph(slow_summary))
    outer.add_edge(START, "inner")
    graph = outer.compile(checkpointer=InMemorySaver())
    for thread in range(PARENT_TASKS_AT_ONCE):  # each just under the threshold, with a checkpoint to read
        graph.invoke({"messages": [*chat(2, 180), HumanMessage(words("turn 6", 10))]}, cfg(f"many {thread}"))
    assert not started, "a thread compacted before its last turn: the test proves nothing"

    async def turn(thread: int) -> dict[str, Any]:
        return await graph.ainvoke({"messages": [HumanMessage(words("turn 7", 10))]}, cfg(f"many {thread}"))

    async def all_at_once() -> list[dict[str, Any]]:
        return await asyncio.gather(*(turn(t) for t in range(PARENT_TASKS_AT_ONCE)))

    states = asyncio.run(all_at_once())
    assert all(is_summary_message(state["messages"][0]) for state in states), "a thread did not compact"
    lost = [t for t, state in enumerate(states) if "7" not in (state.get("notes") or {})]
    assert not lost, f"{len(lost)} of {PARENT_TASKS_AT_ONCE} threads lost the note their run wrote"


def test_where_the_parents_checkpoint_is_gone_at_the_compaction_it_stays_below_and_keeps_the_writes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # What the parent gave the task is read again at the compaction: where it cannot be, a command sent up
    # could not tell the run's writes from what the parent holds, so the compaction stays in the subgraph,
    # whose output then hands the parent everything the run wrote.
    saver = InMemorySaver()

    def forgetting_summary(prompt: str) -> str:
        saver.delete_thread("forgotten")  # (as a saver pruning the thread's checkpoints meanwhile would)
        return short_summary(prompt)

    _noted_turns_six_and_seven(saver, forgetting_summary, "forgotten", caplog)
    assert "could not read again the parent's state" in caplog.text


def _noted_turns_six_and_seven(saver: Any, summarizer: Any, thread: str, caplog: pytest.LogCaptureFixture) -> None:
    """A parent over ``_noting_subgraph(summarizer)`` on ``saver``: turn 6, then turn 7 (logged), which compacts.

    Whatever became of the parent's checkpoint meanwhile, one summary is in its state and both notes.
    """
    outer = StateGraph(_Noted)
    outer.add_node("inner", _noting_subgraph(summarizer))
    outer.add_edge(START, "inner")
    graph = outer.compile(checkpointer=saver)
    config = cfg(thread)
    graph.invoke({"messages": [*chat(2, 180), HumanMessage(words("turn 6", 10))]}, config, durability="sync")
    with caplog.at_level(logging.WARNING, logger="langchain_compaction"):
        state = graph.invoke({"messages": [HumanMessage(words("turn 7", 10))]}, config, durability="sync")
    assert sum(1 for m in state["messages"] if is_summary_message(m)) == 1, "nothing compacted: it proves nothing"
    assert sorted(state["notes"]) == ["6", "7"]


class _DroppingSaver(InMemorySaver):
    """An in-memory saver whose next read fails once ``drop`` is set, as a saver's dropped connection would."""

    drop = False

    def get_tuple(self, config: RunnableConfig) -> Any:
        if self.drop:
            self.drop = False
            raise ConnectionError("the saver's connection was dropped")
        return super().get_tuple(config)


def test_where_reading_the_parents_checkpoint_again_fails_the_compaction_stays_below(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The parent's checkpoint is read again after the summary was paid for: a saver's error there
    # escaped the node, and the turn failed with it. It is taken as the checkpoint's being gone.
    saver = _DroppingSaver()

    def dropping_summary(prompt: str) -> str:
        saver.drop = True
        return short_summary(prompt)

    _noted_turns_six_and_seven(saver, dropping_summary, "dropped", caplog)
    assert "the saver's connection was dropped" in caplog.text


def test_where_the_parents_checkpoint_is_gone_a_compaction_beside_a_sibling_keeps_its_reply() -> None:
    # A compaction that stays below beside another node of the subgraph is written message by message, as one
    # made where no parent is written to is: written as a whole list, it wiped the sibling's reply of that step.
    saver = InMemorySaver()

    def forgetting_summary(prompt: str) -> str:
        saver.delete_thread("beside")
        return short_summary(prompt)

    inner = StateGraph(MessagesState)
    inner.add_node("compact", CompactionNode(forgetting_summary, OPTIONS))
    inner.add_node("a_sibling", lambda state: {"messages": [AIMessage(f"SIBLING {len(state['messages'])}")]})
    inner.add_edge(START, "compact")
    inner.add_edge(START, "a_sibling")
    outer = StateGraph(MessagesState)
    outer.add_node("inner", inner.compile())
    outer.add_edge(START, "inner")
    graph = outer.compile(checkpointer=saver)
    config = cfg("beside")
    graph.invoke({"messages": [*chat(2, 180), HumanMessage(words("turn 6", 10))]}, config, durability="sync")
    state = graph.invoke({"messages": [HumanMessage(words("turn 7", 700))]}, config, durability="sync")
    assert sum(1 for m in state["messages"] if is_summary_message(m)) == 1, "nothing compacted: it proves nothing"
    assert "SIBLING 7" in [m.content for m in state["messages"]]


TOOL_CALLS_A_TURN = 6
"""Tool calls an agent makes each turn, enough for a second compaction in the run after the first one's send-up."""


def test_a_subgraph_run_with_durability_exit_sends_every_compaction_of_the_run_to_its_parent() -> None:
    # With durability "exit" no checkpoint is written during a run: after a send-up the parent runs the
    # subgraph again, and its last checkpoint (a run old) no longer leads the compacted list. Every later
    # compaction of that run stayed below: the parent held 2-3 summaries and grew to 26 messages.
    done = {"turn": 0, "calls": 0}

    def agent(state: _Noted) -> dict[str, Any]:
        key = f"{done['turn']}.{done['calls']}"
        if done["calls"] < TOOL_CALLS_A_TURN:
            return {"messages": [AIMessage("", tool_calls=[{"name": "note", "args": {"key": key}, "id": f"n{key}"}])]}
        return {"messages": [AIMessage(words("noted", 60))]}

    def note(state: _Noted) -> dict[str, Any]:
        done["calls"] += 1
        call = state["messages"][-1].tool_calls[0]
        return {
            "messages": [ToolMessage(words("ok", 300), tool_call_id=call["id"])],
            "notes": {call["args"]["key"]: True},
        }

    outer = StateGraph(_Noted)
    outer.add_node("inner", _noting_loop(agent, note, short_summary))
    outer.add_edge(START, "inner")
    graph = outer.compile(checkpointer=InMemorySaver())
    sizes, placed = [], []
    for turn in range(10):
        done.update(turn=turn, calls=0)
        state = graph.invoke({"messages": [HumanMessage(words(f"turn {turn}", 10))]}, cfg("exit"), durability="exit")
        sizes.append(len(state["messages"]))
        placed.append([i for i, m in enumerate(state["messages"]) if is_summary_message(m)])
    assert placed[1:] == [[0]] * 9, f"the summaries in the parent, turn by turn: {placed}"
    assert len(state["notes"]) == 10 * TOOL_CALLS_A_TURN
    assert max(sizes[1:]) <= 13, f"the parent's sizes, turn by turn: {sizes}"


class _Planned(MessagesState):
    todos: NotRequired[list[dict[str, str]]]


def test_an_agent_in_a_subgraph_keeps_its_to_do_list_across_compactions() -> None:
    # LangChain's own to-do middleware writes ``todos`` from a tool; the
    # compaction before the next model call used to throw the new list away.
    from langchain.agents.middleware import TodoListMiddleware

    def replies(turn: int) -> list[AIMessage]:
        todos = [{"content": f"task {turn} " + words("detail", 150), "status": "in_progress"}]
        call = {"name": "write_todos", "args": {"todos": todos}, "id": f"t{turn}"}
        return [AIMessage("", tool_calls=[call]), AIMessage(words("planned", 40))]

    agent = create_agent(
        ToolCallingFake(messages=iter([r for turn in range(12) for r in replies(turn)])),
        middleware=[TodoListMiddleware(), CompactionMiddleware(short_summary, CompactionOptions(context_window=4_000))],
    )
    outer = StateGraph(_Planned)
    outer.add_node("agent", agent)
    outer.add_edge(START, "agent")
    graph = outer.compile(checkpointer=InMemorySaver())
    config = cfg("planned")
    summaries = 0
    for turn in range(12):
        state = graph.invoke({"messages": [HumanMessage(f"turn {turn} plan it")]}, config)
        summaries += sum(1 for m in state["messages"] if is_summary_message(m))
        assert state["todos"][0]["content"].startswith(f"task {turn} "), f"turn {turn} lost its to-do list"
    assert summaries, "the agent never compacted: the test proves nothing"


class _Read(MessagesState):
    docs: Annotated[list[str], operator.add]


def test_a_key_the_subgraph_only_reads_is_not_written_back_to_its_parent() -> None:
    # Carrying every key up applied the parent's reducer to what it already held: ["d1"] became 8 copies.
    def answer(state: _Read) -> dict[str, Any]:
        return {"messages": [AIMessage(words("answer", 80))]}

    inner = StateGraph(_Read, output_schema=MessagesState)  # (its own output leaves docs alone)
    inner.add_node("compact", CompactionNode(short_summary, OPTIONS))
    inner.add_node("agent", answer)
    inner.add_edge(START, "compact")
    inner.add_edge("compact", "agent")
    outer = StateGraph(_Read)
    outer.add_node("inner", inner.compile())
    outer.add_edge(START, "inner")
    graph = outer.compile(checkpointer=InMemorySaver())
    graph.invoke({"messages": [HumanMessage("hi")], "docs": ["d1"]}, cfg("read"))
    summaries = 0
    for turn in range(20):
        state = graph.invoke({"messages": [HumanMessage(words(f"question {turn}", 60))]}, cfg("read"))
        summaries += sum(1 for m in state["messages"] if is_summary_message(m))
    assert summaries, "nothing compacted: the test proves nothing"
    assert state["docs"] == ["d1"]


@pytest.mark.parametrize("saved", ["no checkpointer", "durability exit"])
def test_an_agent_run_by_a_supervisors_tool_keeps_its_compactions_to_itself(saved: str) -> None:
    # Nothing tells a graph run inside a tool from a subgraph added as a node; where the parent's
    # checkpoint could not be read, the sub-agent's compaction replaced the supervisor's conversation.
    @tool
    def search(query: str) -> str:
        """Search."""
        return words(f"found {query}", 200)

    def researcher_replies() -> list[AIMessage]:
        calls = [
            AIMessage("", tool_calls=[{"name": "search", "args": {"query": f"q{k}"}, "id": f"s{k}"}]) for k in range(15)
        ]
        return [*calls, AIMessage("research done")]

    researcher = create_agent(
        ToolCallingFake(messages=iter(researcher_replies())),
        tools=[search],
        middleware=[CompactionMiddleware(short_summary, OPTIONS)],
    )

    @tool
    def research(task: str) -> str:
        """Hand a research task to the researcher."""
        return str(researcher.invoke({"messages": [HumanMessage(task)]})["messages"][-1].content)

    supervisor_replies = [AIMessage("", tool_calls=[{"name": "research", "args": {"task": "find X"}, "id": "r0"}])]
    supervisor = create_agent(
        ToolCallingFake(messages=iter([*supervisor_replies, AIMessage("final answer")])),
        tools=[research],
        checkpointer=None if saved == "no checkpointer" else InMemorySaver(),
    )
    config = {**cfg("supervised"), "recursion_limit": 100}
    durability: dict[str, Any] = {"durability": "exit"} if saved == "durability exit" else {}
    out = supervisor.invoke({"messages": [HumanMessage("Please research X.", id="ask")]}, config, **durability)
    assert out["messages"][0].id == "ask"
    assert out["messages"][-1].content == "final answer"
    assert not any(isinstance(m, ToolMessage) and m.tool_call_id.startswith("s") for m in out["messages"])


@pytest.mark.parametrize("kind", ["node", "middleware"])
def test_a_subgraph_run_with_durability_exit_gives_no_advice_on_a_turn_that_compacts_nothing(
    kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """With ``durability="exit"`` a thread's first turn has no checkpoint of the parent to read.

    On that turn, which compacted nothing, the node (or the middleware)
    warned that its messages were not the parent's and to pass
    nested='own'; its later compactions did reach the parent, which
    nested='own' would have let grow.
    """
    requests = Requests()
    if kind == "node":
        graph = node_in_subgraph(requests, "parent", RecordingSummarizer())
    else:
        graph = agent_in_subgraph(requests, "parent")
    config = cfg(f"exit {kind}")
    sizes = []
    with caplog.at_level(logging.WARNING, logger="langchain_compaction"):
        for turn in range(30):
            state = graph.invoke({"messages": [HumanMessage(f"question {turn} " * 50)]}, config, durability="exit")
            sizes.append(len(state["messages"]))
    assert requests.invalid == []
    assert [r.getMessage() for r in caplog.records if "nested='own'" in r.getMessage()] == []
    assert max(sizes[10:]) < 30  # the compactions reached the parent


def _subgraph_then_a_parent_node(seen: list[list[BaseMessage]], *, compact_first: bool, saver: bool) -> Any:
    """The subgraph pattern, then a parent node that records the list it is handed (a model call's request)."""
    sub = StateGraph(MessagesState)
    sub.add_node("compact", CompactionNode(short_summary, OPTIONS))
    sub.add_node("model", lambda state: {"messages": [AIMessage("answer")]})
    sub.add_edge(START, "compact")
    sub.add_edge("compact", "model")
    parent = StateGraph(MessagesState)
    parent.add_node("agent", sub.compile())
    parent.add_node("after", lambda state: seen.append(list(state["messages"])) or {})
    if compact_first:  # the fix named: a CompactionNode before the subgraph's node in the parent
        parent.add_node("compact", CompactionNode(short_summary, OPTIONS))
        parent.add_edge(START, "compact")
        parent.add_edge("compact", "agent")
    else:
        parent.add_edge(START, "agent")
    parent.add_edge("agent", "after")
    return parent.compile(checkpointer=InMemorySaver() if saver else None)


@pytest.mark.parametrize("saved", ["durability exit", "no checkpointer"])
def test_where_no_checkpoint_of_the_parent_can_be_read_the_warning_says_what_follows(
    saved: str, caplog: pytest.LogCaptureFixture
) -> None:
    """README: "Where no checkpoint of the parent can be read ... put a `CompactionNode` before the subgraph's node".

    A first turn over the window: the compaction stays in the subgraph, and
    the parent's next node is handed the summary after the whole history.
    The warning said to pass nested='own', which would have let the parent
    grow on every later turn.
    """
    history, run = [*chat(10, 100), HumanMessage("go on")], {}
    if saved == "durability exit":
        run = {"durability": "exit"}
    seen: list[list[BaseMessage]] = []
    graph = _subgraph_then_a_parent_node(seen, compact_first=False, saver=saved != "no checkpointer")
    with caplog.at_level(logging.WARNING, logger="langchain_compaction"):
        graph.invoke({"messages": history}, cfg(saved), **run)
    assert [m.type for m in seen[-1]].index("system") == len(history)  # LangGraph's merge by id
    said = [r.getMessage() for r in caplog.records if r.name == "langchain_compaction"]
    assert len(said) == 1, said
    assert "durability='exit'" in said[0]
    assert "CompactionNode before the subgraph's node" in said[0]
    assert "pass nested='own'" not in said[0]
    requests = Requests()
    if saved == "durability exit":  # the next turn reads the parent's checkpoint: the compaction reaches it
        graph.invoke({"messages": [HumanMessage("next")]}, cfg(saved), **run)
        requests.check(seen[-1])
        assert is_summary_message(seen[-1][0])
        assert len(seen[-1]) < len(history)
    fixed: list[list[BaseMessage]] = []
    graph = _subgraph_then_a_parent_node(fixed, compact_first=True, saver=saved != "no checkpointer")
    graph.invoke({"messages": history}, cfg(saved), **run)
    requests.check(fixed[-1])
    assert is_summary_message(fixed[-1][0])
    assert len(fixed[-1]) < len(history)
    assert requests.invalid == []


def test_agents_in_parallel_branches_never_wipe_each_others_replies() -> None:
    # One agent's compaction sent up replaces the parent's list in the step where its sibling's reply
    # lands too: the reply was wiped (never in the state, never summarized). Beside others, a
    # compaction stays in the agent's own state.
    prompts: list[str] = []

    def summarize(prompt: str) -> str:
        prompts.append(prompt)
        return "## Goal\n- review"

    def agent(who: str) -> Any:
        replies = [AIMessage(f"{who.upper()}{k:03d} " + "t " * 60, id=f"{who}-{k}") for k in range(20)]
        middleware = [CompactionMiddleware(summarize, CompactionOptions(context_window=3_000))]
        return create_agent(
            ToolCallingFake(messages=iter(replies)), system_prompt=f"You are the {who}.", middleware=middleware
        )

    parent = StateGraph(MessagesState)
    parent.add_node("researcher", agent("researcher"))
    parent.add_node("critic", agent("critic"))
    parent.add_node("join", lambda state: {})
    parent.add_edge(START, "researcher")
    parent.add_edge(START, "critic")
    parent.add_edge(["researcher", "critic"], "join")
    graph = parent.compile(checkpointer=InMemorySaver())
    for turn in range(20):
        state = graph.invoke({"messages": [HumanMessage(f"USER{turn:03d} " + "ctx " * 150)]}, cfg("parallel"))
    assert prompts, "nothing compacted: the test proves nothing"
    seen = " ".join(prompts) + " ".join(str(m.content) for m in state["messages"])
    lost = [
        f"{who.upper()}{k:03d}"
        for who in ("researcher", "critic")
        for k in range(20)
        if f"{who.upper()}{k:03d}" not in seen
    ]
    assert lost == []


def test_compact_command_in_a_subgraph_compacts_its_parent() -> None:
    # The node asked whether the parent holds its conversation without the /compact message, which
    # the parent's list has: it compacted its own state, and /compact reached the model next turn.
    from langchain_compaction.graph import route_after_compaction

    seen: list[list[str]] = []

    def model(state: MessagesState) -> dict[str, Any]:
        seen.append([str(m.content) for m in state["messages"] if isinstance(m, HumanMessage)])
        return {"messages": [AIMessage(words("answer", 30))]}

    node = CompactionNode(short_summary, CompactionOptions(context_window=50_000), enable_compact_command=True)
    inner = StateGraph(MessagesState)
    inner.add_node("compact", node)
    inner.add_node("model", model)
    inner.add_edge(START, "compact")
    inner.add_conditional_edges("compact", lambda state: route_after_compaction(state, goto="model"))
    outer = StateGraph(MessagesState)
    outer.add_node("agent", inner.compile())
    outer.add_edge(START, "agent")
    graph = outer.compile(checkpointer=InMemorySaver())
    for turn in range(10):
        graph.invoke({"messages": [HumanMessage(words(f"question {turn}", 100))]}, cfg("command"))
    graph.invoke({"messages": [HumanMessage("/compact keep the order numbers", id="cmd")]}, cfg("command"))
    state = graph.get_state(cfg("command")).values["messages"]
    assert is_summary_message(state[0])
    assert sum(map(is_summary_message, state)) == 1
    assert all(m.id != "cmd" for m in state)
    graph.invoke({"messages": [HumanMessage("question 11")]}, cfg("command"))
    assert not any(text.startswith("/compact") for request in seen for text in request)


class _Worker(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    inner: Annotated[list[AnyMessage], add_messages]


class _Face(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def test_a_subgraph_with_a_key_the_parent_lacks_compacts_its_own_state() -> None:
    """A worker keeps its conversation under ``inner`` (the parent has no such key), with a checkpointer of its own.

    The parent's checkpoint has no ``inner`` at all: the compaction was sent up
    anyway, the parent dropped it and ran the worker again from its start, whose
    first node then added the user's task a second time, and the worker's
    messages were archived under the parent's conversation.
    """
    import re

    from langgraph.store.memory import InMemoryStore

    from langchain_compaction.features import Archive, default_features

    requests: list[list[BaseMessage]] = []

    def ingest(state: _Worker) -> dict[str, Any]:
        return {"inner": [HumanMessage(state["messages"][-1].content)]}

    def model(state: _Worker) -> dict[str, Any]:
        requests.append(list(state["inner"]))
        task = re.findall(r"M\d{4}", str(state["inner"][-1].content))
        return {"inner": [AIMessage(f"worker did {task} " + "work " * 80)], "messages": [AIMessage(f"done {task}")]}

    node = CompactionNode(
        short_summary,
        CompactionOptions(context_window=3_000, reserve_tokens=500, keep_recent_tokens=800),
        messages_key="inner",
        features=[*default_features(), Archive()],
    )
    worker = StateGraph(_Worker, input_schema=_Face, output_schema=_Face)
    worker.add_node("ingest", ingest)
    worker.add_node("compact", node)
    worker.add_node("model", model)
    worker.add_edge(START, "ingest")
    worker.add_edge("ingest", "compact")
    worker.add_edge("compact", "model")
    worker.add_edge("model", END)
    parent = StateGraph(MessagesState)
    parent.add_node("worker", worker.compile(checkpointer=True))
    parent.add_edge(START, "worker")
    parent.add_edge("worker", END)
    store = InMemoryStore()
    graph = parent.compile(checkpointer=InMemorySaver(), store=store)
    for n in range(30):
        graph.invoke({"messages": [HumanMessage(f"M{n:04d} task " + "do " * 60)]}, cfg("t"))
    assert any(is_summary_message(m) for m in requests[-1]), "the worker should have compacted"
    for request in requests:
        said = [str(m.content) for m in request if isinstance(m, HumanMessage)]
        assert len(said) == len(set(said)), "a user turn went to the worker's model twice"
    namespaces = {tuple(ns) for ns in store.list_namespaces(prefix=("compaction_archive",))}
    assert namespaces, "the worker should have archived"
    assert ("compaction_archive", "t") not in namespaces


# -- LangGraph's functional API: a graph run by an @entrypoint or a @task ------------------------------


def _compacting_graph() -> Any:
    """A compiled graph holding a ``CompactionNode`` before a model node, with no checkpointer of its own."""
    sub = StateGraph(MessagesState)
    sub.add_node("compact", CompactionNode(short_summary, CompactionOptions(context_window=3_000)))
    sub.add_node("model", lambda state: {"messages": [AIMessage(words("answer", 60))]})
    sub.add_edge(START, "compact")
    sub.add_edge("compact", "model")
    sub.add_edge("model", END)
    return sub.compile()


@pytest.mark.parametrize("by", ["task", "entrypoint"])
def test_a_graph_run_by_the_functional_api_is_one_level_down(by: str, caplog: pytest.LogCaptureFixture) -> None:
    """An entrypoint saves the list the graph returns, compacted: the graph is one level down, not two.

    Run by a @task, the entrypoint's task and the @task counted as two graph
    levels, and the node warned that its summaries land mid-history in the
    outer graphs, whose state never shrinks: the saved list did shrink.
    """
    from langgraph.func import entrypoint, task

    inner = _compacting_graph()

    @task
    def run_inner(history: list[BaseMessage]) -> list[BaseMessage]:
        return list(inner.invoke({"messages": history})["messages"])

    @entrypoint(checkpointer=InMemorySaver())
    def chat(new: list[BaseMessage], *, previous: list[BaseMessage] | None = None) -> Any:
        history = add_messages(previous or [], new)
        out = run_inner(history).result() if by == "task" else inner.invoke({"messages": history})["messages"]
        return entrypoint.final(value=out[-1], save=out)

    config = cfg(by)
    with caplog.at_level(logging.WARNING, logger="langchain_compaction"):
        for turn in range(30):
            chat.invoke([HumanMessage(words(f"question {turn}", 60))], config)
    saved = chat.checkpointer.get(config)["channel_values"]["__previous__"]  # what the entrypoint saved
    assert is_summary_message(saved[0])
    assert len(saved) < 30
    said = [r.getMessage() for r in caplog.records if r.name == "langchain_compaction"]
    assert len(said) == 1, said
    assert f"@{by}" in said[0]  # it names the setup among its causes,
    assert "nested='own'" in said[0]  # and the option that fits it


def test_a_graph_run_by_a_task_of_a_parent_node_never_commands_the_task(caplog: pytest.LogCaptureFixture) -> None:
    """A node function of a graph holding the messages calls a @task that runs the compacting graph.

    A compaction sent up from there reaches the task, not the parent's
    state, and the task returns nothing: with ``durability="exit"`` the
    parent's last checkpoint would let it be sent.
    """
    from langgraph.func import task

    inner = _compacting_graph()

    @task
    def run_inner(history: list[BaseMessage]) -> list[BaseMessage]:
        return list(inner.invoke({"messages": history})["messages"])

    def node(state: MessagesState) -> dict[str, Any]:
        return {"messages": [run_inner(state["messages"]).result()[-1]]}

    parent = StateGraph(MessagesState)
    parent.add_node("node", node)
    parent.add_edge(START, "node")
    parent.add_edge("node", END)
    graph = parent.compile(checkpointer=InMemorySaver())
    with caplog.at_level(logging.WARNING, logger="langchain_compaction"):
        for turn in range(30):
            state = graph.invoke(
                {"messages": [HumanMessage(words(f"question {turn}", 60))]}, cfg("n"), durability="exit"
            )
    assert [m.type for m in state["messages"][-2:]] == ["human", "ai"]
    said = [r.getMessage() for r in caplog.records if r.name == "langchain_compaction"]
    assert len(said) == 1, said
    assert "nested more than one level" not in said[0]
    assert "nested='own'" in said[0]


def test_a_thread_id_given_as_a_number_finds_its_parents_checkpoint(caplog: pytest.LogCaptureFixture) -> None:
    # LangGraph saves checkpoints under str(thread_id) but hands the node the
    # number: read with it, the parent's checkpoint was missed (2 s waited a
    # turn) and the summary stayed below, after the parent's whole history.
    requests = Requests()
    graph = node_in_subgraph(requests, "parent", RecordingSummarizer())
    config = {"configurable": {"thread_id": 7}}
    with caplog.at_level(logging.WARNING, logger="langchain_compaction"):
        for turn in range(12):
            state = graph.invoke({"messages": [HumanMessage(f"question {turn} " * 50)]}, config)
    assert requests.invalid == []
    assert summaries(state["messages"]) == 1
    assert is_summary_message(state["messages"][0])  # the parent itself was compacted
    assert len(state["messages"]) < 24
    assert "no checkpoint of its parent could be read" not in caplog.text


def test_a_send_up_keeps_no_copy_of_the_parents_state_where_its_checkpoint_is_read() -> None:
    # The state a send-up leaves the parent in is needed only where the parent's step checkpoint is
    # never written (durability "exit"); kept under "async" too, it held a whole state per send-up.
    requests, node = Requests(), CompactionNode(RecordingSummarizer(), OPTIONS)
    graph = node_in_subgraph(requests, "parent", None, node=node)
    for turn in range(15):
        state = graph.invoke({"messages": [HumanMessage(f"question {turn} " * 50)]}, cfg("kept"))
    assert is_summary_message(state["messages"][0])  # sent up: the parent itself was compacted
    assert requests.invalid == []
    delivery = node._delivery
    assert len(delivery._left) == 0
    assert all(entry[2] is None for entry in delivery._sent._items.values())
