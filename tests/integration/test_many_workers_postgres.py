"""Many worker processes serving the same threads on one PostgreSQL checkpointer and store, with kills.

Four worker processes (``tests/many_workers_worker.py``, each its own Python
started with ``subprocess``) compile the same graph: a ``CompactionNode``
(archive on, preparations shared through the store, with or without a
PostgreSQL advisory-lock lease, a 6,000-token window) before a deterministic
agent node, on a ``PostgresSaver`` and a ``PostgresStore`` of one private
server. The test process is the driver: it sends six threads' turns (one in
flight per thread, the threads concurrent) to idle workers picked at random.
Four times it kills a worker with SIGKILL in the middle of a turn (as a turn
over the threshold starts, as a summary call starts in a worker inside a turn,
right after a turn's compaction archived what it removes, and a random few
milliseconds after a dispatch),
starts a replacement, and sends the killed turn again, the same human message
with the same id, to another worker.

Then every message ever sent must be in the thread's final state or in the
archive items of its final timeline (what recall reads), exactly once (the
archive read back whole, with the store API); items of a compaction a killed
turn made and its retry did not (at most one per kill) are outside every
timeline and only counted. No turn but the killed ones may have raised, the state must be bounded, and the
summary calls (each marked in a file by the worker that made it, before it is
made) must stay within 1.3 per compaction made with the lease the README asks
for with several processes (without one, the figure is printed); a preparation still waiting
in the store at the end (it matches the final state: the next compaction's
summary, paid ahead) is not charged to the compactions made. The figures are
printed (run with ``-s``) and, with each thread's compactions and calls,
written to ``detail.json`` in the test's tmp dir.
"""

from __future__ import annotations

import json
import os
import queue
import random
import secrets
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from postgres_server import PostgresServer, postgres_server

pytest.importorskip("langgraph.checkpoint.postgres", reason="pip install langgraph-checkpoint-postgres")
pytest.importorskip("langgraph.store.postgres", reason="pip install langgraph-checkpoint-postgres")
pytest.importorskip("psycopg", reason='pip install "psycopg[binary]"')

from langchain_core.messages import BaseMessage, HumanMessage, messages_from_dict
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.store.postgres import PostgresStore
from many_workers_worker import HUMAN_FILLER, agent_reply_id, build_graph

from langchain_compaction._lc.conversation import Conversation, thread_label
from langchain_compaction._lc.convert import SUMMARY_MARK, is_compaction_message, is_summary_message
from langchain_compaction.archive import ARCHIVE_NAMESPACE
from langchain_compaction.features.prepared import PreparedSummary
from langchain_compaction.features.prepared import namespace as prepared_namespace

pytestmark = [pytest.mark.postgres, pytest.mark.integration]
__all__ = ["postgres_server"]  # the fixture, imported for this module

ROOT = Path(__file__).resolve().parents[2]
WORKER_SCRIPT = ROOT / "tests" / "many_workers_worker.py"

WORKERS = 4
THREADS = 6
TURNS = 60
KILLS = ("over", "summary", "archived", "delay")
"""When each kill lands, in order: as a turn over the threshold starts (it compacts: applies a prepared summary
or makes one); as a summary call starts in a worker that is inside a turn (the turn's own call, or a preparation
it runs in the background); as a turn's compaction reports it archived what it removes (before the turn's
checkpoint is written); a random 5-60 ms after a dispatch."""
KILL_AT = (0.15, 0.35, 0.55, 0.75)
"""The share of all turns done before each kill is armed."""
SETTLE_SECONDS = 1.5
"""How long the workers stay up after the last turn, so the preparations they started reach the store."""
DEADLINE_SECONDS = 170.0
MAX_CALLS_PER_COMPACTION = 1.3


# -- the workers ------------------------------------------------------------------------------


