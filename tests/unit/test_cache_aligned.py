"""The cache-aligned mode: the summarizer is sent the conversation's own prefix, unchanged."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx2
import pytest
from helpers_turns import SMALL_WINDOW, RequestRecorder, ToolCallingFake, cfg, chat, words
from langchain.agents import create_agent
from langchain_anthropic import ChatAnthropic
from langchain_core.language_models.fake_chat_models import FakeListChatModel, GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langgraph.checkpoint.memory import InMemorySaver

from langchain_compaction import (
    CompactionMiddleware,
    CompactionNode,
    CompactionOptions,
    ExtractiveSummarizer,
    acompact,
    compact,
)
from langchain_compaction.anthropic import AnthropicSummarizer
from langchain_compaction.core.prompts import CACHE_ALIGNED_PROMPT
from langchain_compaction.core.types import SummaryRequest
from langchain_compaction.errors import ConfigurationError
from langchain_compaction.features import CacheAligned, default_features
from langchain_compaction.tokens import estimate_message_tokens, estimate_tokens

REPLY = "## Goal\n- finish the migration"


class Recording(GenericFakeChatModel):
    """A fake chat model that keeps every input list it was given."""

    inputs: list = []  # noqa: RUF012 - a pydantic field, copied per instance

    def _generate(self, messages, stop=None, run_manager=None, **kwargs):
        self.inputs.append(list(messages))
        return super()._generate(messages, stop=stop, run_manager=run_manager, **kwargs)


def conversation() -> list[BaseMessage]:
    messages: list[BaseMessage] = [SystemMessage("You are a migration agent.", id="sys")]
    for turn in range(12):
        messages.append(HumanMessage(f"Migrate table t{turn} " + "with care " * 60, id=f"h{turn}"))
        call = {"name": "sql", "args": {"query": f"ALTER TABLE t{turn} ..."}, "id": f"c{turn}"}
        messages.append(AIMessage("Running the migration.", tool_calls=[call], id=f"a{turn}"))
        messages.append(ToolMessage("ok " * 80, tool_call_id=f"c{turn}", name="sql", id=f"t{turn}"))
        messages.append(AIMessage(f"Table t{turn} migrated.", id=f"f{turn}"))
    return messages


OPTIONS = CompactionOptions(keep_recent_tokens=600)
ALIGNED = [*default_features(), CacheAligned()]


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_chat_model_receives_the_callers_prefix_then_the_instruction(mode):
    messages = conversation()
    model = Recording(messages=iter([AIMessage(REPLY)]), inputs=[])
    result, out = (
        compact(model, messages, OPTIONS, features=ALIGNED)
        if mode == "sync"
        else await acompact(model, messages, OPTIONS, features=ALIGNED)
    )
    assert result is not None
    sent = model.inputs[0]
    cut = result.cut_index
    assert len(sent) == cut + 1
    assert all(sent[i] is messages[i] for i in range(cut))  # the caller's own objects, unchanged
    assert isinstance(sent[-1], HumanMessage)
    assert sent[-1].content == CACHE_ALIGNED_PROMPT
    assert result.summary == REPLY


def test_the_prefix_is_byte_identical_to_the_agents_previous_request():
    messages = conversation()
    model = Recording(messages=iter([AIMessage(REPLY)]), inputs=[])
    result, _ = compact(model, messages, OPTIONS, features=ALIGNED)
    assert result is not None
    chat = ChatAnthropic(model="claude-sonnet-4-5", api_key="x")
    agent = chat._get_request_payload(messages)
    summary_request = chat._get_request_payload(model.inputs[0])
    assert summary_request["system"] == agent["system"]
    shared = summary_request["messages"][:-1]
    assert json.dumps(shared) == json.dumps(agent["messages"][: len(shared)])


def test_custom_instructions_ride_on_the_instruction():
    model = Recording(messages=iter([AIMessage(REPLY)]), inputs=[])
    compact(model, conversation(), OPTIONS, "keep the table names", features=ALIGNED)
    assert model.inputs[0][-1].content.endswith("Additional instructions: keep the table names")


def test_summarizers_without_prefix_support_get_the_transcript():
    prompts: list[str] = []
    result, _ = compact(lambda p: prompts.append(p) or REPLY, conversation(), OPTIONS, features=ALIGNED)
    assert result is not None
    assert "[User]" in prompts[0]  # the fenced transcript, as in the default mode
    result, _ = compact(ExtractiveSummarizer(), conversation(), OPTIONS, features=ALIGNED)
    assert result is not None
    assert "t0" in result.summary


def test_a_summarizer_that_sends_the_transcript_reports_the_transcript_sent():
    """Offered the prefix, a summarizer that cannot send it sends the transcript: that is what is counted."""
    prompts: list[str] = []

    def model(prompt: str) -> str:
        prompts.append(prompt)
        return REPLY

    aligned, _ = compact(model, conversation(), OPTIONS, features=ALIGNED)
    plain, _ = compact(model, conversation(), OPTIONS)
    assert aligned is not None
    assert plain is not None
    assert prompts[0] == prompts[1]  # the same transcript went out
    assert aligned.summarizer_input_tokens == plain.summarizer_input_tokens
    assert abs(aligned.summarizer_input_tokens - estimate_tokens(prompts[0])) <= estimate_tokens(prompts[0]) // 100


def test_transcript_is_used_when_the_region_needs_chunks():
    model = Recording(messages=iter([AIMessage(REPLY)] * 10), inputs=[])
    options = CompactionOptions(keep_recent_tokens=600, summary_input_tokens=1500)
    compact(model, conversation(), options, features=ALIGNED)
    assert all(isinstance(batch[0], SystemMessage) and len(batch) == 2 for batch in model.inputs)


def test_redaction_cannot_be_combined_with_the_mode():
    # It sends the prefix byte for byte so the cache serves it: redacting it
    # would lose the cache, its only benefit. Said at construction.
    with pytest.raises(ConfigurationError, match="CacheAligned") as info:
        CompactionNode(REPLY, CompactionOptions(redact=str.upper), features=ALIGNED)
    assert "redact" in str(info.value)


def test_default_mode_is_the_transcript():
    model = Recording(messages=iter([AIMessage(REPLY)]), inputs=[])
    compact(model, conversation(), CompactionOptions(keep_recent_tokens=600))
    assert len(model.inputs[0]) == 2


def test_the_0_2_keyword_still_works_with_a_deprecation_warning():
    with pytest.warns(DeprecationWarning, match="CacheAligned"):
        options = CompactionOptions(keep_recent_tokens=600, summary_mode="cache_aligned")
    model = Recording(messages=iter([AIMessage(REPLY)]), inputs=[])
    compact(model, conversation(), options)
    assert model.inputs[0][-1].content == CACHE_ALIGNED_PROMPT
    with (
        pytest.warns(DeprecationWarning, match="CacheAligned"),
        pytest.raises(ConfigurationError, match=r"summary_mode='cached'"),
    ):
        compact(model, conversation(), CompactionOptions(summary_mode="cached"))


def anthropic_client(bodies: list[dict]) -> anthropic.Anthropic:
    """A real SDK client over a fake transport that records each request body."""

    def handler(request: httpx2.Request) -> httpx2.Response:
        bodies.append(json.loads(request.content))
        return httpx2.Response(
            200,
            json={
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "model": "claude-haiku-4-5",
                "content": [{"type": "text", "text": REPLY}],
                "stop_reason": "end_turn",
                "usage": {
                    "input_tokens": 40,
                    "output_tokens": 30,
                    "cache_read_input_tokens": 5000,
                    "cache_creation_input_tokens": 0,
                },
            },
        )

    return anthropic.Anthropic(api_key="test", http_client=httpx2.Client(transport=httpx2.MockTransport(handler)))


def test_anthropic_summarizer_sends_the_prefix_and_reports_cache_reads():
    bodies: list[dict] = []
    messages = conversation()
    result, _ = compact(
        AnthropicSummarizer("claude-haiku-4-5", client=anthropic_client(bodies)), messages, OPTIONS, features=ALIGNED
    )
    assert result is not None
    assert len(bodies) == 1  # the prefix covered the whole region in one call
    body = bodies[0]
    agent = ChatAnthropic(model="claude-haiku-4-5", api_key="x")._get_request_payload(messages)
    assert body["system"] == agent["system"]
    shared = body["messages"][:-1]
    assert json.dumps(shared) == json.dumps(agent["messages"][: len(shared)])
    assert body["messages"][-1]["content"][-1]["text"] == CACHE_ALIGNED_PROMPT
    assert body["cache_control"] == {"type": "ephemeral"}  # a request reads the cache only when it asks
    assert result.summarizer_cache_read_tokens == 5000
    assert result.summarizer_billed_input_tokens == 40
    # The transcript request shares no prefix with the agent's: it asks for no cache read.
    compact(AnthropicSummarizer("claude-haiku-4-5", client=anthropic_client(bodies)), messages, OPTIONS)
    assert "cache_control" not in bodies[-1]


def test_a_cache_aligned_request_through_chat_anthropic_asks_for_a_cache_read():
    payloads: list[dict] = []

    class RecordingClaude(ChatAnthropic):
        def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> ChatResult:
            payloads.append(self._get_request_payload(messages, stop=stop, **kwargs))
            return ChatResult(generations=[ChatGeneration(message=AIMessage(REPLY))])

    result, _ = compact(
        RecordingClaude(model="claude-haiku-4-5", api_key="x"), conversation(), OPTIONS, features=ALIGNED
    )
    assert result is not None
    assert payloads[-1]["cache_control"] == {"type": "ephemeral"}


def _marked_four_times() -> list[BaseMessage]:
    """The conversation with the agent's own four cache breakpoints on its first four human turns."""
    messages = conversation()
    for n in range(4):
        index = 1 + 4 * n
        text = str(messages[index].content)
        block = {"type": "text", "text": text, "cache_control": {"type": "ephemeral"}}
        messages[index] = messages[index].model_copy(update={"content": [block]})
    return messages


