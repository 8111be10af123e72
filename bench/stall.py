"""The user-visible stall of compaction, with summaries made on the spot or prepared ahead, at four windows.

python bench/stall.py [--only WINDOW] [--agent fast|slow] [--json] [--out PATH]

A latency model, run in scaled real time (one modelled second is ``SCALE``
real seconds, so threads and tasks really run side by side). The agent's own
model takes 0.25 s a turn (fast) or 6 s (slow). A summary call takes, by window:

- 8,000 and 20,000 (a small model run locally): 0.7 s plus 1 s per 5,000
  input tokens;
- 60,000 and 200,000: Claude Sonnet 4.5 as Artificial Analysis measured it
  (1.80 s to the first token, 63 output tokens per second, quoted at
  lattice.uptownhr.com/claude-opus-4-5/speed-analysis), plus 0.1 ms per input
  token (50 to 200 ms per extra 1,000 input tokens, learn.cloudbuckle.com's
  Claude latency notes), for the summary it writes (at most 800 tokens).

A synthetic coding session (``bench.workloads.coding_session``, long enough for
several compactions at each window) is replayed through ``CompactionNode`` and
``CompactionMiddleware.before_model``, on the spot and with ``PrepareAhead()``
added to the default features, and through LangChain's
``SummarizationMiddleware`` (its documented trigger and keep, the same threshold
and keep). The stall is the compaction step's wall time on every turn, in
modelled seconds: time spent waiting is scaled back, CPU time of the process
(any thread) during the step counts as it ran, and a turn that compacts
nothing and waits under 10 ms real (the OS scheduling other work, not a model
call: the shortest modelled call is 14 ms real) counts that wait as real time.
Still, run it on an otherwise idle machine. Also reported: summary calls over the session
(preparations thrown away included) and per compaction, the summarizer input
tokens the library reports against what was sent, and coverage (planted markers
of compacted messages that some summary request showed).

The floor: where one summary call outlasts the agent's own time from the landing
target to the window (the turns a preparation has before a request would not
fit), some stall cannot be avoided by preparing ahead; it is printed beside the
figure.
"""

from __future__ import annotations

import argparse
import asyncio
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
from langchain_compaction.core.types import SummaryRequest
from langchain_compaction.features import Feature, PrepareAhead, default_features
from langchain_compaction.tokens import estimate_tokens

SCALE = 0.02
"""Real seconds per modelled second."""
NOISE = 0.01
"""Real seconds of waiting below which a turn that compacts nothing was only descheduled (a wait on a modelled
call is at least 0.7 s, 14 ms real)."""

SONNET_TTFT = 1.80
SONNET_OUTPUT_PER_SECOND = 63.0
SONNET_PER_INPUT_TOKEN = 0.0001
SUMMARY_TOKENS = 800
AGENTS = {"fast": 0.25, "slow": 6.0}


@dataclass(frozen=True)
class Setup:
    """One window: its session length and how long its summarizer takes."""

    window: int
    turns: int
    local: bool  # a small local model (else Sonnet, with a long window of its own)

    def seconds(self, input_tokens: int, output_tokens: int) -> float:
        if self.local:
            return 0.7 + input_tokens / 5_000
        return SONNET_TTFT + input_tokens * SONNET_PER_INPUT_TOKEN + output_tokens / SONNET_OUTPUT_PER_SECOND

    def options(self) -> CompactionOptions:
        # Sonnet reads a whole region in one request; a local model reads what its window holds.
        return CompactionOptions(context_window=self.window, summary_input_tokens=None if self.local else 200_000)


SETUPS = (Setup(8_000, 120, True), Setup(20_000, 240, True), Setup(60_000, 500, False), Setup(200_000, 1_500, False))


