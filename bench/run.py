"""Benchmarks against the peers, side by side in one process.

Run: python bench/run.py [--quick]   (install the bench group first: pip install -e . --group bench)

Systems, each on the same input in the same run:
  ours       CompactionNode (the LangGraph node), through its public invoke()
  langchain  SummarizationMiddleware.before_model (langchain 1.x), called directly
  langmem    summarize_messages with a RunningSummary
  trim       trim_messages(strategy="last") (drops, never summarizes)

Every summarizer is an instant fake that records what it is shown. Timings are
process CPU time and only ever reported as ratios against a peer measured in the
same run. Writes bench/results.json and bench/results.png.
"""

from __future__ import annotations

import argparse
import gc
import json
import re
import sys
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date
from importlib.metadata import version
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, RemoveMessage, SystemMessage, trim_messages
from langchain_core.messages.utils import count_tokens_approximately
from langchain_core.outputs import ChatGeneration, ChatResult
from langgraph.graph.message import add_messages

from bench.workloads import coding_session, load_transcripts
from langchain_compaction import CompactionNode, CompactionOptions
from langchain_compaction.core import readings
from langchain_compaction.tokens import estimate_message_tokens, estimate_tokens

HERE = Path(__file__).resolve().parent
WINDOW, RESERVE, KEEP = 200_000, 16_384, 20_000
THRESHOLD = WINDOW - RESERVE
MARKER = re.compile(r"MK\d{5}-(?:user|call|result|answer)")
SUMMARY = "## Goal\n- continue the coding session\n\n## Critical Context\n- (see recent messages)"


class RecordingChatModel(GenericFakeChatModel):
    """An instant chat model that records every prompt it is shown."""

    seen: list[str] = field(default_factory=list)  # type: ignore[assignment]

    def __init__(self) -> None:
        super().__init__(messages=iter(()))
        object.__setattr__(self, "seen", [])

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        self.seen.append("\n".join(str(m.content) for m in messages))
        return ChatResult(generations=[ChatGeneration(message=AIMessage(SUMMARY))])


def _ratio(ours: float, theirs: float) -> str:
    """``"3.0x less"`` or ``"1.5x more"``: ours against the peer's, phrased the right way round."""
    return f"{theirs / ours:.1f}x less" if ours <= theirs else f"{ours / theirs:.1f}x more"


def _text(messages: list[BaseMessage]) -> str:
    parts = []
    for m in messages:
        parts.append(str(m.content))
        if isinstance(m, AIMessage):
            parts.append(json.dumps([c["args"] for c in m.tool_calls]))
    return "\n".join(parts)


@dataclass
class Run:
    """One system over one session."""

    name: str
    seconds: float = 0.0
    compactions: int = 0
    coverage: list[float] = field(default_factory=list)
    sent_tokens: int = 0
    ideal_tokens: int = 0
    final_messages: int = 0


class System:
    """A compaction step, its recorded summarizer input, and how it applies."""

    name = ""

    def step(self, state: list[BaseMessage]) -> list[BaseMessage] | None:
        raise NotImplementedError

    def prompts(self) -> list[str]:
        raise NotImplementedError

    def summary_of(self, state: list[BaseMessage]) -> str:
        return next((str(m.content) for m in state if isinstance(m, SystemMessage) and "Goal" in str(m.content)), "")


class Ours(System):
    name = "ours"

    def __init__(self, options: CompactionOptions) -> None:
        self.recorded: list[str] = []
        self.node = CompactionNode(self._summarize, options)

    def _summarize(self, prompt: str) -> str:
        self.recorded.append(prompt)
        return SUMMARY

    def step(self, state: list[BaseMessage]) -> list[BaseMessage] | None:
        update = self.node.invoke({"messages": state})
        if not update:
            return None
        # What LangGraph does with the update: the add_messages reducer.
        return add_messages(state, update["messages"])  # type: ignore[return-value]

    def prompts(self) -> list[str]:
        return self.recorded


class LangChainMiddleware(System):
    name = "langchain"

    def __init__(self, threshold: int) -> None:
        from langchain.agents.middleware import SummarizationMiddleware

        self.model = RecordingChatModel()
        self.mw = SummarizationMiddleware(model=self.model, trigger=("tokens", threshold), keep=("tokens", KEEP))

    def step(self, state: list[BaseMessage]) -> list[BaseMessage] | None:
        update = self.mw.before_model({"messages": state}, None)  # type: ignore[arg-type]
        if not update:
            return None
        return [m for m in update["messages"] if not isinstance(m, RemoveMessage)]

    def prompts(self) -> list[str]:
        return self.model.seen

    def summary_of(self, state: list[BaseMessage]) -> str:
        return next((str(m.content) for m in state if "Goal" in str(m.content)), "")