def test_a_prefix_carrying_four_breakpoints_gets_no_fifth_the_api_would_refuse():
    """The API takes four blocks with cache_control; a top-level one on top of the agent's four made five."""
    bodies: list[dict] = []
    summarizer = AnthropicSummarizer("claude-haiku-4-5", client=anthropic_client(bodies))
    result, _ = compact(summarizer, _marked_four_times(), OPTIONS, features=ALIGNED)
    assert result is not None
    assert "cache_control" not in bodies[-1]
    assert json.dumps(bodies[-1]["messages"]).count('"cache_control"') == 4
    payloads: list[dict] = []

    class RecordingClaude(ChatAnthropic):
        def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> ChatResult:
            payloads.append(self._get_request_payload(messages, stop=stop, **kwargs))
            return ChatResult(generations=[ChatGeneration(message=AIMessage(REPLY))])

    compact(RecordingClaude(model="claude-haiku-4-5", api_key="x"), _marked_four_times(), OPTIONS, features=ALIGNED)
    assert "cache_control" not in payloads[-1]


def test_anthropic_summarizer_falls_back_to_the_transcript_for_a_prefix_the_api_would_refuse():
    # Regression: the prefix was sent without the validity step, so a tool
    # result whose call is gone (here the first call, dropped by an earlier
    # trim) went out in a request the API rejects, failing the compaction.
    messages = [m for m in conversation() if m.id != "a0"]
    bodies: list[dict] = []
    result, out = compact(
        AnthropicSummarizer("claude-haiku-4-5", client=anthropic_client(bodies)), messages, OPTIONS, features=ALIGNED
    )
    assert result is not None
    assert result.summary == REPLY
    assert len(out) < len(messages)
    assert bodies, "no summary request was sent"
    for body in bodies:
        # The transcript mode: the summarizer's own system prompt, one user turn.
        assert body["messages"] == [{"role": "user", "content": body["messages"][0]["content"]}]
        assert isinstance(body["messages"][0]["content"], str)
        assert "tool_result" not in json.dumps(body)
    assert "[User]" in bodies[0]["messages"][0]["content"]


