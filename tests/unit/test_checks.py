"""Checked summaries (budget, sections, one retry, then fallback) and reported usage."""

from __future__ import annotations

import re

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage

from langchain_compaction import CompactionOptions, ExtractiveSummarizer, acompact, compact
from langchain_compaction.core.prompts import CHECKPOINT_FORMAT
from langchain_compaction.errors import InvalidSummaryError, SummarizationError
from langchain_compaction.features import CheckedFacts, Pins, RequireSections

MESSAGES = [
    HumanMessage("fix src/a.py " * 40, id="h1"),
    AIMessage("done " * 80, id="a1"),
    HumanMessage("next", id="h2"),
]
GOOD = "## Goal\n- fix src/a.py"
# Every heading of the format, each with something under it (the bare template is no summary).
FULL = re.sub(r"\[[^\]]*\]", "noted", CHECKPOINT_FORMAT.split("Keep each section")[0])


class Script:
    """A plain-callable summarizer answering from a script, recording prompts."""

    def __init__(self, *answers: str) -> None:
        self.answers = list(answers)
        self.prompts: list[str] = []

    def __call__(self, prompt: str) -> str:
        self.prompts.append(prompt)
        return self.answers[min(len(self.prompts), len(self.answers)) - 1]


async def run(mode, model, options, **kw):
    if mode == "sync":
        return compact(model, MESSAGES, options, **kw)
    return await acompact(model, MESSAGES, options, **kw)


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_oversized_summary_is_asked_again_with_the_problem_stated(mode):
    script = Script("word " * 3000, GOOD)
    result, out = await run(mode, script, CompactionOptions(summary_max_tokens=500))
    assert result is not None
    assert result.summary == GOOD
    assert result.summarizer_calls == 2
    assert len(script.prompts) == 2
    assert "could not be used" in script.prompts[1]
    assert "more than the summary budget of 500" in script.prompts[1]
    assert script.prompts[1].startswith(script.prompts[0])


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_rejected_twice_falls_back(mode):
    script = Script("word " * 3000)
    result, out = await run(mode, script, CompactionOptions(summary_max_tokens=500), fallback=ExtractiveSummarizer())
    assert result is not None
    assert result.fallback_used
    assert result.summarizer == "extractive"
    assert len(script.prompts) == 2
    assert "src/a.py" in result.summary


@pytest.mark.parametrize("mode", ["sync", "async"])
async def test_rejected_twice_without_fallback_raises_and_changes_nothing(mode):
    before = [(m.id, m.content) for m in MESSAGES]
    with pytest.raises(InvalidSummaryError, match="rejected twice") as info:
        await run(mode, Script("word " * 3000), CompactionOptions(summary_max_tokens=500))
    assert isinstance(info.value, SummarizationError)
    assert [(m.id, m.content) for m in MESSAGES] == before


@pytest.mark.parametrize(
    ("answer", "advice"),
    [
        ("word " * 3000, "relax summary_max_tokens"),  # too long
        ("\n#", "stronger summarizer model"),  # nothing but a heading: an echo of the template
        ("## Goal\n- fix the parser", "fewer headings"),  # without the headings RequireSections asks for
    ],
)
def test_the_advice_of_a_summary_rejected_twice_fits_why(answer, advice):
    features = [CheckedFacts(), Pins(), RequireSections()]
    with pytest.raises(InvalidSummaryError, match="rejected twice") as info:
        compact(Script(answer), MESSAGES, CompactionOptions(summary_max_tokens=500), features=features)
    assert advice in str(info.value)
    assert all(
        other not in str(info.value) for other in ("relax summary", "stronger", "fewer headings") if other not in advice
    )


def test_sections_are_checked_only_when_asked():
    result, _ = compact(Script(GOOD), MESSAGES, CompactionOptions())
    assert result is not None
    assert result.summarizer_calls == 1
    script = Script(GOOD, FULL)
    result, _ = compact(script, MESSAGES, CompactionOptions(), features=[CheckedFacts(), Pins(), RequireSections()])
    assert result is not None
    assert result.summarizer_calls == 2
    assert "lacks these headings: ## Constraints & Preferences" in script.prompts[1]
    assert "## Goal" not in script.prompts[1].split("lacks these headings:")[1].split(".")[0]


