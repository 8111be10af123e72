"""The compaction engine: a pure plan, a pure flow, thin sync and async drivers.

``plan_compaction`` decides what to keep and what to summarize.
``compaction_flow`` is a generator that yields one ``SummaryRequest`` per
summarizer call and receives the summary text back; it never calls a model,
so sync and async share every line of compaction logic and the drivers
(``run_flow`` / ``arun_flow``) only make the calls.

A region larger than the summarizer's input budget is summarized in chunks,
each updating the running summary, so every compacted message is shown to the
summarizer (LangChain's ``SummarizationMiddleware`` shows only the last 4,000
tokens). A single oversize message is shortened in the transcript, head and
tail kept, with a marker saying how much was cut.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol, runtime_checkable

from langchain_compaction.core import prompts
from langchain_compaction.core.cut import find_cut, forced_cut, valid_boundaries
from langchain_compaction.core.options import CompactionOptions
from langchain_compaction.core.redact import _apply as _apply_redactor
from langchain_compaction.core.redact import redact_message
from langchain_compaction.core.tokens import estimate_tokens
from langchain_compaction.core.transcript import (
    Block,
    make_block,
    make_fence,
    render,
    render_previous_summary,
    shorten,
)
from langchain_compaction.core.types import FALLBACK_ATTEMPT, Message, SummaryRequest, Usage, usage_of
from langchain_compaction.errors import (
    CompactionError,
    EmptySummaryError,
    InvalidSummaryError,
    SummarizationError,
    SummaryTimeoutError,
)

# No message is shortened below this, however small the budget.
_MIN_MESSAGE_TOKENS = 256


@runtime_checkable
class Summarizer(Protocol):
    """Anything that turns a ``SummaryRequest`` into summary text.

    Chat models, the Anthropic SDK and the offline extractive summarizer all
    sit behind this seam.
    """

    @property
    def name(self) -> str:
        """A short name for results and logs."""
        ...

    def summarize(self, request: SummaryRequest) -> str:
        """Write the summary for ``request`` (blocking)."""
        ...

    async def asummarize(self, request: SummaryRequest) -> str:
        """Write the summary for ``request`` (async)."""
        ...


@dataclass(frozen=True, slots=True)
class Plan:
    """What one compaction keeps and summarizes.

    Attributes:
        keep_head: Indices of leading system messages kept verbatim.
        start: First index of the region after the leading system block.
        cut: First kept message after the summary.
        previous_summaries: Indices of earlier summaries to update.
        forced: Whether the cut was forced (nothing was over the keep budget).
        pinned: Messages kept verbatim between the summary and the recent
            ones: everything up to the last provider-side compaction block,
            which the summary must not reach across.
    """

    keep_head: tuple[int, ...]
    start: int
    cut: int
    previous_summaries: tuple[int, ...]
    forced: bool
    pinned: tuple[int, ...] = ()

    @property
    def removed(self) -> int:
        """Messages the summary replaces."""
        return self.cut - self.start + sum(1 for i in self.previous_summaries if i < self.start)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the flow produced.

    Attributes:
        summary: The final summary text (no header).
        calls: Summarizer calls made.
        chunks: Chunks the region was split into.
        input_tokens: Estimated tokens sent over all calls.
        shortened: Messages shortened in the transcript.
        updated_previous: Whether a previous summary was updated.
    """

    summary: str
    calls: int
    chunks: int
    input_tokens: int
    shortened: int
    updated_previous: bool


def leading_block(messages: Sequence[Message]) -> int:
    """The length of the leading run of system messages (summaries included)."""
    index = 0
    while index < len(messages) and messages[index].role == "system":
        index += 1
    return index


