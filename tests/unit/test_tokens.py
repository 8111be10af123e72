"""The token estimate, the per-message count, custom counters and the trigger."""

from __future__ import annotations

import base64
import json
import random
from typing import Any

import pytest
from helpers_turns import chat
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.messages.utils import count_tokens_approximately

from langchain_compaction import CompactionNode, CompactionOptions, acompact, compact, should_compact
from langchain_compaction._lc.convert import to_core_list
from langchain_compaction.core.context import context_tokens
from langchain_compaction.core.tokens import (
    IMAGE_TOKENS,
    MESSAGE_OVERHEAD_TOKENS,
    TOOL_CALL_OVERHEAD_TOKENS,
    estimate_message,
)
from langchain_compaction.core.types import Counts, Message, Part, ToolCall
from langchain_compaction.errors import ConfigurationError, InvalidMessagesError
from langchain_compaction.tokens import estimate_message_tokens, estimate_tokens

PROSE = (
    "The quick brown fox jumps over the lazy dog while the farmer watches from the porch. "
    "Later that evening the family sat down to dinner and talked about the harvest. "
) * 12

CODE = (
    "def add(a: int, b: int) -> int:\n"
    '    """Add two numbers."""\n'
    "    return a + b\n\n"
    "for i in range(10):\n"
    "    print(add(i, i * 2))\n"
) * 10

JSON_TEXT = json.dumps([{"id": i, "name": f"item{i}", "price": i * 1.5, "tags": ["a", "b"]} for i in range(40)])

CJK = "这是一个用于测试的中文句子，包含一些常见的汉字。" * 20

# Seeded so the test is deterministic; random bytes are what base64 usually carries.
BASE64 = base64.b64encode(random.Random(7).randbytes(3000)).decode()


def _reference_estimate(text: str) -> int:
    """The Go reference's estimate, ``len(text) / 4``."""
    return len(text) // 4


# --- estimate_tokens ---------------------------------------------------------


def test_four_hundred_letters_are_one_hundred_tokens() -> None:
    assert estimate_tokens("a" * 400) == 100


def test_empty_text_is_zero_tokens() -> None:
    assert estimate_tokens("") == 0


def test_plain_prose_is_about_four_chars_per_token() -> None:
    tokens = estimate_tokens(PROSE)
    chars_per_token = len(PROSE) / tokens
    assert 3.7 <= chars_per_token <= 4.3, chars_per_token


def test_plain_prose_stays_within_ten_percent_of_the_reference() -> None:
    assert abs(estimate_tokens(PROSE) - _reference_estimate(PROSE)) <= 0.1 * _reference_estimate(PROSE)


@pytest.mark.parametrize(
    ("name", "text", "factor"),
    [
        ("code", CODE, 1.15),
        ("json", JSON_TEXT, 1.25),
        ("cjk", CJK, 2.5),
        ("base64", BASE64, 2.0),
    ],
)
def test_dense_content_is_charged_more_than_four_chars_per_token(name: str, text: str, factor: float) -> None:
    # The reference's len/4 undercounts these classes; the estimate must charge
    # clearly more than len/4 for each of them.
    assert estimate_tokens(text) >= factor * _reference_estimate(text), name


def test_cjk_costs_about_a_token_per_character() -> None:
    assert estimate_tokens(CJK) >= len(CJK) * 0.9


def test_long_identifiers_are_not_priced_as_base64() -> None:
    identifier = "very_long_snake_case_identifier_name_that_keeps_going_on_and_on_forever"
    # Underscores are punctuation; the point is only that the dense-run rule
    # (0.75 tokens a character) did not fire on a word-like run.
    assert estimate_tokens(identifier) < 0.5 * len(identifier)


def test_estimate_grows_with_text() -> None:
    assert estimate_tokens("word " * 10) < estimate_tokens("word " * 100) < estimate_tokens("word " * 1000)


# --- estimate_message / estimate_message_tokens -------------------------------


def test_every_message_pays_the_overhead() -> None:
    assert estimate_message_tokens([HumanMessage("")]) == MESSAGE_OVERHEAD_TOKENS
    assert estimate_message_tokens([HumanMessage("")] * 5) == 5 * MESSAGE_OVERHEAD_TOKENS


