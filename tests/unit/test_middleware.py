"""CompactionMiddleware inside real ``create_agent`` graphs with real tools and checkpointers."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar, cast

import pytest
from conftest import as_state, assert_compacted, assert_valid_anthropic_request, split_compacted
from helpers_turns import SMALL_WINDOW, ToolCallingFake, cfg, short_summary, words
from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain.agents.middleware.types import ModelRequest
from langchain_anthropic import ChatAnthropic
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.exceptions import ContextOverflowError
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    RemoveMessage,
    ToolMessage,
)
from langchain_core.messages.utils import count_tokens_approximately
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph.message import REMOVE_ALL_MESSAGES
from pydantic import Field

from langchain_compaction import (
    CompactionError,
    CompactionOptions,
    CompactionResult,
    ExtractiveSummarizer,
    should_compact,
)
from langchain_compaction._lc.convert import BRIDGE_TEXT, is_bridge_message, is_summary_message
from langchain_compaction.core.tokens import estimate_tokens
from langchain_compaction.errors import ConfigurationError, SummarizationError
from langchain_compaction.middleware import COMPACTION_EVENT, OVERHEAD_KEY, CompactionMiddleware
from langchain_compaction.tokens import estimate_message_tokens

SUMMARY = "## Goal\n- answer the user's questions\n\n## Critical Context\n- (none)"
ANTHROPIC = ChatAnthropic(model="claude-sonnet-4-5", api_key="x")  # type: ignore[call-arg,arg-type]


# -- real tools -------------------------------------------------------------------


@tool
def lookup(query: str) -> str:
    """Look a query up in the project notes and return what was found."""
    return f"notes for {query}: " + "the build uses hatchling and the tests run with pytest. " * 8


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


# -- a fake tool-calling model ------------------------------------------------------


class _InvalidRequest(Exception):
    """What langchain-openai 1.8 raises for an overflow under openai 3.x: no ContextOverflowError.

    (openai 3 leaves the code out of the message langchain-openai reads it from; the code is an attribute.)
    """

    status_code = 400
    code = "context_length_exceeded"


class ToolCallingFakeModel(GenericFakeChatModel):
    """LangChain's GenericFakeChatModel with ``bind_tools``, a request log and overflows.

    ``overflow_above``: raise ``ContextOverflowError`` (as ChatAnthropic does for
    "prompt is too long") when the request's estimate is above it, before
    consuming a scripted reply, so a retried call gets the same reply.
    """

    requests: list[list[BaseMessage]] = Field(default_factory=list)
    overflow_above: int | None = None
    overflow_as_openai: bool = False  # raise what langchain-openai 1.8 raises under openai 3.x instead

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ToolCallingFakeModel:
        return self

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        self.requests.append(list(messages))
        if self.overflow_above is not None and estimate_message_tokens(messages) > self.overflow_above:
            sent = estimate_message_tokens(messages)
            if self.overflow_as_openai:
                msg = f"Error code: 400 - This model's maximum context length is {self.overflow_above} tokens. "
                raise _InvalidRequest(msg + f"However, your messages resulted in {sent} tokens.")
            raise ContextOverflowError(f"prompt is too long: {sent} tokens > {self.overflow_above} maximum")
        return super()._generate(messages, stop=stop, run_manager=run_manager, **kwargs)


def tool_script(turns: int, *, start: int = 0) -> Iterator[AIMessage]:
    """Two model calls per user turn: a tool call (every 5th turn two parallel calls), then an answer."""
    for turn in range(start, start + turns):
        calls = [{"name": "lookup", "args": {"query": f"topic {turn}"}, "id": f"call_{turn}_a", "type": "tool_call"}]
        if turn % 5 == 0:
            calls.append({"name": "add", "args": {"a": turn, "b": 1}, "id": f"call_{turn}_b", "type": "tool_call"})
        yield AIMessage(content="", tool_calls=calls)
        yield AIMessage(content=f"Answer {turn}: the notes say the build uses hatchling and pytest.")


def text_script(turns: int) -> Iterator[AIMessage]:
    for turn in range(turns):
        yield AIMessage(content=f"reply {turn}")


def history(pairs: int, words: int = 40) -> list[BaseMessage]:
    """A plain conversation of ``pairs`` human/AI exchanges, each message about ``words`` words."""
    out: list[BaseMessage] = []
    for i in range(pairs):
        out.append(HumanMessage(f"question {i}: " + "please explain the design " * (words // 4)))
        out.append(AIMessage(f"answer {i}: " + "the design keeps things simple " * (words // 5)))
    return out


def config(thread: str = "t") -> Any:
    return {"configurable": {"thread_id": thread}}


async def run(agent: Any, payload: dict[str, Any], cfg: Any, mode: str) -> dict[str, Any]:
    if mode == "sync":
        return agent.invoke(payload, cfg)  # type: ignore[no-any-return]
    return await agent.ainvoke(payload, cfg)  # type: ignore[no-any-return]


class Failing:
    """A summarizer function that always fails, counting its calls."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, prompt: str) -> str:
        self.calls += 1
        msg = "summary model is down"
        raise RuntimeError(msg)


# -- the long scripted session ------------------------------------------------------------------

SYSTEM_PROMPT = "You are a careful research assistant. Use the tools to look things up before answering."
SESSION_OPTIONS = CompactionOptions(context_window=5000, reserve_tokens=1000, keep_recent_tokens=1200)


def _session_agent(turns: int, results: list[CompactionResult]) -> tuple[Any, ToolCallingFakeModel]:
    model = ToolCallingFakeModel(messages=tool_script(turns))
    middleware = CompactionMiddleware(lambda prompt: SUMMARY, SESSION_OPTIONS, on_compaction=results.append)
    agent = create_agent(
        model,
        tools=[lookup, add],
        system_prompt=SYSTEM_PROMPT,
        middleware=[middleware],
        checkpointer=InMemorySaver(),
    )
    return agent, model


def _check_session(agent: Any, model: ToolCallingFakeModel, results: list[CompactionResult], turns: int) -> None:
    # Two model calls per user turn, no retries.
    assert len(model.requests) == 2 * turns
    for request in model.requests:
        assert_valid_anthropic_request(request, SYSTEM_PROMPT, ends_with_user=True)
    # The requests stay within the window: compaction fired ahead of time.
    threshold = SESSION_OPTIONS.context_window - SESSION_OPTIONS.reserve_tokens
    assert max(estimate_message_tokens(r) for r in model.requests) <= threshold + 400
    assert len(results) >= 5
    assert all(not r.forced and not r.fallback_used for r in results)
    assert all(r.updated_previous_summary for r in results[1:])

    state = agent.get_state(config()).values
    messages = state["messages"]
    summaries = [m for m in messages if is_summary_message(m)]
    assert len(summaries) == 1
    assert messages[0] is summaries[0]
    parts = split_compacted(messages)  # a bridge, if any, right after the summary
    recent = messages[1:]
    assert recent[1 if parts.bridge is not None else 0 :] == parts.recent
    assert recent[-1].content.startswith(f"Answer {turns - 1}:")
    # Only recent messages: within the keep budget plus the turn added since the last compaction.
    assert estimate_message_tokens(recent) <= threshold
    assert not any(isinstance(m, HumanMessage) and m.content == "question 0" for m in recent)
    assert state[OVERHEAD_KEY] > estimate_tokens(SYSTEM_PROMPT)


