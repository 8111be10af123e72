"""Summarizers over LangChain chat models, Runnables and plain callables."""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.runnables import (
    Runnable,
    RunnableConfig,
    RunnableLambda,
    RunnableSequence,
    RunnableWithFallbacks,
)
from langgraph.constants import TAG_NOSTREAM

from langchain_compaction.core.effects import refuse_awaitable
from langchain_compaction.core.engine import Summarizer, blocking_summary
from langchain_compaction.core.options import check_callable
from langchain_compaction.core.tokens import estimate_tokens
from langchain_compaction.core.types import SummaryReply, SummaryRequest, Usage
from langchain_compaction.errors import ConfigurationError, SummarizationError

SUMMARY_TAG = "langchain_compaction:summary"
"""Tag on every summary call, so traces can find them."""

SUMMARY_RUN_NAME = "langchain_compaction_summary"
"""Run name of every summary call."""

logger = logging.getLogger("langchain_compaction")


def _reply(output: object, *, covers_prefix: bool = False, budget: int | None = None) -> str | SummaryReply:
    """A model's output as a ``SummaryReply``: its text, and its usage when reported.

    Anything that is not a message is handed on as it is, for the engine to
    reject with an error that names what the model returned. ``budget``: the
    tokens the summary was asked to keep within (what a cut-short answer is told by).
    """
    if isinstance(output, SummaryReply):
        return SummaryReply(output.text, output.usage, covers_prefix)
    if not isinstance(output, (BaseMessage, str)):
        return cast("str", output)
    refusal = _refusal(output)
    if refusal:
        # A refusal is no summary, whatever text came with it ("I can't help with that").
        raise SummarizationError(
            f"compaction summarisation failed: the model declined to summarize this conversation ({refusal}); "
            "pass fallback=ExtractiveSummarizer() to compact it anyway"
        )
    # ``.text`` joins the text blocks and skips thinking and tool-use blocks. A
    # reply that calls a tool (asked over the agent's request, tools bound) is
    # no summary, whatever it says first ("Let me look that up."): no text.
    text = str(output.text) if isinstance(output, BaseMessage) else output
    if isinstance(output, AIMessage) and output.tool_calls:
        if not covers_prefix:  # (over the agent's own request the engine asks again, from the transcript)
            names = ", ".join(sorted({str(call.get("name")) for call in output.tool_calls}))
            raise SummarizationError(
                f"compaction summarisation failed: the summarizer model answered with a tool call ({names}), not a "
                "summary; pass a model without tools bound (the agent's model before .bind_tools(...)), or "
                "fallback=ExtractiveSummarizer()"
            )
        text = ""
    if isinstance(output, AIMessage) and _cut_short(output):
        _warn_cut_short(text, budget)
    meta = output.usage_metadata if isinstance(output, AIMessage) else None
    if not meta:
        return SummaryReply(text, covers_prefix=covers_prefix)
    details = meta.get("input_token_details") or {}
    cached = int(details.get("cache_read") or 0)
    # langchain-anthropic reports writes by cache lifetime, and then zeroes the total.
    written = int(details.get("cache_creation") or 0) or sum(
        int(details.get(key) or 0) for key in ("ephemeral_5m_input_tokens", "ephemeral_1h_input_tokens")
    )
    usage = Usage(
        input_tokens=max(int(meta.get("input_tokens") or 0) - cached - written, 0),
        output_tokens=int(meta.get("output_tokens") or 0),
        cache_read_input_tokens=cached,
        cache_creation_input_tokens=written,
    )
    return SummaryReply(text, usage, covers_prefix)


def _warn_cut_short(text: str, budget: int | None) -> None:
    """Warn that a reply stopped at the model's output limit, with the fix that fits: a larger limit, or none."""
    size = estimate_tokens(text)
    if budget is not None and size > budget:
        # A larger max_tokens would only let it run on: the budget check rejects it (then the fallback).
        logger.warning(
            "the summarizer model ran on to its output limit, past the length it was asked for (about %d "
            "tokens for %d): it does not keep to that length; a stronger model helps, and "
            "fallback=ExtractiveSummarizer() stands in for an answer rejected as too long",
            size,
            budget,
        )
    else:
        logger.warning(
            "the summary hit the model's output limit and was cut short; give the summarizer model a max_tokens "
            "of at least summary_max_tokens (ChatAnthropic(max_tokens=...), ChatOpenAI(max_tokens=...))"
        )