def test_text_message_is_text_plus_overhead() -> None:
    assert estimate_message_tokens([HumanMessage("a" * 400)]) == 100 + MESSAGE_OVERHEAD_TOKENS


def test_empty_list_is_zero_tokens() -> None:
    assert estimate_message_tokens([]) == 0


def test_tool_call_names_and_arguments_are_counted() -> None:
    args = {"path": "/src/app/main.py", "content": "x = 1\n" * 200}
    bare = AIMessage("")
    with_call = AIMessage("", tool_calls=[{"name": "write_file", "args": args, "id": "c1"}])
    extra = estimate_message_tokens([with_call]) - estimate_message_tokens([bare])
    # The reference counted text parts only: this call would have cost nothing.
    assert extra >= TOOL_CALL_OVERHEAD_TOKENS + estimate_tokens("write_file") + estimate_tokens(json.dumps(args)) // 2
    assert extra >= 300


def test_each_parallel_tool_call_is_counted() -> None:
    def calls(n: int) -> AIMessage:
        return AIMessage(
            "", tool_calls=[{"name": "search", "args": {"query": f"q{i} " * 20}, "id": f"c{i}"} for i in range(n)]
        )

    one, three = estimate_message_tokens([calls(1)]), estimate_message_tokens([calls(3)])
    assert three - MESSAGE_OVERHEAD_TOKENS >= 2.5 * (one - MESSAGE_OVERHEAD_TOKENS)


def test_tool_use_block_duplicating_a_tool_call_is_counted_once() -> None:
    call = {"name": "search", "args": {"query": "lorem ipsum " * 100}, "id": "toolu_1"}
    plain = AIMessage("", tool_calls=[call])
    # Anthropic replies carry the call twice: as a content block and in tool_calls.
    doubled = AIMessage(
        [{"type": "tool_use", "id": "toolu_1", "name": "search", "input": call["args"]}],
        tool_calls=[call],
    )
    assert estimate_message_tokens([doubled]) == estimate_message_tokens([plain])
    # OpenAI's Responses API (output_version "responses/v1") names the call by call_id; the block's id is its own.
    arguments = json.dumps(call["args"])
    responses = AIMessage(
        [{"type": "function_call", "id": "fc_9", "call_id": "toolu_1", "name": "search", "arguments": arguments}],
        tool_calls=[call],
    )
    assert estimate_message_tokens([responses]) == estimate_message_tokens([plain])
    # A custom tool's call: langchain-openai puts it in tool_calls and keeps its item (named by call_id) too.
    custom = AIMessage(
        [{"type": "custom_tool_call", "id": "ctc_9", "call_id": "toolu_1", "name": "search", "input": arguments}],
        tool_calls=[call],
    )
    assert estimate_message_tokens([custom]) == estimate_message_tokens([plain])


def test_a_legacy_openai_function_call_is_counted_and_shown() -> None:
    from langchain_compaction._lc.convert import to_core
    from langchain_compaction.core.transcript import message_body

    arguments = json.dumps({"location": "Reykjavik, IS", "note": "x" * 2_000})
    call = AIMessage("", additional_kwargs={"function_call": {"name": "get_weather", "arguments": arguments}})
    assert estimate_message_tokens([call]) > 300  # (4 before: an empty assistant turn)
    assert "get_weather" in message_body(to_core(call))
    assert "Reykjavik, IS" in message_body(to_core(call))


def test_tool_results_are_counted() -> None:
    result = ToolMessage("line of output from the tool\n" * 100, tool_call_id="c1")
    assert estimate_message_tokens([result]) >= estimate_tokens(str(result.content))
    assert estimate_message_tokens([result]) > estimate_message_tokens([ToolMessage("", tool_call_id="c1")]) + 500


