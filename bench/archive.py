"""What archiving compacted messages costs, on InMemoryStore and a real PostgreSQL store.

python bench/archive.py [--turns N] [--repeats R] [--json] [--out PATH]

A graph session (``CompactionNode`` before an agent node, ``InMemorySaver``)
runs ``--turns`` turns of a real coding session (``bench.workloads``) twice
on the same store, with the default features and with ``Archive()`` added
(another thread), the summarizer an instant fake. Reported per store:
compactions, messages archived, the wall time of the compaction turns with and
without the archive, and the archive's own time (the ``Archive`` feature's
commit step, timed whole: reading and writing the store) per archived message
and per compaction.
A compaction's summary call with a real model takes seconds (``bench/stall.py``
models Claude Sonnet 4.5: 1.8 s to the first token, 0.1 ms per input token,
800 output tokens at 63 per second), so the archive's share is also given
against that modelled call for the same compaction.

PostgreSQL is started on 127.0.0.1 from the system's binaries, as the tests
do (skipped, and said so, when none are installed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from langchain_core.messages import AIMessage, BaseMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.store.memory import InMemoryStore

from bench.stall import SUMMARY_TOKENS, Setup
from bench.workloads import coding_session
from langchain_compaction import CompactionNode, CompactionOptions
from langchain_compaction.features import Archive, default_features
from langchain_compaction.features.base import Commit
from langchain_compaction.graph import CompactionState
from langchain_compaction.tokens import estimate_tokens

OPTIONS = CompactionOptions(context_window=60_000, reserve_tokens=8_000, keep_recent_tokens=8_000)
SUMMARY = "## Goal\n- continue the coding session\n\n## Progress\n- steps done"


class _TimedArchive(Archive):
    """``Archive()`` with its commit step (what it reads and writes in the store) timed into ``_SPENT``."""

    __slots__ = ()

    def commit(self, commit: Commit) -> Any:
        # On the sync path the driver makes the flow's store calls between its
        # steps, on this thread: the flow's wall time is the archive's.
        started = time.perf_counter()
        try:
            return (yield from super().commit(commit))
        finally:
            _SPENT[0] += time.perf_counter() - started


_SPENT = [0.0]
"""Seconds spent archiving since the last ``_timed()``."""


def _timed() -> list[float]:
    """Time spent archiving from now on (the archive's whole commit step, its store calls included)."""
    _SPENT[0] = 0.0
    return _SPENT


def session(store: Any, thread: str, turns: int, *, archive: bool) -> dict[str, float]:
    prompts: list[str] = []

    def summarize(prompt: str) -> str:
        prompts.append(prompt)
        return SUMMARY

    features = [*default_features(), _TimedArchive()] if archive else None
    node = CompactionNode(summarize, OPTIONS, features=features, result_key="compaction")
    # The archive's own time: its items, the store's reads and writes.
    in_store = _timed()
    messages, _ = coding_session(turns)
    script = iter(messages)

    def agent(state: CompactionState) -> dict[str, Any]:
        # The agent's own messages come from the recorded session: what follows the user's turn.
        out: list[BaseMessage] = []
        for message in script:
            out.append(message)
            if isinstance(message, AIMessage) and not message.tool_calls:
                break
        return {"messages": out}

    builder = StateGraph(CompactionState)
    builder.add_node("compact", node)
    builder.add_node("agent", agent)
    builder.add_edge(START, "compact")
    builder.add_edge("compact", "agent")
    builder.add_edge("agent", END)
    graph = builder.compile(checkpointer=InMemorySaver(), store=store)
    config = {"configurable": {"thread_id": thread}}
    times: list[float] = []
    removed = 0
    for message in script:
        calls = len(prompts)
        started = time.perf_counter()
        out = graph.invoke({"messages": [message]}, config)
        took = time.perf_counter() - started
        if len(prompts) > calls:  # this turn compacted
            times.append(took)
            removed += int(out["compaction"]["messages_removed"])
    # (The latency model of bench/stall.py at this window: Sonnet, a full summary each call.)
    sonnet = Setup(OPTIONS.context_window, 0, local=False)
    modelled = sum(sonnet.seconds(estimate_tokens(p), SUMMARY_TOKENS) for p in prompts)
    return {
        "archive_s": in_store[0],
        "compactions": len(times),
        "messages_compacted": removed,
        "compaction_turns_s": sum(times),
        "modelled_summary_s": modelled,
    }


def stores() -> list[tuple[str, AbstractContextManager[Any]]]:
    out: list[tuple[str, AbstractContextManager[Any]]] = [("InMemoryStore", nullcontext(InMemoryStore()))]
    from postgres_server import find_binaries, running_postgres

    if find_binaries() is None:
        print("  PostgreSQL skipped: no initdb, pg_ctl and postgres on PATH", flush=True)
        return out
    out.append(("PostgresStore", _Postgres(running_postgres)))
    return out


class _Postgres(AbstractContextManager[Any]):
    def __init__(self, running: Any) -> None:
        self._server = running()
        self._store: Any = None

    def __enter__(self) -> Any:
        from langgraph.store.postgres import PostgresStore

        server = self._server.__enter__()
        self._store_cm = PostgresStore.from_conn_string(server.url)
        self._store = self._store_cm.__enter__()
        self._store.setup()
        return self._store

    def __exit__(self, *exc: object) -> None:
        self._store_cm.__exit__(*exc)
        self._server.__exit__(*exc)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("archive.json"), help="with --json")
    args = parser.parse_args()
    figures: dict[str, dict[str, float]] = {}
    for name, opened in stores():
        with opened as store:
            runs: dict[bool, list[dict[str, float]]] = {False: [], True: []}
            for repeat in range(args.repeats):
                for archive in (False, True):
                    thread = f"{name}-{archive}-{repeat}"
                    runs[archive].append(session(store, thread, args.turns, archive=archive))
            off = statistics.median(r["compaction_turns_s"] for r in runs[False])
            on = statistics.median(r["compaction_turns_s"] for r in runs[True])
            first = runs[True][0]
            extra = statistics.median(r["archive_s"] for r in runs[True])
            figures[name] = {
                "compactions": first["compactions"],
                "messages_archived": first["messages_compacted"],
                "compaction_turns_off_ms": round(1000 * off, 1),
                "compaction_turns_on_ms": round(1000 * on, 1),
                "ms_per_archived_message": round(1000 * extra / max(first["messages_compacted"], 1), 3),
                "ms_per_compaction": round(1000 * extra / max(first["compactions"], 1), 1),
                "share_of_compaction_turns": round(extra / on, 3),
                "share_of_modelled_summary_call": round(extra / first["modelled_summary_s"], 4),
            }
            print(f"  {name}: done", flush=True)
    print(
        f"{args.turns}-turn coding session, window {OPTIONS.context_window:,}; median of {args.repeats} runs; wall time"
    )
    print(
        "| store | compactions | messages archived | compaction turns, archive off / on (ms) "
        "| archiving per message (ms) | per compaction (ms) | share of the compaction turns "
        "| share of a modelled summary call |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, f in figures.items():
        print(
            f"| {name} | {f['compactions']:.0f} | {f['messages_archived']:.0f} "
            f"| {f['compaction_turns_off_ms']} / {f['compaction_turns_on_ms']} "
            f"| {f['ms_per_archived_message']} | {f['ms_per_compaction']} "
            f"| {100 * f['share_of_compaction_turns']:.0f}% | {100 * f['share_of_modelled_summary_call']:.2f}% |"
        )
    if args.json:
        args.out.write_text(json.dumps(figures, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
