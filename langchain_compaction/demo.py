"""The offline demo: one real agent session, compacted whenever it outgrows the window.

It replays a public OpenHands run (an agent fixing a compiler bug in the ponyc
repository, 101 messages; ``data/LICENSE-openhands.txt`` says where it comes
from and under which license) shipped inside the package, so it works after a
plain install. Before each assistant turn, as an agent would before calling its
model, it asks ``should_compact`` and compacts with the offline
``ExtractiveSummarizer``. What the library warns about on the way is printed
under the table as a note on the compaction it concerns, not amid the rows.
"""

from __future__ import annotations

import json
import logging
import textwrap
from importlib import resources
from typing import TextIO

from langchain_core.messages import AIMessage, BaseMessage, messages_from_dict

from langchain_compaction._lc.convert import is_summary_message
from langchain_compaction.core.options import CompactionOptions
from langchain_compaction.core.result import CompactionResult
from langchain_compaction.functional import compact, should_compact
from langchain_compaction.summarizers.extractive import ExtractiveSummarizer
from langchain_compaction.tokens import estimate_message_tokens

TRANSCRIPT = "openhands-ponyc-4588.json"
"""The shipped transcript (in ``langchain_compaction/data``)."""

_WIDTH = 100


def demo_session() -> list[BaseMessage]:
    """The session the demo replays: the shipped OpenHands run, system prompt first."""
    data = (resources.files("langchain_compaction") / "data" / TRANSCRIPT).read_text(encoding="utf-8")
    return messages_from_dict(json.loads(data))


def _row(number: int, position: int, sizes: tuple[int, int], result: CompactionResult, summary: int) -> str:
    before, after = sizes
    return (
        f"{number:>3} {position:>7} {before:>11} {after:>6} "
        f"{result.original_tokens:>13,} {result.compacted_tokens:>7,} {summary:>8,}"
    )


class _Notes(logging.Handler):
    """The library's warnings during the replay, each with the compaction it came with."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.number = 0
        self.notes: list[tuple[int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.notes.append((self.number, record.getMessage()))


def _replay(session: list[BaseMessage], options: CompactionOptions, out: TextIO) -> list[BaseMessage]:
    summarizer = ExtractiveSummarizer()
    state: list[BaseMessage] = []
    count = 0
    notes = _Notes()
    library = logging.getLogger("langchain_compaction")
    library.addHandler(notes)
    propagate, library.propagate = library.propagate, False
    try:
        for position, message in enumerate(session, 1):
            if isinstance(message, AIMessage) and should_compact(state, options=options):
                before = len(state)
                notes.number = count + 1
                result, state = compact(summarizer, state, options)
                if result is not None:
                    count += 1
                    summaries = [m for m in state if is_summary_message(m)]
                    summary = estimate_message_tokens(summaries)
                    print(_row(count, position, (before, len(state)), result, summary), file=out)
            state.append(message)
    finally:
        library.removeHandler(notes)
        library.propagate = propagate
    for number, note in notes.notes:
        wrapped = textwrap.wrap(f"note on compaction {number}: {note}", _WIDTH, subsequent_indent="    ")
        print("\n" + "\n".join(wrapped), file=out)
    print(f"\n{count} compactions", end="", file=out)
    return state


def _print_summary(state: list[BaseMessage], out: TextIO) -> None:
    summaries = [m for m in state if is_summary_message(m)]
    if not summaries:
        return
    lines = str(summaries[0].content).splitlines()
    print(f"\nthe summary message ({len(lines)} lines; the first 30, wrapped at {_WIDTH} characters):", file=out)
    for line in lines[:30]:
        # Wrapped at word boundaries, never cut mid-word.
        wrapped = textwrap.wrap(line, _WIDTH, subsequent_indent="    ", break_long_words=False) or [""]
        for piece in wrapped:
            print(f"  {piece}", file=out)
    if len(lines) > 30:
        print(f"  [... {len(lines) - 30} more lines]", file=out)


def run_demo(out: TextIO, *, window: int = 8_000, reserve: int | None = None, keep: int | None = None) -> int:
    """Replay the demo session, compacting when needed, and print what happened.

    Args:
        out: Where to print.
        window: The pretend model's context window.
        reserve: Tokens kept free for the reply (``None``: derived from the window).
        keep: Recent tokens kept verbatim (``None``: derived from the window).

    Returns:
        0 (the exit status).
    """
    session = demo_session()
    options = CompactionOptions(context_window=window, reserve_tokens=reserve, keep_recent_tokens=keep)
    budget = options.budget
    print(f"replaying {len(session)} messages of a real OpenHands run (fixing a ponyc compiler bug)", file=out)
    print(
        f"window {window:,} tokens: compact above {budget.threshold:,}, keep {budget.keep:,} recent tokens, "
        f"summarizer text up to {budget.summary_max:,} (the summary column adds the library's header and "
        f"checked facts); summarizer: offline extractive\n",
        file=out,
    )
    header = (
        f"{'#':>3} {'at msg':>7} {'msgs before':>11} {'after':>6} {'tokens before':>13} {'after':>7} {'summary':>8}"
    )
    print(header, file=out)
    print("-" * len(header), file=out)
    state = _replay(session, options, out)
    total = estimate_message_tokens(state)
    print(f"; final context: {len(state)} messages, ~{total:,} tokens", file=out)
    kinds = ", ".join(f"{sum(1 for m in state if m.type == t)} {t}" for t in ("system", "human", "ai", "tool"))
    print(f"final context holds: {kinds}", file=out)
    _print_summary(state, out)
    return 0
