"""Reported usage anchors the trigger, in the node and in the middleware alike."""

from __future__ import annotations

import logging
import re
from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models.chat_models import BaseChatModel, generate_from_stream
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage, SystemMessage
from langchain_core.outputs import ChatGenerationChunk
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages

from langchain_compaction import CompactionMiddleware, CompactionNode, CompactionOptions, compact, should_compact
from langchain_compaction._lc.convert import summary_message, to_core_list
from langchain_compaction.core import context
from langchain_compaction.graph import CompactionState
from langchain_compaction.tokens import estimate_message_tokens


def usage_anchor(messages: list) -> tuple[int, int] | None:
    return context.usage_anchor(to_core_list(messages))


def context_tokens(messages: list, counts: list[int], overhead: int = 0) -> int:
    return context.context_tokens(to_core_list(messages), counts, overhead)


OPTIONS = CompactionOptions(context_window=10_000, reserve_tokens=1_000, keep_recent_tokens=50)


def reply(text: str, billed: int, id: str) -> AIMessage:
    return AIMessage(
        text, id=id, usage_metadata={"input_tokens": billed, "output_tokens": 50, "total_tokens": billed + 50}
    )


def conversation(billed: int, words: int = 50) -> list:
    return [
        SystemMessage("You are helpful.", id="s"),
        HumanMessage("hello " * words, id="h1"),
        reply("hi " * words, billed, "a1"),
        HumanMessage("more " * words, id="h2"),
    ]


LONG = 1_500
"""Words a message of ``conversation`` holds where the trigger is asked: about 6,800 tokens of messages in all,
so a request billed 9,200 carries about 2,400 besides them (a system prompt and tools the state does not hold),
which a compaction leaves room under."""


def test_reported_usage_plus_what_follows_is_the_context():
    messages = conversation(9_200)
    counts = [10, 60, 60, 60]
    assert usage_anchor(messages) == (2, 9_250)
    assert context_tokens(messages, counts, overhead=500) == 9_250 + 60  # overhead is in the billed figure
    assert context_tokens([m for m in messages if not isinstance(m, AIMessage)], [10, 60, 60], overhead=500) == 630


def test_reasoning_tokens_not_sent_back_are_not_the_context():
    # o-series, GPT-5 and Gemini report their reasoning inside output_tokens; it is not sent again,
    # and counting it compacted a 30,000-token request against a 56,000 threshold.
    usage = {"input_tokens": 9_000, "output_tokens": 30_050, "total_tokens": 39_050}
    usage["output_token_details"] = {"reasoning": 30_000}  # type: ignore[assignment]
    thought = AIMessage("the answer", id="a1", usage_metadata=usage)  # type: ignore[arg-type]
    assert usage_anchor([HumanMessage("q", id="h1"), thought]) == (1, 9_050)
    # The reasoning a reply carries (Claude's thinking text) is sent back with it: counted by its text.
    thinking = {"type": "thinking", "thinking": "step " * 400, "signature": "c2ln"}
    carried = AIMessage([thinking, {"type": "text", "text": "done"}], id="a2", usage_metadata=usage)  # type: ignore[arg-type]
    anchored = usage_anchor([HumanMessage("q", id="h1"), carried])
    assert anchored is not None
    assert 9_050 + 300 < anchored[1] < 9_050 + 1_000


def test_middleware_compacts_on_billed_usage_the_estimate_misses():
    middleware = CompactionMiddleware(lambda p: "## Goal\n- greet", OPTIONS)
    assert middleware.before_model({"messages": conversation(9_200, LONG)}, None) is not None  # type: ignore[arg-type]
    assert middleware.before_model({"messages": conversation(100, LONG)}, None) is None  # type: ignore[arg-type]


def test_node_middleware_and_should_compact_agree():
    node = CompactionNode(lambda p: "## Goal\n- greet", OPTIONS)
    middleware = CompactionMiddleware(lambda p: "## Goal\n- greet", OPTIONS)
    decisions = []
    for billed in (100, 9_200):
        messages = conversation(billed, LONG)
        by_node = bool(node.invoke({"messages": messages}))
        by_middleware = bool(middleware.before_model({"messages": messages}, None))  # type: ignore[arg-type]
        assert by_node == by_middleware == should_compact(messages, options=OPTIONS)
        # The seed's signature answers the same, from the same anchored size.
        assert should_compact(messages, 10_000, 1_000) == by_node
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


class SeenCounter:
    """A token counter that records how many messages it was asked to count."""

    def __init__(self) -> None:
        self.seen = 0

    def __call__(self, messages):
        self.seen += len(messages)
        return 60 * len(messages)


