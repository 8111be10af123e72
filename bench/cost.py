"""Issue 7's figures: what each compaction costs, by mode.

Run: python bench/cost.py [--turns N] [--agent-turns N] [--out PATH]   (needs langchain-anthropic, in the test extra)

Three modes on the same sessions, with an instant recording chat model as the
summarizer and ChatAnthropic's own payload builder to see the bytes:

  transcript     the default: a fenced transcript of the compacted messages
  cache_aligned  the conversation's own prefix, then the instruction (``CacheAligned()``)
  clear_first    transcript mode, but old tool outputs are cleared first (``ClearToolOutputs()``)

Per compaction it reports the summarizer's input tokens, how many of them are
a byte-identical prefix of the agent's preceding request (what a prompt cache
can serve), the cache-weighted input cost (fresh input 1.0, cache reads 0.1,
as on Anthropic's price list), and how much of the agent's *next* request is
no longer a prefix of its previous one (its own cache must be rewritten).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from langchain_anthropic import ChatAnthropic
from langchain_anthropic.chat_models import convert_to_anthropic_tool
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, SystemMessage

from bench.workloads import coding_session, load_transcripts
from langchain_compaction import CompactionOptions, auto_compact
from langchain_compaction.features import CacheAligned, ClearToolOutputs, Feature, default_features
from langchain_compaction.tokens import estimate_tokens

SUMMARY = "## Goal\n- continue\n\n## Critical Context\n- (see recent messages)"
READ_PRICE = 0.1
CHAT = ChatAnthropic(model="claude-sonnet-4-5", api_key="x")


class Recording(GenericFakeChatModel):
    inputs: list = []  # noqa: RUF012 - a pydantic field, copied per instance

    def _generate(self, messages, stop=None, run_manager=None, **kwargs):
        self.inputs.append(list(messages))
        return super()._generate(messages, stop=stop, run_manager=run_manager, **kwargs)


def _pieces(messages: list[BaseMessage]) -> list[str]:
    """A request as ChatAnthropic sends it, one JSON string per part, in order."""
    payload = CHAT._get_request_payload(messages)
    system = payload.get("system")
    return [json.dumps(system)] + [json.dumps(m) for m in payload["messages"]]


def _shared_prefix_tokens(previous: list[str], current: list[str]) -> tuple[int, int]:
    """Tokens of ``current`` that are a byte-identical prefix of ``previous``, and its total."""
    shared = 0
    for a, b in zip(previous, current):
        if a != b:
            # A part that differs may still share its beginning (a merged turn).
            common = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            shared += estimate_tokens(b[:common])
            break
        shared += estimate_tokens(b)
    return shared, sum(estimate_tokens(p) for p in current)


@dataclass
class ModeRun:
    mode: str
    compactions: int = 0
    summaries: int = 0
    cleared_only: int = 0
    sent: int = 0
    cached: int = 0
    cost: float = 0.0
    agent_rewrite: int = 0
    per_compaction: list[dict[str, Any]] = field(default_factory=list)


def mode_features(mode: str) -> list[Feature]:
    """The features of a mode: the defaults, plus what the mode changes."""
    extra: dict[str, list[Feature]] = {
        "transcript": [],
        "cache_aligned": [CacheAligned()],
        "clear_first": [ClearToolOutputs()],
    }
    return [*default_features(), *extra[mode]]


def run(mode: str, session: list[BaseMessage], options: CompactionOptions, features: Sequence[Feature]) -> ModeRun:
    model = Recording(messages=iter([AIMessage(SUMMARY)] * 10_000), inputs=[])
    out = ModeRun(mode)
    state: list[BaseMessage] = []
    for message in session:
        if isinstance(message, AIMessage) and state:
            seen = len(model.inputs)
            result, new_state = auto_compact(model, state, options, features=features)
            if result is not None:
                out.compactions += 1
                before = _pieces(state)
                sent = cached = 0
                for request in model.inputs[seen:]:
                    shared, total = _shared_prefix_tokens(before, _pieces(request))
                    sent += total
                    cached += shared
                out.summaries += 1 if result.summarizer_calls else 0
                cleared = result.part("clearing").get("cleared", 0)
                out.cleared_only += 1 if cleared else 0
                out.sent += sent
                out.cached += cached
                out.cost += (sent - cached) + cached * READ_PRICE
                after = _pieces(new_state)
                shared, total = _shared_prefix_tokens(before, after)
                out.agent_rewrite += total - shared
                out.per_compaction.append({"sent": sent, "cached": cached, "cleared": cleared})
                state = new_state
        state.append(message)
    return out


class ToolRecording(Recording):
    """The agent's own model: binds tools as a real one does; every request it gets is recorded."""

    def bind_tools(self, tools, **kwargs):
        return self.bind(tools=[convert_to_anthropic_tool(t) for t in tools])

    def _generate(self, messages, stop=None, run_manager=None, **kwargs):
        self.inputs.append((list(messages), kwargs.get("tools") or []))
        return GenericFakeChatModel._generate(self, messages, stop=stop, run_manager=run_manager, **kwargs)


