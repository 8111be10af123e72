"""Reported usage anchors the trigger, in the node and in the middleware alike."""

from __future__ import annotations

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

from langchain_compaction import CompactionMiddleware, CompactionNode, CompactionOptions, compact, should_compact
from langchain_compaction._lc.convert import to_core_list
from langchain_compaction.core import context


def usage_anchor(messages: list) -> tuple[int, int] | None:
    return context.usage_anchor(to_core_list(messages))


def context_tokens(messages: list, counts: list[int], overhead: int = 0) -> int:
    return context.context_tokens(to_core_list(messages), counts, overhead)


OPTIONS = CompactionOptions(context_window=10_000, reserve_tokens=1_000, keep_recent_tokens=50)


def reply(text: str, billed: int, id: str) -> AIMessage:
    return AIMessage(
        text, id=id, usage_metadata={"input_tokens": billed, "output_tokens": 50, "total_tokens": billed + 50}
    )


def conversation(billed: int) -> list:
    return [
        SystemMessage("You are helpful.", id="s"),
        HumanMessage("hello " * 50, id="h1"),
        reply("hi " * 50, billed, "a1"),
        HumanMessage("more " * 50, id="h2"),
    ]


def test_reported_usage_plus_what_follows_is_the_context():
    messages = conversation(9_200)
    counts = [10, 60, 60, 60]
    assert usage_anchor(messages) == (2, 9_250)
    assert context_tokens(messages, counts, overhead=500) == 9_250 + 60  # overhead is in the billed figure
    assert context_tokens([m for m in messages if not isinstance(m, AIMessage)], [10, 60, 60], overhead=500) == 630


def test_middleware_compacts_on_billed_usage_the_estimate_misses():
    middleware = CompactionMiddleware(lambda p: "## Goal\n- greet", OPTIONS)
    assert middleware.before_model({"messages": conversation(9_200)}, None) is not None  # type: ignore[arg-type]
    assert middleware.before_model({"messages": conversation(100)}, None) is None  # type: ignore[arg-type]


def test_node_middleware_and_should_compact_agree():
    node = CompactionNode(lambda p: "## Goal\n- greet", OPTIONS)
    middleware = CompactionMiddleware(lambda p: "## Goal\n- greet", OPTIONS)
    decisions = []
    for billed in (100, 9_200):
        by_node = bool(node.invoke({"messages": conversation(billed)}))
        by_middleware = bool(middleware.before_model({"messages": conversation(billed)}, None))  # type: ignore[arg-type]
        assert by_node == by_middleware == should_compact(conversation(billed), options=OPTIONS)
        # The seed's signature answers the same, from the same anchored size.
        assert should_compact(conversation(billed), 10_000, 1_000) == by_node
        decisions.append(by_node)
    assert decisions == [False, True]


def test_usage_from_before_a_compaction_is_not_trusted():
    messages = [*conversation(9_200), reply("ok " * 50, 9_300, "a2"), HumanMessage("next", id="h3")]
    _, out = compact(lambda p: "## Goal\n- greet", messages, CompactionOptions(keep_recent_tokens=100))
    # The kept reply a2 still reports 9,350 tokens, measured before the compaction.
    assert any(m.id == "a2" for m in out)
    assert usage_anchor(out) is None
    assert usage_anchor([*out, reply("fresh", 700, "a3")]) == (len(out), 750)


def test_a_whole_conversation_counter_is_asked_once():
    class WholeCounter:
        calls = 0

        def __call__(self, messages):
            raise AssertionError("count_each must be used")

        def count_each(self, messages):
            WholeCounter.calls += 1
            return [100] * len(messages)

    result, _ = compact(
        lambda p: "## Goal\n- x",
        conversation(100),
        CompactionOptions(token_counter=WholeCounter(), keep_recent_tokens=150),
    )
    assert result is not None
    assert result.original_tokens == 400
    assert WholeCounter.calls >= 1
