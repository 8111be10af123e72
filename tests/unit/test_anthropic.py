"""The Anthropic integration, offline: the real SDK over a mock HTTP transport.

Every test builds a real ``anthropic.Anthropic`` client whose ``httpx2``
transport is a ``MockTransport``; the handler plays the API (a deterministic
fake tokenizer for ``count_tokens``, canned replies for ``messages``) and
records each request so the tests can assert the exact bodies sent.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import anthropic
import httpx2
import pytest
from langchain_anthropic import ChatAnthropic
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.tools import tool

from langchain_compaction import CompactionOptions, acompact, compact
from langchain_compaction.anthropic import AnthropicSummarizer, AnthropicTokenCounter, wire
from langchain_compaction.core.engine import Summarizer
from langchain_compaction.core.types import SummaryReply, SummaryRequest, Usage
from langchain_compaction.errors import CompactionError, ConfigurationError, SummarizationError
from langchain_compaction.summarizers.chat_model import as_summarizer
from langchain_compaction.tokens import estimate_message_tokens
from tests.conftest import load_transcript

MODEL = "claude-haiku-4-5"


def fake_tokens(body: dict[str, Any]) -> int:
    """A deterministic stand-in for Claude's tokenizer: JSON length / 4 plus framing."""
    total = 2
    if "system" in body:
        total += 1 + len(json.dumps(body["system"])) // 4
    if "tools" in body:
        total += len(json.dumps(body["tools"], sort_keys=True)) // 4
    for message in body["messages"]:
        total += 3 + len(json.dumps(message["content"], sort_keys=True)) // 4
    return total


