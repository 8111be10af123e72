"""A summarizer that fails part-way: the chunks it answered are kept, the rest stays verbatim, nothing is lost.

A region larger than one summary request is summarized in chunks. When a later
chunk's call fails (and there is no fallback), all-or-nothing would throw the
answered chunks away; under a summarizer that fails now and then, a long
backlog then only grows (each attempt needs every chunk to succeed). Instead
the summary of the chunks that answered replaces their messages, the cut moves
back to the failed chunk, and the next compaction goes on from there. Where a
feature already committed the whole region before the summary (the archive),
the compaction stays all or nothing.
"""

from __future__ import annotations

import logging

import pytest
from langchain_core.chat_history import InMemoryChatMessageHistory
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.store.memory import InMemoryStore

from langchain_compaction import (
    CompactingChatMessageHistory,
    CompactionNode,
    CompactionOptions,
    acompact,
    compact,
)
from langchain_compaction.errors import SummarizationError
from langchain_compaction.features import Archive, default_features
from langchain_compaction.tokens import estimate_message_tokens

# Requests of about 3,000 tokens: a 100-message region needs several chunks.
OPTIONS = CompactionOptions(context_window=20_000, summary_input_tokens=3_000, keep_recent_tokens=1_000)


class FailingCalls:
    """A summary model (a plain function, as a user may pass) whose calls numbered in ``failing`` raise."""

    def __init__(self, failing: set[int] | None = None, every: int = 0) -> None:
        self.failing = failing or set()
        self.every = every
        self.calls = 0

    def __call__(self, prompt: str) -> str:
        self.calls += 1
        if self.calls in self.failing or (self.every and self.calls % self.every == 0):
            raise ConnectionError("the model's server dropped the connection")
        return "## Goal\n- refactor the parser\n\n## Progress\n- chunks read so far\n"


def session(turns: int, tag: str = "") -> list[BaseMessage]:
    out: list[BaseMessage] = []
    for i in range(turns):
        out.append(HumanMessage(f"request {tag}{i}: " + "please refactor the parser module " * 20, id=f"h{tag}{i}"))
        out.append(AIMessage(f"done {tag}{i}: " + "refactored " * 40, id=f"a{tag}{i}"))
    return out


def test_a_failed_later_chunk_keeps_what_the_earlier_chunks_summarized(caplog: pytest.LogCaptureFixture) -> None:
    messages = session(60)
    model = FailingCalls(failing={3})
    with caplog.at_level(logging.WARNING, logger="langchain_compaction"):
        result, out = compact(model, messages, OPTIONS)
    assert result is not None
    assert model.calls == 3
    assert result.chunks == 2
    # The summary, then every message from the failed chunk on, verbatim and in order.
    assert str(out[0].id).startswith("compaction-summary")
    removed = len(messages) - (len(out) - 1)
    assert removed == result.messages_removed > 0
    assert out[1:] == messages[removed:]
    assert removed % 2 == 0  # a chunk ends between exchanges, never inside one
    assert "failed on chunk 3" in caplog.text
    assert "stay verbatim until the next compaction" in caplog.text
    # The next compaction, with the model answering, goes on from there.
    again, final = compact(FailingCalls(), out, OPTIONS)
    assert again is not None
    assert estimate_message_tokens(final) < estimate_message_tokens(out)


async def test_the_async_path_keeps_the_answered_chunks_too() -> None:
    messages = session(60)
    result, out = await acompact(FailingCalls(failing={2}), messages, OPTIONS)
    assert result is not None
    assert result.chunks == 1
    assert out[1:] == messages[result.messages_removed :]


def test_a_failed_first_chunk_changes_nothing() -> None:
    messages = session(60)
    with pytest.raises(SummarizationError):
        compact(FailingCalls(failing={1}), messages, OPTIONS)


def test_with_the_archive_a_failed_chunk_fails_the_compaction_and_loses_nothing() -> None:
    """The archive committed the whole region before the summary: keeping part of it would archive kept messages."""
    node = CompactionNode(FailingCalls(failing={3}), OPTIONS, features=[*default_features(), Archive()])
    builder = StateGraph(MessagesState)
    builder.add_node("compact", node)
    builder.add_edge(START, "compact")
    graph = builder.compile(checkpointer=InMemorySaver(), store=InMemoryStore())
    config = {"configurable": {"thread_id": "t"}}
    messages = session(60)
    with pytest.raises(SummarizationError):
        graph.invoke({"messages": messages}, config)
    assert [m.id for m in graph.get_state(config).values["messages"]] == [m.id for m in messages]


def test_chat_memory_converges_under_a_summarizer_that_fails_every_third_call() -> None:
    """Chunk by chunk the backlog shrinks: the store ends within the window, every message kept or archived once."""
    options = CompactionOptions(context_window=6_000, summary_input_tokens=1_500, keep_recent_tokens=500)
    archive = InMemoryChatMessageHistory()
    memory = CompactingChatMessageHistory(
        InMemoryChatMessageHistory(), FailingCalls(every=3), options, fallback=None, on_error="warn", archive=archive
    )
    sent = session(150)
    for start in range(0, len(sent), 2):
        memory.add_messages(sent[start : start + 2])
    stored = memory.messages
    assert estimate_message_tokens(stored) <= options.context_window
    seen = [m.id for m in stored if m.id and m.id[0] in "ha"] + [m.id for m in archive.messages]
    assert sorted(seen) == sorted(m.id for m in sent)  # each message once: kept, or archived


def test_a_failed_chunk_inside_a_tool_exchange_never_strands_a_result() -> None:
    """Parallel calls whose results do not fit one request are split across chunks; the cut never is."""
    messages: list[BaseMessage] = [HumanMessage("inspect the three services", id="h0")]
    calls = [{"name": "read_log", "args": {"service": f"svc{n}"}, "id": f"c{n}", "type": "tool_call"} for n in range(3)]
    messages.append(AIMessage("reading the logs", tool_calls=calls, id="a0"))
    messages += [ToolMessage("log line " * 400, tool_call_id=f"c{n}", id=f"t{n}") for n in range(3)]
    messages += session(20)
    # Requests of 1,000 tokens: the first chunk ends after the first result, the second holds the second alone.
    options = CompactionOptions(context_window=40_000, summary_input_tokens=1_000, keep_recent_tokens=1_000)
    result, out = compact(FailingCalls(failing={2}), messages, options)
    assert result is not None
    assert result.chunks == 1
    assert result is not None
    called = set()
    for message in out:
        if isinstance(message, AIMessage):
            called |= {call["id"] for call in message.tool_calls}
        if isinstance(message, ToolMessage):
            assert message.tool_call_id in called, f"{message.id} kept without its call"
    kept = {m.id for m in out}
    assert sorted(kept & {"t0", "t1", "t2"}) in ([], ["t0", "t1", "t2"])  # the exchange stays whole or goes whole
