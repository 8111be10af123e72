"""Defects a read of the whole 0.1.0 package found; each test here failed on 0.1.0."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from langchain_core.chat_history import InMemoryChatMessageHistory
from langchain_core.language_models import FakeListChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from langchain_compaction import (
    CompactingChatMessageHistory,
    CompactionError,
    CompactionMiddleware,
    CompactionNode,
    CompactionOptions,
    ExtractiveSummarizer,
    acompact,
    auto_compact,
    compact,
    should_compact,
)
from langchain_compaction._lc.convert import to_core_list
from langchain_compaction.core.prompts import CACHE_ALIGNED_PROMPT
from langchain_compaction.core.tokens import estimate_message, estimate_tokens
from langchain_compaction.features import CacheAligned, default_features
from langchain_compaction.features.clearing import plan_clearing
from langchain_compaction.history import InProcessLock
from langchain_compaction.tokens import estimate_message_tokens

ROOT = Path(__file__).resolve().parents[2]


def chat(turns: int, size: int = 400) -> list[BaseMessage]:
    messages: list[BaseMessage] = []
    for i in range(turns):
        messages += [HumanMessage(f"question {i} " * size, id=f"h{i}"), AIMessage(f"answer {i} " * size, id=f"a{i}")]
    return messages


# 1. clearing: fewer results than keep_tool_uses must protect them all ---------------


def test_clearing_protects_every_result_when_there_are_fewer_than_keep_tool_uses() -> None:
    messages = []
    for i in range(2):
        call = {"name": "read", "args": {"path": f"f{i}"}, "id": f"c{i}"}
        messages += [AIMessage("", tool_calls=[call], id=f"a{i}"), ToolMessage("x " * 2_000, tool_call_id=f"c{i}")]
    messages.append(HumanMessage("go on " * 100))
    core = to_core_list(messages)
    counts = [estimate_message(m) for m in core]
    # Clearing the first result alone would reach the target, and it lies outside the keep budget.
    assert sum(counts) > 1_500 > sum(counts) - counts[1] + 100
    plan = plan_clearing(core, counts, keep_recent_tokens=200, target_tokens=1_500, keep_tool_uses=3, min_tokens=10)
    assert plan is None  # nothing may be cleared: both are among the last three results
    plan = plan_clearing(core, counts, keep_recent_tokens=200, target_tokens=1_500, keep_tool_uses=1, min_tokens=10)
    assert plan is not None
    assert plan.indices == (1,)


# 2. reserve_tokens=0 means the default, as in pi's options ------------------------------


def test_a_zero_reserve_means_the_default_and_every_adapter_compacts() -> None:
    options = CompactionOptions(context_window=20_000, reserve_tokens=0, keep_recent_tokens=1_000)
    assert options.reserve_tokens is None  # derived, like an option left out
    assert options.budget.reserve == 20_000 // 8
    history = chat(40)  # 80 messages, about 10x the window
    assert estimate_message_tokens(history) > 10 * 20_000 // 2
    summarize = ExtractiveSummarizer()
    assert should_compact(history, options=options)
    assert auto_compact(summarize, history, options)[0] is not None
    assert CompactionNode(summarize, options).invoke({"messages": history})
    assert CompactionMiddleware(summarize, options).before_model({"messages": history}, None)  # type: ignore[arg-type]
    memory = CompactingChatMessageHistory(InMemoryChatMessageHistory(), summarize, options)
    memory.add_messages(history)
    assert len(memory.messages) < len(history)
    # The bare seed signature keeps the seed's rule: a reserve of 0 or less answers no.
    assert should_compact(history, 20_000, 0) is False


# 3. a blocking hold on the loop's thread while a task holds the lock ----------------------


def test_blocking_hold_on_the_loop_thread_while_a_task_holds_the_lock_raises() -> None:
    lock = InProcessLock()

    async def main() -> None:
        async with lock.ahold():
            with pytest.raises(CompactionError, match="deadlock the loop"), lock.hold():
                pass

    asyncio.run(main())
    with lock.hold():  # released: usable again
        pass


def test_hold_and_ahold_exclude_each_other_across_threads() -> None:
    lock = InProcessLock()
    inside = threading.Event()
    release = threading.Event()
    order: list[str] = []

    def holder() -> None:
        with lock.hold():
            inside.set()
            release.wait(5)
            order.append("thread out")

    async def main() -> None:
        worker = threading.Thread(target=holder)
        worker.start()
        inside.wait(5)
        waiting = asyncio.ensure_future(_enter(lock, order))
        await asyncio.sleep(0.05)
        assert order == []  # the task waits for the thread
        release.set()
        await waiting
        worker.join()

    asyncio.run(main())
    assert order == ["thread out", "task in"]


async def _enter(lock: InProcessLock, order: list[str]) -> None:
    async with lock.ahold():
        order.append("task in")


# 6. a token counter never runs on the event loop --------------------------------------------


class ThreadRecordingCounter:
    """A custom token_counter that notes whether it ran on an event loop's thread."""

    def __init__(self) -> None:
        self.on_loop = 0
        self.calls = 0

    def __call__(self, messages: list[BaseMessage]) -> int:
        self.calls += 1
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            self.on_loop += 1
        return estimate_message_tokens(messages)


