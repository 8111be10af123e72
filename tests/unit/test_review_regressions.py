"""Regressions for defects found in review: each failed before its fix."""

from __future__ import annotations

import asyncio

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

from langchain_compaction import CompactionOptions, acompact, compact
from langchain_compaction.cli import main
from langchain_compaction.errors import InvalidMessagesError, SummarizationError, SummaryTimeoutError
from langchain_compaction.features import CacheAligned, default_features
from langchain_compaction.formats import ConversationFileError, parse_conversation


def test_a_tool_call_made_with_a_compaction_block_keeps_its_result():
    messages = [
        SystemMessage("sys"),
        HumanMessage("start " * 50),
        AIMessage(
            content=[
                {"type": "compaction", "content": "server summary"},
                {"type": "tool_use", "id": "t1", "name": "read", "input": {}},
            ],
            tool_calls=[{"id": "t1", "name": "read", "args": {}}],
        ),
        ToolMessage("file " * 300, tool_call_id="t1"),
        AIMessage("done " * 300),
        HumanMessage("more " * 300),
        AIMessage("ok " * 300),
        HumanMessage("last"),
    ]
    result, out = compact(lambda p: "## Goal\n- x", messages, CompactionOptions(keep_recent_tokens=200))
    assert result is not None
    position = next(i for i, m in enumerate(out) if m is messages[2])
    assert out[position + 1] is messages[3]  # the result follows its call


def test_cache_aligned_retry_still_covers_every_chunk():
    messages = [SystemMessage("sys")]
    for i in range(12):
        messages += [HumanMessage(f"FACT{i} " + "words " * 40), AIMessage("ok " * 40)]
    messages.append(HumanMessage("last"))
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel

    seen: list[str] = []

    class Recording(GenericFakeChatModel):
        def _generate(self, msgs, stop=None, run_manager=None, **kw):
            seen.append("\n".join(str(m.content) for m in msgs))
            return super()._generate(msgs, stop=stop, run_manager=run_manager, **kw)

    # The first answer (written from the whole prefix) is too long; the retry
    # and everything after are fine.
    fake = Recording(messages=iter([AIMessage("long " * 400)] + [AIMessage("## Goal\n- short")] * 20))
    options = CompactionOptions(summary_input_tokens=1000, summary_max_tokens=64, keep_recent_tokens=10)
    result, _ = compact(fake, messages, options, features=[*default_features(), CacheAligned()])
    assert result is not None
    accepted = "\n".join(seen[1:])  # everything after the rejected first answer
    assert all(f"FACT{i} " in accepted for i in range(12))
    assert result.chunks > 1


def test_deeply_nested_json_is_one_clean_error(tmp_path, capsys):
    with pytest.raises(ConversationFileError, match="nested too deeply"):
        parse_conversation("[" * 100_000)
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000)
    assert main(["inspect", str(path)]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_a_model_raising_timeout_error_is_a_failure_not_our_deadline():
    def flaky(prompt: str) -> str:
        raise TimeoutError("the model service is down")

    messages = [HumanMessage("a " * 300), AIMessage("b " * 300), HumanMessage("c")]
    with pytest.raises(SummarizationError) as sync_error:
        compact(flaky, messages, CompactionOptions(timeout=30))
    with pytest.raises(SummarizationError) as async_error:
        asyncio.run(acompact(flaky, messages, CompactionOptions(timeout=30)))
    for info in (sync_error, async_error):
        assert not isinstance(info.value, SummaryTimeoutError)
        assert "the model service is down" in str(info.value)


def test_a_non_list_is_an_invalid_messages_error():
    for bad in (None, 5, "hello"):
        with pytest.raises(InvalidMessagesError):
            compact(lambda p: "x", bad)  # type: ignore[arg-type]