def plan_compaction(
    messages: Sequence[Message],
    counts: Sequence[int],
    keep_recent_tokens: int,
    *,
    force: bool = True,
) -> Plan | None:
    """Decide the cut for one compaction.

    Leading system messages (the application's prompt) are never summarized;
    earlier summaries among them are updated, not kept. The cut follows
    ``find_cut``; when nothing is over the keep budget and ``force`` is set (a
    manual compaction, as the reference's ``Compact`` does), the cut keeps only
    the last valid message.

    Args:
        messages: The conversation.
        counts: Token count per message.
        keep_recent_tokens: Recent tokens to keep.
        force: Whether to force a cut when everything fits the keep budget.

    Returns:
        The plan, or ``None`` when there is nothing to compact.
    """
    start = leading_block(messages)
    head = tuple(i for i in range(start) if not messages[i].is_summary)
    earlier = [i for i in range(start) if messages[i].is_summary]
    # The user turn an earlier compaction put after its summary belongs to
    # that output: it is replaced with it and counts as no message.
    while start < len(messages) and messages[start].is_summary and messages[start].role != "system":
        earlier.append(start)
        start += 1
    # A provider-side compaction block (Claude's ``compaction`` content) is
    # the start of the history the provider reads: never summarize across
    # it. It and what precedes it stay verbatim; only what follows is ours.
    blocks = [i for i in range(start, len(messages)) if messages[i].has_compaction_block]
    pinned: tuple[int, ...] = ()
    flags = valid_boundaries(messages)
    if blocks:
        # The region starts at the first valid boundary after the block, so a
        # tool call the block's message makes keeps its results.
        first = next(c for c in range(blocks[-1] + 1, len(messages) + 1) if flags[c])
        pinned = tuple(range(start, first))
        start = first
    # An earlier summary counts as one summarized message, as in the reference
    # where the summary was simply the first message of the list.
    credit = sum(1 for i in earlier if messages[i].role == "system")
    cut = find_cut(messages, counts, keep_recent_tokens, start=start, credit=credit, valid=flags)
    forced = False
    if cut == 0 and force:
        cut = forced_cut(messages, start=start, credit=credit, valid=flags)
        forced = cut > 0
    if cut <= start:
        return None
    inside = [i for i in range(start, cut) if messages[i].is_summary]
    return Plan(
        keep_head=head,
        start=start,
        cut=cut,
        previous_summaries=(*earlier, *inside),
        forced=forced,
        pinned=pinned,
    )


def strip_summary_header(text: str) -> str:
    """The body of a summary message, without the header and notice lines."""
    body = text.strip()
    for line in (prompts.SUMMARY_HEADER, prompts.SUMMARY_NOTICE):
        if body.startswith(line):
            body = body[len(line) :].lstrip()
    return body


def format_summary(summary: str) -> str:
    """The content of a summary message: header, notice, then the summary."""
    return f"{prompts.SUMMARY_HEADER}\n{prompts.SUMMARY_NOTICE}\n\n{summary.strip()}"


def _instructions_text(options: CompactionOptions, updating: bool) -> str:
    if updating:
        if options.update_prompt is not None:
            return options.update_prompt
        if options.summary_prompt is not None:
            return prompts.UPDATE_PREFIX + "\n\n" + options.summary_prompt
        return prompts.UPDATE_PROMPT
    return options.summary_prompt or prompts.CHECKPOINT_PROMPT


def _chunks(blocks: Sequence[Block], room: int) -> list[list[Block]]:
    """Split blocks greedily into chunks of at most ``room`` tokens each."""
    chunks: list[list[Block]] = []
    current: list[Block] = []
    used = 0
    for block in blocks:
        if current and used + block.tokens > room:
            chunks.append(current)
            current, used = [], 0
        current.append(block)
        used += block.tokens
    if current:
        chunks.append(current)
    return chunks


def _cache_aligned(
    options: CompactionOptions, originals: Sequence[object], counts: Sequence[int], plan: Plan, budget: int
) -> bool:
    if options.summary_mode != "cache_aligned" or len(originals) < plan.cut or options.redact is not None:
        # Redaction cannot apply to messages sent unchanged: use the transcript.
        return False
    return sum(counts[: plan.cut]) <= budget


def review_summary(text: str, options: CompactionOptions) -> str:
    """Why ``text`` cannot be used as the summary ("" when it can).

    Args:
        text: A summarizer's answer.
        options: The options in force (budget, required sections).

    Returns:
        The problem, phrased for the summarizer, or ``""``.
    """
    budget = options.effective_summary_max_tokens
    size = estimate_tokens(text)
    if size > budget:
        return f"it has about {size} tokens, more than the summary budget of {budget}; write it shorter"
    if options.require_sections:
        lines = {
            line.strip().lstrip("#").strip().lower() for line in text.splitlines() if line.lstrip().startswith("#")
        }
        missing = [h for h in prompts.CHECKPOINT_SECTIONS if h.lstrip("#").strip().lower() not in lines]
        if missing:
            return "it lacks these headings: " + ", ".join(missing)
    return ""