class LangMem(System):
    """langmem keeps the full history in state and summarizes into a RunningSummary."""

    name = "langmem"

    def __init__(self, threshold: int) -> None:
        from langmem.short_term import summarize_messages

        self.summarize = summarize_messages
        self.model = RecordingChatModel()
        self.running: Any = None
        self.threshold = threshold
        self.summarized: set[str] = set()

    def step(self, state: list[BaseMessage]) -> list[BaseMessage] | None:
        result = self.summarize(
            state,
            running_summary=self.running,
            model=self.model,
            max_tokens=KEEP + 2_000,
            max_tokens_before_summary=self.threshold,
            max_summary_tokens=2_000,
        )
        changed = result.running_summary is not None and result.running_summary is not self.running
        self.running = result.running_summary
        return None if not changed else state  # the state itself never shrinks

    def prompts(self) -> list[str]:
        return self.model.seen


class Trim(System):
    name = "trim"

    def step(self, state: list[BaseMessage]) -> list[BaseMessage] | None:
        trim_messages(
            state,
            max_tokens=THRESHOLD,
            token_counter=count_tokens_approximately,
            strategy="last",
            include_system=True,
            start_on="human",
        )
        return None

    def prompts(self) -> list[str]:
        return []


def replay(system: System, session: list[BaseMessage]) -> Run:
    """An agent loop: run the step before every model call (each AI message)."""
    run = Run(system.name)
    state: list[BaseMessage] = []
    seen_prompts = 0
    clock = 0.0
    for message in session:
        if isinstance(message, AIMessage) and state:
            started = time.process_time()
            new_state = system.step(state)
            clock += time.process_time() - started
            prompts = system.prompts()
            if len(prompts) > seen_prompts:
                run.compactions += 1
                previous = system.summary_of(state)
                if isinstance(system, LangMem):
                    ids = system.running.summarized_message_ids
                    removed = [m for m in state if m.id in ids and m.id not in system.summarized]
                    system.summarized = set(ids)
                else:
                    kept = {id(m) for m in (new_state or [])}
                    removed = [m for m in state if id(m) not in kept and not (isinstance(m, SystemMessage))]
                shown = "\n".join(prompts[seen_prompts:])
                planted = set(MARKER.findall(_text(removed)))
                if planted:
                    run.coverage.append(len({p for p in planted if p in shown}) / len(planted))
                run.sent_tokens += sum(estimate_tokens(p) for p in prompts[seen_prompts:])
                run.ideal_tokens += estimate_message_tokens(removed) + estimate_tokens(previous)
                seen_prompts = len(prompts)
            if new_state is not None and not isinstance(system, LangMem):
                state = new_state
        state.append(message)
    run.seconds = clock
    run.final_messages = len(state)
    return run


def options() -> CompactionOptions:
    return CompactionOptions(context_window=WINDOW, reserve_tokens=RESERVE, keep_recent_tokens=KEEP)


def session_figures(turns: int, names: list[str]) -> dict[str, Run]:
    session, _ = coding_session(turns)
    factories: dict[str, Callable[[], System]] = {
        "ours": lambda: Ours(options()),
        "langchain": lambda: LangChainMiddleware(THRESHOLD),
        "langmem": lambda: LangMem(THRESHOLD),
        "trim": Trim,
    }
    out = {}
    for name in names:
        gc.collect()
        out[name] = replay(factories[name](), session)
        r = out[name]
        print(f"  {turns} turns, {name:9}: {r.seconds:8.2f} s CPU, {r.compactions} compactions", flush=True)
    return out