def test_long_session_sync_keeps_one_summary_and_valid_requests() -> None:
    turns = 200
    results: list[CompactionResult] = []
    agent, model = _session_agent(turns, results)
    for turn in range(turns):
        agent.invoke({"messages": [HumanMessage(f"question {turn}")]}, config())
    _check_session(agent, model, results, turns)


async def test_long_session_async_keeps_one_summary_and_valid_requests() -> None:
    turns = 120
    results: list[CompactionResult] = []
    agent, model = _session_agent(turns, results)
    for turn in range(turns):
        await agent.ainvoke({"messages": [HumanMessage(f"question {turn}")]}, config())
    _check_session(agent, model, results, turns)


def test_kept_messages_keep_their_ids_and_the_update_replaces_the_list() -> None:
    middleware = CompactionMiddleware(
        lambda prompt: SUMMARY, CompactionOptions(context_window=2000, reserve_tokens=500, keep_recent_tokens=300)
    )
    messages = history(12)
    for i, m in enumerate(messages):
        m.id = f"m{i}"
    update = middleware.before_model(cast("Any", {"messages": messages}), cast("Any", None))
    assert update is not None
    new = as_state(update["messages"])
    assert isinstance(new[0], RemoveMessage)
    assert new[0].id == REMOVE_ALL_MESSAGES
    assert is_summary_message(new[1])
    parts = split_compacted(new[1:])
    kept = parts.recent
    assert kept == messages[len(messages) - len(kept) :]
    assert all(a is b for a, b in zip(kept, messages[len(messages) - len(kept) :], strict=True))
    assert_compacted(new[1:], messages, len(messages) - len(kept))
    # Under budget: no update at all.
    assert middleware.before_model(cast("Any", {"messages": messages[-2:]}), cast("Any", None)) is None


# -- the trigger counts the system prompt and the tool schemas ------------------------------------


def _long_tool(number: int) -> Any:
    def search(query: str, limit: int = 10) -> str:
        return f"results for {query}"

    search.__name__ = f"search_{number}"
    search.__doc__ = (
        f"Search index {number} of the knowledge base. " + "It covers design notes and meeting minutes. " * 12
    )
    return tool(search)


TRIGGER_OPTIONS = CompactionOptions(context_window=2600, reserve_tokens=400, keep_recent_tokens=500)
BIG_PROMPT = "You are a meticulous assistant for a software team. " * 70


@pytest.mark.parametrize("extra", ["system prompt", "tool schemas"])
@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_trigger_counts_system_prompt_and_tools(extra: str, mode: str) -> None:
    tools = [_long_tool(i) for i in range(4)] if extra == "tool schemas" else []
    prompt = BIG_PROMPT if extra == "system prompt" else None
    start = [*history(12), HumanMessage("question 12")]
    window, reserve = TRIGGER_OPTIONS.context_window, TRIGGER_OPTIONS.reserve_tokens
    # The messages alone are under the threshold ...
    assert not should_compact(start, window, reserve)
    # ... but what the model is sent is over it.
    overhead = estimate_tokens(prompt or "") + sum(
        estimate_tokens(json.dumps(convert_to_openai_tool(t))) for t in tools
    )
    assert estimate_message_tokens(start) + overhead > window - reserve

    def make(with_extra: bool) -> tuple[Any, ToolCallingFakeModel, list[CompactionResult]]:
        results: list[CompactionResult] = []
        model = ToolCallingFakeModel(messages=text_script(10))
        agent = create_agent(
            model,
            tools=tools if with_extra else [],
            system_prompt=prompt if with_extra else None,
            middleware=[CompactionMiddleware(lambda p: SUMMARY, TRIGGER_OPTIONS, on_compaction=results.append)],
            checkpointer=InMemorySaver(),
        )
        return agent, model, results

    # Without the prompt or tools, nothing compacts.
    agent, model, results = make(with_extra=False)
    await run(agent, {"messages": start}, config(), mode)
    assert results == []
    assert not any(is_summary_message(m) for m in model.requests[0])

    # With them, the first call (no overhead recorded yet) compacts in wrap_model_call,
    # and the shrink is persisted to the checkpointed state.
    agent, model, results = make(with_extra=True)
    await run(agent, {"messages": start}, config(), mode)
    assert len(results) == 1
    assert any(is_summary_message(m) for m in model.requests[0])
    state = agent.get_state(config()).values
    assert is_summary_message(state["messages"][0])
    assert len(state["messages"]) < len(start)
    assert state["messages"][-1].content == "reply 0"
    assert state[OVERHEAD_KEY] >= overhead

    # Later turns compact in before_model, using the recorded overhead: the
    # messages alone are again under the threshold when it fires.
    more = [*history(8)[1:], HumanMessage("question 13")]
    assert not should_compact([*state["messages"], *more], window, reserve)
    if mode == "sync":
        updates = list(agent.stream({"messages": more}, config(), stream_mode="updates"))
    else:
        updates = [u async for u in agent.astream({"messages": more}, config(), stream_mode="updates")]
    before = [u for u in updates if "CompactionMiddleware.before_model" in u]
    assert before
    assert before[0]["CompactionMiddleware.before_model"] is not None
    written = as_state(before[0]["CompactionMiddleware.before_model"]["messages"])
    assert isinstance(written[0], RemoveMessage)
    assert len(results) == 2
    assert sum(1 for m in model.requests[-1] if is_summary_message(m)) == 1


# -- overflow recovery -----------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_overflow_compacts_and_retries_once(mode: str) -> None:
    results: list[CompactionResult] = []
    # context_window=0: no compaction ahead of time, only overflow recovery.
    model = ToolCallingFakeModel(messages=text_script(5), overflow_above=800)
    middleware = CompactionMiddleware(lambda p: SUMMARY, CompactionOptions(), on_compaction=results.append)
    agent = create_agent(
        model, tools=[lookup], system_prompt=SYSTEM_PROMPT, middleware=[middleware], checkpointer=InMemorySaver()
    )
    start = [*history(10), HumanMessage("what next?")]
    assert estimate_message_tokens(start) > 800

    out = await run(agent, {"messages": start}, config(), mode)

    assert len(model.requests) == 2
    first, retry = model.requests
    assert len(first) == len(start) + 1  # system prompt + the whole history
    assert estimate_message_tokens(retry) <= 800
    assert is_summary_message(retry[1])
    assert_valid_anthropic_request(retry, SYSTEM_PROMPT, ends_with_user=True)
    assert len(results) == 1
    # The provider's error stated its limit: the retry was compacted to fit that window,
    # with a cut at the window's keep budget (not the forced cut that keeps one message).
    assert middleware.options.context_window == 800
    assert not results[0].forced
    assert len(retry) > 3
    assert out["messages"][-1].content == "reply 0"
    # Persisted: the checkpointed thread holds the summary, the kept messages and the reply.
    state = agent.get_state(config()).values["messages"]
    assert is_summary_message(state[0])
    assert [type(m) for m in state[-2:]] == [HumanMessage, AIMessage]
    assert state[-2].id == first[-1].id  # the kept messages are the caller's, ids and all
    assert state[-2].content == "what next?"
    assert {m.id for m in state[1:-1]} <= {m.id for m in first}

    # The next turn goes through normally on the compacted state.
    await run(agent, {"messages": [HumanMessage("and then?")]}, config(), mode)
    assert len(model.requests) == 3
    assert is_summary_message(model.requests[2][1])


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_an_overflow_raised_as_another_error_is_recovered_from_too(mode: str) -> None:
    # It propagated: only ContextOverflowError was taken for an overflow.
    model = ToolCallingFakeModel(messages=text_script(5), overflow_above=800, overflow_as_openai=True)
    middleware = CompactionMiddleware(lambda p: SUMMARY, CompactionOptions())
    agent = create_agent(model, tools=[lookup], middleware=[middleware], checkpointer=InMemorySaver())
    out = await run(agent, {"messages": [*history(10), HumanMessage("what next?")]}, config(), mode)
    assert len(model.requests) == 2
    assert estimate_message_tokens(model.requests[1]) <= 800
    assert middleware.options.context_window == 800  # the window the error states
    assert out["messages"][-1].content == "reply 0"