def _cut_short(output: AIMessage) -> bool:
    """Whether the reply stopped at the model's output limit (Anthropic's stop reason, OpenAI's finish reason)."""
    meta = output.response_metadata or {}
    return meta.get("stop_reason") == "max_tokens" or meta.get("finish_reason") in ("length", "max_tokens")


def _refusal(output: BaseMessage | str) -> str:
    """How a chat model said it declined (Anthropic's stop reason, OpenAI's refusal or content filter), or ""."""
    if not isinstance(output, AIMessage):
        return ""
    meta = output.response_metadata or {}
    if meta.get("stop_reason") == "refusal":
        return "stop_reason=refusal"
    if meta.get("finish_reason") == "content_filter":
        return "finish_reason=content_filter"
    if output.additional_kwargs.get("refusal"):
        return "a refusal"
    # (OpenAI's Responses API: a content block of its own.)
    blocks = output.content if isinstance(output.content, list) else []
    return "a refusal" if any(isinstance(b, dict) and b.get("type") == "refusal" for b in blocks) else ""


def uses_prefix(request: SummaryRequest) -> bool:
    """Whether a summarizer that can should send ``request.prefix`` (the cache-aligned mode).

    Only a first ask carries it usefully: a retry states a problem with the
    transcript's answer and goes with the transcript.
    """
    return bool(request.prefix) and request.attempt == 0 and all(isinstance(m, BaseMessage) for m in request.prefix)


def _config(request: SummaryRequest) -> RunnableConfig:
    # TAG_NOSTREAM keeps the summary's tokens out of the user's stream in
    # LangGraph's "messages" stream mode.
    return RunnableConfig(
        tags=[TAG_NOSTREAM, SUMMARY_TAG],
        run_name=SUMMARY_RUN_NAME,
        metadata={"compaction_chunk": request.chunk_index, "compaction_chunks": request.chunk_count},
    )


# Chat model classes whose client takes a per-call ``timeout`` keyword (their
# ``invoke`` keywords go to the provider SDK's create call).
_TIMEOUT_KEYWORD_MODULES = ("langchain_anthropic", "langchain_openai")


def _client_timeout(
    model: Runnable[Any, Any], request: SummaryRequest, clients: Sequence[object] | None = None
) -> dict[str, Any]:
    """``{"timeout": seconds}`` when every client ``model`` may call is known to take it per call, else nothing.

    ``clients``: ``_clients(model)``, when the caller has them already.
    """
    if request.timeout is None:
        return {}
    clients = list(_clients(model)) if clients is None else clients
    known = bool(clients) and all(type(c).__module__.startswith(_TIMEOUT_KEYWORD_MODULES) for c in clients)
    return {"timeout": request.timeout} if known else {}


def _clients(model: Any, depth: int = 0) -> Iterator[object]:
    """The chat models a Runnable calls.

    Through ``.bind`` and ``with_retry`` (``bound``), ``with_fallbacks``
    (``runnable`` and ``fallbacks``), a pipe (each of its steps: ``model |
    StrOutputParser()``) and ``init_chat_model``'s configurable model (the one
    its default config names).
    """
    if depth > 8:  # (a wrapper of wrappers this deep: nothing known)
        yield model
        return
    if isinstance(model, RunnableWithFallbacks):
        for inner in (model.runnable, *model.fallbacks):
            yield from _clients(inner, depth + 1)
    elif isinstance(model, RunnableSequence):
        for step in model.steps:
            yield from _clients(step, depth + 1)
    elif hasattr(model, "bound"):
        yield from _clients(model.bound, depth + 1)
    elif callable(getattr(model, "_model", None)) and hasattr(model, "_default_config"):
        try:
            default = model._model()  # (the model its default config names: built, not called)
        except Exception:  # a configurable model with no default: its client is not known
            yield model
        else:
            yield from _clients(default, depth + 1)
    else:
        yield model


_EXECUTOR_AGENERATE = frozenset({"BaseChatModel._agenerate", "SimpleChatModel._agenerate"})
"""LangChain's own async paths that run the sync one on asyncio's default executor."""


def _blocking(client: object) -> bool:
    """Whether LangChain's ``ainvoke`` of ``client`` runs it on asyncio's default executor (no async path of its own).

    A chat model without an ``_agenerate`` of its own, and a ``RunnableLambda``
    of a plain function (``afunc`` unset).
    """
    if isinstance(client, BaseChatModel):
        return type(client)._agenerate.__qualname__ in _EXECUTOR_AGENERATE
    return isinstance(client, RunnableLambda) and getattr(client, "afunc", None) is None


