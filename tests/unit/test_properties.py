"""Property-based tests: generated conversations with parallel tool calls, many budgets.

The number of examples scales with ``HYPOTHESIS_EXAMPLES`` (default 300), e.g.
``HYPOTHESIS_EXAMPLES=3000 python -m pytest tests/unit/test_properties.py``.
"""

from __future__ import annotations

import asyncio
import os
import re
import warnings
from dataclasses import replace
from typing import Any

from conftest import assert_compacted, is_user_turn, leading_systems, split_compacted, tool_pairs_of
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st
from langchain_anthropic import ChatAnthropic
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage

from langchain_compaction import CompactionOptions, CompactionResult, acompact, compact
from langchain_compaction._lc.convert import BRIDGE_TEXT, is_bridge_message, is_compaction_message, is_summary_message
from langchain_compaction.core import prompts
from langchain_compaction.core.lines import _CONTROL as CONTROL_CHARACTERS
from langchain_compaction.core.lines import _INVISIBLE as INVISIBLE_CHARACTERS
from langchain_compaction.core.lines import clip, one_line
from langchain_compaction.core.tokens import estimate_tokens
from langchain_compaction.functional import find_cut_point
from langchain_compaction.tokens import estimate_message_tokens

EXAMPLES = int(os.environ.get("HYPOTHESIS_EXAMPLES", "300"))

