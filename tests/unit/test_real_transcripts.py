"""The six real agent transcripts (and all six in one list) through ``compact``."""

from __future__ import annotations

import re
import warnings
from collections import Counter

import pytest
from conftest import (
    TRANSCRIPT_NAMES,
    assert_compacted,
    leading_systems,
    load_transcript,
    requires_shared,
    split_compacted,
    tool_pairs_of,
)
from langchain_anthropic import ChatAnthropic
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage

from langchain_compaction import CompactionOptions, CompactionResult, acompact, compact
from langchain_compaction._lc.convert import BRIDGE_TEXT, is_summary_message
from langchain_compaction.tokens import estimate_message_tokens, estimate_tokens

KEEP_BUDGETS = [2000, 5000, 20000]
SUMMARY_INPUT_TOKENS = 6000  # small enough to force chunking on the big transcripts

ANTHROPIC = ChatAnthropic(model="claude-sonnet-4-5", api_key="x")  # type: ignore[call-arg]
_HEADER = re.compile(r"<<(msg-[0-9a-f]{8}) #(\d+) \[")


class Recorder:
    """A plain-callable summarizer that records each prompt."""

    def __init__(self) -> None:
        self.prompts: list[str] = []

    def __call__(self, prompt: str) -> str:
        self.prompts.append(prompt)
        return f"## Goal\n- continue the work (call {len(self.prompts)})"


def _anthropic_valid(messages: list[BaseMessage], *, compacted: bool = True) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        payload = ANTHROPIC._get_request_payload(messages)
    assert payload["messages"]
    if compacted:
        # The Messages API wants the user's turn first (a bridge when the kept part starts otherwise).
        assert payload["messages"][0]["role"] == "user"


def _check(
    messages: list[BaseMessage],
    result: CompactionResult,
    out: list[BaseMessage],
    prompts: list[str],
    budget: int = SUMMARY_INPUT_TOKENS,
) -> None:
    lead = leading_systems(messages)
    cut = result.cut_index
    # Shape: leading systems, one summary, a bridge when the kept part does not
    # start with a user turn, the caller's recent messages.
    assert all(out[k] is messages[k] for k in range(lead))
    assert is_summary_message(out[lead])
    assert sum(1 for m in out if is_summary_message(m)) == 1
    parts = assert_compacted(out, messages, cut)
    bridged = parts.bridge is not None
    assert bridged is not isinstance(messages[cut], HumanMessage)
    assert all(out[lead + 1 + bridged + k] is messages[cut + k] for k in range(len(messages) - cut))
    # No pair split.
    assert not isinstance(messages[cut], ToolMessage)
    for call, answer in tool_pairs_of(messages):
        assert not (call < cut <= answer), (call, answer, cut)
    # Coverage: every compacted message has its own block, in exactly one call,
    # and its opening text (always kept, even when shortened) is shown.
    shown = Counter(int(number) for text in prompts for _fence, number in _HEADER.findall(text))
    assert set(shown) == set(range(lead + 1, cut + 1))
    assert all(count == 1 for count in shown.values())
    everything = "\n".join(prompts)
    for index in range(lead, cut):
        message = messages[index]
        head = str(message.content).strip()[:60]
        if head:
            assert head in everything, (index, head)
        if isinstance(message, AIMessage):
            for call in message.tool_calls:
                assert call["name"] in everything
    assert result.summarizer_calls == result.chunks == len(prompts)
    # Every request fits the summarizer's budget (the system prompt included).
    for text in prompts:
        assert estimate_tokens(text) <= budget
    assert result.compacted_tokens == estimate_message_tokens(out)


@pytest.mark.parametrize("keep", KEEP_BUDGETS)
def test_each_transcript_compacts_validly(transcript: list[BaseMessage], keep: int) -> None:
    recorder = Recorder()
    options = CompactionOptions(keep_recent_tokens=keep, summary_input_tokens=SUMMARY_INPUT_TOKENS)
    result, out = compact(recorder, transcript, options)
    assert result is not None
    _check(transcript, result, out, recorder.prompts)
    _anthropic_valid(out)
    region = estimate_message_tokens(transcript[leading_systems(transcript) : result.cut_index])
    if region > 2 * SUMMARY_INPUT_TOKENS:
        assert result.chunks > 1
    if not result.forced:
        # The kept tail honours the budget unless one message alone is larger.
        tail = estimate_message_tokens(transcript[result.cut_index :])
        assert tail <= keep or result.cut_index == len(transcript) - 1 or isinstance(transcript[-1], ToolMessage)


@pytest.mark.parametrize("keep", KEEP_BUDGETS)
async def test_each_transcript_compacts_validly_async(transcript: list[BaseMessage], keep: int) -> None:
    recorder = Recorder()
    options = CompactionOptions(keep_recent_tokens=keep, summary_input_tokens=SUMMARY_INPUT_TOKENS)
    result, out = await acompact(recorder, transcript, options)
    assert result is not None
    _check(transcript, result, out, recorder.prompts)
    _anthropic_valid(out)


