"""The user-visible stall of compaction turns, with summaries made on the spot or prepared ahead.

python bench/stall.py [--turns N] [--window W] [--keep K] [--json] [--out PATH]

A latency model, run in scaled real time (one modelled second is ``SCALE``
real seconds, so threads and tasks really run side by side):

- the agent's own model takes ``AGENT_SECONDS`` per turn;
- a summary call takes ``TTFT + input_tokens * PER_INPUT_TOKEN + output_tokens / OUTPUT_TOKENS_PER_SECOND``:
  Claude Sonnet 4.5 as Artificial Analysis measured it (1.80 s to the first
  token, 63 output tokens per second, quoted at
  lattice.uptownhr.com/claude-opus-4-5/speed-analysis), plus 0.1 ms per input
  token (50 to 200 ms per extra 1,000 input tokens, learn.cloudbuckle.com's
  Claude latency notes), for a summary of ``SUMMARY_TOKENS`` tokens.

A synthetic coding session (``bench.workloads.coding_session``) is replayed
through ``CompactionNode`` and ``CompactionMiddleware.before_model``, plain and
with ``PrepareAhead(at=0.7)`` added to the default features (the runs keep
their 0.2 label, ``prepare_at=0.7``), and through LangChain's ``SummarizationMiddleware``
(its documented trigger and keep, the same threshold and keep). The stall of a
compaction turn is its wall time minus the agent's own, in modelled seconds:
time spent waiting is scaled back, CPU time of the turn's own thread counts as
it ran. Also reported: summary calls per
compaction (preparations that were thrown away included), summarizer input
tokens, and coverage (planted markers of compacted messages that some summary
request showed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, RemoveMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langgraph.graph.message import add_messages

from bench.run import MARKER
from bench.workloads import coding_session
from langchain_compaction import CompactionMiddleware, CompactionNode, CompactionOptions, CompactionResult
from langchain_compaction.features import Feature, PrepareAhead, default_features
from langchain_compaction.tokens import estimate_tokens

SCALE = 0.004
"""Real seconds per modelled second."""

AGENT_SECONDS = 6.0
TTFT = 1.80
OUTPUT_TOKENS_PER_SECOND = 63.0
PER_INPUT_TOKEN = 0.0001
SUMMARY_TOKENS = 800

SUMMARY_INPUT = 200_000  # the summarizer is a long-window model: one request per compaction
SUMMARY = "## Goal\n- continue the coding session\n\n## Progress\n" + "- step done, details kept verbatim\n" * 110


def summary_seconds(prompt: str) -> float:
    """Modelled seconds of one summary call for ``prompt``."""
    return TTFT + estimate_tokens(prompt) * PER_INPUT_TOKEN + SUMMARY_TOKENS / OUTPUT_TOKENS_PER_SECOND


@dataclass
class Model:
    """A summarizer that takes the modelled time and records what it was shown."""

    prompts: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, prompt: str) -> str:
        with self.lock:
            self.prompts.append(prompt)
        time.sleep(summary_seconds(prompt) * SCALE)
        return SUMMARY


class SlowChatModel(GenericFakeChatModel):
    """The same latency for LangChain's middleware, which calls a chat model."""

    def __init__(self, recorder: Model) -> None:
        super().__init__(messages=iter(()))
        object.__setattr__(self, "recorder", recorder)

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        text = self.recorder("\n".join(str(m.content) for m in messages))  # type: ignore[attr-defined]
        return ChatResult(generations=[ChatGeneration(message=AIMessage(text))])


@dataclass
class Run:
    name: str
    stalls: list[float] = field(default_factory=list)
    compactions: int = 0
    calls: int = 0
    input_tokens: int = 0
    coverage: float = 1.0
    from_prepared: int = 0


def _markers(messages: list[BaseMessage]) -> set[str]:
    found: set[str] = set()
    for m in messages:
        found.update(MARKER.findall(str(m.content)))
        for call in getattr(m, "tool_calls", None) or []:
            found.update(MARKER.findall(json.dumps(call.get("args", {}))))
    return found


def replay(name: str, step: Any, model: Model, session: list[BaseMessage], results: list[bool]) -> Run:
    """Run the agent loop: the step before every model call, then the agent's own time.

    ``results``: per compaction, whether a summary prepared ahead was applied.
    """
    run = Run(name)
    state: list[BaseMessage] = []
    compacted: set[str] = set()
    for message in session:
        if isinstance(message, AIMessage) and state:
            started, cpu = time.monotonic(), time.thread_time()
            new_state = step(state)
            # Waiting (for a modelled call) is scaled back; CPU work counts as it ran.
            spent = time.thread_time() - cpu
            elapsed = (time.monotonic() - started - spent) / SCALE + spent
            if new_state is not None:
                run.compactions += 1
                run.stalls.append(elapsed)
                kept = {id(m) for m in new_state}
                compacted |= _markers([m for m in state if id(m) not in kept])
                state = new_state
            time.sleep(AGENT_SECONDS * SCALE)  # the agent's own model call
        state.append(message)
    time.sleep(0.5)  # let a last background call finish before counting
    run.calls = len(model.prompts)
    run.input_tokens = sum(estimate_tokens(p) for p in model.prompts)
    shown = "\n".join(model.prompts)
    run.coverage = len({m for m in compacted if m in shown}) / len(compacted) if compacted else 1.0
    run.from_prepared = sum(1 for applied in results if applied)
    return run