class FakeAPI:
    """Plays the Messages API; records (path, body, headers) of every request."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, dict[str, Any], httpx2.Headers]] = []
        self.replies: list[httpx2.Response | Exception] = []
        self.reply_text: list[dict[str, Any]] = [{"type": "text", "text": "## Goal\n- keep going"}]
        self.stop_reason = "end_turn"
        self.usage: dict[str, Any] = {
            "input_tokens": 120,
            "output_tokens": 30,
            "cache_read_input_tokens": 7,
            "cache_creation_input_tokens": 5,
        }
        self.count_status: int | None = None

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        body = json.loads(request.content)
        self.requests.append((request.url.path, body, request.headers))
        if self.replies:
            reply = self.replies.pop(0)
            if isinstance(reply, Exception):
                raise reply
            return reply
        if request.url.path == "/v1/messages/count_tokens":
            return httpx2.Response(200, json={"input_tokens": fake_tokens(body)})
        return httpx2.Response(
            200,
            headers={"request-id": "req_123"},
            json={
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "model": body["model"],
                "content": self.reply_text,
                "stop_reason": self.stop_reason,
                "usage": self.usage,
            },
        )

    def paths(self) -> list[str]:
        return [path for path, _body, _headers in self.requests]

    def bodies(self) -> list[dict[str, Any]]:
        return [body for _path, body, _headers in self.requests]


def error(status: int, kind: str, message: str) -> httpx2.Response:
    # retry-after-ms keeps the SDK's backoff at a millisecond in tests.
    return httpx2.Response(
        status,
        headers={"retry-after-ms": "1", "request-id": "req_err"},
        json={"type": "error", "error": {"type": kind, "message": message}},
    )


@pytest.fixture
def api() -> FakeAPI:
    return FakeAPI()


def make_client(api: FakeAPI, **options: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(
        api_key="test", http_client=httpx2.Client(transport=httpx2.MockTransport(api)), **options
    )


def make_async_client(api: FakeAPI, **options: Any) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(
        api_key="test", http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(api)), **options
    )


def conversation() -> list[BaseMessage]:
    return [
        SystemMessage("You are a careful coding agent."),
        HumanMessage("Fix the failing test in parser.py"),
        AIMessage(
            "Let me look.",
            tool_calls=[{"id": "toolu_1", "name": "read_file", "args": {"path": "parser.py"}}],
        ),
        ToolMessage("def parse(x):\n    return int(x)\n", tool_call_id="toolu_1", name="read_file"),
        AIMessage("The parser casts without a check; I will add one."),
        HumanMessage("Go ahead."),
        AIMessage("", tool_calls=[{"id": "toolu_2", "name": "run", "args": {"cmd": "pytest -q"}}]),
        ToolMessage("1 passed", tool_call_id="toolu_2", name="run"),
        AIMessage("All green."),
        HumanMessage("Thanks, now the docs."),
    ]


# --- AnthropicTokenCounter: request bodies ----------------------------------------------


def test_total_sends_system_tools_and_messages_exactly(api: FakeAPI) -> None:
    tools = [{"name": "run", "description": "Run a command", "input_schema": {"type": "object", "properties": {}}}]
    counter = AnthropicTokenCounter(make_client(api), model=MODEL, system="Be brief.", tools=tools)
    messages = [HumanMessage("hello"), AIMessage("hi there"), HumanMessage("how are you")]

    total = counter.total(messages)

    assert api.paths() == ["/v1/messages/count_tokens", "/v1/messages/count_tokens"]
    overhead_body, whole_body = api.bodies()
    assert overhead_body == {
        "model": MODEL,
        "system": "Be brief.",
        "tools": tools,
        "messages": [{"role": "user", "content": "."}],
    }
    assert whole_body == {
        "model": MODEL,
        "system": "Be brief.",
        "tools": tools,
        "messages": [
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": "hi there"},
            {"role": "user", "content": "how are you"},
        ],
    }
    # The total is exactly what the API said for the whole request.
    assert total == fake_tokens(whole_body)
    assert counter.overhead_tokens == fake_tokens(overhead_body)


def test_leading_system_messages_go_into_the_system_parameter(api: FakeAPI) -> None:
    counter = AnthropicTokenCounter(make_client(api), model=MODEL, system="Agent prompt.")
    counter.count_each([SystemMessage("Project rules."), HumanMessage("hi")])
    whole = api.bodies()[-1]
    assert whole["system"] == [{"type": "text", "text": "Agent prompt."}, {"type": "text", "text": "Project rules."}]
    assert whole["messages"] == [{"role": "user", "content": "hi"}]


def test_langchain_tools_are_converted_to_the_api_format(api: FakeAPI) -> None:
    @tool
    def grep(pattern: str) -> str:
        """Search the repository for a pattern."""
        return pattern

    counter = AnthropicTokenCounter(make_client(api), model=MODEL, tools=[grep])
    _ = counter.overhead_tokens
    sent = api.bodies()[0]["tools"]
    assert sent[0]["name"] == "grep"
    assert sent[0]["description"] == "Search the repository for a pattern."
    assert sent[0]["input_schema"]["properties"]["pattern"]["type"] == "string"


def test_a_lone_tool_result_is_counted_after_a_stub_call(api: FakeAPI) -> None:
    counter = AnthropicTokenCounter(make_client(api), model=MODEL)
    result = ToolMessage("1 passed", tool_call_id="toolu_9", name="run")

    value = counter([result])

    overhead_body, body = api.bodies()
    assert body["messages"] == [
        {"role": "user", "content": "."},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_9", "name": "run", "input": {}}]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "content": "1 passed", "tool_use_id": "toolu_9", "is_error": False}],
        },
    ]
    # The count is the request less the fixed overhead: the result and its stub call.
    assert value == fake_tokens(body) - fake_tokens(overhead_body)
    assert value > 0


def test_a_lone_tool_call_is_answered_so_the_request_does_not_end_in_a_prefill(api: FakeAPI) -> None:
    counter = AnthropicTokenCounter(make_client(api), model=MODEL)
    call = AIMessage("checking", tool_calls=[{"id": "toolu_3", "name": "run", "args": {"cmd": "ls"}}])
    counter([call])
    body = api.bodies()[-1]
    assert body["messages"] == [
        {"role": "user", "content": "."},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "checking"},
                {"type": "tool_use", "name": "run", "input": {"cmd": "ls"}, "id": "toolu_3"},
            ],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_3", "content": ""}]},
    ]


def test_a_lone_system_message_is_counted_as_system_text(api: FakeAPI) -> None:
    counter = AnthropicTokenCounter(make_client(api), model=MODEL)
    value = counter([SystemMessage("Rules: be exact.")])
    overhead_body, body = api.bodies()
    assert body == {"model": MODEL, "system": "Rules: be exact.", "messages": [{"role": "user", "content": "."}]}
    assert value == fake_tokens(body) - fake_tokens(overhead_body)


def test_built_in_converter_handles_images_thinking_tool_use_and_results(api: FakeAPI) -> None:
    counter = AnthropicTokenCounter(make_client(api), model=MODEL)
    image = HumanMessage(
        [
            {"type": "text", "text": "what is this?"},
            {"type": "image", "base64": "iVBORw0KGgo=", "mime_type": "image/png"},
            {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}},
        ]
    )
    thinking = AIMessage(
        [
            {"type": "thinking", "thinking": "hm", "signature": "sig"},
            {"type": "thinking", "thinking": "unsigned, dropped"},
            {"type": "reasoning", "reasoning": "another provider's, dropped"},
            {"type": "text", "text": "A cat."},
            {"type": "tool_use", "id": "toolu_5", "name": "zoom", "input": {"x": 1}},
        ],
        tool_calls=[{"id": "toolu_5", "name": "zoom", "args": {"x": 1}}],
    )
    failed = ToolMessage([{"type": "text", "text": "boom"}], tool_call_id="toolu_5", status="error")

    counter.count_each([image, thinking, failed])

    assert api.bodies()[-1]["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is this?"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
                {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "hm", "signature": "sig"},
                {"type": "text", "text": "A cat."},
                {"type": "tool_use", "id": "toolu_5", "name": "zoom", "input": {"x": 1}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_5",
                    "content": [{"type": "text", "text": "boom"}],
                    "is_error": True,
                }
            ],
        },
    ]


def test_a_conversation_ending_on_an_assistant_turn_gets_a_placeholder_user_turn(api: FakeAPI) -> None:
    counter = AnthropicTokenCounter(make_client(api), model=MODEL)
    counter.count_each([HumanMessage("hi"), AIMessage("hello ")])
    assert api.bodies()[-1]["messages"][-1] == {"role": "user", "content": "."}


# --- AnthropicTokenCounter: what counts mean and the caches -----------------------------


def test_count_each_sums_to_the_exact_request_less_overhead(api: FakeAPI) -> None:
    counter = AnthropicTokenCounter(make_client(api), model=MODEL)
    messages = conversation()
    counts = counter.count_each(messages)
    whole = api.bodies()[-1]
    assert len(counts) == len(messages)
    assert all(c >= 0 for c in counts)
    assert sum(counts) + counter.overhead_tokens == fake_tokens(whole)
    assert counter.total(messages) == fake_tokens(whole)


def test_prefix_cache_counts_a_grown_conversation_with_one_request(api: FakeAPI) -> None:
    counter = AnthropicTokenCounter(make_client(api), model=MODEL)
    messages = conversation()

    first = counter.count_each(messages[:6])
    assert counter.requests == 2  # the overhead, then the list

    again = counter.count_each(messages[:6])
    assert again == first
    assert counter.requests == 2  # nothing new: nothing sent

    grown = counter.count_each(messages)
    assert counter.requests == 3  # one request for the grown list
    # The prefix keeps its counts; only the new messages share the growth.
    assert grown[:6] == first
    assert sum(grown) + counter.overhead_tokens == fake_tokens(api.bodies()[-1])


def test_per_message_counts_are_cached_by_fingerprint(api: FakeAPI) -> None:
    counter = AnthropicTokenCounter(make_client(api), model=MODEL)
    messages = conversation()
    first = [counter([m]) for m in messages]
    sent = counter.requests
    assert sent == len(messages) + 1  # one per message and the overhead

    # A growing conversation: the old messages (fresh, equal objects) cost nothing.
    fresh = [*conversation(), AIMessage("Docs updated.")]
    second = [counter([m]) for m in fresh]
    assert second[: len(first)] == first
    assert counter.requests == sent + 1


def test_per_message_counts_err_high_never_low_against_the_whole_request(api: FakeAPI) -> None:
    counter = AnthropicTokenCounter(make_client(api), model=MODEL)
    messages = conversation()
    each = [counter([m]) for m in messages]
    exact = sum(counter.count_each(messages))
    # Lone messages carry their stub partners: the sum is at or above the
    # exact figure, by less than 20 tokens per message here.
    assert exact <= sum(each) < exact + 20 * len(messages)


def test_counter_works_as_the_token_counter_of_compact(api: FakeAPI) -> None:
    counter = AnthropicTokenCounter(make_client(api), model=MODEL)
    messages = conversation()
    options = CompactionOptions(token_counter=counter, keep_recent_tokens=40)
    result, out = compact(lambda prompt: "## Goal\n- docs next", messages, options)
    assert result is not None
    # compact() asks for the whole conversation at once (count_each): the
    # counts add up to the exact request size less the fixed overhead.
    assert result.original_tokens == sum(counter.count_each(messages))
    assert result.original_tokens + counter.overhead_tokens == fake_tokens(api.bodies()[1])
    assert out[-1] is messages[-1]
    assert all(path == "/v1/messages/count_tokens" for path in api.paths())
    assert len(api.paths()) <= 4  # overhead, the conversation, the summary message: not one per message


def test_counts_on_a_real_transcript_add_up(api: FakeAPI) -> None:
    counter = AnthropicTokenCounter(make_client(api), model=MODEL)
    messages = load_transcript("claudecode-fe5e1c67-subagent-mainpage")
    counts = counter.count_each(messages)
    assert counter.requests == 2
    assert sum(counts) + counter.overhead_tokens == fake_tokens(api.bodies()[-1])
    assert all(c > 0 for c in counts)


def rule_violations(messages: list[dict[str, Any]]) -> list[str]:
    """What the Messages API would refuse in a request's messages."""
    problems: list[str] = []
    if not messages or messages[0]["role"] != "user" or messages[-1]["role"] != "user":
        problems.append("the request must start and end with a user turn")
    for index, message in enumerate(messages):
        content = message["content"]
        blocks = content if isinstance(content, list) else [{"type": "text", "text": content}]
        if not blocks:
            problems.append(f"messages[{index}] is empty")
        if index and messages[index - 1]["role"] == message["role"]:
            problems.append(f"messages[{index}] repeats the role {message['role']}")
        if any(b.get("type") == "thinking" and not b.get("signature") for b in blocks):
            problems.append(f"messages[{index}] has unsigned thinking")
        kinds = [b.get("type") for b in blocks]
        results = [b["tool_use_id"] for b in blocks if b.get("type") == "tool_result"]
        if results and kinds[: len(results)] != ["tool_result"] * len(results):
            problems.append(f"messages[{index}] has tool results after other content")
        previous = messages[index - 1] if index else None
        calls = []
        if previous and isinstance(previous["content"], list):
            calls = [b["id"] for b in previous["content"] if b.get("type") == "tool_use"]
        if message["role"] == "user":
            if sorted(set(calls)) != sorted(set(calls) & set(results)):
                problems.append(f"messages[{index}] leaves calls {sorted(set(calls) - set(results))} unanswered")
            if set(results) - set(calls):
                problems.append(f"messages[{index}] answers unknown calls {sorted(set(results) - set(calls))}")
    return problems


