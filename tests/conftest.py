"""Shared fixtures: agent transcripts, a recording summarizer, and readers of the output layout.

Transcripts: the project ships one of its own (``tests/data/transcripts``) and
the demo's (``langchain_compaction/data``), so the suite runs from an sdist; the six public agent runs in
``../shared/data/transcripts`` (or ``$LANGCHAIN_COMPACTION_TRANSCRIPTS``) join
it when they are there, and the tests that need one of them by name are
skipped, with the reason, when they are not.
"""

from __future__ import annotations

import functools
import json
import warnings
from collections.abc import Sequence
from pathlib import Path

import pytest
from langchain_core.messages import BaseMessage, messages_from_dict

from bench.workloads import transcripts_dir

ROOT = Path(__file__).resolve().parents[1]
OWN_TRANSCRIPTS = ROOT / "tests" / "data" / "transcripts"
DEMO_TRANSCRIPTS = ROOT / "langchain_compaction" / "data"  # the one the demo replays ships with the package
SHARED_TRANSCRIPTS = transcripts_dir()
_PATHS = {
    p.stem: p
    for folder in (OWN_TRANSCRIPTS, DEMO_TRANSCRIPTS, SHARED_TRANSCRIPTS)
    if folder is not None
    for p in folder.glob("*.json")
}
TRANSCRIPT_NAMES = sorted(_PATHS)

requires_shared = pytest.mark.skipif(
    SHARED_TRANSCRIPTS is None, reason="needs the shared transcripts (../shared/data/transcripts)"
)


def transcript_path(name: str) -> Path:
    """Where transcript ``name`` is (ours or a shared one)."""
    if name not in _PATHS:
        pytest.skip(f"transcript {name!r} is not here (the shared transcripts are missing)")
    return _PATHS[name]


def load_transcript(name: str) -> list[BaseMessage]:
    """Load one transcript as LangChain messages (fresh objects each call)."""
    return messages_from_dict(json.loads(transcript_path(name).read_text(encoding="utf-8")))


@pytest.fixture(params=TRANSCRIPT_NAMES)
def transcript(request: pytest.FixtureRequest) -> list[BaseMessage]:
    """Each transcript in turn: ours, and the shared ones when present."""
    return load_transcript(request.param)


class RecordingSummarizer:
    """A plain-callable summarizer that records every prompt it is given."""

    def __init__(self, reply: str = "## Goal\n- continue the work\n\n## Critical Context\n- (none)") -> None:
        self.reply = reply
        self.prompts: list[str] = []

    def __call__(self, prompt: str) -> str:
        self.prompts.append(prompt)
        return self.reply


@pytest.fixture
def recorder() -> RecordingSummarizer:
    return RecordingSummarizer()


# --- the layout of a compaction's output ------------------------------------------
#
# ``[leading system messages, summary, (bridge), *recent]``: the bridge is the
# user turn ``finish()`` puts after the summary when the kept messages do not
# start with one (Anthropic rejects a conversation whose first turn is not the
# user's). These helpers are shared by the test files that check the layout.

from typing import Any, NamedTuple  # noqa: E402

from langchain_core.messages import ChatMessage, HumanMessage, SystemMessage  # noqa: E402

from langchain_compaction._lc.convert import (  # noqa: E402
    BRIDGE_REQUEST_INTRO,
    BRIDGE_TEXT,
    SUMMARY_MARK,
    is_bridge_message,
    is_summary_message,
)
from langchain_compaction.core.layout import BRIDGE_REQUEST_CHARS  # noqa: E402


def is_user_turn(message: BaseMessage) -> bool:
    """Whether ``message`` opens a user turn (the rule the bridge follows)."""
    if is_bridge_message(message):
        return True
    if isinstance(message, HumanMessage):
        return True
    return isinstance(message, ChatMessage) and message.role.lower() in ("user", "human")


def assert_bridge(message: BaseMessage) -> None:
    """``message`` is a well-formed bridge: a marked user turn with the fixed text, and the request it repeats."""
    assert isinstance(message, HumanMessage)
    assert is_bridge_message(message)
    mark = message.additional_kwargs[SUMMARY_MARK]
    request = mark.get("request", "")
    assert set(message.additional_kwargs) == {SUMMARY_MARK}
    assert {k: v for k, v in mark.items() if k != "request"} == {"kind": "bridge", "version": 1}
    assert message.content == (f"{BRIDGE_TEXT}\n\n{BRIDGE_REQUEST_INTRO}\n{request}" if request else BRIDGE_TEXT)
    assert "\n" not in request
    assert len(request) <= BRIDGE_REQUEST_CHARS
    assert isinstance(message.id, str)
    assert message.id.startswith("compaction-bridge-")


class Compacted(NamedTuple):
    """A compaction's output split into its four parts."""

    lead: list[BaseMessage]
    summary: BaseMessage
    bridge: BaseMessage | None
    recent: list[BaseMessage]


