"""No death spiral: a compaction lands under the landing target, or says why and keeps less next time."""

from __future__ import annotations

import logging
import re

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage

from bench.small_window import run as small_window_run
from langchain_compaction import CompactionOptions, ExtractiveSummarizer, auto_compact
from langchain_compaction.tokens import estimate_message_tokens

# Threshold 3,500, landing 1,750, keep 1,050 (derived).
OPTIONS = CompactionOptions(context_window=4_000, reserve_tokens=500, summary_input_tokens=50_000)


def summarize(prompt: str) -> str:
    return "## Goal\n- keep exporting"


def chat(start: int, turns: int, size: int = 60) -> list[BaseMessage]:
    out: list[BaseMessage] = []
    for i in range(start, start + turns):
        out += [HumanMessage(f"q{i} " + "word " * size, id=f"h{i}"), AIMessage(f"a{i} " + "word " * size, id=f"a{i}")]
    return out


def test_a_compaction_that_cannot_land_says_so_and_the_next_keeps_less(caplog) -> None:
    # The last message is always kept; this one alone is far above the landing target
    # (about 2,700 tokens: the compaction lands 800 under the threshold, not 1,750).
    pasted = HumanMessage("Here is the log:\n" + "log line " * 1200, id="pasted")
    messages = [SystemMessage("You are an agent.", id="s"), *chat(0, 12), pasted]
    first, messages = auto_compact(summarize, messages, OPTIONS)
    assert first is not None
    assert first.above_landing
    assert not first.repeated
    # The agent goes on; within a few replies the threshold is crossed again.
    for n in range(20):
        messages = [*messages, *chat(100 + n, 1, size=300)]
        with caplog.at_level(logging.WARNING, logger="langchain_compaction"):
            again, compacted = auto_compact(summarize, messages, OPTIONS)
        if again is not None:
            break
    assert again is not None
    assert n + 1 <= 3  # a repeat, not a compaction in the normal course
    assert again.repeated
    assert "compaction fired again" in caplog.text
    # Keeping half as much let the pasted log go into the summary: it lands now.
    assert not any(m.id == "pasted" for m in compacted)
    assert not again.above_landing


def test_a_normal_compaction_is_not_a_repeat() -> None:
    messages = [SystemMessage("You are an agent.", id="s"), *chat(0, 30)]
    first, messages = auto_compact(summarize, messages, OPTIONS)
    assert first is not None
    assert not first.above_landing
    for n in range(40):
        messages = [*messages, *chat(100 + n, 1)]
        again, after = auto_compact(summarize, messages, OPTIONS)
        if again is not None:
            break
    assert again is not None
    assert not again.repeated


# -- small windows: the fixed part (system prompt, tools) named once, never thrashed on ----------


def test_a_fixed_part_over_half_the_threshold_compacts_at_the_rate_the_window_allows() -> None:
    """A 4,096 window with about 2,800 tokens of prompt and tools: compactions plan over what they can remove."""
    figures = small_window_run(4_096, 100)
    assert figures["fixed_tokens"] > 2_700
    # 0.2: 96 summary calls per 100 turns and a warning on nearly every turn.
    assert 0 < figures["summary_calls_per_100_turns"] <= 2 * figures["theory_per_100_turns"]
    assert figures["requests_over_window"] == 0
    assert len(figures["warning_texts"]) == 1
    assert figures["warnings"] == 1
    assert "take 2" in figures["warning_texts"][0]
    assert "a larger window, a shorter system prompt, fewer tools" in figures["warning_texts"][0]


def test_a_fixed_part_that_leaves_no_room_is_named_once_and_not_compacted_for() -> None:
    """At 3,000 the prompt and tools alone pass the threshold: no summary call can help, and none is made."""
    figures = small_window_run(3_000, 60)
    assert figures["summary_calls_per_100_turns"] == 0
    assert figures["warnings"] == 1
    assert "no compaction can bring the context under that" in figures["warning_texts"][0]


def test_ids_used_twice_do_not_make_every_compaction_a_repeat(caplog) -> None:
    """Duplicate message ids (some clients reuse them): a compaction in the normal course is no repeat."""
    messages: list[BaseMessage] = [SystemMessage("You are an agent.", id="s")]
    results = []
    with caplog.at_level(logging.WARNING, logger="langchain_compaction"):
        for n in range(80):
            messages += [
                HumanMessage(f"q{n} " + "word " * 60, id="same"),
                AIMessage(f"a{n} " + "word " * 60, id="same"),
            ]
            result, messages = auto_compact(summarize, messages, OPTIONS)
            if result is not None:
                results.append(result)
    assert len(results) >= 3
    assert not any(r.repeated for r in results)
    assert "fired again" not in caplog.text


def test_a_warning_about_the_kept_messages_is_not_repeated_every_compaction(caplog) -> None:
    """One huge message kept again and again: the conversation is told once, not at every compaction."""
    from langgraph.checkpoint.memory import InMemorySaver

    from langchain_compaction import CompactionNode
    from tests.conftest import compaction_graph

    graph = compaction_graph(CompactionNode(summarize, OPTIONS, result_key="compaction"), checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "huge"}}
    over_budget = 0
    with caplog.at_level(logging.WARNING, logger="langchain_compaction"):
        for n in range(12):
            huge = HumanMessage(f"log {n}:\n" + "log line " * 1_800, id=f"huge{n}")
            state = graph.invoke({"messages": [huge]}, config)
            over_budget += bool((state.get("compaction") or {}).get("over_budget"))
    assert over_budget >= 5
    over = [r for r in caplog.records if "still over budget" in r.getMessage()]
    assert len(over) == 1
    assert "messages kept verbatim are too large" in over[0].getMessage()  # (the huge message is to blame)


