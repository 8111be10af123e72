"""The budget cut and its tool-pair rule (``find_cut_point`` and the core's cut)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest
from conftest import tool_pairs_of
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    FunctionMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)

from langchain_compaction._lc.convert import is_summary_message, summary_message, to_core_list
from langchain_compaction.core.cut import find_cut, forced_cut, thinking_loop_opening, tool_pairs, valid_boundaries
from langchain_compaction.core.options import CompactionOptions
from langchain_compaction.core.types import Message, ToolCall
from langchain_compaction.errors import ConfigurationError
from langchain_compaction.functional import auto_compact, compact, find_cut_point
from langchain_compaction.tokens import estimate_message_tokens


def _tokens(message: BaseMessage) -> int:
    return estimate_message_tokens([message])


def _calls(*ids: str, name: str = "run") -> AIMessage:
    return AIMessage("", tool_calls=[{"name": name, "args": {"i": i}, "id": i} for i in ids])


def _result(call_id: str, text: str = "ok") -> ToolMessage:
    return ToolMessage(text, tool_call_id=call_id)


def _assert_cut_is_safe(messages: Sequence[BaseMessage], cut: int) -> None:
    if cut == 0:
        return
    assert not isinstance(messages[cut], ToolMessage), f"cut {cut} lands on a tool result"
    for call, result in tool_pairs_of(messages):
        assert not (call < cut <= result), f"cut {cut} splits call {call} from result {result}"


def _budgets(messages: Sequence[BaseMessage]) -> list[int]:
    """Every budget that changes the walk: each suffix sum, and one either side."""
    sums, total = [], 0
    for message in reversed(messages):
        total += _tokens(message)
        sums += [total - 1, total, total + 1]
    return sorted({max(s, 1) for s in sums})


# --- the budget walk ---------------------------------------------------------


def test_walks_back_until_the_keep_budget_is_exceeded() -> None:
    messages = [HumanMessage("a" * 400) if i % 2 == 0 else AIMessage("b" * 400) for i in range(10)]
    each = _tokens(messages[0])  # 104 with the overhead
    # Three messages fit in 3 * each; the fourth from the end crosses the budget
    # and is the last one summarized.
    assert find_cut_point(messages, 3 * each) == 7
    assert find_cut_point(messages, 3 * each + 1) == 7
    assert find_cut_point(messages, 3 * each - 1) == 8


def test_find_cut_point_takes_options_in_the_budget_place() -> None:
    """find_cut_point(messages, options) cuts at the options' keep budget, counted with their token counter."""
    messages = [HumanMessage("a" * 400) if i % 2 == 0 else AIMessage("b" * 400) for i in range(10)]
    each = _tokens(messages[0])
    assert find_cut_point(messages, CompactionOptions(keep_recent_tokens=3 * each)) == 7
    counted = CompactionOptions(keep_recent_tokens=3 * each, token_counter=lambda ms: 2 * each * len(ms))
    assert find_cut_point(messages, counted) == 9  # each message counts double: only the last one fits


def test_everything_fits_returns_zero() -> None:
    messages = [HumanMessage("hello"), AIMessage("hi"), HumanMessage("bye")]
    assert find_cut_point(messages, 10_000) == 0


def test_default_budget_is_twenty_thousand() -> None:
    messages = [HumanMessage("a" * 4000) if i % 2 == 0 else AIMessage("b" * 4000) for i in range(40)]
    each = _tokens(messages[0])
    kept = 20_000 // each
    assert find_cut_point(messages) == 40 - kept
    # 0 means the default, as in the reference.
    assert find_cut_point(messages, 0) == find_cut_point(messages)


def test_negative_budget_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError) as info:
        find_cut_point([HumanMessage("x")] * 3, -5)
    assert "keep_recent_tokens=-5" in str(info.value)
    assert isinstance(info.value, ValueError)


def test_last_message_alone_over_budget_is_kept() -> None:
    messages = [HumanMessage("q1"), AIMessage("a1"), HumanMessage("q2"), AIMessage("a2"), HumanMessage("x" * 40_000)]
    assert find_cut_point(messages, 100) == 4


def test_fewer_than_two_to_summarize_returns_zero() -> None:
    messages = [HumanMessage("q1"), AIMessage("x" * 40_000)]
    assert find_cut_point(messages, 100) == 0
    three = [HumanMessage("q1"), AIMessage("x" * 40_000), HumanMessage("q2")]
    # Cut would be 1 (keep the big answer and the question): one message to summarize.
    assert find_cut_point(three, 11_000) == 0


def test_one_message_larger_than_the_keep_budget_is_summarized_alone() -> None:
    # A first message larger than the window (a pasted document) would stay
    # forever if one message were never worth a summary, as in pi.
    messages = [HumanMessage("policy " * 20_000), AIMessage("Noted."), HumanMessage("How long is the window?")]
    core, counts = to_core_list(messages), [_tokens(m) for m in messages]
    assert find_cut(core, counts, 4_000, most=12_000) == 1
    assert find_cut(core, counts, 4_000) == 0  # without a window: pi's two, as ever
    assert find_cut(core, counts, 4_000, most=counts[0]) == 0  # one message a request could hold
    options = CompactionOptions(context_window=16_000)
    result, compacted = auto_compact(lambda prompt: "## Goal\n- answer from the policy", messages, options)
    assert result is not None
    assert estimate_message_tokens(compacted) < 16_000
    assert compacted[-2:] == messages[-2:]


