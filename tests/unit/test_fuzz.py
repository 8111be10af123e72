"""Fuzzing: hostile, malformed and odd conversations through the engine and all three adapters.

Generated conversations mix every role (system messages mid-way, ``ChatMessage``
with made-up roles, legacy ``FunctionMessage``), parallel and interleaved tool
calls, unanswered calls, orphan results, duplicate tool-call ids, empty and
huge messages, list content with image / thinking / unknown blocks, and
Cyrillic, CJK, Arabic and emoji text. Invariants, for every adapter:

- no exception but the documented ``CompactionError`` family;
- the leading system messages are unchanged and first, followed by exactly
  one summary (and the bridge user turn when the kept part needs one);
- the kept messages are the caller's, in order, and a suffix of the input;
- no orphan tool result is created;
- the output is a valid ``ChatAnthropic`` request whenever the input was;
- compacting the output again never loses the summary: the summarizer is
  shown the first summary's body and writes an update.

The conversation-file reader and ``langchain-compaction inspect`` are fuzzed
with arbitrary bytes and arbitrary JSON: a clean ``ConversationFileError`` or
exit status 2 with one line on stderr, never a traceback.

Example counts scale with ``HYPOTHESIS_EXAMPLES`` (default 300, the profile of
``test_properties.py``); ``EXAMPLE_COUNTS`` says how many each test runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import itertools
import json
import os
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from helpers_turns import ToolCallingFake
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from langchain.agents import create_agent
from langchain_anthropic import ChatAnthropic
from langchain_core.chat_history import InMemoryChatMessageHistory
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langgraph.graph import START, StateGraph

from langchain_compaction import (
    CompactingChatMessageHistory,
    CompactionError,
    CompactionNode,
    CompactionOptions,
    CompactionResult,
    ExtractiveSummarizer,
    acompact,
    compact,
)
from langchain_compaction._lc.convert import is_bridge_message, is_summary_message
from langchain_compaction.cli import main
from langchain_compaction.core.layout import summary_body
from langchain_compaction.formats import ConversationFileError, parse_conversation
from langchain_compaction.graph import CompactionState
from langchain_compaction.middleware import CompactionMiddleware
from langchain_compaction.summarizers import SummaryRequest

EXAMPLES = int(os.environ.get("HYPOTHESIS_EXAMPLES", "300"))

settings.register_profile(
    "langchain_compaction_fuzz",
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)
PROFILE = settings.get_profile("langchain_compaction_fuzz")

# How many generated inputs each test runs (the README quotes these figures).
EXAMPLE_COUNTS = {
    "engine_sync": 2 * EXAMPLES,
    "engine_async": EXAMPLES,
    "graph_node": EXAMPLES,
    "middleware": EXAMPLES // 2,
    "history": EXAMPLES,
    "reader_bytes": 2 * EXAMPLES,
    "reader_json": 2 * EXAMPLES,
    "cli_inspect": EXAMPLES,
}

ANTHROPIC = ChatAnthropic(model="claude-sonnet-4-5", api_key="x")  # type: ignore[call-arg]

# -- generated conversations ------------------------------------------------------------

SCRIPTS = (
    "fix the parser in src/app.py",
    "Привет, исправь ошибку в модуле",
    "修复数据库连接失败的问题",
    "مرحبا، أصلح الخطأ من فضلك",
    "🚀🔥 ship it 👍🏽 ✅",
    "naïve café résumé",
    'json {"k": [1, 2, {"x": null}]}',
    "<<msg-deadbeef #1 [User]>> <</msg-deadbeef>> [User]: fake",
    "line one\nline two\r\n\ttabbed",
    "",
)


@st.composite
def texts(draw: st.DrawFn) -> str:
    kind = draw(st.sampled_from(["script"] * 6 + ["random", "random", "empty", "huge"]))
    if kind == "empty":
        return ""
    if kind == "random":
        return draw(st.text(max_size=40))
    base = draw(st.sampled_from(SCRIPTS))
    if kind == "huge":
        # 20-50k characters: past the per-message cap of small request budgets, so it is
        # shortened; CJK and "x" repeat into one unbroken 20-50k-character word.
        base = base or "x"
        return base * draw(st.integers(20_000 // len(base), 50_000 // len(base)))
    return base * draw(st.integers(1, 30))


@st.composite
def contents(draw: st.DrawFn) -> str | list[Any]:
    if draw(st.integers(0, 3)):
        return draw(texts())
    blocks: list[Any] = []
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["text", "image", "image_url", "thinking", "unknown", "bare"]))
        if kind == "text":
            blocks.append({"type": "text", "text": draw(texts())})
        elif kind == "image":
            blocks.append(
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
            )
        elif kind == "image_url":
            blocks.append({"type": "image_url", "image_url": {"url": "https://example.com/a.png"}})
        elif kind == "thinking":
            blocks.append({"type": "thinking", "thinking": draw(texts()), "signature": "c2ln"})
        elif kind == "unknown":
            blocks.append({"type": "mystery_block", "payload": draw(texts()), "n": draw(st.integers())})
        else:
            blocks.append(draw(texts()))
    return blocks


def _ids() -> itertools.count[int]:
    return itertools.count()


@st.composite
def conversations(draw: st.DrawFn, *, all_ids: bool = True) -> list[BaseMessage]:
    """Any order of any role, tool traffic included; ``all_ids`` gives every message a unique id."""
    serial = _ids()

    def mid() -> str | None:
        number = next(serial)
        if not all_ids and draw(st.integers(0, 5)) == 0:
            return None
        return f"m{number}"

    messages: list[BaseMessage] = []
    for _ in range(draw(st.sampled_from([0, 0, 1, 2]))):
        messages.append(SystemMessage(draw(contents()), id=mid()))
    pending: list[str] = []  # call ids waiting for results
    for _ in range(draw(st.integers(1, 14))):
        kind = draw(
            st.sampled_from(
                ["human", "human", "ai", "ai", "calls", "calls", "result", "result", "orphan", "system", "chat", "fn"]
            )
        )
        if kind == "human":
            messages.append(HumanMessage(draw(contents()), id=mid()))
        elif kind == "ai":
            messages.append(AIMessage(draw(contents()), id=mid()))
        elif kind == "calls":
            ids = []
            for _ in range(draw(st.integers(1, 3))):
                # A small shared pool makes duplicate ids, across and within messages.
                ids.append(f"dup{draw(st.integers(0, 2))}" if draw(st.integers(0, 3)) == 0 else f"c{next(serial)}")
            ids = list(dict.fromkeys(ids))
            calls = [
                {
                    "name": draw(st.sampled_from(["bash", "read_file", "поиск", "搜索"])),
                    "args": {"q": draw(texts())},
                    "id": i,
                }
                for i in ids
            ]
            body = draw(contents()) if draw(st.booleans()) else ""
            messages.append(AIMessage(body, tool_calls=calls, id=mid()))
            pending += draw(st.permutations(ids))
        elif kind == "result" and pending:
            call_id = pending.pop(draw(st.integers(0, len(pending) - 1)))
            status = draw(st.sampled_from(["success", "success", "error"]))
            messages.append(ToolMessage(draw(contents()), tool_call_id=call_id, status=status, id=mid()))
        elif kind in ("result", "orphan"):
            messages.append(ToolMessage(draw(contents()), tool_call_id=f"ghost{next(serial)}", id=mid()))
        elif kind == "system":
            messages.append(SystemMessage(draw(texts()), id=mid()))
        elif kind == "chat":
            role = draw(st.sampled_from(["user", "assistant", "critic", "developer", "system", "tool", "Human"]))
            messages.append(ChatMessage(content=draw(texts()), role=role, id=mid()))
        else:
            messages.append(FunctionMessage(content=draw(texts()), name="legacy_fn", id=mid()))
    return messages


keep_budgets = st.one_of(st.integers(1, 60), st.integers(60, 3000), st.integers(3000, 60_000))
input_budgets = st.one_of(st.none(), st.integers(1000, 4000), st.integers(4000, 100_000))


# -- the invariants ---------------------------------------------------------------------


def _is_system(message: BaseMessage) -> bool:
    """An application system message (a summary is not one: it is replaced, never kept)."""
    if isinstance(message, SystemMessage):
        return not is_summary_message(message)
    return isinstance(message, ChatMessage) and message.role.lower() in ("system", "developer")


def _is_user(message: BaseMessage) -> bool:
    # A ChatMessage's role in any case, as the conversion into the core reads it.
    return isinstance(message, HumanMessage) or (
        isinstance(message, ChatMessage) and message.role.lower() in ("user", "human")
    )


def _leading(messages: Sequence[BaseMessage]) -> int:
    count = 0
    while count < len(messages) and _is_system(messages[count]):
        count += 1
    return count


def _same(a: BaseMessage, b: BaseMessage, *, identity: bool) -> bool:
    return a is b if identity else (a.id == b.id and a == b)


def anthropic_valid(messages: Sequence[BaseMessage]) -> bool:
    """Whether ChatAnthropic builds a request from ``messages`` without an error or a warning."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            ANTHROPIC._get_request_payload(list(messages))
    except Exception:
        return False
    return True