def _runs_blocking(clients: Sequence[object]) -> bool:
    """Whether a model calling ``clients`` is run with ``invoke`` on a thread of its own, not awaited.

    One of them would take asyncio's default executor, and none can run only
    awaited (a ``RunnableLambda`` of an ``async def`` alone, in a pipe beside a
    sync-only model: ``invoke`` would refuse it).
    """
    return any(map(_blocking, clients)) and not any(
        isinstance(c, RunnableLambda) and not hasattr(c, "func") for c in clients
    )


def _per_call(
    model: Runnable[Any, Any], request: SummaryRequest, aligned: bool, clients: Sequence[object] | None = None
) -> dict[str, Any]:
    """The keywords of one summary call: the client's timeout, and a cache read for an aligned Claude request.

    Claude's prompt cache is read only by a request that asks for it: a
    cache-aligned request to the direct API (``ChatAnthropic``) carries a
    breakpoint, and the cache finds the agent's own cached prefix before it.
    """
    keywords = _client_timeout(model, request, clients)
    bound = getattr(model, "bound", model)
    if aligned and getattr(bound, "_llm_type", None) == "anthropic-chat":
        from langchain_compaction.anthropic.wire import MOST_BREAKPOINTS, cache_breakpoints

        # (Four at most in a request: a prefix that carries four of the agent's is read at those.)
        contents = (getattr(m, "content", None) for m in request.prefix)
        if cache_breakpoints((), request.prefix_tools, contents) < MOST_BREAKPOINTS:
            keywords["cache_control"] = {"type": "ephemeral"}
    return keywords


@dataclass(frozen=True, slots=True)
class ChatModelSummarizer:
    """Summarizes with any LangChain chat model or Runnable over messages.

    The model receives ``[SystemMessage(system prompt), HumanMessage(prompt)]``
    and its reply's text is the summary. In the cache-aligned mode
    (``CompactionOptions(summary_mode="cache_aligned")``) it receives the
    conversation's own messages before the cut instead, then the instruction,
    so pass the same model (with the same tools bound) that runs the
    conversation to hit its prompt cache.

    Example:
        >>> from langchain_core.language_models import FakeListChatModel
        >>> s = ChatModelSummarizer(FakeListChatModel(responses=["## Goal ..."]))
        >>> s.name
        'FakeListChatModel'
    """

    model: Runnable[Any, Any]

    @property
    def name(self) -> str:
        """The model's class name."""
        return type(self.model).__name__

    @staticmethod
    def _input(request: SummaryRequest) -> tuple[list[BaseMessage], bool]:
        """What the model is sent, and whether it is the request's own prefix."""
        if uses_prefix(request):
            # Cache-aligned: the conversation's own messages, unchanged, then
            # the instruction; the provider's prompt cache serves the prefix.
            prefix = [m for m in request.prefix if isinstance(m, BaseMessage)]
            return [*prefix, HumanMessage(content=request.prefix_prompt)], True
        return [SystemMessage(content=request.system), HumanMessage(content=request.prompt)], False

    def _model(self, request: SummaryRequest, aligned: bool) -> Runnable[Any, Any]:
        # The conversation's own tools go with its prefix, so the provider's
        # cache (tools first) matches the agent's requests.
        if not (aligned and request.prefix_tools):
            return self.model
        # (Looked up only when there are tools to bind: a model with fallbacks
        # answers the lookup through LangChain's own ``__getattr__``, which can
        # raise; and BaseChatModel's own ``bind_tools`` raises NotImplementedError
        # on a model without tool support: either way it is asked without them.)
        try:
            bind = getattr(self.model, "bind_tools", None)
        except Exception:
            return self.model
        if not callable(bind):
            return self.model
        try:
            return cast("Runnable[Any, Any]", bind(list(request.prefix_tools)))
        except NotImplementedError:
            return self.model

    def summarize(self, request: SummaryRequest) -> str | SummaryReply:
        """Invoke the model; see ``Summarizer``."""
        messages, aligned = self._input(request)
        model = self._model(request, aligned)
        output = model.invoke(messages, config=_config(request), **_per_call(model, request, aligned))
        return _reply(output, covers_prefix=aligned, budget=request.max_tokens)

    async def asummarize(self, request: SummaryRequest) -> str | SummaryReply:
        """Await the model's ``ainvoke``; see ``Summarizer``.

        A chat model with no async path of its own (LangChain would run it
        on asyncio's default executor, where a hung call holds a thread every
        other task may need, and ``asyncio.run`` waits for it) is called on a
        thread of its own instead (``blocking_summary``).
        """
        messages, aligned = self._input(request)
        model = self._model(request, aligned)
        clients = tuple(_clients(model))  # (once: a configurable model builds its default to tell)
        keywords = _per_call(model, request, aligned, clients)
        if _runs_blocking(clients):
            call = functools.partial(model.invoke, messages, config=_config(request), **keywords)
            output = await blocking_summary(request, call)
        else:
            output = await model.ainvoke(messages, config=_config(request), **keywords)
        return _reply(output, covers_prefix=aligned, budget=request.max_tokens)