@pytest.mark.parametrize(
    "error",
    [
        # Anthropic's other answer (input plus max_tokens over the window), as langchain-anthropic raises it.
        "input length and `max_tokens` exceed context limit: 198000 + 8192 > 200000, decrease input length",
        # Bedrock's, through botocore: the status only in the response's metadata.
        "bedrock",
    ],
)
def test_each_provider_s_way_of_saying_too_long_is_an_overflow(error: str) -> None:
    from langchain_compaction._lc.overflow import overflowed

    class Refused(Exception):
        status_code = 400

    class ClientError(Exception):  # (botocore's shape: no status_code, a response dict)
        response: ClassVar[dict[str, Any]] = {"ResponseMetadata": {"HTTPStatusCode": 400}}

    if error == "bedrock":
        raised: Exception = ClientError("ValidationException: prompt is too long: 210019 tokens > 200000 maximum")
    else:
        raised = Refused(error)
    assert overflowed(raised)
    assert not overflowed(ValueError(str(raised)))  # the same words from no provider


def test_an_error_that_only_quotes_an_overflow_is_no_overflow() -> None:
    # A guardrail's ValueError saying "prompt is too long" was taken for the provider's: the
    # conversation was summarized, retried, and the window learned from its text.
    class Guardrail(AgentMiddleware):  # type: ignore[type-arg]
        def wrap_model_call(self, request: Any, handler: Any) -> Any:
            raise ValueError("input policy: prompt is too long: 2100 tokens > 2000 maximum for this tenant")

    calls: list[str] = []
    middleware = CompactionMiddleware(lambda p: calls.append(p) or SUMMARY, CompactionOptions())
    model = ToolCallingFakeModel(messages=text_script(5))
    agent = create_agent(model, middleware=[middleware, Guardrail()], checkpointer=InMemorySaver())
    with pytest.raises(ValueError, match="input policy"):
        agent.invoke({"messages": [*history(10), HumanMessage("what next?")]}, config())
    assert calls == []
    assert middleware.options.context_window == 0


@pytest.mark.parametrize(
    ("options", "error_states_limit"),
    [(CompactionOptions(keep_recent_tokens=2_000), True), (CompactionOptions(), False)],
    ids=["options-do-not-fit-the-stated-window", "no-limit-stated"],
)
def test_overflow_without_a_usable_stated_window_keeps_the_forced_cut(
    options: CompactionOptions, error_states_limit: bool, caplog: pytest.LogCaptureFixture
) -> None:
    class Unstated(ToolCallingFakeModel):
        def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
            if estimate_message_tokens(messages) > 800:
                self.requests.append(list(messages))
                raise ContextOverflowError("prompt is too long")
            return super()._generate(messages, *args, **kwargs)

    model_class = ToolCallingFakeModel if error_states_limit else Unstated
    model = model_class(messages=text_script(5), overflow_above=800 if error_states_limit else None)
    results: list[CompactionResult] = []
    middleware = CompactionMiddleware(lambda p: SUMMARY, options, on_compaction=results.append)
    agent = create_agent(model, tools=[lookup], system_prompt=SYSTEM_PROMPT, middleware=[middleware])
    with caplog.at_level(logging.WARNING, logger="langchain_compaction"):
        out = agent.invoke({"messages": [*history(10), HumanMessage("what next?")]})
    assert out["messages"][-1].content == "reply 0"
    assert len(results) == 1
    assert results[0].forced  # the one recovery there is without a window
    assert middleware.options.context_window == 0
    if error_states_limit:
        assert "does not fit" in caplog.text


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_second_overflow_propagates_after_exactly_one_retry(mode: str) -> None:
    model = ToolCallingFakeModel(messages=text_script(5), overflow_above=0)
    middleware = CompactionMiddleware(lambda p: SUMMARY, CompactionOptions())
    agent = create_agent(model, tools=[lookup], middleware=[middleware], checkpointer=InMemorySaver())
    start = [*history(10), HumanMessage("what next?")]

    with pytest.raises(ContextOverflowError, match="prompt is too long"):
        await run(agent, {"messages": start}, config(), mode)

    assert len(model.requests) == 2
    assert is_summary_message(model.requests[1][0])
    # Nothing was persisted: the state is the input, uncompacted.
    state = agent.get_state(config()).values["messages"]
    assert [m.content for m in state] == [m.content for m in start]
    assert not any(is_summary_message(m) for m in state)


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_overflow_with_nothing_to_compact_propagates_without_retry(mode: str) -> None:
    model = ToolCallingFakeModel(messages=text_script(5), overflow_above=0)
    agent = create_agent(model, middleware=[CompactionMiddleware(lambda p: SUMMARY)], checkpointer=InMemorySaver())
    with pytest.raises(ContextOverflowError):
        await run(agent, {"messages": [HumanMessage("one huge message " * 100)]}, config(), mode)
    assert len(model.requests) == 1


@tool
def read_log(path: str) -> str:
    """Read a log file."""
    return f"{path}: ERROR something failed at /srv/x.py:10\n" * 7_000  # about 86,000 tokens


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_a_tool_output_larger_than_the_window_is_summarized_and_the_agent_goes_on(mode: str) -> None:
    # The exchange in progress cannot be cut inside, and kept it is over any
    # request: it goes into the summary, and the model answers from that.
    window = 16_000
    prompts: list[str] = []
    calls = [
        {"name": "read_log", "args": {"path": f"/var/log/app{n}.log"}, "id": f"c{n}", "type": "tool_call"}
        for n in (1, 2)
    ]
    # The second output comes after the first was summarized whole: its exchange opens the region.
    script = iter([AIMessage("", tool_calls=[c]) for c in calls] + [AIMessage("The log shows one error, repeated.")])
    model = ToolCallingFakeModel(messages=script, overflow_above=window)
    options = CompactionOptions(context_window=window, reserve_tokens=2_000, keep_recent_tokens=3_000)
    middleware = CompactionMiddleware(lambda prompt: prompts.append(prompt) or SUMMARY, options)
    agent = create_agent(model, tools=[read_log], middleware=[middleware], checkpointer=InMemorySaver())
    out = await run(agent, {"messages": [HumanMessage("read the log please")]}, config(), mode)
    assert out["messages"][-1].content == "The log shows one error, repeated."
    last = model.requests[-1]
    assert estimate_message_tokens(last) <= window
    assert_valid_anthropic_request(last, ends_with_user=True)
    assert is_summary_message(last[0])
    assert "/var/log/app1.log: ERROR something failed at /srv/x.py:10" in "".join(prompts)  # the output was shown
    assert "/var/log/app2.log: ERROR something failed at /srv/x.py:10" in "".join(prompts)
    state = agent.get_state(config()).values["messages"]
    assert not any(isinstance(m, ToolMessage) for m in state)  # summarized, call and output together
    assert not any(getattr(m, "tool_calls", None) for m in state)


