"""Conversation files: every accepted format reads, round-trips, and bad files fail cleanly."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage, messages_to_dict

from langchain_compaction.formats import ConversationFileError, dump_conversation, parse_conversation
from tests.conftest import TRANSCRIPT_NAMES, transcript_path

OPENAI = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "list files"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "ls", "arguments": '{"dir": "."}'}}],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "a.py\nb.py"},
    {"role": "assistant", "content": "two files"},
]

ANTHROPIC = {
    "system": "be brief",
    "messages": [
        {"role": "user", "content": "list files"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "ls", "input": {"dir": "."}}]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "a.py", "is_error": True}],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "one file"}]},
    ],
}


@pytest.mark.parametrize("name", TRANSCRIPT_NAMES)
def test_reads_the_shared_transcripts_as_langchain(name):
    data = transcript_path(name).read_bytes()
    conversation = parse_conversation(data)
    assert conversation.format == "langchain"
    assert len(conversation.messages) == len(json.loads(data))
    again = parse_conversation(dump_conversation(conversation.messages, "langchain"))
    assert messages_to_dict(again.messages) == messages_to_dict(conversation.messages)


def test_reads_openai_style():
    conversation = parse_conversation(json.dumps(OPENAI))
    assert conversation.format == "openai"
    types = [type(m) for m in conversation.messages]
    assert types == [SystemMessage, HumanMessage, AIMessage, ToolMessage, AIMessage]
    call = conversation.messages[2].tool_calls[0]
    assert (call["name"], call["args"], call["id"]) == ("ls", {"dir": "."}, "c1")
    back = json.loads(dump_conversation(conversation.messages, "openai"))
    assert back[2]["tool_calls"][0]["function"]["name"] == "ls"
    assert back[3] == {"role": "tool", "tool_call_id": "c1", "content": "a.py\nb.py"}


def test_reads_anthropic_style_with_top_level_system():
    conversation = parse_conversation(json.dumps(ANTHROPIC))
    assert conversation.format == "anthropic"
    system, user, call, result, answer = conversation.messages
    assert isinstance(system, SystemMessage)
    assert call.tool_calls[0]["id"] == "t1"
    assert isinstance(result, ToolMessage)
    assert result.status == "error"
    back = json.loads(dump_conversation(conversation.messages, "anthropic"))
    assert back["system"] == [{"type": "text", "text": "be brief"}]
    assert back["messages"][2]["content"][0]["type"] == "tool_result"
    assert back["messages"][1]["content"] == [{"type": "tool_use", "id": "t1", "name": "ls", "input": {"dir": "."}}]
    again = parse_conversation(json.dumps(back))
    assert [m.type for m in again.messages] == [m.type for m in conversation.messages]


@pytest.mark.parametrize(
    "block",
    [
        {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "release notes"}},
        {"type": "web_search_tool_result", "tool_use_id": "srvtoolu_1", "content": []},
        {"type": "mcp_tool_use", "id": "mcptoolu_1", "name": "lookup", "server_name": "docs", "input": {}},
    ],
)
def test_a_transcript_whose_only_anthropic_blocks_are_server_tools_is_read_as_anthropic(block: dict[str, Any]) -> None:
    # Read as OpenAI-style, its summary was written back as a {"role": "system"} message, which Anthropic refuses.
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "what is new in the release?"}]},
        {"role": "assistant", "content": [block, {"type": "text", "text": "It adds a faster cache."}]},
    ]
    assert parse_conversation(json.dumps(messages)).format == "anthropic"


def test_reads_json_lines_and_writes_them_back():
    text = "".join(json.dumps(item) + "\n" for item in OPENAI)
    conversation = parse_conversation(text)
    assert conversation.jsonl
    assert len(conversation.messages) == 5
    out = dump_conversation(conversation.messages, conversation.format, jsonl=True)
    assert len(out.strip().splitlines()) == 5


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        (b"", "empty"),
        (b"\xff\xfe\x00", "UTF-8"),
        (b"{bad", "invalid JSON at line 1"),
        (b'{"a": 1}', "expected a JSON list"),
        (b"[]", "no messages"),
        (b"[1, 2]", "message 1: expected a message object"),
        (b'[{"content": "x"}]', 'needs "role"'),
        (b'[{"role": "wizard", "content": "x"}]', "unknown role 'wizard'"),
        (b'[{"role": "tool", "content": "x"}]', "tool_call_id"),
        (b'[{"role": "user", "content": 5}]', '"content" must be'),
        (b'{"role": "user", "content": "a"}\n{"role": "user", "content": ', "line 2"),
        (b'[{"type": "human", "data": {"content": 3}}]', "not a valid LangChain message"),
    ],
)
def test_bad_files_give_one_clear_error(data, needle):
    with pytest.raises(ConversationFileError) as info:
        parse_conversation(data, name="conv.json")
    assert needle in str(info.value)
    assert "\n" not in str(info.value).strip()


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(st.binary(max_size=300))
def test_any_bytes_give_a_clean_error_or_a_conversation(data):
    try:
        conversation = parse_conversation(data)
    except ConversationFileError:
        return
    assert conversation.messages


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "role",
                    "content",
                    "type",
                    "data",
                    "tool_calls",
                    "tool_call_id",
                    "system",
                    "messages",
                    "function",
                    "name",
                ]
            ),
            inner,
            max_size=4,
        )
    ),
    max_leaves=12,
)


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow], deadline=None)
@given(json_values)
@example({"content": [{"role": None, "type": []}], "role": None})  # (a block "type" that is a list: found once)
def test_any_json_gives_a_clean_error_or_a_conversation(value):
    try:
        parse_conversation(json.dumps(value))
    except ConversationFileError:
        pass


def test_a_summary_in_an_anthropic_files_system_is_updated_by_the_next_compaction_not_kept_beside_it() -> None:
    """compact writes the summary as a system block of its own; read back, it is a summary again, not the prompt."""
    from langchain_compaction import ExtractiveSummarizer, compact
    from langchain_compaction._lc.convert import is_summary_message

    def turns(start: int) -> list[dict[str, Any]]:
        return [
            item
            for i in range(start, start + 30)
            for item in (
                {"role": "user", "content": f"question {i} about src/app{i}.py " * 20},
                {"role": "assistant", "content": f"answer {i} " * 40},
            )
        ]

    document: dict[str, Any] = {"system": "You are a careful coding agent.", "messages": turns(0)}
    for round_ in range(3):
        conversation = parse_conversation(json.dumps(document))
        _, compacted = compact(ExtractiveSummarizer(), conversation.messages)
        document = json.loads(dump_conversation(compacted, "anthropic", read=conversation))
        blocks = document["system"]
        assert [b["text"].startswith("You are a careful") for b in blocks] == [True, False]
        read = parse_conversation(json.dumps(document)).messages
        assert [is_summary_message(m) for m in read[:2]] == [False, True], round_
        document["messages"] += turns(100 * (round_ + 1))


def test_a_one_message_json_lines_file_and_a_byte_order_mark_are_read() -> None:
    """JSON Lines of one message is a JSON object; Windows editors start UTF-8 files with a byte-order mark."""
    one = parse_conversation(b'{"role": "user", "content": "deploy src/app.py"}\n')
    assert one.jsonl
    assert [m.content for m in one.messages] == ["deploy src/app.py"]
    assert dump_conversation(one.messages, one.format, jsonl=True, read=one).count("\n") == 1
    marked = parse_conversation(b'\xef\xbb\xbf[{"role": "user", "content": "deploy src/app.py"}]')
    assert [m.content for m in marked.messages] == ["deploy src/app.py"]
    with pytest.raises(ConversationFileError, match="found dict"):
        parse_conversation(b'{"conversation": []}')


def test_what_openai_messages_say_outside_content_is_read() -> None:
    """Responses API parts (input_text, output_text), a refusal and a voice answer's transcript are text to summarize."""
    from langchain_compaction._lc.convert import to_core

    items = [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Fix JIRA-4471 in refund.py"}]},
        {"role": "assistant", "content": None, "refusal": "I can't help with that."},
        {"role": "assistant", "content": None, "audio": {"id": "a1", "transcript": "Use port 8443."}},
    ]
    messages = parse_conversation(json.dumps(items)).messages
    assert [to_core(m).text for m in messages] == [
        "Fix JIRA-4471 in refund.py",
        "I can't help with that.",
        "Use port 8443.",
    ]