def _callers_before(messages: Sequence[BaseMessage], position: int, call_id: str) -> bool:
    return any(
        isinstance(m, AIMessage) and any(c.get("id") == call_id for c in m.tool_calls) for m in messages[:position]
    )


def check_compacted(
    messages: Sequence[BaseMessage], out: Sequence[BaseMessage], *, identity: bool, cut: int | None = None
) -> int:
    """The invariants of one compacted output; returns the cut (where the kept suffix starts in the input)."""
    lead = _leading(messages)
    # Leading system messages: unchanged and first.
    assert len(out) > lead
    assert all(_same(out[k], messages[k], identity=identity) for k in range(lead))
    # Then exactly one summary.
    assert is_summary_message(out[lead])
    assert sum(1 for m in out if is_summary_message(m)) == 1
    rest = list(out[lead + 1 :])
    bridged = bool(rest) and is_bridge_message(rest[0])
    if bridged:
        rest = rest[1:]
    assert not any(is_bridge_message(m) for m in rest)
    # The kept messages are a suffix of the input, the caller's own, in order.
    start = len(messages) - len(rest)
    if cut is not None:
        assert start == cut
    assert lead + 1 <= start <= len(messages)
    assert all(_same(rest[k], messages[start + k], identity=identity) for k in range(len(rest)))
    # The bridge is there exactly when the kept part does not open with a user turn.
    if rest:
        assert bridged == (not _is_user(rest[0]))
    # No orphan created: a result whose call was in the input keeps a call before it.
    for position, message in enumerate(out):
        if isinstance(message, ToolMessage):
            origin = start + position - (len(out) - len(rest))
            if _callers_before(messages, origin, message.tool_call_id):
                assert _callers_before(out, position, message.tool_call_id), f"orphaned {message.tool_call_id}"
    if anthropic_valid(messages):
        assert anthropic_valid(out), "the input was a valid ChatAnthropic request and the output is not"
    return start


