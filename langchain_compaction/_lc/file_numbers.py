"""Message counts and positions in a conversation file's own terms, for the command line's figures.

``formats.parse_conversation`` reads some items as several LangChain messages
(an Anthropic user turn holding tool results and text is a ``ToolMessage`` per
result and a ``HumanMessage``; a top-level ``system`` is one or more system
messages, outside the file's ``messages``). The command line plans over the
LangChain messages, but a user reads its figures against the file: these map
the one numbering onto the other (``Conversation.originals``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from langchain_core.messages import BaseMessage

    from langchain_compaction.formats import Conversation

__all__ = ["compacted_figures", "cut_in_file", "file_count", "inspected_figures", "items_among", "written_count"]


def file_count(conversation: Conversation) -> int:
    """How many messages the file holds (its ``messages`` list, or its lines; a top-level ``system`` is not one)."""
    return len({number for number, _ in conversation.originals if number >= 0})


def items_among(conversation: Conversation, indices: Iterable[int]) -> int:
    """How many of the file's messages the LangChain messages at ``indices`` were read from."""
    return len({n for i in indices if (n := conversation.originals[i][0]) >= 0})


def cut_in_file(conversation: Conversation, cut: int) -> tuple[int, bool]:
    """A cut before LangChain message ``cut`` as the file's message number, and whether it falls inside that message.

    Inside: the message's first parts (an Anthropic turn's tool results) are
    summarized and the rest kept.
    """
    originals = conversation.originals
    if cut >= len(originals):
        return file_count(conversation), False
    number = originals[cut][0]
    # (Numbers run 0, 1, ... over the file's messages, the top-level system aside: the index is the number.)
    return max(number, 0), cut > 0 and originals[cut - 1][0] == number >= 0


def inspected_figures(conversation: Conversation, cut: int) -> dict[str, Any]:
    """``inspect``'s count and cut in the file's terms, with LangChain's beside them (``cut``: LangChain's, 0 for none).

    ``cut_index`` is the file's message the cut falls before, or inside
    (``cut_inside_message``: an Anthropic turn's tool results summarized, its
    text kept).
    """
    at, inside = cut_in_file(conversation, cut) if cut else (0, False)
    return {
        "messages": file_count(conversation),
        "langchain_messages": len(conversation.messages),
        "cut_index": at,
        "cut_inside_message": inside,
        "langchain_cut_index": cut,
    }


def compacted_figures(conversation: Conversation, compacted: Sequence[BaseMessage], text: str) -> dict[str, int]:
    """A compaction's message counts in the files' terms: read, removed, kept (whole or in part), and written.

    ``compacted`` keeps the read messages it keeps as the same objects;
    ``text`` is the file written from it.
    """
    kept = {id(m) for m in compacted}
    held = [id(m) in kept for m in conversation.messages]
    return {
        "read": file_count(conversation),
        "removed": items_among(conversation, (i for i, k in enumerate(held) if not k)),
        "kept": items_among(conversation, (i for i, k in enumerate(held) if k)),
        "written": written_count(text, jsonl=conversation.jsonl),
    }


def written_count(text: str, *, jsonl: bool) -> int:
    """How many messages a file written by ``formats.dump_conversation`` holds (a top-level ``system`` aside)."""
    if jsonl:
        return sum(1 for line in text.splitlines() if line.strip())
    items: Any = json.loads(text)
    return len(items["messages"] if isinstance(items, dict) else items)
