"""CompactionMiddleware under middleware that edit or add to the request for one call (found by an exploratory probe).

``ContextEditingMiddleware`` clears old tool outputs in the request only; a
``@wrap_model_call`` adds retrieved context to it. The compaction made for such
a request describes the edits, not the state.
"""

from __future__ import annotations

import itertools
import json
import re
from typing import Any

import pytest
from helpers_turns import ToolCallingFake
from langchain.agents import create_agent
from langchain.agents.middleware import (
    ClearToolUsesEdit,
    ContextEditingMiddleware,
    ModelResponse,
    after_model,
    wrap_model_call,
)
from langchain_core.exceptions import ContextOverflowError
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.store.memory import InMemoryStore
from pydantic import Field

from langchain_compaction import CompactionMiddleware, CompactionOptions, CompactionResult, ExtractiveSummarizer
from langchain_compaction.features import Archive
from langchain_compaction.tokens import estimate_message_tokens

FILL = "the quarterly report figures and the outlook section need another careful pass today "
MARK = re.compile(r"M\d{4}")


class Agent(BaseChatModel):
    """Calls ``search`` after a user turn and answers after its result; over ``limit`` tokens it says so."""

    n: int = 0
    limit: int = 10**9
    issued: list[str] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> Agent:
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        size = estimate_message_tokens(messages)
        if size > self.limit:
            raise ContextOverflowError(f"prompt is too long: {size} tokens > {self.limit} maximum")
        self.n += 1
        if isinstance(messages[-1], ToolMessage):
            message = AIMessage(f"answer {self.mark()}: " + FILL * 2)
        else:
            call = {"name": "search", "args": {"query": f"q{self.n}"}, "id": f"c{self.n}", "type": "tool_call"}
            message = AIMessage("", tool_calls=[call])
        return ChatResult(generations=[ChatGeneration(message=message)])

    def mark(self) -> str:
        self.issued.append(f"M{len(self.issued) + 1:04d}")
        return self.issued[-1]


def test_an_overflow_under_context_editing_loses_no_tool_output() -> None:
    """The window is learned from the provider's error: the compaction made of the cleared copies stays out of the state."""
    model = Agent(limit=4_000)

    @tool
    def search(query: str) -> str:
        """Search the notes."""
        return f"result {model.mark()} for {query}: " + FILL * 5

    def echo(prompt: str) -> str:
        return "## Goal\n- keep going\n\n## Critical Context\n- " + " ".join(sorted(set(MARK.findall(prompt))))

    agent = create_agent(
        model,
        [search],
        system_prompt="You are helpful.",
        middleware=[
            ContextEditingMiddleware(edits=[ClearToolUsesEdit(trigger=2000, keep=2)]),
            CompactionMiddleware(echo, CompactionOptions()),
        ],
        checkpointer=InMemorySaver(),
    )
    config = {"configurable": {"thread_id": "t"}}
    for turn in range(40):
        agent.invoke({"messages": [HumanMessage(f"question {turn} {model.mark()}: " + FILL * 2)]}, config)
    state = json.dumps([m.model_dump() for m in agent.get_state(config).values["messages"]], default=str)
    assert [m for m in model.issued if m not in state] == []


def test_context_added_for_each_call_is_made_room_for_in_the_state_not_summarized_every_call() -> None:
    """The state alone fits; with the added context the request does not: ``before_model`` leaves room for it."""
    model = Agent()
    calls = itertools.count()

    @tool
    def search(query: str) -> str:
        """Search the notes."""
        return f"result for {query}: " + FILL * 5

    def summarizer(prompt: str) -> str:
        return f"## Goal\n- answer the questions (summary {next(calls)})"

    docs = "retrieved context: " + "the design doc says the API is versioned and stable " * 60

    @wrap_model_call
    def inject(request: Any, handler: Any) -> Any:
        return handler(request.override(messages=[SystemMessage(docs), *request.messages]))

    options = CompactionOptions(context_window=4_000, reserve_tokens=400, keep_recent_tokens=700)
    agent = create_agent(
        model,
        [search],
        system_prompt="You are helpful.",
        middleware=[inject, CompactionMiddleware(summarizer, options)],
        checkpointer=InMemorySaver(),
    )
    config = {"configurable": {"thread_id": "t"}}
    for turn in range(50):
        agent.invoke({"messages": [HumanMessage(f"question {turn}: " + FILL * 2)]}, config)
    written = len(
        {
            str(m.content)
            for snap in agent.get_state_history(config)
            for m in snap.values.get("messages", [])[:1]
            if isinstance(m, SystemMessage)
        }
    )
    made = next(calls)
    assert written >= 3
    assert made <= written + 2, f"{made} summaries made for {written} written"


def _trim_arguments(message: BaseMessage) -> BaseMessage:
    assert isinstance(message, AIMessage)
    calls = [{**c, "args": {"path": c["args"]["path"], "text": "[trimmed]"}} for c in message.tool_calls]
    return message.model_copy(update={"tool_calls": calls})


def _fail_result(message: BaseMessage) -> BaseMessage:
    return message.model_copy(update={"status": "error"})


