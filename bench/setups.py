"""Speed where it is felt: a cold worker's check, and an add to chat memory.

python bench/setups.py [--json]

Ratios against a peer measured in the same run (CPU time, best of 5):

- Cold worker. A LangGraph server runs a thread's next turn on whichever
  worker is free, so the per-message cache is often empty: a fresh
  ``CompactionNode`` checks a history under its threshold, against
  ``SummarizationMiddleware.before_model`` on the same history, without and with
  ``usage_metadata`` on the last reply (then only what follows it is counted).
- Chat memory per add. ``CompactingChatMessageHistory`` over an
  ``InMemoryChatMessageHistory`` holding 1,000 / 10,000 / 20,000 messages: one
  ``add_messages`` of a single message that does not compact, median of 20,
  against the raw store's own ``add_messages``.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from langchain.agents.middleware import SummarizationMiddleware
from langchain_core.chat_history import InMemoryChatMessageHistory
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from bench.workloads import coding_session
from langchain_compaction import CompactingChatMessageHistory, CompactionNode, CompactionOptions
from langchain_compaction.tokens import estimate_message_tokens


def best(fn, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        started = time.process_time()
        fn()
        times.append(time.process_time() - started)
    return min(times) * 1000


def cold_worker(size: int) -> dict[str, float]:
    session, _ = coding_session(size // 4 + 2)
    state = session[:size]
    total = estimate_message_tokens(state)
    options = CompactionOptions(context_window=total * 4)  # under the threshold: the check alone
    usage = {"input_tokens": total, "output_tokens": 10, "total_tokens": total + 10}
    reported = [*state, AIMessage("done", id="last-reply", usage_metadata=usage)]
    middleware = SummarizationMiddleware(
        model=GenericFakeChatModel(messages=iter(())), trigger=("tokens", total * 4), keep=("tokens", 20_000)
    )
    return {
        "ours_ms": best(lambda: CompactionNode(lambda p: "x", options).invoke({"messages": state})),
        "langchain_ms": best(lambda: middleware.before_model({"messages": state}, None)),  # type: ignore[arg-type]
        "ours_with_usage_ms": best(lambda: CompactionNode(lambda p: "x", options).invoke({"messages": reported})),
        "langchain_with_usage_ms": best(lambda: middleware.before_model({"messages": reported}, None)),  # type: ignore[arg-type]
    }


def memory_add(size: int) -> dict[str, float]:
    history: list[BaseMessage] = []
    for i in range(size // 2):
        history += [HumanMessage(f"question {i} " * 8, id=f"q{i}"), AIMessage(f"answer {i} " * 8, id=f"a{i}")]
    options = CompactionOptions(context_window=estimate_message_tokens(history) * 4)
    raw = InMemoryChatMessageHistory(messages=list(history))
    wrapped = CompactingChatMessageHistory(InMemoryChatMessageHistory(messages=list(history)), lambda p: "x", options)
    wrapped.add_messages([HumanMessage("warm up", id="warm")])  # the first add counts the stored history once

    def median_add(store: object) -> float:
        times = []
        for n in range(20):
            started = time.process_time()
            store.add_messages([HumanMessage(f"one more {n}", id=f"more-{id(store)}-{n}")])  # type: ignore[attr-defined]
            times.append(time.process_time() - started)
        return statistics.median(times) * 1000

    return {"wrapper_ms": median_add(wrapped), "raw_store_ms": median_add(raw)}


def main() -> None:
    figures = {
        "cold_worker": {str(n): cold_worker(n) for n in (1_085, 10_835)},
        "memory_add": {str(n): memory_add(n) for n in (1_000, 10_000, 20_000)},
    }
    (Path(__file__).resolve().parent / "setups.json").write_text(json.dumps(figures, indent=2) + "\n")
    if "--json" in sys.argv:
        print(json.dumps(figures, indent=2))
        return
    print("| figure | this library | peer | ratio |")
    print("|---|---|---|---|")
    for n, f in figures["cold_worker"].items():
        print(
            f"| cold worker's check, {n} messages, no usage (ms) | {f['ours_ms']:.1f} | {f['langchain_ms']:.1f} "
            f"| {f['ours_ms'] / f['langchain_ms']:.1f}x the middleware |"
        )
        print(
            f"| cold worker's check, {n} messages, last reply with usage (ms) | {f['ours_with_usage_ms']:.2f} "
            f"| {f['langchain_with_usage_ms']:.1f} | {f['langchain_with_usage_ms'] / f['ours_with_usage_ms']:.0f}x less |"
        )
    for n, f in figures["memory_add"].items():
        print(
            f"| chat memory, one add to {n} messages (ms, median) | {f['wrapper_ms']:.2f} | raw store "
            f"{f['raw_store_ms']:.3f} | |"
        )


if __name__ == "__main__":
    main()