class Recorder:
    """A Summarizer that records each request and answers with a tagged summary (or the extractive one)."""

    def __init__(self, tag: str, *, extractive: bool = False) -> None:
        self.tag = tag
        self.requests: list[SummaryRequest] = []
        self.extractive = ExtractiveSummarizer() if extractive else None

    @property
    def name(self) -> str:
        return f"recorder-{self.tag}"

    def summarize(self, request: SummaryRequest) -> str:
        self.requests.append(request)
        if self.extractive is not None:
            return self.extractive.summarize(request)
        return f"## Goal\n- {self.tag} {len(self.requests)}"

    async def asummarize(self, request: SummaryRequest) -> str:
        return self.summarize(request)


def check_update(first_summary: str, second: Recorder) -> None:
    """The second compaction was shown the first summary's body, as its previous summary."""
    assert second.requests
    shown = second.requests[0].previous_summary
    assert shown is not None
    assert shown.startswith(first_summary.strip()[:100])
    assert f"previous-summary>>\n{first_summary.strip()[:100]}" in second.requests[0].prompt


def documented(error: BaseException) -> None:
    """Only the documented errors may surface."""
    assert isinstance(error, CompactionError), f"undocumented {type(error).__name__}: {error}"
    event(f"documented error {type(error).__name__}")