@tool
def write_todos(todos: list[str]) -> str:
    """Write the todo list."""
    return "Updated todo list to " + repr(todos)


@tool
def read_short_log(path: str) -> str:
    """Read a log file."""
    return "ERROR something failed at /srv/x.py:10\n" * 1_075  # about 11,900 tokens


def test_an_overflow_with_a_kept_exchange_and_pinned_messages_summarizes_the_exchange_whole() -> None:
    # The exchange alone fits what a request may hold past the summary; with the
    # pinned to-do list written back beside it, the request does not. The model
    # refuses it, and the retry takes the exchange into the summary.
    window = 16_000
    todos = [f"step {i}: check the service number {i} and its configuration thoroughly" for i in range(52)]
    script = iter(
        [
            AIMessage(
                "", tool_calls=[{"name": "write_todos", "args": {"todos": todos}, "id": "t1", "type": "tool_call"}]
            ),
            AIMessage("Planned."),
            AIMessage(
                "",
                tool_calls=[{"name": "read_short_log", "args": {"path": "app.log"}, "id": "c1", "type": "tool_call"}],
            ),
            AIMessage("The log shows one error."),
        ]
    )
    model = ToolCallingFakeModel(messages=script, overflow_above=window)
    summary = "## Goal\n- read logs\n\n## Critical Context\n" + "- the server at host alpha failed\n" * 180
    middleware = CompactionMiddleware(lambda prompt: summary, CompactionOptions(context_window=window))
    agent = create_agent(
        model, tools=[write_todos, read_short_log], middleware=[middleware], checkpointer=InMemorySaver()
    )
    history = [
        HumanMessage(f"q{i} " + "word " * 300) if i % 2 == 0 else AIMessage(f"a{i} " + "word " * 300) for i in range(16)
    ]
    agent.invoke({"messages": [*history, HumanMessage("plan the work")]}, config())
    out = agent.invoke({"messages": [HumanMessage("read the log please")]}, config())
    assert out["messages"][-1].content == "The log shows one error."
    last = model.requests[-1]
    assert estimate_message_tokens(last) <= window
    assert_valid_anthropic_request(last, ends_with_user=True)
    assert any("write_todos" in str(getattr(m, "tool_calls", "")) for m in last)  # the pinned list is still there
    assert all(estimate_message_tokens(r) <= window for r in model.requests)  # no request was refused


@tool
def read_long_log(path: str) -> str:
    """Read a log file."""
    return "ERROR something failed at /srv/x.py:10\n" * 1_200  # about 13,300 tokens


def test_an_overflow_after_a_kept_exchange_retries_with_the_exchange_in_the_summary() -> None:
    # The exchange fits what a request may hold past the summary's budget, but
    # the checked facts of a session full of them take the summary past it: the
    # model refuses the request, and the retry takes the exchange into the summary.
    window = 16_000
    call = {"name": "read_long_log", "args": {"path": "app.log"}, "id": "c1", "type": "tool_call"}
    model = ToolCallingFakeModel(
        messages=iter([AIMessage("", tool_calls=[call]), AIMessage("The log shows one error.")]),
        overflow_above=window,
    )
    summary = "## Goal\n- fix the services\n\n## Critical Context\n" + "- the server at host alpha failed\n" * 150
    options = CompactionOptions(context_window=window, reserve_tokens=500)
    agent = create_agent(
        model,
        tools=[read_long_log],
        middleware=[CompactionMiddleware(lambda p: summary, options)],
        checkpointer=InMemorySaver(),
    )
    history: list[BaseMessage] = []
    for i in range(30):
        history.append(
            HumanMessage(
                f"Ticket OPS-{1000 + i}: never restart svc-{i}-blue on host-{i}.corp; do not modify "
                f"src/svc_{i}/config_{i}.yaml; use branch fix/ops-{1000 + i}. " + "word " * 100
            )
        )
        history.append(
            AIMessage(
                f"Edited src/svc_{i}/handler_{i}.py. Error: KeyError 'shard_{i}' in "
                f"src/svc_{i}/db_{i}.py line {i + 10}. " + "word " * 100
            )
        )
    out = agent.invoke({"messages": [*history, HumanMessage("read the log please")]}, config())
    assert out["messages"][-1].content == "The log shows one error."
    last = model.requests[-1]
    assert estimate_message_tokens(last) <= window
    assert_valid_anthropic_request(last, ends_with_user=True)


# -- summarizer failure -----------------------------------------------------------------------

FAIL_OPTIONS = CompactionOptions(context_window=2000, reserve_tokens=500, keep_recent_tokens=400)


@pytest.mark.parametrize("where", ["before_model", "wrap_model_call"])
@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_summarizer_failure_leaves_state_unchanged(where: str, mode: str) -> None:
    failing = Failing()
    model = ToolCallingFakeModel(messages=text_script(5))
    # Over budget on the messages alone (before_model fires), or only with the
    # big system prompt (wrap_model_call fires on the first call).
    start = [*history(12 if where == "before_model" else 7), HumanMessage("go on")]
    prompt = BIG_PROMPT if where == "wrap_model_call" else None
    assert should_compact(start, 2000, 500) == (where == "before_model")
    agent = create_agent(
        model,
        system_prompt=prompt,
        middleware=[CompactionMiddleware(failing, FAIL_OPTIONS)],
        checkpointer=InMemorySaver(),
    )

    with pytest.raises(SummarizationError, match="summary model is down") as caught:
        await run(agent, {"messages": start}, config(), mode)

    assert isinstance(caught.value, CompactionError)
    assert isinstance(caught.value.__cause__, RuntimeError)
    assert failing.calls == 1
    assert model.requests == []
    state = agent.get_state(config()).values["messages"]
    assert [m.content for m in state] == [m.content for m in start]


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_summarizer_failure_uses_the_fallback(mode: str) -> None:
    results: list[CompactionResult] = []
    model = ToolCallingFakeModel(messages=text_script(5))
    middleware = CompactionMiddleware(
        Failing(), FAIL_OPTIONS, fallback=lambda p: "## Goal\n- fallback summary", on_compaction=results.append
    )
    agent = create_agent(model, middleware=[middleware], checkpointer=InMemorySaver())
    await run(agent, {"messages": [*history(12), HumanMessage("go on")]}, config(), mode)
    assert len(results) == 1
    assert results[0].fallback_used
    state = agent.get_state(config()).values["messages"]
    assert is_summary_message(state[0])
    assert "fallback summary" in state[0].content


async def test_an_async_on_compaction_is_awaited_under_ainvoke_and_refused_under_invoke() -> None:
    told: list[CompactionResult] = []

    async def on_compaction(result: CompactionResult) -> None:
        told.append(result)

    start = [*history(12), HumanMessage("go on")]
    model = ToolCallingFakeModel(messages=text_script(5))
    middleware = CompactionMiddleware(lambda p: SUMMARY, FAIL_OPTIONS, on_compaction=on_compaction)
    agent = create_agent(model, middleware=[middleware], checkpointer=InMemorySaver())
    await agent.ainvoke({"messages": start}, config("async"))
    assert len(told) == 1
    assert is_summary_message(agent.get_state(config("async")).values["messages"][0])

    # On the sync path nothing could await it: refused, naming the fix, and the thread left as it was.
    with pytest.raises(ConfigurationError, match=r"on_compaction=.*plain function.*ainvoke"):
        agent.invoke({"messages": start}, config("sync"))
    assert len(told) == 1
    assert [m.content for m in agent.get_state(config("sync")).values["messages"]] == [m.content for m in start]