def test_whole_requests_for_real_transcripts_follow_the_api_rules(api: FakeAPI, transcript: list[BaseMessage]) -> None:
    counter = AnthropicTokenCounter(make_client(api), model=MODEL)
    counts = counter.count_each(transcript)
    assert len(counts) == len(transcript)
    assert rule_violations(api.bodies()[-1]["messages"]) == []


def test_lone_message_requests_for_real_transcripts_follow_the_api_rules(
    api: FakeAPI, transcript: list[BaseMessage]
) -> None:
    counter = AnthropicTokenCounter(make_client(api), model=MODEL)
    for message in transcript:
        counter([message])
    for body in api.bodies():
        assert rule_violations(body["messages"]) == [], body


def test_a_user_turn_between_a_call_and_its_result_is_padded(api: FakeAPI) -> None:
    counter = AnthropicTokenCounter(make_client(api), model=MODEL)
    messages = [
        HumanMessage("go"),
        AIMessage("", tool_calls=[{"id": "toolu_1", "name": "run", "args": {}}]),
        HumanMessage("that call was malformed"),  # real traffic: OpenHands does this
        AIMessage("retrying"),
    ]
    counter.count_each(messages)
    sent = api.bodies()[-1]["messages"]
    assert rule_violations(sent) == []
    assert sent[2]["content"][0] == {"type": "tool_result", "tool_use_id": "toolu_1", "content": ""}


