"""Keep long LangChain and LangGraph conversations inside a model's context window.

The older part of a conversation is summarized into a structured checkpoint
(a system message) and the most recent messages are kept verbatim, without
ever separating a tool call from its results.
"""

from langchain_compaction.adapters.messages import (
    acompact,
    compact,
    estimate_message_tokens,
    find_cut_point,
    should_compact,
)
from langchain_compaction.core.engine import Summarizer
from langchain_compaction.core.options import CompactionOptions
from langchain_compaction.core.result import CompactionRecord, CompactionResult
from langchain_compaction.core.tokens import estimate_tokens
from langchain_compaction.core.types import SummaryRequest
from langchain_compaction.errors import (
    CompactionError,
    ConfigurationError,
    EmptySummaryError,
    InvalidMessagesError,
    StoreError,
    SummarizationError,
    SummaryTimeoutError,
)
from langchain_compaction.summarizers.chat_model import CallableSummarizer, ChatModelSummarizer

__version__ = "0.1.0"

__all__ = [
    "CallableSummarizer",
    "ChatModelSummarizer",
    "CompactionError",
    "CompactionOptions",
    "CompactionRecord",
    "CompactionResult",
    "ConfigurationError",
    "EmptySummaryError",
    "InvalidMessagesError",
    "StoreError",
    "SummarizationError",
    "Summarizer",
    "SummaryRequest",
    "SummaryTimeoutError",
    "__version__",
    "acompact",
    "compact",
    "estimate_message_tokens",
    "estimate_tokens",
    "find_cut_point",
    "should_compact",
]
