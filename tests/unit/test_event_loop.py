"""Blocking work never runs on the event loop: token counters and sync summarizers, in every async adapter."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from helpers_turns import SUMMARY, chat
from langchain.agents import create_agent
from langchain_core.chat_history import InMemoryChatMessageHistory
from langchain_core.language_models import FakeListChatModel
from langchain_core.messages import BaseMessage, HumanMessage

from langchain_compaction import (
    CompactingChatMessageHistory,
    CompactionMiddleware,
    CompactionNode,
    CompactionOptions,
    ExtractiveSummarizer,
    acompact,
)
from langchain_compaction.tokens import estimate_message_tokens


def on_a_loop() -> bool:
    """Whether the calling thread is running an event loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class ThreadRecordingCounter:
    """A custom token_counter that notes whether it ran on an event loop's thread."""

    def __init__(self) -> None:
        self.on_loop = 0
        self.calls = 0

    def __call__(self, messages: list[BaseMessage]) -> int:
        self.calls += 1
        self.on_loop += on_a_loop()
        return estimate_message_tokens(messages)


async def test_token_counters_run_off_the_event_loop() -> None:
    """A custom token counter never runs on the event loop's thread, in any async adapter."""
    counter = ThreadRecordingCounter()
    options = CompactionOptions(
        context_window=20_000, reserve_tokens=4_000, keep_recent_tokens=2_000, token_counter=counter
    )
    history = chat(20, size=200)
    summarize = ExtractiveSummarizer()
    await CompactionNode(summarize, options).ainvoke({"messages": history})
    await CompactionMiddleware(summarize, options).abefore_model({"messages": history}, None)  # type: ignore[arg-type]
    await acompact(summarize, history, options)
    memory = CompactingChatMessageHistory(InMemoryChatMessageHistory(), summarize, options)
    await memory.aadd_messages(history)
    assert counter.calls > 0
    assert counter.on_loop == 0


class LoopCheckingExtractive(ExtractiveSummarizer):
    """The offline summarizer, noting whether it ran on an event loop's thread."""

    def summarize(self, request):  # type: ignore[no-untyped-def]
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            RAN["off the loop"] = RAN.get("off the loop", 0) + 1
        else:
            RAN["on the loop"] = RAN.get("on the loop", 0) + 1
        return super().summarize(request)


RAN: dict[str, int] = {}


async def test_sync_summarizers_run_off_the_event_loop() -> None:
    """Sync summarizers (a Summarizer or a plain function) run off the event loop in every async adapter."""
    RAN.clear()
    on_loop: list[str] = []

    def plain(prompt: str) -> str:
        try:
            asyncio.get_running_loop()
            on_loop.append("plain")
        except RuntimeError:
            pass
        return "## Goal\n- answer"

    options = CompactionOptions(context_window=20_000, reserve_tokens=4_000, keep_recent_tokens=2_000)
    history = chat(20, size=200)
    for summarizer in (LoopCheckingExtractive(), plain):
        await CompactionNode(summarizer, options).ainvoke({"messages": history})
        await CompactionMiddleware(summarizer, options).abefore_model({"messages": history}, None)  # type: ignore[arg-type]
        await acompact(summarizer, history, options)
        memory = CompactingChatMessageHistory(InMemoryChatMessageHistory(), summarizer, options)
        await memory.aadd_messages(history)
    assert RAN.get("off the loop", 0) >= 4
    assert RAN.get("on the loop", 0) == 0
    assert on_loop == []


class LoopRecordingCounter:
    def __init__(self) -> None:
        self.on_loop: list[str] = []
        self.calls = 0

    def __call__(self, messages: list[BaseMessage]) -> int:
        self.calls += 1
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            self.on_loop.append(type(messages[0]).__name__)
        return estimate_message_tokens(messages)


