"""``langchain-compaction archive``: list and print a thread's archive from a store URL, for debugging.

The store packages come with the ``stores`` extra (``pip install
"langchain-compaction[stores]"``), not with the base install.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import closing, contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO
from urllib.parse import quote

from langchain_compaction._lc.conversation import Conversation
from langchain_compaction._lc.convert import to_core
from langchain_compaction.core.effects import drive
from langchain_compaction.core.lines import one_line, shown
from langchain_compaction.core.transcript import message_body
from langchain_compaction.errors import ConfigurationError
from langchain_compaction.features.archive import Archive, archived_message, read_all

if TYPE_CHECKING:
    from langgraph.store.base import BaseStore, Item

_EXTRA = 'install the store packages: pip install "langchain-compaction[stores]"'


@contextmanager
def open_store(url: str) -> Iterator[BaseStore]:
    """The LangGraph store at ``url``: ``postgresql://...`` or ``sqlite:///path`` (or a path to a ``.db`` file).

    Raises:
        ConfigurationError: The URL names no store this command can open, the
            SQLite file does not exist, or the store packages are missing.
    """
    if url.startswith(("postgres://", "postgresql://")):
        try:
            import psycopg
            from langgraph.store.postgres import PostgresStore
        except ImportError as exc:
            raise ConfigurationError("store", url, _EXTRA) from exc
        try:
            with PostgresStore.from_conn_string(url) as store:
                yield store
        except psycopg.Error as exc:  # not reachable, or no store in it (a listing never creates one)
            raise ConfigurationError("store", url, f"{_first_line(exc)}; {_STORE_ADVICE}") from exc
        return
    path = url.removeprefix("sqlite:///") if url.startswith("sqlite:///") else url
    if not url.startswith("sqlite:///") and Path(path).suffix not in (".db", ".sqlite", ".sqlite3"):
        raise ConfigurationError("store", url, "pass postgresql://user@host/db or sqlite:///path/to/store.db")
    if not Path(path).is_file():
        raise ConfigurationError("store", url, f"no SQLite file at {path}")
    _holds_a_store(path, url)
    try:
        from langgraph.store.sqlite import SqliteStore
    except ImportError as exc:
        raise ConfigurationError("store", url, _EXTRA) from exc
    with SqliteStore.from_conn_string(path) as store:
        yield store


_STORE_ADVICE = "pass the database the graph's store writes to (not its checkpointer's)"


def _first_line(error: BaseException) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def _holds_a_store(path: str, url: str) -> None:
    """Refuse a SQLite file that is no database or holds no LangGraph store, read-only.

    (``SqliteStore`` creates its tables on first use: a listing must not
    write them into another database, the checkpointer's say.)
    """
    try:
        with closing(sqlite3.connect(f"file:{quote(path)}?mode=ro", uri=True)) as db:
            found = db.execute("select 1 from sqlite_master where type = 'table' and name = 'store'").fetchone()
    except sqlite3.Error as exc:
        raise ConfigurationError("store", url, f"{path} is not a SQLite database ({_first_line(exc)})") from exc
    if found is None:
        raise ConfigurationError("store", url, f"{path} holds no LangGraph store; {_STORE_ADVICE}")


def _row(item: Item) -> dict[str, Any] | None:
    try:
        message = archived_message(item.value)
        position = int(str(item.value["position"]))
    except (KeyError, TypeError, ValueError, IndexError):
        return None  # not an item this library wrote
    return {
        "position": position,
        "key": item.value.get("id") or item.key,
        "role": item.value.get("role"),
        "compaction": item.value.get("compaction"),
        "text": message_body(to_core(message)),
    }


def print_archive(
    url: str,
    thread: str,
    out: TextIO,
    *,
    prefix: str,
    show: str | None,
    as_json: bool,
    subgraph: Sequence[str] = (),
) -> int:
    """List ``thread``'s archived messages (a sub-agent's: the nodes that run it), or print one; the exit status."""
    archive = Archive(prefix=prefix)
    namespace = archive.namespace(Conversation(thread, tuple(subgraph)))
    with open_store(url) as store:
        items = drive(read_all(store, namespace))
    rows = sorted((r for r in map(_row, items) if r is not None), key=lambda r: r["position"])
    if show is not None:
        rows = [r for r in rows if show in (r["key"], str(r["position"]))]
        if not rows:
            raise ConfigurationError("show", show, f"pass a key or position of thread {thread!r}'s archive")
    if as_json:
        out.write(json.dumps(rows, ensure_ascii=False, indent=1) + "\n")
        return 0
    if not rows:
        print(f"thread {thread!r} has no archived messages under {namespace}", file=out)
        return 0
    for row in rows:
        text = shown(row["text"]) if show is not None else one_line(row["text"], 100)
        print(f"#{row['position']} {row['role']} (compaction {row['compaction']}) {row['key']}: {text}", file=out)
    if show is None:
        print(f"{len(rows)} archived message(s); --show KEY_OR_POSITION prints one in full", file=out)
    return 0
