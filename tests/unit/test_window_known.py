"""The window comes from the model when it is not given, and an unknown window is said, not silent."""

from __future__ import annotations

import logging

import pytest
from langchain.agents import create_agent
from langchain_core.language_models import FakeListChatModel, GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage

from langchain_compaction import CompactionMiddleware, CompactionNode, CompactionOptions
from tests.conftest import RecordingSummarizer


def model_with_window(window: int | None, replies: int = 40) -> GenericFakeChatModel:
    model = GenericFakeChatModel(messages=iter([AIMessage(f"reply {i} " * 200) for i in range(replies)]))
    model.profile = {"max_input_tokens": window} if window else None
    return model


def test_the_middleware_reads_the_window_from_the_models_profile():
    recorder = RecordingSummarizer()
    middleware = CompactionMiddleware(recorder, CompactionOptions())  # no window given
    agent = create_agent(model_with_window(6_000), middleware=[middleware])
    messages: list = []
    for turn in range(12):
        messages = agent.invoke({"messages": [*messages, HumanMessage(f"question {turn} " * 200)]})["messages"]
    assert middleware.options.context_window == 6_000
    assert recorder.prompts, "a 6,000-token window from the profile should have compacted"
    assert len(messages) < 24


def test_the_middleware_says_when_no_window_is_known(caplog: pytest.LogCaptureFixture):
    middleware = CompactionMiddleware(RecordingSummarizer(), CompactionOptions())
    agent = create_agent(FakeListChatModel(responses=["hi", "hi"]), middleware=[middleware])
    with caplog.at_level(logging.WARNING, logger="langchain_compaction"):
        agent.invoke({"messages": [("user", "hello")]})
        agent.invoke({"messages": [("user", "hello again")]})
    warnings = [r for r in caplog.records if "no context_window" in r.getMessage()]
    assert len(warnings) == 1  # said once, clearly
    assert "pass CompactionOptions(context_window=...)" in warnings[0].getMessage()


def test_a_node_without_a_window_says_it_never_compacts(caplog: pytest.LogCaptureFixture):
    node = CompactionNode(RecordingSummarizer(), CompactionOptions())
    huge = [HumanMessage("x " * 1_000_000, id="h1")]  # ~250k tokens
    with caplog.at_level(logging.WARNING, logger="langchain_compaction"):
        assert node.invoke({"messages": huge}) == {}
        assert node.invoke({"messages": huge}) == {}
    warnings = [r for r in caplog.records if "never compacts on its own" in r.getMessage()]
    assert len(warnings) == 1
    assert "context_window" in warnings[0].getMessage()


def test_a_profile_window_the_options_do_not_fit_is_said_not_raised(caplog: pytest.LogCaptureFixture):
    # keep_recent_tokens over a 6,000 window from the profile: the agent's first call raised
    # ConfigurationError from inside the model call.
    middleware = CompactionMiddleware(RecordingSummarizer(), CompactionOptions(keep_recent_tokens=50_000))
    agent = create_agent(model_with_window(6_000), middleware=[middleware])
    with caplog.at_level(logging.WARNING, logger="langchain_compaction"):
        agent.invoke({"messages": [HumanMessage("hello")]})
    assert middleware.options.context_window == 0
    assert any("which the options do not fit" in r.getMessage() for r in caplog.records)
