"""The internal message form the core works on.

Adapters convert framework messages (LangChain's ``BaseMessage``) into these
values once, inbound only. The core never builds framework messages: it returns
indices and text, and each adapter slices its own original list, so the
messages a caller keeps are the caller's objects.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import accumulate, islice
from typing import Any, Literal, TypeVar

_T = TypeVar("_T")

Role = Literal["system", "user", "assistant", "tool", "other"]
"""Who wrote a message. ``other`` covers roles the core has no rule for."""

PartKind = Literal["text", "reasoning", "image", "data", "compaction"]
"""What a content part holds.

``text`` is prose the model reads; ``reasoning`` is thinking text; ``image`` is
an image or other binary attachment (counted at a fixed cost, never
serialized); ``data`` is a structured block the core has no rule for (kept as
its JSON text); ``compaction`` is a provider-side compaction block, which marks
the start of the usable history.
"""


@dataclass(frozen=True, slots=True)
class Part:
    """One content part of a message.

    Attributes:
        kind: What the part holds.
        text: Its text (for ``image`` parts, a short description such as the
            media type; the bytes are never carried).
        tokens: For an ``image`` part, its cost when its content tells it (a
            PDF's pages: ``core.tokens.pdf_tokens``); 0 means one image's
            (``core.tokens.IMAGE_TOKENS``).
        signed: For a ``reasoning`` part, that it is Claude's thinking (a block the
            API wants back, signed, at the start of a tool loop: ``core.cut``).
        unsent: For a ``reasoning`` part, that no request carries it back
            (DeepSeek's, Ollama's and Groq's ``reasoning_content``, kept beside
            the content): shown to the summarizer, not counted.
        known_units: The estimate of ``text`` once made (``core.tokens.part_units``),
            -1 before: a part is counted on the turn it arrives and shown to
            the summarizer later, and its text is not read twice for it.
    """

    kind: PartKind
    text: str
    tokens: int = 0
    signed: bool = False
    unsent: bool = False
    known_units: int = field(default=-1, init=False, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A tool call made by an assistant message.

    Attributes:
        id: The call id the tool result answers (may repeat in real traffic).
        name: The tool's name.
        arguments: The arguments as JSON text.
        known_units: The estimate of ``arguments`` once made
            (``core.tokens.argument_units``), -1 before.
        known_reading: What ``core.calls.read_call`` found in it once read
            (its arguments, key argument, file, program), ``None`` before: a
            call is read at every compaction whose region or kept part holds it.
    """

    id: str | None
    name: str
    arguments: str
    known_units: int = field(default=-1, init=False, compare=False, repr=False)
    known_reading: object = field(default=None, init=False, compare=False, repr=False)


FactKind = Literal[
    "constraint",
    "rule",
    "task",
    "request",
    "earlier",
    "identifier",
    "modified_file",
    "error",
    "done_call",
    "read_file",
    "name",
    "term",
]
"""The kinds of facts a checked summary keeps (see ``core.facts``)."""


@dataclass(frozen=True, slots=True)
class Fact:
    """One thing a continuing agent needs, found in the messages without a model.

    Attributes:
        kind: What it is.
        text: What the context must state (compared after folding case and whitespace).
        key: What a later fact of the same kind replaces it by (a path, a
            command); ``""`` means the text itself.
        detail: Shown beside the text, not checked (the command an error
            came from, the tool a call was made with).
        known_norm: ``text`` as facts are compared, once made
            (``core.lines.compared``), "" before: a fact is compared at
            every compaction that carries it.
    """

    kind: FactKind
    text: str
    key: str = ""
    detail: str = ""
    known_norm: str = field(default="", init=False, compare=False, repr=False)


_READABLE = frozenset({"text", "reasoning"})