@requires_shared  # our own transcript is small: it compacts in one request
def test_big_transcripts_are_chunked() -> None:
    chunked = []
    for name in TRANSCRIPT_NAMES:
        messages = load_transcript(name)
        options = CompactionOptions(keep_recent_tokens=2000, summary_input_tokens=SUMMARY_INPUT_TOKENS)
        result, _ = compact(Recorder(), messages, options)
        assert result is not None
        if result.chunks > 1:
            chunked.append(name)
    # Five of the six are over 15,000 tokens; only the vue run is small.
    assert len(chunked) >= 4, chunked


def test_second_compaction_of_each_transcript(transcript: list[BaseMessage]) -> None:
    options = CompactionOptions(keep_recent_tokens=5000, summary_input_tokens=SUMMARY_INPUT_TOKENS)
    _, once = compact(Recorder(), transcript, options)
    follow_up = [*once, HumanMessage("Now summarize what you did and stop.")]
    recorder = Recorder()
    result, twice = compact(recorder, follow_up, options)
    assert result is not None
    assert result.updated_previous_summary is True
    assert sum(1 for m in twice if is_summary_message(m)) == 1
    assert "previous-summary>>" in recorder.prompts[0]
    assert all(BRIDGE_TEXT not in prompt for prompt in recorder.prompts)
    # The last message is the user's, and it is kept: no bridge this time.
    assert_compacted(twice, follow_up, result.cut_index)
    assert split_compacted(twice).bridge is None
    _anthropic_valid(twice)


def _all_six() -> list[BaseMessage]:
    messages: list[BaseMessage] = []
    for name in TRANSCRIPT_NAMES:
        messages += load_transcript(name)
    return messages


def _all_six_for_anthropic() -> list[BaseMessage]:
    """All six, with the later runs' system prompts as user turns (ChatAnthropic takes one system block)."""
    messages: list[BaseMessage] = []
    for name in TRANSCRIPT_NAMES:
        for message in load_transcript(name):
            if isinstance(message, SystemMessage) and messages:
                messages.append(HumanMessage(f"(system prompt of the next run) {message.content}"))
            else:
                messages.append(message)
    return messages


@requires_shared
def test_concatenation_repeats_tool_call_ids() -> None:
    ids = Counter(call["id"] for m in _all_six() if isinstance(m, AIMessage) for call in m.tool_calls)
    repeated = {i for i, n in ids.items() if n > 1}
    assert {"call_1", "call_2"} <= repeated  # aider's and SWE-agent's ids collide


@requires_shared
@pytest.mark.parametrize("keep", KEEP_BUDGETS)
def test_all_six_concatenated(keep: int) -> None:
    messages = _all_six()
    recorder = Recorder()
    options = CompactionOptions(keep_recent_tokens=keep, summary_input_tokens=SUMMARY_INPUT_TOKENS)
    result, out = compact(recorder, messages, options)
    assert result is not None
    _check(messages, result, out, recorder.prompts)
    assert result.chunks > 5
    # Later runs' system prompts sit mid-conversation: summarized as [System].
    later_systems = [i for i, m in enumerate(messages) if isinstance(m, SystemMessage) and i > 0]
    summarized = [i for i in later_systems if i < result.cut_index]
    assert summarized
    everything = "\n".join(recorder.prompts)
    for index in summarized:
        assert re.search(rf"<<msg-[0-9a-f]{{8}} #{index + 1} \[System\]>>", everything)


@requires_shared
@pytest.mark.parametrize("keep", KEEP_BUDGETS)
async def test_all_six_concatenated_is_a_valid_anthropic_request(keep: int) -> None:
    messages = _all_six_for_anthropic()
    _anthropic_valid(messages, compacted=False)
    recorder = Recorder()
    options = CompactionOptions(keep_recent_tokens=keep, summary_input_tokens=SUMMARY_INPUT_TOKENS)
    result, out = await acompact(recorder, messages, options)
    assert result is not None
    _check(messages, result, out, recorder.prompts)
    _anthropic_valid(out)


@requires_shared
def test_all_six_with_a_window() -> None:
    # A 60k window: the concatenation (~93k tokens) is over it. The summarizer
    # budget is derived from the window (window - reserve), every request fits
    # it, and the compacted list fits the window again.
    messages = _all_six_for_anthropic()
    options = CompactionOptions(context_window=60_000, reserve_tokens=8_000, keep_recent_tokens=20_000)
    assert estimate_message_tokens(messages) > options.context_window
    recorder = Recorder()
    result, out = compact(recorder, messages, options)
    assert result is not None
    assert result.over_budget is False
    assert estimate_message_tokens(out) <= options.context_window - options.reserve_tokens
    _check(messages, result, out, recorder.prompts, options.context_window - options.reserve_tokens)
    _anthropic_valid(out)