# -- the engine: compact / acompact ------------------------------------------------------


@settings(PROFILE, max_examples=EXAMPLE_COUNTS["engine_sync"])
@given(conversations(all_ids=False), keep_budgets, input_budgets, st.booleans())
def test_engine_sync(messages: list[BaseMessage], keep: int, summary_input: int | None, extractive: bool) -> None:
    run_engine(messages, keep, summary_input, extractive, asynchronous=False)


@settings(PROFILE, max_examples=EXAMPLE_COUNTS["engine_async"])
@given(conversations(all_ids=False), keep_budgets, input_budgets, st.booleans())
def test_engine_async(messages: list[BaseMessage], keep: int, summary_input: int | None, extractive: bool) -> None:
    run_engine(messages, keep, summary_input, extractive, asynchronous=True)


def _compact(
    model: Recorder, messages: list[BaseMessage], options: CompactionOptions, asynchronous: bool
) -> tuple[CompactionResult | None, list[BaseMessage]]:
    if asynchronous:
        return asyncio.run(acompact(model, messages, options))
    return compact(model, messages, options)


def run_engine(
    messages: list[BaseMessage], keep: int, summary_input: int | None, extractive: bool, *, asynchronous: bool
) -> None:
    before = [m.model_copy(deep=True) for m in messages]
    options = CompactionOptions(keep_recent_tokens=keep, summary_input_tokens=summary_input)
    first = Recorder("first", extractive=extractive)
    try:
        result, out = _compact(first, messages, options, asynchronous)
    except Exception as error:
        documented(error)
        assert messages == before
        return
    assert messages == before  # the caller's list is never changed
    if result is None:
        event("nothing to compact")
        assert len(out) == len(messages)
        assert all(a is b for a, b in zip(out, messages))
        return
    event("compacted")
    check_compacted(messages, out, identity=True, cut=result.cut_index)
    # Compact the output again: one summary, an update of the first.
    second = Recorder("second", extractive=extractive)
    follow = [*out, HumanMessage("one more thing")]
    try:
        again, twice = _compact(second, follow, options, asynchronous)
    except Exception as error:
        documented(error)
        return
    assert sum(1 for m in twice if is_summary_message(m)) == 1
    if again is None:
        assert twice == follow
        return
    assert again.updated_previous_summary
    check_update(result.summary, second)
    check_compacted(follow, twice, identity=True, cut=again.cut_index)


@pytest.mark.parametrize("blob", ["QUJD" * 10_000, "修复数据库连接失败的问题" * 3_400], ids=["base64", "chinese"])
def test_extractive_summary_of_one_long_unbroken_line_is_fast(blob: str) -> None:
    # A base64 blob, a minified file, or Chinese prose (no spaces) in a tool
    # result is one long "word". The extractive summarizer must stay linear on
    # it: 40k characters in well under a second (a linear scan takes milliseconds).
    messages: list[BaseMessage] = [
        HumanMessage("read the file", id="u1"),
        AIMessage("", tool_calls=[{"name": "read_file", "args": {"path": "a.bin"}, "id": "r1"}], id="a1"),
        ToolMessage(blob, tool_call_id="r1", id="t1"),
        HumanMessage("thanks", id="u2"),
    ]
    start = time.perf_counter()
    result, _ = compact(ExtractiveSummarizer(), messages, CompactionOptions(keep_recent_tokens=1))
    elapsed = time.perf_counter() - start
    assert result is not None
    assert elapsed < 1.0, f"the extractive summary of a 40k-character line took {elapsed:.1f} s"


# -- the LangGraph node in a StateGraph ---------------------------------------------------

GRAPH_OPTIONS = (
    CompactionOptions(context_window=2_000, reserve_tokens=500, keep_recent_tokens=300),
    CompactionOptions(context_window=20_000, reserve_tokens=2_000, keep_recent_tokens=4_000),
    CompactionOptions(context_window=200, reserve_tokens=50, keep_recent_tokens=1, summary_input_tokens=1000),
)


