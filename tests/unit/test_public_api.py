"""The public surface is pinned: ``__all__`` is exactly this list."""

from __future__ import annotations

import importlib

import pytest

import langchain_compaction

EXPECTED_ALL = [
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


def test_all_is_pinned() -> None:
    assert langchain_compaction.__all__ == EXPECTED_ALL


def test_all_is_sorted_and_unique() -> None:
    assert sorted(langchain_compaction.__all__) == langchain_compaction.__all__
    assert len(set(langchain_compaction.__all__)) == len(langchain_compaction.__all__)


@pytest.mark.parametrize("name", EXPECTED_ALL)
def test_every_name_is_importable(name: str) -> None:
    module = importlib.import_module("langchain_compaction")
    assert getattr(module, name) is not None


def test_star_import_gives_exactly_all() -> None:
    namespace: dict[str, object] = {}
    exec("from langchain_compaction import *", namespace)
    assert sorted(k for k in namespace if k != "__builtins__") == sorted(EXPECTED_ALL)


def test_middleware_is_exported_lazily() -> None:
    # It needs the optional ``langchain`` package, so it is not in ``__all__``.
    from langchain_compaction.adapters.middleware import CompactionMiddleware

    assert langchain_compaction.CompactionMiddleware is CompactionMiddleware
    assert "CompactionMiddleware" not in langchain_compaction.__all__
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = langchain_compaction.nope  # type: ignore[attr-defined]


def test_version_is_a_string() -> None:
    assert isinstance(langchain_compaction.__version__, str)
    assert langchain_compaction.__version__.count(".") >= 1


def test_issue_names_are_public() -> None:
    # The names issue 2 requires, importable from the top level.
    required = {
        "CompactionOptions",
        "CompactionResult",
        "CompactionError",
        "estimate_tokens",
        "estimate_message_tokens",
        "should_compact",
        "find_cut_point",
        "compact",
        "acompact",
    }
    assert required <= set(langchain_compaction.__all__)


def test_errors_descend_from_compaction_error() -> None:
    from langchain_compaction import (
        CompactionError,
        ConfigurationError,
        EmptySummaryError,
        InvalidMessagesError,
        StoreError,
        SummarizationError,
        SummaryTimeoutError,
    )

    for error in (ConfigurationError, EmptySummaryError, InvalidMessagesError, StoreError, SummaryTimeoutError):
        assert issubclass(error, CompactionError)
    assert issubclass(ConfigurationError, ValueError)
    assert issubclass(InvalidMessagesError, ValueError)
    assert issubclass(EmptySummaryError, SummarizationError)
    assert issubclass(SummaryTimeoutError, SummarizationError)