@dataclass
class Worker:
    """One worker process, its reader thread's events going to the driver's queue."""

    slot: int
    generation: int
    proc: subprocess.Popen[str]
    stderr_path: Path
    ready: bool = False
    killed: bool = False
    exited: bool = False
    ask: dict[str, Any] | None = None
    dispatched_at: float = 0.0

    @property
    def name(self) -> str:
        return f"w{self.slot}.{self.generation}"

    def send(self, ask: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        self.ask = ask
        self.dispatched_at = time.monotonic()
        self.proc.stdin.write(json.dumps(ask) + "\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        self.killed = True
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=30)

    def stop(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=20)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None and not stream.closed:
                try:
                    stream.close()
                except OSError:
                    pass


def start_worker(
    slot: int, generation: int, url: str, marks: Path, logs: Path, events: queue.Queue[Any], lease: bool
) -> Worker:
    import threading

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests"), env.get("PYTHONPATH", "")])
    stderr_path = logs / f"w{slot}.{generation}.stderr"
    with stderr_path.open("w") as stderr:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-u",
                str(WORKER_SCRIPT),
                url,
                f"w{slot}.{generation}",
                str(marks),
                "lease" if lease else "plain",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=env,
            cwd=ROOT,
        )
    worker = Worker(slot, generation, proc, stderr_path)

    def read() -> None:
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                if line.strip():
                    events.put((worker, json.loads(line)))
        except (ValueError, OSError):
            pass
        events.put((worker, {"event": "exit"}))

    threading.Thread(target=read, name=f"reader-{worker.name}", daemon=True).start()
    return worker


# -- the conversation ---------------------------------------------------------------------------


def thread_name(number: int) -> str:
    return f"tenant.{number % 2}/user.{number}"


@dataclass
class ThreadPlan:
    """A thread's turns: each human message with its id and unique marker, and where the driver is."""

    thread: str
    asks: list[dict[str, Any]]
    next_turn: int = 0
    retry: dict[str, Any] | None = None
    busy: bool = False
    sent_ids: list[str] = field(default_factory=list)

    @classmethod
    def make(cls, number: int) -> ThreadPlan:
        thread = thread_name(number)
        asks = []
        for turn in range(TURNS):
            marker = f"MK{number:02d}T{turn:03d}X{secrets.token_hex(3)}"
            asks.append(
                {
                    "thread": thread,
                    "turn": turn,
                    "id": f"{thread}-h{turn}",
                    "marker": marker,
                    "text": f"[{marker}] {HUMAN_FILLER}",
                    "attempt": 0,
                }
            )
        return cls(thread, asks)

    def next_ask(self) -> dict[str, Any] | None:
        if self.busy:
            return None
        if self.retry is not None:
            return self.retry
        return self.asks[self.next_turn] if self.next_turn < TURNS else None

    @property
    def finished(self) -> bool:
        return not self.busy and self.retry is None and self.next_turn >= TURNS


# -- the driver ------------------------------------------------------------------------------------


@dataclass
class Run:
    """What the driver saw."""

    kills: list[dict[str, Any]] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)
    crashes: list[dict[str, Any]] = field(default_factory=list)
    turns_done: int = 0
    dispatches: int = 0
    started_over: int = 0
    summary_events: Counter[str] = field(default_factory=Counter)
    # Per attempt (thread, turn, attempt): whether it applied a stored preparation, the compaction ids it archived.
    applied: set[tuple[str, int, int]] = field(default_factory=set)
    archived: dict[tuple[str, int, int], list[str]] = field(default_factory=dict)


