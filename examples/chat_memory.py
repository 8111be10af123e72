"""Compacting chat memory, offline: a file-backed history that summarizes itself.

Run: python examples/chat_memory.py
"""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path

from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import HumanMessage, SystemMessage

from langchain_compaction.core.options import CompactionOptions
from langchain_compaction.history import CompactingChatMessageHistory, FileLock

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # langchain-community is being sunset
    from langchain_community.chat_message_histories import FileChatMessageHistory


def main() -> None:
    folder = Path(tempfile.mkdtemp())
    chat = FakeListChatModel(responses=["Sure, noted." * 5])
    summarizer = FakeListChatModel(
        responses=["## Goal\n- plan a trip to Lisbon\n\n## Critical Context\n- budget 900 EUR"]
    )
    history = CompactingChatMessageHistory(
        FileChatMessageHistory(str(folder / "chat.json")),
        summarizer,
        CompactionOptions(context_window=2000, reserve_tokens=500, keep_recent_tokens=400),
        archive=FileChatMessageHistory(str(folder / "archive.json")),
        lock=FileLock(folder / "chat.lock"),  # only needed when several processes share the file
    )
    history.add_messages([SystemMessage("You are a travel assistant.")])
    for turn in range(30):
        question = HumanMessage(f"Turn {turn}: more about the Lisbon trip, budget 900 EUR. " * 3)
        reply = chat.invoke([*history.messages, question])
        history.add_messages([question, reply])
    messages = history.messages
    print(f"{len(messages)} messages in the store; {len(history.archive.messages)} archived")  # type: ignore[union-attr]
    print(messages[1].content.splitlines()[0])


if __name__ == "__main__":
    main()
