"""Cheapest step first: clearing stale tool outputs before any summary, and auto_compact."""

from __future__ import annotations

import pytest
from langchain_anthropic import ChatAnthropic
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

from langchain_compaction import CompactionOptions, aauto_compact, auto_compact
from langchain_compaction._lc.convert import to_core_list
from langchain_compaction.core.tokens import estimate_message
from langchain_compaction.features import ClearToolOutputs, default_features
from langchain_compaction.features.clearing import CLEARED_PREFIX, plan_clearing
from langchain_compaction.tokens import estimate_message_tokens


def agent_session(turns: int, output_chars: int = 4000) -> list:
    messages: list = [SystemMessage("You are an agent.", id="sys"), HumanMessage("Audit the repository.", id="h0")]
    for turn in range(turns):
        tool = "read_plan" if turn == 0 else ("grep" if turn % 2 else "cat")
        call = {"name": tool, "args": {"path": f"src/file_{turn}.py"}, "id": f"c{turn}"}
        messages.append(AIMessage(f"Looking at file {turn}.", tool_calls=[call], id=f"a{turn}"))
        messages.append(
            ToolMessage(
                f"line of file {turn}\n" * (output_chars // 16), tool_call_id=f"c{turn}", name=tool, id=f"t{turn}"
            )
        )
    messages.append(AIMessage("Next I'll write the report.", id="final"))
    return messages


def never_called(prompt: str) -> str:
    raise AssertionError("clearing was enough: no summary call may be made")


def options(**kw) -> CompactionOptions:
    base = {"context_window": 20_000, "reserve_tokens": 2_000, "keep_recent_tokens": 4_000}
    return CompactionOptions(**(base | kw))


def clearing(**kw) -> list:
    return [*default_features(), ClearToolOutputs(**kw)]


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_clearing_alone_avoids_the_summary_call(mode):
    messages = agent_session(20)
    assert estimate_message_tokens(messages) > 18_000
    run = auto_compact if mode == "sync" else aauto_compact
    result = run(never_called, messages, options(), features=clearing())
    result, out = (await result) if mode == "async" else result
    assert result is not None
    assert result.summarizer_calls == 0
    assert result.summary == ""
    assert result.part("clearing").get("cleared", 0) > 0
    assert result.compacted_tokens < 18_000
    assert estimate_message_tokens(out) == result.compacted_tokens
    assert len(out) == len(messages)
    cleared = [m for m in out if isinstance(m, ToolMessage) and str(m.content).startswith(CLEARED_PREFIX)]
    assert len(cleared) == result.part("clearing").get("cleared", 0)
    for before, after in zip(messages, out):
        if after in cleared:
            # Same id, same call id, the tool named; the pairing is intact.
            assert (after.id, after.tool_call_id, after.name) == (before.id, before.tool_call_id, before.name)
            assert before.name in str(after.content)
            assert after.additional_kwargs["langchain_compaction"]["kind"] == "cleared"
        else:
            assert after is before
    ChatAnthropic(model="claude-sonnet-4-5", api_key="x")._get_request_payload(out)


def test_oldest_first_recent_and_protected_kept():
    messages = agent_session(20)
    features = clearing(exclude_tools=("read_plan",), keep_tool_uses=3)
    result, out = auto_compact(never_called, messages, options(), features=features)
    assert result is not None
    tools = [(i, m) for i, m in enumerate(out) if isinstance(m, ToolMessage)]
    flags = [str(m.content).startswith(CLEARED_PREFIX) for _, m in tools]
    # read_plan (turn 0) is excluded; then the oldest are cleared first.
    assert not flags[0]
    first_kept = flags.index(False, 1)
    assert all(flags[1:first_kept])
    assert not any(flags[first_kept:])
    assert not any(flags[-3:])  # the last three tool uses stay


def test_cleared_outputs_are_not_cleared_again_and_the_summary_follows():
    messages = agent_session(20)
    _, once = auto_compact(never_called, messages, options(), features=clearing())
    grown = once + agent_session(20)[2:-1]
    prompts: list[str] = []

    def summarize(prompt: str) -> str:
        prompts.append(prompt)
        return "## Goal\n- audit"

    result, out = auto_compact(summarize, grown, options(keep_recent_tokens=3_000), features=clearing())
    assert result is not None
    # Either more clearing sufficed or a summary was made; never a second placeholder on a placeholder.
    for message in out:
        if isinstance(message, ToolMessage):
            assert str(message.content).count(CLEARED_PREFIX) <= 1


def test_when_clearing_is_not_enough_the_summary_sees_the_outputs():
    messages = agent_session(20)
    prompts: list[str] = []

    def summarize(prompt: str) -> str:
        prompts.append(prompt)
        return "## Goal\n- audit"

    # Only read_plan is big enough to clear: clearing cannot reach the target.
    result, out = auto_compact(summarize, messages, options(), features=clearing(min_tokens=10**6))
    assert result is not None
    assert result.part("clearing").get("cleared", 0) == 0
    assert result.summarizer_calls >= 1
    assert "line of file 1" in "".join(prompts)
    assert CLEARED_PREFIX not in "".join(prompts)


def test_off_by_default_and_nothing_under_the_threshold():
    messages = agent_session(20)
    prompts: list[str] = []
    result, _ = auto_compact(
        lambda p: prompts.append(p) or "## Goal\n- x",
        messages,
        CompactionOptions(context_window=20_000, reserve_tokens=2_000, keep_recent_tokens=4_000),
    )
    assert result is not None
    assert result.part("clearing").get("cleared", 0) == 0
    assert prompts
    small = agent_session(2)
    result, out = auto_compact(never_called, small, options(), features=clearing())
    assert result is None
    assert out is small


def test_clearing_options_are_validated():
    with pytest.raises(ValueError, match="keep_tool_uses=-1"):
        ClearToolOutputs(keep_tool_uses=-1)
    with pytest.raises(ValueError, match="exclude_tools='grep'"):
        ClearToolOutputs(exclude_tools="grep")  # type: ignore[arg-type]


def test_the_node_writes_cleared_outputs_into_the_state():
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import START, MessagesState, StateGraph

    from langchain_compaction import CompactionNode

    builder = StateGraph(MessagesState)
    builder.add_node("compact", CompactionNode(never_called, options(), features=clearing()))
    builder.add_edge(START, "compact")
    graph = builder.compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "c"}}
    state = graph.invoke({"messages": agent_session(20)}, config)
    cleared = [m for m in state["messages"] if isinstance(m, ToolMessage) and str(m.content).startswith(CLEARED_PREFIX)]
    assert cleared
    assert len(state["messages"]) == len(agent_session(20))
    assert estimate_message_tokens(state["messages"]) < 18_000


