"""A LangChain ``create_agent`` agent that compacts its own history as it goes.

Offline by default: a scripted tool-calling fake model answers and the
``ExtractiveSummarizer`` writes the summaries, so this runs without a key.
With ``ANTHROPIC_API_KEY`` set, Claude answers and Claude Haiku summarizes.
The window is kept small on purpose, so a short session compacts several times;
each compaction's figures are printed.

    python examples/agent_middleware.py [turns]
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

from langchain_compaction import CompactionOptions, CompactionResult
from langchain_compaction.middleware import CompactionMiddleware
from langchain_compaction.summarizers.extractive import ExtractiveSummarizer

NOTES = {
    "build": "The package builds with hatchling; `python -m build` makes the wheel and sdist.",
    "tests": "Unit tests run with `pytest tests/unit`; warnings are errors; no network is allowed.",
    "release": "Releases are tagged vX.Y.Z on main; CI publishes to PyPI from the tag.",
    "style": "ruff check and ruff format; mypy --strict on the package; Google-style docstrings.",
}


@tool
def lookup(topic: str) -> str:
    """Look up the team's notes on a topic: build, tests, release or style."""
    return NOTES.get(topic, f"No notes on {topic!r}; known topics: {', '.join(NOTES)}.") + " " + "(details) " * 40


class ScriptedModel(GenericFakeChatModel):
    """A fake chat model that can be bound to tools (LangChain's fakes cannot)."""

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedModel:
        return self


def script(turns: int) -> Iterator[AIMessage]:
    topics = list(NOTES)
    for turn in range(turns):
        topic = topics[turn % len(topics)]
        call = {"name": "lookup", "args": {"topic": topic}, "id": f"call_{turn}", "type": "tool_call"}
        yield AIMessage(content="", tool_calls=[call])
        yield AIMessage(content=f"Turn {turn}: according to the notes, {NOTES[topic]}")


def report(result: CompactionResult) -> None:
    print(
        f"  compacted: {result.original_tokens} -> {result.compacted_tokens} tokens, "
        f"{result.messages_removed} messages summarized, {result.messages_kept} kept, "
        f"{result.summarizer_calls} summary call(s) by {result.summarizer}" + (" (forced)" if result.forced else "")
    )


def main(turns: int = 40) -> None:
    if os.environ.get("ANTHROPIC_API_KEY"):
        from langchain_anthropic import ChatAnthropic

        model: Any = ChatAnthropic(model="claude-sonnet-4-5")  # type: ignore[call-arg]
        summarizer: Any = ChatAnthropic(model="claude-haiku-4-5", max_tokens=2048)  # type: ignore[call-arg]
    else:
        model = ScriptedModel(messages=script(turns))
        summarizer = ExtractiveSummarizer()

    middleware = CompactionMiddleware(
        summarizer,
        # A window far below Claude's real one, so that a short session shows
        # compactions; the summarizer's own requests may be larger than that.
        CompactionOptions(context_window=4000, reserve_tokens=800, keep_recent_tokens=800, summary_input_tokens=50_000),
        fallback=ExtractiveSummarizer(),
        on_compaction=report,
    )
    agent = create_agent(
        model,
        tools=[lookup],
        system_prompt="You answer questions about the team's engineering practices. Look things up first.",
        middleware=[middleware],
        checkpointer=InMemorySaver(),
    )
    config: Any = {"configurable": {"thread_id": "example"}}
    topics = list(NOTES)
    for turn in range(turns):
        question = f"Question {turn}: what do the notes say about {topics[turn % len(topics)]}?"
        print(f"> {question}")
        reply = agent.invoke({"messages": [("user", question)]}, config)["messages"][-1]
        print(f"  {reply.text[:100]}")
    state = agent.get_state(config).values["messages"]
    print(f"final state: {len(state)} messages, the first is the summary: {state[0].content[:60]!r}...")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 40)
