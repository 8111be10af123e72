"""Compaction summaries written by Claude through the Anthropic SDK."""

from __future__ import annotations

import logging
import os
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any, TypeGuard

import anthropic
from langchain_core.messages import BaseMessage, HumanMessage

from langchain_compaction.anthropic import validity, wire
from langchain_compaction.core.engine import blocking_summary
from langchain_compaction.core.options import check_seconds
from langchain_compaction.core.types import SummaryReply, SummaryRequest, Usage
from langchain_compaction.errors import ConfigurationError, SummarizationError
from langchain_compaction.summarizers.chat_model import uses_prefix

logger = logging.getLogger("langchain_compaction")

# The SDK refuses a non-streaming call it expects to run past ten minutes:
# 3600 s * max_tokens / 128,000 > 600 s, i.e. above 21,333 output tokens.
_MAX_NONSTREAMING_TOKENS = 21_333
# Recent calls kept in ``usage_log``; the running totals cover every call.
_USAGE_LOG_SIZE = 100


def _is_number(value: object, *, whole: bool = False) -> TypeGuard[float]:
    return not isinstance(value, bool) and isinstance(value, int if whole else (int, float))


def _check_clients(model: object, client: object, async_client: object) -> None:
    if not isinstance(model, str) or not model.strip():
        raise ConfigurationError("model", model, 'pass a Claude model name, e.g. "claude-haiku-4-5"')
    if client is not None and not isinstance(client, anthropic.Anthropic):
        advice = (
            "an AsyncAnthropic client goes in async_client=; pass anthropic.Anthropic(...) as client"
            if isinstance(client, anthropic.AsyncAnthropic)
            else "pass an anthropic.Anthropic client, or None to make one from ANTHROPIC_API_KEY"
        )
        raise ConfigurationError("client", client, advice)
    if async_client is not None and not isinstance(async_client, anthropic.AsyncAnthropic):
        raise ConfigurationError("async_client", async_client, "pass an anthropic.AsyncAnthropic client, or None")


def _check_limits(max_tokens: object, timeout: object, max_retries: object, temperature: object) -> None:
    if not _is_number(max_tokens, whole=True) or not 1 <= max_tokens <= _MAX_NONSTREAMING_TOKENS:
        advice = f"pass a whole number from 1 to {_MAX_NONSTREAMING_TOKENS} (the SDK streams above it), e.g. 4096"
        raise ConfigurationError("max_tokens", max_tokens, advice)
    if timeout is not None:  # (the options' rule: a finite number of seconds, NaN and infinity refused)
        check_seconds("timeout", timeout, "pass a positive number of seconds, or None for the client's")
    if max_retries is not None and (not _is_number(max_retries, whole=True) or max_retries < 0):
        raise ConfigurationError("max_retries", max_retries, "pass a whole number of retries from 0, or None")
    if temperature is not None and (not _is_number(temperature) or not 0 <= temperature <= 1):
        raise ConfigurationError("temperature", temperature, "pass a temperature from 0 to 1, or None")


def _require_key() -> None:
    if not (os.environ.get("ANTHROPIC_API_KEY") or os.environ.get("ANTHROPIC_AUTH_TOKEN")):
        advice = (
            "no client was given and ANTHROPIC_API_KEY is not set; set it, or pass "
            "client=anthropic.Anthropic(api_key=...)"
        )
        raise ConfigurationError("client", None, advice)


def _advice(status: int | None, detail: str) -> str:
    if status == 400 and "too long" in detail.lower():
        return "lower CompactionOptions.summary_input_tokens so each summary request fits the model's window"
    if status == 401:
        return "check ANTHROPIC_API_KEY or the client's api_key"
    if status in (403, 404):
        return "check the model name and that the key may use it"
    if status in (429, 529) or (status is not None and status >= 500):
        return "the SDK's retries were used up; raise max_retries, try later, or pass fallback=ExtractiveSummarizer()"
    if status is None:
        return "check the network, raise timeout, or pass fallback=ExtractiveSummarizer()"
    return "see the API's message above"


def _summary_error(exc: anthropic.AnthropicError, request: SummaryRequest) -> SummarizationError:
    if isinstance(exc, anthropic.APIStatusError):
        detail = exc.api_message or exc.message
        kind = f" {exc.type}" if exc.type else ""
        rid = f", request id {exc.request_id}" if exc.request_id else ""
        text = f"Anthropic API error {exc.status_code}{kind}: {detail}{rid}; {_advice(exc.status_code, detail)}"
    elif isinstance(exc, anthropic.APIConnectionError):
        text = f"Anthropic API unreachable ({type(exc).__name__}: {exc.message}); {_advice(None, exc.message)}"
    else:
        text = f"Anthropic SDK error ({type(exc).__name__}: {exc})"
    return SummarizationError(
        f"compaction summarisation failed: {text}", chunk_index=request.chunk_index, chunk_count=request.chunk_count
    )