def test_the_middleware_returns_cleared_outputs():
    from langchain_compaction import CompactionMiddleware

    middleware = CompactionMiddleware(never_called, options(), features=clearing())
    update = middleware.before_model({"messages": agent_session(20)}, None)  # type: ignore[arg-type]
    assert update is not None
    written = update["messages"][1:]
    assert any(isinstance(m, ToolMessage) and str(m.content).startswith(CLEARED_PREFIX) for m in written)


def test_chat_memory_says_it_cannot_clear_instead_of_ignoring_it():
    # Chat memory always summarizes, so its archive gets every original: a
    # user's clear_tool_outputs=True is refused at construction, not dropped.
    from langchain_core.chat_history import InMemoryChatMessageHistory

    from langchain_compaction import CompactingChatMessageHistory
    from langchain_compaction.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="ClearToolOutputs cannot be used here"):
        CompactingChatMessageHistory(
            InMemoryChatMessageHistory(), lambda p: "## Goal\n- audit", options(), features=clearing()
        )
    archive = InMemoryChatMessageHistory()
    history = CompactingChatMessageHistory(
        InMemoryChatMessageHistory(), lambda p: "## Goal\n- audit", options(), archive=archive
    )
    history.add_messages(agent_session(20))
    assert not any(str(m.content).startswith(CLEARED_PREFIX) for m in history.messages)
    assert len(archive.messages) + len(history.messages) >= len(agent_session(20))


# -- fewer results than keep_tool_uses ---------------------------------------------------------------


def test_clearing_protects_every_result_when_there_are_fewer_than_keep_tool_uses() -> None:
    """Fewer tool results than keep_tool_uses: every one of them is protected from clearing."""
    messages = []
    for i in range(2):
        call = {"name": "read", "args": {"path": f"f{i}"}, "id": f"c{i}"}
        messages += [AIMessage("", tool_calls=[call], id=f"a{i}"), ToolMessage("x " * 2_000, tool_call_id=f"c{i}")]
    messages.append(HumanMessage("go on " * 100))
    core = to_core_list(messages)
    counts = [estimate_message(m) for m in core]
    # Clearing the first result alone would reach the target, and it lies outside the keep budget.
    assert sum(counts) > 1_500 > sum(counts) - counts[1] + 100
    plan = plan_clearing(core, counts, keep_recent_tokens=200, target_tokens=1_500, keep_tool_uses=3, min_tokens=10)
    assert plan is None  # nothing may be cleared: both are among the last three results
    plan = plan_clearing(core, counts, keep_recent_tokens=200, target_tokens=1_500, keep_tool_uses=1, min_tokens=10)
    assert plan is not None
    assert plan.indices == (1,)
