"""Keep long LangChain and LangGraph conversations inside a model's context window.

The older part of a conversation is summarized into a structured checkpoint
(a system message) and the most recent messages are kept verbatim, without
ever separating a tool call from its results.

The adapters (``CompactionNode``, ``CompactionMiddleware``,
``CompactingChatMessageHistory``) and the functions over message lists are
imported on first use, so ``import langchain_compaction`` loads no framework.
Everything else lives in named submodules: ``langchain_compaction.graph``
(thread helpers, the ``/compact`` command, the compaction event),
``.history`` (locks for several writers), ``.tokens`` (estimates),
``.summarizers``, ``.anthropic`` (exact counts and summaries through the SDK)
and ``.errors`` (every error the library raises).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from langchain_compaction.core.options import CompactionOptions
from langchain_compaction.core.redact import redact_secrets
from langchain_compaction.core.result import CompactionResult
from langchain_compaction.errors import CompactionError
from langchain_compaction.summarizers.extractive import ExtractiveSummarizer

if TYPE_CHECKING:
    from langchain_compaction.functional import aauto_compact, acompact, auto_compact, compact, should_compact
    from langchain_compaction.graph import CompactionNode
    from langchain_compaction.history import CompactingChatMessageHistory
    from langchain_compaction.middleware import CompactionMiddleware

__version__ = "0.3.0"

# Imported on first use: the adapters need LangChain and LangGraph (the
# middleware needs the optional ``langchain`` package, the ``agents`` extra).
_LAZY = {
    "CompactingChatMessageHistory": "langchain_compaction.history",
    "CompactionMiddleware": "langchain_compaction.middleware",
    "CompactionNode": "langchain_compaction.graph",
    "aauto_compact": "langchain_compaction.functional",
    "acompact": "langchain_compaction.functional",
    "auto_compact": "langchain_compaction.functional",
    "compact": "langchain_compaction.functional",
    "should_compact": "langchain_compaction.functional",
}

__all__ = [
    "CompactingChatMessageHistory",
    "CompactionError",
    "CompactionMiddleware",
    "CompactionNode",
    "CompactionOptions",
    "CompactionResult",
    "ExtractiveSummarizer",
    "aauto_compact",
    "acompact",
    "auto_compact",
    "compact",
    "redact_secrets",
    "should_compact",
]


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        msg = f"module {__name__!r} has no attribute {name!r}"
        raise AttributeError(msg)
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})
