"""How many planted facts survive one and five successive offline compactions.

Run: python bench/fact_survival.py

For each workload it replays the conversation, compacting with the offline
ExtractiveSummarizer whenever ``should_compact`` fires, and checks which planted
facts (user constraints, file paths, error lines, per-turn markers) of the
compacted messages appear verbatim in the summary after the first compaction
and after the fifth.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from langchain_core.messages import AIMessage, BaseMessage

from bench.workloads import Facts, coding_session, load_transcripts, planted_transcript
from langchain_compaction import CompactionOptions, compact, should_compact
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


def replay(messages: list[BaseMessage], facts: Facts, options: CompactionOptions, summarizer=None) -> Survival:
    """Replay ``messages`` with auto-compaction; score after the 1st and 5th compaction."""
    summarizer = summarizer or ExtractiveSummarizer()
    state: list[BaseMessage] = []
    positions: list[int] = []  # original index of each state message (-1 for summaries)
    compacted: list[tuple[str, str, int]] = []
    first: dict[str, tuple[int, int]] = {}
    fifth: dict[str, tuple[int, int]] = {}
    count = 0
    for index, message in enumerate(messages):
        if isinstance(message, AIMessage) and should_compact(state, options.context_window, options.reserve_tokens):
            result, new_state = compact(summarizer, state, options)
            if result is not None:
                count += 1
                removed = {p for p in positions[: result.cut_index] if p >= 0}
                compacted += [f for f in facts.items if f[2] in removed]
                kept = {id(m) for m in new_state}
                positions = [-1 if id(m) not in kept else p for m, p in zip(state, positions)]
                lookup = dict(zip((id(m) for m in state), positions))
                state = new_state
                positions = [lookup.get(id(m), -1) for m in state]
                if count == 1:
                    first = _score(result.summary, compacted)
                if count == 5:
                    fifth = _score(result.summary, compacted)
        state.append(message)
        positions.append(index)
    return Survival(first, fifth, count)


def _fmt(score: dict[str, tuple[int, int]]) -> str:
    if not score:
        return "-"
    return ", ".join(f"{k} {a}/{b} ({a / b:.0%})" for k, (a, b) in sorted(score.items()))


def main() -> None:
    options = CompactionOptions(context_window=24_000, reserve_tokens=4_000, keep_recent_tokens=6_000)
    workloads: list[tuple[str, list[BaseMessage], Facts]] = []
    session, facts = coding_session(400)
    workloads.append(("synthetic 400-turn session", session, facts))
    everything: list[BaseMessage] = []
    all_facts = Facts()
    for seed, transcript in enumerate(load_transcripts().values()):
        planted, planted_facts = planted_transcript(transcript, seed)
        offset = len(everything)
        everything += planted
        for kind, text, index in planted_facts.items:
            all_facts.add(kind, text, index + offset)
    workloads.append(("six transcripts, concatenated", everything, all_facts))
    print(f"window {options.context_window}, reserve {options.reserve_tokens}, keep {options.keep_recent_tokens}")
    for name, messages, planted in workloads:
        s = replay(messages, planted, options)
        print(f"{name}: {s.compactions} compactions")
        print(f"  after 1: {_fmt(s.after_one)}")
        print(f"  after 5: {_fmt(s.after_five)}")


if __name__ == "__main__":
    main()