@pytest.mark.parametrize("jsonl", [True, False])
def test_a_summary_written_to_a_file_whose_system_prompt_is_a_line_stays_a_line_after_it(jsonl: bool) -> None:
    """JSON Lines (or a list with a "system" item): the summary is its own line, after the prompt, read back as one."""
    from langchain_compaction import ExtractiveSummarizer, compact
    from langchain_compaction._lc.convert import is_summary_message

    call = {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {"command": "ls"}}
    lines: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a billing agent."},
        {"role": "user", "content": "Migrate src/billing/invoice.py. Never touch legacy/ledger.c."},
        {"role": "assistant", "content": [call]},  # (Anthropic's blocks: the file is Anthropic-style)
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "src legacy"}]},
    ]
    for round_ in range(3):
        lines += [
            item
            for i in range(round_ * 10, round_ * 10 + 10)
            for item in (
                {"role": "user", "content": f"Round {i}: update src/tax_{i}.py " + "details " * 60},
                {"role": "assistant", "content": [{"type": "text", "text": f"Updated src/tax_{i}.py. " + "ok " * 80}]},
            )
        ]
        text = "".join(json.dumps(x) + "\n" for x in lines) if jsonl else json.dumps(lines)
        conversation = parse_conversation(text)
        _, compacted = compact(ExtractiveSummarizer(), conversation.messages)
        written = dump_conversation(compacted, conversation.format, jsonl=jsonl, read=conversation)
        lines = [json.loads(line) for line in written.splitlines()] if jsonl else json.loads(written)
        assert lines[0] == {"role": "system", "content": "You are a billing agent."}
        read = parse_conversation(written).messages
        assert [is_summary_message(m) for m in read].count(True) == 1
        assert is_summary_message(read[1])


