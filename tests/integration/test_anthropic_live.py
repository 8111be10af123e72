"""The Anthropic integration against the real API (needs ANTHROPIC_API_KEY).

Skipped without a key. Set ANTHROPIC_TEST_MODEL to pick the model (a small,
cheap one by default). Each test makes a handful of small requests.
"""

from __future__ import annotations

import os

import anthropic
import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage

from langchain_compaction import CompactionOptions, acompact, compact
from langchain_compaction.anthropic import AnthropicSummarizer, AnthropicTokenCounter

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not os.environ.get("ANTHROPIC_API_KEY"), reason="needs ANTHROPIC_API_KEY"),
]

MODEL = os.environ.get("ANTHROPIC_TEST_MODEL", "claude-haiku-4-5")


def conversation() -> list[BaseMessage]:
    messages: list[BaseMessage] = [SystemMessage("You are a coding agent working on a parser.")]
    for turn in range(6):
        messages += [
            HumanMessage(f"Step {turn}: the test test_parse_{turn} fails with ValueError on input '{turn}x'."),
            AIMessage(
                f"Reading parser.py for step {turn}.",
                tool_calls=[{"id": f"toolu_live_{turn}", "name": "read_file", "args": {"path": "parser.py"}}],
            ),
            ToolMessage("def parse(x):\n    return int(x)\n" * 3, tool_call_id=f"toolu_live_{turn}", name="read_file"),
            AIMessage(f"Step {turn}: parse() must strip the suffix before int(); fixed."),
        ]
    messages.append(HumanMessage("Now write the changelog entry."))
    return messages


def test_real_count_matches_the_api_total() -> None:
    client = anthropic.Anthropic()
    counter = AnthropicTokenCounter(client, model=MODEL, system="Be exact.")
    simple = [HumanMessage("What is a parser?"), AIMessage("A program that reads text."), HumanMessage("Thanks.")]
    direct = client.messages.count_tokens(
        model=MODEL,
        system="Be exact.",
        messages=[
            {"role": "user", "content": "What is a parser?"},
            {"role": "assistant", "content": "A program that reads text."},
            {"role": "user", "content": "Thanks."},
        ],
    ).input_tokens
    # The counter's total is the API's own figure for the same request.
    assert counter.total(simple) == direct


def test_real_counts_of_a_tool_conversation() -> None:
    counter = AnthropicTokenCounter(anthropic.Anthropic(), model=MODEL)
    messages = conversation()
    counts = counter.count_each(messages)
    assert len(counts) == len(messages)
    assert counter.fallbacks == 0  # the API accepted every request as built
    each = [counter([m]) for m in messages]
    assert counter.fallbacks == 0
    # Per-message counts carry stub partners: they err high, not low.
    assert sum(each) >= sum(counts) - len(messages)


def test_real_small_compaction() -> None:
    summarizer = AnthropicSummarizer(MODEL, max_tokens=1024, max_retries=2, timeout=120)
    counter = AnthropicTokenCounter(MODEL)
    messages = conversation()
    result, out = compact(summarizer, messages, CompactionOptions(token_counter=counter, keep_recent_tokens=300))
    assert result is not None
    assert result.summary.strip()
    assert out[-1] is messages[-1]
    assert summarizer.last_usage is not None
    assert summarizer.last_usage.input_tokens > 0
    assert summarizer.last_usage.output_tokens > 0


async def test_real_small_async_compaction() -> None:
    summarizer = AnthropicSummarizer(MODEL, max_tokens=1024, async_client=anthropic.AsyncAnthropic())
    result, _out = await acompact(summarizer, conversation(), CompactionOptions(keep_recent_tokens=300))
    assert result is not None
    assert result.summary.strip()
