"""The summary flow: which requests a compaction sends, as a pure generator.

``compaction_flow`` yields one ``SummaryRequest`` per summarizer call and
receives each answer (a ``SummaryReply``) back; it never calls a model, so the
sync and async drivers (``core.engine``) share every line of it.

A region larger than the summarizer's input budget is summarized in chunks,
each updating the running summary, so every compacted message is shown to the
summarizer (LangChain's ``SummarizationMiddleware`` shows only the last 4,000
tokens). A single oversize message is shortened in the transcript, head and
tail kept, with a marker saying how much was cut. Each answer is checked
(``review_summary``); a rejected one is asked for once more with the problem
stated, then handed to the driver's fallback.

The transcript blocks are built when the flow is created, not when it is first
advanced: an async adapter creates it in a worker thread, and advancing it on
the event loop then only renders prompts.
"""

from __future__ import annotations

import itertools
from collections.abc import Generator, Sequence
from dataclasses import dataclass, replace

from langchain_compaction.core import prompts
from langchain_compaction.core.cut import valid_boundaries
from langchain_compaction.core.layout import echoes_prompt, summary_body
from langchain_compaction.core.options import CompactionOptions
from langchain_compaction.core.plan import Plan
from langchain_compaction.core.redact import apply_redactor, redact_message
from langchain_compaction.core.tokens import UNITS, estimate_tokens, estimate_units
from langchain_compaction.core.transcript import (
    BLANK_LINE_UNITS,
    Block,
    make_block,
    make_fence,
    render,
    render_previous_summary,
    rendered_units,
    shorten,
)
from langchain_compaction.core.types import FALLBACK_ATTEMPT, Message, Preamble, SummaryReply, SummaryRequest
from langchain_compaction.errors import SummarizationError

# No message is shortened below this, however small the budget.
_MIN_MESSAGE_TOKENS = 256