settings.register_profile(
    "langchain_compaction",
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
PROFILE = settings.get_profile("langchain_compaction")

# One instance for every example: building ChatAnthropic is the slow part.
ANTHROPIC = ChatAnthropic(model="claude-sonnet-4-5", api_key="x")  # type: ignore[call-arg]

WORDS = ("alpha", "beta", "gamma", "delta", "parse()", "src/app.py", "{'k': 1}", "42", "naïve", "数据")


def _text(draw: st.DrawFn, label: str) -> str:
    size = draw(st.sampled_from([0, 1, 5, 20, 80, 300, 1200]))
    seed = draw(st.integers(0, len(WORDS) - 1))
    body = " ".join(WORDS[(seed + k) % len(WORDS)] for k in range(size))
    return f"{label} {body}".strip()


@st.composite
def conversations(draw: st.DrawFn) -> list[BaseMessage]:
    """A conversation with the shapes real agents produce.

    Optional leading system messages, user/assistant turns, assistant turns
    with one to three parallel tool calls whose results arrive in random order
    (sometimes with a user message in between), tool-call ids that repeat,
    orphan results and calls never answered.
    """
    messages: list[BaseMessage] = []
    for k in range(draw(st.sampled_from([0, 0, 1, 2]))):
        messages.append(SystemMessage(_text(draw, f"SYS{k}"), id=f"sys{k}"))
    turns = draw(st.integers(1, 10))
    serial = 0
    for turn in range(turns):
        messages.append(HumanMessage(_text(draw, f"U{turn}"), id=f"u{turn}"))
        for step in range(draw(st.integers(0, 3))):
            kind = draw(st.sampled_from(["text", "tools", "tools", "orphan"]))
            if kind == "text":
                messages.append(AIMessage(_text(draw, f"A{turn}.{step}"), id=f"a{turn}.{step}"))
                continue
            if kind == "orphan":
                messages.append(ToolMessage(_text(draw, "ORPHAN"), tool_call_id=f"ghost{serial}", id=f"o{serial}"))
                serial += 1
                continue
            ids: list[str] = []
            for _ in range(draw(st.integers(1, 3))):
                # Repeated ids come from a small shared pool, as SWE-agent's call_<step> do.
                if draw(st.integers(0, 3)) == 0:
                    candidate = f"dup{draw(st.integers(0, 2))}"
                else:
                    candidate = f"c{serial}"
                    serial += 1
                if candidate not in ids:
                    ids.append(candidate)
            messages.append(
                AIMessage(
                    _text(draw, f"CALL{turn}.{step}") if draw(st.booleans()) else "",
                    tool_calls=[{"name": f"tool_{i}", "args": {"q": _text(draw, "ARG")}, "id": i} for i in ids],
                    id=f"a{turn}.{step}",
                )
            )
            answered = [i for i in draw(st.permutations(ids)) if draw(st.integers(0, 9)) > 0]
            interject_at = draw(st.integers(-1, len(answered)))
            for position, call_id in enumerate(answered):
                if position == interject_at:
                    messages.append(HumanMessage(_text(draw, "INTERJECT"), id=f"i{turn}.{step}"))
                messages.append(ToolMessage(_text(draw, f"R{call_id}"), tool_call_id=call_id, id=f"r{serial}"))
                serial += 1
        if draw(st.booleans()):
            messages.append(AIMessage(_text(draw, f"FINAL{turn}"), id=f"f{turn}"))
    return messages


budgets = st.one_of(st.integers(1, 60), st.integers(60, 3000), st.integers(3000, 30_000))
input_budgets = st.one_of(st.none(), st.integers(1000, 3000), st.integers(3000, 40_000))


def _summarizer(tag: str, log: list[str]) -> Any:
    def summarize(prompt: str) -> str:
        log.append(prompt)
        return f"## Goal\n- {tag} {len(log)}"

    return summarize


def _first_turn_is_the_users(out: list[BaseMessage]) -> None:
    """The first non-system message is a user turn (a bridge counts as one)."""
    first = next((m for m in out if not isinstance(m, SystemMessage)), None)
    assert first is None or is_user_turn(first), f"the first turn is a {type(first).__name__}"


def _check(
    messages: list[BaseMessage], result: CompactionResult | None, out: list[BaseMessage], ensure_user_turn: bool
) -> None:
    """The invariants of one compaction of a list with no earlier summary."""
    if ensure_user_turn:
        _first_turn_is_the_users(out)
    if result is None:
        assert out == messages
        assert all(a is b for a, b in zip(out, messages))
        return
    lead = leading_systems(messages)
    cut = result.cut_index
    # Leading system messages: unchanged, first, the summary right after them,
    # then the bridge when the kept part does not start with a user turn.
    assert all(out[k] is messages[k] for k in range(lead))
    assert is_summary_message(out[lead])
    assert sum(1 for m in out if is_summary_message(m)) == 1
    # The rest is the caller's objects, in order.
    assert lead < cut < len(messages) + 1
    parts = assert_compacted(out, messages, cut, ensure_user_turn=ensure_user_turn)
    bridged = parts.bridge is not None
    assert bridged is (ensure_user_turn and not isinstance(messages[cut], HumanMessage))
    assert len(out) == lead + 1 + bridged + len(messages) - cut
    assert all(out[lead + 1 + bridged + k] is messages[cut + k] for k in range(len(messages) - cut))
    assert cut - lead >= 2
    assert result.messages_kept == lead + len(messages) - cut
    assert result.messages_removed == cut - lead
    # Never lands on a tool result, never splits a pair.
    assert cut == len(messages) or not isinstance(messages[cut], ToolMessage)
    for call, answer in tool_pairs_of(messages):
        assert not (call < cut <= answer), f"pair ({call}, {answer}) split by cut {cut}"
    assert result.compacted_tokens == estimate_message_tokens(out)
    assert result.original_tokens == estimate_message_tokens(messages)


def _anthropic_valid(out: list[BaseMessage]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ANTHROPIC._get_request_payload(out)


@PROFILE
@given(conversations(), budgets, input_budgets, st.booleans())
def test_compaction_invariants(
    messages: list[BaseMessage], keep: int, summary_input: int | None, ensure_user_turn: bool
) -> None:
    before = [m.model_copy(deep=True) for m in messages]
    options = CompactionOptions(
        keep_recent_tokens=keep, summary_input_tokens=summary_input, ensure_user_turn=ensure_user_turn
    )
    log: list[str] = []
    result, out = compact(_summarizer("first", log), messages, options)
    assert messages == before  # the caller's list is never changed
    _check(messages, result, out, ensure_user_turn)
    event("compacted" if result is not None else "nothing to compact")
    if result is None:
        return
    event("chunked" if result.chunks > 1 else "one chunk")
    event("forced" if result.forced else "budget cut")
    event("shortened a message" if result.shortened_messages else "nothing shortened")
    event("bridged" if any(is_bridge_message(m) for m in out) else "no bridge")
    assert result.summarizer_calls == len(log) == result.chunks
    _anthropic_valid(out)

    # Compacting the output again keeps exactly one summary (and at most one
    # bridge) and updates it; the bridge never reaches the summarizer.
    second_log: list[str] = []
    follow_up = [*out, HumanMessage("one more thing", id="more")]
    again, twice = compact(_summarizer("second", second_log), follow_up, options)
    assert sum(1 for m in twice if is_summary_message(m)) == 1
    assert sum(1 for m in twice if is_bridge_message(m)) <= 1
    if ensure_user_turn:
        _first_turn_is_the_users(twice)
    event("second compaction ran" if again is not None else "second compaction had nothing to do")
    if again is None:
        assert twice == follow_up
        return
    assert again.updated_previous_summary is True
    assert f"previous-summary>>\n## Goal\n- first {len(log)}\n" in second_log[0]
    assert all(prompts.SUMMARY_HEADER not in prompt for prompt in second_log)
    assert all(BRIDGE_TEXT not in prompt for prompt in second_log)
    (summary,) = [m for m in twice if is_summary_message(m)]
    assert str(summary.content).count(prompts.SUMMARY_HEADER) == 1
    assert f"second {len(second_log)}" in str(summary.content)
    lead = leading_systems(messages)
    assert all(twice[k] is messages[k] for k in range(lead))
    assert twice[lead] is summary
    parts = assert_compacted(twice, follow_up, again.cut_index, ensure_user_turn=ensure_user_turn)
    old_bridge = split_compacted(out).bridge
    assert old_bridge is None or all(m is not old_bridge for m in twice)  # replaced, never kept
    assert parts.recent[-1] is follow_up[-1]
    _anthropic_valid(twice)


@PROFILE
@given(conversations(), budgets)
def test_find_cut_point_invariants(messages: list[BaseMessage], keep: int) -> None:
    cut = find_cut_point(messages, keep)
    if cut == 0:
        return
    lead = leading_systems(messages)
    assert lead + 2 <= cut < len(messages)
    assert not isinstance(messages[cut], ToolMessage)
    for call, answer in tool_pairs_of(messages):
        assert not (call < cut <= answer)
    # The kept tail is over the budget only when the walk had to keep the last
    # message or a whole tool exchange at the end: no later boundary was valid.
    if estimate_message_tokens(messages[cut:]) > keep:
        pairs = tool_pairs_of(messages)
        for boundary in range(cut + 1, len(messages)):
            on_result = isinstance(messages[boundary], ToolMessage)
            assert on_result or any(call < boundary <= answer for call, answer in pairs), boundary


@PROFILE
@given(conversations(), budgets)
def test_a_fitting_conversation_is_never_cut(messages: list[BaseMessage], keep: int) -> None:
    lead = leading_systems(messages)
    if estimate_message_tokens(messages[lead:]) <= keep:
        assert find_cut_point(messages, keep) == 0


@settings(PROFILE, max_examples=max(EXAMPLES // 3, 10))
@given(conversations(), budgets, input_budgets)
def test_async_matches_sync(messages: list[BaseMessage], keep: int, summary_input: int | None) -> None:
    options = CompactionOptions(keep_recent_tokens=keep, summary_input_tokens=summary_input)
    sync_log: list[str] = []
    async_log: list[str] = []
    sync_result, sync_out = compact(_summarizer("s", sync_log), messages, options)
    async_result, async_out = asyncio.run(acompact(_summarizer("s", async_log), messages, options))
    # The same layout, and the same caller's objects wherever nothing was written.
    assert [(is_summary_message(m), is_bridge_message(m)) for m in sync_out] == [
        (is_summary_message(m), is_bridge_message(m)) for m in async_out
    ]
    assert [id(m) for m in sync_out if not is_compaction_message(m)] == [
        id(m) for m in async_out if not is_compaction_message(m)
    ]
    assert sync_log == async_log  # the same prompts: one code path
    if sync_result is None:
        assert async_result is None
        return
    assert async_result is not None
    # Everything but how long each waited (a clock reading) is the same.
    assert replace(sync_result, wait_seconds=0.0) == replace(async_result, wait_seconds=0.0)


def _clip_slowly(text: str, limit: int) -> str:
    """``clip`` as it reads: whitespace folded, then cut at a word boundary (no shortcut)."""
    folded = " ".join(text.split())
    if len(folded) <= limit:
        return folded
    cut = folded.rfind(" ", 0, limit)
    return folded[: cut if cut > limit // 2 else limit]


@PROFILE
@given(st.text(alphabet=st.characters(exclude_categories=("Cs",))), st.integers(1, 40))
def test_a_clean_line_is_returned_as_is_and_every_other_folded(text: str, limit: int) -> None:
    # clip and one_line return a text that is already one clean line without copying it: the same as the full fold.
    assert clip(text, limit) == _clip_slowly(text, limit)
    # (Invisible format characters go; control characters and line separators part words.)
    assert one_line(text, limit) == _clip_slowly(_folded(text), limit)
    assert one_line(f"a{text}b", limit + 2) == _clip_slowly(_folded(f"a{text}b"), limit + 2)


def _folded(text: str) -> str:
    return CONTROL_CHARACTERS.sub(" ", INVISIBLE_CHARACTERS.sub("", text))


_PIECES = ("plain words", "数据 naïve", "x = f(1, 2)\n", "QUJD" * 20 + "9z", "", "  ", "tab\tand\nnewline")


@st.composite
def varied_content(draw: st.DrawFn) -> str | list[Any]:
    """Text with the classes the estimate prices apart, as a string or as blocks (thinking, images)."""
    text = "".join(draw(st.lists(st.sampled_from(_PIECES), max_size=40))) * draw(st.sampled_from([1, 1, 8, 40]))
    if draw(st.booleans()):
        return text
    blocks: list[Any] = [{"type": "text", "text": text}]
    if draw(st.booleans()):
        blocks.insert(0, {"type": "thinking", "thinking": draw(st.sampled_from(_PIECES)) * 3, "signature": "s"})
    if draw(st.booleans()):
        blocks.append({"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}})
    return blocks


@PROFILE
@given(st.lists(varied_content(), min_size=4, max_size=30), input_budgets, st.integers(20, 400))
def test_the_input_reported_is_the_estimate_of_what_was_sent(
    contents: list[str | list[Any]], summary_input: int | None, keep: int
) -> None:
    """``summarizer_input_tokens`` equals the estimate of each request's system prompt and prompt, exactly.

    The flow adds it up from the blocks' own estimates instead of reading the
    prompt again: chunked, shortened or after an earlier summary, the sum must
    be the same number.
    """
    messages: list[BaseMessage] = []
    for k, content in enumerate(contents):
        if k % 3 == 2:
            call = {"name": "run", "args": {"cmd": str(content)[:200]}, "id": f"c{k}"}
            messages.append(AIMessage("", tool_calls=[call], id=f"a{k}"))
            messages.append(ToolMessage(content, tool_call_id=f"c{k}", id=f"t{k}"))  # type: ignore[arg-type]
        else:
            messages.append(HumanMessage(content, id=f"m{k}") if k % 2 else AIMessage(content, id=f"m{k}"))
    options = CompactionOptions(keep_recent_tokens=keep, summary_input_tokens=summary_input)
    # A plain function is sent the system prompt and the prompt as one text.
    head = prompts.SYSTEM_PROMPT + "\n\n"
    output = messages
    for round_ in range(2):  # the second request carries the first summary
        log: list[str] = []
        result, output = compact(
            _summarizer(f"r{round_}", log), [*output, HumanMessage("next", id=f"n{round_}")], options
        )
        assume(result is not None)
        assert result is not None
        assert all(p.startswith(head) for p in log)
        sent = sum(estimate_tokens(prompts.SYSTEM_PROMPT) + estimate_tokens(p[len(head) :]) for p in log)
        assert result.summarizer_input_tokens == sent
        event(
            f"round {round_}: {'chunked' if result.chunks > 1 else 'one chunk'}, {'shortened' if result.shortened_messages else 'whole'}"
        )


# Revocations of each kind, and words of theirs, in any case, spacing and punctuation:
# a text is scanned only with the alternatives whose words it holds, and finds the same.
_REVOCATIONS = (
    "forget what I said about tabs",
    "ignore my earlier rule on naming",
    "scratch the voucher rule",
    "the tabs rule no longer applies",
    "it's ok to use tabs",
    "it is fine to push",
    "feel free to merge",
    "you're allowed to deploy",
    "you no longer need to sign",
    "you don't have to test it anymore",
    "never mind the tabs rule",
    "nevermind about the naming thing",
    "tabs are fine now",
    "so, layovers are OK",
    "spaces are acceptable in Makefiles",
    "don't worry about pandas",
    "you may use tabs",
    "you can go ahead and push",
    # (Letters IGNORECASE takes for i and s: a case-blind scan must not turn these away.)
    "DİSREGARD what I said about tabs",
    "the push rule no longer applıes",
    "ſcratch the voucher rule",
)
_REVOCATION_WORDS = (
    "forget",
    "drop",
    "the",
    "rule",
    "no longer",
    "ok",
    "fine",
    "allowed",
    "to",
    "you",
    "are",
    "is",
    "may",
    "can",
    "need",
    "have",
    "never",
    "mind",
    "don't",
    "worry",
    "now",
    "in",
    "tabs",
    "book",
    "look",
    "stop",
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(_REVOCATIONS + _REVOCATION_WORDS),
            st.sampled_from([str, str.upper, str.title]),
            st.sampled_from([" ", "  ", "\n", ", ", ". ", ": "]),
        ),
        max_size=12,
    )
)
def test_a_text_is_scanned_for_revocations_with_the_alternatives_it_may_match_and_finds_the_same(
    pieces: list[tuple[str, Any, str]],
) -> None:
    from langchain_compaction.core.extract import _REVOKE, _revocations

    def matched(pattern: re.Pattern[str] | None) -> list[tuple[tuple[int, int], dict[str, str]]]:
        # (Each match and the groups it took: a group of a left-out alternative matches nothing either way.)
        found = pattern.finditer(text) if pattern is not None else ()
        return [(m.span(), {k: v for k, v in m.groupdict().items() if v is not None}) for m in found]

    text = "".join(case(words) + gap for words, case, gap in pieces)
    assert matched(_revocations(text)) == matched(_REVOKE)
