"""A LangGraph agent that compacts its own history: ``python examples/langgraph_agent.py``.

Offline (the default) the agent is a scripted tool-calling fake model. With
``ANTHROPIC_API_KEY`` set and ``langchain-anthropic`` installed it is
``ChatAnthropic``, which also writes the summaries. The window is set small on
purpose so a short session goes through several compactions.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

from langchain_compaction import CompactionOptions
from langchain_compaction.graph import COMPACTION_EVENT, CompactionNode, CompactionState, route_after_compaction

TURNS = 80
# A tiny window for the agent; the summarizer may read more than that in one call.
OPTIONS = CompactionOptions(
    context_window=6_000, reserve_tokens=1_500, keep_recent_tokens=1_500, summary_input_tokens=50_000
)


@tool
def lookup(topic: str) -> str:
    """Look up notes on a topic."""
    return f"Notes on {topic}: " + "the service keeps a write-ahead log and replays it on restart. " * 5


class ScriptedModel(GenericFakeChatModel):
    """A fake chat model that can be bound to tools (the fake models lack bind_tools)."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedModel:
        return self


def script() -> Iterator[AIMessage]:
    for turn in range(TURNS):
        call = {"name": "lookup", "args": {"topic": f"subsystem {turn}"}, "id": f"call_{turn}", "type": "tool_call"}
        yield AIMessage(content="", tool_calls=[call])
        yield AIMessage(content=f"Subsystem {turn} recovers by replaying its log; nothing else to change.")


def offline_summary(prompt: str) -> str:
    # A stand-in for a model: real use passes a chat model (or ExtractiveSummarizer()).
    looked_up = prompt.count("(tool call lookup")
    return f"## Goal\n- Review every subsystem's recovery.\n\n## Progress\n- {looked_up} lookups in this part."


def models() -> tuple[Any, Any]:
    if os.environ.get("ANTHROPIC_API_KEY"):
        try:
            from langchain_anthropic import ChatAnthropic
        except ImportError:
            print("ANTHROPIC_API_KEY is set but langchain-anthropic is not installed; running offline")
        else:
            model = ChatAnthropic(model="claude-sonnet-4-5", max_tokens=512)  # type: ignore[call-arg]
            return model, model
    return ScriptedModel(messages=script()), offline_summary


class PrintCompactions(BaseCallbackHandler):
    def __init__(self) -> None:
        self.count = 0

    def on_custom_event(self, name: str, data: Any, **kwargs: Any) -> None:
        if name == COMPACTION_EVENT:
            self.count += 1
            print(
                f"compaction {self.count}: {data['original_tokens']:,} -> {data['compacted_tokens']:,} tokens, "
                f"{data['messages_removed']} messages summarized, {data['messages_kept']} kept, "
                f"{data['summarizer_calls']} summary call(s), forced={data['forced']}"
            )


def build(model: Any, summarizer: Any) -> Any:
    agent = model.bind_tools([lookup])
    builder = StateGraph(CompactionState)
    builder.add_node(
        "compact", CompactionNode(summarizer, OPTIONS, result_key="compaction", enable_compact_command=True)
    )
    builder.add_node("model", lambda state: {"messages": [agent.invoke(state["messages"])]})
    builder.add_node("tools", ToolNode([lookup]))
    builder.add_edge(START, "compact")
    builder.add_conditional_edges("compact", route_after_compaction, ["model", END])
    builder.add_conditional_edges("model", tools_condition, ["tools", END])
    builder.add_edge("tools", "compact")  # compact between tool results and the next model call
    return builder.compile(checkpointer=InMemorySaver())


def main() -> None:
    graph = build(*models())
    printer = PrintCompactions()
    config: Any = {"configurable": {"thread_id": "demo"}, "callbacks": [printer]}
    system = SystemMessage("You review subsystems. Use lookup, then answer in one sentence.")
    for turn in range(TURNS - 1):
        first = [system] if turn == 0 else []
        graph.invoke({"messages": [*first, HumanMessage(f"How does subsystem {turn} recover?")]}, config)
    graph.invoke({"messages": [HumanMessage("/compact keep the list of subsystems reviewed")]}, config)
    state = graph.get_state(config).values
    kinds = [type(m).__name__ for m in state["messages"]]
    print(f"{printer.count} compactions; the thread now holds {len(kinds)} messages: {kinds[:3]} ...")
    print(state["messages"][1].content)


if __name__ == "__main__":
    main()