def test_reasoning_blocks_are_counted() -> None:
    thinking = "Let me think about the failing test step by step. " * 80
    with_reasoning = AIMessage(
        [{"type": "thinking", "thinking": thinking, "signature": "sig"}, {"type": "text", "text": "Done."}]
    )
    without = AIMessage([{"type": "text", "text": "Done."}])
    assert estimate_message_tokens([with_reasoning]) - estimate_message_tokens([without]) >= estimate_tokens(thinking)


def test_images_cost_a_fixed_amount_not_their_bytes() -> None:
    small = HumanMessage([{"type": "image", "base64": "iVBORw0KGgo=", "mime_type": "image/png"}])
    huge = HumanMessage([{"type": "image", "base64": "A" * 400_000, "mime_type": "image/png"}])
    assert estimate_message_tokens([small]) == estimate_message_tokens([huge])
    assert estimate_message_tokens([small]) == IMAGE_TOKENS + MESSAGE_OVERHEAD_TOKENS


def test_an_image_openai_generated_costs_an_image_and_never_reaches_the_summarizer_as_text() -> None:
    """The Responses API's image_generation_call holds the image's base64 in ``result``."""
    from langchain_compaction._lc.convert import to_core
    from langchain_compaction.core.transcript import message_body

    blob = base64.b64encode(random.Random(3).randbytes(300_000)).decode()
    block = {
        "type": "image_generation_call",
        "id": "ig_1",
        "status": "completed",
        "result": blob,
        "output_format": "png",
    }
    message = AIMessage([{"type": "text", "text": "Here is the logo."}, block])
    assert estimate_message_tokens([message]) < IMAGE_TOKENS + 100
    body = message_body(to_core(message))
    assert blob[:40] not in body
    assert "image/png" in body


@pytest.mark.parametrize(
    "block",
    [
        {"type": "media", "mime_type": "image/png", "data": "QUFB" * 100_000},  # langchain-google-genai, inline
        {"type": "input_file", "filename": "scan.png", "file_data": "data:image/png;base64," + "QUFB" * 100_000},
    ],
    ids=["gemini media", "responses input_file"],
)
def test_files_of_other_providers_cost_an_attachment_and_never_reach_the_summarizer_as_text(
    block: dict[str, Any],
) -> None:
    # They were counted as their base64 text (about 297,000 tokens for a 400 KB photo).
    from langchain_compaction._lc.convert import to_core
    from langchain_compaction.core.transcript import message_body

    message = HumanMessage([{"type": "text", "text": "what is in this photo?"}, block])
    assert estimate_message_tokens([message]) < IMAGE_TOKENS + 100
    assert "QUFB" not in message_body(to_core(message))


def _nested(image: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": [image, {"type": "text", "text": "taken"}]},
        {"type": "non_standard", "value": {"type": "screenshot", "items": [image]}},
        {"type": "function_call_output", "call_id": "c1", "output": [image]},
    ]


@pytest.mark.parametrize("index", range(3), ids=["tool_result", "non_standard", "function_call_output"])
def test_an_image_nested_in_another_block_costs_an_image_and_never_reaches_the_summarizer_as_text(index: int) -> None:
    # A computer-use screenshot in a tool_result of a user turn (as convert_to_messages reads Anthropic's
    # format) counted 297,600 tokens for a 400 KB PNG, and its base64 went to the summarizer.
    from langchain_compaction._lc.convert import to_core
    from langchain_compaction.core.transcript import message_body

    data = "QUFB" * 100_000
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}
    message = HumanMessage([_nested(image)[index]])
    assert estimate_message_tokens([message]) < IMAGE_TOKENS + 100
    body = message_body(to_core(message))
    assert "QUFB" not in body
    assert "image/png" in body


def test_a_tools_listing_of_files_nested_in_a_block_stays_text() -> None:
    # A repository listing as a tool returns it ({"type": "file", "path": ...}, no bytes) is what it says:
    # read as attachments, a thousand entries cost 1.6 million tokens and their paths left the transcript.
    from langchain_compaction._lc.convert import to_core
    from langchain_compaction.core.transcript import message_body

    listing = [{"type": "file", "name": f"m{i}.py", "path": f"src/m{i}.py", "size": 120} for i in range(1_000)]
    message = HumanMessage([{"type": "non_standard", "value": {"type": "listing", "entries": listing}}])
    assert estimate_message_tokens([message]) < 100_000
    assert "src/m999.py" in message_body(to_core(message))