@dataclass(frozen=True, slots=True)
class Message:
    """A framework-neutral message.

    Attributes:
        role: Who wrote it.
        parts: Its content, in order.
        tool_calls: Tool calls an assistant message makes.
        tool_call_id: For a tool result, the id of the call it answers.
        name: The tool name of a tool result, or the author name, if known.
        is_summary: True for an earlier summary (this library's, or another
            compactor's such as LangChain's ``SummarizationMiddleware``), and
            for the user turn this library put after one (``label == "bridge"``).
        is_error: True for a tool result that reports a failure.
        label: The original type name when ``role`` is ``other``; ``"bridge"``
            for the user turn after a summary.
        id: The message's id, if it has one.
        reported_tokens: For an assistant reply, the input plus output tokens
            its provider reported for the request that produced it (0 if none).
        kept_from: For a summary, the id of the first message kept after it
            (what it covers ends there), when it was recorded.
        written_after: For a summary, the id of the conversation's last
            message when it was written (``None`` if unknown).
        kept_before: For a summary, the ids of messages from before its cut
            written back after it (they are not covered by it).
        pinned: The user pinned it: never summarized, written back after the
            summary every time. For one of a user turn's ``results``: a block
            sent as it is, with no output a clearing may replace.
        results: For a user turn in Anthropic's block form (what
            ``convert_to_messages`` makes of an Anthropic or Bedrock history),
            its ``tool_result`` blocks, each as a tool result (the call's id,
            the result's content, its error flag): the turn must stay with the
            calls they answer (``answers``), and what they say is a tool's.
            Likewise the blocks langchain-openai sends from a user turn as
            the answers to the Responses API's calls (an
            ``apply_patch_call_output``, an ``mcp_approval_response``, a
            ``tool_search_output``). For an assistant reply, the server tools'
            results it carries for calls an earlier reply made (Claude paused
            its turn after a ``server_tool_use``; this reply continues it):
            it must stay with that reply, and it answers as the model, no
            tool result of its own (``is_result``).
        mark: For a message this library wrote, its mark as stored (the
            conversation record; each feature reads its own key, see
            ``core.record``); empty otherwise.
    """

    role: Role
    parts: tuple[Part, ...] = ()
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None
    is_summary: bool = False
    is_error: bool = False
    label: str = ""
    id: str | None = None
    reported_tokens: int = 0
    written_after: str | None = None
    kept_from: str | None = None
    kept_before: tuple[str, ...] = ()
    pinned: bool = False
    results: tuple[Message, ...] = ()
    mark: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)
    has_compaction_block: bool = field(init=False, default=False)
    """Whether the message carries a provider-side compaction block (derived from ``parts``)."""
    known_body: tuple[str, int] | None = field(init=False, default=None, compare=False, repr=False)
    """Its transcript body and that body's estimate once made (``core.transcript``), ``None`` before:
    a message is shown to the summarizer at every compaction (or preparation) whose region holds it."""
    known_reading: object = field(init=False, default=None, compare=False, repr=False)
    """What checked facts read in it once read (``core.readings.read_once``), ``None`` before: a
    message is read at every compaction whose region or kept part holds it."""

    def __post_init__(self) -> None:
        # Derived once: the trigger looks for the last block on every turn. (A loop, not
        # ``any`` over a generator: made for every message converted, most with one part.)
        for part in self.parts:
            if part.kind == "compaction":
                object.__setattr__(self, "has_compaction_block", True)
                break

    @property
    def text(self) -> str:
        """The message's readable text: text and reasoning parts joined."""
        parts = self.parts
        if len(parts) == 1:  # most messages: read on every compaction, so without a generator
            return parts[0].text if parts[0].kind in _READABLE else ""
        return "\n".join(p.text for p in parts if p.kind in _READABLE)

    @property
    def answers(self) -> tuple[str | None, ...]:
        """The ids of the calls it answers: a tool result's own (``None`` when it names none), or its ``results``'."""
        if self.role == "tool":
            return (self.tool_call_id,)
        return tuple(r.tool_call_id for r in self.results)

    @property
    def asks(self) -> bool:
        """Whether it is a user turn in the user's own words (not one of ``tool_result`` blocks alone).

        Anthropic's rule too: a turn of tool results continues the assistant's
        tool loop; one that also holds the user's text starts a new turn.
        """
        return self.role == "user" and (not self.results or bool(self.text.strip()))

    @property
    def is_result(self) -> bool:
        """Whether it is a tool's side answering calls: a tool's result, or a user turn of ``tool_result`` blocks.

        A reply that continues a paused turn answers a call too (``answers``),
        but as the model: the model is not left to answer it.
        """
        return self.role == "tool" or (self.role == "user" and bool(self.results))

    @property
    def carries_summary(self) -> bool:
        """Whether the message holds an earlier summary's text (a summary, not its bridge)."""
        return self.is_summary and self.label != "bridge"