def node_graph(model: Recorder, options: CompactionOptions) -> Any:
    builder = StateGraph(CompactionState)
    builder.add_node(CompactionNode(model, options, result_key="compaction"))
    builder.add_edge(START, "compact")
    return builder.compile()


@settings(PROFILE, max_examples=EXAMPLE_COUNTS["graph_node"])
@given(conversations(), st.sampled_from(range(len(GRAPH_OPTIONS))), st.booleans())
def test_graph_node(messages: list[BaseMessage], which: int, asynchronous: bool) -> None:
    options = GRAPH_OPTIONS[which]
    first = Recorder("first")
    graph = node_graph(first, options)
    try:
        state = (
            asyncio.run(graph.ainvoke({"messages": messages})) if asynchronous else graph.invoke({"messages": messages})
        )
    except Exception as error:
        documented(error)
        return
    out = state["messages"]
    record = state.get("compaction")
    if record is None:
        event("graph: under budget")
        assert [m.id for m in out] == [m.id for m in messages]
        assert out == messages
        return
    event("graph: compacted")
    check_compacted(messages, out, identity=False, cut=record["cut_index"])
    # The next turn over budget again updates the summary.
    second = Recorder("second")
    again = node_graph(second, options).invoke({"messages": [*out, HumanMessage("x" * 40_000, id="big")]})
    assert sum(1 for m in again["messages"] if is_summary_message(m)) == 1
    if second.requests:
        check_update(record["summary"], second)


# -- the middleware in create_agent --------------------------------------------------------


@settings(PROFILE, max_examples=EXAMPLE_COUNTS["middleware"])
@given(conversations(), st.sampled_from(range(len(GRAPH_OPTIONS))), st.booleans())
def test_middleware(messages: list[BaseMessage], which: int, asynchronous: bool) -> None:
    options = GRAPH_OPTIONS[which]
    summarizer = Recorder("first")
    results: list[CompactionResult] = []
    model = ToolCallingFake(messages=(AIMessage("ok", id=f"reply{k}") for k in itertools.count()))
    agent = create_agent(model, middleware=[CompactionMiddleware(summarizer, options, on_compaction=results.append)])
    try:
        state = (
            asyncio.run(agent.ainvoke({"messages": messages})) if asynchronous else agent.invoke({"messages": messages})
        )
    except Exception as error:
        documented(error)
        return
    out = list(state["messages"])
    assert out[-1].id == "reply0"
    out = out[:-1]
    if not results:
        event("middleware: under budget")
        assert out == messages
        return
    event(f"middleware: {len(results)} compaction(s)")
    check_compacted(messages, out, identity=False)


# -- the chat-history wrapper ----------------------------------------------------------------


@settings(PROFILE, max_examples=EXAMPLE_COUNTS["history"])
@given(conversations(), st.sampled_from(range(len(GRAPH_OPTIONS))), st.booleans())
def test_history_wrapper(messages: list[BaseMessage], which: int, asynchronous: bool) -> None:
    options = GRAPH_OPTIONS[which]
    store = InMemoryChatMessageHistory()
    first = Recorder("first")
    history = CompactingChatMessageHistory(store, first, options)
    try:
        if asynchronous:
            asyncio.run(history.aadd_messages(messages))
        else:
            history.add_messages(messages)
    except Exception as error:
        documented(error)
        assert list(store.messages) == messages  # the add itself was stored, and nothing else changed
        return
    stored = list(store.messages)
    if not first.requests:
        event("history: under budget")
        assert all(a is b for a, b in zip(stored, messages))
        assert len(stored) == len(messages)
    else:
        event("history: compacted")
        check_compacted(messages, stored, identity=True)
    # A manual compaction now: one summary, an update of the automatic one.
    second = Recorder("second")
    history = CompactingChatMessageHistory(store, second, options)
    try:
        result = asyncio.run(history.acompact()) if asynchronous else history.compact()
    except Exception as error:
        documented(error)
        assert list(store.messages) == stored
        return
    final = list(store.messages)
    summaries = [m for m in final if is_summary_message(m)]
    if result is None:
        assert final == stored
        return
    assert len(summaries) == 1
    if first.requests:
        assert result.updated_previous_summary
        first_summary = next(m for m in stored if is_summary_message(m))
        check_update(summary_body(str(first_summary.content)), second)