@pytest.mark.parametrize(("edited", "edit"), [(AIMessage, _trim_arguments), (ToolMessage, _fail_result)])
def test_a_request_edited_outside_the_content_is_not_written_to_the_state(edited: type, edit: Any) -> None:
    """An outer middleware edits the oldest tool calls' arguments (or results' status) for one call, ids and text kept.

    The compaction made from that request was written to the state: the
    summarizer saw "[trimmed]", and the arguments' markers were in neither the
    state nor the summary.
    """

    @tool
    def write_file(path: str, text: str) -> str:
        """Write a file."""
        return "ok"

    @wrap_model_call
    def trim(request: Any, handler: Any) -> Any:
        messages = list(request.messages)
        for i in [i for i, m in enumerate(messages) if isinstance(m, edited)][:3]:
            messages[i] = edit(messages[i])
        return handler(request.override(messages=messages))

    prompts: list[str] = []

    def summarizer(prompt: str) -> str:
        prompts.append(prompt)
        return "## Goal\n- write the files\n\n## Critical Context\n- " + " ".join(sorted(set(MARK.findall(prompt))))

    agent = create_agent(
        ToolCallingFake(messages=(AIMessage("done") for _ in itertools.count())),
        [write_file],
        system_prompt="You are a coding agent. Guide: " + FILL * 110,
        middleware=[trim, CompactionMiddleware(summarizer, CompactionOptions(context_window=8_000))],
        checkpointer=InMemorySaver(),
    )
    history: list[BaseMessage] = [HumanMessage("write the files", id="h0")]
    for i in range(10):
        call = {"name": "write_file", "args": {"path": f"f{i}.py", "text": f"M{i:04d} " + FILL * 30}, "id": f"c{i}"}
        history += [AIMessage("", tool_calls=[call], id=f"a{i}"), ToolMessage("ok", tool_call_id=f"c{i}", id=f"t{i}")]
    history.append(HumanMessage("now run the tests", id="h1"))
    config = {"configurable": {"thread_id": "t"}}
    agent.invoke({"messages": history}, config)
    assert prompts, "the request should have been compacted"
    # The state keeps its own messages; before_model compacts them on the next call ...
    state = agent.get_state(config).values["messages"]
    assert state[: len(history)] == history
    agent.invoke({"messages": [HumanMessage("and then?")]}, config)
    state = agent.get_state(config).values["messages"]
    assert isinstance(state[0], SystemMessage)
    # ... from the originals: every marker is in the state or its summary.
    kept = json.dumps([m.model_dump() for m in state], default=str)
    assert [f"M{i:04d}" for i in range(10) if f"M{i:04d}" not in kept] == []
    assert "[trimmed]" not in kept


def test_a_compaction_of_a_request_the_state_does_not_hold_is_not_archived() -> None:
    """A reply's malformed tool call, answered for the request only, keeps the model call's compaction out of the state.

    Not written, it was archived all the same, and the next turn's ``before_model``
    archived the same messages again under a new lineage no checkpoint holds.
    """
    results: list[CompactionResult] = []
    store = InMemoryStore()
    middleware = CompactionMiddleware(
        ExtractiveSummarizer(),
        CompactionOptions(context_window=4_000),
        features=[Archive()],
        on_compaction=results.append,
    )
    agent = create_agent(
        Agent(),
        [],
        system_prompt="You are helpful. " + FILL * 70,
        middleware=[middleware],
        checkpointer=InMemorySaver(),
        store=store,
    )
    history: list[BaseMessage] = []
    for i in range(12):
        history += [
            HumanMessage(f"question {i} " + FILL * 5, id=f"h{i}"),
            AIMessage(f"answer {i} " + FILL * 5, id=f"a{i}"),
        ]
    bad = {"name": "search", "args": '{"query": "trunc', "id": "bad", "error": "malformed", "type": "invalid_tool_call"}
    history += [AIMessage("", invalid_tool_calls=[bad], id="a-bad"), HumanMessage("next question", id="hn")]
    config = {"configurable": {"thread_id": "t"}}
    agent.invoke({"messages": history}, config)
    agent.invoke({"messages": [HumanMessage("one more " + FILL * 5, id="hm")]}, config)
    items = [item for ns in store.list_namespaces() for item in store.search(ns, limit=1_000)]
    ids = [item.value["id"] for item in items]
    assert ids
    assert len(ids) == len(set(ids)), f"{len(ids)} items archived for {len(set(ids))} messages"
    assert len(results) == 2
    assert results[0].parts["archive"] == {"request_only": True}


def _checked(request: Any, handler: Any) -> ModelResponse[Any]:
    response = handler(request)
    return ModelResponse(result=[AIMessage(f"[CHECKED] {m.content}", id="checked") for m in response.result])


def _checked_after(state: Any, runtime: Any) -> dict[str, Any]:
    return {"messages": [state["messages"][-1].model_copy(update={"content": "[CHECKED]", "id": "checked"})]}


@pytest.mark.parametrize("where", ["inner wrap_model_call", "after_model"])
def test_a_reply_edit_made_where_the_readme_says_stands_when_the_model_call_compacts(where: str) -> None:
    """The README's two places for a reply edit: a wrap_model_call after ours, an after_model hook.

    (An outer ``wrap_model_call``'s edit is replaced by the model's reply on such a
    call: LangChain applies the compaction's ``Command`` after the model node's update.)
    """
    results: list[CompactionResult] = []
    compaction = CompactionMiddleware(
        ExtractiveSummarizer(), CompactionOptions(context_window=4_000), on_compaction=results.append
    )
    middleware = (
        [compaction, wrap_model_call(_checked)] if where != "after_model" else [after_model(_checked_after), compaction]
    )
    agent = create_agent(Agent(), [], system_prompt="You are helpful. " + FILL * 70, middleware=middleware)
    history: list[BaseMessage] = []
    for i in range(12):
        history += [HumanMessage(f"question {i} " + FILL * 5), AIMessage(f"answer {i} " + FILL * 5)]
    state = agent.invoke({"messages": [*history, HumanMessage("last question")]})
    assert len(results) == 1  # made in the model call: the state's messages alone fit
    assert state["messages"][-1].id == "checked"
    assert str(state["messages"][-1].content).startswith("[CHECKED]")
