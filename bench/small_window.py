"""Small windows: an agent whose system prompt and tools fill much of the window, defaults only.

python bench/small_window.py [--turns N] [--json] [--out PATH]

``create_agent`` with ``CompactionMiddleware`` (an instant summarizer) and a
system prompt plus tool schemas of about 2,100 tokens, at windows 4,096 and
3,000, for ``--turns`` turns of about 120 tokens each (a question and its
answer). Reported per window: summary calls per 100 turns against what the
window allows in theory (the tokens a hundred turns add, divided by threshold
minus landing, the landing taken over what compaction can remove), requests
sent over the window, and the warnings logged (how many, how many distinct).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver

from langchain_compaction import CompactionMiddleware, CompactionOptions
from langchain_compaction.tokens import estimate_message_tokens, estimate_tokens

SYSTEM_PROMPT = "You are a support agent for an airline. " + " ".join(
    f"Rule {n}: check the booking, confirm the passenger's identity and quote the fare rules before any change."
    for n in range(70)
)


def _tools() -> list[Any]:
    made = []
    for n in range(6):

        @tool(f"lookup_{n}", description=f"Look up records of kind {n}: bookings, fares, passengers and flights. " * 4)
        def lookup(query: str, limit: int = 10) -> str:
            return "no records"

        made.append(lookup)
    return made


class Agent(GenericFakeChatModel):
    """Answers every request, and records what it was sent (in the library's token estimate)."""

    sizes: list[int] = []  # noqa: RUF012 (pydantic field)

    def bind_tools(self, tools: Any, **kwargs: Any) -> Agent:
        return self

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any) -> Any:
        self.sizes.append(estimate_message_tokens(messages))
        return super()._generate(messages, stop=stop, run_manager=run_manager, **kw)


class Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def run(window: int, turns: int) -> dict[str, Any]:
    calls = [0]

    def summarizer(prompt: str) -> str:
        calls[0] += 1
        return "## Goal\n- help the passenger with their booking\n\n## Progress\n- looked up the booking"

    options = CompactionOptions(context_window=window)
    model = Agent(messages=iter([AIMessage(f"Answer {n}: " + "the fare rules allow it. " * 10) for n in range(turns)]))
    model.sizes = []
    middleware = CompactionMiddleware(summarizer, options)
    graph = create_agent(
        model, tools=_tools(), system_prompt=SYSTEM_PROMPT, middleware=[middleware], checkpointer=InMemorySaver()
    )
    warnings = Warnings()
    logger = logging.getLogger("langchain_compaction")
    logger.addHandler(warnings)
    try:
        for n in range(turns):
            question = HumanMessage(f"Question {n}: can I change the date of my flight? " + "details " * 20)
            graph.invoke({"messages": [question]}, {"configurable": {"thread_id": f"w{window}"}})
    finally:
        logger.removeHandler(warnings)
    config = {"configurable": {"thread_id": f"w{window}"}}
    overhead = graph.get_state(config).values.get("compaction_overhead_tokens", 0)  # as the middleware counted it
    budget = options.budget
    added = estimate_tokens("Question 0: can I change the date of my flight? " + "details " * 20) + estimate_tokens(
        "Answer 0: " + "the fare rules allow it. " * 10
    )
    fixed = overhead
    threshold = budget.threshold or window
    landing = fixed + (threshold - fixed) // 2
    theory = 100 * added / max(threshold - landing, 1) if threshold > fixed else 0.0
    return {
        "window": window,
        "fixed_tokens": fixed,
        "summary_calls_per_100_turns": round(100 * calls[0] / turns, 1),
        "theory_per_100_turns": round(theory, 1),
        # what the model was sent: the messages (the system prompt among them) and the tool schemas
        "requests_over_window": sum(1 for s in model.sizes if s + overhead - estimate_tokens(SYSTEM_PROMPT) > window),
        "requests": len(model.sizes),
        "warnings": len(warnings.messages),
        "distinct_warnings": len({m.split(":")[0] for m in warnings.messages}),
        "warning_texts": sorted(set(warnings.messages)),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("small_window.json"), help="with --json")
    args = parser.parse_args()
    figures = [run(window, args.turns) for window in (4_096, 3_000)]
    print("| window | fixed part | summary calls per 100 turns | in theory | requests over the window | warnings |")
    print("|---|---|---|---|---|---|")
    for f in figures:
        print(
            f"| {f['window']:,} | {f['fixed_tokens']:,} | {f['summary_calls_per_100_turns']} "
            f"| {f['theory_per_100_turns']} | {f['requests_over_window']} of {f['requests']} "
            f"| {f['warnings']} ({f['distinct_warnings']} distinct) |"
        )
        for text in f["warning_texts"]:
            print(f"  warned: {text}")
    if args.json:
        args.out.write_text(json.dumps(figures, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