SummaryFlow = Generator[SummaryRequest, SummaryReply, "Outcome"]
"""What ``compaction_flow`` returns: requests out, replies in, the outcome at the end."""


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the flow produced.

    Attributes:
        summary: The final summary text (no header).
        calls: Summarizer calls made.
        chunks: Chunks the region was split into.
        input_tokens: Estimated tokens sent over all calls (in the
            cache-aligned mode, the prefix as sent).
        shortened: Messages shortened in the transcript.
        updated_previous: Whether a previous summary was updated.
        until: When a later chunk's summary failed, the index of the first
            message the summary does not cover (the chunks before it are
            kept, the rest stays verbatim); ``None`` when it covers the region.
        failure: That chunk's error.
    """

    summary: str
    calls: int
    chunks: int
    input_tokens: int
    shortened: int
    updated_previous: bool
    until: int | None = None
    failure: SummarizationError | None = None


def instructions_text(options: CompactionOptions, updating: bool) -> str:
    """The instructions after the transcript: write a summary, or update one."""
    if updating:
        if options.update_prompt is not None:
            return options.update_prompt
        if options.summary_prompt is not None:
            return prompts.UPDATE_PREFIX + "\n\n" + options.summary_prompt
        return prompts.UPDATE_PROMPT
    return options.summary_prompt or prompts.CHECKPOINT_PROMPT


def review_summary(text: str, options: CompactionOptions, required: Sequence[str] = ()) -> str:
    """Why ``text`` cannot be used as the summary ("" when it can).

    Args:
        text: A summarizer's answer.
        options: The options in force (the summary budget).
        required: Headings the answer must have (``features.RequireSections``).

    Returns:
        The problem, phrased for the summarizer, or ``""``.
    """
    budget = options.budget.summary_max
    size = estimate_tokens(text)
    if size > budget:
        return f"it has about {size} tokens, {_TOO_LONG} of {budget}; write it shorter"
    if not text.strip():
        return "it has no text (a tool call, or nothing); answer with the summary itself, as text"
    if echoes_prompt(text):
        return "it only repeats the instructions or the template (headings, placeholders); write the summary itself"
    if required:
        lines = {
            line.strip().lstrip("#").strip().lower() for line in text.splitlines() if line.lstrip().startswith("#")
        }
        missing = [h for h in required if h.lstrip("#").strip().lower() not in lines]
        if missing:
            return f"{_LACKING}: " + ", ".join(missing)
    return ""


_TOO_LONG = "more than the summary budget"
_LACKING = "it lacks these headings"


def relief(problem: str) -> str:
    """What else may help a summary rejected twice for ``problem`` (``review_summary``'s)."""
    if _TOO_LONG in problem:
        return "or relax summary_max_tokens"
    if _LACKING in problem:
        return "or ask for fewer headings (RequireSections(headings=...))"
    return "or use a stronger summarizer model"


def _next_chunk(start: int, room: int, tokens: Sequence[int], plan: _Plan) -> int:
    """Where the chunk that starts at block ``start`` ends: blocks packed greedily within ``room`` tokens.

    Blocks go in units that no chunk boundary splits where the cut may not
    (``_Plan``); a unit over ``room`` alone is split block by block. Only this
    chunk's blocks are read.
    """
    end, used, count = start, 0, len(tokens)
    while end < count:
        stop = plan.unit_end[end]
        size = plan.before[stop] - plan.before[end]
        if size <= room:
            if used and used + size > room:
                return end
            used += size
        else:
            for at in range(end, stop):
                if used and used + tokens[at] > room:
                    return at
                used += tokens[at]
        end = stop
    return end


@dataclass(frozen=True, slots=True)
class _Plan:
    """How a region's blocks may be chunked, read once for all its chunks.

    A chunk that ended between an assistant's calls and their results would
    show one request calls with no result and the next results of no call: a
    summarizer then reports finished work as pending. So blocks go in units
    that end only where the cut may (``core.cut``'s rule).

    Attributes:
        unit_end: For each block, where the unit that starts at it ends (the
            next block a cut may precede).
        before: The tokens of the blocks before each position (``before[i]``
            for ``blocks[:i]``).
    """

    unit_end: list[int]
    before: list[int]

    @classmethod
    def of(cls, tokens: Sequence[int], starts: Sequence[bool]) -> _Plan:
        """The plan of blocks costing ``tokens``, ``starts[i]`` when a cut may precede block ``i``."""
        count = len(tokens)
        unit_end = [count] * count
        following = count
        for i in range(count - 1, -1, -1):
            unit_end[i] = following
            if starts[i]:
                following = i
        return cls(unit_end, [0, *itertools.accumulate(tokens)])


@dataclass(frozen=True, slots=True)
class _Setup:
    """Everything about a compaction's requests that does not change between chunks."""

    options: CompactionOptions
    instructions: str
    extra: str
    system: str
    system_tokens: int
    fixed_prompt: int
    budget: int
    summary_cap: int
    per_message: int
    blocks: list[Block]
    shown: dict[int, Message]
    valid: list[bool]
    required: tuple[str, ...]
    reserved: int
    previous: str | None
    prefix: tuple[object, ...]
    prefix_tools: tuple[object, ...]
    prefix_tokens: int

    @property
    def fixed(self) -> int:
        return self.system_tokens + self.fixed_prompt


def _shown(
    messages: Sequence[Message], plan: Plan, region: Sequence[int], options: CompactionOptions
) -> tuple[dict[int, Message], str | None]:
    """What the summarizer is shown of the region, and the previous summary's text, through the redactor."""
    parts = [
        summary_body(messages[i].text, messages[i].mark) for i in plan.previous_summaries if messages[i].carries_summary
    ]
    previous = "\n\n".join(p for p in parts if p) or None
    redactor = options.redact
    # Everything the summarizer sees goes through the redactor; the caller's
    # messages are not touched.
    shown = {i: redact_message(messages[i], redactor) if redactor else messages[i] for i in region}
    if redactor is not None and previous is not None:
        previous = apply_redactor(redactor, previous)
    return shown, previous


def _setup(
    messages: Sequence[Message],
    plan: Plan,
    options: CompactionOptions,
    instructions: str,
    *,
    originals: Sequence[object],
    counts: Sequence[int],
    preamble: Preamble | None,
    required: tuple[str, ...],
    reserved: int,
) -> _Setup:
    system = options.system_prompt or prompts.SYSTEM_PROMPT
    region = [i for i in plan.region if not messages[i].is_summary]
    shown, previous = _shown(messages, plan, region, options)
    if instructions and options.redact is not None:
        # The caller's instructions (a "/compact ..." a user typed) go to the summarizer too.
        instructions = apply_redactor(options.redact, instructions)
    extra = prompts.ADDITIONAL_INSTRUCTIONS + instructions if instructions else ""
    budget = options.budget.summary_input
    longest = max(estimate_tokens(instructions_text(options, True)), estimate_tokens(instructions_text(options, False)))
    fixed_prompt = longest + estimate_tokens(extra) + 64
    system_tokens = estimate_tokens(system)
    fixed = system_tokens + fixed_prompt
    # The running summary may take up to half of what is left; a larger one
    # (a huge previous summary, a long-winded reply) is shortened in the
    # request, head and tail kept, so no request exceeds the budget.
    summary_cap = max((budget - fixed) // 2, _MIN_MESSAGE_TOKENS)
    per_message = max((budget - fixed - summary_cap) // 2, _MIN_MESSAGE_TOKENS)
    prefix: tuple[object, ...] = ()
    prefix_tokens = 0
    if preamble is not None and len(originals) >= plan.cut and sum(counts[: plan.cut]) <= budget - preamble.tokens:
        # The agent's own request, as far as the cut: what it sends besides
        # the conversation (system prompt, tools), then its messages.
        prefix = (*preamble.messages, *originals[: plan.cut])
        prompt_tokens = estimate_tokens(prompts.CACHE_ALIGNED_PROMPT + extra)
        prefix_tokens = preamble.tokens + sum(counts[: plan.cut]) + prompt_tokens
    return _Setup(
        options=options,
        instructions=instructions,
        extra=extra,
        system=system,
        system_tokens=system_tokens,
        fixed_prompt=fixed_prompt,
        budget=budget,
        summary_cap=summary_cap,
        per_message=per_message,
        blocks=[make_block(shown[i], i, max_tokens=per_message) for i in region],
        shown=shown,
        valid=valid_boundaries(messages),
        required=required,
        reserved=reserved,
        previous=previous,
        prefix=prefix,
        prefix_tools=preamble.tools if prefix and preamble is not None else (),
        prefix_tokens=prefix_tokens,
    )


def _request(
    setup: _Setup, chunk: Sequence[Block], shown: str | None, number: int, planned: int
) -> tuple[SummaryRequest, int]:
    """The request for one chunk, and the tokens its text sends."""
    texts = [b.body for b in chunk] + [b.header for b in chunk] + [shown or "", setup.instructions]
    fence = make_fence(texts)
    pieces: list[str] = []
    # What the prompt sends, in ``estimate_units``: added up piece by piece
    # (the blocks' own, known since they were made) instead of reading the
    # whole prompt again. Pieces join at blank lines, which no estimate reads
    # across.
    units = 0
    if shown is not None:
        pieces.append(render_previous_summary(shown, fence))
        units += estimate_units(pieces[-1])
    if chunk:
        pieces.append(render(chunk, fence))
        units += rendered_units(chunk, fence)
    tail = "\n\n" + instructions_text(setup.options, shown is not None) + setup.extra
    units += estimate_units(tail) + BLANK_LINE_UNITS * max(len(pieces) - 1, 0)
    prompt = "\n\n".join(pieces) + tail
    budget = setup.options.budget
    request = SummaryRequest(
        system=setup.system,
        prompt=prompt,
        messages=tuple(setup.shown[b.index] for b in chunk),
        previous_summary=shown,
        instructions=setup.instructions,
        chunk_index=number,
        chunk_count=number + max(planned, 1),
        indices=tuple(b.index for b in chunk),
        # What the features add under the summary is left to them.
        # (At least 256 tokens, but never more than the summary is checked against:
        # a summarizer that keeps to what it was asked is never rejected for its length.)
        max_tokens=min(max(budget.summary_max - setup.reserved, _MIN_MESSAGE_TOKENS), budget.summary_max),
    )
    cost = setup.system_tokens + units // UNITS
    if number == 0 and setup.prefix:
        # The prefix fits one request: offer the caller's own messages too. A
        # summarizer that sends them covers the whole region in this one call
        # (and says so); one that cannot (a plain function, the extractive
        # one) sends the transcript, chunk by chunk, at the cost above.
        prefix_prompt = prompts.CACHE_ALIGNED_PROMPT + setup.extra
        request = replace(request, prefix=setup.prefix, prefix_prompt=prefix_prompt, prefix_tools=setup.prefix_tools)
    return request, cost


@dataclass(slots=True)
class _Tally:
    calls: int = 0
    sent: int = 0


def _answer(
    setup: _Setup, request: SummaryRequest, cost: int, tally: _Tally
) -> Generator[SummaryRequest, SummaryReply, tuple[str, bool]]:
    """Ask for one chunk's summary; return it and whether it covered the whole region."""
    tally.calls += 1
    reply = yield request
    covered = reply.covers_prefix and bool(request.prefix)
    # What was sent: the prefix as it is, or the transcript.
    tally.sent += setup.prefix_tokens if covered else cost
    problem = review_summary(reply.text, setup.options, setup.required)
    if not problem:
        return reply.text, covered
    # Checked summaries: ask once more with the problem stated (from the
    # transcript), then hand the request to the driver's fallback (or raise).
    note = prompts.RETRY_NOTE.format(problem=problem)
    tally.calls += 1
    tally.sent += cost + estimate_tokens(note)
    reply = yield replace(request, prompt=request.prompt + note, attempt=1)
    problem = review_summary(reply.text, setup.options, setup.required)
    if problem:
        tally.calls += 1
        reply = yield replace(request, attempt=FALLBACK_ATTEMPT, problem=problem)
    # The accepted answer did not come from the prefix: the rest of the
    # region still needs its chunks.
    return reply.text, False


def compaction_flow(
    messages: Sequence[Message],
    plan: Plan,
    options: CompactionOptions,
    instructions: str = "",
    *,
    originals: Sequence[object] = (),
    counts: Sequence[int] = (),
    preamble: Preamble | None = None,
    required: tuple[str, ...] = (),
    reserved: int = 0,
) -> SummaryFlow:
    """The summary requests for ``plan``, as a generator that receives each reply.

    Args:
        messages: The conversation.
        plan: From ``plan_compaction``.
        options: The options in force.
        instructions: Custom instructions appended to every request.
        originals: The caller's own messages (opaque), for the cache-aligned
            mode.
        counts: Token count per message, for the cache-aligned mode's budget.
        preamble: In the cache-aligned mode (``features.CacheAligned``), what
            the conversation's own requests send besides its messages, sent
            first; ``None`` sends the transcript.
        required: Headings every answer must have (``features.RequireSections``).
        reserved: Tokens of the summary's budget the features add under it;
            the summarizer is asked to leave them (``SummaryRequest.max_tokens``).

    Returns:
        The flow; it yields one ``SummaryRequest`` per summarizer call and
        returns the ``Outcome``.
    """
    setup = _setup(
        messages,
        plan,
        options,
        instructions,
        originals=originals,
        counts=counts,
        preamble=preamble,
        required=required,
        reserved=reserved,
    )
    return _run(setup)


def _run(setup: _Setup) -> SummaryFlow:
    running = setup.previous
    tally = _Tally()
    blocks = setup.blocks
    tokens = [b.tokens for b in blocks]
    plan = _Plan.of(tokens, [setup.valid[b.index] for b in blocks])
    start = number = 0
    while True:
        shown = shorten(running, setup.summary_cap) if running is not None else None
        # Room for messages is what the running summary, as shown, leaves.
        room = max(setup.budget - setup.fixed - estimate_tokens(shown or ""), setup.per_message + 64)
        end = _next_chunk(start, room, tokens, plan)
        chunk = blocks[start:end]
        start = end
        # How many chunks are left, for progress reports: this one and what the rest fills.
        planned = 1 + -(-(plan.before[-1] - plan.before[end]) // room) if chunk else 0
        request, cost = _request(setup, chunk, shown, number, planned)
        try:
            text, covered = yield from _answer(setup, request, cost, tally)
        except SummarizationError as error:
            tally.sent += cost  # the failed request was sent all the same
            until = _kept_from(setup, chunk)
            if running is None or number == 0 or until is None:
                raise  # nothing summarized yet: nothing to keep
            # What the earlier chunks summarized is kept (the caller decides
            # whether it may be used); this chunk and the rest stay verbatim.
            return replace(_outcome(setup, running, tally, number), until=until, failure=error)
        running = text.strip()
        number += 1
        if covered or start >= len(blocks):  # (a prefix request covers every message of the region)
            break
    return _outcome(setup, running, tally, number)


def _kept_from(setup: _Setup, chunk: Sequence[Block]) -> int | None:
    """Where a summary of the chunks before ``chunk`` may stop: the nearest valid cut at or before its start.

    A chunk may start inside a tool exchange (a unit larger than a request is
    split); the cut never does, so it moves back to the assistant message that
    made the calls, and what the summary covers past it is also kept verbatim.
    ``None`` when that leaves nothing before it.
    """
    if not chunk:
        return None
    first = setup.blocks[0].index
    return next((c for c in range(chunk[0].index, first, -1) if setup.valid[c]), None)


def _outcome(setup: _Setup, summary: str, tally: _Tally, chunks: int) -> Outcome:
    return Outcome(
        summary=summary,
        calls=tally.calls,
        chunks=chunks,
        input_tokens=tally.sent,
        shortened=sum(1 for b in setup.blocks if b.shortened),
        updated_previous=setup.previous is not None,
    )
