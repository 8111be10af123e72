"""Which conversation a turn belongs to: threads without an id, thread id 0, thread ids with a NUL byte.

Prepared summaries and the archive are kept per conversation (the thread id, or
the messages' own identity when there is none); each test runs a real graph
with ``InMemorySaver`` and ``InMemoryStore``.
"""

from __future__ import annotations

import pytest
from helpers_turns import (
    PREPARE_OPTS,
    SMALL_WINDOW,
    archive_graph_with_recall,
    archive_items,
    archived,
    cfg,
    graph_with,
    long_history,
    prepare_of,
    prepared,
    short_summary,
    wait_for_preparations,
    words,
)
from langchain_core.messages import BaseMessage, HumanMessage
from langgraph.store.memory import InMemoryStore

from langchain_compaction import CompactionError, CompactionNode
from langchain_compaction._lc.convert import is_summary_message


def test_conversations_without_a_thread_do_not_share_one_preparation() -> None:
    """Two conversations without a thread id each get, and apply, their own prepared summary."""
    node = CompactionNode(short_summary, PREPARE_OPTS, result_key="compaction", features=prepared(wait=0.5))
    x = long_history(48, 40)
    y = [HumanMessage(words(f"y{i}", 40), id=f"y{i}") for i in range(48)]
    assert prepare_of(node).mark < node.context_tokens(y) < PREPARE_OPTS.budget.threshold
    node.invoke({"messages": x})  # conversation X passes the preparation mark: its summary is prepared
    wait_for_preparations(node, messages=x)
    node.invoke({"messages": y})  # another conversation (no checkpointer either) passes the mark
    wait_for_preparations(node, messages=y)

    def grown(history: list[BaseMessage], label: str) -> list[BaseMessage]:
        return [*history, *(HumanMessage(words(f"{label}{i}", 40), id=f"{label}{i}") for i in range(20))]

    y_update = node.invoke({"messages": grown(y, "ymore")})  # Y at its threshold
    x_update = node.invoke({"messages": grown(x, "xmore")})  # X at its threshold
    applied = {
        "X": x_update["compaction"]["parts"]["prepared"]["applied"],
        "Y": y_update["compaction"]["parts"]["prepared"]["applied"],
    }
    assert all(applied.values()), f"applied a summary prepared for it: {applied}"


def test_thread_id_zero_is_a_thread() -> None:
    """thread_id=0 is a thread like any other: its compacted messages are archived."""
    store = InMemoryStore()
    node = CompactionNode(short_summary, SMALL_WINDOW, features=archived(), result_key="compaction")
    graph = graph_with(node, store=store)
    for turn in range(30):
        state = graph.invoke({"messages": [HumanMessage(words(f"q{turn}"))]}, cfg(0))
    assert any(is_summary_message(m) for m in state["messages"]), "thread 0 never compacted"
    assert archive_items(store, 0), f"nothing archived for thread 0; namespaces: {store.list_namespaces()}"


def test_thread_id_with_nul_raises_only_compaction_errors() -> None:
    """A thread id with a NUL byte never fails a turn with a store's own error (PrepareAhead(in_store=True))."""
    store = InMemoryStore()
    node = CompactionNode(
        short_summary, PREPARE_OPTS, result_key="compaction", features=prepared(wait=0.5, in_store=True)
    )
    graph = graph_with(node, store=store)
    for turn in range(60):
        try:
            graph.invoke({"messages": [HumanMessage(words(f"q{turn}"))]}, cfg("user\x00one"))
        except CompactionError:
            return  # a documented, library error is acceptable
        except Exception as error:
            pytest.fail(f"turn {turn} raised {type(error).__module__}.{type(error).__name__}: {error}")
        wait_for_preparations(node, thread="user\x00one")


def test_thread_id_with_nul_archive_can_be_recalled() -> None:
    """A thread id with a NUL byte: what is archived can be recalled."""
    store = InMemoryStore()
    graph, _ = archive_graph_with_recall(store)
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


def test_a_conversation_without_a_thread_is_known_by_how_it_opens_and_an_edit_makes_it_another() -> None:
    """The same opening read anew (a checkpoint's copies) is the same conversation; one edited in place is not."""
    from langchain_core.messages import SystemMessage

    from langchain_compaction._lc.conversation import conversation_of

    history: list[BaseMessage] = [SystemMessage("You are terse."), *long_history(6, 10)]
    key = conversation_of({}, history).key
    assert conversation_of({}, [m.model_copy() for m in history]).key == key
    assert conversation_of({}, [*history, HumanMessage("more", id="late")]).key == key  # grown: the same
    history[1].content = str(history[1].content) + " and one more sentence"  # edited in place, the same object
    assert conversation_of({}, history).key != key
    history[1].content = history[1].content.replace("and one more sentence", "and two more sentences")
    edited = conversation_of({}, history).key
    assert edited != key
    assert conversation_of({}, [m.model_copy() for m in history]).key == edited