def test_a_file_holding_a_whole_request_is_written_back_whole() -> None:
    """A logged request (model, tools, temperature, ...) keeps its fields; only its messages are compacted."""
    from langchain_compaction import ExtractiveSummarizer, compact

    messages = [{"role": "user", "content": "Fix src/a.py " * 50}, {"role": "assistant", "content": "ok " * 50}] * 5
    body = {"model": "gpt-4o", "temperature": 0.2, "tools": [{"type": "function"}], "messages": messages}
    conversation = parse_conversation(json.dumps(body))
    _, compacted = compact(ExtractiveSummarizer(), conversation.messages)
    written = json.loads(dump_conversation(compacted, conversation.format, read=conversation))
    assert {k: written[k] for k in ("model", "temperature", "tools")} == {
        k: body[k] for k in ("model", "temperature", "tools")
    }
    assert len(written["messages"]) < len(messages)


def test_a_file_holding_only_its_messages_in_an_object_is_written_back_as_that_object() -> None:
    """``{"messages": [...]}`` stays an object: a script reading ``out["messages"]`` reads it either way."""
    from langchain_compaction import ExtractiveSummarizer, compact

    messages = [{"role": "user", "content": "Fix src/a.py " * 50}, {"role": "assistant", "content": "ok " * 50}] * 5
    for body in ({"messages": messages}, messages):
        conversation = parse_conversation(json.dumps(body))
        _, compacted = compact(ExtractiveSummarizer(), conversation.messages)
        written = json.loads(dump_conversation(compacted, conversation.format, read=conversation))
        assert isinstance(written, type(body))
        assert 0 < len(written["messages"] if isinstance(written, dict) else written) < len(messages)