class ToolRecording(Recording):
    """A fake chat model that binds tools the way a real one does, and records them."""

    bound: list = []  # noqa: RUF012 - a pydantic field, copied per instance

    def bind_tools(self, tools, **kwargs):
        self.bound.append(list(tools))
        return self.bind(tools=tools)


def test_under_create_agent_the_summary_request_carries_the_agents_system_prompt_and_tools():
    # The provider's prompt cache reads tools, then system, then messages: a
    # cache-aligned summary must send the agent's own system prompt and tools,
    # or nothing of it is served from the cache.
    from langchain.agents import create_agent
    from langchain_core.tools import tool

    from langchain_compaction import CompactionMiddleware

    @tool
    def lookup(order: str) -> str:
        """Look an order up."""
        return f"order {order}: shipped"

    agent_model = ToolRecording(messages=iter([AIMessage(f"answer {i} " * 120) for i in range(40)]), inputs=[])
    summarizer = ToolRecording(messages=iter([AIMessage(REPLY) for _ in range(10)]), inputs=[], bound=[])
    middleware = CompactionMiddleware(
        summarizer,
        CompactionOptions(context_window=8_000, keep_recent_tokens=2_000),
        features=ALIGNED,
    )
    agent = create_agent(agent_model, tools=[lookup], system_prompt="You are the order desk.", middleware=[middleware])
    messages: list = []
    for turn in range(14):
        messages = agent.invoke({"messages": [*messages, HumanMessage(f"question {turn} " * 120)]})["messages"]
    assert summarizer.inputs, "the window should have compacted"
    sent = summarizer.inputs[0]
    assert isinstance(sent[0], SystemMessage)
    assert sent[0].content == "You are the order desk."
    assert sent[-1].content == CACHE_ALIGNED_PROMPT
    assert [t.name for t in summarizer.bound[0]] == ["lookup"]
    # What came before the instruction is what the agent sent before the cut.
    agent_request = next(r for r in agent_model.inputs if len(r) >= len(sent) - 1)
    assert [m.content for m in sent[1:-1]] == [m.content for m in agent_request[1 : len(sent) - 1]]