@dataclass(frozen=True, slots=True)
class CallableSummarizer:
    """Summarizes with a plain function from prompt text to summary text.

    The function receives one string, the system prompt and the prompt joined
    by a blank line. An ``async def`` function (or one returning an awaitable)
    is awaited on the async path.

    Example:
        >>> s = CallableSummarizer(lambda prompt: "## Goal\\n- test")
        >>> s.name
        '<lambda>'
    """

    function: Callable[[str], Any]

    @property
    def name(self) -> str:
        """The function's name."""
        return getattr(self.function, "__name__", type(self.function).__name__)

    @staticmethod
    def _input(request: SummaryRequest) -> str:
        return f"{request.system}\n\n{request.prompt}"

    def summarize(self, request: SummaryRequest) -> str | SummaryReply:
        """Call the function; see ``Summarizer``."""
        fix = "call acompact / ainvoke instead, or pass a blocking function"
        if self._is_async():
            return _reply(refuse_awaitable(self.function(self._input(request)), self.function, "model", fix))
        answer = self._step().invoke(self._input(request), _config(request))[0]
        return _reply(refuse_awaitable(answer, self.function, "model", fix))

    def _step(self) -> RunnableLambda[str, tuple[Any]]:
        """The function as a step of the caller's run, tagged as the summary's (``_config``).

        A chat model the function calls inherits the tags, so its tokens stay
        out of the user's ``stream_mode="messages"`` stream and an
        ``astream_events`` filter on ``SUMMARY_TAG`` holds them back, as for a
        chat model passed itself.
        """
        function = self.function

        # Called with the prompt alone, its answer boxed: RunnableLambda would hand a function that names
        # a ``config`` parameter the run's config, and invoke an answer that is a Runnable.
        def step(prompt: str) -> tuple[Any]:
            return (function(prompt),)

        async def astep(prompt: str) -> tuple[Any]:
            return (await function(prompt),)

        return RunnableLambda(astep if self._is_async() else step, name=self.name)

    def _is_async(self) -> bool:
        return inspect.iscoroutinefunction(self.function) or inspect.iscoroutinefunction(
            getattr(self.function, "__call__", None)  # noqa: B004 - async callable objects
        )

    async def asummarize(self, request: SummaryRequest) -> str | SummaryReply:
        """Await an async function; run a blocking one in a worker thread.

        A blocking function called on the event loop would stall every other
        task and could not be interrupted by ``timeout``.
        """
        if self._is_async():
            result = (await self._step().ainvoke(self._input(request), _config(request)))[0]
        else:
            step = self._step()
            result = (await blocking_summary(request, step.invoke, self._input(request), _config(request)))[0]
            if inspect.isawaitable(result):
                result = await result
        return _reply(result)


def as_summarizer(model: object, *, field: str = "model") -> Summarizer:
    """Accept whatever a user passes as ``model`` and make it a ``Summarizer``.

    Args:
        model: A ``Summarizer`` (such as ``ExtractiveSummarizer``), a chat model
            or other ``Runnable``, or a callable from prompt text to text.
        field: The argument's name, for the error message.

    Returns:
        A summarizer.

    Raises:
        ConfigurationError: ``model`` is none of those.
    """
    if isinstance(model, type):
        # (A class is callable: taken as a function, it failed at the first compaction.)
        raise ConfigurationError(field, model, f"pass an instance, not the class: {model.__name__}(...)")
    if isinstance(model, Summarizer) and not isinstance(model, Runnable):
        return model
    if isinstance(model, Runnable):
        return ChatModelSummarizer(model)
    if callable(model):
        _check_takes_a_prompt(model, field)
        return CallableSummarizer(model)
    raise ConfigurationError(
        field,
        model,
        "pass a LangChain chat model (e.g. ChatAnthropic(...)), a Runnable, a function "
        "from prompt text to summary text, or ExtractiveSummarizer() to work offline",
    )


def _check_takes_a_prompt(function: Callable[..., Any], field: str) -> None:
    """Refuse, at construction, a function that cannot be called with the prompt alone."""
    check_callable(field, function, "a function called with the prompt text alone, f(prompt) -> summary text", ("p",))