def test_at_a_tiny_window_the_over_budget_warning_names_the_summary_not_the_kept_messages(caplog) -> None:
    """A 300-token window: the summary takes most of what is over, and the warning says so with its figures.

    It blamed the one short message kept after the summary (79 tokens of 465).
    """
    messages = [HumanMessage(f"q{i} " * 50) if i % 2 == 0 else AIMessage(f"a{i} " * 50) for i in range(40)]
    with caplog.at_level(logging.WARNING, logger="langchain_compaction"):
        result, _ = auto_compact(ExtractiveSummarizer(), messages, CompactionOptions(context_window=300))
    assert result is not None
    assert result.over_budget
    over = [r.getMessage() for r in caplog.records if "still over budget" in r.getMessage()]
    assert len(over) == 1
    assert "kept verbatim are too large" not in over[0]
    figures = re.search(r"Most of it is not the (\d+) messages kept after the summary \((\d+) tokens\)", over[0])
    assert figures is not None
    assert int(figures[2]) < result.compacted_tokens // 2
    assert "larger context_window" in over[0]


def test_the_two_over_budget_warnings_are_one_warning_said_once(caplog) -> None:
    """Over budget by the summary first, then by a huge kept message: the conversation is told once, not twice."""
    from langgraph.checkpoint.memory import InMemorySaver

    from langchain_compaction import CompactionNode
    from tests.conftest import compaction_graph

    node = CompactionNode(ExtractiveSummarizer(), CompactionOptions(context_window=300), result_key="compaction")
    graph = compaction_graph(node, checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "both"}}
    kinds = set()
    with caplog.at_level(logging.WARNING, logger="langchain_compaction"):
        for n in range(8):
            text = f"q{n} " * 50 if n < 6 else f"log {n}:\n" + "log line " * 600
            state = graph.invoke({"messages": [HumanMessage(text, id=f"m{n}")]}, config)
            record = state.get("compaction") or {}
            if record.get("over_budget"):
                kinds.add(n < 6)
    assert kinds == {True, False}  # over budget by the summary, then by the kept message
    assert len([r for r in caplog.records if "still over budget" in r.getMessage()]) == 1


def test_the_over_budget_warning_waits_for_a_compaction_that_is_over_budget(caplog) -> None:
    """Normal compactions first: the one that is over budget later is still told (once)."""
    from langgraph.checkpoint.memory import InMemorySaver

    from langchain_compaction import CompactionNode
    from tests.conftest import compaction_graph

    graph = compaction_graph(CompactionNode(summarize, OPTIONS, result_key="compaction"), checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "later"}}
    records: list[dict] = []
    with caplog.at_level(logging.WARNING, logger="langchain_compaction"):
        for n in range(80):
            state = graph.invoke({"messages": [HumanMessage(f"q{n} " + "word " * 80, id=f"q{n}")]}, config)
            if state.get("compaction") and state["compaction"] not in records:
                records.append(state["compaction"])
        assert len(records) >= 2
        assert not any(r["over_budget"] for r in records)
        assert "still over budget" not in caplog.text
        for n in range(3):
            huge = HumanMessage(f"log {n}:\n" + "log line " * 1_800, id=f"huge{n}")
            state = graph.invoke({"messages": [huge]}, config)
    assert state["compaction"]["over_budget"]
    assert len([r for r in caplog.records if "still over budget" in r.getMessage()]) == 1


def test_over_budget_counts_what_every_request_sends_besides_the_messages(caplog) -> None:
    """An agent's system prompt counts, prepared or not, and the warning names it."""
    from langchain.agents import create_agent
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langgraph.checkpoint.memory import InMemorySaver

    from langchain_compaction import CompactionMiddleware
    from langchain_compaction.features import PrepareAhead, default_features

    prompt = "Answer in the house style, with sources. " * 60
    overhead = estimate_message_tokens([SystemMessage(prompt)])  # what each request sends besides the messages
    for features in (None, [*default_features(), PrepareAhead(at=0.7)]):
        results: list = []
        options = CompactionOptions(context_window=1_600, reserve_tokens=200, keep_recent_tokens=300)
        middleware = CompactionMiddleware(summarize, options, on_compaction=results.append, features=features)
        replies = iter([AIMessage("reply " * 60) for _ in range(200)])
        agent = create_agent(
            GenericFakeChatModel(messages=replies),
            system_prompt=prompt,
            middleware=[middleware],
            checkpointer=InMemorySaver(),
        )
        config = {"configurable": {"thread_id": f"mw-{features is None}"}}
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="langchain_compaction"):
            for n in range(30):
                agent.invoke({"messages": [HumanMessage(f"q{n} " + "word " * 60)]}, config)
        assert len(results) >= 3
        threshold = options.budget.threshold
        assert threshold is not None
        for result in results:
            assert result.over_budget == (result.compacted_tokens + overhead > threshold)
        over = [r.getMessage() for r in caplog.records if "still over budget" in r.getMessage()]
        assert len(over) == int(any(r.over_budget for r in results))
        assert all(f"({overhead} of them the system prompt and tool schemas" in text for text in over)