def test_under_create_agent_a_structured_outputs_tool_is_among_the_tools_the_summary_request_carries():
    # create_agent binds a ToolStrategy's tool after every middleware: the summary request went without it,
    # so a cache that reads the tools first served none of the agent's prefix.
    from langchain.agents import create_agent
    from langchain.agents.structured_output import ToolStrategy
    from langchain_core.tools import tool
    from pydantic import BaseModel

    from langchain_compaction import CompactionMiddleware

    class Answer(BaseModel):
        text: str

    @tool
    def lookup(order: str) -> str:
        """Look an order up."""
        return f"order {order}: shipped"

    agent_model = ToolRecording(messages=iter([AIMessage(f"answer {i} " * 120) for i in range(40)]), inputs=[])
    summarizer = ToolRecording(messages=iter([AIMessage(REPLY) for _ in range(10)]), inputs=[], bound=[])
    options = CompactionOptions(context_window=8_000, keep_recent_tokens=2_000)
    middleware = CompactionMiddleware(summarizer, options, features=ALIGNED)
    agent = create_agent(agent_model, tools=[lookup], middleware=[middleware], response_format=ToolStrategy(Answer))
    messages: list = []
    for turn in range(14):
        messages = agent.invoke({"messages": [*messages, HumanMessage(f"question {turn} " * 120)]})["messages"]
    assert summarizer.inputs, "the window should have compacted"
    assert [t.name for t in summarizer.bound[0]] == ["lookup", "Answer"]


def test_cache_aligned_input_tokens_are_the_prefix_sent() -> None:
    """summarizer_input_tokens reports what a cache-aligned request sent: the prefix and the instruction."""
    messages = chat(6, size=50)
    options = CompactionOptions(keep_recent_tokens=200)
    model = FakeListChatModel(responses=["## Goal\n- answer questions"])
    result, _ = compact(model, messages, options, features=[*default_features(), CacheAligned()])
    assert result is not None
    sent = estimate_message_tokens(messages[: result.cut_index]) + estimate_tokens(CACHE_ALIGNED_PROMPT)
    assert result.summarizer_input_tokens == sent
    transcript, _ = compact(model, messages, CompactionOptions(keep_recent_tokens=200))
    assert transcript is not None
    assert transcript.summarizer_input_tokens != sent  # the transcript is another size


def test_cache_aligned_retry_still_covers_every_chunk():
    """After a too-long first answer, the chunked retry of a cache-aligned summary still covers every message."""
    messages = [SystemMessage("sys")]
    for i in range(12):
        messages += [HumanMessage(f"FACT{i} " + "words " * 40), AIMessage("ok " * 40)]
    messages.append(HumanMessage("last"))
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel

    seen: list[str] = []

    class Recording(GenericFakeChatModel):
        def _generate(self, msgs, stop=None, run_manager=None, **kw):
            seen.append("\n".join(str(m.content) for m in msgs))
            return super()._generate(msgs, stop=stop, run_manager=run_manager, **kw)

    # The first answer (written from the whole prefix) is too long; the retry
    # and everything after are fine.
    fake = Recording(messages=iter([AIMessage("long " * 400)] + [AIMessage("## Goal\n- short")] * 20))
    options = CompactionOptions(summary_input_tokens=1000, summary_max_tokens=64, keep_recent_tokens=10)
    result, _ = compact(fake, messages, options, features=[*default_features(), CacheAligned()])
    assert result is not None
    accepted = "\n".join(seen[1:])  # everything after the rejected first answer
    assert all(f"FACT{i} " in accepted for i in range(12))
    assert result.chunks > 1


