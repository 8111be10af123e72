"""Threads summarized by LangChain's SummarizationMiddleware continue with this library."""

from __future__ import annotations

from langchain.agents import create_agent
from langchain.agents.middleware import SummarizationMiddleware
from langchain_core.language_models import FakeListChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from langchain_compaction import CompactionMiddleware, CompactionOptions, compact
from langchain_compaction._lc.convert import is_summary_message
from tests.conftest import RecordingSummarizer

SUMMARY_TEXT = "The user is migrating the billing service to v2; never touch the ledger table."


def summarized_by_langchain() -> list:
    """A thread after LangChain's SummarizationMiddleware compacted it (its own output)."""
    summarizer = FakeListChatModel(responses=[SUMMARY_TEXT])
    middleware = SummarizationMiddleware(model=summarizer, trigger=("messages", 6), keep=("messages", 2))
    agent = create_agent(
        FakeListChatModel(responses=[f"answer {i} " * 10 for i in range(20)]),
        middleware=[middleware],
        checkpointer=InMemorySaver(),
    )
    config = {"configurable": {"thread_id": "migrated"}}
    for turn in range(5):
        state = agent.invoke({"messages": [HumanMessage(f"request {turn} " * 10)]}, config)
    messages = state["messages"]
    assert any(m.additional_kwargs.get("lc_source") == "summarization" for m in messages)
    return messages


def test_its_summary_is_updated_not_read_as_the_users_goal():
    messages = summarized_by_langchain()
    messages += [HumanMessage(f"more work {i} " * 40) for i in range(3)]
    recorder = RecordingSummarizer()
    result, out = compact(recorder, messages, CompactionOptions(keep_recent_tokens=50))
    assert result is not None
    assert result.updated_previous_summary
    prompt = recorder.prompts[0]
    fenced = prompt.split("previous-summary>>", 1)[1]
    assert SUMMARY_TEXT in fenced.split("<</", 1)[0]  # shown as the previous summary ...
    assert prompt.count(SUMMARY_TEXT) == 1  # ... and only there, not as a [User] message
    assert "Here is a summary of the conversation to date" not in prompt
    # LangChain's summary is replaced by ours: one summary, leading.
    assert is_summary_message(out[0])
    assert not any(m.additional_kwargs.get("lc_source") == "summarization" for m in out)


def test_the_middleware_continues_a_langchain_thread():
    messages = summarized_by_langchain()
    recorder = RecordingSummarizer()
    middleware = CompactionMiddleware(recorder, CompactionOptions(context_window=2_000, keep_recent_tokens=100))
    grown = [*messages, HumanMessage("go on " * 400), AIMessage("x " * 3_000)]
    update = middleware.before_model({"messages": grown}, None)  # type: ignore[arg-type]
    assert update is not None
    assert "previous-summary" in recorder.prompts[0]
    assert SUMMARY_TEXT in recorder.prompts[0]


def test_a_chat_model_with_fallbacks_summarizes() -> None:
    # LangChain answers ``getattr(model_with_fallbacks, "bind_tools")`` by
    # reading the method's type hints, which raised NameError for a model that
    # does not define bind_tools: every compaction failed.
    model = FakeListChatModel(responses=["## Goal\n- first"]).with_fallbacks(
        [FakeListChatModel(responses=["## Goal\n- backup"])]
    )
    messages = [HumanMessage(f"step {i} " * 40) if i % 2 == 0 else AIMessage(f"done {i} " * 40) for i in range(20)]
    result, out = compact(model, messages, CompactionOptions(context_window=2_000))
    assert result is not None
    assert "- first" in str(out[0].content)
