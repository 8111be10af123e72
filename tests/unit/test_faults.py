"""Faults: a misbehaving summary model on every adapter, sync and async, and a failing history store.

Model faults: the summarizer raises, hangs past ``CompactionOptions(timeout=...)``
(sync: ``time.sleep`` in a plain function; async: ``asyncio.sleep``), returns
"", returns whitespace, returns a summary ten times over the summary budget,
or is cancelled mid-call. Adapters: ``compact``/``acompact``, the graph node in
a real ``StateGraph`` with an ``InMemorySaver``, the middleware in a real
``create_agent`` agent with an ``InMemorySaver``, and the history wrapper.

After each fault: the state (or list, or store) is exactly as before (message
ids and contents compared), the error is the documented one, and the next call
with a working model compacts. Every test counts "messages lost": the ids sent
that are missing from everything the adapter keeps (the caller's list; the
current state plus every checkpoint of the thread; the store plus the archive)
and asserts it is 0. Each prints one ``FIGURE |`` line (run with ``-s``).

Store faults (history wrapper, journaled rewrite): the store raises on the
write after the archive write, on clear, and on read; nothing is lost and the
repair path finishes the rewrite.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pytest
from helpers_turns import PREPARE_OPTS, ToolCallingFake, cfg, long_history, prepare_of, prepared, wait_for
from langchain.agents import create_agent
from langchain_core.chat_history import BaseChatMessageHistory, InMemoryChatMessageHistory
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph

from langchain_compaction import (
    CompactingChatMessageHistory,
    CompactionNode,
    CompactionOptions,
    ExtractiveSummarizer,
    acompact,
    compact,
)
from langchain_compaction._lc.conversation import Conversation
from langchain_compaction._lc.convert import is_summary_message
from langchain_compaction.core.effects import Running
from langchain_compaction.core.engine import MAX_ABANDONED_CALLS
from langchain_compaction.core.tokens import estimate_tokens
from langchain_compaction.core.types import SummaryRequest
from langchain_compaction.errors import (
    EmptySummaryError,
    InvalidSummaryError,
    StoreError,
    SummarizationError,
    SummaryTimeoutError,
)
from langchain_compaction.graph import CompactionState
from langchain_compaction.middleware import CompactionMiddleware

GOOD = "## Goal\n- keep answering the user's questions\n\n## Critical Context\n- (none)"
OPTIONS = CompactionOptions(
    context_window=3000, reserve_tokens=1000, keep_recent_tokens=600, timeout=0.3, summary_input_tokens=100_000
)
# Cancellation needs the call to be waiting, not timed out first.
NO_TIMEOUT = CompactionOptions(context_window=3000, reserve_tokens=1000, keep_recent_tokens=600)
BUDGET = OPTIONS.budget.summary_max

EXPECTED: dict[str, type[BaseException]] = {
    "raises": SummarizationError,
    "hangs": SummaryTimeoutError,
    "empty": EmptySummaryError,
    "whitespace": EmptySummaryError,
    "oversized": InvalidSummaryError,
    "cancelled": asyncio.CancelledError,
}
CASES = [(fault, mode) for fault in EXPECTED for mode in ("sync", "async") if (fault, mode) != ("cancelled", "sync")]


class Fault:
    """A summarizer that misbehaves as told until ``kind`` is set to ``None``.

    ``sync`` is the plain function a caller passes on the sync path; ``asynchronous``
    the ``async def`` one for the async path.
    """

    def __init__(self, kind: str | None) -> None:
        self.kind = kind
        self.calls = 0
        self.answers: list[int] = []  # estimated tokens of each answer given

    def _answer(self) -> str:
        if self.kind == "raises":
            msg = "summary model is down"
            raise RuntimeError(msg)
        text = {
            None: GOOD,
            "empty": "",
            "whitespace": " \n\t  \n",
            "oversized": "## Goal\n- " + "word " * (8 * BUDGET),  # ten times the summary budget
        }.get(self.kind, GOOD)
        self.answers.append(estimate_tokens(text))
        return text

    def sync(self, prompt: str) -> str:
        self.calls += 1
        if self.kind == "hangs":
            time.sleep(2)  # a blocking call past the timeout: the library stops waiting
            return GOOD
        return self._answer()

    async def asynchronous(self, prompt: str) -> str:
        self.calls += 1
        if self.kind in ("hangs", "cancelled"):
            await asyncio.sleep(30)
        return self._answer()

    def for_mode(self, mode: str) -> Callable[[str], Any]:
        return self.sync if mode == "sync" else self.asynchronous


def conversation(prefix: str = "") -> list[BaseMessage]:
    """About 3,400 estimated tokens: system prompt, plain turns, a parallel tool exchange."""
    out: list[BaseMessage] = [SystemMessage("You are a helpful assistant.", id=f"{prefix}sys")]
    for i in range(30):
        out.append(HumanMessage(f"question {i}: " + "please explain the design " * 8, id=f"{prefix}u{i}"))
        if i == 10:
            calls = [{"name": "lookup", "args": {"q": f"topic {k}"}, "id": f"{prefix}c{k}"} for k in range(2)]
            out.append(AIMessage("", tool_calls=calls, id=f"{prefix}call"))
            out += [ToolMessage(f"notes {k} " * 20, tool_call_id=f"{prefix}c{k}", id=f"{prefix}t{k}") for k in range(2)]
        out.append(AIMessage(f"answer {i}: " + "the design keeps it simple " * 6, id=f"{prefix}a{i}"))
    return out


def fingerprint(messages: Iterable[BaseMessage]) -> list[tuple[str | None, str, Any]]:
    return [(m.id, m.type, m.content) for m in messages]


def lost(sent: Iterable[BaseMessage], *kept: Iterable[BaseMessage]) -> int:
    """How many of the ids sent are in none of ``kept``."""
    have = {m.id for group in kept for m in group}
    return sum(1 for m in sent if m.id not in have)


def figure(fault: str, adapter: str, mode: str, result: str, count: int) -> None:
    print(f"FIGURE | {fault} | {adapter} | {mode} | {result} | messages lost: {count}")


def check_error(fault: str, error: BaseException, model: Fault) -> str:
    expected = EXPECTED[fault]
    assert type(error) is expected, f"{fault}: expected {expected.__name__}, got {type(error).__name__}: {error}"
    if fault == "raises":
        assert isinstance(error.__cause__, RuntimeError)
        assert "summary model is down" in str(error)
    if fault == "hangs":
        assert isinstance(error, SummaryTimeoutError)
        assert error.timeout == OPTIONS.timeout
    if fault == "oversized":
        # Asked once more with the problem stated, then given up: two answers, both 10x over.
        assert model.calls == 2
        assert all(size >= 10 * BUDGET for size in model.answers)
        assert "more than the summary budget" in str(error)
    return type(error).__name__


async def provoke(fault: str, mode: str, model: Fault, call: Callable[[], Any]) -> BaseException:
    """Run ``call`` (a blocking call, or a coroutine factory) and return the error it ends with."""
    if fault == "cancelled":
        task = asyncio.ensure_future(call())
        while model.calls == 0:  # the summarizer is now awaiting
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError) as info:
            await task
        return info.value

    async def invoke() -> Any:
        return call() if mode == "sync" else await call()

    with pytest.raises(EXPECTED[fault]) as caught:
        await invoke()
    return caught.value


def options_for(fault: str) -> CompactionOptions:
    return NO_TIMEOUT if fault == "cancelled" else OPTIONS


# -- compact / acompact ---------------------------------------------------------------------


@pytest.mark.parametrize(("fault", "mode"), CASES)
async def test_compact(fault: str, mode: str) -> None:
    model = Fault(fault)
    messages = conversation()
    before = [m.model_copy(deep=True) for m in messages]
    options = options_for(fault)

    def call() -> Any:
        if mode == "sync":
            return compact(model.sync, messages, options)
        return acompact(model.asynchronous, messages, options)

    error = await provoke(fault, mode, model, call)
    result = check_error(fault, error, model)
    assert messages == before
    count = lost(before, messages)
    assert count == 0
    model.kind = None
    done = (
        compact(model.sync, messages, options)
        if mode == "sync"
        else await acompact(model.asynchronous, messages, options)
    )
    assert done[0] is not None
    assert is_summary_message(done[1][1])
    figure(fault, "compact", mode, result, count)


# -- the graph node, with a checkpointer ----------------------------------------------------------


def checkpointed_messages(graph: Any, cfg: Any) -> list[BaseMessage]:
    """Every message of every checkpoint of the thread."""
    return [m for snapshot in graph.get_state_history(cfg) for m in snapshot.values.get("messages", [])]


@pytest.mark.parametrize(("fault", "mode"), CASES)
async def test_graph_node(fault: str, mode: str) -> None:
    model = Fault(fault)
    builder = StateGraph(CompactionState)
    builder.add_node(CompactionNode(model.for_mode(mode), options_for(fault)))
    builder.add_edge(START, "compact")
    graph = builder.compile(checkpointer=InMemorySaver())
    cfg = {"configurable": {"thread_id": f"{fault}-{mode}"}}
    messages = conversation()

    def call() -> Any:
        if mode == "sync":
            return graph.invoke({"messages": messages}, cfg)
        return graph.ainvoke({"messages": messages}, cfg)

    error = await provoke(fault, mode, model, call)
    result = check_error(fault, error, model)
    state = graph.get_state(cfg).values["messages"]
    # The node wrote nothing: the thread holds exactly what was sent.
    assert fingerprint(state) == fingerprint(messages)
    count = lost(messages, state)
    assert count == 0
    model.kind = None
    follow = HumanMessage("and now?", id="next")
    if mode == "sync":
        final = graph.invoke({"messages": [follow]}, cfg)["messages"]
    else:
        final = (await graph.ainvoke({"messages": [follow]}, cfg))["messages"]
    assert is_summary_message(final[1])
    assert final[-1].id == "next"
    # Summarized messages are gone from the state, never from the thread's checkpoints.
    assert lost([*messages, follow], final, checkpointed_messages(graph, cfg)) == 0
    figure(fault, "graph node", mode, result, count)


# -- the middleware in create_agent -----------------------------------------------------------------


@pytest.mark.parametrize(("fault", "mode"), CASES)
async def test_middleware(fault: str, mode: str) -> None:
    model = Fault(fault)
    agent = create_agent(
        ToolCallingFake(messages=(AIMessage(f"reply {k}", id=f"reply{k}") for k in itertools.count())),
        middleware=[CompactionMiddleware(model.for_mode(mode), options_for(fault))],
        checkpointer=InMemorySaver(),
    )
    cfg = {"configurable": {"thread_id": f"{fault}-{mode}"}}
    messages = conversation()

    def call() -> Any:
        if mode == "sync":
            return agent.invoke({"messages": messages}, cfg)
        return agent.ainvoke({"messages": messages}, cfg)

    error = await provoke(fault, mode, model, call)
    result = check_error(fault, error, model)
    state = agent.get_state(cfg).values["messages"]
    assert fingerprint(state) == fingerprint(messages)
    count = lost(messages, state)
    assert count == 0
    model.kind = None
    follow = HumanMessage("and now?", id="next")
    if mode == "sync":
        final = agent.invoke({"messages": [follow]}, cfg)["messages"]
    else:
        final = (await agent.ainvoke({"messages": [follow]}, cfg))["messages"]
    assert sum(1 for m in final if is_summary_message(m)) == 1
    assert final[-1].content.startswith("reply")
    assert lost([*messages, follow], final, checkpointed_messages(agent, cfg)) == 0
    figure(fault, "middleware", mode, result, count)


# -- the history wrapper --------------------------------------------------------------------------


@pytest.mark.parametrize(("fault", "mode"), CASES)
async def test_history_wrapper(fault: str, mode: str) -> None:
    model = Fault(fault)
    store, archive = InMemoryChatMessageHistory(), InMemoryChatMessageHistory()
    history = CompactingChatMessageHistory(store, model.for_mode(mode), options_for(fault), archive=archive)
    messages = conversation()

    def call() -> Any:
        if mode == "sync":
            return history.add_messages(messages)
        return history.aadd_messages(messages)

    error = await provoke(fault, mode, model, call)
    result = check_error(fault, error, model)
    # The append was stored, the compaction wrote nothing, the archive is untouched.
    assert fingerprint(store.messages) == fingerprint(messages)
    assert archive.messages == []
    count = lost(messages, store.messages, archive.messages)
    assert count == 0
    model.kind = None
    follow = [HumanMessage("and now?", id="next")]
    if mode == "sync":
        history.add_messages(follow)
    else:
        await history.aadd_messages(follow)
    assert is_summary_message(store.messages[1])
    assert lost([*messages, *follow], store.messages, archive.messages) == 0
    figure(fault, "history wrapper", mode, result, count)


# -- store faults: the history wrapper over a failing store -------------------------------------------


class FlakyStore(BaseChatMessageHistory):
    """A list-backed store (journaled rewrite) whose Nth read or write, or whose clear, fails once armed."""

    def __init__(self) -> None:
        self._messages: list[BaseMessage] = []
        self.reads = 0
        self.writes = 0
        self.fail_read_at = -1
        self.fail_write_at = -1
        self.fail_clear = False

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        self.reads += 1
        if self.reads == self.fail_read_at:
            msg = "read timed out"
            raise TimeoutError(msg)
        return list(self._messages)

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        self.writes += 1
        if self.writes == self.fail_write_at:
            msg = "disk full"
            raise OSError(msg)
        self._messages.extend(messages)

    def clear(self) -> None:
        if self.fail_clear:
            msg = "connection reset"
            raise ConnectionError(msg)
        self._messages = []

    def disarm(self) -> None:
        self.fail_read_at = self.fail_write_at = -1
        self.fail_clear = False


def arm(store: FlakyStore, fault: str) -> str:
    """Arm ``fault`` for the compaction the next add triggers; return the failing operation."""
    if fault == "write after archive":
        store.fail_write_at = store.writes + 2  # the user's append succeeds, the rewrite's write fails
        return "add_messages"
    if fault == "clear":
        store.fail_clear = True
        return "clear"
    if fault == "read (snapshot)":
        store.fail_read_at = store.reads + 2  # the append's own read succeeds, the snapshot's fails
        return "read"
    store.fail_read_at = store.reads + 3  # the re-read under the lock, after the summary was made
    return "read"


STORE_FAULTS = ["write after archive", "clear", "read (snapshot)", "read (after summary)"]


async def _add(history: CompactingChatMessageHistory, messages: list[BaseMessage], mode: str) -> None:
    if mode == "sync":
        history.add_messages(messages)
    else:
        await history.aadd_messages(messages)


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("fault", STORE_FAULTS)
async def test_store_fault(fault: str, mode: str) -> None:
    store, archive = FlakyStore(), InMemoryChatMessageHistory()
    history = CompactingChatMessageHistory(store, lambda p: GOOD, OPTIONS, archive=archive)
    assert "journal" in repr(history)
    messages = conversation()
    await _add(history, messages[:10], mode)  # under budget: no compaction yet
    operation = arm(store, fault)
    batch = messages[10:]
    with pytest.raises(StoreError) as info:
        await _add(history, batch, mode)
    # Both paths name the operation alike (one flow serves both).
    assert info.value.operation == operation
    assert isinstance(info.value.__cause__, (OSError, ConnectionError, TimeoutError))
    assert "No message was lost" in str(info.value)
    store.disarm()
    raw = list(store._messages)
    if fault == "write after archive":
        # The store was cleared and the write failed: the originals are in the
        # archive, the rewrite is pending in the process, and every reader sees
        # the finished target.
        assert raw == []
        assert len(archive.messages) > 0
        view = history.messages if mode == "sync" else await history.aget_messages()
        assert is_summary_message(view[1])
        count = lost(messages, view, archive.messages)
    else:
        # Nothing was rewritten: the store holds exactly what was sent.
        assert fingerprint(raw) == fingerprint(messages)
        count = lost(messages, raw, archive.messages)
    assert count == 0
    # The repair path. A pending rewrite (write or clear failed) is finished
    # by the next call of any method; a failed read left nothing pending.
    if fault == "write after archive":
        # The read above already finished it.
        assert fingerprint(store._messages) == fingerprint(view)
    if mode == "sync":
        assert history.repair() is (fault == "clear")
    else:
        await history.aget_messages()
    if fault in ("write after archive", "clear"):
        assert is_summary_message(store._messages[1])
        assert lost(messages, store._messages, archive.messages) == 0
    follow = [HumanMessage("and now?", id="next")]
    await _add(history, follow, mode)
    final = list(store._messages)
    assert is_summary_message(final[1])
    assert final[-1].id == "next"
    assert lost([*messages, *follow], final, archive.messages) == 0
    # Each original was archived once, even when the rewrite ran twice.
    ids = [m.id for m in archive.messages]
    assert len(ids) == len(set(ids))
    figure(f"store {fault}", "history wrapper", mode, f"StoreError({operation}) then repaired", count)


# -- timeouts and cancellation of the summary call ---------------------------------------------------


def test_a_model_raising_timeout_error_is_a_failure_not_our_deadline():
    """A model that raises TimeoutError itself is a SummarizationError, not the library's SummaryTimeoutError."""

    def flaky(prompt: str) -> str:
        raise TimeoutError("the model service is down")

    messages = [HumanMessage("a " * 300), AIMessage("b " * 300), HumanMessage("c")]
    with pytest.raises(SummarizationError) as sync_error:
        compact(flaky, messages, CompactionOptions(timeout=30))
    with pytest.raises(SummarizationError) as async_error:
        asyncio.run(acompact(flaky, messages, CompactionOptions(timeout=30)))
    for info in (sync_error, async_error):
        assert not isinstance(info.value, SummaryTimeoutError)
        assert "the model service is down" in str(info.value)


