"""How many planted facts survive one and five successive offline compactions.

Run: python bench/fact_survival.py [--out PATH]

For each workload it replays the conversation, compacting with the offline
ExtractiveSummarizer whenever ``should_compact`` fires, and checks which planted
facts (user constraints, file paths, error lines, per-turn markers) of the
compacted messages appear verbatim in the summary after the first compaction
and after the fifth.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from langchain_core.messages import AIMessage, BaseMessage

from bench.workloads import Facts, coding_session, load_transcripts, planted_transcript
from langchain_compaction import CompactionOptions, compact, should_compact
from langchain_compaction._lc.convert import is_summary_message, to_core_list
from langchain_compaction.core import readings
from langchain_compaction.core.facts import gather
from langchain_compaction.features import Feature, Pins
from langchain_compaction.summarizers.extractive import ExtractiveSummarizer


@dataclass
class Survival:
    after_one: dict[str, tuple[int, int]]
    after_five: dict[str, tuple[int, int]]
    compactions: int


def _score(summary: str, facts: list[tuple[str, str, int]]) -> dict[str, tuple[int, int]]:
    found: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for kind, text, _ in facts:
        found[kind][1] += 1
        if text in summary:
            found[kind][0] += 1
    return {k: (v[0], v[1]) for k, v in found.items()}


def _summary_text(state: list[BaseMessage]) -> str:
    """What the agent reads of the summary: the summary message as written (checked facts included)."""
    return next((str(m.content) for m in state if is_summary_message(m)), "")


def replay(
    messages: list[BaseMessage],
    facts: Facts,
    options: CompactionOptions,
    summarizer: object,
    features: Sequence[Feature] | None = None,
) -> Survival:
    """Replay ``messages`` with auto-compaction; score after the 1st and 5th compaction."""
    state: list[BaseMessage] = []
    positions: list[int] = []  # original index of each state message (-1 for summaries)
    compacted: list[tuple[str, str, int]] = []
    first: dict[str, tuple[int, int]] = {}
    fifth: dict[str, tuple[int, int]] = {}
    count = 0
    critical = [f for f in facts.items if f[0] != "marker"]  # markers measure coverage, not survival
    for index, message in enumerate(messages):
        if isinstance(message, AIMessage) and should_compact(state, options=options):
            result, new_state = compact(summarizer, state, options, features=features)
            if result is not None:
                count += 1
                removed = {p for p in positions[: result.cut_index] if p >= 0}
                compacted += [f for f in critical if f[2] in removed]
                lookup = dict(zip((id(m) for m in state), positions))
                state = new_state
                positions = [lookup.get(id(m), -1) for m in state]
                if count == 1:
                    first = _score(_summary_text(state), compacted)
                if count == 5:
                    fifth = _score(_summary_text(state), compacted)
        state.append(message)
        positions.append(index)
    return Survival(first, fifth, count)


def _fmt(score: dict[str, tuple[int, int]]) -> str:
    if not score:
        return "-"
    return ", ".join(f"{k} {a / b:.0%}" for k, (a, b) in sorted(score.items()))


def _overall(score: dict[str, tuple[int, int]]) -> str:
    found = sum(a for a, _ in score.values())
    total = sum(b for _, b in score.values())
    return f"{found / total:.0%}" if total else "-"


def _empty_checkpoint(prompt: str) -> str:
    """A deliberately poor model: a plausible checkpoint that states nothing."""
    return "## Goal\n- Continue the task.\n\n## Progress\n- Work is ongoing.\n\n## Next Steps\n- Keep going."


def extraction_cost(messages: list[BaseMessage], repeats: int = 5) -> float:
    """Microseconds of fact extraction per compacted message read for the first time (CPU time, best of ``repeats``)."""
    best = float("inf")
    for _ in range(repeats):
        # What a message says is kept once read, by its text and on the message:
        # each repeat reads new message objects with the readings cleared.
        core = to_core_list(messages)
        readings.forget()
        started = time.process_time()
        gather((), core, range(len(core)), ())
        best = min(best, time.process_time() - started)
    return best / len(core) * 1e6


def workloads() -> list[tuple[str, list[BaseMessage], Facts]]:
    out: list[tuple[str, list[BaseMessage], Facts]] = []
    session, facts = coding_session(400)
    out.append(("synthetic 400-turn session", session, facts))
    everything: list[BaseMessage] = []
    all_facts = Facts()
    for seed, transcript in enumerate(load_transcripts().values()):
        planted, planted_facts = planted_transcript(transcript, seed)
        offset = len(everything)
        everything += planted
        for kind, text, index in planted_facts.items:
            all_facts.add(kind, text, index + offset)
    out.append(("six real transcripts, concatenated", everything, all_facts))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("fact_survival.json"))
    args = parser.parse_args()
    options = CompactionOptions(context_window=24_000, reserve_tokens=4_000, keep_recent_tokens=6_000)
    summarizers = {"offline (extractive)": ExtractiveSummarizer(), "poor model (empty checkpoint)": _empty_checkpoint}
    print(f"window {options.context_window}, reserve {options.reserve_tokens}, keep {options.keep_recent_tokens}")
    print("| workload | summarizer | checked facts | compactions | after 1 | after 5 | after 5, by kind |")
    print("|---|---|---|---|---|---|---|")
    figures: dict[str, object] = {}
    for name, messages, planted in workloads():
        for label, summarizer in summarizers.items():
            for check in (False, True):
                # Checked facts on: the default features; off: the defaults without CheckedFacts.
                s = replay(messages, planted, options, summarizer, None if check else [Pins()])
                on = "on" if check else "off"
                print(
                    f"| {name} | {label} | {on} | {s.compactions} | {_overall(s.after_one)} | "
                    f"{_overall(s.after_five)} | {_fmt(s.after_five)} |",
                    flush=True,
                )
                figures[f"{name} / {label} / {on}"] = {
                    "compactions": s.compactions,
                    "after_one": s.after_one,
                    "after_five": s.after_five,
                }
        cost = extraction_cost(messages)
        figures[f"{name} / extraction_us_per_message"] = round(cost, 1)
        print(f"fact extraction on {name}: {cost:.1f} us per compacted message ({len(messages)} messages)")
    args.out.write_text(json.dumps(figures, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