# --- AnthropicTokenCounter: failures ---------------------------------------------------


def test_network_failure_falls_back_to_the_estimate_with_a_warning(
    api: FakeAPI, caplog: pytest.LogCaptureFixture
) -> None:
    api.replies = [httpx2.ConnectError("connection refused")]
    counter = AnthropicTokenCounter(make_client(api, max_retries=0), model=MODEL, retry_after=60)
    message = HumanMessage("a" * 400)

    with caplog.at_level(logging.WARNING, logger="langchain_compaction"):
        value = counter([message])

    assert value == estimate_message_tokens([message]) == 104
    warnings = [r for r in caplog.records if r.name == "langchain_compaction" and r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "count_tokens failed" in warnings[0].getMessage()
    assert "APIConnectionError" in warnings[0].getMessage()
    # While the API is down no request is made and nothing more is logged.
    calls = len(api.requests)
    assert counter([HumanMessage("b" * 40)]) == estimate_message_tokens([HumanMessage("b" * 40)])
    assert len(api.requests) == calls
    assert counter.fallbacks == 2


def test_estimates_are_not_cached_and_counting_resumes(api: FakeAPI) -> None:
    api.replies = [httpx2.ConnectError("down")]
    counter = AnthropicTokenCounter(make_client(api, max_retries=0), model=MODEL, retry_after=0)
    message = HumanMessage("hello world")
    estimated = counter([message])
    exact = counter([message])  # the API is back: the count is real now
    assert estimated == estimate_message_tokens([message])
    overhead_body, body = api.bodies()[-2:]
    assert exact == fake_tokens(body) - fake_tokens(overhead_body)


def test_a_failure_after_a_cached_prefix_estimates_only_the_new_messages(api: FakeAPI) -> None:
    counter = AnthropicTokenCounter(make_client(api, max_retries=0), model=MODEL)
    messages = conversation()
    exact = counter.count_each(messages[:6])
    api.replies = [httpx2.ReadTimeout("slow")]
    mixed = counter.count_each(messages)
    assert mixed[:6] == exact
    assert mixed[6:] == [estimate_message_tokens([m]) for m in messages[6:]]


def test_server_errors_fall_back_after_the_sdk_retries(api: FakeAPI, caplog: pytest.LogCaptureFixture) -> None:
    api.replies = [error(529, "overloaded_error", "Overloaded")] * 2
    counter = AnthropicTokenCounter(make_client(api, max_retries=1), model=MODEL)
    with caplog.at_level(logging.WARNING, logger="langchain_compaction"):
        value = counter([HumanMessage("hello")])
    assert len(api.requests) == 2  # the first try and one retry
    assert value == estimate_message_tokens([HumanMessage("hello")]) > 0
    assert "529 Overloaded" in caplog.text


def test_a_bad_key_raises_a_configuration_error(api: FakeAPI) -> None:
    api.replies = [error(401, "authentication_error", "invalid x-api-key")]
    counter = AnthropicTokenCounter(make_client(api, max_retries=0), model=MODEL)
    with pytest.raises(ConfigurationError, match="invalid x-api-key") as caught:
        counter([HumanMessage("hi")])
    assert isinstance(caught.value.__cause__, anthropic.AuthenticationError)


def test_a_refused_whole_list_is_counted_message_by_message(api: FakeAPI) -> None:
    counter = AnthropicTokenCounter(make_client(api, max_retries=0), model=MODEL)
    _ = counter.overhead_tokens
    api.replies = [error(400, "invalid_request_error", "tool_use ids must be unique")]
    messages = conversation()[:4]
    counts = counter.count_each(messages)
    assert counts == [counter([m]) for m in messages]
    assert counter.fallbacks == 0  # every count is still exact, one message at a time


def test_counter_configuration_errors(api: FakeAPI, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigurationError, match="model=None"):
        AnthropicTokenCounter(make_client(api))
    with pytest.raises(ConfigurationError, match=r"pass anthropic\.Anthropic"):
        AnthropicTokenCounter(make_async_client(api), model=MODEL)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="cache_size"):
        AnthropicTokenCounter(make_client(api), model=MODEL, cache_size=0)
    with pytest.raises(ConfigurationError, match="client_or_model_name"):
        AnthropicTokenCounter(42, model=MODEL)  # type: ignore[arg-type]
    # A model name alone makes the client lazily, from the environment.
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    counter = AnthropicTokenCounter(MODEL)
    assert counter.model == MODEL
    with pytest.raises(ConfigurationError, match="ANTHROPIC_API_KEY"):
        counter([HumanMessage("hi")])