def test_a_tool_exchange_in_progress_larger_than_a_request_may_hold_is_summarized_whole() -> None:
    messages = [
        HumanMessage("q1"),
        AIMessage("a1"),
        HumanMessage("read the log"),
        _calls("c1"),
        _result("c1", "ERROR at /srv/x.py:10 " * 20_000),
    ]
    core = to_core_list(messages)
    counts = [_tokens(m) for m in messages]
    # Kept, the exchange alone is over what a request may hold: it goes into the summary.
    assert find_cut(core, counts, 3_000) == 3
    assert find_cut(core, counts, 3_000, most=sum(counts[3:])) == 3
    assert find_cut(core, counts, 3_000, most=12_000) == len(messages)
    assert forced_cut(core) == 3
    assert forced_cut(core, counts=counts, most=12_000) == len(messages)
    # What a request may hold past the fixed part and the summary: kept with the summary, it fits.
    budget = CompactionOptions(context_window=16_000, reserve_tokens=500).budget
    assert budget.most_kept == 15_500 - budget.summary_max
    assert CompactionOptions().budget.most_kept is None  # without a window: no bound
    # An exchange that opens the region (the summary and its bridge before it) goes whole too.
    after = to_core_list([SystemMessage("summary"), HumanMessage("go on"), *messages[3:]])
    after_counts = [10, 5, *counts[3:]]
    assert find_cut(after, after_counts, 3_000, start=2, credit=1, most=12_000) == len(after)
    assert forced_cut(after, start=2, credit=1, counts=after_counts, most=12_000) == len(after)
    # One whose calls are not all answered yet (results stored one at a time) is not: one would be orphaned.
    two = [*messages[:3], _calls("c1", "c2"), messages[4]]
    assert find_cut(to_core_list(two), counts, 3_000, most=12_000) == 3
    assert forced_cut(to_core_list(two), counts=counts, most=12_000) == 3
    # A finished turn is cut before its answer, as ever: nothing in progress to take whole.
    done = [*core, *to_core_list([AIMessage("The log shows one error.")])]
    assert forced_cut(done, counts=[*counts, 10], most=12_000) == len(done) - 1


@pytest.mark.parametrize("count", [0, 1])
def test_tiny_lists_return_zero(count: int) -> None:
    assert find_cut_point([HumanMessage("x" * 4000)] * count, 1) == 0


def test_no_valid_cut_returns_zero() -> None:
    # Nothing but tool results and legacy function results: no boundary is allowed.
    messages: list[BaseMessage] = [
        _result("a"),
        _result("b"),
        FunctionMessage(name="f", content="x" * 4000),
        _result("c", "y" * 4000),
    ]
    assert find_cut_point(messages, 10) == 0


# --- the tool-pair rule ----------------------------------------------------


def test_never_lands_on_a_tool_result() -> None:
    messages = [
        HumanMessage("q1"),
        AIMessage("a1"),
        HumanMessage("q2"),
        _calls("c1"),
        _result("c1", "r" * 4000),
        AIMessage("done " * 100),
        HumanMessage("next"),
    ]
    for budget in _budgets(messages):
        cut = find_cut_point(messages, budget)
        _assert_cut_is_safe(messages, cut)


def test_moves_forward_past_tool_results() -> None:
    messages = [
        HumanMessage("q1 " * 50),
        AIMessage("a1 " * 50),
        _calls("c1"),
        _result("c1", "r" * 4000),
        HumanMessage("short"),
    ]
    # The budget is crossed on the tool result: the reference moves forward to
    # the next non-tool message rather than cutting the result from its call.
    budget = _tokens(messages[4]) + 1
    assert find_cut_point(messages, budget) == 4


def test_parallel_tool_calls_are_never_split() -> None:
    messages = [
        SystemMessage("sys"),
        HumanMessage("q1 " * 200),
        AIMessage("a1 " * 200),
        HumanMessage("check three things " * 20),
        _calls("p1", "p2", "p3"),
        _result("p1", "one " * 300),
        _result("p2", "two " * 300),
        _result("p3", "three " * 300),
        AIMessage("all three done " * 30),
        HumanMessage("thanks " * 30),
    ]
    cuts = set()
    for budget in _budgets(messages):
        cut = find_cut_point(messages, budget)
        _assert_cut_is_safe(messages, cut)
        cuts.add(cut)
    assert not cuts & {5, 6, 7}
    assert {4, 8} <= cuts  # the cut does happen on both sides of the exchange


def test_out_of_order_results_are_never_split() -> None:
    messages = [
        HumanMessage("q1 " * 200),
        AIMessage("a1 " * 200),
        _calls("c1", "c2", "c3"),
        _result("c3", "three " * 300),
        _result("c1", "one " * 300),
        HumanMessage("interjection " * 50),  # a user turn arriving before the last result
        _result("c2", "two " * 300),
        AIMessage("done " * 100),
        HumanMessage("thanks"),
    ]
    for budget in _budgets(messages):
        cut = find_cut_point(messages, budget)
        _assert_cut_is_safe(messages, cut)
        # The user turn sits inside the exchange: cutting before it would
        # separate c2's result from its call.
        assert cut != 5


def test_repeated_tool_call_ids_pair_with_their_own_turn() -> None:
    messages = [
        HumanMessage("q1 " * 100),
        _calls("call_1"),
        _result("call_1", "first " * 200),
        HumanMessage("q2 " * 100),
        _calls("call_1"),  # the same id again, as SWE-agent's call_<step> ids do across runs
        _result("call_1", "second " * 200),
        AIMessage("done " * 100),
        HumanMessage("thanks"),
    ]
    cuts = set()
    for budget in _budgets(messages):
        cut = find_cut_point(messages, budget)
        _assert_cut_is_safe(messages, cut)
        cuts.add(cut)
    # Pairing by first occurrence would block every cut from 2 to 5; pairing
    # with the nearest earlier call allows the boundary between the two turns.
    assert 3 in cuts


