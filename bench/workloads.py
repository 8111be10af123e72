"""Workloads shared by the benchmarks and the fact-survival tests.

``coding_session`` generates a long coding-agent session in which every turn
plants unique facts: a marker in the user request, in the tool call, in the
tool result and in the answer, plus a file path, a user constraint and (every
fifth turn) an error line. Some turns make parallel tool calls whose results
come back in reverse order. ``planted_transcript`` plants the same kinds of
facts into a real transcript without disturbing its tool pairs.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage, messages_from_dict

ROOT = Path(__file__).resolve().parents[1]


def transcripts_dir() -> Path | None:
    """The shared transcripts: ``$LANGCHAIN_COMPACTION_TRANSCRIPTS``, or ``../shared/data/transcripts``."""
    env = os.environ.get("LANGCHAIN_COMPACTION_TRANSCRIPTS")
    candidates = [Path(env)] if env else []
    candidates.append(ROOT.parent / "shared" / "data" / "transcripts")
    return next((p for p in candidates if p.is_dir() and any(p.glob("*.json"))), None)


def load_transcripts() -> dict[str, list[BaseMessage]]:
    """The six shared transcripts, by name ({} when they are not there)."""
    folder = transcripts_dir()
    if folder is None:
        return {}
    return {
        p.stem: messages_from_dict(json.loads(p.read_text(encoding="utf-8"))) for p in sorted(folder.glob("*.json"))
    }


@dataclass
class Facts:
    """Planted facts, each with the index of the message that carries it.

    Attributes:
        items: ``(kind, text, message_index)`` triples.
    """

    items: list[tuple[str, str, int]] = field(default_factory=list)

    def add(self, kind: str, text: str, index: int) -> None:
        self.items.append((kind, text, index))

    def within(self, start: int, stop: int) -> list[tuple[str, str, int]]:
        """Facts carried by messages ``start <= i < stop``."""
        return [f for f in self.items if start <= f[2] < stop]


FILLER = (
    "The handler reads the request, validates the payload against the schema, "
    "and writes the normalized record to the store before it answers. "
)


def coding_session(turns: int, *, filler: int = 2, parallel_every: int = 3) -> tuple[list[BaseMessage], Facts]:
    """A synthetic coding-agent session with planted facts.

    Args:
        turns: Number of user turns.
        filler: Sentences of ordinary prose per message, to give it weight.
        parallel_every: Every n-th turn makes two parallel tool calls.

    Returns:
        The messages (a system prompt first) and the planted facts.
    """
    facts = Facts()
    messages: list[BaseMessage] = [SystemMessage("You are a coding agent. Use the tools; be precise.")]
    for turn in range(turns):
        marker = f"MK{turn:05d}"
        path = f"src/pkg_{turn % 23}/mod_{turn}.py"
        request = (
            f"[{marker}-user] Please fix the bug in {path}. "
            f"Never change the signature of handle_{turn}(). " + FILLER * filler
        )
        facts.add("marker", f"{marker}-user", len(messages))
        facts.add("path", path, len(messages))
        facts.add("constraint", f"Never change the signature of handle_{turn}()", len(messages))
        messages.append(HumanMessage(request, id=f"h{turn}"))
        calls = [
            {"name": "bash", "args": {"command": f"pytest tests/test_{turn}.py -k {marker}-call"}, "id": f"c{turn}a"}
        ]
        if parallel_every and turn % parallel_every == 0:
            calls.append({"name": "read_file", "args": {"path": path}, "id": f"c{turn}b"})
        facts.add("marker", f"{marker}-call", len(messages))
        messages.append(AIMessage(f"I'll run the tests for {path} first.", tool_calls=calls, id=f"a{turn}"))
        for call in reversed(calls):
            failed = turn % 5 == 0 and call["name"] == "bash"
            body = f"[{marker}-result] " + (
                f"FAILED tests/test_{turn}.py::test_handle - ValueError: bad offset {turn * 7}\n"
                if failed
                else "12 passed in 0.4s\n"
            )
            if failed:
                facts.add("error", f"ValueError: bad offset {turn * 7}", len(messages))
            facts.add("marker", f"{marker}-result", len(messages))
            messages.append(
                ToolMessage(
                    body + FILLER * filler, tool_call_id=call["id"], name=call["name"], id=f"t{turn}{call['id']}"
                )
            )
        facts.add("marker", f"{marker}-answer", len(messages))
        messages.append(AIMessage(f"[{marker}-answer] Fixed {path}. " + FILLER * filler, id=f"f{turn}"))
    return messages, facts


def planted_transcript(messages: list[BaseMessage], seed: int = 0) -> tuple[list[BaseMessage], Facts]:
    """Plant facts into a copy of a real transcript, keeping its tool pairs.

    Every human message gets a constraint and a file path appended, except a
    slash command's turn ("/undo" and the harness's answer to it: the user
    writes no rules there); every fourth tool result gets an error line
    appended.

    Args:
        messages: A transcript.
        seed: Makes the planted strings unique across transcripts.

    Returns:
        The planted copy and its facts.
    """
    facts = Facts()
    out: list[BaseMessage] = []
    tools = 0
    for index, message in enumerate(messages):
        command = isinstance(message.content, str) and re.match(r"\s*/[A-Za-z][\w-]*(\s|$)", message.content)
        if isinstance(message, HumanMessage) and isinstance(message.content, str) and not command:
            path = f"/srv/planted_{seed}_{index}/config.yaml"
            constraint = f"Do not delete the cache directory tmp_{seed}_{index}"
            text = f"{message.content}\n\nKeep {path} as it is. {constraint}."
            facts.add("path", path, index)
            facts.add("constraint", constraint, index)
            out.append(message.model_copy(update={"content": text}))
        elif isinstance(message, ToolMessage) and isinstance(message.content, str):
            tools += 1
            if tools % 4 == 0:
                error = f"PlantedError{seed}x{index}: quota exceeded"
                facts.add("error", error, index)
                out.append(message.model_copy(update={"content": f"{message.content}\n{error}"}))
            else:
                out.append(message)
        else:
            out.append(message)
    return out, facts
