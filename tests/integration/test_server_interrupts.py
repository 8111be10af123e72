"""Cancellation, double-texting and a graph factory under LangGraph's Agent Server (``langgraph dev``).

One module-scoped fixture starts ``examples/server`` with ``test_server``'s
``langgraph_dev`` (its ``langgraph.json`` copied with a third graph, a graph
factory, added in the temporary copy) and drives, all at once:

- cancellation threads: before each turn the client reads the thread's state
  and asks ``should_compact`` whether the run will compact; it then cancels the
  run (``client.runs.cancel``, with and without ``wait=True``, mostly
  ``action="interrupt"``, every fifth ``"rollback"``) right after creating it,
  when its ``compact`` task starts on a turn that compacts, when the custom
  stream says a compaction was made (before the node's update is committed),
  when a preparation starts in the background, or when the tool runs;
- double-texting threads: a second message sent while the first run is in
  flight (just created, or at its ``compact`` or ``agent`` task, or when it has
  made a compaction), with ``multitask_strategy`` ``"interrupt"``,
  ``"rollback"`` and ``"enqueue"`` in turn;
- a graph factory (``make_graph(config)``, a new graph, so a new
  ``PrepareAhead`` with an empty memory, for every run) and the module-level
  ``agent`` graph, side by side, 30 turns each.

Then, for every thread: no run is in ``error``, and the server logged no error
and no ``SummaryTimeoutError``; a cancelled run is ``interrupted`` (or, rolled
back, deleted), never ``error``; every human message of a run that completed
is in the thread's state or in its archive exactly once, and an interrupted
run's at most once; every archived item is a message this thread was sent or
produced, and none of the surviving timeline's items is also in the state.

Rollback: the Agent Server documents that a rolled-back run "is completely
deleted from the database" (its checkpoints with it), so its message is in
neither the state nor the archive. The in-memory runtime of ``langgraph dev``
does not always do that: it marks a cancelled run ``interrupted`` as soon as it
receives the cancel and may start the thread's next run while the cancelled
one is still winding down (on top of its checkpoints); and a run rolled back
while no client streams it is deleted, with the checkpoints it has so far, at
once, even while it is still running, so what it writes afterwards stays. Both
cases are read from the server's log (the two runs' execution overlapped; "Eagerly
deleting pending run" with status "running") and reported; the message must
then still be there at most once.

The archive is a LangGraph store, which a cancellation or a rollback does not
roll back: a compaction whose update was never committed (the run was
cancelled, or rolled back, after the archive was written) leaves items under a
compaction id that is not in the surviving state's record (``lineage``). The
library documents this (``features/archive.py``: the recall tool counts an item
only when its compaction is in the record of the checkpoint it runs on). So the
"exactly once" and "not also in the state" checks are made over the items of
the surviving timeline; the items of uncommitted compactions are counted
apart, and each must still be a message of the thread that is in the state or
in the timeline's archive (so no message lives only in such an item).

The figures (where the cancellations landed: during a compaction or a
preparation, established from the server's log and the run's own stream; the
summary calls per compaction of the factory and of the module-level graph) are
printed (``pytest -s``).
"""

from __future__ import annotations

import asyncio
import collections
import importlib.util
import json
import random
import re
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import BaseMessage, HumanMessage, convert_to_messages
from langgraph_sdk import get_client
from langgraph_sdk.schema import CancelAction, MultitaskStrategy, StreamMode

# The server test's helpers (it skips this module too when langgraph-cli[inmem] is not installed).
import tests.integration.test_server as base
from langchain_compaction import should_compact
from langchain_compaction._lc.convert import SUMMARY_MARK
from langchain_compaction._lc.events import COMPACTION_EVENT, PREPARE_EVENT

pytestmark = pytest.mark.integration

FACTORY_GRAPH = "agent_factory"
FACTORY_MODULE = '''"""A graph factory for examples/server (written by tests/integration/test_server_interrupts.py).

langgraph-api calls a graph path that names a function with one parameter (not
annotated as ServerRuntime) with the run's config, for every run and every
state read; each call builds a new graph, so a new PrepareAhead with an empty
memory.
"""

import importlib.util
import logging
import sys
from pathlib import Path

from langchain_core.runnables import RunnableConfig

from langchain_compaction.features import Archive, PrepareAhead, default_features

_spec = importlib.util.spec_from_file_location("example_server_graph", Path(__file__).parent / "app" / "graph.py")
example = importlib.util.module_from_spec(_spec)
sys.modules["example_server_graph"] = example
_spec.loader.exec_module(example)

logger = logging.getLogger("graph_factory")


def make_graph(config: RunnableConfig):
    configurable = config.get("configurable") or {}
    logger.info("graph factory called (execution: %s)", bool(configurable.get("__is_for_execution__")))
    return example.build([*default_features(), Archive(), PrepareAhead(at=0.6, in_store=True)])
'''