def long_history(billed: int, size: int = 400) -> list:
    messages: list = [SystemMessage("You are helpful.", id="s")]
    for i in range(size // 2):
        detail = " about the export" * 6
        messages += [HumanMessage(f"question {i}{detail}", id=f"h{i}"), AIMessage(f"answer {i}{detail}", id=f"a{i}")]
    return [*messages, reply("last answer", billed, "last"), HumanMessage("and now?", id="now")]


def test_a_fresh_node_with_trusted_usage_counts_only_what_follows_the_reply():
    # A cold worker: a new node, nothing cached. The last reply's usage
    # answers for everything before it.
    options = CompactionOptions(context_window=30_000, reserve_tokens=1_000, token_counter=(counter := SeenCounter()))
    assert CompactionNode(lambda p: "## Goal\n- x", options).invoke({"messages": long_history(13_000)}) == {}
    assert counter.seen == 1  # the one message after the reply
    # Without usage, the same node counts the whole history to decide.
    unreported = [m for m in long_history(13_000) if m.id != "last"]
    CompactionNode(lambda p: "## Goal\n- x", options).invoke({"messages": unreported})
    assert counter.seen == 1 + len(unreported)


def test_a_fresh_node_compacts_when_the_reported_usage_is_over():
    node = CompactionNode(lambda p: "## Goal\n- x", CompactionOptions(context_window=30_000, reserve_tokens=1_000))
    history = long_history(29_500)
    assert should_compact(history, options=node.options)  # on the reported usage, as the node decides
    state = add_messages(history, node.invoke({"messages": history})["messages"])
    assert len(state) < len(history)
    assert isinstance(state[0], SystemMessage)
    assert state[0].id == "s"


def test_a_fresh_node_does_not_trust_usage_measured_before_a_summary():
    history = long_history(900)
    options = CompactionOptions(context_window=30_000, reserve_tokens=1_000, keep_recent_tokens=100)
    _, compacted = compact(lambda p: "## Goal\n- x", history, options)
    # The kept reply's usage predates the summary: a fresh node must count.
    counter = SeenCounter()
    counted = CompactionOptions(context_window=30_000, reserve_tokens=1_000, token_counter=counter)
    CompactionNode(lambda p: "## Goal\n- x", counted).invoke({"messages": compacted})
    assert counter.seen == len(compacted)


def test_a_fresh_node_still_moves_a_summary_found_mid_history():
    # A subgraph's summary merged into the middle of the parent's list: the
    # usage says the context fits, but the request would be invalid as it is.
    history = long_history(900)
    stray = summary_message("## Goal\n- x", {"kind": "summary", "kept_from": "h75"})
    with_stray = [*history[:200], stray, *history[200:]]
    node = CompactionNode(lambda p: "## Goal\n- x", CompactionOptions(context_window=30_000, reserve_tokens=1_000))
    state = add_messages(with_stray, node.invoke({"messages": with_stray})["messages"])
    # Moved to the front, and what it covers is gone; nothing else changed.
    assert [m.id for m in state[:2]] == ["s", stray.id]
    assert not any(isinstance(m, SystemMessage) for m in state[2:])


def test_fresh_and_warm_nodes_decide_alike():
    options = CompactionOptions(context_window=6_000, reserve_tokens=1_000)
    warm = CompactionNode(lambda p: "## Goal\n- x", options)
    for billed in (100, 2_000, 4_900, 5_100, 20_000):
        history = long_history(billed, size=120)
        fresh = bool(CompactionNode(lambda p: "## Goal\n- x", options).invoke({"messages": history}))
        warm.invoke({"messages": history[:-3]})  # the cache has seen the older part
        assert fresh == bool(warm.invoke({"messages": history})) == should_compact(history, options=options)


def test_a_usage_far_under_the_estimate_measured_another_conversation_and_the_estimate_stands():
    # A sub-agent's final reply handed up by a supervisor carries the sub-agent's own usage, and a
    # server may report its output alone: trusted, they kept a history of three windows from compacting.
    options = CompactionOptions(context_window=10_000, reserve_tokens=1_000)
    for usage in ({"input_tokens": 250, "output_tokens": 50}, {"input_tokens": 0, "output_tokens": 50}):
        history = long_history(0)  # (about 12,900 tokens by the estimate)
        history[-2] = AIMessage("last answer", id="last", usage_metadata={**usage, "total_tokens": 300})  # type: ignore[typeddict-item]
        assert should_compact(history, options=options)
        assert CompactionNode(lambda p: "## Goal\n- x", options).invoke({"messages": history}), usage  # cold
        warm = CompactionNode(lambda p: "## Goal\n- x", options)
        warm.invoke({"messages": history[:-2]})  # (its cache has seen all but the last two)
        assert warm.invoke({"messages": history}), usage
    # A usage over a quarter of the estimate is the provider's count (the estimate may run high): trusted.
    assert not should_compact(long_history(8_000), options=options)
    assert should_compact(long_history(9_500), options=options)


def test_a_usage_far_under_an_estimate_made_of_attachments_is_trusted():
    # Images and PDFs are estimated at a fixed cost a provider may bill far under (Gemini about 258
    # tokens a page): a Gemini usage for two 40-page PDFs is the context, not another conversation's.
    import base64

    pages = b"".join(b"%d 0 obj << /Type /Page /Parent 1 0 R >> endobj\n" % i for i in range(2, 42))
    pdf = base64.b64encode(b"%PDF-1.4\n" + pages + b"1 0 obj << /Type /Pages /Count 40 >> endobj\n%%EOF").decode()
    attached = [{"type": "file", "base64": pdf, "mime_type": "application/pdf"} for _ in range(2)]
    history = [
        HumanMessage([{"type": "text", "text": "Compare these two reports."}, *attached], id="h1"),
        AIMessage("The second one is longer.", id="a1", usage_metadata=_gemini(2 * 40 * 258 + 40, 10)),
        HumanMessage("Which has the higher revenue?", id="h2"),
    ]
    options = CompactionOptions(context_window=200_000)
    assert not should_compact(history, options=options)  # (the estimate alone: 240,000 tokens)
    assert CompactionNode(lambda p: "## Goal\n- x", options).invoke({"messages": history}) == {}


def _gemini(input_tokens: int, output_tokens: int) -> dict:
    return {"input_tokens": input_tokens, "output_tokens": output_tokens, "total_tokens": input_tokens + output_tokens}


def test_a_cold_worker_ignores_another_conversations_usage_in_chinese_too():
    # The cold screen counts characters: four a token in English, but about one in Chinese, where a
    # sub-agent's usage of 8,200 for a history of about 50,000 tokens passed it as this conversation's.
    options = CompactionOptions(context_window=20_000, reserve_tokens=2_000)
    text = "我们需要检查数据库迁移脚本并确认所有的表结构都已经正确更新了。" * 20
    history: list = []
    for i in range(40):
        history += [HumanMessage(f"{i} {text}", id=f"h{i}"), AIMessage(text, id=f"a{i}")]
    usage = {"input_tokens": 8_000, "output_tokens": 200, "total_tokens": 8_200}
    history += [AIMessage("研究完成。", id="sub", usage_metadata=usage), HumanMessage("继续", id="next")]
    assert should_compact(history, options=options)
    assert CompactionNode(lambda p: "## Goal\n- x", options).invoke({"messages": history})


class _Streamed(BaseChatModel):
    """A chat model that streams its reply, every chunk carrying the request's usage (``running``: as a running total).

    Some OpenAI-compatible servers (vLLM's continuous usage stats) send the
    usage so far in each chunk; LangChain adds the chunks' usage up as it
    merges them, so the reply reports its request about 80 times over.
    """

    running: bool = True

    @property
    def _llm_type(self) -> str:
        return "streamed"

    def bind_tools(self, tools: Any, **kwargs: Any) -> _Streamed:
        return self

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any):  # type: ignore[no-untyped-def]
        return generate_from_stream(self._stream(messages))

    def _stream(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any):  # type: ignore[no-untyped-def]
        sent = estimate_message_tokens(messages)
        for k in range(1, 81):
            usage = {"input_tokens": sent, "output_tokens": k, "total_tokens": sent + k}
            last = k == 80
            yield ChatGenerationChunk(
                message=AIMessageChunk("reply ", usage_metadata=usage if self.running or last else None)  # type: ignore[arg-type]
            )