def split_compacted(out: list[BaseMessage]) -> Compacted:
    """Split ``out`` into (leading systems, summary, bridge or None, recent), checking the layout.

    Exactly one summary, preceded only by system messages; at most one bridge,
    right after the summary, and well formed.
    """
    positions = [i for i, m in enumerate(out) if is_summary_message(m)]
    assert len(positions) == 1, f"expected one summary, found {len(positions)} at {positions}"
    (index,) = positions
    assert all(isinstance(m, SystemMessage) for m in out[:index])
    bridges = [i for i, m in enumerate(out) if is_bridge_message(m)]
    assert bridges in ([], [index + 1]), f"a bridge may only follow the summary, found at {bridges}"
    bridge = out[index + 1] if bridges else None
    if bridge is not None:
        assert_bridge(bridge)
    rest = index + 1 + (bridge is not None)
    return Compacted(list(out[:index]), out[index], bridge, list(out[rest:]))


def bridge_required(recent: list[BaseMessage], ensure_user_turn: bool = True) -> bool:
    """Whether the new rule puts a bridge before ``recent``."""
    return ensure_user_turn and bool(recent) and not is_user_turn(recent[0])


def assert_compacted(
    out: list[BaseMessage],
    messages: list[BaseMessage],
    cut: int,
    *,
    ensure_user_turn: bool = True,
    same_objects: bool = True,
) -> Compacted:
    """``out == kept + [summary] + ([bridge] if required) + messages[cut:]``.

    ``kept`` is the leading system messages of ``messages`` that are not
    summaries. With ``same_objects`` every message but the summary and the
    bridge must be the caller's own object; otherwise (a store round trip)
    equal to it. Lists with a provider-side compaction block (whose fenced-off
    messages come before ``messages[cut:]``) are not modelled here.
    """
    parts = split_compacted(out)
    lead_end = 0
    while lead_end < len(messages) and isinstance(messages[lead_end], SystemMessage):
        lead_end += 1
    kept = [m for m in messages[:lead_end] if not is_summary_message(m)]
    recent = list(messages[cut:])
    assert len(parts.lead) == len(kept)
    assert len(parts.recent) == len(recent)
    for got, want in zip([*parts.lead, *parts.recent], [*kept, *recent], strict=True):
        if same_objects:
            assert got is want
        else:
            assert got == want
    required = bridge_required(recent, ensure_user_turn)
    assert (parts.bridge is not None) == required, (
        f"bridge {'missing' if required else 'unexpected'}: recent starts with {type(recent[0]).__name__}"
        if recent
        else "bridge before an empty recent part"
    )
    return parts


def tool_pairs_of(messages: list[BaseMessage] | tuple[BaseMessage, ...]) -> list[tuple[int, int]]:
    """Pair each tool result with the nearest earlier AIMessage that made its call.

    Written independently of the library, so tests check the library's cut and
    output against this reading of the conversation.
    """
    from langchain_core.messages import AIMessage, ToolMessage

    pairs = []
    for j, message in enumerate(messages):
        if isinstance(message, ToolMessage):
            for i in range(j - 1, -1, -1):
                candidate = messages[i]
                if isinstance(candidate, AIMessage) and any(
                    c["id"] == message.tool_call_id for c in candidate.tool_calls
                ):
                    pairs.append((i, j))
                    break
    return pairs


def leading_systems(messages: list[BaseMessage] | tuple[BaseMessage, ...]) -> int:
    """How many messages at the start are system messages."""
    count = 0
    while count < len(messages) and isinstance(messages[count], SystemMessage):
        count += 1
    return count


def as_state(update: list) -> list[BaseMessage]:
    """A message update as the ``add_messages`` reducer reads it: dicts (what a compaction wrote) as messages.

    The caller's objects stay the same objects, so identity checks still hold.
    """
    from langchain_core.messages import convert_to_messages

    return [convert_to_messages([m])[0] if isinstance(m, dict) else m for m in update]


def compaction_graph(node: object, agent: object = None, **compile_kwargs: object) -> Any:
    """A real graph: START -> the compaction node -> (the agent node) -> END, compiled with ``compile_kwargs``."""
    from langgraph.graph import END, START, StateGraph

    from langchain_compaction.graph import CompactionState

    builder = StateGraph(CompactionState)
    builder.add_node("compact", node)  # type: ignore[call-overload]
    builder.add_edge(START, "compact")
    last = "compact"
    if agent is not None:
        builder.add_node("agent", agent)  # type: ignore[call-overload]
        builder.add_edge("compact", "agent")
        last = "agent"
    builder.add_edge(last, END)
    return builder.compile(**compile_kwargs)  # type: ignore[arg-type]


# --- a request as ChatAnthropic would send it ------------------------------------------


@functools.cache
def anthropic_model() -> Any:
    """A ChatAnthropic that is never called: its payload builder checks what a request holds."""
    from langchain_anthropic import ChatAnthropic

    return ChatAnthropic(model="claude-sonnet-4-5", api_key="x")  # type: ignore[call-arg,arg-type]