CANCEL_GRAPHS = ("agent_unprepared", "agent_unprepared", "agent_unprepared", "agent", "agent", "agent")
CANCEL_TURNS = 36
DOUBLE_GRAPHS = ("agent", "agent", "agent", "agent_unprepared", "agent_unprepared", "agent_unprepared")
DOUBLE_TEXTS = 15
"""Double-texts per thread (each sends two messages); the strategy goes interrupt, rollback, enqueue in turn."""
STRATEGIES: tuple[MultitaskStrategy, ...] = ("interrupt", "rollback", "enqueue")
FACTORY_THREADS = 2
FACTORY_TURNS = 30
LOOKUP_EVERY = 3
STREAM: list[StreamMode] = ["updates", "tasks", "custom"]
TAG = re.compile(r"\[((?:cx|dt|fx|mx)\d+) turn (\d+)\]")
_KEEP = ("type", "content", "id", "additional_kwargs", "tool_calls", "tool_call_id", "name")


def _example_options() -> Any:
    spec = importlib.util.spec_from_file_location("example_server_graph_for_tests", base.EXAMPLE / "graph.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.OPTIONS


OPTIONS = _example_options()
"""The example's ``CompactionOptions`` (a 6,000-token window), to ask ``should_compact`` what the node will do."""


# -- what the client records ------------------------------------------------------------------


@dataclass
class Run:
    run_id: str
    message_id: str
    plan: str
    """What the client did to it: "plain", a cancel trigger ("cancel:<when>"), or "first"/"second" of a double-text."""
    strategy: str = ""
    due: bool | None = None
    """Whether ``should_compact`` said the run's first compaction node would compact (not asked for every run)."""
    cancel: dict[str, Any] = field(default_factory=dict)
    """When a cancel was sent: its action, ``wait``, the trigger, and whether the server accepted it."""
    seen: collections.Counter[str] = field(default_factory=collections.Counter)
    """What the run's own stream showed: task starts/results per node, compaction records, custom events."""
    errors: list[Any] = field(default_factory=list)
    status: str = ""
    """Its status at the end (``runs.get``); "deleted" when the server no longer has it (rolled back)."""


@dataclass
class Conv:
    kind: str
    graph: str
    label: str
    thread_id: str = ""
    sent: dict[str, str] = field(default_factory=dict)
    runs: list[Run] = field(default_factory=list)
    compactions: list[dict[str, Any]] = field(default_factory=list)
    errors: list[Any] = field(default_factory=list)
    final: list[dict[str, Any]] = field(default_factory=list)
    archive: list[dict[str, Any]] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)
    listed: list[dict[str, Any]] = field(default_factory=list)

    def message(self, turn: int) -> tuple[str, str]:
        message_id = str(uuid.uuid4())
        tag = f"[{self.label} turn {turn}]"
        if turn % LOOKUP_EVERY == LOOKUP_EVERY - 1:
            text = f"look up subsystem {turn} {tag}"
        else:
            text = f"Question {tag}: how does subsystem {turn} stay consistent after a crash?"
        self.sent[message_id] = text
        return message_id, text

    @property
    def lineage(self) -> set[str]:
        """The compaction ids of the surviving timeline (the record of the final state's summary)."""
        found: list[str] = []
        for message in self.final:
            mark = (message.get("additional_kwargs") or {}).get(SUMMARY_MARK)
            if isinstance(mark, dict) and isinstance(mark.get("lineage"), list) and len(mark["lineage"]) > len(found):
                found = [i for i in mark["lineage"] if isinstance(i, str)]
        return set(found)

    def timeline(self) -> list[dict[str, Any]]:
        lineage = self.lineage
        return [i for i in self.archive if i["value"].get("lineage") in lineage]

    def orphans(self) -> list[dict[str, Any]]:
        lineage = self.lineage
        return [i for i in self.archive if i["value"].get("lineage") not in lineage]

    def committed_by(self, run_id: str) -> bool:
        """Whether a surviving checkpoint of ``run_id`` holds a compaction record its first one does not."""
        records = {
            json.dumps((state.get("values") or {}).get("compaction"), sort_keys=True)
            for state in self.history
            if (state.get("metadata") or {}).get("run_id") == run_id
        }
        return len(records) > 1

    def produced(self) -> set[str]:
        """Every message id any surviving checkpoint of the thread held."""
        return {m.get("id") for state in self.history for m in (state.get("values") or {}).get("messages", [])}


@dataclass
class Session:
    convs: list[Conv]
    seconds: float
    records: list[dict[str, Any]]
    log_text: str


def _messages(values: dict[str, Any]) -> list[BaseMessage]:
    return convert_to_messages(
        [{k: v for k, v in m.items() if k in _KEEP and v is not None} for m in values.get("messages", [])]
    )


def _input(message_id: str, text: str) -> dict[str, Any]:
    return {"messages": [{"type": "human", "content": text, "id": message_id}]}


def _status_of(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None)


# -- the drive -------------------------------------------------------------------------------