class Scanned(tuple[Message, ...]):
    """A conversation that knows where its rare messages are: summaries and provider compaction blocks.

    The trigger looks for both on every turn (a summary past the leading
    block, the last compaction block); a history that grows by a few messages
    a turn is scanned once with ``grown``, not whole each time. Immutable, so
    what it knows cannot go stale; a plain sequence is scanned as it comes.

    Example:
        >>> first = Scanned.grown((), 0, [Message("user", (Part("text", "hi"),))])
        >>> later = Scanned.grown(first, 1, [Message("system", is_summary=True)])
        >>> later.summaries, later.blocks
        ((1,), ())
    """

    summaries: tuple[int, ...] = ()
    """Indices of the summaries (and their bridges), in order."""
    blocks: tuple[int, ...] = ()
    """Indices of the messages with a provider-side compaction block, in order."""

    @classmethod
    def grown(cls, previous: Sequence[Message], same: int, added: Sequence[Message]) -> Scanned:
        """``previous``'s first ``same`` messages, then ``added``; scanned past ``same`` if ``previous`` was."""
        out = cls(_joined(previous, same, added))
        known = previous if isinstance(previous, Scanned) else None  # (a plain sequence is scanned whole)
        start = same if known is not None else 0
        summaries = [i for i in known.summaries if i < start] if known is not None else []
        blocks = [i for i in known.blocks if i < start] if known is not None else []
        for index in range(start, len(out)):
            message = out[index]
            if message.is_summary:
                summaries.append(index)
            if message.has_compaction_block:
                blocks.append(index)
        out.summaries, out.blocks = tuple(summaries), tuple(blocks)
        return out


class Counts(tuple[int, ...]):
    """Token counts per message that keep their running sums, so any range is summed at once.

    The trigger sums the whole history on every turn (``core.context``); a
    history that grows by a few messages a turn carries its sums on
    (``grown``), so a turn costs what it adds, not what the conversation
    holds. Immutable, like ``Scanned``: a plain sequence is summed as it comes.

    Example:
        >>> first = Counts.grown((), 0, [3, 4])
        >>> later = Counts.grown(first, 2, [5])
        >>> later, later.span(1), later.span(0, 2)
        ((3, 4, 5), 9, 7)
    """

    _sums: list[int] | None = None
    """``_sums[i]`` is the sum of the first ``i`` counts; it may run on past this tuple (a later read grew it).
    ``None`` for counts made directly (``Counts(values)``): they are summed as they come."""

    @classmethod
    def grown(cls, previous: Sequence[int], same: int, added: Sequence[int]) -> Counts:
        """``previous``'s first ``same`` counts and then ``added``, their sums carried on when ``previous`` has them."""
        out = cls(_joined(previous, same, added))
        # (Counts made directly have no sums: the cache's empty read is one, shared by every
        # conversation, so no read ever grows a list it holds.)
        sums = previous._sums if isinstance(previous, Counts) else None
        with _GROWING:
            # The common turn adds to the newest read's end: its sums grow in
            # place (an older read knows its own length and reads no further).
            if sums is None or len(sums) != same + 1:
                sums = list(accumulate(islice(out, same), initial=0)) if sums is None else sums[: same + 1]
            for count in added:
                sums.append(sums[-1] + count)
        out._sums = sums
        return out

    def span(self, start: int = 0, end: int | None = None) -> int:
        """The sum of ``self[start:end]`` (``start`` and ``end`` at least 0)."""
        sums = self._sums
        if sums is None:
            return sum(self[start:end])
        stop = len(self) if end is None else min(end, len(self))
        return sums[stop] - sums[min(start, stop)]


def _joined(previous: Sequence[_T], same: int, added: Sequence[_T]) -> tuple[_T, ...]:
    """``previous``'s first ``same`` items, then ``added``: tuples joined in C (a copy of each, no more)."""
    head = previous if isinstance(previous, tuple) else tuple(previous)
    return (head if same == len(head) else head[:same]) + tuple(added)


_GROWING = threading.Lock()
"""Held while a ``Counts`` grows its sums in place: two threads growing one read take turns."""


@dataclass(frozen=True, slots=True)
class Preamble:
    """What an agent's requests carry besides the conversation's messages.

    A cache-aligned summary request sends it first, as the agent does, so the
    provider's prompt cache serves the whole prefix.

    Attributes:
        messages: Messages sent before the conversation (a system prompt kept
            outside the state), opaque to the core.
        tools: The tool schemas sent with it, opaque to the core.
        tokens: What the two cost.
    """

    messages: tuple[object, ...] = ()
    tools: tuple[object, ...] = ()
    tokens: int = 0