async def test_token_counters_run_off_the_event_loop() -> None:
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


# 7. should_compact answers what the adapters decide, counter included ---------------------


def test_should_compact_with_options_uses_the_token_counter() -> None:
    options = CompactionOptions(context_window=10_000, reserve_tokens=1_000, keep_recent_tokens=100)
    heavy = CompactionOptions(
        context_window=10_000, reserve_tokens=1_000, keep_recent_tokens=100, token_counter=lambda m: 1_000 * len(m)
    )
    messages = chat(5, size=5)  # ten short messages: the estimate says they fit
    assert should_compact(messages, options=options) is False
    assert should_compact(messages, 10_000, 1_000) is False
    assert should_compact(messages, options=heavy) is True
    assert bool(CompactionNode(lambda p: "## Goal\n- x", heavy).invoke({"messages": messages})) is True


# 8. summarizer_input_tokens reports what a cache-aligned request sent -----------------------


def test_cache_aligned_input_tokens_are_the_prefix_sent() -> None:
    messages = chat(6, size=50)
    options = CompactionOptions(keep_recent_tokens=200)
    model = FakeListChatModel(responses=["## Goal\n- answer questions"])
    result, _ = compact(model, messages, options, features=[*default_features(), CacheAligned()])
    assert result is not None
    sent = estimate_message_tokens(messages[: result.cut_index]) + estimate_tokens(CACHE_ALIGNED_PROMPT)
    assert result.summarizer_input_tokens == sent
    transcript, _ = compact(model, messages, CompactionOptions(keep_recent_tokens=200))
    assert transcript is not None
    assert transcript.summarizer_input_tokens != sent  # the transcript is another size


# 5. CalibratedEstimate never learned through the adapters: it is gone, and so is the claim ---


def test_no_calibrating_counter_is_claimed() -> None:
    import langchain_compaction.anthropic as anthropic_module

    assert not hasattr(anthropic_module, "CalibratedEstimate")
    assert "CalibratedEstimate" not in (ROOT / "README.md").read_text(encoding="utf-8")


# 11. the suite runs without the shared transcripts (as from an sdist) ----------------------------


def test_the_suite_runs_without_the_shared_transcripts(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"  # no ../shared beside it
    shutil.copytree(ROOT / "tests", checkout / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", checkout / "pyproject.toml")
    shutil.copytree(ROOT / "bench", checkout / "bench", ignore=shutil.ignore_patterns("__pycache__", "*.png"))
    env = {k: v for k, v in os.environ.items() if k != "LANGCHAIN_COMPACTION_TRANSCRIPTS"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/unit/test_formats.py"],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "passed" in done.stdout


# 12. CI removes its virtual environment --------------------------------------------------------------


def test_ci_removes_its_virtual_environment() -> None:
    script = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "trap" in script
    assert 'rm -rf "$scratch"' in script


# 12/4 (setups). Sync summarizers run off the event loop -------------------------------------


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
