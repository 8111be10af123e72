"""Who answers a summary request: the only code that calls a summarizer.

``summarize`` turns a ``compaction_flow`` (``core.flow``) into calls
(``core.effects``): it hands each request to the summarizer (or, once it
failed, to the fallback), enforces the timeout, checks that the answer is
usable text, and sends it back; ``drive`` or ``adrive`` makes the calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, TypeVar, runtime_checkable

from langchain_compaction.core.effects import Flow, Running, computing, settled, twin
from langchain_compaction.core.flow import Outcome, SummaryFlow, relief
from langchain_compaction.core.types import SummaryReply, SummaryRequest, Usage
from langchain_compaction.errors import (
    CompactionError,
    EmptySummaryError,
    InvalidSummaryError,
    SummarizationError,
    SummaryTimeoutError,
)


@runtime_checkable
class Summarizer(Protocol):
    """Anything that turns a ``SummaryRequest`` into summary text.

    Chat models, the Anthropic SDK and the offline extractive summarizer all
    sit behind this seam. Either method may return plain text or a
    ``SummaryReply`` (text plus what the call was billed). ``asummarize`` must
    not block the event loop: run blocking work with ``core.effects.off_loop``.
    """

    @property
    def name(self) -> str:
        """A short name for results and logs."""
        ...

    def summarize(self, request: SummaryRequest) -> str | SummaryReply:
        """Write the summary for ``request`` (blocking)."""
        ...

    async def asummarize(self, request: SummaryRequest) -> str | SummaryReply:
        """Write the summary for ``request`` (async)."""
        ...


@dataclass(frozen=True, slots=True)
class DriverReport:
    """What the driver adds to the flow's outcome.

    Attributes:
        outcome: The flow's outcome.
        summarizer: The name of the summarizer that wrote the last summary.
        fallback_used: Whether the fallback wrote any part of it.
        usage: Tokens the summarizer calls were billed, where reported.
        failed: Why the summarizer failed, when the fallback took over from an error ("" otherwise).
    """

    outcome: Outcome
    summarizer: str
    fallback_used: bool
    usage: Usage = field(default_factory=Usage)
    failed: str = ""


# Open reasoning models served without a reasoning parser (DeepSeek-R1, QwQ,
# Qwen3 thinking) write their reasoning inline before the answer; one cut off
# before it closed left no answer at all.
_REASONING = re.compile(r"\A\s*<(think|thinking|reasoning)>(?:.*?</\1>|.*\Z)\s*", re.DOTALL | re.IGNORECASE)
# Others (DeepSeek-R1's newer template, QwQ, Qwen3 thinking) put the opening
# tag in the prompt: their reply is the reasoning, a closing tag on a line of
# its own, the answer. (A tag mentioned in a line of text, or after the
# answer's first heading, is the answer's.)
_UNOPENED_REASONING = re.compile(
    r"\A(?:(?!<(?:think|thinking|reasoning)>|^#).)*?^[ \t]*</(?:think|thinking|reasoning)>[ \t]*$\s*",
    re.DOTALL | re.IGNORECASE | re.MULTILINE,
)


def _reply(value: object, request: SummaryRequest) -> SummaryReply:
    """A summarizer's answer as a ``SummaryReply``, or the error that says what is wrong with it."""
    reply = value if isinstance(value, SummaryReply) else SummaryReply(value) if isinstance(value, str) else None
    if reply is None or not isinstance(reply.text, str):
        got = type(value if reply is None else reply.text).__name__
        raise SummarizationError(
            f"compaction summarisation failed: the summarizer returned {got}, "
            "not text; return a string (or a message with text content)",
            chunk_index=request.chunk_index,
            chunk_count=request.chunk_count,
        )
    reply = replace(reply, text=_UNOPENED_REASONING.sub("", _REASONING.sub("", reply.text, count=1), count=1))
    if not reply.text.strip() and request.prefix and request.attempt == 0:
        # Asked over the agent's own request (tools bound), a model may answer
        # with a tool call and no text: the flow asks again from the transcript.
        return SummaryReply("", reply.usage, reply.covers_prefix)
    if not reply.text.strip():
        raise EmptySummaryError(
            "compaction produced an empty summary; the messages were left unchanged. "
            "Check the summarizer model, or pass fallback=ExtractiveSummarizer()",
            chunk_index=request.chunk_index,
            chunk_count=request.chunk_count,
        )
    return SummaryReply(str(reply.text), reply.usage, reply.covers_prefix)


