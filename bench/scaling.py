"""How one compaction grows with the shapes that once made it quadratic.

python bench/scaling.py [--json] [--out PATH]

Each shape is compacted once at a base size and at four times it (``compact``
with the offline summarizer, window 8,000), CPU time, best of three: linear
work takes about 4x, and anything over 8x is reported as superlinear. The
shapes are those an exploratory test found quadratic (each had been, until the
change named beside it in the CHANGELOG):

- one tool output of distinct paths, URLs and addresses (its identifiers);
- many small messages in one region (its chunks);
- one assistant message with thousands of parallel calls (its exchange);
- a pasted table padded with spaces in a message that says "fine" (a revocation's subject);
- a revocation sentence holding a long run of spaces (a contrast's split);
- test runs of one program, half of them failing (each clean run was checked
  against every failure held, in the offline summary).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage

from langchain_compaction import CompactionOptions, ExtractiveSummarizer, compact

SUPERLINEAR = 8.0
"""The growth, for four times the input, past which a shape is reported as superlinear."""


def _tail(messages: list[BaseMessage]) -> list[BaseMessage]:
    """Ten short turns after the shape, so that the shape falls in the compacted region."""
    for i in range(10):
        messages += [HumanMessage(f"follow-up question {i} " * 20), AIMessage(f"answer {i} " * 20)]
    return messages


def identifiers_output(n: int) -> list[BaseMessage]:
    lines = [f"/usr/lib/p{i}/x.so https://ex.com/a/{i}?q={i} u{i}@ex.org v{i}.2.3" for i in range(n)]
    call = {"name": "bash", "args": {"command": "cat app.log"}, "id": "c1"}
    return _tail(
        [
            SystemMessage("You are a helpful assistant."),
            HumanMessage("What is wrong in the log?"),
            AIMessage("", tool_calls=[call]),
            ToolMessage("\n".join(lines), tool_call_id="c1"),
        ]
    )


def small_messages(n: int) -> list[BaseMessage]:
    messages: list[BaseMessage] = [SystemMessage("You are a helpful assistant.")]
    for i in range(n):
        messages.append(HumanMessage(f"question {i}?") if i % 2 == 0 else AIMessage(f"answer {i}."))
    return messages


def parallel_calls(n: int) -> list[BaseMessage]:
    calls = [{"name": "read_file", "args": {"path": f"src/f{i}.py"}, "id": f"c{i}"} for i in range(n)]
    results: list[BaseMessage] = [ToolMessage(f"def f{i}(): return {i}", tool_call_id=f"c{i}") for i in range(n)]
    return _tail([SystemMessage("sys"), HumanMessage("read every file"), AIMessage("", tool_calls=calls), *results])


def padded_table(n: int) -> list[BaseMessage]:
    rows = "".join(f"item{i}," + " " * n + f"{i}.00\n" for i in range(200))
    return _tail([SystemMessage("sys"), HumanMessage("Here is the report, it looks fine:\n" + rows), AIMessage("ok")])


def spaced_revocation(n: int) -> list[BaseMessage]:
    said = "You may use tabs" + " " * n + "in the docs."
    return _tail([SystemMessage("sys"), HumanMessage("Never use tabs."), AIMessage("ok"), HumanMessage(said)])


def failing_tests(n: int) -> list[BaseMessage]:
    messages: list[BaseMessage] = [SystemMessage("sys"), HumanMessage("make every test pass")]
    for i in range(n):
        call = {"name": "bash", "args": {"command": f"pytest tests/test_{i}.py"}, "id": f"c{i}"}
        output = f"E   AssertionError: {i}\n1 failed" if i % 2 == 0 else "3 passed"
        messages += [AIMessage("", tool_calls=[call]), ToolMessage(output, tool_call_id=f"c{i}")]
    return _tail(messages)


SHAPES: dict[str, tuple[Callable[[int], list[BaseMessage]], int]] = {
    "one tool output of distinct identifiers (lines)": (identifiers_output, 3_000),
    "small messages in one region": (small_messages, 8_000),
    "parallel calls in one message": (parallel_calls, 3_000),
    "a padded table saying 'fine' (spaces a row)": (padded_table, 200),
    "a revocation with a run of spaces (spaces)": (spaced_revocation, 10_000),
    "test runs of one program, half failing (calls)": (failing_tests, 1_000),
}


def cpu(messages: list[BaseMessage]) -> float:
    """The best of three: CPU seconds of one compaction."""
    best = float("inf")
    for _ in range(3):
        gc.collect()
        started = time.process_time()
        compact(ExtractiveSummarizer(), messages, CompactionOptions(context_window=8_000))
        best = min(best, time.process_time() - started)
    return best


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("scaling.json"), help="with --json")
    args = parser.parse_args()
    figures: dict[str, dict[str, float]] = {}
    print("| shape | size | CPU s | 4x size | CPU s | growth |")
    print("|---|---|---|---|---|---|")
    for name, (make, size) in SHAPES.items():
        small, large = cpu(make(size)), cpu(make(4 * size))
        growth = large / max(small, 1e-6)
        figures[name] = {
            "size": size,
            "seconds": round(small, 4),
            "seconds_4x": round(large, 4),
            "growth": round(growth, 2),
        }
        note = " (superlinear)" if growth > SUPERLINEAR else ""
        print(f"| {name} | {size:,} | {small:.3f} | {4 * size:,} | {large:.3f} | {growth:.1f}x{note} |", flush=True)
    if args.json:
        args.out.write_text(json.dumps(figures, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