def test_unanswered_call_followed_by_reused_id_does_not_block_cuts() -> None:
    messages = [
        HumanMessage("q1 " * 100),
        _calls("x"),  # never answered
        HumanMessage("q2 " * 100),
        _calls("x"),
        _result("x", "r " * 200),
        HumanMessage("q3 " * 100),
    ]
    assert tool_pairs(to_core_list(messages)) == [(3, 4)]
    budget = _tokens(messages[5]) + _tokens(messages[4]) + _tokens(messages[3])
    assert find_cut_point(messages, budget) == 3


def test_orphan_results_and_unanswered_calls_do_not_crash() -> None:
    messages = [
        HumanMessage("q1 " * 100),
        _result("nobody-called-me", "orphan " * 100),
        _calls("never-answered"),
        HumanMessage("q2 " * 100),
        AIMessage("a2 " * 100),
        HumanMessage("q3 " * 100),
    ]
    for budget in _budgets(messages):
        cut = find_cut_point(messages, budget)
        _assert_cut_is_safe(messages, cut)
        assert 0 <= cut < len(messages)


def test_tail_inside_a_tool_exchange_moves_the_cut_back() -> None:
    # Documented deviation from the reference: an agent compacting mid-loop
    # ends with tool results. The reference scans forward, runs off the end and
    # gives up (returns 0); here the cut moves back to keep the exchange whole.
    messages = [
        HumanMessage("q1 " * 200),
        AIMessage("a1 " * 200),
        HumanMessage("q2 " * 200),
        _calls("c1", "c2"),
        _result("c1", "one " * 300),
        _result("c2", "two " * 300),
    ]
    budget = _tokens(messages[5]) - 1  # crossed on the very last message
    assert find_cut_point(messages, budget) == 3
    budget = _tokens(messages[5]) + _tokens(messages[4]) - 1
    assert find_cut_point(messages, budget) == 3


def test_tail_inside_exchange_still_needs_two_summarized_messages() -> None:
    messages = [HumanMessage("q1 " * 200), _calls("c1"), _result("c1", "one " * 300)]
    assert find_cut_point(messages, 10) == 0


# --- leading system messages -------------------------------------------------


def test_leading_system_messages_are_never_summarized() -> None:
    messages = [
        SystemMessage("You are an agent. " * 400),
        SystemMessage("Tools: ls, cat. " * 400),
        HumanMessage("q1 " * 100),
        AIMessage("a1 " * 100),
        HumanMessage("q2 " * 100),
        AIMessage("a2 " * 100),
    ]
    for budget in _budgets(messages):
        cut = find_cut_point(messages, budget)
        assert cut == 0 or cut >= 4  # two system messages, then at least two summarized


def test_leading_system_messages_do_not_count_towards_the_two() -> None:
    messages = [SystemMessage("sys"), HumanMessage("q1 " * 100), AIMessage("a1 " * 100)]
    # Cutting at 2 would summarize only the human message.
    assert find_cut_point(messages, 10) == 0


def test_previous_summary_counts_as_one_summarized_message() -> None:
    summary = summary_message("## Goal\n- earlier work")
    messages = [summary, HumanMessage("q1 " * 100), AIMessage("a1 " * 300)]
    # The reference's list started with the summary, so the summary plus the
    # question are the two summarized messages.
    assert find_cut_point(messages, 10) == 2


# --- the core functions ----------------------------------------------------


def _core(*messages: BaseMessage) -> list[Message]:
    return to_core_list(list(messages))


def test_tool_pairs_in_result_order() -> None:
    core = _core(HumanMessage("q"), _calls("a", "b"), _result("b"), _result("a"), _result("zzz"))
    assert tool_pairs(core) == [(1, 2), (1, 3)]


def test_valid_boundaries_mark_tool_results_and_spans() -> None:
    core = _core(HumanMessage("q"), _calls("a", "b"), _result("a"), HumanMessage("mid"), _result("b"), AIMessage("x"))
    assert valid_boundaries(core) == [True, True, False, False, False, True, True]


def test_find_cut_accepts_precomputed_counts() -> None:
    core = [Message("user"), Message("assistant"), Message("user"), Message("assistant")]
    assert find_cut(core, [10, 10, 10, 10], 15) == 3
    assert find_cut(core, [10, 10, 10, 10], 25) == 2
    assert find_cut(core, [10, 10, 10, 10], 40) == 0


def test_find_cut_with_start_skips_the_head() -> None:
    core = [Message("system"), Message("user"), Message("assistant"), Message("user")]
    assert find_cut(core, [1000, 10, 10, 10], 15, start=1) == 3
    assert find_cut(core, [1000, 10, 10, 10], 25, start=1) == 0  # only one would be summarized


def test_forced_cut_keeps_only_the_last_valid_message() -> None:
    core = [
        Message("user"),
        Message("assistant"),
        Message("user"),
        Message("assistant", tool_calls=(ToolCall("c", "t", "{}"),)),
        Message("tool", tool_call_id="c"),
    ]
    assert forced_cut(core) == 3
    assert forced_cut(core[:3]) == 2
    assert forced_cut(core[:2]) == 0
    assert forced_cut([Message("tool"), Message("tool"), Message("tool")]) == 0