def test_a_usage_larger_than_the_window_is_not_taken_for_the_context():
    """A reply reporting more than the window holds (a streamed usage added up chunk by chunk) leaves the estimate.

    Trusted, the 80-fold figure put every turn over the threshold: a summary
    call each (every turn from the tenth of 40). The agent compacts as often
    as the same agent whose model reports its usage once.
    """

    def calls(running: bool) -> int:
        asked: list[str] = []

        def summarizer(prompt: str) -> str:
            asked.append(prompt)
            return "## Goal\n- answer the questions"

        agent = create_agent(
            _Streamed(running=running),
            middleware=[CompactionMiddleware(summarizer, CompactionOptions(context_window=8_000))],
            checkpointer=InMemorySaver(),
        )
        config = {"configurable": {"thread_id": "streamed"}}
        for turn in range(40):
            state = agent.invoke({"messages": [HumanMessage(f"question {turn} " * 40)]}, config)
        assert state["messages"][-1].usage_metadata["input_tokens"] > (8_000 if running else 0)
        return len(asked)

    honest = calls(running=False)
    assert 0 < honest < 5
    assert calls(running=True) == honest


def _recording(summary: str) -> tuple[list[str], Any]:
    """A plain-function summarizer answering ``summary``, and the prompts it was asked."""
    asked: list[str] = []

    def summarize(prompt: str) -> str:
        asked.append(prompt)
        return summary

    return asked, summarize