def test_default_budget_follows_the_window():
    assert CompactionOptions().budget.summary_max == 8192
    # Two thirds of what half the threshold leaves after the keep budget, 256 to 8,192.
    budget = CompactionOptions(context_window=24_000, reserve_tokens=4_000, keep_recent_tokens=6_000).budget
    assert (budget.landing, budget.summary_max) == (10_000, 2_666)
    budget = CompactionOptions(context_window=8_000, reserve_tokens=2_000, keep_recent_tokens=5_000).budget
    assert budget.summary_max == 256  # the keep budget is over the landing: the floor
    assert CompactionOptions(summary_max_tokens=300).budget.summary_max == 300


def test_provider_usage_is_reported():
    reply = AIMessage(
        GOOD,
        usage_metadata={
            "input_tokens": 1200,
            "output_tokens": 80,
            "total_tokens": 1280,
            "input_token_details": {"cache_read": 900, "cache_creation": 100},
        },
    )
    model = GenericFakeChatModel(messages=iter([reply]))
    result, _ = compact(model, MESSAGES)
    assert result is not None
    record = result.to_dict()
    assert record["summarizer_billed_input_tokens"] == 200
    assert record["summarizer_cache_read_tokens"] == 900
    assert record["summarizer_cache_write_tokens"] == 100
    assert record["summarizer_output_tokens"] == 80


def test_no_usage_reported_is_zero_not_a_guess():
    result, _ = compact(Script(GOOD), MESSAGES)
    assert result is not None
    assert result.summarizer_billed_input_tokens == result.summarizer_cache_read_tokens == 0


@pytest.mark.parametrize("which", ["SYSTEM_PROMPT", "CHECKPOINT_PROMPT", "UPDATE_PROMPT", "CACHE_ALIGNED_PROMPT"])
def test_an_answer_that_only_echoes_the_instructions_is_no_summary(which: str) -> None:
    """A model that repeats a prompt back: rejected (asked again, then the fallback), never an empty summary."""
    from langchain_compaction.core import prompts

    messages = [HumanMessage("Fix src/app.py. Booking JG7FMM.", id="h")]
    for i in range(30):
        messages += [
            AIMessage(f"step {i} edited module_{i}.py " * 10, id=f"a{i}"),
            HumanMessage(f"go on {i} " * 10, id=f"h{i}"),
        ]
    echoes: list[str] = []

    def echo(prompt: str) -> str:
        echoes.append(prompt)
        return str(getattr(prompts, which))

    options = CompactionOptions(context_window=4_000)
    with pytest.raises(InvalidSummaryError, match="only repeats the instructions"):
        compact(echo, messages, options)
    assert len(echoes) == 2  # asked once more, with the problem stated
    result, out = compact(echo, messages, options, fallback=ExtractiveSummarizer())
    assert result is not None
    assert result.fallback_used
    assert "JG7FMM" in result.summary


@pytest.mark.parametrize("words", [30, 600])
def test_reasoning_written_inline_before_the_answer_is_left_out(words: int) -> None:
    """An open reasoning model without a reasoning parser writes <think>...</think> first: only the answer counts."""
    from langchain_core.language_models.fake_chat_models import FakeListChatModel

    messages = []
    for i in range(30):
        messages += [HumanMessage(f"step {i}: edit src/mod{i}.py " * 15), AIMessage(f"done {i} " * 40)]
    reasoning = "Okay, the user wants a summary. Let me go through the steps. " * words
    answer = "## Goal\n- edit the modules\n\n## Next Steps\n1. continue with src/mod29.py"
    # As a template that opens the tag in the prompt leaves it too: the reasoning, a closing tag, the answer.
    for reply in (f"<think>\n{reasoning}\n</think>\n\n{answer}", f"{reasoning}\n</think>\n\n{answer}"):
        model = FakeListChatModel(responses=[reply] * 3)
        result, out = compact(model, messages, CompactionOptions(context_window=24_000))
        assert result is not None
        assert "## Goal\n- edit the modules" in result.summary
        assert "think>" not in str(out[0].content)
        assert "Let me go through" not in str(out[0].content)
    # A tag met later, in the answer's own text, is the answer's: mentioned in a line, or after its first heading.
    for text in (
        f"{answer}\n- the parser reads <think>...</think> blocks",
        f"{answer}\n- Qwen3 replies end their reasoning with </think> and no opener",
        f"{answer}\n\n## Critical Context\n```\n</think>\n```",
    ):
        model = FakeListChatModel(responses=[text] * 3)
        result, _ = compact(model, messages, CompactionOptions(context_window=24_000))
        assert result is not None
        assert result.summary.startswith("## Goal\n- edit the modules")
        assert "think>" in result.summary