def test_forced_cut_respects_start_and_credit() -> None:
    core = [Message("system"), Message("user"), Message("assistant"), Message("user")]
    assert forced_cut(core, start=1) == 3
    assert forced_cut(core[:3], start=1) == 0
    assert forced_cut(core[:3], start=1, credit=1) == 2


_CLAUDES_THINKING = {
    "thinking": {"type": "thinking", "thinking": "read them one by one", "signature": "c2ln"},
    "redacted_thinking": {"type": "redacted_thinking", "data": "ZW5jcnlwdGVk"},
    # Claude on Bedrock (langchain-aws's Converse API): the text and signature one level down.
    "bedrock": {"type": "reasoning_content", "reasoning_content": {"text": "read them", "signature": "c2ln"}},
    "bedrock_redacted": {"type": "reasoning_content", "reasoning_content": {"redacted_content": "ZW5j"}},
    # Thinking shown as ``display: "omitted"``: no text, the signature carries it.
    "omitted": {"type": "thinking", "thinking": "", "signature": "c2ln"},
    # LangChain's v1 content (ChatAnthropic(output_version="v1"), ``content_blocks``), as langchain-anthropic's
    # parser writes it: thinking (its text perhaps omitted) as ``reasoning``, its signature in extras; redacted
    # thinking, and thinking on a message that names no provider, as Anthropic's block in a ``non_standard`` one.
    "v1_omitted": {"type": "reasoning", "reasoning": "", "extras": {"signature": "c2ln"}},
    "v1_redacted": {"type": "non_standard", "value": {"type": "redacted_thinking", "data": "ZW5jcnlwdGVk"}},
    "v1_non_standard_thinking": {
        "type": "non_standard",
        "value": {"type": "thinking", "thinking": "", "signature": "c2ln"},
    },
}


