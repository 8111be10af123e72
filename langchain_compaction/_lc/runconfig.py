"""The run's config inside a node or a hook, where LangGraph could not make it current (Python 3.10, async).

LangGraph makes a node's config current (``get_config``, ``get_store``,
``get_stream_writer``, the parent run of a chat model called there) by
starting the node's asyncio task in a context that holds it. Before Python
3.11 a task cannot be started in a given context: an async node gets its
config only as an argument, and an agent middleware's async hook not even
that, only its ``Runtime``. Without this module the node found no store (an
archive refused to run) and the middleware no thread (it compacted without
archiving), and neither's summary calls were traced under the run.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from langchain_core.runnables import RunnableConfig
from langchain_core.runnables.config import var_child_runnable_config


def run_config(runtime: Any = None) -> RunnableConfig | None:
    """The running node's config; in an async hook before Python 3.11, what its ``runtime`` tells of it.

    ``None`` outside a graph (a hook called directly).
    """
    try:
        from langgraph.config import get_config

        return get_config()
    except RuntimeError:
        pass
    info = getattr(runtime, "execution_info", None)
    if info is None:
        return None
    # Which thread and graph it runs in; the runtime itself where LangGraph's readers look for it.
    configurable: dict[str, Any] = {"thread_id": info.thread_id, "checkpoint_ns": info.checkpoint_ns}
    try:
        from langgraph._internal._constants import CONFIG_KEY_RUNTIME

        configurable[CONFIG_KEY_RUNTIME] = runtime
    except ImportError:  # (a LangGraph that names it otherwise: the store and stream writer stay unknown)
        pass
    return RunnableConfig(configurable=configurable)


@contextmanager
def current(config: RunnableConfig | None) -> Iterator[None]:
    """``config`` made the run's current config while the block runs, when none is (else nothing changes)."""
    if config is None or var_child_runnable_config.get() is not None:
        yield
        return
    token = var_child_runnable_config.set(config)
    try:
        yield
    finally:
        var_child_runnable_config.reset(token)
