"""``examples/server`` under LangGraph's Agent Server (``langgraph dev``, in-memory runtime), driven with ``langgraph-sdk``.

One module-scoped fixture starts the server on a free port, runs many threads
of both graphs of the example at once (``agent``: archive and preparations on;
``agent_unprepared``: archive only), streaming in several modes, and collects
what it saw; the tests below each check one property of that session:

- every run succeeded, on its first attempt, and the server logged no error;
- runs of several threads were executing at the same time (from the server's
  own ``run_started_at`` / ``run_ended_at``);
- every human message sent is in the thread's final state or in its archive
  (read back through the server's store API), exactly once, and no archive
  holds another thread's messages;
- the state shrinks, and the ``values`` stream ends on the final state;
- the ``messages`` stream shows no compaction internals;
- preparing ahead costs at most 1.3x the summary calls per compaction of
  compacting on the spot (the records agree with the server's log);
- a deleted thread's archive stays in the store (as the example's README says).

The figures are printed (``pytest -s``) at the end.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from langchain_compaction._lc.convert import BRIDGE_TEXT, SUMMARY_MARK
from langchain_compaction.core.prompts import CHECKPOINT_PROMPT, SYSTEM_PROMPT, UPDATE_PROMPT
from langchain_compaction.features.archive import ARCHIVE_NAMESPACE
from langchain_compaction.features.prepared import STORE_NAMESPACE as PREPARED_NAMESPACE

_MISSING = [name for name in ("langgraph_cli", "langgraph_api") if importlib.util.find_spec(name) is None]
if _MISSING:
    pytest.skip(
        f"{' and '.join(_MISSING)} not importable: pip install 'langgraph-cli[inmem]' to run the Agent Server test",
        allow_module_level=True,
    )

from langgraph_sdk import get_client  # noqa: E402 (after the skip above)

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "server"

GRAPHS = ("agent", "agent_unprepared")
THREADS = 6
"""Threads per graph (both graphs run at once: twice this many threads in flight)."""
TURNS = 32
"""Human messages sent to each thread."""
LOOKUP_EVERY = 3
"""Every third question asks the agent to look something up (a tool call and its result)."""
STARTUP_SECONDS = 90
# The stream modes, by thread: "updates" always (it carries the node's compaction record),
# plus LangGraph's messages (as tuples, and the SDK's older partial/complete form) or values.
MODES: tuple[list[str], ...] = (
    ["updates", "messages-tuple"],
    ["updates", "values"],
    ["updates", "messages"],
)
PROMPT_TEXTS = (
    SYSTEM_PROMPT.splitlines()[0],
    CHECKPOINT_PROMPT.splitlines()[0],
    UPDATE_PROMPT.splitlines()[0],
    "Use this EXACT format",
    "previous-summary>>",
)
"""What only the summarizer's request holds: its prompts and the transcript's fences."""
FENCE = re.compile(r"<<\S+ [^<>\n]*>>|<</\S+>>")
TAG = re.compile(r"\[(agent(?:_unprepared)?)#(\d+) turn (\d+)\]")


# -- the server ---------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/ok", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


@dataclass
class Server:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def records(self) -> list[dict[str, Any]]:
        """The server's log so far, one JSON record a line (``LOG_JSON``); other lines as ``{"text": ...}``."""
        out: list[dict[str, Any]] = []
        for line in self.log.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                record = {"text": line}
            out.append(record if isinstance(record, dict) else {"text": line})
        return out

    def tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])


def _stop(process: subprocess.Popen[bytes]) -> None:
    """Stop the server we started: SIGTERM to its own process group, then SIGKILL."""
    if process.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=15)