def _agent_pieces(messages: list[BaseMessage], tools: list) -> list[str]:
    """A request with tools as ChatAnthropic sends it: tools, then system, then the messages."""
    payload = CHAT._get_request_payload(messages, tools=tools)
    return [json.dumps(payload.get("tools")), json.dumps(payload.get("system"))] + [
        json.dumps(m) for m in payload["messages"]
    ]


def run_agent(mode: str, turns: int = 60) -> ModeRun:
    """create_agent with a system prompt, three tools and the middleware; the summarizer is the agent's model."""
    from langchain.agents import create_agent
    from langchain_core.messages import HumanMessage
    from langchain_core.tools import tool

    from langchain_compaction import CompactionMiddleware

    @tool
    def read_file(path: str) -> str:
        """Read a file of the repository."""
        return path

    @tool
    def run_tests(selection: str) -> str:
        """Run the test suite, or a selection of it."""
        return selection

    @tool
    def edit_file(path: str, old: str, new: str) -> str:
        """Replace text in a file."""
        return path

    replies = [AIMessage(SUMMARY if i % 7 == 6 else f"Step {i}: done. " + "details " * 300) for i in range(10_000)]
    model = ToolRecording(messages=iter(replies), inputs=[])
    options = CompactionOptions(context_window=24_000)
    middleware = CompactionMiddleware(model, options, features=mode_features(mode))
    agent = create_agent(
        model, tools=[read_file, run_tests, edit_file], system_prompt=SYSTEM_PROMPT, middleware=[middleware]
    )
    out = ModeRun(f"agent/{mode}")
    state: list[BaseMessage] = []
    for turn in range(turns):
        seen = len(model.inputs)
        state = agent.invoke({"messages": [*state, HumanMessage(f"Turn {turn}: " + "please continue " * 200)]})[
            "messages"
        ]
        summaries = [(m, t) for m, t in model.inputs[seen:] if _is_summary_request(m)]
        if not summaries:
            continue
        previous = next(r for r in reversed(model.inputs[:seen]) if not _is_summary_request(r[0]))
        before = _agent_pieces(*previous)
        out.compactions += 1
        out.summaries += 1
        for messages, tools in summaries:
            shared, total = _shared_prefix_tokens(before, _agent_pieces(messages, tools))
            out.sent += total
            out.cached += shared
            out.cost += (total - shared) + shared * READ_PRICE
    return out


def _is_summary_request(messages: list[BaseMessage]) -> bool:
    last = messages[-1].content if messages else ""
    text = last if isinstance(last, str) else json.dumps(last)
    return "checkpoint summary" in text or "context checkpoint" in text


SYSTEM_PROMPT = "You are a careful coding agent. Read before you edit; run the tests after every change. " * 20


def workloads(turns: int = 600) -> list[tuple[str, list[BaseMessage], CompactionOptions]]:
    session, _ = coding_session(turns)
    transcripts: list[BaseMessage] = [SystemMessage("You are a careful software agent.")]
    for messages in load_transcripts().values():
        transcripts += [m for m in messages if not isinstance(m, SystemMessage)]
    return [
        (f"synthetic {turns}-turn session", session, CompactionOptions(context_window=200_000)),
        (
            "six real transcripts",
            transcripts,
            CompactionOptions(context_window=24_000, reserve_tokens=4_000, keep_recent_tokens=6_000),
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=600, help="turns of the synthetic session")
    parser.add_argument("--agent-turns", type=int, default=60, help="turns of the create_agent run")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "cost.json")
    args = parser.parse_args()
    print(
        "| workload | mode | compactions (summaries) | summarizer input tokens | of which a cached prefix | cache-weighted input cost | agent request tokens to re-cache |"
    )
    print("|---|---|---|---|---|---|---|")
    results = {}
    for name, session, base in workloads(args.turns):
        for mode in ("transcript", "cache_aligned", "clear_first"):
            options = CompactionOptions(
                context_window=base.context_window,
                reserve_tokens=base.reserve_tokens,
                keep_recent_tokens=base.keep_recent_tokens,
            )
            r = run(mode, session, options, mode_features(mode))
            results[f"{name}/{mode}"] = r.__dict__
            share = r.cached / r.sent if r.sent else 0.0
            print(
                f"| {name} | {mode} | {r.compactions} ({r.summaries}) | {r.sent:,} | {r.cached:,} ({share:.0%}) "
                f"| {r.cost:,.0f} | {r.agent_rewrite:,} |",
                flush=True,
            )
    for mode in ("transcript", "cache_aligned"):
        # create_agent: the agent's requests carry a system prompt and tools; a
        # cache-aligned summary request sends them too. The saving holds only
        # when the summarizer is the agent's own model (a cache is per model).
        r = run_agent(mode, args.agent_turns)
        results[f"create_agent, summarizer = the agent's model/{mode}"] = r.__dict__
        share = r.cached / r.sent if r.sent else 0.0
        print(
            f"| create_agent, {args.agent_turns} turns, summarizer = the agent's model | {mode} | {r.compactions} ({r.summaries}) "
            f"| {r.sent:,} | {r.cached:,} ({share:.0%}) | {r.cost:,.0f} | |",
            flush=True,
        )
    args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