class SlowToCancel:
    """An async summarizer that hangs, and on cancellation cleans up for a moment (closing a
    connection) before it lets the cancellation through, as HTTP clients do."""

    name = "slow-to-cancel"

    def summarize(self, request: SummaryRequest) -> str:
        raise NotImplementedError

    async def asummarize(self, request: SummaryRequest) -> str:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            await asyncio.sleep(0.4)  # cleanup
            raise
        return "## Goal\n- x"


async def test_caller_cancellation_with_timeout_stays_a_cancellation() -> None:
    """A caller's cancellation during a timed-out summary call surfaces as CancelledError, not a timeout."""
    options = CompactionOptions(context_window=3_000, timeout=0.1)
    caller = asyncio.ensure_future(acompact(SlowToCancel(), long_history(), options))
    await asyncio.sleep(0.25)  # past the 0.1 s deadline: the library is awaiting the cancelled summary call
    caller.cancel()
    outcome = (await asyncio.gather(caller, return_exceptions=True))[0]
    assert isinstance(outcome, asyncio.CancelledError), f"the caller's cancellation became {outcome!r}"


async def test_cancelled_background_preparation_task_is_cancelled() -> None:
    """A background preparation task that is cancelled ends cancelled (it does not swallow the cancellation)."""
    node = CompactionNode(SlowToCancel(), PREPARE_OPTS, features=prepared(wait=0.1))
    history = long_history(48, 40)
    assert prepare_of(node).mark < node.context_tokens(history) < PREPARE_OPTS.budget.threshold
    before = asyncio.all_tasks()
    await node.ainvoke({"messages": history}, cfg("bg"))
    started = asyncio.all_tasks() - before - {asyncio.current_task()}
    assert prepare_of(node).running(Conversation("bg")), "no preparation is running after a turn past the mark"
    assert len(started) == 1, started  # the preparation's task
    (task,) = started
    assert not task.done()
    await asyncio.sleep(0.05)
    task.cancel()
    await asyncio.wait({task}, timeout=2)
    assert task.done()
    assert task.cancelled(), "the cancelled background preparation task returned normally"


