"""Threads and sessions written by langchain-compaction 0.1.0 keep compacting correctly.

The states in ``tests/data/v0_1_0`` were saved by 0.1.0 (``make_state.py`` there
says how): a graph thread after three compactions and a chat-memory session with
an archive. Whatever the summary's format becomes, such a thread must go on:
the old summary is updated (never nested, never read as the user's words), the
old bridge turn is replaced, and an archive never receives a message twice.
"""

from __future__ import annotations

import json
import shutil
import time
from collections import Counter
from pathlib import Path

from langchain_community.chat_message_histories import FileChatMessageHistory
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage, messages_from_dict
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph

from langchain_compaction import CompactingChatMessageHistory, CompactionNode, CompactionOptions, ExtractiveSummarizer
from langchain_compaction.graph import CompactionState
from tests.conftest import RecordingSummarizer, split_compacted

SAVED = Path(__file__).resolve().parents[1] / "data" / "v0_1_0"
MARK = "langchain_compaction"


def _saved_graph_state() -> dict:
    data = json.loads((SAVED / "graph_state.json").read_text(encoding="utf-8"))
    return {"messages": messages_from_dict(data["messages"]), "compaction": data["compaction"]}


def test_saved_graph_thread_is_updated_not_nested() -> None:
    saved = _saved_graph_state()
    old_summary = next(m for m in saved["messages"] if m.additional_kwargs.get(MARK, {}).get("kind") == "summary")
    old_bridge = next(m for m in saved["messages"] if m.additional_kwargs.get(MARK, {}).get("kind") == "bridge")
    recorder = RecordingSummarizer()
    node = CompactionNode(
        recorder,
        CompactionOptions(context_window=3_000, reserve_tokens=600, keep_recent_tokens=700),
        result_key="compaction",
    )

    def agent(state: CompactionState) -> dict:
        turn = len(state["messages"])
        call = {"name": "read_file", "args": {"path": f"src/new_{turn}.py"}, "id": f"new_{turn}"}
        return {
            "messages": [
                AIMessage("Reading.", tool_calls=[call], id=f"new-ai-{turn}"),
                ToolMessage("x = 1\n" * 60, tool_call_id=f"new_{turn}", id=f"new-tool-{turn}"),
            ]
        }

    builder = StateGraph(CompactionState)
    builder.add_node("compact", node)
    builder.add_node("agent", agent)
    builder.add_edge(START, "compact")
    builder.add_edge("compact", "agent")
    graph = builder.compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "old-thread"}}
    graph.update_state(config, saved, as_node="agent")
    for turn in range(12):
        state = graph.invoke({"messages": [HumanMessage(f"continue {turn}", id=f"next-{turn}")]}, config)
        if recorder.prompts:
            break
    assert recorder.prompts, "the restored thread never compacted"
    prompt = recorder.prompts[0]
    # The old summary is shown as the previous summary, once, not as a message to summarize.
    body = str(old_summary.content).split("\n\n", 1)[1]
    assert body.startswith("## Goal")
    assert prompt.count(body) == 1
    assert "previous-summary" in prompt
    assert old_bridge.content not in prompt
    messages = state["messages"]
    parts = split_compacted(messages)
    assert parts.lead[0].id == "system-prompt"
    assert all(m.id not in (old_summary.id, old_bridge.id) for m in messages)


def test_saved_history_session_keeps_its_archive_exact(tmp_path: Path) -> None:
    for name in ("history.json", "history_archive.json"):
        shutil.copy(SAVED / name, tmp_path / name)
    before = messages_from_dict(json.loads((tmp_path / "history.json").read_text(encoding="utf-8")))
    archived_before = messages_from_dict(json.loads((tmp_path / "history_archive.json").read_text(encoding="utf-8")))
    history = CompactingChatMessageHistory(
        FileChatMessageHistory(str(tmp_path / "history.json")),
        ExtractiveSummarizer(),
        CompactionOptions(context_window=2_000, reserve_tokens=500, keep_recent_tokens=300),
        archive=FileChatMessageHistory(str(tmp_path / "history_archive.json")),
    )
    sent = [m for m in before if MARK not in m.additional_kwargs]
    for i in range(20, 40):
        batch = [HumanMessage(f"question {i} " * 8, id=f"new-q-{i}"), AIMessage(f"answer {i} " * 12, id=f"new-a-{i}")]
        sent += batch
        history.add_messages(batch)
    archive = history.archive.messages
    assert len(archive) > len(archived_before), "the restored session never compacted"
    stored = [m for m in history.messages if MARK not in m.additional_kwargs]
    # Every message sent since the save is in the store or the archive, exactly once;
    # the archive holds no summary or bridge, and nothing twice.
    counts = Counter(m.id for m in [*archive[len(archived_before) :], *stored])
    assert {m.id for m in sent} <= set(counts)
    assert all(n == 1 for n in counts.values())
    assert all(MARK not in m.additional_kwargs for m in archive)
    assert len({m.id for m in archive}) == len(archive)


# -- 0.2.0: checked facts, pins, the archive and prepared summaries in the store ----------------

SAVED_0_2 = Path(__file__).resolve().parents[1] / "data" / "v0_2_0"