# -- cost per turn, events, transient edits, construction ---------------------------------------------


def test_token_counts_are_cached_per_message() -> None:
    counted: list[int] = []

    def counter(messages: Sequence[BaseMessage]) -> int:
        counted.append(len(messages))
        return count_tokens_approximately(messages)

    results: list[CompactionResult] = []
    turns = 60
    options = CompactionOptions(
        context_window=5000, reserve_tokens=1000, keep_recent_tokens=1200, token_counter=counter
    )
    model = ToolCallingFakeModel(messages=tool_script(turns))
    agent = create_agent(
        model,
        tools=[lookup, add],
        system_prompt=SYSTEM_PROMPT,
        middleware=[CompactionMiddleware(lambda p: SUMMARY, options, on_compaction=results.append)],
        checkpointer=InMemorySaver(),
    )
    for turn in range(turns):
        agent.invoke({"messages": [HumanMessage(f"question {turn}")]}, config())
    assert len(results) >= 2
    # The bridges the compactions wrote (one after each summary whose kept part
    # started with the assistant), found in every checkpoint of the thread.
    bridges = {
        m.id
        for snapshot in agent.get_state_history(config())
        for m in snapshot.values.get("messages", [])
        if is_bridge_message(m)
    }
    assert len(bridges) <= len(results)
    # Every message ever created: per turn a question, a tool call, its results
    # and an answer, plus each summary and each bridge.
    created = sum(4 + (turn % 5 == 0) for turn in range(turns)) + len(results) + len(bridges)
    # Each message is counted once (the system prompt once, each summary and
    # each bridge once more when finish() reports the compacted size), not once
    # per turn it stays in view.
    assert len(counted) <= created + len(results) + len(bridges) + 1
    seen = sum(len(r) for r in model.requests)
    assert seen > 5 * len(counted)


# Before Python 3.11 LangGraph cannot hand an async hook or create_agent's model node the run's
# callbacks (no current config in an asyncio task): custom events and streamed tokens never reach them.
NO_ASYNC_CALLBACKS = pytest.mark.skipif(
    sys.version_info < (3, 11), reason="before Python 3.11 an async node's callbacks are not current"
)


@pytest.mark.parametrize("mode", ["sync", pytest.param("async", marks=NO_ASYNC_CALLBACKS)])
async def test_compaction_is_dispatched_as_a_custom_event(mode: str) -> None:
    class Events(BaseCallbackHandler):
        def __init__(self) -> None:
            self.events: list[tuple[str, Any]] = []

        def on_custom_event(self, name: str, data: Any, **kwargs: Any) -> None:
            self.events.append((name, data))

    handler = Events()
    model = ToolCallingFakeModel(messages=text_script(5))
    agent = create_agent(model, middleware=[CompactionMiddleware(lambda p: SUMMARY, FAIL_OPTIONS)])
    await run(agent, {"messages": [*history(12), HumanMessage("go on")]}, {"callbacks": [handler]}, mode)
    assert [name for name, _ in handler.events] == [COMPACTION_EVENT]
    record = handler.events[0][1]
    json.dumps(record)  # plain data
    assert record["messages_removed"] > 0
    assert record["summary"].startswith("## Goal")


@pytest.mark.parametrize("where", ["before_model", "wrap_model_call"])
@pytest.mark.parametrize("mode", ["sync", pytest.param("async", marks=NO_ASYNC_CALLBACKS)])
async def test_summary_calls_do_not_stream_to_the_user(where: str, mode: str) -> None:
    # One reply per summary call (a region may be summarized in chunks).
    summary_model = GenericFakeChatModel(messages=iter([AIMessage("## Goal\n- SECRET-SUMMARY-TEXT")] * 10))
    model = ToolCallingFakeModel(messages=text_script(5))
    agent = create_agent(
        model,
        system_prompt=BIG_PROMPT if where == "wrap_model_call" else None,
        middleware=[CompactionMiddleware(summary_model, FAIL_OPTIONS)],
    )
    start = [*history(12 if where == "before_model" else 7), HumanMessage("go on")]
    payload: Any = {"messages": start}
    chunks: list[BaseMessage]
    if mode == "sync":
        chunks = [cast("BaseMessage", chunk) for chunk, _ in agent.stream(payload, stream_mode="messages")]
    else:
        chunks = [cast("BaseMessage", chunk) async for chunk, _ in agent.astream(payload, stream_mode="messages")]
    # The summary was made (the model saw it) ...
    assert any("SECRET-SUMMARY-TEXT" in str(m.content) for m in model.requests[0])
    # ... and none of the summary call's tokens reached the stream, while the
    # agent's own reply streamed word by word.
    tokens = [c for c in chunks if isinstance(c, AIMessageChunk)]
    assert "reply 0" in "".join(str(c.content) for c in tokens)
    assert not any("SECRET" in str(c.content) for c in tokens)
    # Nor does the state write: the summary, the bridge and the removal of the
    # old list are written as plain dicts, which the messages stream skips.
    assert not any("SECRET" in str(c.content) for c in chunks)
    assert not any(c.type == "remove" or is_summary_message(c) for c in chunks)


def test_wrap_persists_the_states_messages_not_an_outer_middlewares_transient_edit() -> None:
    from langchain.agents.middleware import AgentMiddleware

    class Redact(AgentMiddleware[Any, Any, Any]):
        """An outer middleware that edits the request only (as ContextEditingMiddleware does)."""

        def wrap_model_call(self, request: ModelRequest[Any], handler: Callable[..., Any]) -> Any:
            *head, last = request.messages
            return handler(request.override(messages=[*head, last.model_copy(update={"content": "[redacted]"})]))

    model = ToolCallingFakeModel(messages=text_script(5))
    agent = create_agent(
        model,
        system_prompt=BIG_PROMPT,
        middleware=[Redact(), CompactionMiddleware(lambda p: SUMMARY, FAIL_OPTIONS)],
        checkpointer=InMemorySaver(),
    )
    start = [*history(7), HumanMessage("go on")]
    agent.invoke({"messages": start}, config())
    sent = model.requests[0]
    assert is_summary_message(sent[1])
    assert sent[-1].content == "[redacted]"
    state = agent.get_state(config()).values["messages"]
    assert is_summary_message(state[0])
    assert state[-2].content == "go on"  # the state's own message, not the redacted copy


class TransientNote(AgentMiddleware):
    """An outer middleware that adds a note to the model request only (never to the state)."""

    def wrap_model_call(self, request: Any, handler: Any) -> Any:
        return handler(request.override(messages=[*request.messages, HumanMessage("transient note")]))


