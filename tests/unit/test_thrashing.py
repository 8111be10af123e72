"""No death spiral: a compaction lands under the landing target, or says why and keeps less next time."""

from __future__ import annotations

import logging

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage

from langchain_compaction import CompactionOptions, auto_compact
from langchain_compaction.core.plan import REPEAT_TURNS

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
    # The last message is always kept; this one alone is above the landing target.
    pasted = HumanMessage("Here is the log:\n" + "log line " * 800, id="pasted")
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
    assert n + 1 <= REPEAT_TURNS  # a repeat, not a compaction in the normal course
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