def test_timed_out_sync_summary_calls_do_not_pile_up_threads() -> None:
    """Summary calls that hang past their timeout leave a bounded number of threads behind."""
    release = threading.Event()

    def hanging(prompt: str) -> str:
        release.wait(30)
        return "## Goal\n- x"

    def alive() -> int:
        return sum(1 for t in threading.enumerate() if t.name == "langchain-compaction-call" and t.is_alive())

    options = CompactionOptions(context_window=3_000, timeout=0.05)
    baseline = alive()
    try:
        for _ in range(8):
            with pytest.raises(SummaryTimeoutError):
                compact(hanging, long_history(), options)
        leaked = alive() - baseline
    finally:
        release.set()
    wait_for(lambda: alive() <= baseline, 3.0)  # released: they end
    assert leaked <= 4, f"{leaked} summary threads are still alive after 8 timed-out calls"


_RESPONSES_REFUSAL = AIMessage(content=[{"type": "refusal", "refusal": "I can't help with that."}])


@pytest.mark.parametrize(
    "metadata",
    [{"stop_reason": "refusal"}, {"finish_reason": "content_filter"}, {}],
    ids=["anthropic refusal", "openai content filter", "openai responses refusal block"],
)
def test_a_chat_model_that_declines_writes_no_summary(metadata: dict[str, str]) -> None:
    """A refusal's text ("I can't help with that") is no summary: an error, or the fallback writes it."""
    messages = [HumanMessage("Rebook JG7FMM on the 21st.", id="h")]
    for i in range(30):
        messages += [
            AIMessage(f"option {i} " * 20, id=f"a{i}"),
            HumanMessage(f"what about option {i}? " * 5, id=f"q{i}"),
        ]

    def declining() -> GenericFakeChatModel:
        reply = AIMessage("I can't help with that.", response_metadata=metadata) if metadata else _RESPONSES_REFUSAL
        return GenericFakeChatModel(messages=itertools.repeat(reply))

    options = CompactionOptions(context_window=4_000)
    with pytest.raises(SummarizationError, match="declined to summarize"):
        compact(declining(), messages, options)
    result, _ = compact(declining(), messages, options, fallback=ExtractiveSummarizer())
    assert result is not None
    assert result.fallback_used
    assert "can't help" not in result.summary