class Driver:
    def __init__(self, url: str, marks: Path, logs: Path, lease: bool, seed: int) -> None:
        self.url, self.marks, self.logs, self.lease = url, marks, logs, lease
        self.random = random.Random(seed)
        self.events: queue.Queue[Any] = queue.Queue()
        self.workers: list[Worker] = []
        self.all_workers: list[Worker] = []
        self.plans = [ThreadPlan.make(n) for n in range(THREADS)]
        self.by_thread = {p.thread: p for p in self.plans}
        self.run = Run()
        total = THREADS * TURNS
        # Each kill is armed once this many turns are done, and fires at the next moment of its kind.
        self.kill_plan = [(kind, int(total * share)) for kind, share in zip(KILLS, KILL_AT)]
        self.armed_since: int | None = None
        self.delay_kill: tuple[Worker, dict[str, Any], float] | None = None

    def spawn(self, slot: int) -> Worker:
        generation = sum(1 for w in self.all_workers if w.slot == slot)
        worker = start_worker(slot, generation, self.url, self.marks, self.logs, self.events, self.lease)
        self.all_workers.append(worker)
        return worker

    # -- kills ---------------------------------------------------------------------------

    def armed(self) -> str | None:
        if not self.kill_plan:
            return None
        kind, at = self.kill_plan[0]
        if self.run.turns_done < at:
            return None
        if self.armed_since is None:
            self.armed_since = self.run.turns_done
        if kind == "summary" and self.run.turns_done - self.armed_since > 60:
            return "over"  # no summary call under way during a turn lately: the next best moment
        return kind

    def kill(self, worker: Worker, kind: str, event: dict[str, Any]) -> None:
        ask = worker.ask
        assert ask is not None
        worker.kill()
        self.kill_plan.pop(0)
        self.armed_since = None
        self.delay_kill = None
        self.run.kills.append(
            {
                "kind": kind,
                "worker": worker.name,
                "pid": worker.proc.pid,
                "thread": ask["thread"],
                "turn": ask["turn"],
                "attempt": ask["attempt"],
                "after_s": round(time.monotonic() - worker.dispatched_at, 4),
                "at_event": event.get("event"),
                "over": event.get("over"),
                "summary_where": event.get("where"),
            }
        )
        plan = self.by_thread[ask["thread"]]
        plan.busy = False
        plan.retry = {**ask, "attempt": ask["attempt"] + 1, "not_on": worker.proc.pid}
        self.workers[worker.slot] = self.spawn(worker.slot)

    # -- the loop ----------------------------------------------------------------------------

    def dispatch(self) -> None:
        idle = [w for w in self.workers if w.ready and w.ask is None and not w.killed and not w.exited]
        waiting = [p for p in self.plans if p.next_ask() is not None]
        self.random.shuffle(idle)
        self.random.shuffle(waiting)
        for plan in waiting:
            ask = plan.next_ask()
            assert ask is not None
            choices = [w for w in idle if w.proc.pid != ask.get("not_on")]
            if not choices:
                continue
            worker = choices[0]
            idle.remove(worker)
            plan.busy = True
            worker.send({k: v for k, v in ask.items() if k != "not_on"} | {"attempt": ask["attempt"]})
            self.run.dispatches += 1
            if self.armed() == "delay" and self.delay_kill is None:
                self.delay_kill = (worker, worker.ask or {}, time.monotonic() + self.random.uniform(0.005, 0.06))

    def handle(self, worker: Worker, event: dict[str, Any]) -> None:
        kind = event["event"]
        if worker.killed:
            return  # what a killed worker said before it died: its turn is retried anyway
        if kind == "ready":
            worker.ready = True
            return
        if kind == "exit":
            worker.exited = True
            if worker.ask is not None or not self.finished():
                self.run.crashes.append({"worker": worker.name, "ask": worker.ask, "rc": worker.proc.poll()})
            return
        ask = worker.ask
        if kind == "summary":
            self.run.summary_events[event["where"]] += 1
            if ask is not None and self.armed() == "summary":
                self.kill(worker, "summary", event)
            return
        if ask is None or (event.get("thread"), event.get("turn")) != (ask["thread"], ask["turn"]):
            return
        attempt = (ask["thread"], ask["turn"], ask["attempt"])
        if kind == "applied":
            self.run.applied.add(attempt)
            return
        if kind == "archived":
            self.run.archived.setdefault(attempt, []).extend(event.get("lineages") or [])
            if self.armed() == "archived":
                self.kill(worker, "archived", event)
            return
        if kind == "started":
            self.run.started_over += bool(event["over"])
            if event["over"] and self.armed() == "over":
                self.kill(worker, "over", event)
            return
        if kind in ("done", "error"):
            if kind == "error":
                self.run.errors.append({"worker": worker.name, **event})
            plan = self.by_thread[ask["thread"]]
            plan.busy = False
            if plan.retry is not None and plan.retry["turn"] == ask["turn"]:
                plan.retry = None
            else:
                plan.next_turn += 1
            worker.ask = None
            self.run.turns_done += 1

    def finished(self) -> bool:
        return all(p.finished for p in self.plans)

    def drive(self) -> Run:
        self.workers = [self.spawn(slot) for slot in range(WORKERS)]
        deadline = time.monotonic() + DEADLINE_SECONDS
        try:
            while not self.finished():
                assert time.monotonic() < deadline, f"the run did not finish in {DEADLINE_SECONDS} s: {self.status()}"
                assert not self.run.crashes, f"a worker died without being killed: {self.run.crashes}"
                self.dispatch()
                timeout = 0.5
                if self.delay_kill is not None:
                    timeout = max(0.0, min(timeout, self.delay_kill[2] - time.monotonic()))
                try:
                    worker, event = self.events.get(timeout=timeout)
                except queue.Empty:
                    pass
                else:
                    self.handle(worker, event)
                if self.delay_kill is not None and time.monotonic() >= self.delay_kill[2]:
                    worker, ask, _ = self.delay_kill
                    if worker.ask is ask and not worker.killed:
                        self.kill(worker, "delay", {"event": "timer"})
                    else:
                        self.delay_kill = None  # that turn ended first: armed again at the next dispatch
            time.sleep(SETTLE_SECONDS)
        finally:
            for worker in self.workers:
                worker.stop()
            for worker in self.all_workers:
                worker.stop()
        return self.run

    def status(self) -> str:
        busy = {w.name: (w.ask or {}).get("id") for w in self.workers}
        return f"turns done {self.run.turns_done}, workers {busy}, kills left {self.kill_plan}"