def _node_step(
    options: CompactionOptions, features: Sequence[Feature] | None, model: Model, results: list[bool]
) -> Any:
    node = CompactionNode(model, options, features=features, result_key="compaction")

    def step(state: list[BaseMessage]) -> list[BaseMessage] | None:
        update = node.invoke({"messages": state})
        if not update:
            return None
        record = update["compaction"]
        results.append(bool(record.get("parts", {}).get("prepared", {}).get("applied", False)))
        return add_messages(state, update["messages"])  # what LangGraph does with it

    return step


def _middleware_step(
    options: CompactionOptions, features: Sequence[Feature] | None, model: Model, results: list[bool]
) -> Any:
    def on_compaction(result: CompactionResult) -> None:
        results.append(bool(result.part("prepared").get("applied", False)))

    middleware = CompactionMiddleware(model, options, features=features, on_compaction=on_compaction)

    def step(state: list[BaseMessage]) -> list[BaseMessage] | None:
        update = middleware.before_model({"messages": state}, None)  # type: ignore[arg-type]
        return None if not update else add_messages(state, update["messages"])

    return step


def _langchain_step(model: Model, options: CompactionOptions) -> Any:
    from langchain.agents.middleware import SummarizationMiddleware

    budget = options.budget
    middleware = SummarizationMiddleware(
        model=SlowChatModel(model), trigger=("tokens", budget.threshold), keep=("tokens", budget.keep)
    )

    def step(state: list[BaseMessage]) -> list[BaseMessage] | None:
        update = middleware.before_model({"messages": state}, None)  # type: ignore[arg-type]
        if not update:
            return None
        return [m for m in update["messages"] if not isinstance(m, RemoveMessage)]

    return step


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=1500)
    parser.add_argument("--window", type=int, default=200_000)
    parser.add_argument("--keep", type=int, default=None)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("stall.json"), help="with --json")
    args = parser.parse_args()
    session, _ = coding_session(args.turns)
    plain = CompactionOptions(
        context_window=args.window, keep_recent_tokens=args.keep, summary_input_tokens=SUMMARY_INPUT
    )

    # Prepared ahead: the same options, the default features plus PrepareAhead(at=0.7); a new
    # PrepareAhead per adapter (it holds its preparations, as each adapter did with prepare_at).
    def prepared() -> list[Feature]:
        return [*default_features(), PrepareAhead(at=0.7)]

    runs: list[Run] = []
    for name, build in (
        ("node, on the spot", lambda m, r: _node_step(plain, None, m, r)),
        ("node, prepared (prepare_at=0.7)", lambda m, r: _node_step(plain, prepared(), m, r)),
        ("middleware, on the spot", lambda m, r: _middleware_step(plain, None, m, r)),
        ("middleware, prepared (prepare_at=0.7)", lambda m, r: _middleware_step(plain, prepared(), m, r)),
        ("LangChain SummarizationMiddleware", lambda m, r: _langchain_step(m, plain)),
    ):
        model = Model()
        results: list[bool] = []
        runs.append(replay(name, build(model, results), model, session, results))
        print(f"  {name}: done", flush=True)
    budget = plain.budget
    print(
        f"{args.turns}-turn session, window {args.window:,} (threshold {budget.threshold:,}), keep {budget.keep:,}; "
        f"agent {AGENT_SECONDS:.0f} s per turn; a summary call {TTFT} s + 0.1 ms per input token + "
        f"{SUMMARY_TOKENS} tokens at {OUTPUT_TOKENS_PER_SECOND:.0f}/s"
    )
    print(
        "| run | compactions | stall per compaction turn, median / worst (s) | total stall (s) "
        "| summary calls per compaction | summarizer input tokens | coverage |"
    )
    print("|---|---|---|---|---|---|---|")
    figures = {}
    for run in runs:
        median = statistics.median(run.stalls) if run.stalls else 0.0
        worst = max(run.stalls, default=0.0)
        per = run.calls / run.compactions if run.compactions else 0.0
        print(
            f"| {run.name} | {run.compactions} ({run.from_prepared} prepared) | {median:.2f} / {worst:.2f} "
            f"| {sum(run.stalls):.1f} | {per:.2f} | {run.input_tokens:,} | {run.coverage:.0%} |"
        )
        figures[run.name] = {
            "compactions": run.compactions,
            "from_prepared": run.from_prepared,
            "stall_median_s": round(median, 2),
            "stall_worst_s": round(worst, 2),
            "stall_total_s": round(sum(run.stalls), 1),
            "calls_per_compaction": round(per, 2),
            "summarizer_input_tokens": run.input_tokens,
            "coverage": round(run.coverage, 3),
        }
    for kind in ("node", "middleware"):
        on_spot = figures[f"{kind}, on the spot"]["stall_total_s"]
        ahead = figures[f"{kind}, prepared (prepare_at=0.7)"]["stall_total_s"]
        print(f"{kind}: prepared total stall is {ahead / on_spot:.1%} of on the spot" if on_spot else "")
    if args.json:
        out = args.out
        saved = json.loads(out.read_text(encoding="utf-8")) if out.exists() else {}
        saved[f"window {args.window}, {args.turns} turns"] = figures
        out.write_text(json.dumps(saved, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
