"""The public surface is pinned, small and lazy.

``__all__`` is exactly the list below; every other public name has one home in
a named submodule; ``import langchain_compaction`` and ``langchain-compaction
--help`` load no framework (checked through ``sys.modules`` in a fresh
interpreter, not with a timer).
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from typing import Any

import pytest
from conftest import ROOT

import langchain_compaction

EXPECTED_ALL = [
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

# Every public name outside ``__all__``, in its one home.
HOMES = {
    "langchain_compaction.graph": [
        "COMPACTION_EVENT",
        "COMPACT_COMMAND",
        "CompactionNode",
        "CompactionRecord",
        "CompactionState",
        "acompact_thread",
        "compact_thread",
        "parse_compact_command",
        "route_after_compaction",
    ],
    "langchain_compaction.history": [
        "CompactingChatMessageHistory",
        "CompactionLock",
        "FileLock",
        "InProcessLock",
        "PostgresAdvisoryLock",
    ],
    "langchain_compaction.tokens": ["estimate_message_tokens", "estimate_tokens", "estimate_tool_tokens"],
    "langchain_compaction.functional": [
        "aauto_compact",
        "acompact",
        "auto_compact",
        "compact",
        "find_cut_point",
        "should_compact",
    ],
    "langchain_compaction.summarizers": ["ExtractiveSummarizer", "Summarizer", "SummaryReply", "SummaryRequest"],
    "langchain_compaction.middleware": ["COMPACTION_EVENT", "CompactionAgentState", "CompactionMiddleware"],
    "langchain_compaction.anthropic": ["AnthropicSummarizer", "AnthropicTokenCounter"],
    "langchain_compaction.features": [
        "Archive",
        "CacheAligned",
        "CheckedFacts",
        "ClearToolOutputs",
        "Feature",
        "Pins",
        "PrepareAhead",
        "RequireSections",
        "default_features",
    ],
    "langchain_compaction.archive": ["ARCHIVE_NAMESPACE", "RECALL_TOOL_NAME", "Archive", "recall_tool"],
    "langchain_compaction.errors": [
        "CompactionError",
        "ConfigurationError",
        "ConversationFileError",
        "EmptySummaryError",
        "InvalidMessagesError",
        "InvalidSummaryError",
        "StoreError",
        "SummarizationError",
        "SummaryTimeoutError",
    ],
}

FRAMEWORKS = ("langchain_core", "langgraph", "langchain", "anthropic")


def test_all_is_pinned_small_and_sorted() -> None:
    assert langchain_compaction.__all__ == EXPECTED_ALL
    assert len(EXPECTED_ALL) <= 20
    assert sorted(EXPECTED_ALL) == EXPECTED_ALL


@pytest.mark.parametrize("name", EXPECTED_ALL)
def test_every_top_level_name_is_importable(name: str) -> None:
    assert getattr(langchain_compaction, name) is not None


@pytest.mark.parametrize("module", sorted(HOMES))
def test_every_submodule_exports_its_names(module: str) -> None:
    loaded = importlib.import_module(module)
    for name in HOMES[module]:
        assert getattr(loaded, name) is not None, name
        assert name in loaded.__all__, name


def test_top_level_names_are_the_submodules_objects() -> None:
    from langchain_compaction import functional, graph, history, middleware

    assert langchain_compaction.CompactionNode is graph.CompactionNode
    assert langchain_compaction.CompactionMiddleware is middleware.CompactionMiddleware
    assert langchain_compaction.CompactingChatMessageHistory is history.CompactingChatMessageHistory
    assert langchain_compaction.compact is functional.compact
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = langchain_compaction.nope  # type: ignore[attr-defined]


def test_one_compaction_event_name() -> None:
    from langchain_compaction import graph, middleware

    assert graph.COMPACTION_EVENT is middleware.COMPACTION_EVENT == "langchain_compaction"


def _loaded_after(code: str) -> list[str]:
    script = (
        f"import sys\n{code}\nimport json\nprint(json.dumps(sorted(m for m in {FRAMEWORKS!r} if m in sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_importing_the_package_loads_no_framework() -> None:
    assert _loaded_after("import langchain_compaction") == []
    assert _loaded_after("from langchain_compaction import CompactionOptions, ExtractiveSummarizer") == []


def test_the_command_lines_help_loads_no_framework() -> None:
    code = (
        "import contextlib, io\nfrom langchain_compaction import cli\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    try:\n        cli.main(['--help'])\n    except SystemExit:\n        pass"
    )
    assert _loaded_after(code) == []


def test_an_adapter_loads_its_framework_on_first_use() -> None:
    loaded = _loaded_after("import langchain_compaction\nlangchain_compaction.CompactionNode")
    assert {"langchain_core", "langgraph"} <= set(loaded)
    assert "anthropic" not in loaded


def test_version_is_a_string() -> None:
    assert isinstance(langchain_compaction.__version__, str)
    assert langchain_compaction.__version__.count(".") >= 1


def test_errors_descend_from_compaction_error() -> None:
    from langchain_compaction.errors import (
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


def test_the_options_hold_the_budgets_and_prompts_only() -> None:
    # Twelve fields; every feature's option lives in the feature.
    from dataclasses import fields

    from langchain_compaction import CompactionOptions

    names = [f.name for f in fields(CompactionOptions)]
    assert len(names) <= 12, names
    assert not {"prepare_at", "check_facts", "pin_tools", "clear_tool_outputs", "summary_mode"} & set(names)


# Each 0.2 keyword, and the feature it turns into (checked on the features a node ends up with).
LEGACY = [
    ({"check_facts": False}, {}, lambda fs: not any(type(f).__name__ == "CheckedFacts" for f in fs)),
    ({"pin_tools": ("plan",)}, {}, lambda fs: next(f for f in fs if type(f).__name__ == "Pins").tools == ("plan",)),
    ({"pinned_max_tokens": 50}, {}, lambda fs: next(f for f in fs if type(f).__name__ == "Pins").max_tokens == 50),
    (
        {"clear_tool_outputs": True, "keep_tool_uses": 5, "clear_exclude_tools": ("x",), "clear_min_tokens": 7},
        {},
        lambda fs: any(
            type(f).__name__ == "ClearToolOutputs"
            and (f.keep_tool_uses, f.exclude_tools, f.min_tokens) == (5, ("x",), 7)
            for f in fs
        ),
    ),
    (
        {"prepare_at": 0.8},
        {"prepare_wait": 1.5},
        lambda fs: any(getattr(f, "at", None) == 0.8 and f.wait == 1.5 for f in fs),
    ),
    ({"summary_mode": "cache_aligned"}, {}, lambda fs: any(type(f).__name__ == "CacheAligned" for f in fs)),
    ({"require_sections": True}, {}, lambda fs: any(type(f).__name__ == "RequireSections" for f in fs)),
    ({}, {"archive": True}, lambda fs: any(type(f).__name__ == "Archive" for f in fs)),
]


@pytest.mark.parametrize(("options", "adapter", "holds"), LEGACY)
def test_the_0_2_keywords_keep_working_for_one_release(options: dict, adapter: dict, holds: object) -> None:
    from langchain_compaction import CompactionNode, CompactionOptions

    with pytest.warns(DeprecationWarning, match="deprecated and will be removed in 0.4") as caught:
        node = CompactionNode(lambda p: "## Goal\n- x", CompactionOptions(context_window=200_000, **options), **adapter)
    assert len(caught) == len(options) + len(adapter)  # one warning per keyword, naming its replacement
    assert holds(node.features)  # type: ignore[operator]


def test_a_0_2_keyword_warns_at_the_callers_line_and_a_switch_must_be_a_bool() -> None:
    import warnings

    from langchain_compaction import CompactionOptions
    from langchain_compaction.errors import ConfigurationError

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        CompactionOptions(check_facts=False)
    assert [w.filename for w in caught] == [__file__]  # (shown by Python's default filter: the user's own line)
    # "false" is a true value: it would have turned clearing on, and a cleared output is gone from the state.
    for keyword in ({"clear_tool_outputs": "false"}, {"check_facts": "no"}, {"require_sections": "no"}):
        with pytest.warns(DeprecationWarning, match="deprecated"), pytest.raises(ConfigurationError, match="True or"):
            CompactionOptions(**keyword)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["4000", [1], b"1"])
def test_a_summary_budget_of_the_wrong_type_is_named_with_a_window_set(value: object) -> None:
    from langchain_compaction import CompactionOptions
    from langchain_compaction.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="summary_max_tokens"):
        CompactionOptions(context_window=100_000, summary_max_tokens=value)  # type: ignore[arg-type]


@pytest.mark.parametrize("ttl", [float("nan"), float("inf"), 1e300, 0, -1])
def test_an_archive_ttl_that_no_store_can_keep_is_refused(ttl: float) -> None:
    from langchain_compaction.errors import ConfigurationError
    from langchain_compaction.features import Archive

    with pytest.raises(ConfigurationError, match="ttl_minutes"):
        Archive(ttl_minutes=ttl)


def test_a_remove_message_given_as_part_of_a_conversation_is_refused() -> None:
    from langchain_core.messages import AIMessage, HumanMessage, RemoveMessage
    from langgraph.graph.message import REMOVE_ALL_MESSAGES

    from langchain_compaction import ExtractiveSummarizer, compact
    from langchain_compaction.errors import InvalidMessagesError

    messages = [HumanMessage("q " * 300), AIMessage("a " * 300), RemoveMessage(id=REMOVE_ALL_MESSAGES)]
    with pytest.raises(InvalidMessagesError, match=r"messages\[2\] is a RemoveMessage.*add_messages"):
        compact(ExtractiveSummarizer(), messages)


def test_options_given_0_2_keywords_survive_pickling_and_copying_and_compare_by_them() -> None:
    import copy
    import pickle

    from langchain_compaction import CompactionOptions

    with pytest.warns(DeprecationWarning, match="deprecated"):
        old = CompactionOptions(context_window=4_000, check_facts=False, clear_tool_outputs=True)
    for clone in (pickle.loads(pickle.dumps(old)), copy.deepcopy(old), copy.copy(old)):
        assert clone == old
        assert dict(clone.legacy) == {"check_facts": False, "clear_tool_outputs": True}
    assert old != CompactionOptions(context_window=4_000)  # (they compared equal to the defaults)


def test_options_take_positional_arguments_in_0_2s_order() -> None:
    # 0.2's third to sixth positions were the prompts: its system prompt had become the summary prompt.
    from langchain_compaction import CompactionOptions

    options = CompactionOptions(200_000, 16_384, 20_000, None, None, "terse checkpoints")
    assert options.system_prompt == "terse checkpoints"
    assert options.summary_prompt is None
    assert CompactionOptions(200_000, None, None, None, None, None, None, 5_000).summary_input_tokens == 5_000
    with pytest.raises(TypeError):
        CompactionOptions(200_000, None, None, None, None, None, None, None, None, None, None, False)  # type: ignore[misc]


def test_features_and_deprecated_keywords_do_not_mix() -> None:
    from langchain_compaction import CompactionNode, CompactionOptions
    from langchain_compaction.errors import ConfigurationError
    from langchain_compaction.features import default_features

    with pytest.warns(DeprecationWarning, match="prepare_at"):
        options = CompactionOptions(context_window=200_000, prepare_at=0.7)
    with pytest.raises(ConfigurationError, match="not both"):
        CompactionNode(lambda p: "x", options, features=default_features())
    with pytest.raises(TypeError, match="unexpected keyword argument 'archiv'"):
        CompactionNode(lambda p: "x", archiv=True)


def test_no_calibrating_counter_is_claimed() -> None:
    """CalibratedEstimate (it never learned through the adapters) is gone, and the README does not claim it."""
    import langchain_compaction.anthropic as anthropic_module

    assert not hasattr(anthropic_module, "CalibratedEstimate")
    assert "CalibratedEstimate" not in (ROOT / "README.md").read_text(encoding="utf-8")


def test_a_summarizer_class_or_a_function_that_cannot_take_the_prompt_is_refused_at_construction() -> None:
    # Each was taken, and failed at the first compaction (or, as a fallback, silently).
    from langchain_compaction import CompactionMiddleware, CompactionNode, ExtractiveSummarizer
    from langchain_compaction.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match=r"not the class: ExtractiveSummarizer\(\.\.\.\)"):
        CompactionNode(ExtractiveSummarizer)
    with pytest.raises(ConfigurationError, match=r"f\(prompt\)"):
        CompactionMiddleware(lambda: "x")
    with pytest.raises(ConfigurationError, match="fallback"):
        CompactionNode(ExtractiveSummarizer(), fallback=lambda prompt, extra: "x")
    CompactionNode(lambda prompt, *rest, style="terse": "x")  # takes the prompt alone: fine


def test_the_helpers_say_what_to_pass_for_one_message_or_the_wrong_type() -> None:
    from langchain_core.messages import HumanMessage

    from langchain_compaction import redact_secrets, should_compact
    from langchain_compaction.errors import ConfigurationError, InvalidMessagesError
    from langchain_compaction.functional import find_cut_point
    from langchain_compaction.tokens import estimate_message_tokens, estimate_tokens

    one = HumanMessage("hello")
    for call in (
        lambda: estimate_message_tokens(one),  # type: ignore[arg-type]
        lambda: should_compact(one, 100, 10),  # type: ignore[arg-type]
        lambda: find_cut_point(one),  # type: ignore[arg-type]
    ):
        with pytest.raises(InvalidMessagesError, match=r"one HumanMessage, not a list of messages; pass \[message\]"):
            call()
    with pytest.raises(ConfigurationError, match="context_window='8000'"):
        should_compact([one], "8000", 500)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="for messages use estimate_message_tokens"):
        estimate_tokens(one)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="redact_secrets takes text"):
        redact_secrets(None)  # type: ignore[arg-type]


def test_a_decorated_summarizer_taking_the_prompt_alone_is_accepted() -> None:
    # inspect.signature follows functools.wraps to the wrapped function (prompt, client): the
    # wrapper, which takes the prompt alone, was refused.
    import functools

    from langchain_compaction import CompactionNode

    def with_client(summarize: Any) -> Any:
        @functools.wraps(summarize)
        def wrapper(prompt: str) -> str:
            return str(summarize(prompt, client="a client"))

        return wrapper

    @with_client
    def summarize(prompt: str, client: str) -> str:
        return "## Goal\n- x"

    CompactionNode(summarize)


@pytest.mark.parametrize("headings", [("",), ("##",), ("   ",), ()])
def test_required_headings_with_no_word_are_refused_at_construction(headings: tuple[str, ...]) -> None:
    """Such a heading is in no summary: every summary would have been rejected, the thread never compacted."""
    from langchain_compaction.errors import ConfigurationError
    from langchain_compaction.features import RequireSections

    with pytest.raises(ConfigurationError, match="headings"):
        RequireSections(headings=headings)


def test_every_feature_copies_and_pickles_as_it_was_made() -> None:
    """A feature holding locks and caches at run time (PrepareAhead, CacheAligned) is copied by its options."""
    import copy
    import pickle

    from langchain_compaction import CompactionNode
    from langchain_compaction.features import (
        Archive,
        CacheAligned,
        CheckedFacts,
        ClearToolOutputs,
        Pins,
        PrepareAhead,
        RequireSections,
    )

    made = [
        CheckedFacts(max_tokens=300),
        Pins(tools=("plan",)),
        ClearToolOutputs(keep_tool_uses=2),
        PrepareAhead(at=0.6, wait=1.5, in_store=True),
        Archive(max_messages=50),
        CacheAligned(),
        RequireSections(headings=("## Goal",)),
    ]
    for feature in made:
        for twin in (copy.deepcopy(feature), pickle.loads(pickle.dumps(feature)), copy.copy(feature)):
            assert type(twin) is type(feature)
            assert twin == feature
    # A copied feature works in a node of its own (its run-time state is its own).
    node = CompactionNode(lambda prompt: "## Goal\n- x", features=[copy.deepcopy(PrepareAhead(at=0.6))])
    assert [type(f).__name__ for f in node.features][-1] == "PrepareAhead"


def test_an_invalid_0_2_feature_keyword_is_named_as_it_was_typed() -> None:
    from langchain_compaction import CompactionNode, CompactionOptions
    from langchain_compaction.errors import ConfigurationError

    for keyword, named in (({"pin_tools": "write_todos"}, "pin_tools"), ({"pinned_max_tokens": -5}, "pinned_max")):
        with pytest.warns(DeprecationWarning, match="deprecated"):
            options = CompactionOptions(**keyword)  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match=rf"^{named}"):
            CompactionNode(lambda prompt: "## Goal\n- x", options)
