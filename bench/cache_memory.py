"""What the token-count cache holds in memory at its bound, and what a message it dropped costs to count again.

python bench/cache_memory.py

A ``TokenCountCache`` (one per node or middleware) keeps, per message id, a
count and the message's core form (its text and what the library read in it).
Each workload fills one, lets go of the messages and previous reads, then
empties it under ``tracemalloc``: the memory that frees, per token and per
message held, projected to the cache's two bounds (``_MAX_HELD_TOKENS`` tokens,
``DEFAULT_CACHE_SIZE`` messages: whichever comes first). Workloads:

- a server in miniature: ``CompactionMiddleware`` in ``create_agent``
  (``InMemorySaver``), 200 threads of six turns with one compaction each, each
  thread deleted when done: what stays is each thread's summary (its marks and
  checked facts) and last reply;
- the synthetic coding session (``bench/workloads.py``, tool calls and
  results), 20 conversations of 200 turns;
- the shared transcripts, when they are there (``$LANGCHAIN_COMPACTION_TRANSCRIPTS``);
- messages of a word or two (``"ok"``): the message bound's worst case.

Then what a dropped message costs: a conversation's checkpoint copies counted
by a new cache (nothing known), best of five, per token.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.memory import InMemorySaver

from bench.workloads import coding_session, load_transcripts
from langchain_compaction import CompactionMiddleware, CompactionOptions
from langchain_compaction._lc.counting import _MAX_HELD_TOKENS, DEFAULT_CACHE_SIZE, TokenCountCache


def emptied(cache: TokenCountCache) -> float:
    """The bytes emptying ``cache`` frees (tracemalloc running since before it was filled)."""
    cache._last.clear()  # (the previous reads hold the caller's messages, not the cache's entries)
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    cache._entries.clear()
    cache._cores.clear()
    gc.collect()
    return float(before - tracemalloc.get_traced_memory()[0])


def report(name: str, freed: float, tokens: int, entries: int) -> None:
    per_token, per_message = freed / tokens, freed / entries
    at_bound = min(per_token * _MAX_HELD_TOKENS, per_message * DEFAULT_CACHE_SIZE)
    print(
        f"{name}: {entries:,} messages, {tokens:,} tokens ({tokens / entries:.0f} a message): "
        f"{freed / 1e6:.1f} MB, {per_token:.1f} bytes a token, {per_message:.0f} a message; "
        f"at the bound ({_MAX_HELD_TOKENS:,} tokens or {DEFAULT_CACHE_SIZE:,} messages) about {at_bound / 1e6:.0f} MB"
    )


def filled(name: str, make: Callable[[], list[list[BaseMessage]]]) -> None:
    """A cache filled with the conversations ``make`` gives (made under tracemalloc), measured."""
    cache = TokenCountCache(CompactionOptions())
    tracemalloc.start()
    for key, messages in enumerate(make()):
        cache.counts_and_core(messages, key)
    tokens, entries = cache._held, len(cache)
    freed = emptied(cache)
    tracemalloc.stop()
    report(name, freed, tokens, entries)


class _Model(GenericFakeChatModel):
    def bind_tools(self, tools: object, **kwargs: object) -> _Model:
        return self


async def server(threads: int = 200) -> None:
    """The middleware over finished threads, each deleted from the checkpointer when done."""

    def replies() -> Iterator[AIMessage]:
        while True:
            yield AIMessage("an answer here " * 25)

    async def summarize(prompt: str) -> str:
        return "## Goal\n- answer the questions"

    options = CompactionOptions(context_window=2_000, reserve_tokens=300, keep_recent_tokens=300)
    middleware = CompactionMiddleware(summarize, options)
    saver = InMemorySaver()
    agent = create_agent(
        _Model(messages=replies()), tools=[], middleware=[middleware], checkpointer=saver, system_prompt="be nice"
    )
    tracemalloc.start()
    for i in range(threads):
        config: Any = {"configurable": {"thread_id": f"t{i}"}}
        for turn in range(6):
            await agent.ainvoke({"messages": [HumanMessage(f"question {turn} of thread {i} " * 30)]}, config)
        saver.delete_thread(f"t{i}")
    cache = middleware._turn.cache
    tokens, entries = cache._held, len(cache)
    freed = emptied(cache)
    tracemalloc.stop()
    report(f"middleware, {threads} finished threads", freed, tokens, entries)


def renamed(messages: list[BaseMessage], tag: str) -> list[BaseMessage]:
    return [m.model_copy(update={"id": f"{tag}-{i}"}) for i, m in enumerate(messages)]


def recount() -> None:
    """What counting a conversation again costs, once its messages fell out of the cache."""
    session = coding_session(1_800)[0]
    best = float("inf")
    for _ in range(5):
        copies = [m.model_copy() for m in session]  # a checkpoint's copies: nothing known on them
        cache = TokenCountCache(CompactionOptions())
        started = time.perf_counter()
        cache.counts_and_core(copies)
        best = min(best, time.perf_counter() - started)
    tokens = cache._held
    print(
        f"counted again: {len(session):,} messages, {tokens:,} tokens in {best * 1e3:.0f} ms "
        f"({best / tokens * 1e9:.0f} ns a token: {best / tokens * 180_000 * 1e3:.0f} ms for 180,000 tokens)"
    )


def main() -> None:
    asyncio.run(server())
    filled("coding session, 20 x 200 turns", lambda: [renamed(coding_session(200)[0], f"s{t}") for t in range(20)])
    transcripts = load_transcripts
    if transcripts():
        filled("shared transcripts", lambda: [renamed(v, n) for n, v in transcripts().items()])
    filled(
        "messages of a word",
        lambda: [[ToolMessage("ok", tool_call_id="c", id=f"{t}-{j}") for j in range(100)] for t in range(100)],
    )
    recount()


if __name__ == "__main__":
    main()
