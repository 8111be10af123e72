"""Shared fixtures: the six real agent transcripts and a recording summarizer."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from langchain_core.messages import BaseMessage, messages_from_dict


def _find_transcripts() -> Path:
    # The shared folder sits beside the checkout (../shared); CI lays it out the same way.
    env = os.environ.get("LANGCHAIN_COMPACTION_TRANSCRIPTS")
    candidates = [Path(env)] if env else []
    root = Path(__file__).resolve().parents[1]
    candidates += [root.parent / "shared" / "data" / "transcripts", root / "tests" / "data" / "transcripts"]
    for path in candidates:
        if path.is_dir() and any(path.glob("*.json")):
            return path
    msg = f"the shared transcripts were not found in any of {[str(c) for c in candidates]}"
    raise FileNotFoundError(msg)


TRANSCRIPTS_DIR = _find_transcripts()
TRANSCRIPT_NAMES = sorted(p.stem for p in TRANSCRIPTS_DIR.glob("*.json"))


def load_transcript(name: str) -> list[BaseMessage]:
    """Load one shared transcript as LangChain messages (fresh objects each call)."""
    data = json.loads((TRANSCRIPTS_DIR / f"{name}.json").read_text(encoding="utf-8"))
    return messages_from_dict(data)


@pytest.fixture(params=TRANSCRIPT_NAMES)
def transcript(request: pytest.FixtureRequest) -> list[BaseMessage]:
    """Each of the six real transcripts in turn."""
    return load_transcript(request.param)


class RecordingSummarizer:
    """A plain-callable summarizer that records every prompt it is given."""

    def __init__(self, reply: str = "## Goal\n- continue the work\n\n## Critical Context\n- (none)") -> None:
        self.reply = reply
        self.prompts: list[str] = []

    def __call__(self, prompt: str) -> str:
        self.prompts.append(prompt)
        return self.reply


@pytest.fixture
def recorder() -> RecordingSummarizer:
    return RecordingSummarizer()
