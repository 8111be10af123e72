"""Interop with provider-side compaction: never summarize across a ``compaction`` block."""

from __future__ import annotations

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

from langchain_compaction import CompactionOptions, compact
from langchain_compaction._lc.convert import is_summary_message


def conversation() -> list:
    server_block = {"type": "compaction", "content": "SERVER-SUMMARY: the user is migrating billing to v2."}
    messages = [
        SystemMessage("You are an agent.", id="sys"),
        HumanMessage("OLD-REQUEST " * 50, id="h0"),
        AIMessage(content=[server_block, {"type": "text", "text": "Continuing."}], id="a0"),
    ]
    for turn in range(1, 12):
        messages.append(HumanMessage(f"step {turn} " + "detail " * 80, id=f"h{turn}"))
        messages.append(AIMessage(f"done {turn} " + "note " * 80, id=f"a{turn}"))
    return messages


def test_the_block_and_what_precedes_it_stay_verbatim_and_unsummarized():
    messages = conversation()
    prompts: list[str] = []
    result, out = compact(
        lambda p: prompts.append(p) or "## Goal\n- go on", messages, CompactionOptions(keep_recent_tokens=800)
    )
    assert result is not None
    assert out[0] is messages[0]
    assert is_summary_message(out[1])
    # Right after the summary: the messages up to the server's block, untouched.
    assert out[2] is messages[1]
    assert out[3] is messages[2]
    assert out[-1] is messages[-1]
    shown = "".join(prompts)
    assert "SERVER-SUMMARY" not in shown
    assert "OLD-REQUEST" not in shown
    assert "step 1 " in shown  # what follows the block is summarized
    assert result.messages_removed == result.cut_index - 3
    assert result.compacted_tokens < result.original_tokens


def test_nothing_after_the_block_means_nothing_to_compact():
    messages = conversation()[:3]
    result, out = compact(lambda p: "## Goal\n- x", messages, CompactionOptions(keep_recent_tokens=10))
    assert result is None
    assert out == messages


def test_a_second_compaction_keeps_the_block_and_updates_the_summary():
    messages = conversation()
    _, once = compact(lambda p: "## Goal\n- first", messages, CompactionOptions(keep_recent_tokens=800))
    grown = [*once, HumanMessage("step 99 " + "more " * 200, id="h99"), AIMessage("ok " * 200, id="a99")]
    prompts: list[str] = []
    result, out = compact(
        lambda p: prompts.append(p) or "## Goal\n- second", grown, CompactionOptions(keep_recent_tokens=300)
    )
    assert result is not None
    assert result.updated_previous_summary
    assert sum(1 for m in out if is_summary_message(m)) == 1
    assert any(m is messages[2] for m in out)  # the server's block is still there, same object
    assert "## Goal\n- first" in "".join(prompts)


def test_what_precedes_a_server_block_is_not_counted_without_usage():
    # Claude drops everything before its compaction block: the trigger must not
    # count it when replies carry no usage_metadata (120 turns, ~20k billed).
    from langchain_compaction import CompactionNode, should_compact
    from langchain_compaction.tokens import estimate_message_tokens

    before = [HumanMessage(f"old {i} " + "detail " * 1_000, id=f"old{i}") for i in range(60)]
    block = {"type": "compaction", "content": "SERVER-SUMMARY of the old turns"}
    after = [AIMessage(content=[block, {"type": "text", "text": "Continuing."}], id="blk")]
    for turn in range(40):
        after += [HumanMessage(f"step {turn} " * 20, id=f"h{turn}"), AIMessage(f"done {turn} " * 20, id=f"a{turn}")]
    messages = [SystemMessage("You are an agent.", id="sys"), *before, *after]
    billed = estimate_message_tokens([messages[0], *after])
    assert estimate_message_tokens(messages) > 100_000 > 20_000 > billed
    options = CompactionOptions(context_window=40_000)
    assert should_compact(messages, options=options) is False
    assert CompactionNode(lambda p: "## Goal\n- x", options).invoke({"messages": messages}) == {}
    # Once what follows the block outgrows the window, it compacts.
    grown = [*messages, *(HumanMessage("more " * 400, id=f"m{i}") for i in range(80))]
    assert should_compact(grown, options=options) is True


def test_a_tool_call_made_with_a_compaction_block_keeps_its_result():
    """A tool call made in the message that holds a compaction block keeps its result right after it."""
    messages = [
        SystemMessage("sys"),
        HumanMessage("start " * 50),
        AIMessage(
            content=[
                {"type": "compaction", "content": "server summary"},
                {"type": "tool_use", "id": "t1", "name": "read", "input": {}},
            ],
            tool_calls=[{"id": "t1", "name": "read", "args": {}}],
        ),
        ToolMessage("file " * 300, tool_call_id="t1"),
        AIMessage("done " * 300),
        HumanMessage("more " * 300),
        AIMessage("ok " * 300),
        HumanMessage("last"),
    ]
    result, out = compact(lambda p: "## Goal\n- x", messages, CompactionOptions(keep_recent_tokens=200))
    assert result is not None
    position = next(i for i, m in enumerate(out) if m is messages[2])
    assert out[position + 1] is messages[3]  # the result follows its call


def test_a_thinking_loop_kept_after_a_server_block_opens_with_the_library_s_user_turn():
    # Compacted mid-loop, the user's request that opened the loop went into the summary: the block's reply
    # was followed by the loop's first reply, two assistant turns, and Claude refused a loop in progress
    # that did not open with thinking. The bridge, repeating the request, now follows the fenced part.
    from tests.conftest import assert_valid_anthropic_request

    thinking = {"type": "thinking", "thinking": "next", "signature": "sig"}
    history = [
        HumanMessage("start the billing migration " * 20, id="h0"),
        AIMessage([{"type": "compaction", "content": "Summary: migrating billing."}, {"type": "text", "text": "On."}]),
    ]
    for step in range(5):
        history += [
            HumanMessage(f"step {step} " + "detail " * 80),
            AIMessage([thinking, {"type": "text", "text": "ok"}]),
        ]
    history.append(HumanMessage("now run the lookups for every region", id="request"))
    for k in range(6):
        call = {"name": "lookup", "args": {"q": str(k)}, "id": f"toolu_{k}", "type": "tool_call"}
        history.append(
            AIMessage(
                [thinking, {"type": "tool_use", "id": f"toolu_{k}", "name": "lookup", "input": {}}], tool_calls=[call]
            )
        )
        history.append(ToolMessage("row " * 300, tool_call_id=f"toolu_{k}"))
    result, out = compact(lambda p: "## Goal\n- migrate billing", history, CompactionOptions(context_window=4_000))
    assert result is not None
    assert_valid_anthropic_request(out)
    block = next(
        i for i, m in enumerate(out) if isinstance(m.content, list) and m.content[0].get("type") == "compaction"
    )
    assert isinstance(out[block + 1], HumanMessage)
    assert "now run the lookups for every region" in str(out[block + 1].content)