@contextlib.contextmanager
def langgraph_dev(workdir: Path) -> Iterator[Server]:
    """``langgraph dev`` for a copy of ``examples/server`` in ``workdir`` (it writes ``.langgraph_api/`` there)."""
    app = workdir / "app"
    app.mkdir()
    for name in ("graph.py", "langgraph.json"):
        shutil.copy(EXAMPLE / name, app / name)
    log = workdir / "server.log"
    port = _free_port()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p),
        "LOG_JSON": "true",
        "LOG_COLOR": "false",
        "LANGSMITH_TRACING": "false",
        "LANGCHAIN_TRACING_V2": "false",
    }
    command = [
        sys.executable, "-m", "langgraph_cli", "dev",
        "--host", "127.0.0.1", "--port", str(port),
        "--no-browser", "--no-reload", "--n-jobs-per-worker", "10",
    ]  # fmt: skip
    with log.open("wb") as sink:
        process = subprocess.Popen(
            command, cwd=app, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
    server = Server(f"http://127.0.0.1:{port}", process, log)
    try:
        deadline = time.monotonic() + STARTUP_SECONDS
        while not _ready(server.url):
            if process.poll() is not None:
                pytest.fail(f"langgraph dev exited with {process.returncode}:\n{server.tail()}")
            if time.monotonic() > deadline:
                pytest.fail(f"langgraph dev was not ready within {STARTUP_SECONDS} s:\n{server.tail()}")
            time.sleep(0.25)
        yield server
    finally:
        _stop(process)


# -- the session ------------------------------------------------------------------------------


@dataclass
class Thread:
    graph: str
    index: int
    modes: list[str]
    thread_id: str = ""
    sent: dict[str, str] = field(default_factory=dict)
    """Human message id -> its text."""
    compactions: list[dict[str, Any]] = field(default_factory=list)
    """Every compaction record the ``updates`` stream carried (one per compaction)."""
    streamed: list[dict[str, Any]] = field(default_factory=list)
    """Every message the ``messages`` stream modes carried."""
    errors: list[Any] = field(default_factory=list)
    run_ids: list[str] = field(default_factory=list)
    final: list[dict[str, Any]] = field(default_factory=list)
    archive: list[dict[str, Any]] = field(default_factory=list)
    runs: list[dict[str, Any]] = field(default_factory=list)
    last_values: dict[str, Any] | None = None

    @property
    def label(self) -> str:
        return f"{self.graph}#{self.index}"


@dataclass
class Session:
    threads: list[Thread]
    seconds: float
    peak_in_flight: int
    records: list[dict[str, Any]]
    namespaces: list[list[str]]
    prepared: dict[str, list[dict[str, Any]]]
    """Thread id -> the prepared summaries left in the store (``PrepareAhead(in_store=True)``)."""
    deleted: tuple[str, int, int, bool]
    """A thread deleted at the end: its id, archive items before and after, and whether the thread is gone."""


def _question(thread: Thread, turn: int) -> str:
    tag = f"[{thread.label} turn {turn}]"
    if turn % LOOKUP_EVERY == LOOKUP_EVERY - 1:
        return f"look up subsystem {turn} {tag}"
    return f"Question {tag}: how does subsystem {turn} stay consistent after a crash?"


def _streamed_messages(event: str, data: Any) -> list[dict[str, Any]]:
    if event == "messages" and isinstance(data, list) and data:  # messages-tuple: [message, metadata]
        return [data[0]] if isinstance(data[0], dict) else []
    if event in ("messages/complete", "messages/partial") and isinstance(data, list):
        return [m for m in data if isinstance(m, dict)]
    return []


async def _archive(client: Any, thread_id: str, prefix: str = ARCHIVE_NAMESPACE) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    seen: set[str] = set()
    while True:
        page = (await client.store.search_items([prefix, thread_id], limit=200, offset=len(items)))["items"]
        for item in page:
            assert item["key"] not in seen, f"the store returned archive item {item['key']} twice"
            seen.add(item["key"])
        items.extend(page)
        if len(page) < 200:
            return items


async def _drive(url: str) -> Session:
    client = get_client(url=url, timeout=60)
    threads = [Thread(g, k, MODES[k % len(MODES)]) for g in GRAPHS for k in range(THREADS)]
    in_flight = 0
    peak = 0

    async def converse(thread: Thread) -> None:
        nonlocal in_flight, peak
        thread.thread_id = (await client.threads.create(metadata={"test": "server", "label": thread.label}))[
            "thread_id"
        ]
        for turn in range(TURNS):
            message_id = str(uuid.uuid4())
            text = _question(thread, turn)
            thread.sent[message_id] = text
            in_flight += 1
            peak = max(peak, in_flight)
            try:
                async for part in client.runs.stream(
                    thread.thread_id,
                    thread.graph,
                    input={"messages": [{"type": "human", "content": text, "id": message_id}]},
                    stream_mode=thread.modes,
                ):
                    if part.event == "metadata":
                        thread.run_ids.append(part.data["run_id"])
                    elif part.event == "error":
                        thread.errors.append((turn, part.data))
                    elif part.event == "values":
                        thread.last_values = part.data
                    elif part.event == "updates":
                        update = part.data.get("compact") if isinstance(part.data, dict) else None
                        if isinstance(update, dict) and "compaction" in update:
                            thread.compactions.append(update["compaction"])
                    thread.streamed.extend(_streamed_messages(part.event, part.data))
            except Exception as exc:  # recorded, asserted on below with the thread and turn
                thread.errors.append((turn, f"{type(exc).__name__}: {exc}"))
            finally:
                in_flight -= 1

    try:
        started = time.monotonic()
        await asyncio.gather(*(converse(t) for t in threads))
        seconds = time.monotonic() - started
        for thread in threads:
            if not thread.thread_id:
                continue
            state = await client.threads.get_state(thread.thread_id)
            thread.final = list(state["values"].get("messages", []))
            thread.archive = await _archive(client, thread.thread_id)
            thread.runs = await client.runs.list(thread.thread_id, limit=TURNS * 2)
        namespaces = (await client.store.list_namespaces(prefix=[ARCHIVE_NAMESPACE], limit=1000))["namespaces"]
        prepared = {
            ns[1]: await _archive(client, ns[1], PREPARED_NAMESPACE)
            for ns in (await client.store.list_namespaces(prefix=[PREPARED_NAMESPACE], limit=1000))["namespaces"]
        }
        # Deleting a thread deletes its runs and checkpoints; the store (its archive) is left to the store's TTL.
        gone = threads[0]
        await client.threads.delete(gone.thread_id)
        try:
            await client.threads.get(gone.thread_id)
            removed = False
        except Exception:  # 404
            removed = True
        deleted = (gone.thread_id, len(gone.archive), len(await _archive(client, gone.thread_id)), removed)
    finally:
        await client.aclose()
    return Session(threads, seconds, peak, [], namespaces, prepared, deleted)


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    with langgraph_dev(tmp_path_factory.mktemp("langgraph_dev")) as server:
        result = asyncio.run(_drive(server.url))
        time.sleep(0.5)  # the last log lines
        result.records = server.records()
        yield result


# -- figures ---------------------------------------------------------------------------------


def _when(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def _executing(records: list[dict[str, Any]]) -> tuple[int, int, list[float]]:
    """The most runs executing at once (and of how many threads), from the server's own run timings."""
    spans = [
        (_when(r["run_started_at"]), _when(r["run_ended_at"]), r.get("thread_id"), float(r.get("run_exec_ms", 0)))
        for r in records
        if r.get("event") == "Background run succeeded" and r.get("run_started_at") and r.get("run_ended_at")
    ]
    points = sorted([(s, 1, t) for s, _, t, _ in spans] + [(e, -1, t) for _, e, t, _ in spans])
    running: collections.Counter[Any] = collections.Counter()
    best = (0, 0)
    for _, step, thread in points:  # an end sorts before a start at the same instant
        running[thread] += step
        if running[thread] == 0:
            del running[thread]
        total = sum(running.values())
        if total > best[0]:
            best = (total, len(running))
    return best[0], best[1], [ms for *_, ms in spans]


def _calls_per_compaction(threads: list[Thread], graph: str) -> tuple[int, int, float]:
    records = [c for t in threads if t.graph == graph for c in t.compactions]
    calls = sum(int(c["summarizer_calls"]) for c in records)
    return len(records), calls, calls / len(records) if records else float("nan")


def _logged(session: Session, graph: str) -> tuple[int, int, int]:
    """What the library logged in the server for ``graph``: compactions, their summary calls, preparations made."""
    compactions = calls = prepared = 0
    for record in session.records:
        if record.get("logger") != "langchain_compaction" or record.get("graph_id") != graph:
            continue
        event = str(record.get("event", ""))
        made = re.search(r"^compacted .*, (\d+) summarizer call", event)
        if made:
            compactions += 1
            calls += int(made.group(1))
        elif event.startswith("prepared a summary of"):
            prepared += 1
    return compactions, calls, prepared


def _applied(threads: list[Thread], graph: str) -> int:
    return sum(
        1 for t in threads if t.graph == graph for c in t.compactions if c["parts"].get("prepared", {}).get("applied")
    )


def _report(session: Session) -> str:
    peak, of_threads, exec_ms = _executing(session.records)
    lines = [
        f"{len(session.threads)} threads ({THREADS} per graph) x {TURNS} turns in {session.seconds:.1f} s; "
        f"client-side peak {session.peak_in_flight} runs in flight, server-side peak {peak} runs executing "
        f"at once (of {of_threads} threads); {len(exec_ms)} runs, median exec "
        f"{sorted(exec_ms)[len(exec_ms) // 2] if exec_ms else float('nan'):.0f} ms",
    ]
    for graph in GRAPHS:
        mine = [t for t in session.threads if t.graph == graph]
        count, calls, ratio = _calls_per_compaction(session.threads, graph)
        logged = _logged(session, graph)
        lines.append(
            f"{graph}: {sum(len(t.sent) for t in mine)} human messages sent, "
            f"{sum(len(t.final) + len(t.archive) for t in mine)} messages in all, {count} compactions, "
            f"{calls} summary calls ({ratio:.2f} per compaction, {_applied(session.threads, graph)} from a prepared "
            f"summary); the server log: {logged[0]} compactions, {logged[1]} summary calls, {logged[2]} preparations "
            f"made; {sum(len(t.archive) for t in mine)} archive items; final state sizes {[len(t.final) for t in mine]}"
        )
    thread_id, before, after, removed = session.deleted
    lines.append(
        f"prepared summaries left in the store: {sum(map(len, session.prepared.values()))} "
        f"(in {len(session.prepared)} threads); thread {thread_id} deleted (gone: {removed}): "
        f"archive items {before} before, {after} after"
    )
    return "\n".join(lines)


# -- the checks ------------------------------------------------------------------------------


def test_every_run_succeeded(session: Session) -> None:
    print("\n" + _report(session))
    for thread in session.threads:
        assert not thread.errors, f"{thread.label} ({thread.thread_id}): {thread.errors[:3]}"
        assert len(thread.run_ids) == TURNS, f"{thread.label}: {len(thread.run_ids)} runs of {TURNS}"
        bad = [(r["run_id"], r["status"]) for r in thread.runs if r["status"] != "success"]
        assert not bad, f"{thread.label} ({thread.thread_id}): runs not successful: {bad}"
    succeeded = [r for r in session.records if r.get("event") == "Background run succeeded"]
    assert len(succeeded) == len(session.threads) * TURNS
    assert all(int(r.get("run_attempt", 1)) == 1 for r in succeeded), "a run was retried"
    errors = [r for r in session.records if str(r.get("level", "")).lower() in ("error", "critical", "exception")]
    blocking = [r for r in session.records if "Blocking call" in json.dumps(r)]
    assert not errors, f"the server logged errors: {errors[:3]}"
    assert not blocking, f"blocking calls on the event loop: {blocking[:3]}"


def test_runs_of_several_threads_execute_at_once(session: Session) -> None:
    peak, of_threads, _ = _executing(session.records)
    assert session.peak_in_flight >= 2 * THREADS - 2, "the client did not keep the threads' runs in flight together"
    assert any(r.get("run_started_at") for r in session.records), "the server logged no run timings (LOG_JSON)"
    assert peak >= 3, f"at most {peak} runs were executing at once on the server"
    assert of_threads >= 3


def test_nothing_lost_nothing_twice_nothing_crossed(session: Session) -> None:
    own = {t.thread_id for t in session.threads}
    found = {tuple(ns) for ns in session.namespaces}
    assert found == {
        (ARCHIVE_NAMESPACE, t) for t in own if any(x.thread_id == t and x.archive for x in session.threads)
    }
    for thread in session.threads:
        where = f"{thread.label} ({thread.thread_id})"
        in_state = collections.Counter(m.get("id") for m in thread.final)
        in_archive = collections.Counter(item["value"].get("id") for item in thread.archive)
        for message_id, text in thread.sent.items():
            seen = in_state[message_id] + in_archive[message_id]
            assert seen == 1, f"{where}: human message {text!r} is there {seen} times (state + archive)"
        # Nothing else twice either: every message is in the state or the archive, once.
        twice = [i for i, n in (in_state + in_archive).items() if n > 1]
        assert not twice, f"{where}: message ids found more than once: {twice[:5]}"
        for item in thread.archive:
            value = item["value"]
            message = value["message"]
            assert message["data"]["id"] == value["id"]
            if value["role"] == "human" and value["id"] in thread.sent:
                assert message["data"]["content"] == thread.sent[value["id"]], f"{where}: archived text differs"
            content = json.dumps(message["data"].get("content"))
            others = {(g, int(k)) for g, k, _ in TAG.findall(content)} - {(thread.graph, thread.index)}
            assert not others, f"{where}: its archive holds messages of {sorted(others)}"
            assert value["role"] != "human" or value["id"] in thread.sent or SUMMARY_MARK in json.dumps(message), (
                f"{where}: archived a human message it was never sent: {content[:200]}"
            )
    for thread_id, items in session.prepared.items():
        owner = next(t for t in session.threads if t.thread_id == thread_id)
        others = {(g, int(k)) for g, k, _ in TAG.findall(json.dumps(items))} - {(owner.graph, owner.index)}
        assert not others, f"{owner.label}: its prepared summaries hold messages of {sorted(others)}"


def test_values_stream_ends_on_the_final_state(session: Session) -> None:
    watched = [t for t in session.threads if "values" in t.modes]
    assert watched
    for thread in watched:
        assert thread.last_values is not None
        assert [m.get("id") for m in thread.last_values["messages"]] == [m.get("id") for m in thread.final]
        assert thread.last_values.get("compaction") == thread.compactions[-1]


def test_a_deleted_threads_archive_stays_in_the_store(session: Session) -> None:
    thread_id, before, after, removed = session.deleted
    assert removed, "the deleted thread is still there"
    assert before > 0
    assert after == before, "deleting a thread changed its archive (the README says the store keeps it)"


def test_state_shrinks(session: Session) -> None:
    for thread in session.threads:
        produced = len(thread.final) + len(thread.archive)
        assert len(thread.compactions) >= 3, f"{thread.label}: {len(thread.compactions)} compactions"
        assert len(thread.final) * 3 < produced, f"{thread.label}: {len(thread.final)} messages left of {produced}"
        assert sum(1 for m in thread.final if SUMMARY_MARK in m.get("additional_kwargs", {})) >= 1


def test_messages_stream_shows_no_internals(session: Session) -> None:
    streamed = [m for t in session.threads for m in t.streamed]
    assert streamed, "no thread streamed in a messages mode"
    for message in streamed:
        content = json.dumps(message.get("content"))
        assert message.get("type") != "remove", f"a RemoveMessage was streamed: {message}"
        assert not any(text in content for text in PROMPT_TEXTS), f"summarizer prompt text streamed: {content[:300]}"
        assert not FENCE.search(content), f"a transcript fence streamed: {content[:300]}"
        assert BRIDGE_TEXT not in content, f"the bridge turn streamed: {message}"
        # What the library writes (the summary, the bridge) is in the state, never a chat UI's message stream.
        assert SUMMARY_MARK not in (message.get("additional_kwargs") or {}), (
            f"a compaction message streamed: {content[:300]}"
        )


def test_preparing_ahead_costs_at_most_a_third_more_summary_calls(session: Session) -> None:
    prepared = _calls_per_compaction(session.threads, "agent")
    unprepared = _calls_per_compaction(session.threads, "agent_unprepared")
    assert prepared[0], "no compaction with PrepareAhead"
    assert unprepared[0], "no compaction without PrepareAhead"
    applied = _applied(session.threads, "agent")
    assert applied, "no compaction applied a prepared summary"
    assert prepared[2] <= 1.3 * unprepared[2], (
        f"{prepared[2]:.2f} summary calls per compaction with PrepareAhead, {unprepared[2]:.2f} without"
    )
    # The server log agrees with the records the updates stream carried.
    for graph, (count, calls, _) in (("agent", prepared), ("agent_unprepared", unprepared)):
        assert _logged(session, graph)[:2] == (count, calls), f"{graph}: the log says {_logged(session, graph)}"
    # No preparation is made for nothing: each was applied, or is the one a thread holds for its next
    # compaction when the session ends (its calls are in that compaction's record, as a discarded one's are).
    made = _logged(session, "agent")[2]
    discarded = sum(
        int(c["parts"].get("prepared", {}).get("discarded_calls", 0)) for t in session.threads for c in t.compactions
    )
    assert applied <= made <= applied + discarded + THREADS, (
        f"{made} preparations made, {applied} applied, {discarded} summary calls of discarded ones"
    )