def test_a_summarizer_that_answers_with_a_tool_call_is_named_as_such() -> None:
    """The agent's model passed with its tools bound calls a tool: an error that says so, or the fallback."""
    messages = [HumanMessage(f"question {i} " * 40, id=f"q{i}") for i in range(30)]
    call = {"name": "search", "args": {"query": "x"}, "id": "c1", "type": "tool_call"}

    def tool_calling() -> GenericFakeChatModel:
        return GenericFakeChatModel(messages=itertools.repeat(AIMessage("Let me look.", tool_calls=[call])))

    options = CompactionOptions(context_window=4_000)
    with pytest.raises(SummarizationError, match=r"answered with a tool call \(search\).*without tools bound"):
        compact(tool_calling(), messages, options)
    result, _ = compact(tool_calling(), messages, options, fallback=ExtractiveSummarizer())
    assert result is not None
    assert result.fallback_used


def test_a_fallback_that_answers_for_a_failing_summarizer_says_why_it_had_to(caplog: pytest.LogCaptureFixture) -> None:
    """The summarizer's error is told at WARNING, with the fallback's name: it was dropped, and said only at INFO
    that a fallback was used (a summarizer failing on every call, a revoked key, went unseen)."""
    messages = [HumanMessage(f"question {i} " * 40, id=f"q{i}") for i in range(30)]

    def unavailable(prompt: str) -> str:
        raise RuntimeError("HTTP 503: the model is overloaded")

    with caplog.at_level(logging.WARNING, logger="langchain_compaction"):
        result, _ = compact(
            unavailable, messages, CompactionOptions(context_window=4_000), fallback=ExtractiveSummarizer()
        )
    assert result is not None
    assert result.fallback_used
    told = [r.getMessage() for r in caplog.records if "the summarizer failed" in r.getMessage()]
    assert len(told) == 1
    assert "HTTP 503: the model is overloaded" in told[0]
    assert "extractive" in told[0].lower()


