"""Threads and stores: one rule for how a run's thread is named in a LangGraph store.

Prepared summaries (``_lc.prepared``) and the archive of compacted messages
(``_lc.archive``) both keep items per thread in the graph's store, under a
namespace whose second label is the thread id. Store labels cannot contain a
dot or be empty, so thread ids are encoded here, once.
"""

from __future__ import annotations

from typing import Any

__all__ = ["current_store", "thread_label", "thread_of"]


def thread_label(thread_id: object) -> str:
    """A thread id as a store namespace label (labels cannot contain ``.`` or be empty).

    ``%`` and ``.`` are percent-encoded, so the encoding is one to one:
    ``"user.123"`` becomes ``"user%2E123"``.

    Example:
        >>> thread_label("user.123"), thread_label("50%.x")
        ('user%2E123', '50%25%2Ex')
    """
    text = str(thread_id)
    return (text.replace("%", "%25").replace(".", "%2E")) or "%00"


def thread_of(config: Any) -> str:
    """The thread id of a run's config ("" outside a thread: one conversation per adapter)."""
    configurable = (config or {}).get("configurable") or {} if isinstance(config, dict) else {}
    return str(configurable.get("thread_id") or "")


def current_store() -> Any:
    """The LangGraph store of the graph being run, or ``None`` (none given, or not inside a graph)."""
    try:
        from langgraph.config import get_store

        return get_store()
    except (ImportError, RuntimeError, KeyError):
        return None