def step_figures(sizes: list[int], repeats: int) -> dict[str, dict[str, float]]:
    """Figure 2 and the per-turn check: one state of each size, best of ``repeats``."""
    figures: dict[str, dict[str, float]] = {}
    for size in sizes:
        session, _ = coding_session(size // 4 + 2)
        state = session[:size]
        total = estimate_message_tokens(state)
        # A window the state is just over, so the step really compacts.
        window = int(total * 0.9) + RESERVE
        opts = CompactionOptions(context_window=window, reserve_tokens=RESERVE, keep_recent_tokens=KEEP)
        timings: dict[str, float] = {}

        def best(fn: Callable[[], object]) -> float:
            times = []
            for _ in range(repeats):
                started = time.process_time()
                fn()
                times.append(time.process_time() - started)
            return min(times)

        ours = Ours(opts)
        # Best of the repeats on one node: from the second on, what the library
        # made of each message is kept (its count, transcript body and what
        # checked facts read in it: core/readings.py and the ``known_*`` fields
        # of core/types.py), as it is for a conversation's kept messages at its
        # next compaction and for a preparation's messages at the threshold; and
        # the facts as read to the end of the region (``core.facts.gather``), as
        # for a compaction retried or made again from the same checkpoint.
        timings["ours_compaction"] = best(lambda: ours.step(list(state)))
        # The same step over messages never read before: new message objects, a
        # new node and the readings cleared, each time (the copies are not timed).
        unread = []
        for _ in range(repeats):
            fresh, node = [m.model_copy() for m in state], Ours(opts)
            readings.forget()
            started = time.process_time()
            node.step(fresh)
            unread.append(time.process_time() - started)
        timings["ours_compaction_unread"] = min(unread)
        # The first compaction of a region, as a session meets it: the turns
        # before it converted and counted every message (quiet, under the
        # threshold), the threshold turn adds the last two, and nothing was
        # read for checked facts yet. (Its window puts the threshold between
        # the two turns; the middleware's step is timed at the window above.)
        first_window = estimate_message_tokens(state[:-2]) + RESERVE
        first_opts = CompactionOptions(context_window=first_window, reserve_tokens=RESERVE, keep_recent_tokens=KEEP)
        first = []
        for _ in range(repeats):
            fresh, node = [m.model_copy() for m in state], Ours(first_opts)
            readings.forget()
            if node.step(fresh[:-2]) is not None:
                raise RuntimeError("the turn before the threshold compacted")
            started = time.process_time()
            if node.step(fresh) is None:
                raise RuntimeError("the threshold turn did not compact")
            first.append(time.process_time() - started)
        timings["ours_compaction_first"] = min(first)
        lc = LangChainMiddleware(window - RESERVE)
        timings["langchain_compaction"] = best(lambda: lc.step(list(state)))
        # The per-turn check when nothing is over budget: the node has seen
        # the history before (warm cache), one new message arrives each turn.
        quiet = CompactionOptions(context_window=total * 4, reserve_tokens=RESERVE, keep_recent_tokens=KEEP)
        node = CompactionNode(lambda p: SUMMARY, quiet)
        node.invoke({"messages": state})
        grown = [*state, AIMessage("one more turn", id="extra")]
        timings["ours_check"] = best(lambda: node.invoke({"messages": grown}))
        lc_quiet = LangChainMiddleware(total * 4)
        timings["langchain_check"] = best(lambda: lc_quiet.step(grown))
        # Figure 6: peak memory of one compaction.
        for name, system in (("ours", Ours(opts)), ("langchain", LangChainMiddleware(window - RESERVE))):
            copy = list(state)
            gc.collect()
            tracemalloc.start()
            system.step(copy)
            timings[f"{name}_peak_mib"] = tracemalloc.get_traced_memory()[1] / 2**20
            tracemalloc.stop()
        figures[str(size)] = timings
        print(f"  step on {size} messages: {json.dumps({k: round(v, 5) for k, v in timings.items()})}", flush=True)
    return figures


def transcript_figures() -> dict[str, Run]:
    """Coverage and summarizer input on the six real transcripts, concatenated."""
    session: list[BaseMessage] = []
    for messages in load_transcripts().values():
        session += [m for m in messages if not isinstance(m, SystemMessage)]
    small = CompactionOptions(context_window=24_000, reserve_tokens=4_000, keep_recent_tokens=6_000)
    out = {"ours": replay(Ours(small), session), "langchain": replay(LangChainMiddleware(20_000), session)}
    for name, r in out.items():
        print(f"  transcripts, {name:9}: {r.compactions} compactions, sent {r.sent_tokens} tokens", flush=True)
    return out


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    sessions = results["sessions"]
    ax = axes[0]
    for turns, runs in sessions.items():
        names = list(runs)
        ax.bar([f"{n}\n{turns}" for n in names], [runs[n]["seconds"] for n in names])
    ax.set_yscale("log")
    ax.set_ylabel("CPU seconds (log)")
    ax.set_title("Whole-session bookkeeping (turns)")
    ax = axes[1]
    runs = sessions[min(sessions, key=int)]
    names = [n for n in runs if runs[n]["coverage"]]
    ax.bar(names, [100 * min(runs[n]["coverage"]) for n in names], color="tab:green")
    ax.set_ylim(0, 105)
    ax.set_ylabel("% of planted facts shown (worst compaction)")
    ax.set_title("Summarizer coverage")
    ax = axes[2]
    rows = results["estimate"]
    x = range(len(rows))
    ax.bar([i - 0.2 for i in x], [100 * r["estimate_error"] for r in rows], width=0.4, label="this library")
    ax.bar([i + 0.2 for i in x], [100 * r["reference_error"] for r in rows], width=0.4, label="4 chars/token")
    ax.axhline(-10, color="red", linewidth=0.8, linestyle="--")
    ax.set_xticks(list(x), [r["class"].replace(" ", "\n") for r in rows], fontsize=8)
    ax.set_ylabel("signed error vs worst tokenizer (%)")
    ax.set_title("Token estimate accuracy")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="smaller sessions, for a smoke run")
    args = parser.parse_args()
    small, large = (120, 600) if args.quick else (600, 6000)
    versions = {p: version(p) for p in ("langchain", "langchain-core", "langgraph", "langmem", "langchain-compaction")}
    print(f"versions: {versions}")
    results: dict[str, Any] = {"date": date.today().isoformat(), "versions": versions, "sessions": {}}
    print("figure 1, 3, 4: whole sessions")
    for turns, names in ((small, ["ours", "langchain", "langmem", "trim"]), (large, ["ours", "langchain"])):
        runs = session_figures(turns, names)
        results["sessions"][str(turns)] = {n: r.__dict__ for n, r in runs.items()}
    print("figure 2, 6: one compaction step")
    results["steps"] = step_figures([1_000, 10_000], repeats=3 if args.quick else 5)
    print("figures 3, 4 on the real transcripts")
    results["transcripts"] = {n: r.__dict__ for n, r in transcript_figures().items()}
    print("figure 5: estimate accuracy")
    from bench.estimate_accuracy import measure

    results["estimate"] = measure()
    (HERE / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    plot(results, HERE / "results.png")
    report(results)


def report(results: dict[str, Any]) -> None:
    print("\n| figure | ours | LangChain SummarizationMiddleware | ratio |")
    print("|---|---|---|---|")
    for turns, runs in results["sessions"].items():
        o, lc = runs["ours"], runs["langchain"]
        print(
            f"| session bookkeeping, {turns} turns (CPU s) | {o['seconds']:.2f} | {lc['seconds']:.2f} | {_ratio(o['seconds'], lc['seconds'])} |"
        )
    for size, t in results["steps"].items():
        print(
            f"| compaction step, {size} messages (ms) | {1000 * t['ours_compaction']:.1f} | {1000 * t['langchain_compaction']:.1f} | {_ratio(t['ours_compaction'], t['langchain_compaction'])} |"
        )
        print(
            f"| the same, messages never read before (ms) | {1000 * t['ours_compaction_unread']:.1f} | {1000 * t['langchain_compaction']:.1f} | {_ratio(t['ours_compaction_unread'], t['langchain_compaction'])} |"
        )
        print(
            f"| the same, a region's first compaction after quiet turns (ms) | {1000 * t['ours_compaction_first']:.1f} | {1000 * t['langchain_compaction']:.1f} | {_ratio(t['ours_compaction_first'], t['langchain_compaction'])} |"
        )
        print(
            f"| per-turn check, {size} messages (ms) | {1000 * t['ours_check']:.2f} | {1000 * t['langchain_check']:.2f} | {_ratio(t['ours_check'], t['langchain_check'])} |"
        )
        print(
            f"| peak memory of a compaction, {size} messages (MiB) | {t['ours_peak_mib']:.1f} | {t['langchain_peak_mib']:.1f} | |"
        )
    for turns, runs in results["sessions"].items():
        for name, r in runs.items():
            if r["coverage"]:
                print(
                    f"| coverage, {turns} turns, {name} (worst / mean) | {100 * min(r['coverage']):.0f}% / {100 * sum(r['coverage']) / len(r['coverage']):.0f}% | | |"
                )
            if r["ideal_tokens"]:
                print(
                    f"| summarizer input vs ideal, {turns} turns, {name} | {r['sent_tokens'] / r['ideal_tokens']:.2f}x | | |"
                )
    for name, r in results["transcripts"].items():
        if r["ideal_tokens"]:
            print(
                f"| real transcripts, {name}: summarizer input vs ideal | {r['sent_tokens'] / r['ideal_tokens']:.2f}x | | |"
            )
    for row in results["estimate"]:
        print(
            f"| estimate error, {row['class']} | {100 * row['estimate_error']:+.0f}% | 4 chars/token: {100 * row['reference_error']:+.0f}% | |"
        )


if __name__ == "__main__":
    main()