def test_an_openai_file_whose_replies_keep_claude_s_thinking_is_read_as_openai() -> None:
    # convert_to_openai_messages of a ChatAnthropic history with extended thinking: the thinking blocks
    # made it Anthropic's, its tool_calls were dropped and each "tool" message became the assistant's.
    from langchain_core.messages import convert_to_openai_messages

    messages: list[Any] = [HumanMessage("The suite fails; fix it.")]
    for i in range(3):
        thinking = [
            {"type": "thinking", "thinking": f"look at file {i}", "signature": "c2ln"},
            {"type": "text", "text": "."},
        ]
        call = {"name": "read_file", "args": {"path": f"m{i}.py"}, "id": f"toolu_{i}", "type": "tool_call"}
        messages += [
            AIMessage(thinking, tool_calls=[call]),
            ToolMessage(f"def f{i}(): pass", tool_call_id=f"toolu_{i}"),
        ]
    read = parse_conversation(json.dumps(convert_to_openai_messages(messages)))
    assert read.format == "openai"
    assert [type(m) for m in read.messages] == [type(m) for m in messages]
    assert sum(len(m.tool_calls) for m in read.messages if isinstance(m, AIMessage)) == 3


def test_anthropic_files_keep_a_server_compaction_block_an_empty_turn_and_no_empty_system() -> None:
    compaction = {"type": "compaction", "content": "earlier turns, summarized by the API"}
    request = {
        "model": "claude-sonnet-4-5",
        "system": "",
        "messages": [
            {"role": "user", "content": "Go on."},
            {"role": "assistant", "content": [compaction, {"type": "text", "text": "Going on."}]},
            {"role": "user", "content": []},
            {"role": "assistant", "content": "Still here."},
        ],
    }
    read = parse_conversation(json.dumps(request))
    assert read.format == "anthropic"  # (the compaction block alone says so: it was read as OpenAI's)
    assert len([m for m in read.messages if not isinstance(m, SystemMessage)]) == 4  # (the empty turn was dropped)
    written = json.loads(dump_conversation(read.messages, "anthropic"))
    system = written.get("system", []) if isinstance(written, dict) else []
    assert all(block.get("text") for block in system)  # ("" became an empty text block, which the API refuses)


TEXT_ONLY = [{"role": "user", "content": "hello"}, {"role": "assistant", "content": [{"type": "text", "text": "hi"}]}]


@pytest.mark.parametrize(
    ("fields", "shape"),
    [
        ({"tools": [{"name": "ls", "input_schema": {"type": "object"}}]}, "anthropic"),  # Anthropic's tool
        ({"anthropic_version": "bedrock-2023-05-31"}, "anthropic"),  # Bedrock's and Vertex AI's body
        ({"tools": [{"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}]}, "openai"),
        ({"max_tokens": 1024}, "openai"),  # (either API takes it: no sign of one or the other)
    ],
)
def test_a_text_only_request_without_system_is_read_by_what_its_fields_say(fields: dict[str, Any], shape: str) -> None:
    """Text alone reads the same in both formats: an Anthropic request's own fields (its tools) tell it apart.

    Read as OpenAI's, its compaction's summary went into "messages" as a "system" message, which the
    Messages API refuses; read as Anthropic's, it goes to the top-level "system".
    """
    read = parse_conversation(json.dumps({"model": "m", **fields, "messages": TEXT_ONLY}))
    assert read.format == shape
    written = json.loads(dump_conversation([SystemMessage("the summary"), *read.messages], read.format, read=read))
    if shape == "anthropic":
        assert written["system"] == [{"type": "text", "text": "the summary"}]
        assert [m["role"] for m in written["messages"]] == ["user", "assistant"]
    else:
        assert written["messages"][0] == {"role": "system", "content": "the summary"}