def compaction_flow(
    messages: Sequence[Message],
    plan: Plan,
    options: CompactionOptions,
    instructions: str = "",
    *,
    originals: Sequence[object] = (),
    counts: Sequence[int] = (),
) -> Generator[SummaryRequest, str, Outcome]:
    """Yield the summary requests for ``plan``; receive each summary text.

    Args:
        messages: The conversation.
        plan: From ``plan_compaction``.
        options: The options in force.
        instructions: Custom instructions appended to every request.
        originals: The caller's own messages (opaque), for the cache-aligned
            mode.
        counts: Token count per message, for the cache-aligned mode's budget.

    Yields:
        One ``SummaryRequest`` per summarizer call.

    Returns:
        The ``Outcome`` with the final summary.
    """
    system = options.system_prompt or prompts.SYSTEM_PROMPT
    previous_parts = [
        strip_summary_header(messages[i].text) for i in plan.previous_summaries if messages[i].role == "system"
    ]
    previous = "\n\n".join(p for p in previous_parts if p) or None
    region = [i for i in range(plan.start, plan.cut) if not messages[i].is_summary]
    redactor = options.redact
    if redactor is not None:
        # Everything the summarizer sees goes through the redactor; the
        # caller's messages are not touched.
        shown_messages = {i: redact_message(messages[i], redactor) for i in region}
        previous = _apply_redactor(redactor, previous) if previous is not None else None
    else:
        shown_messages = {i: messages[i] for i in region}
    extra = prompts.ADDITIONAL_INSTRUCTIONS + instructions if instructions else ""
    budget = options.effective_summary_input_tokens
    fixed = (
        estimate_tokens(system)
        + max(estimate_tokens(_instructions_text(options, True)), estimate_tokens(_instructions_text(options, False)))
        + estimate_tokens(extra)
        + 64
    )
    system_tokens = estimate_tokens(system)
    fixed_prompt = fixed - system_tokens
    # The running summary may take up to half of what is left; a larger one
    # (a huge previous summary, a long-winded reply) is shortened in the
    # request, head and tail kept, so no request exceeds the budget.
    summary_cap = max((budget - fixed) // 2, _MIN_MESSAGE_TOKENS)
    per_message = max((budget - fixed - summary_cap) // 2, _MIN_MESSAGE_TOKENS)
    blocks = [make_block(shown_messages[i], i, max_tokens=per_message) for i in region]

    running = previous
    calls = 0
    sent = 0
    number = 0
    remaining = blocks
    while True:
        shown = shorten(running, summary_cap) if running is not None else None
        # Room for messages is what the running summary, as shown, leaves.
        room = max(budget - fixed - estimate_tokens(shown or ""), per_message + 64)
        planned = _chunks(remaining, room)
        chunk = planned[0] if planned else []
        remaining = remaining[len(chunk) :]
        updating = shown is not None
        texts = [b.body for b in chunk] + [b.header for b in chunk] + [shown or "", instructions]
        fence = make_fence(texts)
        pieces: list[str] = []
        if shown is not None:
            pieces.append(render_previous_summary(shown, fence))
        if chunk:
            pieces.append(render(chunk, fence))
        prompt = "\n\n".join(pieces) + "\n\n" + _instructions_text(options, updating) + extra
        request = SummaryRequest(
            system=system,
            prompt=prompt,
            messages=tuple(shown_messages[b.index] for b in chunk),
            previous_summary=shown,
            instructions=instructions,
            chunk_index=number,
            chunk_count=number + max(len(planned), 1),
            indices=tuple(b.index for b in chunk),
            max_tokens=options.effective_summary_max_tokens,
        )
        if number == 0 and _cache_aligned(options, originals, counts, plan, budget):
            # The prefix fits one request: offer the caller's own messages too.
            # A summarizer that sends them covers the whole region in this one
            # call (and says so); one that cannot (a plain function, the
            # extractive one) uses the transcript, chunk by chunk.
            request = replace(
                request,
                prefix=tuple(originals[: plan.cut]),
                prefix_prompt=prompts.CACHE_ALIGNED_PROMPT + extra,
            )
        # What this request costs, from the pieces already estimated (the
        # prompt is never estimated again as a whole).
        cost = system_tokens + fixed_prompt + sum(b.tokens for b in chunk) + estimate_tokens(shown or "")
        sent += cost
        calls += 1
        text = yield request
        aligned = bool(request.prefix) and getattr(text, "aligned", False)
        problem = review_summary(text, options)
        if problem:
            # Checked summaries: ask once more with the problem stated, then
            # hand the request to the driver's fallback (or let it raise).
            retry = replace(request, prompt=prompt + prompts.RETRY_NOTE.format(problem=problem), attempt=1)
            sent += cost + estimate_tokens(prompts.RETRY_NOTE) + estimate_tokens(problem)
            calls += 1
            text = yield retry
            problem = review_summary(text, options)
            if problem:
                calls += 1
                text = yield replace(request, attempt=FALLBACK_ATTEMPT, problem=problem)
            # The accepted answer did not come from the prefix: the rest of
            # the region still needs its chunks.
            aligned = False
        running = text.strip()
        number += 1
        if aligned and not problem:
            remaining = []  # the prefix covered every message of the region
        if not remaining:
            break
    assert running is not None  # at least one chunk ran
    return Outcome(
        summary=running,
        calls=calls,
        chunks=number,
        input_tokens=sent,
        shortened=sum(1 for b in blocks if b.shortened),
        updated_previous=previous is not None,
    )


def _checked(text: object, request: SummaryRequest) -> str:
    if not isinstance(text, str):
        raise SummarizationError(
            f"compaction summarisation failed: the summarizer returned {type(text).__name__}, "
            "not text; return a string (or a message with text content)",
            chunk_index=request.chunk_index,
            chunk_count=request.chunk_count,
        )
    if not text.strip():
        raise EmptySummaryError(
            "compaction produced an empty summary; the messages were left unchanged. "
            "Check the summarizer model, or pass fallback=ExtractiveSummarizer()",
            chunk_index=request.chunk_index,
            chunk_count=request.chunk_count,
        )
    return text


def _wrap(exc: Exception, request: SummaryRequest) -> CompactionError:
    if isinstance(exc, CompactionError):
        return exc
    error = SummarizationError(
        f"compaction summarisation failed: {type(exc).__name__}: {exc}",
        chunk_index=request.chunk_index,
        chunk_count=request.chunk_count,
    )
    error.__cause__ = exc
    return error


def _call_with_timeout(summarizer: Summarizer, request: SummaryRequest, timeout: float | None) -> str:
    if timeout is None:
        return summarizer.summarize(request)
    # A blocking call cannot be interrupted; run it in a daemon thread with the
    # caller's context (callbacks, tracing) and stop waiting at the deadline.
    box: dict[str, object] = {}
    context = contextvars.copy_context()

    def target() -> None:
        try:
            box["value"] = context.run(summarizer.summarize, request)
        except BaseException as exc:  # handed to the waiting thread
            box["error"] = exc

    worker = threading.Thread(target=target, name="langchain-compaction-summary", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise SummaryTimeoutError(timeout, chunk_index=request.chunk_index, chunk_count=request.chunk_count)
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]


def _ask(summarizer: Summarizer, request: SummaryRequest, timeout: float | None) -> str:
    try:
        text = _call_with_timeout(summarizer, request, timeout)
    except Exception as exc:
        raise _wrap(exc, request) from exc
    return _checked(text, request)


async def _aask(summarizer: Summarizer, request: SummaryRequest, timeout: float | None) -> str:
    try:
        if timeout is None:
            text = await summarizer.asummarize(request)
        else:
            task = asyncio.ensure_future(summarizer.asummarize(request))
            try:
                done, _ = await asyncio.wait({task}, timeout=timeout)
            except asyncio.CancelledError:
                task.cancel()  # the caller was cancelled: do not leave the call running
                raise
            if not done:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
                raise SummaryTimeoutError(timeout, chunk_index=request.chunk_index, chunk_count=request.chunk_count)
            # A TimeoutError raised by the model itself is a failure, not our deadline.
            text = task.result()
    except Exception as exc:
        raise _wrap(exc, request) from exc
    return _checked(text, request)


@dataclass(frozen=True, slots=True)
class DriverReport:
    """What the driver adds to the flow's outcome.

    Attributes:
        outcome: The flow's outcome.
        summarizer: The name of the summarizer that wrote the last summary.
        fallback_used: Whether the fallback wrote any part of it.
        usage: Tokens the summarizer calls were billed, where reported.
    """

    outcome: Outcome
    summarizer: str
    fallback_used: bool
    usage: Usage = field(default_factory=Usage)


class _Driver:
    """The state both drivers share: who answers, and what it cost.

    Only the call itself differs between sync and async; every decision
    (which summarizer answers a request, when the fallback takes over, when
    to give up) is made here.
    """

    def __init__(self, summarizer: Summarizer, fallback: Summarizer | None) -> None:
        self.active = summarizer
        self.fallback = fallback
        self.used_fallback = False
        self.usage = Usage()

    def choose(self, request: SummaryRequest) -> Summarizer:
        """The summarizer for ``request``; raises when the fallback is wanted but absent."""
        if request.wants_fallback:
            if self.fallback is None or self.used_fallback:
                raise InvalidSummaryError(
                    f"compaction summarisation failed: the summary was rejected twice ({request.problem}); "
                    "the messages were left unchanged. Pass fallback=ExtractiveSummarizer(), or relax "
                    "summary_max_tokens / require_sections",
                    chunk_index=request.chunk_index,
                    chunk_count=request.chunk_count,
                )
            self.active, self.used_fallback = self.fallback, True
        return self.active

    def switch(self, error: SummarizationError) -> Summarizer:
        """After ``active`` failed: the fallback to try, or re-raise ``error``."""
        if self.fallback is None or self.used_fallback:
            raise error
        self.active, self.used_fallback = self.fallback, True
        return self.active

    def record(self, text: str) -> str:
        self.usage = self.usage + usage_of(text)
        return text

    def report(self, outcome: Outcome) -> DriverReport:
        return DriverReport(outcome, self.active.name, self.used_fallback, self.usage)


def _advance(flow: Generator[SummaryRequest, str, Outcome], text: str | None) -> SummaryRequest:
    """The flow's next request, with a failure inside it wrapped.

    A user's ``redact`` hook that raises becomes a ``SummarizationError``
    like any summary failure, chained to the cause.
    """
    try:
        return next(flow) if text is None else flow.send(text)
    except (StopIteration, CompactionError):
        raise
    except Exception as exc:
        error = SummarizationError(f"compaction summarisation failed: {type(exc).__name__}: {exc}")
        raise error from exc


def run_flow(
    flow: Generator[SummaryRequest, str, Outcome],
    summarizer: Summarizer,
    *,
    fallback: Summarizer | None = None,
    timeout: float | None = None,
) -> DriverReport:
    """Drive ``flow`` with blocking summarizer calls.

    Args:
        flow: From ``compaction_flow``.
        summarizer: Makes each summary.
        fallback: Used for a request the summarizer failed, or whose answer
            was rejected twice (and for the rest of this compaction), if given.
        timeout: Seconds each call may take.

    Returns:
        The outcome, who wrote it and what it cost.

    Raises:
        SummarizationError: The summarizer failed and there is no fallback (or
            the fallback failed too).
    """
    driver = _Driver(summarizer, fallback)
    try:
        request = _advance(flow, None)
        while True:
            active = driver.choose(request)
            try:
                text = _ask(active, request, timeout)
            except SummarizationError as error:
                text = _ask(driver.switch(error), request, timeout)
            request = _advance(flow, driver.record(text))
    except StopIteration as stop:
        return driver.report(stop.value)
    finally:
        flow.close()


async def arun_flow(
    flow: Generator[SummaryRequest, str, Outcome],
    summarizer: Summarizer,
    *,
    fallback: Summarizer | None = None,
    timeout: float | None = None,
) -> DriverReport:
    """Drive ``flow`` with async summarizer calls; see ``run_flow``."""
    driver = _Driver(summarizer, fallback)
    try:
        request = _advance(flow, None)
        while True:
            active = driver.choose(request)
            try:
                text = await _aask(active, request, timeout)
            except SummarizationError as error:
                text = await _aask(driver.switch(error), request, timeout)
            request = _advance(flow, driver.record(text))
    except StopIteration as stop:
        return driver.report(stop.value)
    finally:
        flow.close()