def summary_text(max_tokens: int) -> str:
    """A plausible summary within ``max_tokens`` (and 800)."""
    lines = max(1, min(SUMMARY_TOKENS, int(max_tokens * 0.8)) // 8)
    return "## Goal\n- continue the coding session\n\n## Progress\n" + "- step done, details kept verbatim\n" * lines


@dataclass
class Model:
    """A summarizer that takes the modelled time and records what it was sent."""

    setup: Setup
    prompts: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def name(self) -> str:
        return "modelled"

    def summarize(self, request: SummaryRequest) -> str:
        return self.answer(f"{request.system}\n{request.prompt}", request.max_tokens)

    async def asummarize(self, request: SummaryRequest) -> str:
        return await asyncio.to_thread(self.summarize, request)

    def answer(self, prompt: str, max_tokens: int = SUMMARY_TOKENS) -> str:
        with self.lock:
            self.prompts.append(prompt)
        text = summary_text(max_tokens)
        time.sleep(self.setup.seconds(estimate_tokens(prompt), estimate_tokens(text)) * SCALE)
        return text


class SlowChatModel(GenericFakeChatModel):
    """The same latency for LangChain's middleware, which calls a chat model."""

    def __init__(self, recorder: Model) -> None:
        super().__init__(messages=iter(()))
        object.__setattr__(self, "recorder", recorder)

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        text = self.recorder.answer("\n".join(str(m.content) for m in messages))  # type: ignore[attr-defined]
        return ChatResult(generations=[ChatGeneration(message=AIMessage(text))])


@dataclass
class Run:
    name: str
    stalls: list[float] = field(default_factory=list)
    total_stall: float = 0.0
    compactions: int = 0
    calls: int = 0
    input_tokens: int = 0
    reported_calls: int = 0
    reported_input_tokens: int = 0
    coverage: float = 1.0
    from_prepared: int = 0


def _markers(messages: list[BaseMessage]) -> set[str]:
    found: set[str] = set()
    for m in messages:
        found.update(MARKER.findall(str(m.content)))
        for call in getattr(m, "tool_calls", None) or []:
            found.update(MARKER.findall(json.dumps(call.get("args", {}))))
    return found


def replay(name: str, step: Any, model: Model, session: list[BaseMessage], agent: float, results: list[Any]) -> Run:
    """Run the agent loop: the step before every model call, then the agent's own time.

    ``results``: per compaction, the library's record (``CompactionResult.to_dict()``), when it reports one.
    """
    run = Run(name)
    state: list[BaseMessage] = []
    compacted: set[str] = set()
    for message in session:
        if isinstance(message, AIMessage) and state:
            started, cpu = time.monotonic(), time.process_time()
            new_state = step(state)
            # Waiting (for a modelled call) is scaled back; CPU work counts as
            # it ran, on any thread (a preparation starting holds the
            # interpreter lock for a moment, which is real time, not modelled).
            # A turn that compacts nothing and waits less than NOISE has waited
            # for the OS to schedule it, not for a model: real time too.
            spent = time.process_time() - cpu
            waited = time.monotonic() - started - spent
            modelled = new_state is not None or waited > NOISE
            elapsed = (waited / SCALE if modelled else waited) + spent
            run.total_stall += elapsed
            if new_state is not None:
                run.compactions += 1
                run.stalls.append(elapsed)
                kept = {id(m) for m in new_state}
                compacted |= _markers([m for m in state if id(m) not in kept])
                state = new_state
            time.sleep(agent * SCALE)  # the agent's own model call
        state.append(message)
    time.sleep(0.5)  # let a last background call finish before counting
    run.calls = len(model.prompts)
    run.input_tokens = sum(estimate_tokens(p) for p in model.prompts)
    run.reported_calls = sum(r["summarizer_calls"] for r in results)
    run.reported_input_tokens = sum(r["summarizer_input_tokens"] for r in results)
    shown = "\n".join(model.prompts)
    run.coverage = len({m for m in compacted if m in shown}) / len(compacted) if compacted else 1.0
    run.from_prepared = sum(1 for r in results if r.get("parts", {}).get("prepared", {}).get("applied"))
    return run


def _node_step(options: CompactionOptions, features: Sequence[Feature] | None, model: Model, results: list[Any]) -> Any:
    node = CompactionNode(model, options, features=features, result_key="compaction")

    def step(state: list[BaseMessage]) -> list[BaseMessage] | None:
        update = node.invoke({"messages": state})
        if not update:
            return None
        results.append(update["compaction"])  # the record: CompactionResult.to_dict()
        return add_messages(state, update["messages"])  # what LangGraph does with it

    return step


def _middleware_step(
    options: CompactionOptions, features: Sequence[Feature] | None, model: Model, results: list[Any]
) -> Any:
    def on_compaction(result: CompactionResult) -> None:
        results.append(result.to_dict())

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


def floor_seconds(setup: Setup, session: list[BaseMessage], agent: float) -> float:
    """The stall no preparation avoids over the session: per compaction, one summary call minus the agent's time
    from the landing target to the window (the turns a preparation has before a request would not fit)."""
    budget = setup.options().budget
    per_turn = estimate_tokens("\n".join(str(m.content) for m in session)) / setup.turns
    turns = max((setup.window - (budget.landing or 0)) / per_turn, 1.0)
    call = setup.seconds((budget.threshold or 0) - budget.keep, SUMMARY_TOKENS)
    compactions = estimate_tokens("\n".join(str(m.content) for m in session)) / max(
        (budget.threshold or 0) - (budget.landing or 0), 1
    )
    return max(call - turns * agent, 0.0) * compactions


def run_setup(setup: Setup, agent_name: str) -> dict[str, Any]:
    agent = AGENTS[agent_name]
    session, _ = coding_session(setup.turns)
    options = setup.options()

    # A new PrepareAhead per adapter (it holds its preparations).
    def prepared() -> list[Feature]:
        return [*default_features(), PrepareAhead()]

    runs: list[Run] = []
    for name, build in (
        ("node, on the spot", lambda m, r: _node_step(options, None, m, r)),
        ("node, prepared", lambda m, r: _node_step(options, prepared(), m, r)),
        ("middleware, on the spot", lambda m, r: _middleware_step(options, None, m, r)),
        ("middleware, prepared", lambda m, r: _middleware_step(options, prepared(), m, r)),
        ("LangChain SummarizationMiddleware", lambda m, r: _langchain_step(m, options)),
    ):
        model = Model(setup)
        results: list[Any] = []
        runs.append(replay(name, build(model, results), model, session, agent, results))
    budget = options.budget
    floor = floor_seconds(setup, session, agent)
    print(
        f"\nwindow {setup.window:,} (threshold {budget.threshold:,}, landing {budget.landing:,}, keep {budget.keep:,}), "
        f"{setup.turns} turns, {agent_name} agent ({agent} s a turn), summarizer "
        f"{'0.7 s + 1 s per 5,000 input tokens' if setup.local else 'Sonnet 4.5'}; unavoidable stall {floor:.1f} s"
    )
    print(
        "| run | compactions | stall per compaction, median / worst (s) | total stall (s) | summary calls "
        "| input tokens sent (reported) | coverage |"
    )
    print("|---|---|---|---|---|---|---|")
    figures: dict[str, Any] = {"unavoidable_stall_s": round(floor, 1)}
    for run in runs:
        median = statistics.median(run.stalls) if run.stalls else 0.0
        worst = max(run.stalls, default=0.0)
        reported = f" ({run.reported_input_tokens:,})" if not run.name.startswith("LangChain") else ""
        print(
            f"| {run.name} | {run.compactions} ({run.from_prepared} prepared) | {median:.2f} / {worst:.2f} "
            f"| {run.total_stall:.1f} | {run.calls} | {run.input_tokens:,}{reported} | {run.coverage:.0%} |",
            flush=True,
        )
        figures[run.name] = {
            "compactions": run.compactions,
            "from_prepared": run.from_prepared,
            "stall_median_s": round(median, 2),
            "stall_worst_s": round(worst, 2),
            "stall_total_s": round(run.total_stall, 1),
            "summary_calls": run.calls,
            "summary_calls_reported": run.reported_calls,
            "summarizer_input_tokens_sent": run.input_tokens,
            "summarizer_input_tokens_reported": run.reported_input_tokens,
            "coverage": round(run.coverage, 3),
        }
    for kind in ("node", "middleware"):
        spot, ahead = figures[f"{kind}, on the spot"], figures[f"{kind}, prepared"]
        stall = ahead["stall_total_s"] / spot["stall_total_s"] if spot["stall_total_s"] else 0.0
        calls = ahead["summary_calls"] / spot["summary_calls"] if spot["summary_calls"] else 0.0
        print(f"{kind}: prepared stall {stall:.1%} of on the spot, summary calls {calls:.2f}x")
    return figures


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", type=int, default=None, help="one window (8000, 20000, 60000 or 200000)")
    parser.add_argument("--agent", choices=sorted(AGENTS), default=None, help="one agent speed")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("stall.json"), help="with --json")
    args = parser.parse_args()
    figures = {}
    for setup in SETUPS:
        if args.only is not None and setup.window != args.only:
            continue
        for agent in sorted(AGENTS) if args.agent is None else [args.agent]:
            figures[f"window {setup.window}, {agent} agent"] = run_setup(setup, agent)
    if args.json:
        out = args.out
        saved = json.loads(out.read_text(encoding="utf-8")) if out.exists() and args.only else {}
        saved.update(figures)
        out.write_text(json.dumps(saved, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
