"""One worker process of ``tests/integration/test_many_workers_postgres.py``.

Run as a script: ``python many_workers_worker.py <postgres url> <worker name> <marks dir> [lease]``.
It compiles the graph (a ``CompactionNode`` with the archive and preparations
kept in the store, then a deterministic agent node) on a ``PostgresSaver`` and
a ``PostgresStore``, then serves turns read from stdin, one JSON line each::

    {"thread": "...", "turn": 7, "id": "...", "text": "...", "attempt": 0}

and reports on stdout, one JSON line per event:

- ``ready``: the graph is compiled and connected;
- ``started``: a turn was read, with the context size it will have (the state
  plus the new message) and whether that is over the threshold;
- ``applied``: a turn took a preparation from the store (and marked it applied);
- ``archived``: a turn's compaction wrote the messages it removes to the archive
  (the turn's checkpoint is not written yet), with the compaction ids written;
- ``summary``: a summary call began (``where``: ``turn`` on the turn's own
  thread, ``prepare`` in a background preparation);
- ``done``: the turn's ``graph.invoke`` returned (with the message count and
  the ``result_key`` record when it compacted);
- ``error``: it raised (with the traceback); the worker goes on serving.

Every summary call is also appended as one line to ``<marks dir>/<pid>.marks``
with an unbuffered ``os.write`` before the summary is made, so a worker killed
with SIGKILL leaves the count of what it spent.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

SUMMARY_SECONDS = 0.05
"""How long a summary call takes (a model is never instant; it gives a kill a window inside it)."""

ARCHIVE_ANSWER_SECONDS = 0.02
"""How late the store answers an archive write made in a turn (a remote database's round trip): a kill sent
when the worker reports the write lands before the turn's checkpoint."""

HUMAN_FILLER = "please extend the quarterly report with the regional figures and the outlook " * 7
AGENT_FILLER = "The regional figures rose again and the outlook stays cautious for the next quarter. " * 10

_write_lock = threading.Lock()
_current: dict[str, Any] = {}


def emit(event: str, **fields: Any) -> None:
    line = json.dumps({"event": event, "pid": os.getpid(), **fields}) + "\n"
    with _write_lock:
        sys.stdout.write(line)
        sys.stdout.flush()


def agent_reply_id(human_id: str) -> str:
    return f"{human_id}-ai"


class CountedSummarizer:
    """``ExtractiveSummarizer``, each call marked in this process's file (and reported) before it is made."""

    def __init__(self, marks: Path) -> None:
        from langchain_compaction import ExtractiveSummarizer

        self.inner = ExtractiveSummarizer()
        self.fd = os.open(marks / f"{os.getpid()}.marks", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    @property
    def name(self) -> str:
        return "counted-extractive"

    def _mark(self, request: Any) -> None:
        prepare = threading.current_thread().name == "langchain-compaction-prepare"
        where = "prepare" if prepare else "turn"
        turn = None if prepare else dict(_current)
        # Which thread and turns the call covers, read from the markers of its human messages.
        covered = [
            m.text[1 : m.text.index("]")] for m in request.messages if m.role == "user" and m.text.startswith("[MK")
        ]
        mark = {
            "pid": os.getpid(),
            "where": where,
            "turn": turn,
            "covers": [covered[0], covered[-1]] if covered else [],
            "previous_summary": request.previous_summary is not None,
            "chunk": [request.chunk_index, request.chunk_count],
            "attempt": request.attempt,
            "time": time.time(),
        }
        os.write(self.fd, (json.dumps(mark) + "\n").encode())
        emit("summary", where=where, turn=turn)

    def summarize(self, request: Any) -> str:
        self._mark(request)
        time.sleep(SUMMARY_SECONDS)
        return self.inner.summarize(request)

    async def asummarize(self, request: Any) -> str:
        import asyncio

        self._mark(request)
        await asyncio.sleep(SUMMARY_SECONDS)
        return await self.inner.asummarize(request)


def reporting_store(base: type) -> type:
    """``base`` (a store class) reporting each archive write made on a turn's own thread."""
    from langgraph.store.base import PutOp

    from langchain_compaction.archive import ARCHIVE_NAMESPACE
    from langchain_compaction.features.prepared import APPLIED_KEY, STORE_NAMESPACE

    class Reporting(base):  # type: ignore[misc,valid-type]
        def batch(self, ops: Any) -> Any:
            ops = list(ops)
            out = super().batch(ops)
            puts = [o for o in ops if isinstance(o, PutOp) and o.value]
            if _current and any(o.namespace[:1] == (STORE_NAMESPACE,) and o.value.get(APPLIED_KEY) for o in puts):
                emit("applied", **_current)
            archived = [o for o in puts if o.namespace[:1] == (ARCHIVE_NAMESPACE,)]
            if archived and _current:
                lineages = sorted({str(o.value.get("lineage")) for o in archived})
                emit("archived", **_current, items=len(archived), lineages=lineages)
                time.sleep(ARCHIVE_ANSWER_SECONDS)
            return out

    return Reporting


def build_graph(url: str, marks: Path, saver: Any, store: Any, *, lease: bool) -> tuple[Any, Any]:
    """The graph every worker compiles, and its compaction node."""
    from helpers_turns import graph_with
    from langchain_core.messages import AIMessage, HumanMessage

    from langchain_compaction import CompactionNode, CompactionOptions
    from langchain_compaction.features import Archive, PrepareAhead, default_features
    from langchain_compaction.graph import CompactionState
    from langchain_compaction.history import PostgresAdvisoryLock

    prepare = PrepareAhead(at=0.7, in_store=True, lease=(lambda key: PostgresAdvisoryLock(url, key)) if lease else None)
    node = CompactionNode(
        CountedSummarizer(marks),
        CompactionOptions(context_window=6_000),
        result_key="compaction",
        features=[*default_features(), Archive(), prepare],
    )

    def agent(state: CompactionState) -> dict[str, Any]:
        # Deterministic: the reply to the last human message, with an id derived
        # from its id, so a retried turn writes the same reply over itself.
        last = next(m for m in reversed(state["messages"]) if isinstance(m, HumanMessage))
        turn = last.additional_kwargs.get("turn", "?")
        return {"messages": [AIMessage(f"Reply to turn {turn}. " + AGENT_FILLER, id=agent_reply_id(str(last.id)))]}

    return graph_with(node, saver=saver, store=store, agent=agent), node


def serve(url: str, name: str, marks: Path, lease: bool) -> None:
    from langchain_core.messages import HumanMessage
    from langgraph.checkpoint.postgres import PostgresSaver
    from langgraph.store.postgres import PostgresStore

    store_class = reporting_store(PostgresStore)
    with PostgresSaver.from_conn_string(url) as saver, store_class.from_conn_string(url) as store:
        graph, node = build_graph(url, marks, saver, store, lease=lease)
        threshold = node.options.budget.threshold
        emit("ready", worker=name)
        for line in sys.stdin:
            if not line.strip():
                continue
            ask = json.loads(line)
            key = {"thread": ask["thread"], "turn": ask["turn"], "attempt": ask["attempt"]}
            _current.clear()
            _current.update(key)
            try:
                config = {"configurable": {"thread_id": ask["thread"]}}
                message = HumanMessage(ask["text"], id=ask["id"], additional_kwargs={"turn": ask["turn"]})
                before = graph.get_state(config).values.get("messages", [])
                tokens = node.context_tokens([*before, message])
                emit("started", **key, tokens=tokens, over=tokens > threshold, size=len(before))
                out = graph.invoke({"messages": [message]}, config)
                emit("done", **key, size=len(out["messages"]), compaction=out.get("compaction"))
            except Exception:
                emit("error", **key, traceback=traceback.format_exc())
            finally:
                _current.clear()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    serve(sys.argv[1], sys.argv[2], Path(sys.argv[3]), lease=len(sys.argv) > 4 and sys.argv[4] == "lease")
