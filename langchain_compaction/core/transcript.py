"""What the summarizer reads: a fenced, role-labelled transcript.

Each message becomes a block that opens and closes with a marker line carrying
a code computed so that it occurs in no message of the request. Content cannot
close or forge a block: a message that contains a fake ``[User]:`` line, a
closing marker of another request, or a fake previous-summary block stays
inside its own block. Unlike pi's compaction, which serialized text parts only,
tool calls (name and arguments) and tool results are written out too.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from langchain_compaction.core.effects import breathe
from langchain_compaction.core.lines import one_line
from langchain_compaction.core.tokens import UNITS, argument_units, estimate_tokens, estimate_units, part_units
from langchain_compaction.core.types import Message

_ROLE_LABELS = {
    "user": "[User]",
    "assistant": "[Assistant]",
    "tool": "[Tool result]",
    "system": "[System]",
}

CUT_MARKER = "[... {count:,} characters of this message cut here: head and tail kept ...]"
"""Stands where an oversize message was shortened in the transcript."""


def role_label(message: Message) -> str:
    """The role label pi's compaction uses (``[User]``, ``[Assistant]``, ...).

    A user turn of ``tool_result`` blocks alone is a tool result: what it says is no user's words.
    """
    label = _ROLE_LABELS.get("tool" if message.is_result and not message.asks else message.role)
    if label is not None:
        return label
    return f"[{message.label or message.role}]"


def message_body(message: Message) -> str:
    """Everything of a message the summarizer should read, as text.

    Args:
        message: The message.

    Returns:
        Its text, reasoning, structured blocks, image placeholders and tool
        calls, in order.
    """
    return _body(message)[0]


_LINE_PREFIX = {"reasoning": "(reasoning) ", "compaction": "(server-side compaction summary) ", "data": "(block) "}
_NEWLINE_UNITS = estimate_units("\n")
BLANK_LINE_UNITS = estimate_units("\n\n")
"""What the blank line that joins two pieces of a request costs, in ``estimate_units``."""


def _body(message: Message) -> tuple[str, int]:
    """``message_body`` and its ``estimate_units``, added up from the parts' own (known once counted), kept."""
    known = message.known_body
    if known is None:
        known = _made_body(message)
        object.__setattr__(message, "known_body", known)
    return known


def _made_body(message: Message) -> tuple[str, int]:
    lines: list[str] = []
    units = 0
    for part in message.parts:
        if part.kind in ("text", "reasoning") and not part.text:
            continue  # an empty line (Claude's thinking with no text shown: redacted, omitted) is left out
        if part.kind == "image":
            line = f"(attachment: {part.text or 'image'})"
            lines.append(line)
            units += estimate_units(line)
            continue
        # Every prefix ends in a space, which no estimate reads across: the
        # line costs the prefix plus the part.
        prefix = "" if part.kind == "text" else _LINE_PREFIX.get(part.kind, "(block) ")
        lines.append(prefix + part.text)
        units += estimate_units(prefix) + part_units(part)
    for call in message.tool_calls:
        label = f"(tool call {call.name}, id {call.id or '-'}) "
        lines.append(label + call.arguments)
        units += estimate_units(label) + argument_units(call)
    for result in message.results:  # (a user turn's tool_result blocks: each the tool's output, with its call)
        label = f"(tool result, call {result.tool_call_id}{', status=error' if result.is_error else ''})\n"
        body, body_units = _body(result)
        lines.append(label + body)
        units += estimate_units(label) + body_units
    return "\n".join(lines), units + _NEWLINE_UNITS * max(len(lines) - 1, 0)


def _header(message: Message, number: int) -> str:
    details = [f"#{number}", role_label(message)]
    if message.role in ("user", "assistant") and message.name:
        details.append(f"name={one_line(message.name, 80)}")  # two users in one chat, a supervisor's agents
    if message.role == "tool":
        if message.name:
            details.append(f"tool={message.name}")
        if message.tool_call_id:
            details.append(f"call={message.tool_call_id}")
        if message.is_error:
            details.append("status=error")
    return " ".join(details)


def make_fence(texts: Iterable[str]) -> str:
    """A marker code that occurs in none of ``texts``.

    Deterministic for the same input (so identical requests stay identical for
    provider prompt caches), and checked against every text.

    Args:
        texts: Everything the request will contain.

    Returns:
        A short code such as ``"msg-3fa9c21e"``.
    """
    joined = "\x00".join(texts)
    digest = hashlib.blake2b(joined.encode("utf-8", "surrogatepass"), digest_size=8)
    salt = 0
    while True:
        code = "msg-" + digest.hexdigest()[:8]
        if code not in joined:
            return code
        salt += 1
        digest.update(salt.to_bytes(4, "little"))


