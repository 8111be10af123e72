"""Pinned context: what the user pins, and a plan tool's latest call, are never summarized."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from conftest import assert_valid_anthropic_request, compaction_graph, split_compacted
from helpers_turns import SMALL_WINDOW, cfg, graph_with, short_summary, words
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver

from langchain_compaction import CompactionNode, CompactionOptions, auto_compact, compact
from langchain_compaction.errors import ConfigurationError
from langchain_compaction.features import CheckedFacts, ClearToolOutputs, Pins
from langchain_compaction.graph import CompactionState

OPTIONS = CompactionOptions(context_window=4_000, reserve_tokens=500, keep_recent_tokens=400)
PIN = {"compaction_pin": True}


def summarize(prompt: str) -> str:
    return "## Goal\n- keep working"


def todos(turn: int, items: list[str]) -> list[BaseMessage]:
    call = {"name": "write_todos", "args": {"todos": items}, "id": f"todo-{turn}", "type": "tool_call"}
    return [
        AIMessage("", tool_calls=[call], id=f"plan-{turn}"),
        ToolMessage(f"Updated todos: {items}", tool_call_id=f"todo-{turn}", id=f"plan-result-{turn}"),
    ]


def chat(turn: int) -> list[BaseMessage]:
    return [
        HumanMessage(f"step {turn}: " + "please continue with the migration work " * 8, id=f"h{turn}"),
        AIMessage(f"done with step {turn}. " + "the tables were moved " * 8, id=f"a{turn}"),
    ]


def test_the_latest_write_todos_call_survives_every_compaction_verbatim() -> None:
    messages: list[BaseMessage] = [
        *chat(0),
        *todos(1, ["old plan"]),
        *chat(2),
        *todos(3, ["migrate users", "drop legacy"]),
    ]
    for turn in range(4, 40):
        messages += chat(turn)
    result, out = compact(summarize, messages, OPTIONS)
    parts = split_compacted(out)
    assert [m.id for m in parts.recent[:2]] == ["plan-3", "plan-result-3"]  # the latest list, whole
    assert parts.bridge is not None  # the pinned exchange starts with the assistant: a user turn first
    assert "plan-1" not in {m.id for m in out}  # the older list was summarized
    assert result.part("pins")["pinned"] == 2
    assert_valid_anthropic_request(out)
    # Compacted again (and again), it stays.
    for round_ in range(3):
        out = [*out, *(m for turn in range(100 * (round_ + 1), 100 * (round_ + 1) + 30) for m in chat(turn))]
        result, out = compact(summarize, out, OPTIONS)
        assert "plan-3" in {m.id for m in out}
        assert_valid_anthropic_request(out)


def test_a_message_the_user_pinned_is_written_back_after_each_summary() -> None:
    rule = HumanMessage("The production database is read-only until Friday.", id="rule", additional_kwargs=PIN)
    messages: list[BaseMessage] = [*chat(0), rule, AIMessage("Understood.", id="ok")]
    for turn in range(1, 40):
        messages += chat(turn)
    out = messages
    for round_ in range(3):
        result, out = compact(summarize, out, OPTIONS)
        parts = split_compacted(out)
        assert parts.recent[0] is rule
        assert parts.bridge is None  # it is a user turn itself
        assert_valid_anthropic_request(out)
        out = [*out, *(m for turn in range(100 * (round_ + 1), 100 * (round_ + 1) + 30) for m in chat(turn))]


def test_a_pinned_call_keeps_its_whole_message_and_every_parallel_result() -> None:
    calls = [
        {"name": "write_todos", "args": {"todos": ["a", "b"]}, "id": "t1", "type": "tool_call"},
        {"name": "read_file", "args": {"path": "schema.sql"}, "id": "r1", "type": "tool_call"},
    ]
    exchange: list[BaseMessage] = [
        AIMessage("Planning and reading.", tool_calls=calls, id="both"),
        ToolMessage("Updated todos", tool_call_id="t1", id="res-t1"),
        ToolMessage("CREATE TABLE users (...)", tool_call_id="r1", id="res-r1"),
    ]
    messages: list[BaseMessage] = [*chat(0), *exchange]
    for turn in range(1, 40):
        messages += chat(turn)
    result, out = compact(summarize, messages, OPTIONS)
    parts = split_compacted(out)
    assert [m.id for m in parts.recent[:3]] == ["both", "res-t1", "res-r1"]
    assert result.part("pins")["pinned"] == 3
    assert_valid_anthropic_request(out)


def test_a_pinned_reply_that_paused_a_server_tool_keeps_every_reply_that_continues_it() -> None:
    # Claude paused after a web search, and again after the next: the pin wrote back the paused reply
    # alone, its server_tool_use without the web_search_tool_result of the reply that continued it.
    def search(ident: str) -> tuple[dict[str, Any], dict[str, Any]]:
        use = {"type": "server_tool_use", "id": ident, "name": "web_search", "input": {"query": ident}}
        hits = [{"type": "web_search_result", "url": "https://ex.com", "title": "T", "encrypted_content": "e" * 80}]
        return use, {"type": "web_search_tool_result", "tool_use_id": ident, "content": hits}

    (first, first_hits), (second, second_hits) = search("srvtoolu_a"), search("srvtoolu_b")
    turn = [
        AIMessage([{"type": "text", "text": "Searching."}, first], id="paused", additional_kwargs=PIN),
        AIMessage([first_hits, {"type": "text", "text": "One more."}, second], id="again"),
        AIMessage([second_hits, {"type": "text", "text": "The release adds a cache."}], id="done"),
    ]
    messages: list[BaseMessage] = [*chat(0), HumanMessage("What is new in the release?", id="ask"), *turn]
    for step in range(1, 40):
        messages += chat(step)
    result, out = compact(summarize, messages, OPTIONS)
    assert [m.id for m in split_compacted(out).recent[:3]] == ["paused", "again", "done"]
    assert result.part("pins")["pinned"] == 3
    assert_valid_anthropic_request(out)


def test_the_pinned_total_has_a_cap_and_the_result_says_when_it_is_hit(caplog: pytest.LogCaptureFixture) -> None:
    messages: list[BaseMessage] = []
    for turn in range(30):
        messages += chat(turn)
        if turn % 10 == 0:
            messages.append(
                HumanMessage(f"pinned note {turn}: " + "remember this " * 20, id=f"pin{turn}", additional_kwargs=PIN)
            )
            messages.append(AIMessage("Noted.", id=f"noted{turn}"))
    options = CompactionOptions(context_window=4_000, reserve_tokens=500, keep_recent_tokens=400)
    with caplog.at_level(logging.WARNING, logger="langchain_compaction"):
        result, out = compact(summarize, messages, options, features=[CheckedFacts(), Pins(max_tokens=120)])
    ids = {m.id for m in out}
    assert "pin20" in ids  # the newest pin fits
    assert "pin0" not in ids  # older ones go to the summary
    assert result.part("pins")["over_cap"] == 2
    assert "pinned exchange(s) were summarized" in caplog.text


def test_pinning_can_be_turned_off_and_is_checked() -> None:
    messages: list[BaseMessage] = [*chat(0), *todos(1, ["plan"])]
    for turn in range(2, 40):
        messages += chat(turn)
    options = CompactionOptions(context_window=4_000, reserve_tokens=500, keep_recent_tokens=400)
    for features in ([CheckedFacts(), Pins(tools=())], [CheckedFacts()]):
        result, out = compact(summarize, messages, options, features=features)
        assert result.part("pins").get("pinned", 0) == 0
        assert "plan-1" not in {m.id for m in out}
    with pytest.raises(ConfigurationError, match="tools"):
        Pins(tools="write_todos")  # type: ignore[arg-type]


def test_a_graph_agent_keeps_its_todo_list_across_compactions() -> None:
    """The deepagents report: after summarization the active todo list is gone."""
    node = CompactionNode(summarize, OPTIONS, result_key="compaction")
    turns = [0]

    def agent(state: CompactionState) -> dict[str, Any]:
        turns[0] += 1
        if turns[0] == 2:
            return {"messages": todos(2, ["write the report", "send it to Ana"])}
        return {"messages": [AIMessage(f"step {turns[0]} done. " + "details " * 30)]}

    graph = compaction_graph(node, agent, checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "t"}}
    summaries = set()
    for turn in range(80):
        state = graph.invoke({"messages": [HumanMessage(f"go on with part {turn} " + "please continue " * 30)]}, config)
        summaries |= {m.id for m in state["messages"] if m.id and m.id.startswith("compaction-summary-")}
        assert "plan-2" in {m.id for m in state["messages"]} or turn < 1
        assert_valid_anthropic_request(state["messages"])
    assert sum(1 for m in state["messages"] if m.id == "plan-result-2") == 1
    assert len(summaries) >= 5  # it survived five compactions


def test_a_summary_with_pins_merged_mid_history_is_put_back_without_what_it_covers() -> None:
    """A subgraph's compacted output merged into its parent by id: the pins stay, the covered messages go."""
    from langgraph.graph.message import add_messages

    messages: list[BaseMessage] = [*chat(0), *todos(1, ["ship it"])]
    for turn in range(2, 40):
        messages += chat(turn)
    _, out = compact(summarize, messages, OPTIONS)
    merged = add_messages(messages, out)  # what the parent holds: the summary lands at the end
    node = CompactionNode(summarize, CompactionOptions(context_window=200_000))
    update = node.invoke({"messages": merged})
    fixed = add_messages(merged, update["messages"])
    assert [m.id for m in fixed if not m.id.startswith("compaction-bridge-")] == [
        m.id for m in out if not m.id.startswith("compaction-bridge-")
    ]