def test_transient_request_message_is_not_written_into_the_state() -> None:
    """A message an outer middleware adds to the request only never lands in the checkpoint."""
    middleware = CompactionMiddleware(short_summary, SMALL_WINDOW)
    model = ToolCallingFake(messages=iter([AIMessage(words("reply", 20)) for _ in range(50)]))
    agent = create_agent(
        model,
        system_prompt="You are careful. " * 200,  # a large prompt: only wrap_model_call sees it
        middleware=[TransientNote(), middleware],
        checkpointer=InMemorySaver(),
    )
    # First call of the thread: a history under the threshold on its own, over it with the prompt.
    history: list[BaseMessage] = []
    for i in range(14):
        history += [HumanMessage(words(f"q{i}")), AIMessage(words(f"a{i}"))]
    history.append(HumanMessage("go on"))
    state = agent.invoke({"messages": history}, cfg("transient"))
    if not any(is_summary_message(m) for m in state["messages"]):
        # The request was not the state's list (the note was added to it): the compaction made in the
        # model call may be left out of the state, for before_model to make on the next call.
        state = agent.invoke({"messages": [HumanMessage("and then?")]}, cfg("transient"))
    assert any(is_summary_message(m) for m in state["messages"]), "the state was never compacted"
    copies = sum(1 for m in state["messages"] if m.content == "transient note")
    assert copies == 0, f"{copies} copies of the request-only note were written into the state"
    saved = [s for s in agent.get_state_history(cfg("transient")) if "messages" in s.values]
    assert not [s for s in saved if any(m.content == "transient note" for m in s.values["messages"])]


# -- compacted mid-loop: the bridge ---------------------------------------------------------------


def _mid_loop_start() -> list[BaseMessage]:
    """A thread that stopped inside a tool exchange: a big lookup result is the last message."""
    messages = [*history(7), HumanMessage("look up the release notes", id="ask")]
    messages.append(
        AIMessage("", id="call", tool_calls=[{"name": "lookup", "args": {"query": "notes"}, "id": "c-notes"}])
    )
    messages.append(
        ToolMessage("release notes: " + "the parser now strips whitespace. " * 38, tool_call_id="c-notes", id="res")
    )
    for i, m in enumerate(messages):
        m.id = m.id or f"m{i}"
    return messages


def test_before_model_mid_loop_writes_summary_bridge_then_the_exchange() -> None:
    middleware = CompactionMiddleware(lambda prompt: SUMMARY, FAIL_OPTIONS)
    messages = _mid_loop_start()
    # With the system prompt and tools recorded as 1,000 tokens, the state is over budget.
    state = {"messages": messages, OVERHEAD_KEY: 1000}
    update = middleware.before_model(cast("Any", state), cast("Any", None))
    assert update is not None
    new = as_state(update["messages"])
    assert isinstance(new[0], RemoveMessage)
    parts = assert_compacted(new[1:], messages, len(messages) - 2)
    assert parts.bridge is not None
    assert new[1:] == [parts.summary, parts.bridge, messages[-2], messages[-1]]
    assert new[3] is messages[-2]
    assert new[4] is messages[-1]
    assert ANTHROPIC._get_request_payload(new[1:])["messages"][0]["role"] == "user"


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_wrap_model_call_mid_loop_persists_the_bridge_and_the_next_compaction_replaces_it(mode: str) -> None:
    prompts: list[str] = []

    def summarize(prompt: str) -> str:
        prompts.append(prompt)
        return SUMMARY

    results: list[CompactionResult] = []
    model = ToolCallingFakeModel(messages=text_script(5))
    agent = create_agent(
        model,
        tools=[lookup],
        system_prompt=BIG_PROMPT,
        middleware=[CompactionMiddleware(summarize, FAIL_OPTIONS, on_compaction=results.append)],
        checkpointer=InMemorySaver(),
    )
    start = _mid_loop_start()
    # The state alone is under the threshold; with the big system prompt the
    # first request is over it, so wrap_model_call compacts and persists.
    assert not should_compact(start, FAIL_OPTIONS.context_window, FAIL_OPTIONS.reserve_tokens)
    await run(agent, {"messages": start}, config(), mode)
    assert len(results) == 1
    # The model was sent [system prompt, summary, bridge, call, result].
    sent = model.requests[0]
    assert sent[0].content == BIG_PROMPT
    parts = split_compacted(sent[1:])
    assert parts.bridge is not None
    assert [m.id for m in parts.recent] == ["call", "res"]
    assert_valid_anthropic_request(sent, BIG_PROMPT, ends_with_user=True)
    # The checkpointed state holds the same layout, then the reply.
    state = agent.get_state(config()).values["messages"]
    stored = split_compacted(state)
    assert stored.bridge is not None
    assert stored.bridge.id == parts.bridge.id
    assert [m.id for m in stored.recent[:2]] == ["call", "res"]
    assert stored.recent[2].content == "reply 0"
    assert stored.recent[:2] == start[-2:]

    # The next turn compacts again: one summary, the old bridge gone. The big
    # system prompt is fixed: the compaction plans over what it can remove, so
    # it lands under the threshold at once (0.2 compacted a second time, keeping
    # half as much).
    more = [*history(8)[1:], HumanMessage("question 13")]
    await run(agent, {"messages": more}, config(), mode)
    assert [r.repeated for r in results] == [False, False]
    budget = FAIL_OPTIONS.budget
    assert budget.threshold is not None
    assert results[1].compacted_tokens <= budget.threshold
    state = agent.get_state(config()).values["messages"]
    assert sum(1 for m in state if is_summary_message(m)) == 1
    assert sum(1 for m in state if is_bridge_message(m)) <= 1
    assert all(m.id != stored.bridge.id for m in state)
    split_compacted(state)
    assert all(BRIDGE_TEXT not in p for p in prompts)
    for request in model.requests:
        assert_valid_anthropic_request(request, BIG_PROMPT, ends_with_user=True)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"options": {"context_window": 1000}}, "options"),
        ({"custom_instructions": 3}, "custom_instructions"),
        ({"on_compaction": "print"}, "on_compaction"),
        ({"cache_size": 0}, "cache_size"),
        ({"fallback": 42}, "fallback"),
    ],
)
def test_bad_arguments_name_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigurationError, match=field) as caught:
        CompactionMiddleware(lambda p: SUMMARY, **kwargs)
    assert caught.value.field == field
    assert isinstance(caught.value, ValueError)