def assert_valid_anthropic_request(
    messages: Sequence[BaseMessage],
    system_prompt: str | None = None,
    *,
    ends_with_user: bool = False,
    thinking: bool | None = None,
) -> None:
    """ChatAnthropic builds the payload without a warning, and tool uses and results pair up.

    At most one summary; the conversation starts with the user's turn; each tool
    result answers a tool use of the assistant's turn right before it, and each
    tool use is answered in the turn after it (a state may end on a tool call).
    With ``system_prompt``, the list starts with that system message and the
    payload's system text starts with it. With ``ends_with_user``, the list is a
    request as sent: it must end on the user's side (no prefill). With
    ``thinking`` (extended thinking on; ``None``: on when a thinking block is
    anywhere in the request), a tool loop in progress opens with its thinking block.
    """
    messages = list(messages)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        payload = anthropic_model()._get_request_payload(messages)
    if system_prompt is not None:
        assert isinstance(messages[0], SystemMessage)
        assert messages[0].content == system_prompt
        system = payload["system"]
        text = system if isinstance(system, str) else "".join(b["text"] for b in system)
        assert text.startswith(system_prompt)
    assert sum(1 for m in messages if is_summary_message(m)) <= 1
    turns = payload["messages"]
    assert turns, "the request holds no conversation turns"
    assert turns[0]["role"] == "user", "the Messages API wants the user's turn first"
    if ends_with_user:
        assert turns[-1]["role"] == "user", "the request must end on the user's side (no prefill)"
    for index, turn in enumerate(turns):
        blocks = turn["content"] if isinstance(turn["content"], list) else []
        results = {b["tool_use_id"] for b in blocks if b.get("type") == "tool_result"}
        uses = {b["id"] for b in blocks if b.get("type") == "tool_use"}
        if results:
            previous = turns[index - 1] if index else {"role": "", "content": []}
            prev_blocks = previous["content"] if isinstance(previous["content"], list) else []
            called = {b["id"] for b in prev_blocks if isinstance(b, dict) and b.get("type") == "tool_use"}
            assert previous["role"] == "assistant"
            assert results <= called, f"tool_result without its tool_use at turn {index}"
        if uses and index + 1 < len(turns):
            following = turns[index + 1]["content"]
            answered = {b["tool_use_id"] for b in following if isinstance(b, dict) and b.get("type") == "tool_result"}
            assert uses <= answered, f"tool_use without its tool_result at turn {index}"
    _assert_server_results_follow_their_uses(turns)
    _assert_thinking_opens_the_last_turn(turns, thinking)


def _assert_server_results_follow_their_uses(turns: list[dict[str, Any]]) -> None:
    """Each server tool's result follows its ``server_tool_use`` (``mcp_tool_use``) in the assistant's turn, and
    each such use has its result before the user's next turn.

    The API joins consecutive assistant turns (a paused turn and its
    continuation) into one: the use may be in an earlier one of them. A
    request may end on a paused turn (its use not answered yet).
    """
    pending: set[str] = set()
    for index, turn in enumerate(turns):
        if turn["role"] != "assistant":
            assert not pending, f"server tool uses {sorted(pending)} without their results before turn {index}"
            continue
        for block in turn["content"] if isinstance(turn["content"], list) else []:
            kind = block.get("type", "") if isinstance(block, dict) else ""
            if kind in ("server_tool_use", "mcp_tool_use"):
                pending.add(block["id"])
            elif kind.endswith("_tool_result") and kind != "tool_result":
                assert block["tool_use_id"] in pending, f"{kind} without its server_tool_use at turn {index}"
                pending.discard(block["tool_use_id"])


_THINKING = ("thinking", "redacted_thinking")


def _assert_thinking_opens_the_last_turn(turns: list[dict[str, Any]], thinking: bool | None) -> None:
    """With extended thinking, the tool loop in progress starts with a thinking block.

    The API's rule: the assistant turn after the last user message that is not
    only tool results (a tool loop) must open with its thinking block.
    """

    def blocks(turn: dict[str, Any]) -> list[Any]:
        return turn["content"] if isinstance(turn["content"], list) else []

    if thinking is None:
        thinking = any(isinstance(b, dict) and b.get("type") in _THINKING for t in turns for b in blocks(t))
    if not thinking:
        return
    opened = max(
        (
            i
            for i, t in enumerate(turns)
            if t["role"] == "user"
            and any(not (isinstance(b, dict) and b.get("type") == "tool_result") for b in (blocks(t) or [t["content"]]))
        ),
        default=-1,
    )
    final = next((t for t in turns[opened + 1 :] if t["role"] == "assistant"), None)
    if final is not None and any(t["role"] == "user" for t in turns[opened + 1 :]):  # a tool loop in progress
        first = next(iter(blocks(final)), None)
        message = "with thinking on, the tool loop in progress must open with its thinking block"
        assert isinstance(first, dict), message
        assert first.get("type") in _THINKING, message