def _in_line(*nodes: tuple[str, Any]) -> Any:
    """A checkpointed graph running ``nodes`` (name, node) one after the other."""
    builder = StateGraph(CompactionState)
    previous = START
    for name, node in nodes:
        builder.add_node(name, node)
        builder.add_edge(previous, name)
        previous = name
    return builder.compile(checkpointer=InMemorySaver())


def test_a_node_plans_with_the_system_prompt_and_tools_its_model_node_adds(caplog: Any) -> None:
    """A model node sends a 5,000-token prompt the state does not hold; its usage says so, and the node plans with it.

    Planned without it, each compaction landed over its target and came back
    on the next turns (38 summary calls in 50 turns), and the
    warning blamed ``keep_recent_tokens``. Now the one warning names the part
    it cannot remove, and compactions come as that leaves room for.
    """
    prompt = SystemMessage("Follow the house rules. " * 830)
    hidden = estimate_message_tokens([prompt])
    assert 4_500 < hidden < 5_500

    def model(state: CompactionState) -> dict[str, list[BaseMessage]]:
        sent = estimate_message_tokens([prompt, *state["messages"]])
        usage = {"input_tokens": sent, "output_tokens": 100, "total_tokens": sent + 100}
        return {"messages": [AIMessage("reply " * 80, usage_metadata=usage)]}  # type: ignore[typeddict-item]

    calls, summarize = _recording("## Goal\n- answer the questions")
    graph = _in_line(("compact", CompactionNode(summarize, CompactionOptions(context_window=8_000))), ("model", model))
    config = {"configurable": {"thread_id": "hidden"}}
    with caplog.at_level(logging.WARNING, logger="langchain_compaction"):
        for turn in range(50):
            graph.invoke({"messages": [HumanMessage(f"q{turn} " * 80)]}, config)
    said = [r.getMessage() for r in caplog.records]
    assert not any("fired again" in line for line in said)
    fixed = [line for line in said if "over half of the" in line]
    assert len(fixed) == 1
    told = int(re.search(r"take (\d+) tokens", fixed[0])[1])  # type: ignore[index]
    assert abs(told - hidden) < hidden // 10
    assert 4 <= len(calls) <= 12


def test_a_worker_answer_handed_up_with_the_workers_usage_does_not_stop_compaction() -> None:
    """A supervisor's list ends each turn with a worker's answer carrying the worker's own usage, 40,300 tokens.

    That figure is over a quarter of the supervisor's estimate, so it was
    taken for the context on every turn: the node never compacted while the
    messages grew past 85,000 tokens in a 60,000 window. A usage that does not
    grow with the conversation from one reply to the next is not its own.
    """

    def worker(state: CompactionState) -> dict[str, list[BaseMessage]]:
        usage = {"input_tokens": 40_000, "output_tokens": 300, "total_tokens": 40_300}
        answer = AIMessage("worker: the bug is in parser.py line 40; patch attached. " * 10, name="worker")
        answer.usage_metadata = usage  # type: ignore[assignment]
        return {"messages": [answer]}

    calls, summarize = _recording("## Goal\n- fix the parser bug")
    graph = _in_line(
        ("worker", worker), ("compact", CompactionNode(summarize, CompactionOptions(context_window=60_000)))
    )
    config = {"configurable": {"thread_id": "supervisor"}}
    largest = 0
    for turn in range(30):
        state = graph.invoke({"messages": [HumanMessage(f"task {turn}: look into the parser bug " * 300)]}, config)
        largest = max(largest, estimate_message_tokens(state["messages"]))
    assert calls  # it compacted
    assert largest <= 60_000
