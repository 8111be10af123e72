"""Keep long LangChain and LangGraph conversations inside a model's context window.

The older part of a conversation is summarized into a structured checkpoint
(a system message) and the most recent messages are kept verbatim, without
ever separating a tool call from its results.
"""

import importlib
from typing import TYPE_CHECKING

from langchain_compaction.adapters.graph import (
    COMPACT_COMMAND,
    COMPACTION_EVENT,
    CompactionNode,
    CompactionState,
    acompact_thread,
    compact_thread,
    parse_compact_command,
    route_after_compaction,
)
from langchain_compaction.adapters.history import CompactingChatMessageHistory
from langchain_compaction.adapters.locks import CompactionLock, FileLock, InProcessLock, PostgresAdvisoryLock
from langchain_compaction.adapters.messages import (
    aauto_compact,
    acompact,
    auto_compact,
    compact,
    estimate_message_tokens,
    find_cut_point,
    should_compact,
)
from langchain_compaction.core.engine import Summarizer
from langchain_compaction.core.options import CompactionOptions
from langchain_compaction.core.redact import redact_secrets
from langchain_compaction.core.result import CompactionRecord, CompactionResult
from langchain_compaction.core.tokens import estimate_tokens
from langchain_compaction.core.types import SummaryRequest
from langchain_compaction.errors import (
    CompactionError,
    ConfigurationError,
    EmptySummaryError,
    InvalidMessagesError,
    InvalidSummaryError,
    StoreError,
    SummarizationError,
    SummaryTimeoutError,
)
from langchain_compaction.summarizers.chat_model import CallableSummarizer, ChatModelSummarizer
from langchain_compaction.summarizers.extractive import ExtractiveSummarizer

if TYPE_CHECKING:
    from langchain_compaction.adapters.middleware import CompactionMiddleware as CompactionMiddleware
    from langchain_compaction.anthropic import AnthropicSummarizer as AnthropicSummarizer
    from langchain_compaction.anthropic import AnthropicTokenCounter as AnthropicTokenCounter
    from langchain_compaction.anthropic import CalibratedEstimate as CalibratedEstimate

# Imported on first use: the middleware needs the optional ``langchain``
# package (the ``agents`` extra), and the Anthropic SDK takes seconds to import.
_LAZY = {
    "CompactionMiddleware": "langchain_compaction.adapters.middleware",
    "AnthropicSummarizer": "langchain_compaction.anthropic",
    "AnthropicTokenCounter": "langchain_compaction.anthropic",
    "CalibratedEstimate": "langchain_compaction.anthropic",
}

__version__ = "0.1.0"

__all__ = [
    "COMPACTION_EVENT",
    "COMPACT_COMMAND",
    "CallableSummarizer",
    "ChatModelSummarizer",
    "CompactingChatMessageHistory",
    "CompactionError",
    "CompactionLock",
    "CompactionNode",
    "CompactionOptions",
    "CompactionRecord",
    "CompactionResult",
    "CompactionState",
    "ConfigurationError",
    "EmptySummaryError",
    "ExtractiveSummarizer",
    "FileLock",
    "InProcessLock",
    "InvalidMessagesError",
    "InvalidSummaryError",
    "PostgresAdvisoryLock",
    "StoreError",
    "SummarizationError",
    "Summarizer",
    "SummaryRequest",
    "SummaryTimeoutError",
    "__version__",
    "aauto_compact",
    "acompact",
    "acompact_thread",
    "auto_compact",
    "compact",
    "compact_thread",
    "estimate_message_tokens",
    "estimate_tokens",
    "find_cut_point",
    "parse_compact_command",
    "redact_secrets",
    "route_after_compaction",
    "should_compact",
]


def __getattr__(name: str) -> object:
    # The lazy names stay out of ``__all__``, so ``import *`` needs neither.
    module = _LAZY.get(name)
    if module is None:
        msg = f"module {__name__!r} has no attribute {name!r}"
        raise AttributeError(msg)
    return getattr(importlib.import_module(module), name)