NO_PREAMBLE = Preamble()
"""The preamble of a conversation whose requests carry nothing besides its messages."""


@dataclass(frozen=True, slots=True)
class SummaryRequest:
    """One call the engine asks its summarizer to make.

    A model-backed summarizer sends ``system`` and ``prompt``; an extractive
    one reads ``messages`` and ``previous_summary`` directly.

    Attributes:
        system: The system prompt for the summarizer.
        prompt: The user prompt: the fenced transcript and the instructions.
        messages: The messages this call covers, in order.
        previous_summary: The running summary this call updates, if any.
        instructions: The caller's custom instructions ("" for none).
        chunk_index: Which chunk of the compacted region this is (0-based).
        chunk_count: How many chunks the region was split into.
        attempt: 0 for the first ask; 1 when the engine asks again after a
            summary failed its check.
        indices: The positions of ``messages`` in the conversation, so a
            summarizer that holds the original list (the cache-aligned mode)
            can send the caller's own messages.
        problem: Why the previous answer to this request could not be used
            (set on a retry, and on a request for the fallback).
        prefix: In the cache-aligned mode, the caller's own messages before
            the cut, unchanged (opaque to the core); a summarizer that can
            sends them followed by ``prefix_prompt`` instead of the
            transcript, so the provider's prompt cache serves the prefix.
        prefix_prompt: The final user message for a ``prefix`` request.
        prefix_tools: The tools the conversation's own requests carry (opaque
            to the core), sent with a ``prefix`` request so the provider's
            prompt cache (tools, then system, then messages) matches it.
        max_tokens: The summary budget in force: an answer over it is
            rejected, so summarizers that can bound themselves should.
        timeout: Seconds the call may take (``CompactionOptions.timeout``);
            a summarizer that can passes it to its client, so a call the
            library stopped waiting for also ends.
    """

    system: str
    prompt: str
    messages: tuple[Message, ...]
    previous_summary: str | None = None
    instructions: str = ""
    chunk_index: int = 0
    chunk_count: int = 1
    attempt: int = 0
    indices: tuple[int, ...] = ()
    problem: str = ""
    prefix: tuple[object, ...] = ()
    prefix_prompt: str = ""
    prefix_tools: tuple[object, ...] = ()
    max_tokens: int = 8192
    timeout: float | None = None

    @property
    def wants_fallback(self) -> bool:
        """True when two answers failed their check: use the fallback, or raise."""
        return self.attempt >= FALLBACK_ATTEMPT


FALLBACK_ATTEMPT = 2
"""``SummaryRequest.attempt`` of a request that asks for the fallback."""


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens a summarizer call was billed, as its provider reported them.

    Attributes:
        input_tokens: Uncached input tokens.
        output_tokens: Output tokens.
        cache_read_input_tokens: Input tokens served from the prompt cache.
        cache_creation_input_tokens: Input tokens written to the prompt cache.
        model: The model that answered, when known.
        stop_reason: Why the model stopped (``"max_tokens"`` means cut short).
        request_id: The provider's request id, for support tickets.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    model: str = ""
    stop_reason: str | None = None
    request_id: str | None = None

    @property
    def total_input_tokens(self) -> int:
        """All input tokens: uncached, cache reads and cache writes."""
        return self.input_tokens + self.cache_read_input_tokens + self.cache_creation_input_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cache_read_input_tokens + other.cache_read_input_tokens,
            self.cache_creation_input_tokens + other.cache_creation_input_tokens,
            model=self.model if self.model == other.model or not other.model else other.model,
        )


@dataclass(frozen=True, slots=True)
class SummaryReply:
    """What a summarizer may return instead of plain text.

    A summarizer that returns a ``str`` is fine; one that knows more (what the
    call was billed, whether it sent the request's ``prefix``) returns this.

    Attributes:
        text: The summary text.
        usage: What the call was billed, if reported.
        covers_prefix: True when the summarizer sent the request's ``prefix``
            (the whole compacted region, cache-aligned), so no further chunk
            is needed.

    Example:
        >>> SummaryReply("## Goal\\n- ship it", Usage(input_tokens=90, output_tokens=8)).usage.output_tokens
        8
    """

    text: str
    usage: Usage | None = None
    covers_prefix: bool = False
