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
from langchain_compaction.core.tokens import estimate_tokens
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
    """The role label pi's compaction uses (``[User]``, ``[Assistant]``, ...)."""
    label = _ROLE_LABELS.get(message.role)
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
    lines: list[str] = []
    for part in message.parts:
        if part.kind == "text":
            lines.append(part.text)
        elif part.kind == "reasoning":
            lines.append(f"(reasoning) {part.text}")
        elif part.kind == "image":
            lines.append(f"(attachment: {part.text or 'image'})")
        elif part.kind == "compaction":
            lines.append(f"(server-side compaction summary) {part.text}")
        else:
            lines.append(f"(block) {part.text}")
    for call in message.tool_calls:
        lines.append(f"(tool call {call.name}, id {call.id or '-'}) {call.arguments}")
    return "\n".join(line for line in lines if line)


def _header(message: Message, number: int) -> str:
    details = [f"#{number}", role_label(message)]
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


def _shorten(text: str, max_tokens: int) -> tuple[str, int]:
    """``shorten``, also returning the estimate of the result.

    When the text fits (the common case) that is one estimate in all.
    """
    tokens = estimate_tokens(text)
    if tokens <= max_tokens:
        return text, tokens
    keep_chars = max(int(len(text) * max_tokens / tokens) - 80, 200)
    head = keep_chars * 3 // 5
    tail = keep_chars - head
    cut = len(text) - head - tail
    if cut <= 0:
        return text, tokens
    short = f"{text[:head]}\n{CUT_MARKER.format(count=cut)}\n{text[len(text) - tail :]}"
    return short, estimate_tokens(short)


@dataclass(frozen=True, slots=True)
class Block:
    """One message as it appears in a transcript (without its fence).

    Attributes:
        index: The message's position in the conversation.
        header: The label line (number, role, tool details).
        body: The content, possibly shortened.
        tokens: The estimated size of the fenced block.
        shortened: Whether the body was cut to fit.
    """

    index: int
    header: str
    body: str
    tokens: int
    shortened: bool


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
    body = message_body(message)
    short, tokens = _shorten(body, max_tokens)
    header = _header(message, index + 1)
    return Block(
        index=index,
        header=header,
        body=short,
        # Headers are short ASCII labels with digits and punctuation: about
        # one token per two characters, not worth a full estimate each.
        tokens=len(header) // 2 + 1 + tokens + _FENCE_TOKENS,
        shortened=short is not body,
    )


# What the fence lines and separators around one block cost (codes are
# "msg-" and eight hex digits), plus a token of rounding per estimate.
_FENCE_TOKENS = estimate_tokens("<<msg-0f1e2d3c >>\n\n<</msg-0f1e2d3c>>\n\n") + 3


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