class ThreadRecorder(RequestRecorder):
    """Records each summary request with the thread it was made for."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[str] = []

    def summarize(self, request: SummaryRequest) -> str:
        from langgraph.config import get_config

        self.threads.append(str(get_config()["configurable"].get("thread_id")))
        return super().summarize(request)


def test_cache_aligned_summary_uses_its_own_threads_system_prompt() -> None:
    """A cache-aligned summary request of one thread carries that thread's system prompt, never another's."""
    from langchain.agents.middleware import dynamic_prompt
    from langgraph.config import get_config

    @dynamic_prompt
    def per_thread_prompt(request: Any) -> str:
        return f"SYSTEM-PROMPT-OF-{get_config()['configurable']['thread_id']}"

    recorder = ThreadRecorder()
    middleware = CompactionMiddleware(recorder, SMALL_WINDOW, features=[*default_features(), CacheAligned()])
    model = ToolCallingFake(messages=iter([AIMessage(words("reply", 40)) for _ in range(200)]))
    agent = create_agent(model, middleware=[per_thread_prompt, middleware], checkpointer=InMemorySaver())
    for turn in range(25):
        for thread in ("A", "B"):
            agent.invoke({"messages": [HumanMessage(words(f"{thread}{turn}", 40))]}, cfg(thread))
    with_prefix = [(t, r) for t, r in zip(recorder.threads, recorder.requests) if r.prefix]
    assert with_prefix, "no cache-aligned request was made"
    mixed = []
    for thread, request in with_prefix:
        systems = [str(m.content) for m in request.prefix if getattr(m, "type", "") == "system"]
        if any("SYSTEM-PROMPT-OF-" in text and text != f"SYSTEM-PROMPT-OF-{thread}" for text in systems):
            mixed.append((thread, systems))
    assert not mixed, f"a summary request for one thread carried another thread's system prompt: {mixed[:2]}"


@pytest.mark.parametrize("said", ["", "Let me look that order up."])
def test_a_tool_call_answered_to_the_agents_request_is_asked_again_from_the_transcript(said: str):
    """Over the agent's own request, with its tools bound, a model may answer a tool call: the transcript then."""
    from langchain_core.messages import ToolCall as LCToolCall

    call = LCToolCall(name="lookup", args={"order": "1"}, id="x1")
    summarizer = ToolRecording(
        messages=iter([AIMessage(said, tool_calls=[call]), AIMessage(REPLY)]), inputs=[], bound=[]
    )
    result, _ = compact(summarizer, conversation(), OPTIONS, features=ALIGNED)
    assert result is not None
    assert result.summary == REPLY
    first, second = summarizer.inputs
    assert first[-1].content == CACHE_ALIGNED_PROMPT  # the agent's request, then the instruction
    assert "[User]" in str(second[-1].content)  # then the fenced transcript
    assert "no text" in str(second[-1].content)  # with what was wrong said


@pytest.mark.parametrize("path", ["sync", "async"])
def test_a_summarizer_model_without_tool_support_is_asked_without_the_agents_tools(path: str) -> None:
    """BaseChatModel's own bind_tools raises NotImplementedError: the request goes without the tools.

    Every compaction failed, and the agent's turn with it, blaming a missing sync path (under ainvoke).
    """
    import asyncio

    from langchain.agents import create_agent
    from langchain_core.tools import tool

    from langchain_compaction import CompactionMiddleware

    @tool
    def lookup(order: str) -> str:
        """Look an order up."""
        return f"order {order}: shipped"

    agent_model = ToolRecording(messages=iter([AIMessage(f"answer {i} " * 120) for i in range(40)]), inputs=[])
    summarizer = Recording(messages=iter([AIMessage(REPLY) for _ in range(10)]), inputs=[])
    middleware = CompactionMiddleware(
        summarizer, CompactionOptions(context_window=8_000, keep_recent_tokens=2_000), features=ALIGNED
    )
    agent = create_agent(agent_model, tools=[lookup], system_prompt="You are the order desk.", middleware=[middleware])
    messages: list = []
    for turn in range(14):
        state = {"messages": [*messages, HumanMessage(f"question {turn} " * 120)]}
        messages = (agent.invoke(state) if path == "sync" else asyncio.run(agent.ainvoke(state)))["messages"]
    assert summarizer.inputs, "the window should have compacted"
    assert summarizer.inputs[0][-1].content == CACHE_ALIGNED_PROMPT
    assert any(REPLY in str(m.content) for m in messages)