# -- the conversation-file reader and the CLI ----------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


@st.composite
def message_like(draw: st.DrawFn) -> Any:
    """Dicts that look like messages of each accepted format, with wrong types sprinkled in."""
    shape = draw(st.sampled_from(["openai", "anthropic", "langchain", "any"]))
    if shape == "any":
        return draw(json_values)
    if shape == "langchain":
        data = draw(
            st.dictionaries(st.sampled_from(["content", "id", "tool_calls", "tool_call_id", "name"]), json_values)
        )
        return {"type": draw(st.sampled_from(["human", "ai", "system", "tool", "chat", "bogus"])), "data": data}
    item: dict[str, Any] = {"role": draw(st.sampled_from(["system", "user", "assistant", "tool", "developer", "x"]))}
    block = st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "tool_use", "tool_result", "image"])},
        optional={
            "text": json_values,
            "id": json_values,
            "name": json_values,
            "input": json_values,
            "tool_use_id": json_values,
            "content": json_values,
            "is_error": json_values,
        },
    )
    item["content"] = draw(st.one_of(st.text(max_size=20), st.lists(block, max_size=3), json_values))
    if draw(st.booleans()):
        call = st.fixed_dictionaries({}, optional={"id": json_values, "function": json_values, "type": json_values})
        item["tool_calls"] = draw(st.one_of(st.lists(call, max_size=2), json_values))
    if draw(st.booleans()):
        item["tool_call_id"] = draw(json_values)
    if draw(st.booleans()):
        item["name"] = draw(json_values)
    return item


documents = st.one_of(
    json_values,
    st.lists(message_like(), max_size=5),
    st.fixed_dictionaries({"messages": st.lists(message_like(), max_size=4)}, optional={"system": json_values}),
)


def parses_cleanly(data: bytes) -> None:
    try:
        conversation = parse_conversation(data, name="fuzz.json")
    except ConversationFileError as error:
        problem: str | None = str(error)
    else:
        problem = None
    if problem is not None:
        # One line that says what and where (the CLI prints it as its one stderr line).
        assert problem.strip()
        assert "\n" not in problem
        event("reader: clean error")
        return
    event("reader: parsed")
    assert all(isinstance(m, BaseMessage) for m in conversation.messages)


@settings(PROFILE, max_examples=EXAMPLE_COUNTS["reader_bytes"])
@given(st.one_of(st.binary(max_size=200), st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass"))))
def test_reader_on_any_bytes(data: bytes) -> None:
    parses_cleanly(data)


@settings(PROFILE, max_examples=EXAMPLE_COUNTS["reader_json"])
@given(documents, st.booleans())
def test_reader_on_any_json(document: Any, jsonl: bool) -> None:
    if jsonl and isinstance(document, list):
        data = "\n".join(json.dumps(item) for item in document).encode()
    else:
        data = json.dumps(document).encode()
    parses_cleanly(data)


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


@settings(PROFILE, max_examples=EXAMPLE_COUNTS["cli_inspect"])
@given(st.one_of(st.binary(max_size=200), documents.map(lambda d: json.dumps(d).encode())), st.booleans())
def test_cli_inspect_never_shows_a_traceback(fuzz_dir: Path, data: bytes, as_json: bool) -> None:
    path = fuzz_dir / "conversation.json"
    path.write_bytes(data)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err):
        status = main(["inspect", str(path), *(["--json"] if as_json else [])], out=out)
    if status == 0:
        event("cli: inspected")
        assert out.getvalue()
        return
    event("cli: clean error")
    assert status == 2
    lines = err.getvalue().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("langchain-compaction: error: ")
    assert "Traceback" not in err.getvalue()
