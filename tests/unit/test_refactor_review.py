"""Defects a review of the refactor found; each test failed before its fix."""

from __future__ import annotations

import asyncio
import gc
import json
import time
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_community.chat_message_histories import FileChatMessageHistory
from langchain_core.chat_history import BaseChatMessageHistory, InMemoryChatMessageHistory
from langchain_core.language_models import FakeListChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, message_to_dict, messages_from_dict

from langchain_compaction import CompactingChatMessageHistory, CompactionError, CompactionMiddleware, CompactionOptions
from langchain_compaction._lc.counting import TokenCountCache
from langchain_compaction.history import stores
from langchain_compaction.tokens import estimate_message_tokens

SUMMARY = "## Goal\n- x"


def chat(turns: int) -> list[BaseMessage]:
    messages: list[BaseMessage] = []
    for i in range(turns):
        messages += [HumanMessage(f"q{i} " * 50, id=f"h{i}"), AIMessage(f"a{i} " * 50, id=f"a{i}")]
    return messages


def test_the_token_cache_reads_the_previous_call_once() -> None:
    # Another thread swapping the cache's memory of the previous call in the
    # middle of a call must not hand this call the other conversation's counts.
    cache = TokenCountCache(CompactionOptions())
    mine = [HumanMessage("a" * 40, id=f"a{i}") for i in range(5)]
    theirs = [HumanMessage("b" * 4000, id=f"b{i}") for i in range(5)]
    cache.counts_and_core(mine)
    truth = TokenCountCache(CompactionOptions()).counts(mine)
    reused = cache._reused

    def other_thread_runs_meanwhile(messages: Any, last: Any) -> int:
        count = reused(messages, last)
        cache._last = (theirs, *TokenCountCache(CompactionOptions()).counts_and_core(theirs))
        return count

    cache._reused = other_thread_runs_meanwhile  # type: ignore[method-assign]
    counts, core = cache.counts_and_core(mine)
    assert counts == truth
    assert all(m.text.startswith("a") for m in core)


class SortedJsonStore(BaseChatMessageHistory):
    """Keeps messages as key-sorted JSON (as a JSONB column does); one write may commit, then fail."""

    def __init__(self) -> None:
        self.rows: list[str] = []
        self.fail_after_write = False

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        return messages_from_dict([json.loads(r) for r in self.rows])

    def add_messages(self, messages: Any) -> None:
        self.rows += [json.dumps(message_to_dict(m), sort_keys=True) for m in messages]
        if self.fail_after_write:
            self.fail_after_write = False
            raise TimeoutError("the write committed, but its reply timed out")

    def clear(self) -> None:
        self.rows = []
        self.fail_after_write = True


def test_a_store_that_reorders_keys_is_not_rewritten_twice() -> None:
    inner = SortedJsonStore()
    inner.rows = [json.dumps(message_to_dict(m), sort_keys=True) for m in chat(6)]
    memory = CompactingChatMessageHistory(inner, lambda p: SUMMARY, CompactionOptions(keep_recent_tokens=100))
    with pytest.raises(CompactionError):
        memory.compact()  # the rewrite landed, but the store reported a failure
    kinds = [m.type for m in memory.messages]  # the next call finishes (or recognizes) the rewrite
    assert kinds.count("system") == 1
    assert [m.type for m in inner.messages] == kinds


async def test_a_cancelled_compaction_holds_the_lock_until_its_write_lands(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = stores._file_replace

    def slow_replace(store: Any, messages: Any) -> None:
        time.sleep(0.4)  # a slow disk: the write is still running when the caller gives up
        real(store, messages)

    monkeypatch.setattr(stores, "_file_replace", slow_replace)
    path = tmp_path / "chat.json"
    inner = FileChatMessageHistory(str(path))
    inner.add_messages(chat(6))
    memory = CompactingChatMessageHistory(inner, lambda p: SUMMARY, CompactionOptions(keep_recent_tokens=100))
    task = asyncio.ensure_future(memory.acompact())
    await asyncio.sleep(0.15)  # the rewrite is in its worker thread now
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    other = CompactingChatMessageHistory(FileChatMessageHistory(str(path)), lambda p: SUMMARY, CompactionOptions())
    await other.aadd_messages([HumanMessage("IMPORTANT NEW MESSAGE", id="new")])
    await asyncio.sleep(0.6)  # any write still in flight has landed
    assert "new" in [m.id for m in FileChatMessageHistory(str(path)).messages]


class BlippingStore(BaseChatMessageHistory):
    """No atomic rewrite (the journaled path); the add right after a clear fails once."""

    def __init__(self) -> None:
        self.messages: list[BaseMessage] = []
        self.session_id = "blipping-session"
        self.fail = False

    def add_messages(self, messages: Any) -> None:
        if self.fail:
            self.fail = False
            raise ConnectionError("a database blip")
        self.messages = [*self.messages, *messages]

    def clear(self) -> None:
        self.messages = []
        self.fail = True


def test_an_unfinished_rewrite_outlives_the_wrapper_that_started_it() -> None:
    store = BlippingStore()
    store.messages = chat(6)

    def request(action: Any) -> Any:
        # RunnableWithMessageHistory's pattern: a new wrapper per request.
        memory = CompactingChatMessageHistory(store, lambda p: SUMMARY, CompactionOptions(keep_recent_tokens=100))
        return action(memory)

    with pytest.raises(CompactionError):
        request(lambda m: m.compact())
    gc.collect()
    messages = request(lambda m: m.messages)
    # The pending rewrite survived the wrapper: the history is the compacted one, not lost.
    assert messages[0].type == "system"
    assert messages[0].additional_kwargs["langchain_compaction"]["kind"] == "summary"
    assert messages[-1].id == "a5"


async def test_a_blocking_compact_on_the_loop_thread_during_acompact_raises() -> None:
    started = asyncio.Event()

    async def slow_summary(prompt: str) -> str:
        started.set()
        await asyncio.sleep(0.2)
        return SUMMARY

    memory = CompactingChatMessageHistory(
        InMemoryChatMessageHistory(messages=chat(6)), slow_summary, CompactionOptions(keep_recent_tokens=100)
    )
    running = asyncio.ensure_future(memory.acompact())
    await started.wait()
    with pytest.raises(CompactionError, match="deadlock the loop"):
        memory.compact()
    assert await running is not None


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
    counter = LoopRecordingCounter()
    middleware = CompactionMiddleware(
        lambda p: SUMMARY, CompactionOptions(context_window=200_000, token_counter=counter)
    )
    agent = create_agent(FakeListChatModel(responses=["hi"]), system_prompt="You are helpful.", middleware=[middleware])
    await agent.ainvoke({"messages": [("user", "hello")]})
    assert counter.calls > 0
    assert counter.on_loop == []