def test_summary_calls_within_their_deadline_take_no_abandoned_slot() -> None:
    """Six threads compacting at once, each call well within its timeout: none fails for want of a slot."""
    errors: list[BaseException] = []

    def slow(prompt: str) -> str:
        time.sleep(0.3)
        return "## Goal\n- x"

    def run() -> None:
        try:
            compact(slow, long_history(), CompactionOptions(context_window=3_000, timeout=30))
        except BaseException as error:
            errors.append(error)

    workers = [threading.Thread(target=run) for _ in range(6)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(20)
    assert not errors, errors


class _HangingChatModel(GenericFakeChatModel):
    """A chat model with a sync path only (LangChain runs it on asyncio's default executor), hung until released."""

    release: Any = None

    def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> ChatResult:
        self.release.wait(30)
        return ChatResult(generations=[ChatGeneration(message=AIMessage("## Goal\n- x"))])


@pytest.mark.parametrize("shape", ["function", "chat model piped into a parser"])
def test_an_async_caller_never_waits_for_a_hung_blocking_summarizer_nor_starves_the_executor(shape: str) -> None:
    """asyncio.run(acompact(...)) honours timeout=, and abandoned calls take none of asyncio's executor threads.

    A pipe (``model | StrOutputParser()``) ran its sync-only model on that executor.
    """
    from langchain_core.output_parsers import StrOutputParser

    release = threading.Event()

    def hanging_function(prompt: str) -> str:
        release.wait(30)
        return "## Goal\n- x"

    piped = _HangingChatModel(messages=iter(()), release=release) | StrOutputParser()
    hanging = hanging_function if shape == "function" else piped

    async def main() -> float:
        for _ in range(8):  # more than the default executor's threads on a small machine
            with pytest.raises(SummaryTimeoutError):
                await acompact(hanging, long_history(), CompactionOptions(context_window=3_000, timeout=0.05))
        started = time.monotonic()
        await asyncio.wait_for(asyncio.to_thread(lambda: None), timeout=5)  # the default executor is free
        return time.monotonic() - started

    try:
        started = time.monotonic()
        free = asyncio.run(main())
        took = time.monotonic() - started
    finally:
        release.set()
    assert free < 1.0
    assert took < 5.0, f"asyncio.run waited {took:.1f} s for abandoned summary calls"


@pytest.mark.parametrize("metadata", [{"stop_reason": "max_tokens"}, {"finish_reason": "length"}])
def test_a_summary_cut_at_the_models_output_limit_is_said(
    metadata: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    """A chat model's reply that stopped at its max_tokens is kept, and a warning names the fix."""
    reply = AIMessage("## Goal\n- fix the parser and then", response_metadata=metadata)
    with caplog.at_level(logging.WARNING, logger="langchain_compaction"):
        result, _ = compact(GenericFakeChatModel(messages=itertools.repeat(reply)), long_history())
    assert result is not None
    assert any("cut short" in r.getMessage() and "max_tokens" in r.getMessage() for r in caplog.records)


def test_a_reply_cut_short_past_the_length_asked_for_is_not_told_to_raise_max_tokens(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A model that ran past the budget to its own limit: a larger max_tokens would only let it run on."""
    reply = AIMessage("## Goal\n" + "- fix the parser and then\n" * 90, response_metadata={"finish_reason": "length"})
    with caplog.at_level(logging.WARNING, logger="langchain_compaction"):
        model = GenericFakeChatModel(messages=itertools.repeat(reply))
        compact(model, long_history(), CompactionOptions(summary_max_tokens=300), fallback=ExtractiveSummarizer())
    said = [r.getMessage() for r in caplog.records if "output limit" in r.getMessage()]
    assert said
    assert all("past the length it was asked for" in m and "at least summary_max_tokens" not in m for m in said)


def test_cache_writes_langchain_anthropic_reports_by_lifetime_are_counted() -> None:
    """langchain-anthropic moves the cache write count to ephemeral_5m/1h_input_tokens and zeroes cache_creation."""
    usage = {
        "input_tokens": 4_050,
        "output_tokens": 30,
        "total_tokens": 4_080,
        "input_token_details": {"cache_read": 0, "cache_creation": 0, "ephemeral_5m_input_tokens": 4_000},
    }
    reply = AIMessage("## Goal\n- fix the parser", usage_metadata=usage)
    result, _ = compact(GenericFakeChatModel(messages=itertools.repeat(reply)), long_history())
    assert result is not None
    assert result.summarizer_cache_write_tokens == 4_000
    assert result.summarizer_billed_input_tokens == 50


@pytest.mark.parametrize("kind", ["BaseChatModel", "SimpleChatModel", "with_fallbacks", "RunnableLambda"])
def test_a_sync_only_chat_model_that_hangs_is_abandoned_on_time_under_asyncio_run(kind: str) -> None:
    """A chat model with no async path of its own (``_generate``, or ``SimpleChatModel``'s ``_call``) is called
    on a thread of the library's, not asyncio's executor, which ``asyncio.run`` waits for."""
    from langchain_core.language_models import SimpleChatModel
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.runnables import RunnableLambda

    release = threading.Event()

    class HungGenerate(BaseChatModel):
        @property
        def _llm_type(self) -> str:
            return "hung"

        def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> ChatResult:
            release.wait(30)
            return ChatResult(generations=[ChatGeneration(message=AIMessage("## Goal\n- x"))])

    class HungCall(SimpleChatModel):
        @property
        def _llm_type(self) -> str:
            return "hung-simple"

        def _call(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> str:
            release.wait(30)
            return "## Goal\n- x"

    def hung(messages: Any) -> str:
        release.wait(30)
        return "## Goal\n- x"

    model: Any = {
        "BaseChatModel": HungGenerate(),
        "SimpleChatModel": HungCall(),
        "with_fallbacks": HungGenerate().with_fallbacks([HungCall()]),
        "RunnableLambda": RunnableLambda(hung),
    }[kind]

    async def main() -> None:
        with pytest.raises(SummaryTimeoutError):
            await acompact(model, long_history(), CompactionOptions(context_window=3_000, timeout=0.2))

    started = time.monotonic()
    try:
        asyncio.run(main())
        took = time.monotonic() - started
    finally:
        release.set()
    assert took < 5.0, f"asyncio.run returned after {took:.1f} s"


def test_an_async_summarizer_is_not_refused_for_threads_other_calls_abandoned() -> None:
    """Four hung blocking calls abandoned: blocking calls are refused at once, a native async one still runs."""
    release = threading.Event()

    def hanging(prompt: str) -> str:
        release.wait(30)
        return "## Goal\n- x"

    async def answering(prompt: str) -> str:
        return "## Goal\n- answered"

    options = CompactionOptions(context_window=3_000, timeout=0.05)
    try:
        for _ in range(4):
            with pytest.raises(SummaryTimeoutError):
                compact(hanging, long_history(), options)
        with pytest.raises(SummaryTimeoutError, match="still running past their timeout") as refused:
            compact(hanging, long_history(), options)
        assert "give its client a timeout of its own" in str(refused.value)  # not "raise the timeout": it hangs
        result, _ = asyncio.run(acompact(answering, long_history(), options))
        assert result is not None
        assert "answered" in result.summary
    finally:
        release.set()
    wait_for(lambda: Running.abandoned() == 0, 5.0)


def test_calls_cancelled_within_their_deadline_do_not_refuse_other_conversations() -> None:
    """A client that disconnects cancels its run: the blocking call runs on within its timeout, and is
    no reason to refuse another conversation's compaction (four such made every other one fail at once)."""
    release = threading.Event()
    started = threading.Semaphore(0)

    def hanging(prompt: str) -> str:
        started.release()
        release.wait(30)
        return "## Goal\n- x"

    async def cancel_one() -> None:
        task = asyncio.ensure_future(
            acompact(hanging, long_history(), CompactionOptions(context_window=3_000, timeout=2.0))
        )
        await asyncio.to_thread(started.acquire, True, 5.0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    try:
        for _ in range(MAX_ABANDONED_CALLS):
            asyncio.run(cancel_one())
        assert Running.abandoned() == 0  # running, but within their time
        result, _ = compact(
            lambda prompt: "## Goal\n- another conversation", long_history(), CompactionOptions(timeout=2.0)
        )
        assert result is not None
        # Past their deadline, still running: now they count.
        wait_for(lambda: Running.abandoned() == MAX_ABANDONED_CALLS, 5.0)
        with pytest.raises(SummaryTimeoutError, match="still running past their timeout"):
            compact(hanging, long_history(), CompactionOptions(context_window=3_000, timeout=2.0))
    finally:
        release.set()
    wait_for(lambda: Running.abandoned() == 0, 5.0)


def test_cancelled_calls_made_without_a_timeout_never_refuse_timed_calls() -> None:
    """An untimed call has no deadline to be past: clients of a graph without ``timeout=`` that disconnect
    mid-summary are no reason to refuse a timed compaction elsewhere (four such made every one fail at once)."""
    release = threading.Event()
    started = threading.Semaphore(0)
    ended = threading.Semaphore(0)

    def hanging(prompt: str) -> str:
        started.release()
        try:
            release.wait(30)
        finally:
            ended.release()
        return "## Goal\n- x"

    async def cancel_untimed() -> None:
        tasks = [
            asyncio.ensure_future(acompact(hanging, long_history(), CompactionOptions(context_window=3_000)))
            for _ in range(MAX_ABANDONED_CALLS)
        ]
        for _ in tasks:
            await asyncio.to_thread(started.acquire, True, 5.0)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with pytest.raises(asyncio.CancelledError):
                await task

    try:
        asyncio.run(cancel_untimed())
        result, _ = compact(
            lambda prompt: "## Goal\n- another conversation", long_history(), CompactionOptions(timeout=2.0)
        )
        assert result is not None
        assert "another conversation" in result.summary
        assert Running.abandoned() == 0  # still running, past no deadline
    finally:
        release.set()
    for _ in range(MAX_ABANDONED_CALLS):
        assert ended.acquire(timeout=5.0)


def test_a_summary_error_is_chained_to_what_the_model_raised_not_to_itself() -> None:
    """A summarizer that raises the library's own error keeps its cause; the engine does not chain it to itself."""

    class Broken(ConnectionError):
        pass

    def failing(prompt: str) -> str:
        try:
            raise Broken("connection reset")
        except Broken as error:
            raise SummarizationError("the model failed") from error

    with pytest.raises(SummarizationError) as raised:
        compact(failing, long_history(), CompactionOptions(context_window=3_000))
    assert isinstance(raised.value.__cause__, Broken)


def test_the_timeout_reaches_the_client_through_the_wrappers_users_pass() -> None:
    """``with_fallbacks``, ``with_retry``, ``bind`` and ``init_chat_model``'s configurable model: each client gets it."""
    from langchain.chat_models import init_chat_model
    from langchain_anthropic import ChatAnthropic

    from langchain_compaction.core.types import SummaryRequest
    from langchain_compaction.summarizers.chat_model import _client_timeout

    request = SummaryRequest("system", "prompt", (), timeout=2.5)
    claude = ChatAnthropic(model="claude-haiku-4-5", api_key="x")  # type: ignore[call-arg]
    other = ChatAnthropic(model="claude-sonnet-4-5", api_key="x")  # type: ignore[call-arg]
    configurable = init_chat_model(
        "claude-haiku-4-5", model_provider="anthropic", api_key="x", configurable_fields="any"
    )
    for model in (
        claude,
        claude.bind(temperature=0),
        claude.with_retry(),
        claude.with_fallbacks([other]),
        configurable,
    ):
        assert _client_timeout(model, request) == {"timeout": 2.5}, model
    # A client not known to take it per call, anywhere in the chain: not passed (it would be refused).
    fake = GenericFakeChatModel(messages=iter([AIMessage("x")]))
    assert _client_timeout(claude.with_fallbacks([fake]), request) == {}


def test_a_summarizer_with_an_async_path_only_called_from_sync_code_says_which_calls_to_use() -> None:
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.outputs import ChatGeneration, ChatResult

    class AsyncOnly(BaseChatModel):
        @property
        def _llm_type(self) -> str:
            return "async-only"

        def _generate(self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any) -> ChatResult:
            raise NotImplementedError("sync not supported")

        async def _agenerate(
            self, messages: Any, stop: Any = None, run_manager: Any = None, **kwargs: Any
        ) -> ChatResult:
            return ChatResult(generations=[ChatGeneration(message=AIMessage("## Goal\n- x"))])

    options = CompactionOptions(context_window=4_000)
    with pytest.raises(SummarizationError, match="no sync path: use acompact"):
        compact(AsyncOnly(), long_history(), options)
    result, _ = asyncio.run(acompact(AsyncOnly(), long_history(), options))
    assert result is not None


def test_a_pipe_with_an_async_only_step_beside_a_sync_only_model_is_awaited() -> None:
    """``SyncOnly() | RunnableLambda(async def ...)``: invoke would refuse the async step, so the pipe is awaited."""
    from langchain_core.runnables import RunnableLambda

    async def tidy(message: AIMessage) -> str:
        return str(message.content).strip()

    release = threading.Event()
    release.set()
    piped = _HangingChatModel(messages=iter(()), release=release) | RunnableLambda(tidy)
    result, _ = asyncio.run(acompact(piped, long_history(), CompactionOptions(context_window=3_000)))
    assert result is not None
    assert result.summary.startswith("## Goal")