def test_image_url_blocks_cost_the_image_price() -> None:
    message = HumanMessage(
        [{"type": "text", "text": "what is in this picture?"}, {"type": "image_url", "image_url": {"url": "https://x"}}]
    )
    assert estimate_message_tokens([message]) >= IMAGE_TOKENS


def test_unknown_blocks_are_counted_as_their_json() -> None:
    block = {"type": "citation_list", "items": [f"source {i}" for i in range(100)]}
    message = AIMessage([block])
    assert estimate_message_tokens([message]) >= estimate_tokens(json.dumps(block)) * 0.9


@pytest.mark.parametrize("kind", [["text"], {"name": "text"}])
def test_a_block_whose_type_is_no_string_is_an_unknown_block_not_a_type_error(kind: object) -> None:
    # A client's or a server's malformed JSON: it raised "unhashable type" on every turn of the thread.
    from langchain_compaction._lc.convert import to_core
    from langchain_compaction.core.transcript import message_body

    message = HumanMessage([{"type": kind, "text": "hello from the widget"}])
    assert estimate_message_tokens([message]) > 0
    assert "hello from the widget" in message_body(to_core(message))
    messages = [message, AIMessage("hi " * 200), HumanMessage("next " * 200), AIMessage("ok " * 200)]
    result, out = compact(lambda prompt: "## Goal\n- go on", messages, CompactionOptions(keep_recent_tokens=100))
    assert result.messages_removed >= 1
    assert out[-1] is messages[-1]


def test_core_estimate_message_counts_every_field() -> None:
    message = Message(
        "assistant",
        parts=(Part("text", "a" * 40), Part("reasoning", "b" * 40), Part("image", "image/png")),
        tool_calls=(ToolCall("call_1", "run", '{"cmd": "ls"}'),),
    )
    expected = (
        MESSAGE_OVERHEAD_TOKENS
        + 10
        + 10
        + IMAGE_TOKENS
        + TOOL_CALL_OVERHEAD_TOKENS
        + estimate_tokens("run")
        + estimate_tokens('{"cmd": "ls"}')
    )
    assert estimate_message(message) == expected


# --- custom token_counter ---------------------------------------------------


def _conversation() -> list[BaseMessage]:
    return [
        SystemMessage("You are a helpful agent."),
        HumanMessage("please list the files " * 30),
        AIMessage("", tool_calls=[{"name": "ls", "args": {"path": "."}, "id": "c1"}]),
        ToolMessage("a.py\nb.py\n" * 50, tool_call_id="c1"),
        AIMessage("There are two files. " * 20),
        HumanMessage("thanks, now open a.py"),
    ]


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_custom_token_counter_is_used_by_compact(mode: str) -> None:
    calls: list[int] = []

    def counter(messages: list[BaseMessage]) -> int:
        calls.append(len(messages))
        return count_tokens_approximately(messages)

    messages = _conversation()
    options = CompactionOptions(keep_recent_tokens=50, token_counter=counter)

    def model(_prompt: str) -> str:
        return "## Goal\n- list files"

    if mode == "sync":
        result, _ = compact(model, messages, options)
    else:
        result, _ = await acompact(model, messages, options)
    assert result is not None
    assert calls, "the custom counter was never called"
    assert result.original_tokens == sum(count_tokens_approximately([m]) for m in messages)
    assert result.original_tokens != estimate_message_tokens(messages)


def test_custom_token_counter_drives_the_cut() -> None:
    # Every message costs 1000 by this counter: with a 2500 budget the walk
    # back keeps two messages and the third one crosses the budget.
    messages = [HumanMessage(f"turn {i}") if i % 2 == 0 else AIMessage(f"reply {i}") for i in range(10)]

    def model(_prompt: str) -> str:
        return "## Goal\n- chat"

    options = CompactionOptions(keep_recent_tokens=2500, token_counter=lambda ms: 1000 * len(ms))
    result, out = compact(model, messages, options)
    assert result is not None
    assert result.cut_index == 8
    assert out[1:] == messages[8:]
    # The built-in estimate counts these tiny messages as a few tokens each:
    # everything fits the same budget and only a forced cut would happen.
    assert compact(model, messages, CompactionOptions(keep_recent_tokens=2500))[0].forced  # type: ignore[union-attr]