def _wrap(exc: Exception, request: SummaryRequest, *, sync: bool) -> SummarizationError:
    """A summarizer's own exception as the library's error (one of the library's is re-raised as it is)."""
    # (A summarizer with an async path only, called from sync code: say which calls to use.)
    advice = (
        "; it may have no sync path: use acompact / ainvoke / aadd_messages"
        if sync and isinstance(exc, NotImplementedError)
        else ""
    )
    return SummarizationError(
        f"compaction summarisation failed: {type(exc).__name__}: {exc}{advice}",
        chunk_index=request.chunk_index,
        chunk_count=request.chunk_count,
    )


_T = TypeVar("_T")


MAX_ABANDONED_CALLS = 4
"""Timed-out blocking summary calls whose threads may still run before no new one is started.

A blocking call cannot be interrupted in Python: its thread is abandoned at the
deadline (the timeout is also given to the model's client where the library
knows how, so the call itself ends soon after). While this many are still
running, a new timed call fails at once instead of leaving one more thread.
Calls still within their deadline do not count, nor do calls made without a
timeout, which have none to be past (``core.effects.Running``): an untimed
call's thread lives as long as its caller's wait would have, and refusing
timed calls would not end it.
"""


def _check_abandoned(request: SummaryRequest, timeout: float) -> None:
    left = Running.abandoned()
    if left >= MAX_ABANDONED_CALLS:
        raise SummaryTimeoutError(
            timeout,
            chunk_index=request.chunk_index,
            chunk_count=request.chunk_count,
            detail=f"not called: {left} earlier summary calls are still running past their timeout; "
            f"MAX_ABANDONED_CALLS is {MAX_ABANDONED_CALLS}",
            # (A longer timeout would not end them: the model hangs, and only its client can stop waiting.)
            advice="the model hangs: give its client a timeout of its own (e.g. ChatAnthropic(timeout=...)) "
            "so hung calls end; the next compaction tries again",
        )


async def blocking_summary(request: SummaryRequest, function: Callable[..., _T], *args: Any) -> _T:
    """A blocking summary call awaited on a thread of its own (``off_loop``), refused while too many are abandoned.

    What an async summarizer whose work blocks (a plain function, a sync-only
    client) awaits; one that awaits its client natively is never refused for
    threads it does not use.
    """
    call = Running(function, *args)
    if request.timeout is not None:
        _check_abandoned(request, request.timeout)
        call.deadline = time.monotonic() + request.timeout
    return await settled(call)  # type: ignore[no-any-return]


def _call_with_timeout(summarizer: Summarizer, request: SummaryRequest, timeout: float | None) -> object:
    if timeout is None:
        return summarizer.summarize(request)
    _check_abandoned(request, timeout)
    # A blocking call cannot be interrupted; run it on a daemon thread with the
    # caller's context (callbacks, tracing) and stop waiting at the deadline.
    call = Running(summarizer.summarize, request)
    call.deadline = time.monotonic() + timeout
    call.start()
    if not call.done.wait(timeout) and call.abandon():
        raise SummaryTimeoutError(timeout, chunk_index=request.chunk_index, chunk_count=request.chunk_count)
    return call.result()


async def _await_with_timeout(summarizer: Summarizer, request: SummaryRequest, timeout: float | None) -> object:
    if timeout is None:
        return await summarizer.asummarize(request)
    # (A blocking summarizer's calls run on threads of their own: ``blocking_summary`` bounds those.)
    task = asyncio.ensure_future(summarizer.asummarize(request))
    try:
        done, _ = await asyncio.wait({task}, timeout=timeout)
        if not done:
            task.cancel()
            # Wait (briefly) for the call to wind down; a cancellation of the
            # caller meanwhile propagates as itself, never as our timeout.
            await asyncio.wait({task}, timeout=_WIND_DOWN_SECONDS)
            raise SummaryTimeoutError(timeout, chunk_index=request.chunk_index, chunk_count=request.chunk_count)
    except asyncio.CancelledError:
        task.cancel()  # the caller was cancelled: do not leave the call running
        raise
    # A TimeoutError raised by the model itself is a failure, not our deadline.
    return task.result()


_WIND_DOWN_SECONDS = 1.0
"""How long a timed-out async summary call is given to end after it is cancelled."""


def _ask(summarizer: Summarizer, request: SummaryRequest, timeout: float | None) -> SummaryReply:
    try:
        value = _call_with_timeout(summarizer, _timed(request, timeout), timeout)
    except CompactionError:
        raise  # already ours, chained to its own cause
    except Exception as exc:
        raise _wrap(exc, request, sync=True) from exc
    return _reply(value, request)