def _restored_0_2(features: list) -> tuple:
    from langgraph.store.memory import InMemoryStore

    from langchain_compaction.graph import CompactionState

    data = json.loads((SAVED_0_2 / "graph_state.json").read_text(encoding="utf-8"))
    store = InMemoryStore()
    for item in json.loads((SAVED_0_2 / "store.json").read_text(encoding="utf-8")):
        store.put(tuple(item["namespace"]), item["key"], item["value"], index=False)
    recorder = RecordingSummarizer()
    node = CompactionNode(
        recorder,
        CompactionOptions(context_window=3_000, reserve_tokens=600, keep_recent_tokens=700),
        result_key="compaction",
        features=features,
    )

    def agent(state: CompactionState) -> dict:
        turn = len(state["messages"])
        return {"messages": [AIMessage(f"Done with new step {turn}. " + "details " * 30, id=f"new-ai-{turn}")]}

    builder = StateGraph(CompactionState)
    builder.add_node("compact", node)
    builder.add_node("agent", agent)
    builder.add_edge(START, "compact")
    builder.add_edge("compact", "agent")
    graph = builder.compile(checkpointer=InMemorySaver(), store=store)
    config = {"configurable": {"thread_id": "old-thread"}}
    saved = {"messages": messages_from_dict(data["messages"]), "compaction": data["compaction"]}
    graph.update_state(config, saved, as_node="agent")
    return graph, node, store, recorder, config, saved


def test_a_0_2_thread_with_its_archive_goes_on() -> None:
    from langchain_core.messages import AIMessage as AI
    from langgraph.prebuilt import ToolNode

    from langchain_compaction.features import Archive, PrepareAhead, default_features

    features = [*default_features(), Archive(), PrepareAhead(at=0.7, in_store=True)]
    graph, node, store, recorder, config, saved = _restored_0_2(features)
    old = saved["messages"]
    old_summary = next(m for m in old if m.additional_kwargs.get(MARK, {}).get("kind") == "summary")
    old_number = old_summary.additional_kwargs[MARK]["compaction"]
    old_items = store.search(("compaction_archive", "old-thread"), limit=10_000)
    sent = [m for m in old if MARK not in m.additional_kwargs]
    for turn in range(30):
        message = HumanMessage(f"continue {turn} " + "words " * 30, id=f"next-{turn}")
        state = graph.invoke({"messages": [message]}, config)
        sent += [message, state["messages"][-1]]
        if all(m.id != old_summary.id for m in state["messages"]):
            break
        time.sleep(0.05)  # a summary being prepared in the background finishes meanwhile
    assert all(m.id != old_summary.id for m in state["messages"]), "the restored thread never compacted"
    # The 0.2 summary is updated, not nested; its facts are carried on.
    assert recorder.prompts[0].count("previous-summary") >= 1
    messages = state["messages"]
    summary = split_compacted(messages).summary
    mark = summary.additional_kwargs[MARK]
    assert mark["compaction"] == old_number + 1  # numbered on from 0.2's record
    assert "Never touch vendor/." in str(summary.content)  # a 0.2 fact, carried on (the booking ref is recalled below)
    # Every message is in the state or the archive (0.2's items and the new ones), once.
    items = store.search(("compaction_archive", "old-thread"), limit=10_000)
    assert len(items) > len(old_items)
    where = Counter(i.value["message"]["data"]["id"] for i in items)
    where.update(m.id for m in messages if MARK not in m.additional_kwargs)
    assert {m.id for m in sent} <= set(where)
    assert [i for i, n in where.items() if n > 1] == []
    # 0.2's archived messages are read back in this timeline.
    tool = node.recall_tool()
    tools = StateGraph(CompactionState)
    tools.add_node("tools", ToolNode([tool]))
    tools.add_edge(START, "tools")
    call = AI("", tool_calls=[{"name": tool.name, "args": {"query": "QX7-2210"}, "id": "r1", "type": "tool_call"}])
    answer = tools.compile(store=store).invoke({"messages": [*messages, call]}, config)["messages"][-1]
    assert "Booking ref QX7-2210" in str(answer.content)


def test_a_0_2_session_goes_on(tmp_path: Path) -> None:
    for name in ("history.json", "history_archive.json"):
        shutil.copy(SAVED_0_2 / name, tmp_path / name)
    archived_before = messages_from_dict(json.loads((tmp_path / "history_archive.json").read_text(encoding="utf-8")))
    history = CompactingChatMessageHistory(
        FileChatMessageHistory(str(tmp_path / "history.json")),
        ExtractiveSummarizer(),
        CompactionOptions(context_window=2_000, reserve_tokens=500, keep_recent_tokens=300),
        archive=FileChatMessageHistory(str(tmp_path / "history_archive.json")),
    )
    sent = [m for m in history.messages if MARK not in m.additional_kwargs]
    for i in range(60, 90):
        batch = [HumanMessage(f"question {i} " * 8, id=f"new-q-{i}"), AIMessage(f"answer {i} " * 12, id=f"new-a-{i}")]
        sent += batch
        history.add_messages(batch)
    archive = history.archive.messages
    assert len(archive) > len(archived_before), "the restored session never compacted"
    stored = [m for m in history.messages if MARK not in m.additional_kwargs]
    counts = Counter(m.id for m in [*archive[len(archived_before) :], *stored])
    assert {m.id for m in sent} <= set(counts)
    assert all(n == 1 for n in counts.values())
