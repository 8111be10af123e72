"""Turns of real graphs and agents, shared by the unit tests of several subjects.

Conversations (``chat``, ``long_history``, ``words``), a thread's config
(``cfg``), a graph that compacts then answers (``graph_with``), a recall graph
over the archive, summarizers that record what they were asked, and waiting for
background preparations through the public ``PrepareAhead.running``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.prebuilt import ToolNode

from langchain_compaction import CompactionNode, CompactionOptions
from langchain_compaction._lc.conversation import conversation_of, thread_label
from langchain_compaction.core.types import SummaryRequest
from langchain_compaction.features import Archive, PrepareAhead, default_features
from langchain_compaction.graph import CompactionState, route_after_compaction

SUMMARY = "## Goal\n- x"
ARCHIVE_NS = "compaction_archive"
SMALL_WINDOW = CompactionOptions(context_window=3_000)
# One summary request per compaction (a large summarizer input), so calls count compactions.
PREPARE_OPTS = CompactionOptions(
    context_window=4_000, reserve_tokens=500, keep_recent_tokens=400, summary_input_tokens=50_000
)


# -- conversations ------------------------------------------------------------------------


def short_summary(prompt: str) -> str:
    """A plain-function summarizer with a one-line summary."""
    return SUMMARY


def words(label: str, n: int = 60) -> str:
    return f"{label} " + "word " * n


def cfg(thread: object) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}}


def chat(turns: int, size: int = 400) -> list[BaseMessage]:
    """``turns`` question/answer pairs (ids h0, a0, ...), each message ``size`` times a few words."""
    messages: list[BaseMessage] = []
    for i in range(turns):
        messages += [HumanMessage(f"question {i} " * size, id=f"h{i}"), AIMessage(f"answer {i} " * size, id=f"a{i}")]
    return messages


def long_history(n: int = 40, size: int = 60) -> list[BaseMessage]:
    """``n`` alternating human and AI messages of ``size`` words."""
    out: list[BaseMessage] = []
    for i in range(n):
        out.append(
            HumanMessage(words(f"q{i}", size), id=f"h{i}")
            if i % 2 == 0
            else AIMessage(words(f"a{i}", size), id=f"a{i}")
        )
    return out


# -- models and summarizers ---------------------------------------------------------------


class ToolCallingFake(GenericFakeChatModel):
    """GenericFakeChatModel with bind_tools, so create_agent can give it tools."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> ToolCallingFake:
        return self


class RequestRecorder:
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


# -- graphs -------------------------------------------------------------------------------


def _short_answer(state: dict[str, Any]) -> dict[str, Any]:
    return {"messages": [AIMessage(words("answer", 20), id=f"a-{time.monotonic_ns()}")]}


def graph_with(
    node: CompactionNode,
    *,
    saver: Any = None,
    store: Any = None,
    route: bool = False,
    agent: Callable[[Any], dict[str, Any]] = _short_answer,
) -> Any:
    """START -> compact -> agent -> END (by default the agent answers with a short reply)."""
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


# -- the archive ---------------------------------------------------------------------------


def archived(**kw: Any) -> list[Any]:
    """The default features, and the archive."""
    return [*default_features(), Archive(**kw)]


def archive_items(store: Any, thread: object) -> list[Any]:
    """Every archived item of a thread (its own graph's and its sub-agents')."""
    return store.search((ARCHIVE_NS, thread_label(thread)), limit=100_000)


def archive_graph_with_recall(store: Any) -> tuple[Any, CompactionNode]:
    """compact -> agent -> (recall_messages through a ToolNode) in one graph, so recall runs in the branch."""
    node = CompactionNode(short_summary, SMALL_WINDOW, features=archived(), result_key="compaction")
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


# -- prepared summaries -------------------------------------------------------------------


def prepared(**kw: Any) -> list[Any]:
    """The default features, and summaries prepared past 70% of the threshold."""
    return [*default_features(), PrepareAhead(at=0.7, **kw)]


def prepare_of(adapter: Any) -> PrepareAhead:
    """The adapter's PrepareAhead feature (public: ``adapter.features``)."""
    return next(f for f in adapter.features if isinstance(f, PrepareAhead))


def wait_for(condition: Any, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the background preparation never finished"
        time.sleep(0.01)


def wait_for_preparations(
    *adapters: Any, thread: object = None, messages: Sequence[BaseMessage] = (), seconds: float = 3.0
) -> None:
    """Wait until the adapters' background preparations of one conversation have finished."""
    conversation = conversation_of(cfg(thread) if thread is not None else None, messages)
    features = [prepare_of(a) for a in adapters]
    wait_for(lambda: not any(f.running(conversation) for f in features), seconds)
    time.sleep(0.01)  # and handed their result back