@pytest.mark.parametrize("bad", [-1, 1.5, "12", None, True])
def test_token_counter_returning_a_bad_value_is_an_invalid_messages_error(bad: object) -> None:
    messages = _conversation()
    options = CompactionOptions(token_counter=lambda _ms: bad)
    with pytest.raises(InvalidMessagesError) as info:
        compact(lambda _p: "summary", messages, options)
    assert "token_counter" in str(info.value)
    assert repr(bad) in str(info.value)
    assert info.value.index == 0


def test_token_counter_must_be_callable() -> None:
    with pytest.raises(ConfigurationError) as info:
        CompactionOptions(token_counter=42)  # type: ignore[arg-type]
    assert "token_counter=42" in str(info.value)


def test_a_token_counter_or_redactor_that_cannot_take_its_argument_is_refused_at_construction() -> None:
    # It was accepted, then failed inside the agent's run with a bare TypeError from the counting.
    with pytest.raises(ConfigurationError, match=r"token_counter=.*it takes \(\)"):
        CompactionOptions(token_counter=lambda: 0)
    with pytest.raises(ConfigurationError, match=r"redact=.*it takes \(text, mode\)"):
        CompactionOptions(redact=lambda text, mode: text)
    CompactionOptions(token_counter=count_tokens_approximately, redact=lambda text, *rest: text)  # (these take it)


def test_a_summary_budget_that_leaves_no_room_is_refused_at_construction() -> None:
    # It was taken, and a compaction at window 4,000 grew the context from 3,960 to 9,537 tokens.
    with pytest.raises(ConfigurationError) as info:
        CompactionOptions(context_window=4_000, summary_max_tokens=100_000)
    assert "summary_max_tokens=100000" in str(info.value)
    assert "below 2450" in str(info.value)
    assert CompactionOptions(context_window=4_000, summary_max_tokens=2_000).budget.summary_max == 2_000
    assert CompactionOptions(summary_max_tokens=100_000).budget.summary_max == 100_000  # no window: nothing to fit


# --- should_compact ------------------------------------------------------------


@pytest.mark.parametrize(("window", "reserve"), [(0, 100), (-5, 100), (1000, 0), (1000, -1), (0, 0)])
def test_should_compact_is_false_without_a_window_or_a_reserve(window: int, reserve: int) -> None:
    huge = [HumanMessage("a" * 400_000)]
    assert should_compact(huge, window, reserve) is False


def test_should_compact_is_false_at_the_threshold() -> None:
    messages = _conversation()
    tokens = estimate_message_tokens(messages)
    reserve = 100
    # tokens == window - reserve: not over, so no compaction.
    assert should_compact(messages, tokens + reserve, reserve) is False


def test_should_compact_is_true_one_token_over_the_threshold() -> None:
    messages = _conversation()
    tokens = estimate_message_tokens(messages)
    reserve = 100
    assert should_compact(messages, tokens + reserve - 1, reserve) is True


def test_should_compact_is_false_well_under_the_threshold() -> None:
    assert should_compact(_conversation(), 200_000, 16_384) is False


def test_should_compact_counts_tool_calls_the_reference_missed() -> None:
    # Only tool traffic, no text: the reference's estimate is 0 and it never fires.
    args = {"content": "x = 1\n" * 2000}
    messages: list[BaseMessage] = [
        HumanMessage("go"),
        AIMessage("", tool_calls=[{"name": "write", "args": args, "id": "c1"}]),
        ToolMessage("ok", tool_call_id="c1"),
    ]
    assert should_compact(messages, 4000, 1000) is True


