"""Several real processes on one chat-memory session: no call fails, nothing is lost or twice,
and the writers agree on who summarizes (the lease of the lock), so a paid model is not
asked more often than a single writer would ask it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import warnings
from collections import Counter
from pathlib import Path

import pytest
from langchain_core.messages import BaseMessage

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    from langchain_community.chat_message_histories import FileChatMessageHistory, SQLChatMessageHistory

ROOT = Path(__file__).resolve().parents[2]
MARK = "langchain_compaction"

WRITER = textwrap.dedent(
    """
    import json, sys, time, warnings
    warnings.simplefilter("ignore")
    from langchain_community.chat_message_histories import FileChatMessageHistory, SQLChatMessageHistory
    from langchain_core.messages import HumanMessage
    from langchain_compaction import CompactingChatMessageHistory, CompactionOptions
    from langchain_compaction.history import FileLock

    kind, where, lock_path, name, count, calls_path = sys.argv[1:7]
    fail_every, request_tokens = (int(a) for a in (sys.argv[7:9] or ("0", "0")))
    made = []

    def summarize(prompt):
        with open(calls_path, "a") as calls:  # one line per summary call, from any process
            calls.write(name + "\\n")
        time.sleep(0.05)  # a model takes a while: the others go on meanwhile
        made.append(1)
        if fail_every and len(made) % fail_every == 0:
            raise ConnectionError("the model's server dropped the connection")
        return "## Goal\\n- summarized by " + name

    if kind == "file":
        inner, archive = FileChatMessageHistory(where), FileChatMessageHistory(where + ".archive")
    else:
        inner = SQLChatMessageHistory(session_id="shared", connection=where)
        archive = SQLChatMessageHistory(session_id="shared-archive", connection=where)
    history = CompactingChatMessageHistory(
        inner,
        summarize,
        CompactionOptions(
            context_window=3000, reserve_tokens=1000, keep_recent_tokens=600, summary_input_tokens=request_tokens or None
        ),
        archive=archive,
        lock=FileLock(lock_path),
        # A failing model: each add retries (the messages are stored all the same).
        on_error="warn" if fail_every else "raise",
    )
    failed = []
    for i in range(int(count)):
        try:
            history.add_messages([HumanMessage(f"{name}-m{i}" + " lorem ipsum dolor" * 6)])
        except Exception as exc:
            failed.append(f"{type(exc).__name__}: {exc}")
    print(json.dumps(failed))
    """
)

READER = textwrap.dedent(
    """
    import json, os, sys, warnings
    warnings.simplefilter("ignore")
    from langchain_community.chat_message_histories import FileChatMessageHistory
    from langchain_compaction import CompactingChatMessageHistory, CompactionOptions
    from langchain_compaction.history import FileLock

    where, lock_path, stop = sys.argv[1:4]
    failed, reads = [], 0
    while not os.path.exists(stop) or reads < 50:
        # RunnableWithMessageHistory's pattern: a wrapper per call, reading first.
        history = CompactingChatMessageHistory(
            FileChatMessageHistory(where),
            lambda p: "unused",
            CompactionOptions(context_window=3000),
            archive=FileChatMessageHistory(where + ".archive"),
            lock=FileLock(lock_path),
        )
        try:
            history.messages
            history.recall("p0", limit=3)  # the archive, read while another process appends to it
        except Exception as exc:
            failed.append(f"{type(exc).__name__}: {exc}")
        reads += 1
    print(json.dumps({"failed": failed, "reads": reads}))
    """
)


def _spawn(script: str, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", script, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )


def _failures(proc: subprocess.Popen[str]) -> list[str]:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-2000:]
    return json.loads(out.strip().splitlines()[-1])


def _exactly_once(stored: list[BaseMessage], archived: list[BaseMessage], sent: list[str]) -> None:
    originals = [str(m.content).split(" ")[0] for m in [*stored, *archived] if MARK not in m.additional_kwargs]
    counts = Counter(originals)
    assert [s for s in sent if counts[s] == 0] == [], "messages lost"
    assert [s for s, n in counts.items() if n > 1] == [], "messages stored twice"


def test_file_store_writers_and_a_reader_never_fail(tmp_path: Path) -> None:
    where = str(tmp_path / "chat.json")
    FileChatMessageHistory(where)
    FileChatMessageHistory(where + ".archive")
    lock, stop = str(tmp_path / "chat.lock"), str(tmp_path / "stop")
    reader = _spawn(READER, where, lock, stop)
    writers = [_spawn(WRITER, "file", where, lock, f"p{n}", "60", str(tmp_path / "calls")) for n in range(3)]
    failed = [f for w in writers for f in _failures(w)]
    Path(stop).touch()
    out, err = reader.communicate(timeout=300)
    assert reader.returncode == 0, err[-2000:]
    read = json.loads(out.strip().splitlines()[-1])
    # No add_messages raised (a stored message reported as failed invites a duplicate on retry),
    # and no read by a fourth process failed while the others wrote.
    assert failed == []
    assert read["failed"] == []
    assert read["reads"] >= 50
    stored, archived = FileChatMessageHistory(where).messages, FileChatMessageHistory(where + ".archive").messages
    assert any(MARK in m.additional_kwargs for m in stored)  # it did compact
    _exactly_once(stored, archived, [f"p{n}-m{i}" for n in range(3) for i in range(60)])


def _sqlite_run(tmp_path: Path, tag: str, processes: int, each: int, *failing: str) -> int:
    url = f"sqlite:///{tmp_path / tag}.db"
    SQLChatMessageHistory(session_id="shared", connection=url)  # create the table once
    calls = tmp_path / f"{tag}.calls"
    writers = [
        _spawn(WRITER, "sql", url, str(tmp_path / f"{tag}.lock"), f"p{n}", str(each), str(calls), *failing)
        for n in range(processes)
    ]
    assert [f for w in writers for f in _failures(w)] == []
    stored = SQLChatMessageHistory(session_id="shared", connection=url).messages
    archived = SQLChatMessageHistory(session_id="shared-archive", connection=url).messages
    _exactly_once(stored, archived, [f"p{n}-m{i}" for n in range(processes) for i in range(each)])
    return len(calls.read_text().split()) if calls.exists() else 0


def test_concurrent_writers_summarize_about_as_often_as_one(tmp_path: Path) -> None:
    single = _sqlite_run(tmp_path, "single", 1, 200)
    eight = _sqlite_run(tmp_path, "eight", 8, 25)
    assert single > 0
    assert eight <= max(single * 1.2, single + 1), (eight, single)


def test_stored_counts_match_a_fresh_count_whatever_happens_to_the_store() -> None:
    # The chat-memory trigger counts only what was appended since its last read;
    # whatever another writer appends, compacts or clears meanwhile, the counts
    # it uses are those a fresh count gives. (An older message edited in place
    # is not looked for: the compaction itself counts afresh.)
    import random

    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

    from langchain_compaction import CompactionOptions
    from langchain_compaction._lc.counting import counts_and_core
    from langchain_compaction.history.session import StoredCounts

    options = CompactionOptions()
    counted = StoredCounts()
    rng = random.Random(7)
    store: list[BaseMessage] = [SystemMessage("You are helpful.", id="sys")]
    for step in range(400):
        action = rng.random()
        if action < 0.6:  # another append
            store.append(HumanMessage(f"q{step} " * rng.randint(1, 40), id=f"m{step}"))
        elif action < 0.75 and len(store) >= 3:  # a compaction elsewhere that keeps the tail where it was
            keep = rng.randint(1, len(store) - 2)
            summary = SystemMessage(f"summary {step}", id=f"s{step}")
            store = [store[0], summary, *([AIMessage("x", id=f"b{step}")] * (len(store) - 2 - keep)), *store[-keep:]]
        elif action < 0.8:  # the last message replaced under its id (an agent's streaming update)
            if store:
                store[-1] = store[-1].model_copy(update={"content": f"replaced {step}"})
        elif action < 0.85:
            store = []
        copy = [m.model_copy() for m in store]  # a store hands back fresh objects
        assert counted.counts_and_core(copy, options)[0] == counts_and_core(copy, options)[0], step


def test_writers_converge_under_a_model_that_fails_every_third_call(tmp_path: Path) -> None:
    """Four processes, a summarizer failing every third call, requests of 1,000 tokens (chunks): nothing is lost or
    twice, and the store converges: a failed chunk keeps the ones before it (all or nothing kept all 240 messages,
    7,880 tokens, with no summary).

    Where the four stop depends on timing: each writer's every third call fails, so when the writer holding the
    lease needs three chunks or more, each of its compactions keeps two and the rest waits (seen: 1,520 to 6,267
    tokens at the end). What must hold whatever the timing: one more writer with the same model, adding on, brings
    the store under the window within 20 adds.
    """
    from langchain_compaction.tokens import estimate_message_tokens

    calls = _sqlite_run(tmp_path, "failing", 4, 60, "3", "1000")
    url = f"sqlite:///{tmp_path / 'failing'}.db"
    stored = SQLChatMessageHistory(session_id="shared", connection=url).messages
    assert calls > 0
    print("FIGURE | stored tokens", estimate_message_tokens(stored), "messages", len(stored), "calls", calls)
    assert estimate_message_tokens(stored) < 7880  # less than the 240 messages
    # A fifth writer, alone, with the same model (every third of its calls fails).
    last = _spawn(
        WRITER, "sql", url, str(tmp_path / "failing.lock"), "p9", "20", str(tmp_path / "more.calls"), "3", "1000"
    )
    assert _failures(last) == []
    stored = SQLChatMessageHistory(session_id="shared", connection=url).messages
    archived = SQLChatMessageHistory(session_id="shared-archive", connection=url).messages
    sent = [f"p{n}-m{i}" for n in range(4) for i in range(60)] + [f"p9-m{i}" for i in range(20)]
    _exactly_once(stored, archived, sent)
    print("FIGURE | after 20 more adds: stored tokens", estimate_message_tokens(stored), "messages", len(stored))
    assert estimate_message_tokens(stored) <= 3000


FORKER = textwrap.dedent(
    """
    import multiprocessing, sys, threading, time
    from langchain_core.chat_history import InMemoryChatMessageHistory
    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_compaction import CompactingChatMessageHistory, CompactionOptions

    asked = threading.Event()

    def slow(prompt):
        asked.set()
        time.sleep(2)  # the parent's compaction is waiting for its model when the process forks
        return "## Goal\\n- summarized"

    history = CompactingChatMessageHistory(
        InMemoryChatMessageHistory(), slow, CompactionOptions(context_window=2000, reserve_tokens=500,
        keep_recent_tokens=300)
    )
    for i in range(10):
        history.inner.add_messages([HumanMessage(f"question {i} " * 10), AIMessage(f"answer {i} " * 10)])

    def child(results):
        history.add_messages([HumanMessage("the child's question " * 10)])
        results.put(history.compact() is not None)

    if __name__ == "__main__":
        threading.Thread(target=history.compact, daemon=True).start()
        asked.wait(10)
        context = multiprocessing.get_context("fork")
        results = context.Queue()
        process = context.Process(target=child, args=(results,))
        process.start()
        process.join(30)
        if process.is_alive():
            process.kill()
            print("hung")
        else:
            print("compacted" if not results.empty() and results.get() else "not compacted")
    """
)


def test_a_process_forked_while_a_thread_compacts_a_session_can_compact_its_own_copy(tmp_path: Path) -> None:
    # The child inherited the session's lock held by a thread it does not
    # have: its compact() never returned, and add_messages never compacted.
    script = tmp_path / "forker.py"
    script.write_text(FORKER)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, str(script)]
    done = subprocess.run(command, check=False, capture_output=True, text=True, env=env, timeout=120)
    assert done.stdout.strip() == "compacted", done.stdout + done.stderr[-2000:]


DIES_AFTER_ARCHIVING = textwrap.dedent(
    """
    import os, sys, warnings
    warnings.simplefilter("ignore")
    from langchain_community.chat_message_histories import SQLChatMessageHistory
    from langchain_core.messages import HumanMessage
    from langchain_compaction import CompactingChatMessageHistory, CompactionOptions

    class DiesAfterItsWrite(SQLChatMessageHistory):
        # The process is killed right after the archive write, before the session is rewritten.
        def add_messages(self, messages):
            super().add_messages(messages)
            os._exit(9)

    url, archive_class, first, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    archive_type = DiesAfterItsWrite if archive_class == "dies" else SQLChatMessageHistory
    history = CompactingChatMessageHistory(
        SQLChatMessageHistory(session_id="s", connection=url),
        lambda prompt: "## Goal\\n- go on",
        CompactionOptions(context_window=3000, reserve_tokens=1000, keep_recent_tokens=600),
        archive=archive_type(session_id="s-archive", connection=url),
    )
    for i in range(first, first + count):
        history.add_messages([HumanMessage(f"m{i} " + "words " * 60, id=f"m{i}")])
    """
)


def test_a_process_killed_between_its_first_archive_write_and_the_rewrite_archives_nothing_twice(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'chat.db'}"
    first = _spawn(DIES_AFTER_ARCHIVING, url, "dies", "0", "40")
    first.communicate(timeout=120)
    assert first.returncode == 9  # it died in its first compaction, after the archive write
    assert SQLChatMessageHistory(session_id="s-archive", connection=url).messages  # which landed
    second = _spawn(DIES_AFTER_ARCHIVING, url, "plain", "40", "40")
    _, err = second.communicate(timeout=120)
    assert second.returncode == 0, err[-2000:]
    stored = SQLChatMessageHistory(session_id="s", connection=url).messages
    archived = SQLChatMessageHistory(session_id="s-archive", connection=url).messages
    # The killed process stored its messages up to the one whose add compacted (it never sent the rest).
    held = {str(m.content).split(" ")[0] for m in [*stored, *archived] if MARK not in m.additional_kwargs}
    last = max(i for i in range(40) if f"m{i}" in held)
    _exactly_once(stored, archived, [f"m{i}" for i in [*range(last + 1), *range(40, 80)]])


SHARED_JOURNAL = textwrap.dedent(
    """
    import json, os, sys
    from langchain_core.chat_history import BaseChatMessageHistory
    from langchain_core.messages import AIMessage, HumanMessage, messages_from_dict, messages_to_dict
    from langchain_community.chat_message_histories import FileChatMessageHistory
    from langchain_compaction import CompactingChatMessageHistory, CompactionOptions
    from langchain_compaction.errors import ConfigurationError

    folder, step = sys.argv[1], sys.argv[2]


    class Rows(BaseChatMessageHistory):
        '''One JSON line a message, no atomic rewrite (the journaled path); dies in a rewrite when armed.'''

        armed = False

        def __init__(self, session_id):
            self.session_id = session_id
            self.path = os.path.join(folder, f"{session_id}.jsonl")

        @property
        def messages(self):
            if not os.path.exists(self.path):
                return []
            with open(self.path) as lines:
                return messages_from_dict([json.loads(line) for line in lines if line.strip()])

        def add_messages(self, messages):
            for message in messages:
                if Rows.armed and message.type == "human":
                    os._exit(17)
                with open(self.path, "a") as out:
                    out.write(json.dumps(messages_to_dict([message])[0]) + "\\n")

        def clear(self):
            open(self.path, "w").close()


    def memory(session):
        journal = FileChatMessageHistory(os.path.join(folder, "journal.json"))
        return CompactingChatMessageHistory(
            Rows(session), lambda p: "## Goal\\n- summary", CompactionOptions(keep_recent_tokens=300), journal=journal
        )


    if step == "crash":
        for i in range(12):
            memory("alice").add_messages([HumanMessage(f"alice question {i} " * 8), AIMessage(f"alice {i} " * 8)])
        Rows.armed = True
        memory("alice").compact()
    elif step == "bob":
        try:
            memory("bob").messages
        except ConfigurationError as error:
            print(json.dumps(str(error)))
    else:
        print(json.dumps([str(m.content) for m in memory("alice").messages]))
    """
)


def test_a_journal_shared_by_sessions_is_refused_and_never_finishes_one_sessions_rewrite_in_another(
    tmp_path: Path,
) -> None:
    """One journal= handed to every session's wrapper: after a crash mid-rewrite, bob's history got alice's."""
    from langchain_community.chat_message_histories import FileChatMessageHistory

    from langchain_compaction import CompactingChatMessageHistory, ExtractiveSummarizer
    from langchain_compaction.errors import ConfigurationError

    def run(step: str) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        command = [sys.executable, "-c", SHARED_JOURNAL, str(tmp_path), step]
        return subprocess.run(command, check=False, capture_output=True, text=True, env=env, timeout=120)

    assert run("crash").returncode == 17  # (died in alice's rewrite, after its journal)
    bob = run("bob")
    assert "journal of another session" in json.loads(bob.stdout.strip().splitlines()[-1])
    assert not (tmp_path / "bob.jsonl").exists() or "alice" not in (tmp_path / "bob.jsonl").read_text()
    alice = json.loads(run("alice").stdout.strip().splitlines()[-1])
    assert alice[0].startswith("[Conversation summary")  # (alice's rewrite finished in alice's history)
    # In one process, the second session given the same journal is refused at once.
    journal = str(tmp_path / "one.json")
    for session in ("carol", "dave"):
        inner = FileChatMessageHistory(str(tmp_path / f"{session}.json"))
        if session == "dave":
            with pytest.raises(ConfigurationError, match="journal of another session"):
                CompactingChatMessageHistory(inner, ExtractiveSummarizer(), journal=FileChatMessageHistory(journal))
        else:
            CompactingChatMessageHistory(inner, ExtractiveSummarizer(), journal=FileChatMessageHistory(journal))
