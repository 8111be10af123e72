"""Cheapest step first: clearing stale tool outputs before any summary, and auto_compact."""

from __future__ import annotations

import operator
from typing import Any

import pytest
from conftest import assert_valid_anthropic_request
from langchain_anthropic import ChatAnthropic
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
    convert_to_messages,
)
from pydantic import Field

from langchain_compaction import CompactionOptions, aauto_compact, auto_compact
from langchain_compaction._lc.convert import PIN_KEY, to_core_list
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


def clearing_graph() -> Any:
    """A checkpointed graph of one CompactionNode that clears (and never summarizes)."""
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import START, MessagesState, StateGraph

    from langchain_compaction import CompactionNode

    builder = StateGraph(MessagesState)
    builder.add_node("compact", CompactionNode(never_called, options(), features=clearing()))
    builder.add_edge(START, "compact")
    return builder.compile(checkpointer=InMemorySaver())


def test_the_node_writes_cleared_outputs_into_the_state():
    graph = clearing_graph()
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


# -- Anthropic's block form: tool_result blocks in user turns ------------------------------------


def block_session(turns: int, output_chars: int = 2800, *, start: int = 0) -> list[BaseMessage]:
    """An Anthropic-SDK history through ``convert_to_messages``: tool_use blocks, then user turns of tool_result blocks.

    Each turn calls ``cat`` and ``grep`` at once; ``grep`` reports an error
    every seventh turn; every fifth turn the user also writes beside the
    results. No message carries a ``tool_calls`` entry or a ToolMessage.
    """
    raw: list[dict[str, Any]] = [] if start else [{"role": "user", "content": "Audit the repository."}]
    for turn in range(start, start + turns):
        cat, grep = f"toolu_{turn:03d}_cat", f"toolu_{turn:03d}_grep"
        raw.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": f"Looking at file {turn}."},
                    {"type": "tool_use", "id": cat, "name": "cat", "input": {"path": f"src/file_{turn}.py"}},
                    {"type": "tool_use", "id": grep, "name": "grep", "input": {"pattern": f"def f{turn}"}},
                ],
            }
        )
        text = [{"type": "text", "text": f"line of file {turn}\n" * (output_chars // 16)}]
        found = f"match in file {turn}\n" * (output_chars // 40)
        results: list[dict[str, Any]] = [
            {"type": "tool_result", "tool_use_id": cat, "content": text},
            {"type": "tool_result", "tool_use_id": grep, "content": found, "is_error": turn % 7 == 3},
        ]
        if turn % 5 == 4:
            results.append({"type": "text", "text": f"Also look at module {turn}, please."})
        raw.append({"role": "user", "content": results})
    return convert_to_messages(raw)


def results_of(messages: list[BaseMessage]) -> list[dict[str, Any]]:
    """Every tool_result block, in order."""
    return [
        b
        for m in messages
        if isinstance(m, HumanMessage) and isinstance(m.content, list)
        for b in m.content
        if isinstance(b, dict) and b.get("type") == "tool_result"
    ]


def is_cleared_block(block: dict[str, Any]) -> bool:
    return isinstance(block["content"], str) and block["content"].startswith(CLEARED_PREFIX)


def assert_blocks_cleared_in_place(
    before: list[BaseMessage], after: list[BaseMessage], cleared: int, same: Any = operator.is_
) -> None:
    """Only user turns were rewritten, block by block: a cleared block keeps its id, error flag and place.

    ``same``: what "untouched" means (the same objects; equal ones after a checkpoint's round trip).
    """
    assert len(after) == len(before)
    calls = {
        b["id"]: b["name"] for m in before if isinstance(m.content, list) for b in m.content if b["type"] == "tool_use"
    }
    seen = 0
    for old, new in zip(before, after):
        if same(new, old):
            continue
        assert isinstance(new, HumanMessage)
        assert (new.id, new.additional_kwargs["langchain_compaction"]["kind"]) == (old.id, "cleared")
        assert len(new.content) == len(old.content)
        for was, now in zip(old.content, new.content):
            if was.get("type") != "tool_result" or not is_cleared_block(now):
                assert same(now, was)  # the user's own text and the results kept: untouched
                continue
            seen += 1
            assert now["tool_use_id"] == was["tool_use_id"]
            assert now.get("is_error") == was.get("is_error")
            # The placeholder names the tool (from its tool_use block) and the call.
            assert f"{calls[was['tool_use_id']]} (call {was['tool_use_id']})" in now["content"]
            assert ("reported an error" in now["content"]) == (was.get("is_error") is True)
    assert seen == cleared > 0


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_block_form_tool_results_are_cleared_instead_of_summarized(mode):
    messages = block_session(20)
    assert estimate_message_tokens(messages) > 18_000
    run = auto_compact if mode == "sync" else aauto_compact
    result = run(never_called, messages, options(), features=clearing())
    result, out = (await result) if mode == "async" else result
    assert result is not None
    assert result.summarizer_calls == 0
    cleared = result.part("clearing").get("cleared", 0)
    assert_blocks_cleared_in_place(messages, out, cleared)
    # Turns that held the user's words beside their results were rewritten too, the words kept.
    assert any(any(b["type"] == "text" for b in new.content) for old, new in zip(messages, out) if new is not old)
    assert result.compacted_tokens == estimate_message_tokens(out) < 18_000
    assert_valid_anthropic_request(out)
    # Oldest first, block by block; the newest keep_tool_uses (3) blocks stay.
    flags = [is_cleared_block(b) for b in results_of(out)]
    assert flags == [True] * cleared + [False] * (len(flags) - cleared)
    assert not any(flags[-3:])


def test_each_tool_result_block_is_one_tool_result_for_the_plan():
    big, small = "x " * 4_000, "ok " * 10  # about 2,000 tokens; 7
    messages = [
        HumanMessage("go"),
        AIMessage(
            [
                {"type": "tool_use", "id": "toolu_a", "name": "cat", "input": {"path": "a"}},
                {"type": "tool_use", "id": "toolu_b", "name": "grep", "input": {"pattern": "b"}},
            ]
        ),
        HumanMessage(
            [
                {"type": "tool_result", "tool_use_id": "toolu_a", "content": big},
                {"type": "tool_result", "tool_use_id": "toolu_b", "content": small},
            ]
        ),
        AIMessage(
            [
                {"type": "tool_use", "id": "toolu_c", "name": "grep", "input": {"pattern": "c"}},
                {"type": "tool_use", "id": "toolu_d", "name": "cat", "input": {"path": "d"}},
            ]
        ),
        HumanMessage(
            [
                {"type": "tool_result", "tool_use_id": "toolu_c", "content": big},
                {"type": "tool_result", "tool_use_id": "toolu_d", "content": big},
            ]
        ),
        HumanMessage("go on " * 100),
    ]
    core = to_core_list(messages)
    counts = [estimate_message(m) for m in core]

    def plan(*, target: int, keep: int = 200, **kw: Any) -> Any:
        kw = {"keep_tool_uses": 1, "min_tokens": 50, **kw}
        return plan_clearing(core, counts, keep_recent_tokens=keep, target_tokens=sum(counts) - target, **kw)

    # keep_tool_uses counts blocks: only toolu_d (the newest) is kept; toolu_b is under min_tokens.
    everything = plan(target=3_500)
    assert everything is not None
    assert (everything.indices, everything.blocks, everything.messages) == ((2, 4), (0, 0), (2, 4))
    assert "cat (call toolu_a)" in everything.contents[0]
    assert "grep (call toolu_c)" in everything.contents[1]
    assert plan(target=3_500, keep_tool_uses=2) is None  # toolu_c is kept now: not enough
    assert plan(target=3_500, protected=(2,)) is None  # a protected turn: none of its blocks
    assert plan(target=3_500, keep=4_500) is None  # the last turn inside the keep budget
    assert plan(target=1_500, protected=(2,)).blocks == (0,)  # type: ignore[union-attr]
    assert plan(target=1_500, exclude_tools=("cat",)).indices == (4,)  # type: ignore[union-attr]
    # A pinned turn is never cleared either.
    messages[2] = messages[2].model_copy(update={"additional_kwargs": {PIN_KEY: True}})
    core = to_core_list(messages)
    assert plan(target=3_500) is None
    assert plan(target=1_500).indices == (4,)  # type: ignore[union-attr]


def test_an_openai_call_output_in_a_user_turn_is_cleared_in_its_output_an_approval_or_loaded_tools_never():
    # Langchain-openai sends these blocks of a user turn as input items answering the reply's call items.
    from langchain_compaction._lc.convert import cleared_copy

    tools = [{"type": "function", "name": f"t{i}", "description": "check the module " * 40} for i in range(10)]
    operation = {"type": "update_file", "path": "a.py", "diff": "+x\n"}
    output = {"type": "apply_patch_call_output", "call_id": "call_p", "status": "completed"}
    messages = [
        HumanMessage("go"),
        AIMessage([{"type": "tool_search_call", "id": "ts_1", "call_id": "call_s", "execution": "client"}]),
        HumanMessage([{"type": "tool_search_output", "call_id": "call_s", "execution": "client", "tools": tools}]),
        AIMessage([{"type": "mcp_approval_request", "id": "mcpr_1", "name": "drop", "arguments": "{}"}]),
        HumanMessage([{"type": "mcp_approval_response", "approval_request_id": "mcpr_1", "approve": True}]),
        AIMessage([{"type": "apply_patch_call", "id": "apc_1", "call_id": "call_p", "operation": operation}]),
        HumanMessage([output | {"output": "patched line\n" * 600}]),
        HumanMessage("go on " * 100),
    ]
    core = to_core_list(messages)
    counts = [estimate_message(m) for m in core]
    assert counts[2] > 1_000  # the loaded tools: worth clearing, were they a tool's output
    # Oldest first: the search's tools and the approval are passed over, sent as they are.
    target = sum(counts) - 1_000
    plan = plan_clearing(core, counts, keep_recent_tokens=200, target_tokens=target, keep_tool_uses=0, min_tokens=0)
    assert plan is not None
    assert (plan.indices, plan.blocks) == ((6,), (0,))
    (block,) = cleared_copy(messages[6], plan.by_message()[6], counts[6]).content
    assert isinstance(block, dict)
    assert set(block) == {"type", "call_id", "status", "output"}
    assert block["output"].startswith(CLEARED_PREFIX)
    assert "apply_patch (call call_p)" in block["output"]


def cleared_for_an_output_and_a_half(messages: list[BaseMessage], *, keep: int, recent: int = 0) -> Any:
    """The messages ``plan_clearing`` clears to save an output and a half (the first output, at 2, sizes it).

    ``keep``: its ``keep_tool_uses``; ``recent``: its ``keep_recent_tokens``. ``None``: clearing cannot save that.
    """
    core = to_core_list(messages)
    counts = [estimate_message(m) for m in core]
    target = sum(counts) - counts[2] * 3 // 2
    plan = plan_clearing(core, counts, keep_recent_tokens=recent, target_tokens=target, keep_tool_uses=keep)
    return None if plan is None else plan.indices


def test_the_results_kept_by_keep_tool_uses_are_ones_that_could_be_cleared():
    # An approval answered after the tool outputs has no output to clear: counted among the last
    # three results, three approvals left the newest real outputs unprotected, and they were cleared.
    def read(n: int) -> dict[str, Any]:
        return {"name": "read", "args": {"path": f"f{n}.py"}, "id": f"c{n}"}

    messages: list[BaseMessage] = [HumanMessage("go")]
    for n in range(4):
        messages += [AIMessage("", tool_calls=[read(n)]), ToolMessage("output line\n" * 300, tool_call_id=f"c{n}")]
    for n in range(3):
        request = {"type": "mcp_approval_request", "id": f"mcpr_{n}", "name": "deploy", "arguments": "{}"}
        messages += [
            AIMessage([request]),
            HumanMessage([{"type": "mcp_approval_response", "approval_request_id": f"mcpr_{n}", "approve": True}]),
        ]
    messages.append(AIMessage("done"))
    assert cleared_for_an_output_and_a_half(messages, keep=1) == (2, 4)
    # The three newest outputs (4, 6, 8) are kept: clearing alone cannot do it.
    assert cleared_for_an_output_and_a_half(messages, keep=3) is None


def test_pinned_tool_outputs_never_take_the_places_keep_tool_uses_keeps():
    messages: list[BaseMessage] = [HumanMessage("go", id="h")]
    for n in range(5):
        messages.append(AIMessage("", id=f"a{n}", tool_calls=[{"name": "t", "args": {}, "id": f"c{n}"}]))
        pinned = {"additional_kwargs": {PIN_KEY: True}} if n >= 3 else {}  # the two newest outputs
        messages.append(ToolMessage("out " * 400, tool_call_id=f"c{n}", id=f"t{n}", **pinned))
    messages.append(HumanMessage("next", id="h2"))
    assert cleared_for_an_output_and_a_half(messages, keep=1, recent=10) == (2, 4)
    # t1 and t2 are the two newest outputs that could be cleared: only t0 may go.
    assert cleared_for_an_output_and_a_half(messages, keep=2, recent=10) is None


def test_a_server_tool_result_in_the_reply_that_continues_a_paused_turn_is_never_rewritten():
    # Its content is the server tool's own blocks (encrypted search results): a placeholder's text in
    # their place is a request the Messages API refuses. The tool messages around it are cleared.
    messages: list[BaseMessage] = [HumanMessage("Research the release notes.", id="h")]
    hits = [{"type": "web_search_result", "url": "https://ex.com", "title": "T", "encrypted_content": "e" * 1000}]
    for n in range(8):
        use = {"type": "server_tool_use", "id": f"srvtoolu_{n}", "name": "web_search", "input": {"query": f"v{n}"}}
        found = {"type": "web_search_tool_result", "tool_use_id": f"srvtoolu_{n}", "content": hits}
        read = {"name": "cat", "args": {"path": f"notes_{n}.md"}, "id": f"c{n}"}
        messages += [
            AIMessage([{"type": "text", "text": f"Searching {n}."}, use], id=f"p{n}"),
            AIMessage([found, {"type": "text", "text": f"Found {n}."}], tool_calls=[read], id=f"f{n}"),
            ToolMessage(f"note line {n}\n" * 600, tool_call_id=f"c{n}", name="cat", id=f"t{n}"),
        ]
    messages.append(AIMessage("Next I'll write the report.", id="final"))
    core = to_core_list(messages)
    assert [len(m.results) for m in core[1:4]] == [0, 1, 0]  # the continuation answers the paused call
    result, out = auto_compact(
        never_called, messages, options(keep_recent_tokens=2_000), features=clearing(keep_tool_uses=2)
    )
    assert result is not None
    assert result.summarizer_calls == 0
    assert result.part("clearing")["cleared"] > 0
    assert all(new is old for old, new in zip(messages, out) if not isinstance(old, ToolMessage))
    assert_valid_anthropic_request(out)


def test_a_turn_cleared_in_part_is_cleared_further_later_never_a_placeholder_twice():
    messages = block_session(20)
    _, once = auto_compact(never_called, messages, options(), features=clearing())
    partly = [i for i, m in enumerate(once) if m is not messages[i] and not all(map(is_cleared_block, results_of([m])))]
    assert len(partly) == 1  # clearing stopped inside a turn: its first block cleared, the second kept
    grown = [*once, *block_session(10, start=20)]
    assert estimate_message_tokens(grown) > 18_000
    result, out = auto_compact(never_called, grown, options(), features=clearing())
    assert result is not None
    assert result.summarizer_calls == 0
    (index,) = partly
    assert all(map(is_cleared_block, results_of([out[index]])))  # its second block now
    # The rewritten turn keeps the size it had before any clearing; its first placeholder stays as it was.
    assert out[index].additional_kwargs == once[index].additional_kwargs
    assert out[index].content[0] == once[index].content[0]
    for block in results_of(out):
        assert str(block["content"]).count(CLEARED_PREFIX) <= 1
    assert sum(map(is_cleared_block, results_of(out))) == (
        sum(map(is_cleared_block, results_of(once))) + result.part("clearing")["cleared"]
    )
    assert_valid_anthropic_request(out)


def test_the_node_clears_block_form_tool_results_in_the_state():
    graph = clearing_graph()
    config = {"configurable": {"thread_id": "blocks"}}
    sent = block_session(20)
    state = graph.invoke({"messages": sent}, config)["messages"]
    before = graph.get_state_history(config)
    given = next(s for s in before if s.next == ("compact",)).values["messages"]  # the state as the node read it
    assert [m.id for m in state] == [m.id for m in given]
    cleared = sum(is_cleared_block(b) for b in results_of(state))
    assert_blocks_cleared_in_place(given, state, cleared, operator.eq)
    assert estimate_message_tokens(state) < 18_000
    assert_valid_anthropic_request(state)


def test_the_middleware_clears_block_form_tool_results():
    from langchain_compaction import CompactionMiddleware

    messages = block_session(20)
    middleware = CompactionMiddleware(never_called, options(), features=clearing())
    update = middleware.before_model({"messages": messages}, None)  # type: ignore[arg-type]
    assert update is not None
    written = update["messages"][1:]  # (after the instruction that replaces the list)
    cleared = sum(is_cleared_block(b) for b in results_of(written))
    assert_blocks_cleared_in_place(messages, written, cleared)
    assert_valid_anthropic_request(written)


class _Recording(GenericFakeChatModel):
    """A fake chat model that keeps each request it is sent."""

    requests: list[list[BaseMessage]] = Field(default_factory=list)

    def bind_tools(self, tools: Any, **kwargs: Any) -> _Recording:
        return self

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any) -> Any:
        self.requests.append(list(messages))
        return super()._generate(messages, stop=stop, run_manager=run_manager, **kwargs)


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_an_agent_sends_the_model_its_block_form_history_cleared(mode):
    from langchain.agents import create_agent
    from langgraph.checkpoint.memory import InMemorySaver

    from langchain_compaction import CompactionMiddleware

    model = _Recording(messages=iter([AIMessage("The report: nothing is wrong.")]))
    middleware = CompactionMiddleware(never_called, options(), features=clearing())
    agent = create_agent(model, middleware=[middleware], checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": f"agent-{mode}"}}
    payload = {"messages": block_session(20)}  # it ends on the user's turn of tool results
    state = agent.invoke(payload, config) if mode == "sync" else await agent.ainvoke(payload, config)
    (request,) = model.requests
    assert any(is_cleared_block(b) for b in results_of(request))
    assert estimate_message_tokens(request) < 18_000
    assert_valid_anthropic_request(request, ends_with_user=True)
    kept = state["messages"][:-1]
    assert [results_of(kept)] == [results_of(request)]  # the state holds what was sent
    assert state["messages"][-1].content == "The report: nothing is wrong."


def test_with_an_archive_a_block_form_turn_is_archived_whole_once_when_first_cleared():
    from helpers_turns import archive_items
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import START, StateGraph
    from langgraph.store.memory import InMemoryStore

    from langchain_compaction import CompactionNode
    from langchain_compaction.features import Archive
    from langchain_compaction.features.archive import archived_message
    from langchain_compaction.graph import CompactionState

    store = InMemoryStore()
    node = CompactionNode(never_called, options(), features=[*clearing(), Archive()], result_key="compaction")
    builder = StateGraph(CompactionState)
    builder.add_node("compact", node)
    builder.add_edge(START, "compact")
    graph = builder.compile(checkpointer=InMemorySaver(), store=store)
    config = {"configurable": {"thread_id": "archived-blocks"}}
    originals = block_session(20)
    once = graph.invoke({"messages": originals}, config)
    first = [m for m in once["messages"] if m.additional_kwargs.get("langchain_compaction")]
    assert once["compaction"]["parts"]["archive"] == {"archived": len(first), "present": 0}
    partly = [m for m in first if not all(map(is_cleared_block, results_of([m])))]
    assert len(partly) == 1  # its first block cleared, the second kept
    twice = graph.invoke({"messages": block_session(10, start=20)}, config)
    assert twice["compaction"]["summarizer_calls"] == 0
    second = [m for m in twice["messages"] if m.additional_kwargs.get("langchain_compaction")]
    (turn,) = (m for m in second if m.id == partly[0].id)
    assert all(map(is_cleared_block, results_of([turn])))  # cleared further...
    # ...and not archived again: its item is the original, written when it was first cleared.
    assert twice["compaction"]["parts"]["archive"] == {"archived": len(second) - len(first), "present": 0}
    items = archive_items(store, "archived-blocks")
    assert sorted(i.value["id"] for i in items) == sorted(m.id for m in second)
    for item in items:
        message = archived_message(item.value)
        assert results_of([message])
        assert not any(map(is_cleared_block, results_of([message])))
        assert CLEARED_PREFIX not in str(message.content)