# --- AnthropicSummarizer ---------------------------------------------------------------


REQUEST = SummaryRequest(system="You summarize.", prompt="<transcript>...</transcript>\nSummarize.", messages=())


def test_summarizer_sends_the_exact_request(api: FakeAPI) -> None:
    summarizer = AnthropicSummarizer(
        MODEL,
        client=make_client(api),
        max_tokens=2048,
        temperature=0.0,
        extra_headers={"anthropic-beta": "some-beta"},
    )
    reply = summarizer.summarize(REQUEST)
    assert reply.text == "## Goal\n- keep going"
    assert not reply.covers_prefix
    ((path, body, headers),) = api.requests
    assert path == "/v1/messages"
    assert body == {
        "model": MODEL,
        "max_tokens": 2048,
        "system": "You summarize.",
        "messages": [{"role": "user", "content": "<transcript>...</transcript>\nSummarize."}],
        "temperature": 0.0,
    }
    assert headers["anthropic-beta"] == "some-beta"
    assert summarizer.name == f"anthropic:{MODEL}"
    assert isinstance(summarizer, Summarizer)
    assert as_summarizer(summarizer) is summarizer


def test_summarizer_joins_text_blocks_and_records_usage(api: FakeAPI) -> None:
    api.reply_text = [
        {"type": "thinking", "thinking": "let me think", "signature": "s"},
        {"type": "text", "text": "## Goal\n"},
        {"type": "text", "text": "- ship"},
    ]
    summarizer = AnthropicSummarizer(MODEL, client=make_client(api))
    reply = summarizer.summarize(REQUEST)
    assert isinstance(reply, SummaryReply)
    assert reply.text == "## Goal\n- ship"
    expected = Usage(
        input_tokens=120,
        output_tokens=30,
        cache_read_input_tokens=7,
        cache_creation_input_tokens=5,
        model=MODEL,
        stop_reason="end_turn",
        request_id="req_123",
    )
    assert reply.usage == expected
    assert summarizer.last_usage == expected
    assert expected.total_input_tokens == 132
    summarizer.summarize(REQUEST)
    assert len(summarizer.usage_log) == 2
    assert summarizer.total_usage().output_tokens == 60


def test_timeout_and_retries_reach_the_sdk(api: FakeAPI) -> None:
    api.replies = [error(529, "overloaded_error", "Overloaded"), error(529, "overloaded_error", "Overloaded")]
    summarizer = AnthropicSummarizer(MODEL, client=make_client(api), timeout=7.5, max_retries=2)
    assert summarizer.summarize(REQUEST).text == "## Goal\n- keep going"
    assert len(api.requests) == 3  # two overloaded answers retried, the third succeeds
    assert [h["x-stainless-retry-count"] for _p, _b, h in api.requests] == ["0", "1", "2"]
    assert all(h["x-stainless-read-timeout"] == "7.5" for _p, _b, h in api.requests)


def test_overloaded_after_retries_is_a_summarization_error(api: FakeAPI) -> None:
    api.replies = [error(529, "overloaded_error", "Overloaded")] * 3
    summarizer = AnthropicSummarizer(MODEL, client=make_client(api), max_retries=2)
    with pytest.raises(SummarizationError) as caught:
        summarizer.summarize(REQUEST)
    assert len(api.requests) == 3
    message = str(caught.value)
    assert "529" in message
    assert "overloaded_error: Overloaded" in message
    assert "req_err" in message
    assert "max_retries" in message
    assert isinstance(caught.value.__cause__, anthropic.OverloadedError)


def test_prompt_too_long_is_a_summarization_error_with_advice(api: FakeAPI) -> None:
    api.replies = [error(400, "invalid_request_error", "prompt is too long: 210000 tokens > 200000 maximum")]
    summarizer = AnthropicSummarizer(MODEL, client=make_client(api), max_retries=2)
    with pytest.raises(SummarizationError) as caught:
        summarizer.summarize(REQUEST)
    assert len(api.requests) == 1  # a 400 is not retried
    message = str(caught.value)
    assert "400" in message
    assert "prompt is too long: 210000 tokens > 200000 maximum" in message
    assert "summary_input_tokens" in message
    assert isinstance(caught.value.__cause__, anthropic.BadRequestError)


def test_timeouts_are_summarization_errors(api: FakeAPI) -> None:
    api.replies = [httpx2.ReadTimeout("read timed out")]
    summarizer = AnthropicSummarizer(MODEL, client=make_client(api), max_retries=0, timeout=1)
    with pytest.raises(SummarizationError, match="APITimeoutError") as caught:
        summarizer.summarize(REQUEST)
    assert isinstance(caught.value.__cause__, anthropic.APITimeoutError)