@pytest.mark.parametrize("opening", sorted(_CLAUDES_THINKING))
def test_a_tool_loop_in_progress_that_opened_with_thinking_is_never_cut_inside(opening: str) -> None:
    """Claude with extended thinking rejects a tool loop in progress that does not start with its thinking block."""
    block = _CLAUDES_THINKING[opening]
    history: list[BaseMessage] = [HumanMessage("earlier question " * 40), AIMessage("earlier answer " * 40)]
    history.append(HumanMessage("read every module"))
    for n in range(12):
        call = {"name": "read_file", "args": {"path": f"src/m{n}.py"}, "id": f"c{n}"}
        use = {"type": "tool_use", "id": f"c{n}", "name": "read_file", "input": call["args"]}
        history.append(AIMessage([block, use] if n == 0 else [use], tool_calls=[call]))
        history.append(ToolMessage(f"contents of m{n} " * 60, tool_call_id=f"c{n}"))
    core = to_core_list(history)
    counts = [_tokens(m) for m in history]
    opening_index = 3
    valid = valid_boundaries(core)
    assert valid[opening_index]
    assert not any(valid[opening_index + 1 : len(core)])
    # The budget would cut inside the loop: the cut moves back to its opening, so the loop is kept whole,
    # while it is no larger than twice the keep budget; past that it is summarized whole (it could outgrow the
    # window itself), as it is by a forced cut, which makes the context as small as it gets.
    loop = sum(counts[opening_index:])
    assert find_cut(core, counts, keep_recent_tokens=loop // 2 + 1) == opening_index
    assert find_cut(core, counts, keep_recent_tokens=sum(counts[-4:])) == len(core)
    assert forced_cut(core) == len(core)
    # Once the turn is finished (an answer without tool calls), it is not in progress: any boundary will do.
    finished = to_core_list([*history, AIMessage("All read.")])
    assert valid_boundaries(finished)[opening_index + 2]


def test_inside_a_thinking_loop_the_kept_part_may_start_at_a_reply_that_thinks_and_openai_reasoning_is_free() -> None:
    """Claude wants the loop in progress to open with thinking: a reply with thinking of its own may open the kept part.
    OpenAI's reasoning items carry no such rule: a loop that opened with one is cut as any other."""

    def loop(block: dict[str, Any], every: bool) -> list[BaseMessage]:
        history: list[BaseMessage] = [HumanMessage("read every module")]
        for n in range(8):
            call = {"name": "read_file", "args": {"path": f"src/m{n}.py"}, "id": f"c{n}"}
            use = {"type": "tool_use", "id": f"c{n}", "name": "read_file", "input": call["args"]}
            history.append(AIMessage([block, use] if every or n == 0 else [use], tool_calls=[call]))
            history.append(ToolMessage(f"contents of m{n} " * 60, tool_call_id=f"c{n}"))
        return history

    thinking = {"type": "thinking", "thinking": "next file", "signature": "c2ln"}
    interleaved = to_core_list(loop(thinking, every=True))
    assert [i for i, ok in enumerate(valid_boundaries(interleaved)) if ok] == [0, *range(1, 17, 2), 17]
    reasoning = {"type": "reasoning", "reasoning": "next file"}
    unsigned = to_core_list(loop(reasoning, every=False))
    assert valid_boundaries(unsigned) == valid_boundaries(to_core_list(loop({"type": "text", "text": "ok"}, False)))


@pytest.mark.parametrize("interleaved", [False, True])
def test_a_pinned_call_is_not_written_back_inside_a_thinking_loop_in_progress(interleaved: bool) -> None:
    """Written after the summary's bridge, a pinned write_todos call would open the loop without thinking."""
    from conftest import assert_valid_anthropic_request

    from langchain_compaction import CompactionOptions, compact

    think = {"type": "thinking", "thinking": "plan the reads", "signature": "c2ln"}
    messages: list[BaseMessage] = [SystemMessage("You are a coding agent."), HumanMessage("earlier " * 50)]
    messages += [AIMessage("ok " * 50), HumanMessage("Read every module and keep a todo list.")]
    for n in range(14):
        name = "write_todos" if n == 5 else "read_file"
        args: dict[str, Any] = {"todos": ["a", "b"]} if name == "write_todos" else {"path": f"src/m{n}.py"}
        call = {"name": name, "args": args, "id": f"toolu_{n}"}
        use = {"type": "tool_use", "id": call["id"], "name": name, "input": args}
        blocks = [think, use] if (n == 0 or (interleaved and n > 5)) else [use]
        messages += [AIMessage(blocks, tool_calls=[call]), ToolMessage(f"contents {n} " * 150, tool_call_id=call["id"])]
    _, out = compact(lambda p: "## Goal\n- read modules", messages, CompactionOptions(context_window=8_000))
    assert_valid_anthropic_request(out, "You are a coding agent.", thinking=True)


def test_claudes_thinking_in_langchains_v1_blocks_is_claudes_thinking() -> None:
    """ChatAnthropic(output_version="v1") writes thinking as a reasoning block with its signature in extras."""
    reasoning = {"type": "reasoning", "reasoning": "plan", "extras": {"signature": "c2ln"}}
    call = {"name": "read", "args": {}, "id": "c1"}
    loop = [HumanMessage("go"), AIMessage([reasoning], tool_calls=[call]), ToolMessage("ok", tool_call_id="c1")]
    assert thinking_loop_opening(to_core_list(loop)) == 1
    unsigned = [HumanMessage("go"), AIMessage([{"type": "reasoning", "reasoning": "plan"}], tool_calls=[call])]
    assert thinking_loop_opening(to_core_list([*unsigned, ToolMessage("ok", tool_call_id="c1")])) is None
    # Gemini writes its thoughts as unsigned ``thinking`` blocks: not Claude's, so no loop rule.
    gemini = [HumanMessage("go"), AIMessage([{"type": "thinking", "thinking": "plan"}], tool_calls=[call])]
    assert thinking_loop_opening(to_core_list([*gemini, ToolMessage("ok", tool_call_id="c1")])) is None


def _claude_reply(step: int, thinking: dict[str, Any] | None, *, v1: bool) -> AIMessage:
    """Claude's reply as ChatAnthropic parses it from the API's message (in v1 content if ``v1``), usage left out."""
    from anthropic.types import Message as AnthropicMessage
    from conftest import anthropic_model

    content: list[dict[str, Any]] = [thinking] if thinking else []
    content += [{"type": "text", "text": f"Step {step}: read the next module and check its handler. " * 3}]
    content += [{"type": "tool_use", "id": f"toolu_{step:02d}", "name": "bash", "input": {"cmd": f"cat m{step}.py"}}]
    raw = AnthropicMessage.model_validate(
        {"id": f"msg_{step}", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5", "content": content}
        | {"stop_reason": "tool_use", "stop_sequence": None, "usage": {"input_tokens": 10, "output_tokens": 5}}
    )
    reply = anthropic_model()._format_output(raw).generations[0].message
    update: dict[str, Any] = {"usage_metadata": None, "id": f"a{step}"}
    if v1:  # (what langchain-core does for output_version="v1")
        update |= {
            "content": reply.content_blocks,
            "response_metadata": {**reply.response_metadata, "output_version": "v1"},
        }
    return reply.model_copy(update=update)


_UNREADABLE_THINKING = {
    "omitted": {"type": "thinking", "thinking": "", "signature": "EqQBCkYIBxgCKkB0sig=="},
    "redacted": {"type": "redacted_thinking", "data": "EmwKAhgBEgy0redacted=="},
}


@pytest.mark.parametrize("v1", [False, True], ids=["native", "v1"])
@pytest.mark.parametrize("thinking", sorted(_UNREADABLE_THINKING))
def test_a_loop_opened_with_thinking_without_text_keeps_its_opening(thinking: str, v1: bool) -> None:
    """Claude's thinking with no readable text (omitted, redacted) opens its loop all the same.

    It left no part (omitted), or was read as plain data (redacted, in v1 content): the loop was cut before
    a reply without thinking, which Claude refuses (the kept part opened with ``text``).
    """
    from conftest import assert_valid_anthropic_request

    from langchain_compaction import ExtractiveSummarizer, compact
    from langchain_compaction.core.transcript import message_body

    messages: list[BaseMessage] = [HumanMessage("Fix the failing build in the repo.", id="h0")]
    for step in range(14):
        messages.append(_claude_reply(step, _UNREADABLE_THINKING[thinking] if step == 0 else None, v1=v1))
        messages.append(
            ToolMessage(
                f"output {step}: " + "the handler validates the payload. " * 30, tool_call_id=f"toolu_{step:02d}"
            )
        )
    core = to_core_list(messages)
    assert thinking_loop_opening(core) == 1
    assert message_body(core[1]).startswith("Step 0:")  # (no empty "(reasoning)" line for the summarizer)
    _, compacted = compact(ExtractiveSummarizer(), messages, CompactionOptions(context_window=3_000))
    assert any(is_summary_message(m) for m in compacted), "nothing was compacted (test setup)"
    assert_valid_anthropic_request(compacted, thinking=True)


def _thinking_loop_with_a_result_to_come() -> list[BaseMessage]:
    """A Claude tool loop opened with signed thinking whose last reply made two calls; one result is in."""
    messages: list[BaseMessage] = [HumanMessage("fix the bug " * 40, id="h0")]
    for k in range(4):
        content: list[Any] = [{"type": "thinking", "thinking": "plan " * 30, "signature": "SIG=="}] if k == 0 else []
        calls = [{"id": f"c{k}_{j}", "name": "bash", "args": {"command": f"cat f{k}_{j}.py"}} for j in range(2)]
        content += [{"type": "tool_use", "id": c["id"], "name": "bash", "input": c["args"]} for c in calls]
        messages.append(AIMessage(content, tool_calls=calls, id=f"a{k}"))
        messages += [ToolMessage("output " * 200, tool_call_id=f"c{k}_{j}", id=f"t{k}_{j}") for j in range(2)]
    return messages[:-1]  # (chat memory stores results one at a time: the last is still to come)


def test_a_thinking_loop_with_a_result_to_come_is_never_summarized_whole() -> None:
    """Summarized whole, the loop's pending call would go and its result arrive after the summary alone."""
    core = to_core_list(_thinking_loop_with_a_result_to_come())
    counts = [estimate_message_tokens([m]) for m in _thinking_loop_with_a_result_to_come()]
    assert thinking_loop_opening(core) == 1
    assert find_cut(core, counts, 200, most=300) < len(core)
    assert forced_cut(core, counts=counts, most=300) < len(core)


def _block_exchange(n: int) -> list[BaseMessage]:
    """A tool exchange in Anthropic's block form, as ``convert_to_messages`` makes it of an Anthropic-SDK history."""
    from langchain_core.messages import convert_to_messages

    return convert_to_messages(
        [
            {"role": "user", "content": f"turn {n}: check the next module " * 5},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Reading."},
                    {"type": "tool_use", "id": f"toolu_{n:03d}a", "name": "read_file", "input": {"path": f"m{n}.py"}},
                    {"type": "tool_use", "id": f"toolu_{n:03d}b", "name": "read_file", "input": {"path": f"t{n}.py"}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": f"toolu_{n:03d}a", "content": "x = 1\n" * 60},
                    {"type": "tool_result", "tool_use_id": f"toolu_{n:03d}b", "content": "assert f()\n" * 40},
                ],
            },
            {"role": "assistant", "content": f"Module {n} looks fine. " * 12},
        ]
    )


def test_a_tool_exchange_in_anthropic_block_form_is_never_split() -> None:
    # The tool_use blocks were no calls and the tool_result turn a user's: the cut kept a
    # tool_result whose tool_use it summarized (Anthropic: "unexpected tool_use_id").
    messages = [m for n in range(6) for m in _block_exchange(n)]
    core = to_core_list(messages)
    assert [c.id for c in core[1].tool_calls] == ["toolu_000a", "toolu_000b"]
    assert core[2].answers == ("toolu_000a", "toolu_000b")
    assert (1, 2) in tool_pairs(core)
    for budget in _budgets(messages):
        cut = find_cut_point(messages, budget)
        assert cut == 0 or not core[cut].answers, f"budget {budget}: the cut lands on a tool_result turn"


def _openai_exchange(n: int, kind: str) -> list[BaseMessage]:
    """A call OpenAI's Responses API writes as an output item, answered in a user turn.

    The reply's content holds the item as langchain-openai parses it (no ``tool_calls``:
    a built-in tool's call), the user turn the block langchain-openai sends as an input
    item (``non_message_item_types``), paired by the call's ``call_id`` (an approval
    request by its ``id``).
    """
    ask = HumanMessage(f"turn {n}: go on with the next module " * 5)
    if kind == "apply_patch":
        operation = {"type": "update_file", "path": f"src/m{n}.py", "diff": "+x = 1\n" * 60}
        call = {"type": "apply_patch_call", "id": f"apc_{n}", "call_id": f"call_{n}", "operation": operation}
        answer = {"type": "apply_patch_call_output", "call_id": f"call_{n}", "output": f"patched m{n}.py " * 40}
    elif kind == "mcp_approval":
        call = {"type": "mcp_approval_request", "id": f"mcpr_{n}", "server_label": "tracker", "name": "list_issues"}
        call["arguments"] = json.dumps({"page": n, "filter": "open " * 40})
        answer = {"type": "mcp_approval_response", "approve": True, "approval_request_id": f"mcpr_{n}"}
    else:
        arguments = {"query": f"tools for module {n} " * 20}
        call = {"type": "tool_search_call", "id": f"ts_{n}", "call_id": f"call_{n}", "execution": "client"}
        call |= {"status": "completed", "arguments": arguments}
        tools = [{"type": "function", "name": f"check_{n}_{i}", "description": "Checks a module. " * 8} for i in (1, 2)]
        answer = {"type": "tool_search_output", "call_id": f"call_{n}", "execution": "client", "tools": tools}
    reply = AIMessage([{"type": "reasoning", "id": f"rs_{n}", "summary": []}, {**call, "status": "completed"}])
    return [ask, reply, HumanMessage([answer]), AIMessage(f"Module {n} is done. " * 12)]


@pytest.mark.parametrize("kind", ["apply_patch", "mcp_approval", "tool_search"])
def test_an_openai_call_item_is_never_split_from_its_answer_in_a_user_turn(kind: str) -> None:
    # The item was no call and its answer a user's turn: the cut kept an apply_patch_call_output
    # (an mcp_approval_response, a tool_search_output) whose call it summarized, and the
    # Responses API refuses an output whose call is not in the request.
    messages = [m for n in range(6) for m in _openai_exchange(n, kind)]
    core = to_core_list(messages)
    ident = "mcpr_0" if kind == "mcp_approval" else "call_0"
    assert [c.id for c in core[1].tool_calls] == [ident]
    assert core[2].answers == (ident,)
    assert (1, 2) in tool_pairs(core)
    for budget in _budgets(messages):
        cut = find_cut_point(messages, budget)
        assert cut == 0 or not core[cut].answers, f"budget {budget}: the cut lands on the answer to a call"


def test_a_call_item_its_reply_answers_itself_is_no_call_and_a_computer_call_pairs_with_its_tool_message() -> None:
    # A tool search the server ran carries its output in the same reply: nothing waits for an answer.
    search = {"type": "tool_search_call", "id": "ts_1", "call_id": "c1", "execution": "server", "arguments": {}}
    found = {"type": "tool_search_output", "id": "tso_1", "call_id": "c1", "execution": "server", "tools": []}
    served = to_core_list([AIMessage([search, found])])[0]
    assert served.tool_calls == ()
    assert [p.kind for p in served.parts] == ["data", "data"]
    # A computer call is answered by a tool message (langchain-openai sends it as a computer_call_output).
    click = {"type": "computer_call", "id": "cu_1", "call_id": "call_c", "action": {"type": "click", "x": 4, "y": 2}}
    screen = ToolMessage("", tool_call_id="call_c", additional_kwargs={"type": "computer_call_output"})
    core = to_core_list([HumanMessage("open the settings"), AIMessage([click]), screen])
    assert [(c.id, c.name) for c in core[1].tool_calls] == [("call_c", "computer")]
    assert tool_pairs(core) == [(1, 2)]


_SEARCH_HITS = [{"type": "web_search_result", "url": "https://ex.com", "title": "T", "encrypted_content": "e" * 400}]


def _server_blocks(n: int, kind: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A server tool's call and its result, as ChatAnthropic keeps them in a reply (``v1``: LangChain's v1 blocks)."""
    ident = f"srvtoolu_{n:03d}"
    if kind == "v1":
        call = {"type": "server_tool_call", "id": ident, "name": "web_search", "args": {"query": f"lib {n}"}}
        result = {"type": "server_tool_result", "tool_call_id": ident, "status": "success", "output": _SEARCH_HITS}
        return call, result | {"extras": {"block_type": "web_search_tool_result"}}
    if kind == "mcp":
        call = {"type": "mcp_tool_use", "id": ident, "name": "list_issues", "server_name": "tracker", "input": {}}
        return call, {"type": "mcp_tool_result", "tool_use_id": ident, "is_error": False, "content": "issue " * 200}
    if kind == "code_execution":
        call = {"type": "server_tool_use", "id": ident, "name": "code_execution", "input": {"code": f"print({n})"}}
        output = {"type": "code_execution_result", "stdout": "row\n" * 200, "stderr": "", "return_code": 0}
        return call, {"type": "code_execution_tool_result", "tool_use_id": ident, "content": output | {"content": []}}
    call = {"type": "server_tool_use", "id": ident, "name": "web_search", "input": {"query": f"lib {n}"}}
    return call, {"type": "web_search_tool_result", "tool_use_id": ident, "content": _SEARCH_HITS}


def _paused_exchange(n: int, kind: str) -> list[BaseMessage]:
    """Claude pauses its turn after a server tool's call (``pause_turn``); the next reply continues it with the result.

    Anthropic's docs say to send the paused reply back as it is: ChatAnthropic
    sends the two replies as consecutive assistant turns, which the API joins.
    """
    call, result = _server_blocks(n, kind)
    meta = {"output_version": "v1", "model_provider": "anthropic"} if kind == "v1" else {}
    text = "The handler reads the request and validates the payload. "
    paused = AIMessage([{"type": "text", "text": f"Looking {n} up. {text}"}, call], response_metadata=meta)
    continued = AIMessage([result, {"type": "text", "text": f"Found {n}. " + text * 6}], response_metadata=meta)
    return [HumanMessage(f"turn {n}: look up the next library " * 5), paused, continued]


@pytest.mark.parametrize("kind", ["web_search", "code_execution", "mcp", "v1"])
def test_a_paused_server_tool_call_is_never_split_from_the_reply_that_carries_its_result(kind: str) -> None:
    # The server tool's call and its result in the next reply were data: the cut kept the continuation
    # (its web_search_tool_result) and summarized the call, a request the Messages API refuses.
    from conftest import assert_valid_anthropic_request

    from langchain_compaction import ExtractiveSummarizer

    messages = [m for n in range(8) for m in _paused_exchange(n, kind)]
    core = to_core_list(messages)
    assert [c.id for c in core[1].tool_calls] == ["srvtoolu_000"]
    assert core[2].answers == ("srvtoolu_000",)
    assert (1, 2) in tool_pairs(core)
    for budget in _budgets(messages):
        cut = find_cut_point(messages, budget)
        assert cut == 0 or not core[cut].answers, f"budget {budget}: the cut lands on the reply that continues a turn"
    for budget in _budgets(messages)[::2]:
        options = CompactionOptions(context_window=200_000, keep_recent_tokens=budget)
        result, out = compact(ExtractiveSummarizer(), messages, options)
        assert result is not None
        assert_valid_anthropic_request(out)


def test_a_server_tool_result_in_its_own_reply_waits_for_nothing_and_a_continuation_answers_as_the_model() -> None:
    from langchain_compaction.core.tokens import estimate_tokens
    from langchain_compaction.core.transcript import message_body, role_label

    call, result = _server_blocks(1, "web_search")
    text = {"type": "text", "text": "Found it."}
    # Claude ran the search within the reply: one block pair, as today (no call waits for an answer).
    whole = to_core_list([AIMessage([call, result, text])])[0]
    assert (whole.tool_calls, whole.results) == ((), ())
    assert [p.kind for p in whole.parts] == ["data", "data", "text"]
    # Paused after the call, with thinking: the turn is in progress until the continuation answers it.
    thinking = {"type": "thinking", "thinking": "search first", "signature": "sig"}
    core = to_core_list([HumanMessage("what is new?"), AIMessage([thinking, call]), AIMessage([result, text])])
    assert thinking_loop_opening(core[:2]) == 1
    assert thinking_loop_opening(core) is None  # the continuation answered as the model: the turn is done
    continued = core[2]
    assert (continued.is_result, continued.asks, continued.answers) == (False, False, ("srvtoolu_001",))
    assert valid_boundaries(core) == [True, True, False, True]
    # The summarizer reads it as the assistant's, the result beside its call; the estimate counts the result.
    assert role_label(continued) == "[Assistant]"
    assert "(tool result, call srvtoolu_001)" in message_body(continued)
    assert estimate_message_tokens([AIMessage([result, text])]) > estimate_tokens(json.dumps(result))


def test_the_node_keeps_a_block_form_exchange_whole_in_a_graph() -> None:
    from conftest import assert_valid_anthropic_request
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import START, MessagesState, StateGraph

    from langchain_compaction import CompactionNode, ExtractiveSummarizer

    for keep in (300, 450, 600, 900):
        turns = iter(range(1, 100))

        def agent(state: MessagesState, turns: Any = turns) -> dict[str, list[BaseMessage]]:
            return {"messages": _block_exchange(next(turns))[1:]}

        builder = StateGraph(MessagesState)
        options = CompactionOptions(context_window=4_000, reserve_tokens=500, keep_recent_tokens=keep)
        builder.add_node("compact", CompactionNode(ExtractiveSummarizer(), options))
        builder.add_node("agent", agent)
        builder.add_edge(START, "compact")
        builder.add_edge("compact", "agent")
        graph = builder.compile(checkpointer=InMemorySaver())
        config = {"configurable": {"thread_id": f"k{keep}"}}
        compacted = 0
        for turn in range(25):
            state = graph.invoke({"messages": [HumanMessage(f"turn {turn}: check the next module " * 5)]}, config)
            compacted += any(is_summary_message(m) for m in state["messages"])
            assert_valid_anthropic_request(state["messages"])
        assert compacted, "the run never compacted (test setup)"


def _thinking_loop_in_blocks() -> list[BaseMessage]:
    """A Claude tool loop with extended thinking, in Anthropic's block form (results in user turns)."""
    messages: list[BaseMessage] = [
        HumanMessage("Old question.", id="h00"),
        AIMessage("Old answer. " * 300, id="a00"),
        HumanMessage("Refactor the payment module step by step.", id="h0"),
    ]
    for i in range(10):
        content: list[Any] = [{"type": "thinking", "thinking": "Plan it. " * 40, "signature": "c2ln" * 20}][: i == 0]
        use = {"type": "tool_use", "id": f"toolu_{i}", "name": "read_file", "input": {"path": f"f{i}.py"}}
        messages.append(AIMessage([*content, {"type": "text", "text": f"Step {i}."}, use], id=f"a{i}"))
        result = {"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": f"line {i} " * 200}
        messages.append(HumanMessage([result], id=f"r{i}"))
    return messages


def test_a_thinking_loop_in_block_form_keeps_its_opening() -> None:
    # A tool_result turn was taken for the user's: the loop's opening (its thinking block) was
    # looked for after it, not found, and the kept part opened with a later step (Claude refuses).
    from conftest import assert_valid_anthropic_request

    from langchain_compaction import ExtractiveSummarizer, compact

    options = CompactionOptions(context_window=8_000, reserve_tokens=1_000, keep_recent_tokens=1_500)
    _, compacted = compact(ExtractiveSummarizer(), _thinking_loop_in_blocks(), options)
    assert_valid_anthropic_request(compacted, thinking=True)


def test_the_bridge_repeats_the_user_s_words_that_came_with_tool_results() -> None:
    # A user turn of tool_result blocks and the user's new words was skipped as a tool's answer: the
    # bridge repeated the request it replaced.
    from langchain_compaction import ExtractiveSummarizer, compact

    messages: list[BaseMessage] = [HumanMessage("Refactor the payment module step by step.", id="h0")]
    for i in range(20):
        use = {"type": "tool_use", "id": f"toolu_{i}", "name": "read_file", "input": {"path": f"f{i}.py"}}
        messages.append(AIMessage([{"type": "text", "text": f"Step {i}."}, use], id=f"a{i}"))
        blocks: list[Any] = [{"type": "tool_result", "tool_use_id": f"toolu_{i}", "content": f"line {i} " * 60}]
        if i == 5:
            blocks.append({"type": "text", "text": "Change of plan: write the migration for the orders table instead."})
        messages.append(HumanMessage(blocks, id=f"r{i}"))
    options = CompactionOptions(context_window=8_000, reserve_tokens=1_000, keep_recent_tokens=800)
    _, compacted = compact(ExtractiveSummarizer(), messages, options)
    bridge = next(m for m in compacted if isinstance(m, HumanMessage) and str(m.id).startswith("compaction-bridge"))
    assert "orders table" in str(bridge.content)