def test_should_compact_with_options_uses_the_token_counter() -> None:
    """should_compact(options=...) answers what the adapters decide, with the options' token counter."""
    options = CompactionOptions(context_window=10_000, reserve_tokens=1_000, keep_recent_tokens=100)
    heavy = CompactionOptions(
        context_window=10_000, reserve_tokens=1_000, keep_recent_tokens=100, token_counter=lambda m: 1_000 * len(m)
    )
    messages = chat(5, size=5)  # ten short messages: the estimate says they fit
    assert should_compact(messages, options=options) is False
    assert should_compact(messages, 10_000, 1_000) is False
    assert should_compact(messages, options=heavy) is True
    assert bool(CompactionNode(lambda p: "## Goal\n- x", heavy).invoke({"messages": messages})) is True


def test_should_compact_takes_the_options_second_as_compact_does() -> None:
    """should_compact(messages, options) uses the options, like compact(model, messages, options)."""
    messages = [HumanMessage("a" * 8_000)]
    assert should_compact(messages, CompactionOptions(context_window=1_000)) is True
    assert should_compact(messages, CompactionOptions(context_window=200_000)) is False


@pytest.mark.parametrize(
    ("args", "kwargs", "named"),
    [
        ((1_000, CompactionOptions()), {}, "reserve_tokens=CompactionOptions("),
        ((CompactionOptions(), 200), {}, "context_window=CompactionOptions("),
        ((CompactionOptions(),), {"options": CompactionOptions()}, "context_window=CompactionOptions("),
        ((1_000,), {}, "reserve_tokens=None"),
        (("1000", 200), {}, "context_window='1000'"),
    ],
)
def test_should_compact_errors_name_the_argument_passed_wrongly(
    args: tuple[Any, ...], kwargs: dict[str, Any], named: str
) -> None:
    with pytest.raises(ConfigurationError, match="pass") as caught:
        should_compact([HumanMessage("hi")], *args, **kwargs)
    assert str(caught.value).startswith(named)
    assert "options=None" not in str(caught.value)


def test_reasoning_kept_beside_the_content_is_shown_to_the_summarizer_but_not_counted() -> None:
    # ChatDeepSeek, ChatOllama(reasoning=True) and ChatGroq keep the model's reasoning in
    # additional_kwargs["reasoning_content"], and no request sends it back: it was never shown.
    reason = "ROOTCAUSE the off-by-one is in tokenizer.py line 212, the loop runs to <= len"
    call = [{"id": "call_1", "name": "read_file", "args": {"path": "tokenizer.py"}, "type": "tool_call"}]
    thinking = AIMessage("", additional_kwargs={"reasoning_content": reason}, tool_calls=call)
    plain = AIMessage("", tool_calls=call)
    assert estimate_message_tokens([thinking]) == estimate_message_tokens([plain])
    opening = [HumanMessage("Why does the tokenizer drop the last token?"), thinking]
    opening += [ToolMessage("tokenizer.py: 400 lines " * 20, tool_call_id="call_1"), AIMessage("Found it.")]
    assert "ROOTCAUSE" in _shown_to_the_summarizer(opening)


def _shown_to_the_summarizer(opening: list[BaseMessage]) -> str:
    """What the summarizer is shown of ``opening``, compacted away by the turns after it."""
    history = list(opening)
    for i in range(12):
        history += [HumanMessage(f"next step {i} " * 40), AIMessage(f"done step {i} " * 40)]
    prompts: list[str] = []

    def summarize(prompt: str) -> str:
        prompts.append(prompt)
        return "## Goal\n- continue"

    result, _ = compact(summarize, history, CompactionOptions(context_window=3_000, keep_recent_tokens=400))
    assert result is not None
    return "\n".join(prompts)