def test_a_refusal_is_a_summarization_error(api: FakeAPI) -> None:
    api.stop_reason = "refusal"
    api.reply_text = []
    summarizer = AnthropicSummarizer(MODEL, client=make_client(api))
    with pytest.raises(SummarizationError, match="refusal"):
        summarizer.summarize(REQUEST)
    assert summarizer.last_usage is not None  # the call was billed all the same


def test_a_summary_cut_short_is_logged(api: FakeAPI, caplog: pytest.LogCaptureFixture) -> None:
    api.stop_reason = "max_tokens"
    summarizer = AnthropicSummarizer(MODEL, client=make_client(api), max_tokens=16)
    with caplog.at_level(logging.WARNING, logger="langchain_compaction"):
        summarizer.summarize(REQUEST)
    assert "max_tokens=16" in caplog.text


async def test_async_summarizer_uses_the_async_client(api: FakeAPI) -> None:
    summarizer = AnthropicSummarizer(MODEL, async_client=make_async_client(api), max_retries=1)
    reply = await summarizer.asummarize(REQUEST)
    assert reply.text == "## Goal\n- keep going"
    ((path, body, headers),) = api.requests
    assert path == "/v1/messages"
    assert body["system"] == "You summarize."
    assert headers["x-stainless-async"].startswith("async")
    # Only an async client: the blocking path says what to do.
    with pytest.raises(ConfigurationError, match="acompact"):
        summarizer.summarize(REQUEST)


async def test_async_errors_are_mapped_too(api: FakeAPI) -> None:
    api.replies = [error(429, "rate_limit_error", "Number of requests has exceeded your rate limit")] * 2
    summarizer = AnthropicSummarizer(MODEL, async_client=make_async_client(api), max_retries=1)
    with pytest.raises(SummarizationError, match="429 rate_limit_error") as caught:
        await summarizer.asummarize(REQUEST)
    assert len(api.requests) == 2
    assert isinstance(caught.value.__cause__, anthropic.RateLimitError)


async def test_async_with_only_a_sync_client_runs_it_in_a_thread(api: FakeAPI) -> None:
    summarizer = AnthropicSummarizer(MODEL, client=make_client(api))
    reply = await summarizer.asummarize(REQUEST)
    assert reply.text == "## Goal\n- keep going"
    assert api.requests[0][2]["x-stainless-async"] == "false"


def test_summarizer_configuration_errors(api: FakeAPI, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigurationError, match="model"):
        AnthropicSummarizer("")
    with pytest.raises(ConfigurationError, match="async_client="):
        AnthropicSummarizer(MODEL, client=make_async_client(api))  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="max_tokens=50000"):
        AnthropicSummarizer(MODEL, max_tokens=50000)
    with pytest.raises(ConfigurationError, match="timeout"):
        AnthropicSummarizer(MODEL, timeout=0)
    with pytest.raises(ConfigurationError, match="max_retries"):
        AnthropicSummarizer(MODEL, max_retries=-1)
    with pytest.raises(ConfigurationError, match="temperature"):
        AnthropicSummarizer(MODEL, temperature=1.5)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_AUTH_TOKEN", raising=False)
    summarizer = AnthropicSummarizer(MODEL)  # no client yet: made on first use
    with pytest.raises(ConfigurationError, match="ANTHROPIC_API_KEY"):
        summarizer.summarize(REQUEST)


def test_usage_totals_count_every_call_and_the_log_keeps_only_recent_ones(api: FakeAPI) -> None:
    # Regression: usage_log grew by one entry per call for the summarizer's
    # whole life, and total_usage() summed it.
    summarizer = AnthropicSummarizer(MODEL, client=make_client(api))
    calls = 130
    with ThreadPoolExecutor(max_workers=4) as pool:
        replies = list(pool.map(lambda _: summarizer.summarize(REQUEST), range(calls)))
    assert len(replies) == len(api.requests) == calls
    assert len(summarizer.usage_log) == 100
    total = summarizer.total_usage()
    assert (total.input_tokens, total.output_tokens) == (120 * calls, 30 * calls)
    assert (total.cache_read_input_tokens, total.cache_creation_input_tokens) == (7 * calls, 5 * calls)
    assert total.total_input_tokens == 132 * calls
    assert summarizer.last_usage == summarizer.usage_log[-1]


# --- AnthropicSummarizer: the cache-aligned request ------------------------------------

PREFIX_PROMPT = "Write the checkpoint summary of the conversation above."


def aligned(prefix: list[BaseMessage]) -> SummaryRequest:
    return SummaryRequest(
        system=REQUEST.system, prompt=REQUEST.prompt, messages=(), prefix=tuple(prefix), prefix_prompt=PREFIX_PROMPT
    )


def test_a_valid_prefix_is_sent_as_chat_anthropic_sends_it(api: FakeAPI) -> None:
    prefix = conversation()[:8]  # ends with a tool result
    tools = [{"name": "run", "description": "Run a command", "input_schema": {"type": "object", "properties": {}}}]
    summarizer = AnthropicSummarizer(MODEL, client=make_client(api), tools=tools)

    reply = summarizer.summarize(aligned(prefix))

    assert reply.covers_prefix
    ((_path, body, _headers),) = api.requests
    agent = ChatAnthropic(model=MODEL, api_key="x")._get_request_payload(prefix)
    assert body["system"] == agent["system"]
    assert body["tools"] == tools
    assert json.dumps(body["messages"][:-1]) == json.dumps(agent["messages"][:-1])  # byte for byte
    # The instruction joins the last user turn, after its tool results.
    assert body["messages"][-1]["content"] == [
        *agent["messages"][-1]["content"],
        {"type": "text", "text": PREFIX_PROMPT},
    ]