def shorten(text: str, max_tokens: int) -> str:
    """Shorten ``text`` to about ``max_tokens``, keeping its head and tail.

    The cut is marked with ``CUT_MARKER`` and the number of characters cut.

    Args:
        text: The text.
        max_tokens: The budget.

    Returns:
        ``text`` itself if it fits, else head + marker + tail.
    """
    return _shorten(text, max_tokens)[0]


def _shorten(text: str, max_tokens: int, units: int | None = None) -> tuple[str, int]:
    """``shorten``, also returning the ``estimate_units`` of the result.

    ``units`` is the text's own when known: when the text fits (the common
    case) nothing more is estimated.
    """
    if units is None:
        units = estimate_units(text)
    tokens = units // UNITS
    if tokens <= max_tokens:
        return text, units
    keep_chars = max(int(len(text) * max_tokens / tokens) - 80, 200)
    head = keep_chars * 3 // 5
    tail = keep_chars - head
    cut = len(text) - head - tail
    if cut <= 0:
        return text, units
    short = f"{text[:head]}\n{CUT_MARKER.format(count=cut)}\n{text[len(text) - tail :]}"
    return short, estimate_units(short)


@dataclass(frozen=True, slots=True)
class Block:
    """One message as it appears in a transcript (without its fence).

    Attributes:
        index: The message's position in the conversation.
        header: The label line (number, role, tool details).
        body: The content, possibly shortened.
        tokens: The estimated size of the fenced block.
        shortened: Whether the body was cut to fit.
        units: The body's ``estimate_units`` (``rendered_units`` adds the
            header and the fence).
    """

    index: int
    header: str
    body: str
    tokens: int
    shortened: bool
    units: int = 0


def make_block(message: Message, index: int, *, max_tokens: int) -> Block:
    """Turn one message into a transcript block, shortening it if oversize.

    Args:
        message: The message.
        index: Its position in the conversation (shown 1-based).
        max_tokens: The largest body a block may have.

    Returns:
        The block.
    """
    breathe()  # called per message: on the worker thread, let the event loop in
    body, units = _body(message)
    short, units = _shorten(body, max_tokens, units)
    header = _header(message, index + 1)
    return Block(
        index=index,
        header=header,
        body=short,
        # Headers are short ASCII labels with digits and punctuation: about
        # one token per two characters, as a budget.
        tokens=len(header) // 2 + 1 + units // UNITS + _FENCE_TOKENS,
        shortened=short is not body,
        units=units,
    )


# What the fence lines and separators around one block cost (codes are
# "msg-" and eight hex digits), plus a token of rounding per estimate.
_FENCE_TOKENS = estimate_tokens("<<msg-0f1e2d3c >>\n\n<</msg-0f1e2d3c>>\n\n") + 3


def rendered_units(blocks: Sequence[Block], fence: str) -> int:
    """``estimate_units(render(blocks, fence))``, added up from the blocks' own."""
    if not blocks:
        return 0
    # A block is its fence lines, header and body; blocks are joined by a
    # blank line. No estimate reads across the line breaks, spaces and
    # brackets that join them, so the pieces add up exactly. (The headers
    # are estimated in one text, a line each, and the line breaks taken off.)
    per_block = estimate_units(f"<<{fence} >>\n\n<</{fence}>>")
    headers = estimate_units("\n".join(b.header for b in blocks)) - _NEWLINE_UNITS * (len(blocks) - 1)
    return sum(b.units for b in blocks) + headers + per_block * len(blocks) + BLANK_LINE_UNITS * (len(blocks) - 1)


def render(blocks: Sequence[Block], fence: str) -> str:
    """Render blocks as the fenced transcript.

    Args:
        blocks: The blocks, in conversation order.
        fence: A code from ``make_fence`` that occurs in no block.

    Returns:
        The transcript text.
    """
    out: list[str] = []
    for block in blocks:
        out.append(f"<<{fence} {block.header}>>\n{block.body}\n<</{fence}>>")
    return "\n\n".join(out)


def render_previous_summary(summary: str, fence: str) -> str:
    """Fence the previous summary the way messages are fenced."""
    return f"<<{fence} previous-summary>>\n{summary}\n<</{fence}>>"