@pytest.mark.parametrize(
    "block",
    [
        {
            "type": "text",
            "text": "Python 3.14 came out in October 2025.",
            "annotations": [{"type": "citation", "url": "https://docs.example.org/v1", "title": "What's new"}],
        },
        {
            "type": "output_text",
            "text": "Python 3.14 came out in October 2025.",
            "annotations": [
                {"type": "url_citation", "url": "https://docs.example.org/oai", "title": "What's new", "start_index": 0}
            ],
        },
        {
            "type": "text",
            "text": "Python 3.14 came out in October 2025.",
            "citations": [
                {
                    "type": "web_search_result_location",
                    "url": "https://docs.example.org/ant",
                    "title": "What's new",
                    "cited_text": "came out",
                    "encrypted_index": "x",
                }
            ],
        },
    ],
    ids=["langchain citation", "openai url_citation", "anthropic citations"],
)
def test_the_sources_a_text_block_cites_are_shown_to_the_summarizer(block: dict[str, Any]) -> None:
    # Only the text reached the summarizer: after compaction the agent could not say where a fact came from.
    shown = _shown_to_the_summarizer([HumanMessage("When did Python 3.14 come out? Cite sources."), AIMessage([block])])
    assert "October 2025" in shown
    assert f"What's new <{block.get('annotations', block.get('citations'))[0]['url']}>" in shown


def test_tool_schemas_are_priced_alike_in_every_form_bind_tools_takes() -> None:
    # A plain function and a Pydantic class were priced by their repr (19 and
    # 16 tokens for a schema of 176), not converted as bind_tools converts them.
    from langchain_core.tools import tool
    from langchain_core.utils.function_calling import convert_to_openai_tool
    from pydantic import BaseModel, Field

    from langchain_compaction.tokens import estimate_tool_tokens

    def search(query: str, limit: int = 10) -> str:
        """Search the company's document store for passages matching a query, ranked by relevance."""
        return query * limit

    class Search(BaseModel):
        """Search the company's document store for passages matching a query, ranked by relevance."""

        query: str = Field(description="what to look for")
        limit: int = 10

    as_dict = estimate_tool_tokens([convert_to_openai_tool(search)])
    assert estimate_tool_tokens([search]) == estimate_tool_tokens([tool(search)]) == as_dict
    assert estimate_tool_tokens([Search]) == estimate_tool_tokens([convert_to_openai_tool(Search)]) > as_dict // 2


def test_counts_sum_any_range_after_reads_that_branch_from_one_another() -> None:
    """Running sums carried from read to read stay right when two reads grow the same earlier one differently."""
    rng = random.Random(7)
    reads = [Counts.grown((), 0, [rng.randrange(1, 50) for _ in range(5)])]
    for _ in range(300):
        previous = rng.choice(reads[-4:])  # (mostly the newest, which grows in place; an older one is copied)
        same = rng.choice([len(previous), rng.randrange(len(previous) + 1)])
        reads.append(Counts.grown(previous, same, [rng.randrange(0, 50) for _ in range(rng.randrange(4))]))
        assert reads[-1][:same] == previous[:same]
    for counts in reads:
        values = list(counts)
        for start, end in [(0, None), (0, len(values)), *((rng.randrange(len(values) + 1), None) for _ in range(3))]:
            assert counts.span(start, end) == sum(values[start:end])
        cut = rng.randrange(len(values) + 1)
        assert counts.span(0, cut) + counts.span(cut) == sum(values)
    assert Counts([3, 4]).span(1) == 4  # (made directly: summed as it comes)


def test_the_context_size_is_the_same_from_running_sums_and_from_a_list() -> None:
    """``context_tokens`` gives one answer for a ``Counts`` and for the same counts as a plain list."""
    reply = AIMessage("done", usage_metadata={"input_tokens": 900, "output_tokens": 20, "total_tokens": 920})
    histories = [
        [SystemMessage("rules"), HumanMessage("a" * 400), AIMessage("b" * 800), HumanMessage("c" * 40)],
        [SystemMessage("rules"), HumanMessage("a" * 400), reply, HumanMessage("c" * 40)],
        [
            HumanMessage("a" * 4_000),
            reply.model_copy(update={"usage_metadata": {**reply.usage_metadata, "input_tokens": 5}}),
        ],
    ]
    for messages in histories:
        core = to_core_list(messages)
        plain = [estimate_message(m) for m in core]
        counts = Counts.grown(Counts.grown((), 0, plain[:1]), 1, plain[1:])
        assert context_tokens(core, counts, 7) == context_tokens(core, plain, 7)