INVALID_PREFIXES = {
    # The call was compacted away earlier: its result now opens the prefix.
    "orphan tool result": [SystemMessage("You are a careful coding agent."), *conversation()[3:6]],
    "assistant turn first": [SystemMessage("You are a careful coding agent."), *conversation()[4:6]],
    "call never answered": [
        HumanMessage("go"),
        AIMessage("", tool_calls=[{"id": "toolu_7", "name": "run", "args": {}}]),
        HumanMessage("that call was malformed"),
    ],
    "prefix ends on a call": conversation()[:3],
    "repeated call id": [
        *conversation()[1:5],
        AIMessage("", tool_calls=[{"id": "toolu_1", "name": "read_file", "args": {"path": "docs.md"}}]),
        ToolMessage("# Docs", tool_call_id="toolu_1", name="read_file"),
    ],
}


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("case", INVALID_PREFIXES)
async def test_a_prefix_the_api_would_refuse_is_summarized_from_the_transcript(
    api: FakeAPI, caplog: pytest.LogCaptureFixture, case: str, mode: str
) -> None:
    # Regression: a cache-aligned request skipped the validity step, so an
    # orphan tool result went out as a first turn the API rejects (400).
    request = aligned(INVALID_PREFIXES[case])
    with caplog.at_level(logging.WARNING, logger="langchain_compaction"):
        if mode == "sync":
            reply = AnthropicSummarizer(MODEL, client=make_client(api)).summarize(request)
        else:
            reply = await AnthropicSummarizer(MODEL, async_client=make_async_client(api)).asummarize(request)

    ((_path, body, _headers),) = api.requests
    assert body == {
        "model": MODEL,
        "max_tokens": 4096,
        "system": REQUEST.system,
        "messages": [{"role": "user", "content": REQUEST.prompt}],
    }
    assert reply.text == "## Goal\n- keep going"
    assert not reply.covers_prefix  # the engine goes on with the region's other chunks
    assert "summarizing from the transcript" in caplog.text


def representative_conversation() -> list[BaseMessage]:
    return [
        SystemMessage("You are a careful coding agent."),
        HumanMessage(
            [
                {"type": "text", "text": "What fails in this screenshot?"},
                {"type": "image", "base64": "iVBORw0KGgo=", "mime_type": "image/png"},
                {"type": "image_url", "image_url": {"url": "https://example.com/shot.png"}},
            ]
        ),
        AIMessage(
            [
                {"type": "thinking", "thinking": "Read the file first.", "signature": "sig"},
                {"type": "text", "text": "Let me look."},
            ],
            tool_calls=[
                {"id": "toolu_1", "name": "read_file", "args": {"path": "parser.py"}},
                {"id": "toolu_2", "name": "run", "args": {"cmd": "pytest -q"}},
            ],
        ),
        ToolMessage("def parse(x):\n    return int(x)\n", tool_call_id="toolu_1", name="read_file"),
        ToolMessage([{"type": "text", "text": "1 failed"}], tool_call_id="toolu_2", name="run", status="error"),
        AIMessage("The parser casts without a check."),
        HumanMessage("Fix it."),
    ]


def test_the_prefix_formatter_still_matches_chat_anthropic(caplog: pytest.LogCaptureFixture) -> None:
    """Fails when langchain-anthropic changes its private ``_format_messages``: update ``wire`` then."""
    messages = representative_conversation()
    expected = ChatAnthropic(model=MODEL, api_key="x")._get_request_payload(messages)
    with caplog.at_level(logging.WARNING, logger="langchain_compaction"):
        system, sent = wire.chat_anthropic_format(messages, MODEL)
    upstream = (
        "langchain-anthropic changed upstream: langchain_anthropic.chat_models._format_messages no longer "
        "gives ChatAnthropic's request, so cache-aligned prefixes miss the prompt cache; update "
        "langchain_compaction/anthropic/wire.py (chat_anthropic_format). "
    )
    assert not caplog.records, upstream + caplog.text
    assert json.dumps(sent) == json.dumps(expected["messages"]), upstream
    assert system == expected["system"], upstream


def test_the_prefix_formatter_falls_back_to_the_own_converter_with_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, request: pytest.FixtureRequest
) -> None:
    import langchain_anthropic.chat_models as chat_models

    # The formatter is looked up once per process: forget it around this test.
    request.addfinalizer(wire._private_formatter.cache_clear)
    messages = representative_conversation()
    expected = ChatAnthropic(model=MODEL, api_key="x")._get_request_payload(messages)
    monkeypatch.delattr(chat_models, "_format_messages")
    wire._private_formatter.cache_clear()
    with caplog.at_level(logging.WARNING, logger="langchain_compaction"):
        system, sent = wire.chat_anthropic_format(messages, MODEL)
    assert "_format_messages is gone" in caplog.text
    # The own converter sends the same request, though not byte for byte.
    assert (system, sent) == (expected["system"], expected["messages"])

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise TypeError("unexpected keyword argument 'model'")

    monkeypatch.setattr(chat_models, "_format_messages", broken, raising=False)
    wire._private_formatter.cache_clear()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="langchain_compaction"):
        assert wire.chat_anthropic_format(messages, MODEL) == (system, sent)
    assert "unexpected keyword argument" in caplog.text