class Driver:
    def __init__(self, url: str) -> None:
        self.client = get_client(url=url, timeout=60)
        self.cancels = 0

    async def start(self, conv: Conv) -> None:
        created = await self.client.threads.create(metadata={"test": "server_interrupts", "label": conv.label})
        conv.thread_id = created["thread_id"]

    def _note(self, run: Run, event: str, data: Any, conv: Conv) -> str | None:
        """Record one stream event of ``run``; return what it was, for the triggers."""
        if event == "metadata" and isinstance(data, dict) and not run.run_id:
            run.run_id = data["run_id"]
        if event == "error":
            run.errors.append(data)
            return "error"
        if event == "tasks" and isinstance(data, dict):
            name = str(data.get("name"))
            if "result" in data or "error" in data:
                run.seen[f"{name}:done"] += 1
                return f"{name}:done"
            run.seen[f"{name}:start"] += 1
            return f"{name}:start"
        if event == "custom" and isinstance(data, dict):
            if PREPARE_EVENT in data:
                run.seen["prepare-event"] += 1
                return "prepare-event"
            if COMPACTION_EVENT in data:
                run.seen["compaction-event"] += 1
                return "compaction-event"
        if event == "updates" and isinstance(data, dict):
            update = data.get("compact")
            if isinstance(update, dict) and "compaction" in update:
                run.seen["compaction-committed"] += 1
                conv.compactions.append(update["compaction"])
        return None

    async def _cancel(self, conv: Conv, run: Run, trigger: str) -> None:
        self.cancels += 1
        action: CancelAction = "rollback" if self.cancels % 5 == 0 else "interrupt"
        wait = self.cancels % 2 == 0
        run.cancel = {"trigger": trigger, "action": action, "wait": wait, "at": time.monotonic()}
        try:
            await self.client.runs.cancel(conv.thread_id, run.run_id, wait=wait, action=action)
            run.cancel["accepted"] = True
        except Exception as exc:  # 404: the run had ended (or was deleted) before the cancel came
            run.cancel["accepted"] = False
            run.cancel["refused"] = f"{_status_of(exc)} {type(exc).__name__}"
        run.cancel["returned"] = time.monotonic()

    async def _stream(self, conv: Conv, run: Run, message_id: str, text: str, on: Any = None) -> None:
        """Stream a new run; ``on(name)`` is awaited for every event worth a trigger."""
        try:
            async for part in self.client.runs.stream(
                conv.thread_id, conv.graph, input=_input(message_id, text), stream_mode=STREAM
            ):
                name = self._note(run, part.event, part.data, conv)
                if name is not None and on is not None:
                    await on(name)
        except Exception as exc:  # recorded, asserted on below
            conv.errors.append((run.plan, f"{type(exc).__name__}: {exc}"))

    async def _settle(self, conv: Conv, run: Run) -> None:
        """Wait for the run to end, then read its status."""
        if not run.run_id:
            return
        try:
            await self.client.runs.join(conv.thread_id, run.run_id)
        except Exception as exc:
            if _status_of(exc) != 404:
                conv.errors.append((run.plan, f"join: {type(exc).__name__}: {exc}"))
        try:
            run.status = (await self.client.runs.get(conv.thread_id, run.run_id))["status"]
        except Exception as exc:
            if _status_of(exc) != 404:
                raise
            run.status = "deleted"

    # -- 1. cancellation --------------------------------------------------------------------

    async def _due(self, conv: Conv, message_id: str, text: str) -> bool:
        """Whether the run about to be sent will compact at its first node (what the node itself decides)."""
        state = await self.client.threads.get_state(conv.thread_id)
        before = [*_messages(state.get("values") or {}), HumanMessage(text, id=message_id)]
        return should_compact(before, options=OPTIONS)

    async def cancelling(self, conv: Conv, seed: int) -> None:
        rng = random.Random(seed)
        await self.start(conv)
        for turn in range(CANCEL_TURNS):
            message_id, text = conv.message(turn)
            due = await self._due(conv, message_id, text)
            draw = rng.random()
            if due:
                trigger = "compact:start" if draw < 0.55 else "compaction-event" if draw < 0.85 else ""
            else:  # a preparation starts on the agent graph only: elsewhere that turn runs to its end
                trigger = (
                    "created" if draw < 0.1 else
                    "tools:start" if draw < 0.2 else
                    "prepare-event" if draw < 0.8 else ""
                )  # fmt: skip
            run = Run("", message_id, f"cancel:{trigger}" if trigger else "plain", due=due)
            conv.runs.append(run)
            if trigger == "created":
                made = await self.client.runs.create(conv.thread_id, conv.graph, input=_input(message_id, text))
                run.run_id = made["run_id"]
                await self._cancel(conv, run, trigger)
            else:

                async def on(name: str, run: Run = run, trigger: str = trigger) -> None:
                    if name == trigger and not run.cancel:
                        await self._cancel(conv, run, trigger)

                await self._stream(conv, run, message_id, text, on if trigger else None)
            await self._settle(conv, run)

    # -- 2. double-texting ----------------------------------------------------------------------

    async def double_texting(self, conv: Conv, seed: int) -> None:
        rng = random.Random(seed)
        await self.start(conv)
        whens = ("created", "compact:start", "agent:start", "compaction-event")
        for k in range(DOUBLE_TEXTS):
            strategy = STRATEGIES[k % len(STRATEGIES)]
            when = whens[(k // len(STRATEGIES) + rng.randrange(len(whens))) % len(whens)]
            first_id, first_text = conv.message(2 * k)
            second_id, second_text = conv.message(2 * k + 1)
            first = Run("", first_id, f"first:{when}", strategy=strategy)
            first.due = await self._due(conv, first_id, first_text)
            second = Run("", second_id, "second", strategy=strategy)
            conv.runs += [first, second]

            async def send_second(
                second: Run = second, strategy: MultitaskStrategy = strategy, text: str = second_text
            ) -> None:
                made = await self.client.runs.create(
                    conv.thread_id,
                    conv.graph,
                    input=_input(second.message_id, text),
                    multitask_strategy=strategy,
                    stream_mode=STREAM,
                )
                second.run_id = made["run_id"]

            if when == "created":
                made = await self.client.runs.create(conv.thread_id, conv.graph, input=_input(first_id, first_text))
                first.run_id = made["run_id"]
                await send_second()
            else:
                fired = False

                async def on(name: str, when: str = when) -> None:
                    nonlocal fired
                    if name == when and not fired:
                        fired = True
                        await send_second()

                await self._stream(conv, first, first_id, first_text, on)
                if not fired:  # the first run ended before the moment came: send it now, on an idle thread
                    first.plan += " (ended first)"
                    await send_second()
            await self._settle(conv, first)
            await self._settle(conv, second)

    # -- 3. a graph factory, and the module-level graph ----------------------------------------------

    async def plain(self, conv: Conv) -> None:
        await self.start(conv)
        for turn in range(FACTORY_TURNS):
            message_id, text = conv.message(turn)
            run = Run("", message_id, "plain")
            conv.runs.append(run)
            await self._stream(conv, run, message_id, text)
            await self._settle(conv, run)

    # -- reading back ----------------------------------------------------------------------------

    async def read(self, conv: Conv) -> None:
        client = self.client
        conv.final = list((await client.threads.get_state(conv.thread_id))["values"].get("messages", []))
        conv.archive = await base._archive(client, conv.thread_id)
        conv.history = await client.threads.get_history(conv.thread_id, limit=1000, select=["values", "metadata"])
        conv.listed = await client.runs.list(conv.thread_id, limit=500)


async def _drive(url: str) -> Session:
    convs = [Conv("cancel", g, f"cx{i}") for i, g in enumerate(CANCEL_GRAPHS)]
    convs += [Conv("double", g, f"dt{i}") for i, g in enumerate(DOUBLE_GRAPHS)]
    convs += [Conv("factory", FACTORY_GRAPH, f"fx{i}") for i in range(FACTORY_THREADS)]
    convs += [Conv("module", "agent", f"mx{i}") for i in range(FACTORY_THREADS)]
    driver = Driver(url)
    jobs = []
    for i, conv in enumerate(convs):
        if conv.kind == "cancel":
            jobs.append(driver.cancelling(conv, 1000 + i))
        elif conv.kind == "double":
            jobs.append(driver.double_texting(conv, 2000 + i))
        else:
            jobs.append(driver.plain(conv))
    try:
        started = time.monotonic()
        await asyncio.gather(*jobs)
        seconds = time.monotonic() - started
        await asyncio.sleep(1.0)  # background preparations still running finish
        for conv in convs:
            await driver.read(conv)
    finally:
        await driver.client.aclose()
    return Session(convs, seconds, [], "")


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Session]:
    workdir = tmp_path_factory.mktemp("langgraph_dev_interrupts")
    # test_server.langgraph_dev copies graph.py and langgraph.json from base.EXAMPLE into workdir/app:
    # point it at a copy whose langgraph.json declares a third graph, a factory in workdir/factory.py.
    stage = workdir / "example"
    stage.mkdir()
    shutil.copy(base.EXAMPLE / "graph.py", stage / "graph.py")
    config = json.loads((base.EXAMPLE / "langgraph.json").read_text(encoding="utf-8"))
    config["graphs"][FACTORY_GRAPH] = "../factory.py:make_graph"
    (stage / "langgraph.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    (workdir / "factory.py").write_text(FACTORY_MODULE, encoding="utf-8")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(base, "EXAMPLE", stage)
        with base.langgraph_dev(workdir) as server:
            result = asyncio.run(_drive(server.url))
            time.sleep(0.5)  # the last log lines
            result.records = server.records()
            result.log_text = server.log.read_text(encoding="utf-8", errors="replace")
            _dump(result, workdir / "session.json")
            yield result


def _dump(session: Session, path: Path) -> None:
    """What the client saw, next to the server's log, to reproduce a failure from."""
    convs = [
        {
            "label": c.label,
            "graph": c.graph,
            "thread_id": c.thread_id,
            "runs": [
                {
                    "run_id": r.run_id,
                    "message_id": r.message_id,
                    "text": c.sent[r.message_id],
                    "plan": r.plan,
                    "strategy": r.strategy,
                    "due": r.due,
                    "status": r.status,
                    "cancel": r.cancel,
                    "seen": dict(r.seen),
                }
                for r in c.runs
            ],
            "final": [m.get("id") for m in c.final],
            "lineage": sorted(c.lineage),
            "archive": [
                {"key": i["key"], "id": i["value"].get("id"), "lineage": i["value"].get("lineage")} for i in c.archive
            ],
        }
        for c in session.convs
    ]
    path.write_text(json.dumps(convs, indent=1, default=str), encoding="utf-8")


# -- what the server logged, by run -----------------------------------------------------------------


def _when(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


@dataclass
class Logged:
    """What the server logged for one run (every attempt)."""

    thread_id: str = ""
    started: int = 0
    retried: int = 0
    ended: list[tuple[str, float]] = field(default_factory=list)
    spans: list[tuple[float, float]] = field(default_factory=list)
    """When each attempt executed (the worker's ``run_started_at`` / ``run_ended_at``)."""
    cancelled: float = float("inf")
    """When the server received the cancellation (``Runs.cancel``: a cancel request, or a double-text)."""
    deleted_running: bool = False
    """Rolled back with no client streaming it, the server deleted the run (and the checkpoints it had so far)
    while it was still running ("Eagerly deleting pending run", status "running"): what it wrote afterwards stays."""
    archived: int = 0
    compacted: int = 0
    summary_calls: int = 0
    preparing: list[float] = field(default_factory=list)
    """When the run started a preparation in the background."""
    prepared: list[float] = field(default_factory=list)
    """When a preparation it started finished (logged with the run's context, possibly after the run ended)."""


def _by_run(records: list[dict[str, Any]]) -> dict[str, Logged]:
    out: dict[str, Logged] = collections.defaultdict(Logged)
    for record in records:
        if record.get("event") == "Cancelled runs" and isinstance(record.get("timestamp"), str):
            for cancelled in record.get("run_ids") or ():
                out[str(cancelled)].cancelled = min(out[str(cancelled)].cancelled, _when(record["timestamp"]))
        run_id = record.get("run_id")
        if not isinstance(run_id, str):
            continue
        event = str(record.get("event", ""))
        stamp = _when(record["timestamp"]) if isinstance(record.get("timestamp"), str) else 0.0
        logged = out[run_id]
        logged.thread_id = str(record.get("thread_id") or logged.thread_id)
        if isinstance(record.get("run_started_at"), str) and isinstance(record.get("run_ended_at"), str):
            logged.spans.append((_when(record["run_started_at"]), _when(record["run_ended_at"])))
        if event == "Starting background run":
            logged.started += 1
        elif event == "Ignoring rollback error for missing run" or (
            event.startswith("Eagerly deleting pending run") and record.get("status") == "running"
        ):
            logged.deleted_running = True
        elif event.startswith("Background run failed, will retry"):
            logged.retried += 1
        elif event.startswith("Background run "):
            logged.ended.append((event, stamp))
        elif record.get("logger") == "langchain_compaction":
            made = re.search(r"^compacted .*, (\d+) summarizer call", event)
            if event.startswith("archived "):
                logged.archived += 1
            elif made:
                logged.compacted += 1
                logged.summary_calls += int(made.group(1))
            elif event.startswith("the context passed the preparation mark"):
                logged.preparing.append(stamp)
            elif event.startswith("prepared a summary of"):
                logged.prepared.append(stamp)
    return out


def _overlapped(logged: dict[str, Logged]) -> dict[str, set[str]]:
    """Run id -> the runs of its thread that started while it was still executing.

    The in-memory runtime marks a cancelled run ``interrupted`` as soon as the
    cancel is received (``Runs.cancel``), and starts the thread's next pending
    run (``Runs.next`` waits only for a ``running`` one) while the cancelled run
    is still winding down.
    """
    threads: dict[str, list[tuple[str, Logged]]] = collections.defaultdict(list)
    for run_id, mine in logged.items():
        threads[mine.thread_id].append((run_id, mine))
    out: dict[str, set[str]] = collections.defaultdict(set)
    for runs in threads.values():
        for run_id, mine in runs:
            for other_id, other in runs:
                if other_id != run_id and any(s < o < e for s, e in mine.spans for o, _ in other.spans):
                    out[run_id].add(other_id)
    return out


def _landed(conv: Conv, run: Run, logged: Logged) -> set[str]:
    """Where a cancellation (or the double-text that superseded the run) landed, as the log and the stream show it."""
    if not logged.started:
        return {"pending (the run never started)"}
    where: set[str] = set()
    if logged.compacted or logged.archived:
        where.add(
            "after a compaction was committed"
            if run.seen["compaction-committed"] or conv.committed_by(run.run_id)
            else "during a compaction: made (archived, logged), its update not committed"
        )
    elif run.seen["compact:start"] > run.seen["compact:done"] and run.due:
        where.add(
            "during a compaction: in the compact node of a turn over the threshold, before it was made"
            if conv.graph != "agent"
            else "in the compact node of a turn over the threshold (agent: applies or waits for a preparation)"
        )
    if any(p < logged.cancelled for p in logged.preparing) and (
        len(logged.prepared) < len(logged.preparing) or max(logged.prepared) > logged.cancelled
    ):
        where.add("during a preparation: the cancel reached the server before the preparation finished")
    if run.seen["tools:start"] > run.seen["tools:done"]:
        where.add("in the tool call")
    return where or {"elsewhere (agent node, between nodes)"}


# -- the figures ------------------------------------------------------------------------------


def _convs(session: Session, *kinds: str) -> list[Conv]:
    return [c for c in session.convs if c.kind in kinds]


def _calls_per_compaction(convs: list[Conv]) -> tuple[int, int, float, int]:
    records = [c for conv in convs for c in conv.compactions]
    calls = sum(int(c["summarizer_calls"]) for c in records)
    applied = sum(1 for c in records if c["parts"].get("prepared", {}).get("applied"))
    return len(records), calls, calls / len(records) if records else float("nan"), applied


def _found(conv: Conv) -> collections.Counter[str | None]:
    """How often each message id is in the final state or in the surviving timeline's archive."""
    found = collections.Counter(m.get("id") for m in conv.final)
    found.update(item["value"].get("id") for item in conv.timeline())
    return found


def _report(session: Session) -> str:
    logged = _by_run(session.records)
    runs = [(c, r) for c in session.convs for r in c.runs]
    statuses = collections.Counter(r.status for _, r in runs)
    lines = [
        f"{len(session.convs)} threads, {len(runs)} runs in {session.seconds:.1f} s (statuses {dict(statuses)}); "
        f"{sum(x.retried for x in logged.values())} run attempts retried by the server after a cancellation"
    ]
    cancelled = [(c, r) for c, r in _convs_runs(session, "cancel") if r.cancel]
    accepted = [(c, r) for c, r in cancelled if r.cancel.get("accepted")]
    landed = collections.Counter(w for c, r in accepted for w in _landed(c, r, logged[r.run_id]))
    triggers = collections.Counter(r.cancel["trigger"] for _, r in cancelled)
    lines.append(
        f"cancellation: {len(_convs(session, 'cancel'))} threads x {CANCEL_TURNS} turns; {len(cancelled)} cancels sent "
        f"(by trigger {dict(triggers)}; {sum(1 for _, r in cancelled if r.cancel['wait'])} with wait=True, "
        f"{sum(1 for _, r in cancelled if r.cancel['action'] == 'rollback')} action=rollback), {len(accepted)} accepted, "
        f"{len(cancelled) - len(accepted)} refused (the run had ended); outcome "
        f"{dict(collections.Counter(r.status for _, r in accepted))}"
    )
    lines += [f"  landed {where}: {n}" for where, n in sorted(landed.items())]
    for strategy in STRATEGIES:
        firsts = [
            (c, r) for c, r in _convs_runs(session, "double") if r.plan.startswith("first") and r.strategy == strategy
        ]
        hit = collections.Counter(
            w for c, r in firsts if r.status in ("interrupted", "deleted") for w in _landed(c, r, logged[r.run_id])
        )
        lines.append(
            f"double-texting {strategy}: {len(firsts)} double-texts; the first run ended "
            f"{dict(collections.Counter(r.status for _, r in firsts))}; sent at "
            f"{dict(collections.Counter(r.plan.split(':', 1)[1] for _, r in firsts))}; cut: {dict(hit)}"
        )
    overlapped = _overlapped(logged)
    sent = found = completed = kept_interrupted = interrupted = rolled = survived = 0
    survivors: list[str] = []
    for conv in session.convs:
        where = _found(conv)
        for run in conv.runs:
            sent += 1
            found += where[run.message_id] > 0
            completed += run.status == "success"
            interrupted += run.status == "interrupted"
            kept_interrupted += run.status == "interrupted" and where[run.message_id] > 0
            rolled += run.status == "deleted"
            if run.status == "deleted" and where[run.message_id]:
                survived += 1
                why = (
                    f"the next run {sorted(overlapped[run.run_id])} started before it had ended"
                    if overlapped[run.run_id]
                    else "deleted while still running"
                    if logged[run.run_id].deleted_running
                    else "?"
                )
                survivors.append(f"{_where(conv, run)}: {why}")
    archive = sum(len(c.archive) for c in session.convs)
    orphans = [(c, i) for c in session.convs for i in c.orphans()]
    back = sum(1 for c, i in orphans if i["value"].get("id") in {m.get("id") for m in c.final})
    lines.append(
        f"markers: {sent} sent, {found} found in a state or a timeline's archive; {completed} of completed runs "
        f"(each once), {kept_interrupted} of {interrupted} interrupted runs' kept; {rolled} rolled back, {survived} "
        f"of them found; {sum(1 for x in logged.values() if x.deleted_running)} runs deleted by a rollback while "
        f"still running"
    )
    lines += [f"  rolled back, yet its message is still there: {text}" for text in survivors]
    cancelled_ids = {r.run_id for _, r in runs if r.cancel or r.strategy in ("interrupt", "rollback")}
    lines.append(
        f"runs that started on a thread while a cancelled run of it was still executing: "
        f"{len({o for run_id in cancelled_ids for o in overlapped.get(run_id, ())})} "
        f"(after {sum(1 for run_id in cancelled_ids if overlapped.get(run_id))} cancelled runs)"
    )
    lines.append(
        f"archive: {archive} items, {archive - len(orphans)} in the surviving timelines, {len(orphans)} of compactions "
        f"never committed or rolled back (in {len({c.label for c, _ in orphans})} threads; {back} of them are "
        f"messages back in the state)"
    )
    for name, kinds in (("factory", ("factory",)), ("module-level agent", ("module",))):
        count, calls, ratio, applied = _calls_per_compaction(_convs(session, *kinds))
        convs = _convs(session, *kinds)
        mine = [logged[r.run_id] for c in convs for r in c.runs]
        lines.append(
            f"{name}: {len(convs)} threads x {FACTORY_TURNS} turns, {count} compactions, {calls} summary calls "
            f"({ratio:.2f} per compaction), {applied} from a prepared summary (the server log: "
            f"{sum(x.compacted for x in mine)} compactions, {sum(x.summary_calls for x in mine)} summary calls, "
            f"{sum(len(x.prepared) for x in mine)} preparations made); final state sizes "
            f"{[len(c.final) for c in convs]}, archive {[len(c.archive) for c in convs]}"
        )
    builds = collections.Counter(str(r.get("event")) for r in session.records if r.get("logger") == "graph_factory")
    lines.append(f"graph factory calls: {dict(builds)}")
    return "\n".join(lines)


def _convs_runs(session: Session, *kinds: str) -> list[tuple[Conv, Run]]:
    return [(c, r) for c in _convs(session, *kinds) for r in c.runs]


def _where(conv: Conv, run: Run | None = None) -> str:
    text = f"{conv.label} ({conv.graph}, thread {conv.thread_id})"
    if run is not None:
        text += f" run {run.run_id} [{run.plan}{' ' + run.strategy if run.strategy else ''}, due={run.due}]"
    return text


# -- the checks ------------------------------------------------------------------------------


def test_no_run_in_error_and_no_summary_timeout(session: Session) -> None:
    print("\n" + _report(session))
    logged = _by_run(session.records)
    for conv in session.convs:
        assert not conv.errors, f"{_where(conv)}: {conv.errors[:3]}"
        listed = {r["run_id"]: r["status"] for r in conv.listed}
        for run in conv.runs:
            assert run.run_id, f"{_where(conv, run)}: no run id"
            assert not run.errors, f"{_where(conv, run)}: the stream carried errors {run.errors[:2]}"
            assert run.status in ("success", "interrupted", "deleted"), f"{_where(conv, run)}: {run.status}"
            assert listed.get(run.run_id, "deleted") == run.status
            if not run.cancel and not run.plan.startswith("first"):
                # Only a run the client cancelled (or superseded) may be retried by the server, or not succeed.
                assert logged[run.run_id].retried == 0, f"{_where(conv, run)} was retried"
                assert run.status == "success", f"{_where(conv, run)}: {run.status}"
    assert "SummaryTimeoutError" not in session.log_text, "a cancellation surfaced as a SummaryTimeoutError"
    errors = [r for r in session.records if str(r.get("level", "")).lower() in ("error", "critical", "exception")]
    assert not errors, f"the server logged errors: {errors[:3]}"
    assert "Run encountered an error" not in session.log_text
    assert "Blocking call" not in session.log_text


def test_a_cancelled_run_is_interrupted_or_rolled_back(session: Session) -> None:
    logged = _by_run(session.records)
    cancelled = [(c, r) for c, r in _convs_runs(session, "cancel") if r.cancel]
    assert len(cancelled) >= 40, f"only {len(cancelled)} cancellations"
    raced: list[str] = []
    for conv, run in cancelled:
        where = _where(conv, run)
        log = logged[run.run_id]
        if not run.cancel["accepted"]:  # the run had ended before the cancel came
            assert run.status == "success", f"{where}: cancel refused ({run.cancel['refused']}), run {run.status}"
            continue
        if run.status == "success" and log.spans and max(end for _, end in log.spans) <= log.cancelled:
            # Accepted, but the worker had finished the run before the server
            # received the cancel (the server's own timestamps): too late, not lost.
            continue
        if run.status == "success" and not any(w.startswith("during a compaction") for w in _landed(conv, run, log)):
            # Accepted, yet the run ended as if never cancelled, with the cancel
            # outside the library's code in the run (a tool call, a background
            # preparation): the in-memory runtime passes a running run's cancel to
            # its worker through a stream, which a run about to end may not read
            # (seen about once in 60 under a loaded machine). Counted below; a
            # cancel that lands in a compaction must always take effect.
            raced.append(where)
            continue
        if run.cancel["action"] == "interrupt":
            assert run.status == "interrupted", f"{where}: cancelled, ended {run.status}"
        else:  # rollback: the run is deleted, or, cancelled before it started with a client joined, interrupted
            assert run.status == "deleted" or (run.status == "interrupted" and not log.started), (
                f"{where}: rolled back, ended {run.status}"
            )
        if log.started:
            events = {e for e, _ in log.ended}
            assert events <= {"Background run interrupted", "Background run rolled back"}, f"{where}: {events}"
    accepted = sum(1 for _, r in cancelled if r.cancel["accepted"])
    assert len(raced) <= max(2, accepted // 10), f"{len(raced)} of {accepted} accepted cancels had no effect: {raced}"
    # Some cancellations must have landed where they matter.
    landed = collections.Counter(
        w for c, r in cancelled if r.cancel["accepted"] for w in _landed(c, r, logged[r.run_id])
    )
    assert any(w.startswith("during a compaction") for w in landed), f"no cancellation hit a compaction: {landed}"
    assert any(w.startswith("during a preparation") for w in landed), f"no cancellation hit a preparation: {landed}"


def test_double_texting_ends_as_documented(session: Session) -> None:
    pairs: collections.Counter[str] = collections.Counter()
    for conv in _convs(session, "double"):
        runs = conv.runs
        for first, second in zip(runs[::2], runs[1::2]):
            where = _where(conv, first)
            pairs[first.strategy] += 1
            assert second.status == "success", f"{_where(conv, second)}: {second.status}"
            if first.strategy == "enqueue":
                assert first.status == "success", f"{where}: {first.status}"
            elif first.strategy == "interrupt":
                assert first.status in ("interrupted", "success"), f"{where}: {first.status}"
            else:  # rollback: "the first run is completely deleted from the database"
                assert first.status in ("deleted", "success"), f"{where}: {first.status}"
            if "(ended first)" in first.plan:
                assert first.status == "success"
    assert set(pairs) == set(STRATEGIES), pairs
    assert min(pairs.values()) >= 10, pairs
    firsts = [r for _, r in _convs_runs(session, "double") if r.plan.startswith("first")]
    assert sum(r.status == "interrupted" for r in firsts) >= 5
    assert sum(r.status == "deleted" for r in firsts) >= 5


def test_nothing_lost_nothing_twice(session: Session) -> None:
    logged = _by_run(session.records)
    overlapped = _overlapped(logged)
    for conv in session.convs:
        found = _found(conv)
        twice = [i for i, n in found.items() if n > 1]
        assert not twice, f"{_where(conv)}: message ids in the state or the timeline's archive twice: {twice[:5]}"
        for run in conv.runs:
            where = f"{_where(conv, run)}: message {conv.sent[run.message_id]!r} ({run.message_id})"
            seen = found[run.message_id]
            if run.status == "success":
                assert seen == 1, f"{where} of a completed run is there {seen} times (state + archive)"
            elif run.status == "deleted" and not overlapped[run.run_id] and not logged[run.run_id].deleted_running:
                # Rolled back: "completely deleted", its checkpoints with it, so its message is in neither.
                assert seen == 0, f"{where} of a rolled-back run is still there"
            else:
                assert seen <= 1, f"{where} of an interrupted run is there {seen} times"


def test_every_archived_item_is_accounted_for(session: Session) -> None:
    for conv in session.convs:
        in_state = {m.get("id") for m in conv.final}
        timeline = conv.timeline()
        kept = in_state | {i["value"].get("id") for i in timeline}
        known = set(conv.sent) | conv.produced()
        for item in conv.archive:
            value = item["value"]
            message = value["message"]
            where = f"{_where(conv)}: archived item {item['key']} ({value.get('role')} {value.get('id')})"
            assert message["data"]["id"] == value["id"], where
            assert value["id"] in known, f"{where} is no message this thread was sent or produced"
            tags = {label for label, _ in TAG.findall(json.dumps(message["data"].get("content")))}
            tags |= {label for label, _ in TAG.findall(json.dumps(message["data"].get("tool_calls", [])))}
            assert tags <= {conv.label}, f"{where} holds messages of {sorted(tags - {conv.label})}"
            if value["role"] == "human" and value["id"] in conv.sent:
                assert message["data"]["content"] == conv.sent[value["id"]], f"{where}: the text differs"
        for item in timeline:
            assert item["value"]["id"] not in in_state, f"{_where(conv)}: {item['key']} is archived and in the state"
        for item in conv.orphans():
            # A compaction never committed (cancelled, or rolled back): the recall tool skips its items; the
            # message itself must still be in the state or in the surviving timeline's archive.
            assert item["value"]["id"] in kept, (
                f"{_where(conv)}: {item['key']} ({item['value']['id']}) lives only in an uncommitted compaction's items"
            )


def test_a_graph_factory_keeps_working(session: Session) -> None:
    factory = _convs(session, "factory")
    module = _convs(session, "module")
    for conv in factory + module:
        produced = len(conv.final) + len(conv.archive)
        assert all(r.status == "success" for r in conv.runs), _where(conv)
        assert len(conv.compactions) >= 3, f"{_where(conv)}: {len(conv.compactions)} compactions"
        assert len(conv.final) * 3 < produced, f"{_where(conv)}: {len(conv.final)} messages left of {produced}"
        assert not conv.orphans()
    built = sum(
        1 for r in session.records if r.get("logger") == "graph_factory" and "execution: True" in str(r.get("event"))
    )
    assert built >= FACTORY_THREADS * FACTORY_TURNS, f"the factory built {built} graphs for runs"
    count, _, ratio, applied = _calls_per_compaction(factory)
    # The README: with in_store=True the next run's new node applies what an earlier run prepared.
    assert applied >= 1, "no factory compaction applied a prepared summary (PrepareAhead in_store=True)"
    assert count