def test_import_without_langchain_names_the_extra() -> None:
    # A fresh interpreter in which ``langchain`` cannot be imported (a None entry
    # in sys.modules makes every ``import langchain...`` fail), as when the
    # extra is not installed.
    code = (
        "import sys\n"
        "sys.modules['langchain'] = None\n"
        "try:\n"
        "    import langchain.agents\n"
        "except ImportError:\n"
        "    pass\n"
        "else:\n"
        "    raise SystemExit('langchain was not blocked')\n"
        "import langchain_compaction\n"  # the package itself does not need langchain
        "import langchain_compaction.middleware\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode != 0
    assert "ImportError" in done.stderr
    assert 'pip install "langchain-compaction[agents]"' in done.stderr
    assert "not blocked" not in done.stderr


def test_event_name_matches_the_langgraph_node() -> None:
    # One event name for every adapter, so a listener catches all compactions.
    from langchain_compaction import graph

    assert graph.COMPACTION_EVENT == COMPACTION_EVENT


class _ThinkingClaude(BaseChatModel):
    """Claude with extended thinking: a turn opens with thinking, then one tool call per reply, ``replies`` a turn.

    Over ``window`` tokens it answers as the API does: "prompt is too long".
    """

    seen: list[list[BaseMessage]] = Field(default_factory=list)
    step: int = 0
    replies: int = 25
    window: int = 0

    @property
    def _llm_type(self) -> str:
        return "thinking-fake"

    def bind_tools(self, tools: Any, **kwargs: Any) -> _ThinkingClaude:
        return self

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        self.seen.append(list(messages))
        size = count_tokens_approximately(messages)
        if self.window and size > self.window:
            raise ContextOverflowError(f"prompt is too long: {size} tokens > {self.window} maximum")
        step, self.step = self.step, self.step + 1
        if step >= self.replies:
            return ChatResult(generations=[ChatGeneration(message=AIMessage([{"type": "text", "text": "Done."}]))])
        n = len(self.seen)
        call = {"name": "read_file", "args": {"path": f"src/m{n}.py"}, "id": f"toolu_{n}"}
        blocks: list[Any] = [{"type": "tool_use", "id": call["id"], "name": "read_file", "input": call["args"]}]
        if isinstance(messages[-1], HumanMessage):  # a turn opens (after the user, or the summary's bridge)
            blocks.insert(0, {"type": "thinking", "thinking": "One file at a time.", "signature": "c2ln"})
        reply = AIMessage(blocks, tool_calls=[call])  # type: ignore[list-item]
        return ChatResult(generations=[ChatGeneration(message=reply)])


@tool("read_file")
def _read_file(path: str) -> str:
    """Read a file."""
    return f"contents of {path}\n" + f"def function_{path.replace('/', '_')}(): pass\n" * 40


def test_a_compaction_inside_a_thinking_tool_loop_keeps_the_loop_with_its_thinking_block() -> None:
    """Claude with extended thinking: every request's tool loop in progress still opens with its thinking block."""
    model = _ThinkingClaude()
    middleware = CompactionMiddleware(short_summary, CompactionOptions(context_window=12_000))
    agent = create_agent(model, tools=[_read_file], middleware=[middleware], checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "thinking"}, "recursion_limit": 200}
    for turn in range(2):
        model.step = 0
        agent.invoke({"messages": [HumanMessage(f"Read every module of task {turn}.")]}, config)
    sent = [request for request in model.seen if any(is_summary_message(m) for m in request)]
    assert sent, "the loop should have compacted"
    for request in model.seen:
        assert_valid_anthropic_request(request, ends_with_user=True, thinking=True)


def test_a_thinking_tool_loop_longer_than_the_window_is_summarized_whole() -> None:
    """A loop that cannot be cut inside and outgrows the window goes into the summary whole, not past the window."""
    model = _ThinkingClaude(replies=80, window=12_000)
    middleware = CompactionMiddleware(short_summary, CompactionOptions(context_window=12_000))
    agent = create_agent(model, tools=[_read_file], middleware=[middleware], checkpointer=InMemorySaver())
    out = agent.invoke(
        {"messages": [HumanMessage("Read every module.")]}, {**cfg("long-loop"), "recursion_limit": 1_000}
    )
    assert out["messages"][-1].text == "Done."  # no "prompt is too long" escaped
    # Compacted ahead of time by the library's estimate; a request the provider's count finds over the window
    # is compacted again and retried (the fake counts with LangChain's approximation).
    over = sum(count_tokens_approximately(request) > 12_000 for request in model.seen)
    assert over <= 3, f"{over} requests over the window"
    assert sum(any(is_summary_message(m) for m in request) for request in model.seen) > 10
    for request in model.seen:
        assert_valid_anthropic_request(request, ends_with_user=True, thinking=True)


def test_a_model_that_sends_previous_response_id_is_said_to_defeat_compaction(caplog: pytest.LogCaptureFixture) -> None:
    """With use_previous_response_id, OpenAI reads its stored conversation, not the summary: said once."""

    class StoredResponses(BaseChatModel):
        """What ChatOpenAI(use_previous_response_id=True) says of itself (langchain-openai is not a test dependency)."""

        use_previous_response_id: bool = True

        @property
        def _llm_type(self) -> str:
            return "stored-responses"

        def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> ChatResult:
            return ChatResult(generations=[ChatGeneration(message=AIMessage("ok"))])

    model = StoredResponses()
    agent = create_agent(
        model, middleware=[CompactionMiddleware(short_summary, CompactionOptions(context_window=8_000))]
    )
    with caplog.at_level(logging.WARNING, logger="langchain_compaction"):
        for turn in range(3):
            agent.invoke({"messages": [HumanMessage(f"question {turn}")]})
    said = [r.getMessage() for r in caplog.records if "previous_response_id" in r.getMessage()]
    assert len(said) == 1, said


def test_a_preparation_that_took_a_thinking_loop_whole_is_not_applied_over_the_replies_since() -> None:
    """Prepared mid-loop, the summary took the loop whole; the replies since would open it without thinking."""
    from langchain_compaction.features import PrepareAhead, default_features

    model = _ThinkingClaude(replies=60)
    middleware = CompactionMiddleware(
        short_summary, CompactionOptions(context_window=12_000), features=[*default_features(), PrepareAhead(at=0.6)]
    )
    agent = create_agent(model, tools=[_read_file], middleware=[middleware], checkpointer=InMemorySaver())
    agent.invoke({"messages": [HumanMessage("Read every module.")]}, {**cfg("prepared-loop"), "recursion_limit": 1_000})
    assert sum(any(is_summary_message(m) for m in request) for request in model.seen) > 5
    for request in model.seen:
        assert_valid_anthropic_request(request, ends_with_user=True, thinking=True)