# --- end to end through compact ------------------------------------------------------


def long_conversation() -> list[BaseMessage]:
    messages: list[BaseMessage] = [SystemMessage("You are a coding agent.")]
    for turn in range(8):
        messages += [HumanMessage(f"Step {turn}: refactor module_{turn}.py " + "x" * 300), AIMessage(f"Done {turn}.")]
    return messages


def test_compact_with_the_anthropic_summarizer(api: FakeAPI) -> None:
    messages = long_conversation()
    summarizer = AnthropicSummarizer(MODEL, client=make_client(api), max_retries=0)
    result, out = compact(summarizer, messages, CompactionOptions(keep_recent_tokens=200))
    assert result is not None
    assert result.summarizer == f"anthropic:{MODEL}"
    assert result.summary == "## Goal\n- keep going"
    assert out[0] is messages[0]
    assert out[-1] is messages[-1]
    assert isinstance(out[1], SystemMessage)
    assert "## Goal\n- keep going" in str(out[1].content)
    ((path, body, _headers),) = api.requests
    assert path == "/v1/messages"
    prompt = body["messages"][0]["content"]
    assert "Step 0: refactor module_0.py" in prompt  # the old messages were shown
    assert body["system"]  # the engine's summarizer system prompt


async def test_acompact_with_the_anthropic_summarizer(api: FakeAPI) -> None:
    messages = long_conversation()
    summarizer = AnthropicSummarizer(MODEL, async_client=make_async_client(api))
    result, out = await acompact(summarizer, messages, CompactionOptions(keep_recent_tokens=200))
    assert result is not None
    assert result.summary == "## Goal\n- keep going"
    assert len(out) < len(messages)
    assert summarizer.last_usage is not None


def test_compact_surfaces_api_errors_and_leaves_messages_alone(api: FakeAPI) -> None:
    api.replies = [error(400, "invalid_request_error", "prompt is too long: 300000 tokens > 200000 maximum")]
    messages = long_conversation()
    before = list(messages)
    summarizer = AnthropicSummarizer(MODEL, client=make_client(api), max_retries=0)
    with pytest.raises(SummarizationError, match="prompt is too long") as caught:
        compact(summarizer, messages, CompactionOptions(keep_recent_tokens=200))
    assert isinstance(caught.value, CompactionError)
    assert messages == before


def test_compact_falls_back_when_claude_is_overloaded(api: FakeAPI) -> None:
    api.replies = [error(529, "overloaded_error", "Overloaded")] * 2
    summarizer = AnthropicSummarizer(MODEL, client=make_client(api), max_retries=1)
    fallback: Callable[[str], str] = lambda prompt: "## Goal\n- fallback summary"  # noqa: E731
    result, _out = compact(
        summarizer, long_conversation(), CompactionOptions(keep_recent_tokens=200), fallback=fallback
    )
    assert result is not None
    assert result.fallback_used
    assert result.summary == "## Goal\n- fallback summary"


def test_counter_and_summarizer_together_on_one_client(api: FakeAPI) -> None:
    client = make_client(api)
    counter = AnthropicTokenCounter(client, model=MODEL)
    summarizer = AnthropicSummarizer(MODEL, client=client)
    messages = long_conversation()
    result, _out = compact(summarizer, messages, CompactionOptions(token_counter=counter, keep_recent_tokens=200))
    assert result is not None
    paths = api.paths()
    assert paths.count("/v1/messages") == 1
    assert 1 <= paths.count("/v1/messages/count_tokens") < len(messages)  # whole-conversation counts


@pytest.mark.parametrize("timeout", [float("inf"), float("nan"), 0, -1])
def test_a_summarizer_timeout_that_is_not_a_finite_positive_number_is_refused(api: FakeAPI, timeout: float) -> None:
    # Infinity and NaN were taken, and every call then failed as "Anthropic API unreachable".
    with pytest.raises(ConfigurationError, match="timeout="):
        AnthropicSummarizer(MODEL, client=make_client(api), timeout=timeout)


def test_a_pdf_file_block_and_a_v03_image_block_go_as_chat_anthropic_sends_them() -> None:
    """A PDF counted as its base64 text was tens of thousands of tokens; a v0.3 image was left out, uncounted."""
    from langchain_core.messages import HumanMessage

    pdf = {"type": "file", "base64": "JVBERi0xLjQK" * 200, "mime_type": "application/pdf"}
    image = {"type": "image", "source_type": "base64", "data": "iVBORw0KGgo=", "mime_type": "image/png"}
    content = wire.to_api(HumanMessage([{"type": "text", "text": "read these"}, pdf, image]))[0]["content"]
    assert [b["type"] for b in content] == ["text", "document", "image"]
    assert content[1]["source"] == {"type": "base64", "media_type": "application/pdf", "data": pdf["base64"]}
    assert content[2]["source"] == {"type": "base64", "media_type": "image/png", "data": image["data"]}
