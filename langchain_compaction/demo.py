"""The offline demo: a long real session, compacted whenever it outgrows the window.

It replays the six real agent transcripts that sit beside the project
(``../shared/data/transcripts``, or ``$LANGCHAIN_COMPACTION_TRANSCRIPTS``) as
one session behind a system prompt. Before each assistant turn, as an agent
would before calling its model, it checks ``should_compact`` and compacts with
the offline ``ExtractiveSummarizer``. When the transcripts are not there, it
replays a generated coding session instead.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage, messages_from_dict

from langchain_compaction.core.options import CompactionOptions
from langchain_compaction.core.result import CompactionResult
from langchain_compaction.functional import compact, should_compact
from langchain_compaction.summarizers.extractive import ExtractiveSummarizer
from langchain_compaction.tokens import estimate_message_tokens

SYSTEM_PROMPT = "You are a careful software agent. Use the tools; report what you changed."


def find_transcripts() -> Path | None:
    """The shared transcripts folder, if it can be found."""
    env = os.environ.get("LANGCHAIN_COMPACTION_TRANSCRIPTS")
    candidates = [Path(env)] if env else []
    here = Path(__file__).resolve().parent.parent
    candidates += [Path.cwd().parent / "shared/data/transcripts", here.parent / "shared/data/transcripts"]
    return next((p for p in candidates if p.is_dir() and any(p.glob("*.json"))), None)


def _generated_session(turns: int = 120) -> Iterator[BaseMessage]:
    for turn in range(turns):
        path = f"src/module_{turn % 17}/handler_{turn}.py"
        yield HumanMessage(f"Turn {turn}: fix the failing test in {path}. Do not change the public API.")
        call = {"name": "bash", "args": {"command": f"pytest tests/test_handler_{turn}.py -x"}, "id": f"call_{turn}"}
        yield AIMessage(f"I'll run the tests for {path} first.", tool_calls=[call])
        failed = turn % 5 == 0
        output = f"FAILED tests/test_handler_{turn}.py::test_case - AssertionError: expected {turn}" if failed else ""
        yield ToolMessage(output + "\n" + "collected 12 items\n" * 40, tool_call_id=f"call_{turn}", name="bash")
        yield AIMessage(f"Patched {path}: handle_{turn}() now returns {turn * 3}. All 12 tests pass.")


def demo_session() -> tuple[list[BaseMessage], str]:
    """The session the demo replays, and where it came from."""
    folder = find_transcripts()
    if folder is None:
        return list(_generated_session()), "a generated 120-turn coding session (shared transcripts not found)"
    messages: list[BaseMessage] = []
    files = sorted(folder.glob("*.json"))
    for file in files:
        for message in messages_from_dict(json.loads(file.read_text(encoding="utf-8"))):
            # Each transcript's own system prompt would sit mid-session; the
            # demo's agent has one system prompt, at the top.
            if not isinstance(message, SystemMessage):
                messages.append(message)
    return messages, f"{len(files)} real agent transcripts from {folder}"


def run_demo(out: TextIO, *, window: int = 24_000, reserve: int = 4_000, keep: int = 6_000) -> int:
    """Replay the demo session, compacting when needed, and print what happened.

    Args:
        out: Where to print.
        window: The pretend model's context window.
        reserve: Tokens kept free for the reply.
        keep: Recent tokens kept verbatim.

    Returns:
        0 (the exit status).
    """
    session, origin = demo_session()
    options = CompactionOptions(context_window=window, reserve_tokens=reserve, keep_recent_tokens=keep)
    summarizer = ExtractiveSummarizer()
    print(f"replaying {len(session)} messages: {origin}", file=out)
    print(f"window {window:,} tokens, reserve {reserve:,}, keep {keep:,}; summarizer: offline extractive\n", file=out)
    header = (
        f"{'#':>3} {'at msg':>7} {'msgs before':>11} {'after':>6} {'tokens before':>13} {'after':>7} {'summary':>8}"
    )
    print(header, file=out)
    print("-" * len(header), file=out)
    state: list[BaseMessage] = [SystemMessage(SYSTEM_PROMPT)]
    results: list[CompactionResult] = []
    for position, message in enumerate(session, 1):
        if isinstance(message, AIMessage) and should_compact(state, options=options):
            before = len(state)
            result, state = compact(summarizer, state, options)
            if result is not None:
                results.append(result)
                summary_tokens = estimate_message_tokens([state[1]])
                print(
                    f"{len(results):>3} {position:>7} {before:>11} {len(state):>6} "
                    f"{result.original_tokens:>13,} {result.compacted_tokens:>7,} {summary_tokens:>8,}",
                    file=out,
                )
        state.append(message)
    total = estimate_message_tokens(state)
    print(f"\n{len(results)} compactions; final context: {len(state)} messages, ~{total:,} tokens", file=out)
    kinds = ", ".join(f"{sum(1 for m in state if m.type == t)} {t}" for t in ("system", "human", "ai", "tool"))
    print(f"final context holds: {kinds}", file=out)
    summaries = [m for m in state if isinstance(m, SystemMessage) and m is not state[0]]
    if summaries:
        lines = str(summaries[0].content).splitlines()
        print(f"\nthe summary message ({len(lines)} lines; first 30):", file=out)
        for line in lines[:30]:
            print(f"  {line[:150]}", file=out)
    return 0