def test_clearing_old_tool_outputs_never_empties_a_pinned_result() -> None:
    plan = ["step " + "x" * 40 for _ in range(30)]  # a long todo list: worth clearing by size
    messages: list[BaseMessage] = [*chat(0), *todos(1, plan)]
    for turn in range(2, 40):
        call = {"name": "read_file", "args": {"path": f"f{turn}.py"}, "id": f"r{turn}", "type": "tool_call"}
        messages += [
            *chat(turn),
            AIMessage("", tool_calls=[call], id=f"ra{turn}"),
            ToolMessage("content " * 200, tool_call_id=f"r{turn}", id=f"rr{turn}"),
        ]
    options = CompactionOptions(context_window=24_000, reserve_tokens=2_000, keep_recent_tokens=2_000)
    features = [CheckedFacts(), Pins(), ClearToolOutputs()]
    result, out = auto_compact(summarize, messages, options, features=features)  # the automatic path clears first
    assert result is not None
    assert result.part("clearing")["cleared"] > 10
    todo_result = next(m for m in out if m.id == "plan-result-1")
    assert todo_result.content == messages[3].content  # whole, never a placeholder


def test_pin_added_by_update_state_is_honoured_by_a_warm_node() -> None:
    """A message pinned later (same id, same content) is kept verbatim by a node that counted it unpinned."""
    node = CompactionNode(short_summary, SMALL_WINDOW, result_key="compaction")
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
    fresh = CompactionNode(short_summary, SMALL_WINDOW, result_key="compaction")
    before = next(s for s in graph.get_state_history(config) if s.next == ("compact",)).values
    assert fresh.invoke(before, config)["compaction"]["parts"]["pins"]["pinned"] == 1
    assert state["compaction"]["parts"]["pins"]["pinned"] == 1
    assert any(m.id == "rule" for m in state["messages"]), "the pinned rule was summarized"