def _usage(response: Any) -> Usage:
    """The usage Claude reported on ``response``."""
    reported = response.usage
    return Usage(
        input_tokens=int(reported.input_tokens or 0),
        output_tokens=int(reported.output_tokens or 0),
        cache_read_input_tokens=int(getattr(reported, "cache_read_input_tokens", None) or 0),
        cache_creation_input_tokens=int(getattr(reported, "cache_creation_input_tokens", None) or 0),
        model=str(response.model),
        stop_reason=response.stop_reason,
        request_id=getattr(response, "_request_id", None),
    )


class AnthropicSummarizer:
    """Writes compaction summaries with Claude through the Anthropic SDK.

    A ``Summarizer`` for ``compact``, ``acompact``, the graph node and the
    middleware. Each request is one ``messages.create`` call: the system prompt
    and the prompt as the only user turn, or in the cache-aligned mode the
    conversation's own messages before the cut, formatted as ``ChatAnthropic``
    sends them (so the agent's prompt cache serves them), then the instruction.
    A prefix the API would refuse (a tool result without its call, say) is not
    sent: the transcript is, and the reply says it does not cover the prefix.
    The reply's text blocks, joined, are the summary, with the call's ``Usage``.

    ``asummarize`` uses ``async_client``, or runs ``client`` in a worker thread
    when only that was given; clients not given are made from
    ``ANTHROPIC_API_KEY`` on first use. The SDK retries 408, 409, 429, 5xx and
    connection errors itself; what still fails is raised as
    ``SummarizationError`` with the API's status and message, chained.

    Args:
        model: The Claude model, e.g. ``"claude-haiku-4-5"``.
        client: A synchronous client.
        async_client: An asynchronous client.
        max_tokens: The summary's output limit (at most 21,333: the SDK wants
            streaming above that).
        timeout: Seconds per HTTP attempt; ``None`` keeps the client's.
        max_retries: SDK retries; ``None`` keeps the client's (2 by default).
        temperature: Sampling temperature, sent in the request body; ``None``
            keeps the model's default (newer models accept only that).
        extra_headers: Headers added to every call (e.g. a beta flag).
        tools: The conversation's own tools (API dicts or LangChain tools),
            sent with a cache-aligned request so its prefix matches the
            agent's requests.

    Example:
        >>> import anthropic, httpx2
        >>> def handler(request):
        ...     return httpx2.Response(200, json={
        ...         "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-haiku-4-5",
        ...         "content": [{"type": "text", "text": "## Goal\\n- ship it"}],
        ...         "stop_reason": "end_turn", "usage": {"input_tokens": 90, "output_tokens": 8}})
        >>> client = anthropic.Anthropic(
        ...     api_key="test", http_client=httpx2.Client(transport=httpx2.MockTransport(handler)))
        >>> summarizer = AnthropicSummarizer("claude-haiku-4-5", client=client)
        >>> reply = summarizer.summarize(SummaryRequest(system="s", prompt="p", messages=()))
        >>> reply.text, reply.usage.input_tokens, reply.covers_prefix
        ('## Goal\\n- ship it', 90, False)
        >>> summarizer.total_usage().output_tokens
        8
    """

    def __init__(
        self,
        model: str,
        *,
        client: anthropic.Anthropic | None = None,
        async_client: anthropic.AsyncAnthropic | None = None,
        max_tokens: int = 4096,
        timeout: float | None = None,
        max_retries: int | None = None,
        temperature: float | None = None,
        extra_headers: Mapping[str, str] | None = None,
        tools: Sequence[Any] | None = None,
    ) -> None:
        _check_clients(model, client, async_client)
        _check_limits(max_tokens, timeout, max_retries, temperature)
        self.model = model
        self.max_tokens = max_tokens
        self.timeout = timeout
        self.max_retries = max_retries
        self.temperature = temperature
        self.extra_headers = dict(extra_headers) if extra_headers else None
        self.tools = wire.convert_tools(tools)
        self._client = client
        self._async_client = async_client
        self._configured: anthropic.Anthropic | None = None
        self._configured_async: anthropic.AsyncAnthropic | None = None
        self._lock = threading.Lock()
        self._total = Usage(model=model)
        self.usage_log: deque[Usage] = deque(maxlen=_USAGE_LOG_SIZE)
        """The usage of the latest calls (at most 100), oldest first."""
        self.last_usage: Usage | None = None
        """The usage of the latest call."""

    @property
    def name(self) -> str:
        """``anthropic:<model>``."""
        return f"anthropic:{self.model}"

    def total_usage(self) -> Usage:
        """The usage of every call so far, summed."""
        with self._lock:
            return self._total

    # -- clients ------------------------------------------------------------------------

    def _options(self) -> dict[str, Any]:
        options: dict[str, Any] = {}
        if self.timeout is not None:
            options["timeout"] = self.timeout
        if self.max_retries is not None:
            options["max_retries"] = self.max_retries
        return options

    def _sync_client(self) -> anthropic.Anthropic:
        with self._lock:
            if self._configured is None:
                if self._client is None:
                    if self._async_client is not None:
                        advice = (
                            "only async_client was given; call acompact/ainvoke, or also pass "
                            "client=anthropic.Anthropic(...)"
                        )
                        raise ConfigurationError("client", None, advice)
                    _require_key()
                    self._client = anthropic.Anthropic()
                options = self._options()
                self._configured = self._client.with_options(**options) if options else self._client
            return self._configured

    def _async(self) -> anthropic.AsyncAnthropic | None:
        """The async client; ``None`` when only a sync client was given (run it in a thread)."""
        with self._lock:
            if self._configured_async is None:
                if self._async_client is None:
                    if self._client is not None:
                        return None
                    _require_key()
                    self._async_client = anthropic.AsyncAnthropic()
                options = self._options()
                self._configured_async = self._async_client.with_options(**options) if options else self._async_client
            return self._configured_async

    # -- the request and the reply (shared by both paths) ----------------------------

    def _aligned_params(self, request: SummaryRequest) -> dict[str, Any] | None:
        """A cache-aligned request (the prefix, then the instruction), or ``None`` to send the transcript."""
        if not uses_prefix(request):
            return None
        prefix = [m for m in request.prefix if isinstance(m, BaseMessage)]
        # The instruction as a block list, as ChatAnthropic would join it to a
        # user turn the prefix ends with.
        instruction = HumanMessage(content=[{"type": "text", "text": request.prefix_prompt}])
        system, messages = wire.chat_anthropic_format([*prefix, instruction], self.model)
        if not validity.is_valid_request(messages):
            # The API would refuse it (the agent's next request would be refused
            # too); the transcript still summarizes the region.
            logger.warning(
                "the messages before the cut are not a valid Messages API request (a tool result without its "
                "call, or a call without its result); summarizing from the transcript instead of cache-aligned"
            )
            return None
        params: dict[str, Any] = {"model": self.model, "max_tokens": self.max_tokens, "messages": messages}
        if system is not None:
            params["system"] = system
        tools = wire.convert_tools(request.prefix_tools) if request.prefix_tools else self.tools
        if tools:
            params["tools"] = tools
        # The prompt cache is read only by a request that asks for it: a
        # breakpoint (on the last block), and the cache finds the agent's own
        # cached prefix before it. The API takes four at most: a prefix that
        # carries four of the agent's is read at those.
        contents = (m.get("content") for m in messages)
        if wire.cache_breakpoints(params.get("system"), params.get("tools") or (), contents) < wire.MOST_BREAKPOINTS:
            params["cache_control"] = {"type": "ephemeral"}
        return params

    def _params(self, request: SummaryRequest) -> tuple[dict[str, Any], bool]:
        """The ``messages.create`` arguments, and whether they send the request's prefix."""
        params = self._aligned_params(request)
        aligned = params is not None
        if params is None:
            messages = [{"role": "user", "content": request.prompt}]
            params = {"model": self.model, "max_tokens": self.max_tokens, "messages": messages}
            if request.system:
                params["system"] = request.system
        if self.temperature is not None:
            # anthropic>=1 dropped ``temperature`` from ``create``'s arguments
            # (current models ignore it); the API still reads it from the body
            # for older models, so it goes in ``extra_body``.
            params["extra_body"] = {"temperature": self.temperature}
        if self.extra_headers:
            params["extra_headers"] = self.extra_headers
        if request.timeout is not None and (self.timeout is None or request.timeout < self.timeout):
            params["timeout"] = request.timeout  # the library stops waiting then: so does the call
        return params, aligned

    def _finish(self, response: Any, request: SummaryRequest, *, aligned: bool) -> SummaryReply:
        usage = _usage(response)
        with self._lock:
            self.usage_log.append(usage)
            self.last_usage = usage
            self._total = self._total + usage
        if response.stop_reason == "refusal":
            raise SummarizationError(
                "compaction summarisation failed: Claude declined to summarize this conversation "
                "(stop_reason=refusal); pass fallback=ExtractiveSummarizer() to compact it anyway",
                chunk_index=request.chunk_index,
                chunk_count=request.chunk_count,
            )
        if response.stop_reason == "max_tokens":
            logger.warning(
                "the summary hit max_tokens=%d and was cut short; raise AnthropicSummarizer(max_tokens=...)",
                self.max_tokens,
            )
        text = "".join(block.text for block in response.content if getattr(block, "type", None) == "text")
        return SummaryReply(text, usage, covers_prefix=aligned)

    def summarize(self, request: SummaryRequest) -> SummaryReply:
        """One blocking ``messages.create`` call; see ``Summarizer``."""
        client = self._sync_client()
        params, aligned = self._params(request)
        try:
            response = client.messages.create(**params)
        except anthropic.AnthropicError as exc:
            raise _summary_error(exc, request) from exc
        return self._finish(response, request, aligned=aligned)

    async def asummarize(self, request: SummaryRequest) -> SummaryReply:
        """One awaited ``messages.create`` call; see ``Summarizer``."""
        client = self._async()
        if client is None:
            return await blocking_summary(request, self.summarize, request)
        params, aligned = self._params(request)
        try:
            response = await client.messages.create(**params)
        except anthropic.AnthropicError as exc:
            raise _summary_error(exc, request) from exc
        return self._finish(response, request, aligned=aligned)