def test_an_on_compaction_observer_that_raises_is_logged_and_the_compaction_goes_ahead(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A metrics hook's hiccup threw away every compaction it was told about
    # and failed the turn, turn after turn, while each paid for a summary.
    seen: list[CompactionResult] = []

    def flaky(result: CompactionResult) -> None:
        seen.append(result)
        raise ConnectionError("the metrics endpoint is down")

    model = ToolCallingFakeModel(messages=text_script(30))
    agent = create_agent(
        model,
        middleware=[CompactionMiddleware(short_summary, CompactionOptions(context_window=3_000), on_compaction=flaky)],
        checkpointer=InMemorySaver(),
    )
    with caplog.at_level(logging.ERROR, logger="langchain_compaction"):
        for turn in range(30):
            agent.invoke({"messages": [HumanMessage(words(f"question {turn}", 120))]}, cfg("observed"))
    assert seen, "nothing compacted: the test proves nothing"
    assert "on_compaction raised" in caplog.text
    state = agent.get_state(cfg("observed")).values["messages"]
    assert is_summary_message(state[0])
    assert len(model.requests) == 30


def test_two_tools_of_one_name_and_description_are_counted_apart() -> None:
    # The schema's count was kept by name and description: a tool whose parameters list 2,000 files
    # was counted as the one-file tool seen first, in every conversation of the process.
    from typing import Literal

    from langchain_core.tools import StructuredTool
    from pydantic import create_model

    def opener(files: list[str]) -> StructuredTool:
        arguments = create_model("Args", path=(Literal[tuple(files)], ...))
        return StructuredTool.from_function(
            lambda path: path, name="open_file", description="Open.", args_schema=arguments
        )

    middleware = CompactionMiddleware(short_summary, CompactionOptions(context_window=200_000))
    overheads = []
    for files in (["a.py"], [f"src/module_{i}/file_{i}.py" for i in range(2_000)]):
        model = ToolCallingFakeModel(messages=text_script(1))
        agent = create_agent(model, tools=[opener(files)], middleware=[middleware], checkpointer=InMemorySaver())
        agent.invoke({"messages": [HumanMessage("open it")]}, cfg(len(files)))
        overheads.append(agent.get_state(cfg(len(files))).values[OVERHEAD_KEY])
    assert overheads[1] > overheads[0] + 10_000


class StructuredModel(GenericFakeChatModel):
    """A fake model that logs the tools bound to it; with ``profile={"structured_output": True}`` LangChain deems it native."""

    bound: list[list[str]] = Field(default_factory=list)

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> StructuredModel:
        self.bound.append(sorted(convert_to_openai_tool(t)["function"]["name"] for t in tools))
        return self


@pytest.mark.parametrize("native", [False, True])
def test_a_bare_response_format_is_counted_as_langchain_sends_it(native: bool) -> None:
    # create_agent wraps a bare schema in AutoStrategy and binds it as a tool for a model without native
    # structured output: that ~1,500-token tool was left out of the overhead (62 tokens recorded against
    # 2,486 for ToolStrategy(schema) in the probe), and requests went over the window.
    from langchain.agents.structured_output import ProviderStrategy, ToolStrategy
    from pydantic import create_model

    described = {
        f"field_{i}": (str, Field(description=f"field {i}: " + "the figure for the quarter " * 4)) for i in range(25)
    }
    answer = create_model("Answer", __doc__="The answer.", **described)  # type: ignore[call-overload]
    reply = {f"field_{i}": "x" for i in range(25)}
    figures = []
    for response_format in (answer, ProviderStrategy(answer) if native else ToolStrategy(answer)):
        said = (
            AIMessage(json.dumps(reply))
            if native
            else AIMessage("", tool_calls=[{"name": "Answer", "args": reply, "id": "c1"}])
        )
        profile: Any = {"structured_output": True} if native else None
        model = StructuredModel(messages=iter([said]), profile=profile)
        middleware = CompactionMiddleware(short_summary, CompactionOptions(context_window=200_000))
        agent = create_agent(
            model,
            tools=[lookup],
            middleware=[middleware],
            response_format=response_format,
            checkpointer=InMemorySaver(),
        )
        agent.invoke({"messages": [HumanMessage("answer it")]}, config())
        figures.append((model.bound[-1], agent.get_state(config()).values[OVERHEAD_KEY]))
    # The same tools were sent both ways, and the same figure recorded.
    assert figures[0] == figures[1]
    assert ("Answer" in figures[0][0]) is not native


@NO_ASYNC_CALLBACKS
async def test_astream_events_leaves_the_summary_out_when_its_tag_is_excluded() -> None:
    # astream_events shows every chat model's tokens, the summarizer's too (LangGraph honours the
    # nostream tag only in stream_mode="messages"); a UI excludes the library's tag.
    from langchain_compaction.summarizers.chat_model import SUMMARY_TAG

    def agent() -> Any:
        summary_model = GenericFakeChatModel(messages=iter([AIMessage("## Goal\n- SECRET-SUMMARY-TEXT")] * 10))
        middleware = [CompactionMiddleware(summary_model, FAIL_OPTIONS)]
        return create_agent(ToolCallingFakeModel(messages=text_script(5)), middleware=middleware)

    payload: Any = {"messages": [*history(12), HumanMessage("go on")]}

    async def streamed(**kwargs: Any) -> str:
        events = agent().astream_events(payload, version="v2", **kwargs)
        return "".join([str(e["data"]["chunk"].content) async for e in events if e["event"] == "on_chat_model_stream"])

    assert "SECRET" in await streamed()  # (what the README warns of)
    shown = await streamed(exclude_tags=[SUMMARY_TAG])
    assert "reply 0" in shown
    assert "SECRET" not in shown


def test_langchains_tool_selector_picks_tools_for_the_users_request_after_a_mid_loop_compaction() -> None:
    """``LLMToolSelectorMiddleware`` reads the last user message: after a mid-loop compaction it is the request."""
    from langchain.agents.middleware import LLMToolSelectorMiddleware
    from langchain_core.runnables import RunnableLambda

    @tool
    def weather(city: str) -> str:
        """Get the weather for a city."""
        return f"weather in {city}: " + "sunny and warm " * 80

    @tool
    def stocks(ticker: str) -> str:
        """Get a stock price."""
        return "price 100"

    class Looping(BaseChatModel):
        calls: int = 0

        @property
        def _llm_type(self) -> str:
            return "looping"

        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            return self

        def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> ChatResult:
            self.calls += 1
            call = {"name": "weather", "args": {"city": f"city{self.calls}"}, "id": f"w{self.calls}"}
            reply = AIMessage("", tool_calls=[call]) if self.calls < 12 else AIMessage("final report " * 40)
            return ChatResult(generations=[ChatGeneration(message=reply)])

    asked: list[str] = []

    class Selector(Looping):
        def with_structured_output(self, schema: Any, **kwargs: Any) -> Any:
            return RunnableLambda(lambda msgs: asked.append(str(msgs[-1].content)) or {"tools": ["weather"]})

    question = "What is the weather in all twelve of my cities? Please report on each one in detail."
    compaction = CompactionMiddleware(ExtractiveSummarizer(), CompactionOptions(context_window=3_000))
    agent = create_agent(
        Looping(),
        tools=[weather, stocks],
        system_prompt="You are helpful.",
        middleware=[LLMToolSelectorMiddleware(model=Selector(), max_tools=1), compaction],
        checkpointer=InMemorySaver(),
    )
    out = agent.invoke({"messages": [HumanMessage(question)]}, cfg("selector"))
    assert any(is_summary_message(m) for m in out["messages"])  # compacted mid-loop
    assert len(asked) == 12
    assert all(question in query for query in asked)


@pytest.mark.parametrize(("pages", "told"), [(600, 1), (40, 0)])
def test_a_tool_output_too_large_to_keep_is_told_once_naming_the_tool(caplog, pages: int, told: int) -> None:
    """A retrieval larger than a request may hold is summarized before the model reads it: said once, with the fix.

    A model shown the question again retrieves again; without the warning an
    agent loops to LangGraph's recursion limit with nothing saying why. The
    model is told too, in the user turn after the summary: the call, the
    output's size, and to ask for less (a model told nothing called the tool
    again the same way). A document the request holds is kept and read:
    nothing to tell.
    """

    @tool
    def retrieve(query: str) -> str:
        """Retrieve the policy document."""
        return "Refunds are accepted within 30 days of delivery. " * pages

    def script() -> Iterator[AIMessage]:
        for turn in range(2):
            call = {"name": "retrieve", "args": {"query": f"refunds {turn}"}, "id": f"r{turn}", "type": "tool_call"}
            yield AIMessage("", tool_calls=[call])
            yield AIMessage(f"Per the policy, refunds are accepted within 30 days ({turn}).")

    model = ToolCallingFakeModel(messages=script())
    agent = create_agent(
        model,
        tools=[retrieve],
        middleware=[CompactionMiddleware(ExtractiveSummarizer(), CompactionOptions(context_window=6_000))],
        checkpointer=InMemorySaver(),
    )
    with caplog.at_level(logging.WARNING, logger="langchain_compaction"):
        for turn in range(2):
            agent.invoke({"messages": [HumanMessage(f"What is the refund policy? ({turn})")]}, cfg("rag"))
    said = [r.getMessage() for r in caplog.records if "before the model read it" in r.getMessage()]
    assert len(said) == told
    assert all("(retrieve, " in line and "make the tool return less" in line for line in said)
    # What the model read after each retrieval: the output itself, or the summary and a turn that says why.
    last = [request[-1] for request in model.requests]
    notes = [m.text for m in last if isinstance(m, HumanMessage) and "too large to keep" in m.text]
    assert len(notes) == 2 * told
    assert all(re.search(r"\(retrieve, [\d,]+ tokens\)", note) and "ask for less" in note for note in notes)
    assert all("What is the refund policy?" in note for note in notes)  # the request still comes last
