"""Summarizers over LangChain chat models, Runnables and plain callables."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.runnables import Runnable, RunnableConfig
from langgraph.constants import TAG_NOSTREAM

from langchain_compaction.core.engine import Summarizer
from langchain_compaction.core.types import SummaryRequest, SummaryText, Usage
from langchain_compaction.errors import ConfigurationError

SUMMARY_TAG = "langchain_compaction:summary"
"""Tag on every summary call, so traces can find them."""

SUMMARY_RUN_NAME = "langchain_compaction_summary"
"""Run name of every summary call."""


def _text(output: object) -> object:
    """Text of a model's output: a message's text blocks, or a string as is.

    A reply with ``usage_metadata`` becomes a ``SummaryText`` carrying it, so
    the result can report billed and cached tokens.
    """
    if isinstance(output, AIMessage):
        # ``.text`` joins the text blocks and skips thinking and tool-use blocks.
        meta = output.usage_metadata
        if not meta:
            return str(output.text)
        details = meta.get("input_token_details") or {}
        cached = int(details.get("cache_read") or 0)
        written = int(details.get("cache_creation") or 0)
        usage = Usage(
            input_tokens=max(int(meta.get("input_tokens") or 0) - cached - written, 0),
            output_tokens=int(meta.get("output_tokens") or 0),
            cache_read_input_tokens=cached,
            cache_creation_input_tokens=written,
        )
        return SummaryText(str(output.text), usage)
    if isinstance(output, BaseMessage):
        return str(output.text)
    return output


def _aligned(text: object, sent: list[BaseMessage], request: SummaryRequest) -> str:
    """Mark a summary written from the request's prefix (it covers the region)."""
    if not isinstance(text, str) or len(sent) != len(request.prefix) + 1 or not request.prefix:
        return text  # type: ignore[return-value]
    return SummaryText(str(text), getattr(text, "usage", None), aligned=True)


def _config(request: SummaryRequest) -> RunnableConfig:
    # TAG_NOSTREAM keeps the summary's tokens out of the user's stream in
    # LangGraph's "messages" stream mode.
    return RunnableConfig(
        tags=[TAG_NOSTREAM, SUMMARY_TAG],
        run_name=SUMMARY_RUN_NAME,
        metadata={"compaction_chunk": request.chunk_index, "compaction_chunks": request.chunk_count},
    )


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
    def _input(request: SummaryRequest) -> list[BaseMessage]:
        if request.prefix and all(isinstance(m, BaseMessage) for m in request.prefix) and request.attempt == 0:
            # Cache-aligned: the conversation's own messages, unchanged, then
            # the instruction; the provider's prompt cache serves the prefix.
            prefix = [m for m in request.prefix if isinstance(m, BaseMessage)]
            return [*prefix, HumanMessage(content=request.prefix_prompt)]
        return [SystemMessage(content=request.system), HumanMessage(content=request.prompt)]

    def summarize(self, request: SummaryRequest) -> str:
        """Invoke the model; see ``Summarizer``."""
        messages = self._input(request)
        return _aligned(_text(self.model.invoke(messages, config=_config(request))), messages, request)

    async def asummarize(self, request: SummaryRequest) -> str:
        """Await the model's ``ainvoke``; see ``Summarizer``."""
        messages = self._input(request)
        return _aligned(_text(await self.model.ainvoke(messages, config=_config(request))), messages, request)


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

    def summarize(self, request: SummaryRequest) -> str:
        """Call the function; see ``Summarizer``."""
        result = self.function(self._input(request))
        if inspect.isawaitable(result):
            close = getattr(result, "close", None)
            if close is not None:
                close()  # do not leave a never-awaited coroutine behind
            msg = (
                "an async summarizer function was used on the sync path; "
                "call acompact / ainvoke instead, or pass a blocking function"
            )
            raise ConfigurationError("model", self.function, msg)
        return _text(result)  # type: ignore[return-value]

    async def asummarize(self, request: SummaryRequest) -> str:
        """Await an async function; run a blocking one in a worker thread.

        A blocking function called on the event loop would stall every other
        task and could not be interrupted by ``timeout``.
        """
        if inspect.iscoroutinefunction(self.function) or inspect.iscoroutinefunction(
            getattr(self.function, "__call__", None)  # noqa: B004 - async callable objects
        ):
            result = await self.function(self._input(request))
        else:
            result = await asyncio.to_thread(self.function, self._input(request))
            if inspect.isawaitable(result):
                result = await result
        return _text(result)  # type: ignore[return-value]


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
    if isinstance(model, Summarizer) and not isinstance(model, Runnable):
        return model
    if isinstance(model, Runnable):
        return ChatModelSummarizer(model)
    if callable(model):
        return CallableSummarizer(model)
    raise ConfigurationError(
        field,
        model,
        "pass a LangChain chat model (e.g. ChatAnthropic(...)), a Runnable, a function "
        "from prompt text to summary text, or ExtractiveSummarizer() to work offline",
    )