# -- reading the outcome back ------------------------------------------------------------------------


def archived(store: Any, thread: str) -> list[tuple[str, dict[str, Any], BaseMessage]]:
    items = store.search((ARCHIVE_NAMESPACE, thread_label(thread)), limit=100_000)
    return [(i.key, i.value, messages_from_dict([i.value["message"]])[0]) for i in items]


def marker_of(message: BaseMessage) -> str | None:
    text = message.content if isinstance(message.content, str) else str(message.content)
    if isinstance(message, HumanMessage) and text.startswith("[MK"):
        return text[1 : text.index("]")]
    return None


def marks_written(marks: Path) -> list[dict[str, Any]]:
    calls = []
    for path in sorted(marks.glob("*.marks")):
        calls += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return calls


@pytest.mark.parametrize("lease", [False, True], ids=["store", "store+lease"])
def test_many_workers_share_threads_through_postgres_with_kills(
    postgres_server: PostgresServer, tmp_path: Path, lease: bool
) -> None:
    seed = int(os.environ.get("LC_MANY_WORKERS_SEED", secrets.randbelow(10**6)))
    url = postgres_server.url
    marks, logs, own = tmp_path / "marks", tmp_path / "logs", tmp_path / "driver-marks"
    for folder in (marks, logs, own):
        folder.mkdir()
    database = f"workers_{'lease' if lease else 'store'}"
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {database}")
    url = url.replace("/postgres?", f"/{database}?")
    with PostgresSaver.from_conn_string(url) as saver, PostgresStore.from_conn_string(url) as store:
        saver.setup()
        store.setup()

    started = time.monotonic()
    driver = Driver(url, marks, logs, lease, seed)
    run = driver.drive()
    elapsed = time.monotonic() - started

    # -- what ended up in PostgreSQL -------------------------------------------------------------
    lost: dict[str, list[str]] = {}
    duplicates: dict[str, list[str]] = {}
    invented: dict[str, list[str]] = {}
    altered: dict[str, list[str]] = {}
    outside: dict[str, list[str]] = {}
    raw_duplicates: dict[str, int] = {}
    archive_lineages: dict[str, dict[str, int]] = {}
    compactions = banked_calls = pending_preparations = stale_preparations = 0
    compaction_details: dict[str, list[dict[str, Any]]] = {}
    history_compactions = 0
    recorded_calls = 0
    markers_sent = markers_in_state = markers_in_archive = archive_items = 0
    state_sizes: list[int] = []
    sent_per_thread = 2 * TURNS
    with PostgresSaver.from_conn_string(url) as saver, PostgresStore.from_conn_string(url) as store:
        graph, node = build_graph(url, own, saver, store, lease=False)
        for plan in driver.plans:
            config = {"configurable": {"thread_id": plan.thread}}
            state = graph.get_state(config).values["messages"]
            state_sizes.append(len(state))
            items = archived(store, plan.thread)
            archive_items += len(items)
            expected: dict[str, str] = {}
            markers: dict[str, str] = {}
            for ask in plan.asks:
                expected[ask["id"]] = ask["text"]
                expected[agent_reply_id(ask["id"])] = ""  # any reply text: it is the agent's
                markers[ask["marker"]] = ask["id"]
            markers_sent += len(markers)
            kept = [m for m in state if not is_compaction_message(m)]
            summaries = [m for m in state if is_summary_message(m)]
            assert len(summaries) == 1, f"{plan.thread}: {len(summaries)} summaries in the final state"
            record = summaries[0].additional_kwargs[SUMMARY_MARK]
            lineage = list(record.get("lineage") or [])
            assert record.get("compaction") == len(lineage), record
            compactions += len(lineage)
            # What recall reads: the state and the archive items of the final timeline's compactions. Items of
            # a compaction outside it (a killed turn's, whose retry compacted differently) are read by nothing.
            timeline = [m for _, v, m in items if v.get("lineage") in lineage]
            outside[plan.thread] = sorted(
                {str(v.get("lineage")) for _, v, _ in items if v.get("lineage") not in lineage}
            )
            where = Counter(str(m.id) for m in [*kept, *timeline])
            lost[plan.thread] = sorted(set(expected) - set(where))
            invented[plan.thread] = sorted({str(m.id) for _, _, m in items} - set(expected))
            archive_markers = Counter(k for m in timeline if (k := marker_of(m)) is not None)
            duplicates[plan.thread] = sorted(
                {i for i, n in where.items() if n > 1} | {k for k, n in archive_markers.items() if n > 1}
            )
            raw = Counter(str(m.id) for m in kept)
            raw.update(str(m.id) for _, _, m in items)
            raw_duplicates[plan.thread] = sum(1 for n in raw.values() if n > 1)
            altered[plan.thread] = sorted(
                str(m.id)
                for m in [*kept, *(m for _, _, m in items)]
                if expected.get(str(m.id)) and m.content != expected[str(m.id)]
            )
            found_state = {k for m in kept if (k := marker_of(m)) is not None}
            markers_in_state += len(found_state & set(markers))
            markers_in_archive += len(set(archive_markers) & set(markers))
            archive_lineages[plan.thread] = dict(Counter(str(v.get("lineage")) for _, v, _ in items))
            # Every checkpoint of the thread: the compactions it went through (by compaction id), and the
            # summary calls each one's result says it cost.
            seen: dict[str, int] = {}
            details: dict[str, dict[str, Any]] = {}
            for snapshot in graph.get_state_history(config):
                marks_here = [
                    m.additional_kwargs[SUMMARY_MARK]
                    for m in snapshot.values.get("messages", [])
                    if is_summary_message(m)
                ]
                ids = (marks_here[-1].get("lineage") or []) if marks_here else []
                for compaction_id in ids:
                    seen.setdefault(compaction_id, 0)
                value = snapshot.values.get("compaction")
                if value and ids:
                    seen[ids[-1]] = int(value["summarizer_calls"])
                    prepared = value.get("parts", {}).get("prepared", {})
                    details[ids[-1]] = {
                        "calls": value["summarizer_calls"],
                        "removed": value["messages_removed"],
                        "applied": prepared.get("applied"),
                        "discarded_calls": prepared.get("discarded_calls"),
                        "updated": value["updated_previous_summary"],
                    }
            compaction_details[plan.thread] = [details.get(i, {"id": i}) for i in lineage]
            # Preparations still waiting in the store: the next compaction's summary, paid for ahead.
            for item in store.search(prepared_namespace(Conversation(plan.thread)), limit=100):
                prepared = PreparedSummary.from_value(item.value)
                if prepared.matches(state):
                    banked_calls += prepared.result.summarizer_calls
                    pending_preparations += 1
                else:
                    stale_preparations += 1
            history_compactions += len(seen)
            recorded_calls += sum(seen.values())
        threshold = node.options.budget.threshold
        window = node.options.budget.window
        final_tokens = [
            node.context_tokens(graph.get_state({"configurable": {"thread_id": p.thread}}).values["messages"])
            for p in driver.plans
        ]

    calls = marks_written(marks)
    by_where = Counter(c["where"] for c in calls)
    calls_in_killed = sum(
        1
        for c in calls
        if c["turn"] is not None
        and any(
            (c["turn"]["thread"], c["turn"]["turn"], c["turn"]["attempt"]) == (k["thread"], k["turn"], k["attempt"])
            for k in run.kills
        )
    )
    warnings_logged: Counter[str] = Counter()
    tracebacks: list[str] = []
    for worker in driver.all_workers:
        text = worker.stderr_path.read_text(errors="replace")
        for line in text.splitlines():
            if line.startswith(("WARNING", "ERROR", "CRITICAL")):
                warnings_logged[line[:140]] += 1
        if "Traceback" in text:
            tracebacks.append(f"{worker.name}:\n{text[-3000:]}")
    figures = {
        "mode": "store+lease" if lease else "store",
        "seed": seed,
        "seconds": round(elapsed, 1),
        "workers": WORKERS,
        "worker_processes_started": len(driver.all_workers),
        "threads": THREADS,
        "turns": TURNS,
        "turns_done": run.turns_done,
        "dispatches": run.dispatches,
        "kills": run.kills,
        "markers_sent": markers_sent,
        "markers_in_state": markers_in_state,
        "markers_in_archive": markers_in_archive,
        "messages_sent": THREADS * sent_per_thread,
        "archive_items": archive_items,
        "lost": {t: v for t, v in lost.items() if v},
        "duplicates": {t: v for t, v in duplicates.items() if v},
        "invented": {t: v for t, v in invented.items() if v},
        "altered": {t: v for t, v in altered.items() if v},
        "compactions_outside_final_lineage": {t: v for t, v in outside.items() if v},
        "attempts_applying_a_stored_preparation": len(run.applied),
        "attempts_archiving": len(run.archived),
        "ids_twice_counting_those": {t: n for t, n in raw_duplicates.items() if n},
        "final_state_sizes": state_sizes,
        "final_context_tokens": final_tokens,
        "threshold": threshold,
        "window": window,
        "turns_started_over_threshold": run.started_over,
        "compactions": compactions,
        "compactions_in_history": history_compactions,
        "summary_calls": len(calls),
        "summary_calls_by_where": dict(by_where),
        "summary_calls_in_killed_turns": calls_in_killed,
        "summary_calls_recorded_in_results": recorded_calls,
        "preparations_pending_in_store": pending_preparations,
        "summary_calls_banked_in_pending_preparations": banked_calls,
        "stale_preparations_in_store": stale_preparations,
        "raw_calls_per_compaction": round(len(calls) / compactions, 3) if compactions else None,
        "calls_per_compaction": round((len(calls) - banked_calls) / compactions, 3) if compactions else None,
        "errors": [{k: e.get(k) for k in ("worker", "thread", "turn", "attempt")} for e in run.errors],
        "crashes": run.crashes,
        "worker_log_warnings": dict(warnings_logged),
    }
    print("\nMANY-WORKERS FIGURES " + json.dumps(figures))
    calls_by_thread: dict[str, list[dict[str, Any]]] = {}
    for call in sorted(calls, key=lambda c: c["time"]):
        number = int(call["covers"][0][2:4]) if call["covers"] else -1
        calls_by_thread.setdefault(thread_name(number), []).append(call)
    detail = {
        plan.thread: {
            "compactions": compaction_details.get(plan.thread),
            "calls": [
                {k: c[k] for k in ("pid", "where", "covers", "previous_summary", "chunk", "attempt")}
                for c in calls_by_thread.get(plan.thread, [])
            ],
        }
        for plan in driver.plans
    }
    (tmp_path / "detail.json").write_text(json.dumps({"figures": figures, "threads": detail}, indent=1))
    print(f"(per-thread compactions and summary calls: {tmp_path / 'detail.json'})")

    assert not run.errors, "turns that were not killed raised:\n" + "\n".join(
        f"{e['worker']} {e['thread']} turn {e['turn']} attempt {e['attempt']}:\n{e['traceback']}" for e in run.errors
    )
    assert not run.crashes, run.crashes
    assert not tracebacks, "\n".join(tracebacks)
    assert len(run.kills) == len(KILLS), run.kills
    assert not figures["lost"], f"messages lost: {figures['lost']}"
    assert not figures["duplicates"], (
        f"messages kept twice: {figures['duplicates']}; archive items by compaction id: "
        f"{ {t: archive_lineages[t] for t in figures['duplicates']} }; final timelines: "
        f"{ {t: [d.get('removed') for d in compaction_details[t]] for t in figures['duplicates']} }; kills: {run.kills}"
    )
    # A killed turn that archived before dying and whose retry compacted differently (it compacted on the spot,
    # the retry found a preparation that landed in between) leaves that compaction's items outside every
    # timeline: at most one such compaction per kill, each archived by a killed attempt that took no stored
    # preparation (one that did is applied again by its retry: the same compaction).
    assert sum(map(len, outside.values())) <= len(run.kills), (outside, run.kills)
    killed = {(k["thread"], k["turn"], k["attempt"]) for k in run.kills}
    for thread, ids in outside.items():
        for compaction_id in ids:
            by = [a for a, written in run.archived.items() if a[0] == thread and compaction_id in written]
            assert by, f"{thread}: compaction {compaction_id} outside the final timeline, archived by no turn seen"
            assert all(a in killed and a not in run.applied for a in by), (thread, compaction_id, by, run.kills)
    assert not figures["invented"], f"messages nobody sent: {figures['invented']}"
    assert not figures["altered"], f"messages whose text changed: {figures['altered']}"
    assert markers_in_state + markers_in_archive == markers_sent
    assert all(size < sent_per_thread // 3 for size in state_sizes), state_sizes
    # After the agent's reply a state may be past the threshold (the next turn compacts it), never past the window.
    assert all(tokens <= window for tokens in final_tokens), (final_tokens, window)
    assert compactions >= THREADS * 4, f"too few compactions to judge: {compactions}"
    # The calls spent on the compactions made: all of them, but those banked in a preparation still waiting
    # in the store for the next compaction of its thread (which it matches). Without a lease nothing tells a
    # worker that another is preparing the same thread (the README asks for one with several processes):
    # there the figure is printed, not bounded.
    spent = len(calls) - banked_calls
    if not lease:
        return
    assert spent <= MAX_CALLS_PER_COMPACTION * compactions, (
        f"{spent} summary calls ({len(calls)} made, {banked_calls} banked in preparations still pending) for "
        f"{compactions} compactions: {spent / compactions:.2f} per compaction; by where: {dict(by_where)}; "
        f"each thread's compactions and calls: {tmp_path / 'detail.json'}"
    )