async def _aask(summarizer: Summarizer, request: SummaryRequest, timeout: float | None) -> SummaryReply:
    try:
        value = await _await_with_timeout(summarizer, _timed(request, timeout), timeout)
    except CompactionError:
        raise  # already ours, chained to its own cause
    except Exception as exc:
        raise _wrap(exc, request, sync=False) from exc
    return _reply(value, request)


def _timed(request: SummaryRequest, timeout: float | None) -> SummaryRequest:
    # The summarizer passes it on to its client where it can (a call that ends
    # itself frees its thread).
    return request if timeout is None else replace(request, timeout=timeout)


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
        self.failed = ""

    def choose(self, request: SummaryRequest) -> Summarizer:
        """The summarizer for ``request``; raises when the fallback is wanted but absent."""
        if request.wants_fallback:
            if self.fallback is None or self.used_fallback:
                raise InvalidSummaryError(
                    f"compaction summarisation failed: the summary was rejected twice ({request.problem}); "
                    "the messages were left unchanged. Pass a fallback summarizer (fallback=ExtractiveSummarizer()), "
                    + relief(request.problem),
                    chunk_index=request.chunk_index,
                    chunk_count=request.chunk_count,
                )
            self.active, self.used_fallback = self.fallback, True
        return self.active

    def switch(self, error: SummarizationError) -> Summarizer:
        """After ``active`` failed: the fallback to try, or re-raise ``error``."""
        if self.fallback is None or self.used_fallback:
            raise error
        self.active, self.used_fallback, self.failed = self.fallback, True, str(error)
        return self.active

    def record(self, reply: SummaryReply) -> SummaryReply:
        if reply.usage is not None:
            self.usage = self.usage + reply.usage
        return reply

    def report(self, outcome: Outcome) -> DriverReport:
        return DriverReport(outcome, self.active.name, self.used_fallback, self.usage, self.failed)


def _advance(
    flow: SummaryFlow, reply: SummaryReply | None, error: SummarizationError | None = None
) -> tuple[SummaryRequest | None, Outcome | None]:
    """The flow's next request, or (when it is done) its outcome; ``error`` is thrown into it instead of a reply.

    A failure inside the flow becomes a ``SummarizationError`` chained to it.
    The end is returned, not raised: a step run in a worker thread cannot
    hand ``StopIteration`` back through a future.
    """
    try:
        if error is not None:
            return flow.throw(error), None
        return (next(flow) if reply is None else flow.send(reply)), None
    except StopIteration as stop:
        return None, stop.value
    except CompactionError:
        raise
    except Exception as exc:
        error = SummarizationError(f"compaction summarisation failed: {type(exc).__name__}: {exc}")
        raise error from exc


def summarize(
    flow: SummaryFlow,
    summarizer: Summarizer,
    *,
    fallback: Summarizer | None = None,
    timeout: float | None = None,
) -> Flow[DriverReport]:
    """The summarizer calls that answer ``flow``, as calls for ``drive`` / ``adrive``.

    Args:
        flow: From ``compaction_flow``.
        summarizer: Makes each summary.
        fallback: Used for a request the summarizer failed, or whose answer
            was rejected twice (and for the rest of this compaction), if given.
        timeout: Seconds each call may take.

    Returns:
        A flow that returns the outcome, who wrote it and what it cost, and
        raises ``SummarizationError`` when the summarizer failed and there is
        no fallback (or the fallback failed too).
    """
    driver = _Driver(summarizer, fallback)
    # Between requests the flow renders transcripts and checks summaries: CPU
    # work, so on the async path it runs off the event loop.
    try:
        request, outcome = yield computing(_advance, flow, None)
        while request is not None:
            try:
                try:
                    reply = yield twin(_ask, _aask, driver.choose(request), request, timeout)
                except SummarizationError as error:
                    reply = yield twin(_ask, _aask, driver.switch(error), request, timeout)
            except SummarizationError as error:
                # No one could answer this request: the flow decides (it may
                # keep what earlier chunks summarized, or give up).
                request, outcome = yield computing(_advance, flow, None, error)
                continue
            request, outcome = yield computing(_advance, flow, driver.record(reply))
        assert outcome is not None  # a flow that ends returns its outcome
        return driver.report(outcome)
    finally:
        # Cancelled while the worker thread advances the flow ("generator
        # already executing"): it ends there, unheard, and the cancellation
        # goes on as it is.
        with contextlib.suppress(ValueError):
            flow.close()