async def test_the_middleware_counts_the_system_prompt_off_the_loop() -> None:
    """The middleware counts the agent's system prompt off the event loop too."""
    counter = LoopRecordingCounter()
    middleware = CompactionMiddleware(
        lambda p: SUMMARY, CompactionOptions(context_window=200_000, token_counter=counter)
    )
    agent = create_agent(FakeListChatModel(responses=["hi"]), system_prompt="You are helpful.", middleware=[middleware])
    await agent.ainvoke({"messages": [("user", "hello")]})
    assert counter.calls > 0
    assert counter.on_loop == []


class ThreadRecordingRedactor:
    """A ``redact`` function (it runs while a compaction is planned, on every text) that notes its threads."""

    def __init__(self) -> None:
        self.on_loop = 0
        self.threads: set[int] = set()

    def __call__(self, text: str) -> str:
        self.threads.add(threading.get_ident())
        self.on_loop += on_a_loop()
        return text


async def test_the_library_cpu_work_runs_off_the_event_loop_on_one_worker() -> None:
    """Planning, redacting and summarizing offline leave the event loop free, on one worker thread.

    Twenty conversations compacting at once on one async graph share that
    worker, so the loop waits behind one thread for the interpreter lock, not
    behind twenty (a thread per call kept it waiting over 100 ms).
    """
    redact = ThreadRecordingRedactor()
    options = CompactionOptions(context_window=20_000, reserve_tokens=4_000, keep_recent_tokens=2_000, redact=redact)
    node = CompactionNode(ExtractiveSummarizer(), options)
    histories = [[HumanMessage(f"conversation {n}", id=f"c{n}"), *chat(20, size=200)] for n in range(20)]
    updates = await asyncio.gather(*(node.ainvoke({"messages": h}) for h in histories))
    assert all(update and update["messages"] for update in updates)  # every conversation compacted
    assert redact.threads  # the flow did redact
    assert redact.on_loop == 0
    assert threading.get_ident() not in redact.threads
    assert len(redact.threads) == 1


def _compute_in_a_forked_child(results: Any) -> None:
    from langchain_compaction.core.effects import compute_off_loop

    results.put(asyncio.run(asyncio.wait_for(compute_off_loop(sum, [20, 22]), timeout=10)))


def test_the_worker_thread_works_in_a_forked_child() -> None:
    """A process forked after the worker thread ran (a pre-loading server, a prefork pool) gets a worker of its own."""
    import multiprocessing

    from langchain_compaction.core.effects import compute_off_loop

    assert asyncio.run(compute_off_loop(sum, [1, 2])) == 3  # the parent's worker thread exists
    fork = multiprocessing.get_context("fork")
    results = fork.Queue()
    child = fork.Process(target=_compute_in_a_forked_child, args=(results,))
    child.start()
    child.join(30)
    assert child.exitcode == 0
    assert results.get(timeout=1) == 42


async def test_the_worker_offers_the_interpreter_lock_in_its_loops_and_no_other_thread_does(monkeypatch) -> None:
    """``breathe`` sleeps (releasing the lock to a waiting event loop) on the worker thread only.

    What it buys, the loop's worst pause with twenty conversations compacting,
    is measured by ``bench/loop_stall.py``, not here.
    """
    import time

    from langchain_compaction.core import effects

    offers: list[int] = []
    real_sleep = time.sleep

    def recording_sleep(seconds: float) -> None:
        offers.append(threading.get_ident())
        real_sleep(seconds)

    monkeypatch.setattr(effects.time, "sleep", recording_sleep)

    def busy() -> int:
        # Calls 3 ms apart: each offers (the interval is 1 ms), but perhaps the
        # first, if the worker offered under a millisecond before this job.
        for _ in range(3):
            effects.breathe()
            started = time.perf_counter()
            while time.perf_counter() - started < 0.003:
                pass
        return threading.get_ident()

    worker = await effects.compute_off_loop(busy)
    assert offers.count(worker) >= 2
    assert set(offers) == {worker}
    offers.clear()
    for _ in range(1_000):
        effects.breathe()  # the loop's own thread (a sync caller's): never sleeps
    await asyncio.to_thread(effects.breathe)  # another thread: nor there
    assert offers == []
