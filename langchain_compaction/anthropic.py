"""Exact token counts and summaries through the Anthropic SDK.

``AnthropicTokenCounter`` asks ``client.messages.count_tokens`` for the exact
input size of LangChain messages (system prompt and tools included);
``CalibratedEstimate`` scales the built-in estimate by the ratio it learns from
the usage Claude reports on replies, for when no counting call is wanted; and
``AnthropicSummarizer`` writes the summary with ``client.messages.create``.

What a count means:

- ``counter.count_each(messages)`` gives one count per message whose sum is
  the exact size of the whole request less ``counter.overhead_tokens`` (the
  system prompt, the tools and a one-character placeholder turn). It sends one
  request per new state of the conversation: the exact total of every prefix
  it has counted is cached by a hash chain over the messages, so when the
  conversation grows only the new messages' share is worked out (the total of
  the grown list, less the cached total of its prefix, split over the new
  messages in proportion to their estimates).
- ``counter([m])`` (how the adapters call a ``token_counter`` today) is the
  exact size of the smallest valid request holding ``m`` alone, less the same
  overhead, cached per message. A message that cannot stand alone is sent with
  the smallest partner the API accepts (a tool result after a stub call, an
  assistant turn between one-character user turns), and the partner's tokens
  are included: per-message counts err high by a few tokens (about ten per
  tool call), never low by more than the one-character placeholder.

On a network failure (connection errors, timeouts, 429 and 5xx after the SDK's
own retries) the counter falls back to the built-in estimate with a warning on
the ``langchain_compaction`` logger, never to zero, and stops calling the API
for ``retry_after`` seconds. Credentials and model errors (401, 403, 404) raise
``ConfigurationError``: a counter that silently estimates forever hides a bad
key.
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib
import json
import logging
import math
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import anthropic
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)

from langchain_compaction.adapters._convert import is_summary_message
from langchain_compaction.adapters.messages import estimate_message_tokens
from langchain_compaction.core.types import SummaryRequest
from langchain_compaction.errors import ConfigurationError, SummarizationError

__all__ = [
    "AnthropicSummarizer",
    "AnthropicTokenCounter",
    "AnthropicUsage",
    "CalibratedEstimate",
    "SummaryText",
]

logger = logging.getLogger("langchain_compaction")

_PLACEHOLDER = "."
# The SDK refuses a non-streaming call it expects to run past ten minutes:
# 3600 s * max_tokens / 128,000 > 600 s, i.e. above 21,333 output tokens.
_MAX_NONSTREAMING_TOKENS = 21_333
# Statuses that say the request itself is fine but the service is not.
_TRANSIENT_STATUS = frozenset({408, 409, 429})
_CONFIG_STATUS = frozenset({401, 403, 404})
_RATIO_BOUNDS = (0.2, 5.0)

ApiMessage = dict[str, Any]
"""One message in the Messages API's request format (``role`` and ``content``)."""


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"), default=str)


def _digest(*parts: str) -> str:
    hasher = hashlib.sha256()
    for part in parts:
        hasher.update(part.encode("utf-8", "surrogatepass"))
        hasher.update(b"\x00")
    return hasher.hexdigest()


# --- LangChain messages to the Messages API format ---------------------------------


def _langchain_anthropic_formatter() -> Callable[..., Any] | None:
    """``langchain_anthropic.chat_models._format_messages`` when installed.

    It is private, so it is looked up by name and any failure falls back to the
    small converter below rather than breaking counting.
    """
    try:
        module = importlib.import_module("langchain_anthropic.chat_models")
    except ImportError:
        return None
    formatter = getattr(module, "_format_messages", None)
    return formatter if callable(formatter) else None


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        pieces = []
        for block in content:
            if isinstance(block, str):
                pieces.append(block)
            elif isinstance(block, dict) and isinstance(block.get("text"), str):
                pieces.append(block["text"])
        return "\n".join(pieces)
    return "" if content is None else _json(content)


def _image_source(block: Mapping[str, Any]) -> dict[str, Any] | None:
    source = block.get("source")
    if isinstance(source, dict):
        return dict(source)
    if isinstance(block.get("base64"), str):
        return {
            "type": "base64",
            "media_type": block.get("mime_type") or "image/png",
            "data": block["base64"],
        }
    url = block.get("url")
    if block.get("type") == "image_url":
        image_url = block.get("image_url")
        url = image_url.get("url") if isinstance(image_url, dict) else image_url
    if isinstance(url, str):
        if url.startswith("data:") and ";base64," in url:
            head, data = url[5:].split(";base64,", 1)
            return {"type": "base64", "media_type": head or "image/png", "data": data}
        return {"type": "url", "url": url}
    return None


def _own_blocks(content: Any, skip_tool_use: frozenset[str]) -> list[dict[str, Any]]:
    """Content blocks in the API's format (the fallback converter)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content.strip() else []
    blocks: list[dict[str, Any]] = []
    for block in content if isinstance(content, list) else [content]:
        if isinstance(block, str):
            if block.strip():
                blocks.append({"type": "text", "text": block})
            continue
        if not isinstance(block, dict):
            blocks.append({"type": "text", "text": str(block)})
            continue
        kind = block.get("type")
        if kind == "text" or (kind is None and isinstance(block.get("text"), str)):
            if str(block.get("text", "")).strip():
                blocks.append({"type": "text", "text": str(block["text"])})
        elif kind in ("image", "image_url"):
            source = _image_source(block)
            if source is not None:
                blocks.append({"type": "image", "source": source})
        elif kind == "thinking":
            blocks.append({k: v for k, v in block.items() if k in ("type", "thinking", "signature")})
        elif kind == "redacted_thinking":
            blocks.append({k: v for k, v in block.items() if k in ("type", "data")})
        elif kind == "tool_use":
            if str(block.get("id")) not in skip_tool_use:
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": str(block.get("id")),
                        "name": str(block.get("name")),
                        "input": block.get("input") or {},
                    }
                )
        elif kind in ("reasoning", "function_call", "tool_call", "refusal"):
            continue  # other providers' blocks: the API has no input form for them
        elif kind == "tool_result" or kind in ("document", "search_result"):
            blocks.append(dict(block))
        else:
            # A block the API may not know: count its JSON as text rather than
            # risk a 400 for the whole request.
            blocks.append({"type": "text", "text": _json(block)})
    return blocks


def _own_convert(message: BaseMessage) -> list[ApiMessage]:
    """A LangChain message in the API's format, without langchain-anthropic."""
    if isinstance(message, AIMessage):
        ids = frozenset(str(c.get("id")) for c in message.tool_calls if c.get("id"))
        blocks = _own_blocks(message.content, ids)
        for call in message.tool_calls:
            blocks.append(
                {"type": "tool_use", "id": str(call.get("id")), "name": call["name"], "input": call.get("args") or {}}
            )
        return [{"role": "assistant", "content": blocks}]
    if isinstance(message, (ToolMessage, FunctionMessage)):
        content = message.content
        inner: str | list[dict[str, Any]] = content if isinstance(content, str) else _own_blocks(content, frozenset())
        call_id = message.tool_call_id if isinstance(message, ToolMessage) else (message.name or "function")
        result: dict[str, Any] = {"type": "tool_result", "tool_use_id": str(call_id), "content": inner}
        if isinstance(message, ToolMessage) and message.status == "error":
            result["is_error"] = True
        return [{"role": "user", "content": [result]}]
    role = "assistant" if isinstance(message, ChatMessage) and message.role in ("assistant", "ai") else "user"
    return [{"role": role, "content": _own_blocks(message.content, frozenset())}]


def _sanitize(messages: list[ApiMessage]) -> list[ApiMessage]:
    """Drop what the API rejects in input: unsigned thinking and empty turns."""
    clean: list[ApiMessage] = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            content = [
                b
                for b in content
                if not (isinstance(b, dict) and b.get("type") == "thinking" and not b.get("signature"))
            ]
        if not content or (isinstance(content, str) and not content.strip()):
            continue
        clean.append({"role": message.get("role", "user"), "content": content})
    return clean


def _to_api(message: BaseMessage, model: str, use_langchain_anthropic: bool) -> list[ApiMessage]:
    """One non-system LangChain message as API messages (usually one)."""
    formatter = _langchain_anthropic_formatter() if use_langchain_anthropic else None
    if formatter is not None and isinstance(message, (HumanMessage, AIMessage, ToolMessage)):
        try:
            _system, formatted = formatter([message], model=model)
            return _sanitize(list(formatted))
        except Exception:  # a private helper: any change in it must not break counting
            logger.debug("langchain-anthropic could not format a %s; using the built-in converter", message.type)
    return _sanitize(_own_convert(message))


def _tool_use_ids(message: ApiMessage) -> list[str]:
    content = message.get("content")
    if not isinstance(content, list):
        return []
    return [str(b.get("id")) for b in content if isinstance(b, dict) and b.get("type") == "tool_use"]


def _tool_result_ids(message: ApiMessage) -> list[str]:
    content = message.get("content")
    if not isinstance(content, list):
        return []
    return [str(b.get("tool_use_id")) for b in content if isinstance(b, dict) and b.get("type") == "tool_result"]


def _placeholder_user() -> ApiMessage:
    return {"role": "user", "content": _PLACEHOLDER}


def _answer(ids: Sequence[str]) -> ApiMessage:
    return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": i, "content": ""} for i in ids]}


def _merged(messages: Sequence[ApiMessage]) -> list[ApiMessage]:
    """Consecutive turns of one role joined into one, as the API does."""
    out: list[ApiMessage] = []
    for message in messages:
        if out and out[-1]["role"] == message["role"]:
            out[-1] = {
                "role": message["role"],
                "content": [*_as_blocks(out[-1]["content"]), *_as_blocks(message["content"])],
            }
        else:
            out.append(dict(message))
    return out


def _is_result(block: Any) -> bool:
    return isinstance(block, dict) and block.get("type") == "tool_result"


def _valid_sequence(messages: Sequence[ApiMessage], tool_names: Mapping[str, str]) -> list[ApiMessage]:
    """Pad a message run into a request the API accepts.

    Turns of one role are joined; a first assistant turn gets a placeholder
    user turn before it; a tool result with no call before it gets a stub
    call; a call with no result after it gets an empty result; a final
    assistant turn is followed by a placeholder user turn (or its calls'
    empty results), so the request never ends in a prefill (refused by newer
    models; a final assistant turn may not end in whitespace or carry thinking).
    Padding only adds tokens, so counts err high, never low.
    """
    turns = _merged(messages)
    if turns and (turns[0]["role"] == "assistant" or _tool_result_ids(turns[0])):
        turns.insert(0, _placeholder_user())
    out: list[ApiMessage] = []
    for index, turn in enumerate(turns):
        if turn["role"] != "user" or index == 0:
            out.append(turn)
            continue
        previous = out[-1] if out and out[-1]["role"] == "assistant" else None
        calls = _tool_use_ids(previous) if previous else []
        results = _tool_result_ids(turn)
        orphans = [i for i in results if i not in calls]
        unanswered = [i for i in calls if i not in results]
        if orphans:
            stubs = [{"type": "tool_use", "id": i, "name": tool_names.get(i) or "tool", "input": {}} for i in orphans]
            if previous is None:
                out.append({"role": "assistant", "content": stubs})
            else:
                out[-1] = {"role": "assistant", "content": [*_as_blocks(previous["content"]), *stubs]}
        blocks = _as_blocks(turn["content"])
        if unanswered or orphans or any(_is_result(b) for b in blocks):
            # Results first: the API wants them at the start of the turn.
            padding = [{"type": "tool_result", "tool_use_id": i, "content": ""} for i in unanswered]
            ordered = [b for b in blocks if _is_result(b)] + [b for b in blocks if not _is_result(b)]
            if padding or ordered != blocks:
                out.append({"role": "user", "content": [*padding, *ordered]})
                continue
        out.append(turn)
    if out and out[-1]["role"] == "assistant":
        pending = _tool_use_ids(out[-1])
        out.append(_answer(pending) if pending else _placeholder_user())
    return out or [_placeholder_user()]


def _as_blocks(content: Any) -> list[Any]:
    if isinstance(content, list):
        return list(content)
    return [{"type": "text", "text": str(content)}]


def _convert_tools(tools: Sequence[Any] | None) -> list[dict[str, Any]] | None:
    """Tools in the API's format: dicts pass through, LangChain tools are converted."""
    if not tools:
        return None
    converted: list[dict[str, Any]] = []
    for tool in tools:
        if isinstance(tool, dict) and ("input_schema" in tool or "type" in tool):
            converted.append(dict(tool))
            continue
        try:
            module = importlib.import_module("langchain_anthropic.chat_models")
            converted.append(dict(module.convert_to_anthropic_tool(tool)))
        except ImportError:
            from langchain_core.utils.function_calling import convert_to_openai_tool

            function = convert_to_openai_tool(tool)["function"]
            converted.append(
                {
                    "name": function["name"],
                    "description": function.get("description", ""),
                    "input_schema": function.get("parameters", {"type": "object", "properties": {}}),
                }
            )
    return converted


def _largest_remainder(total: int, weights: Sequence[int]) -> list[int]:
    """Split ``total`` in proportion to ``weights``; the parts sum to ``total``."""
    if not weights:
        return []
    weight_sum = sum(weights)
    if weight_sum <= 0:
        weights, weight_sum = [1] * len(weights), len(weights)
    shares = [total * w / weight_sum for w in weights]
    parts = [math.floor(s) for s in shares]
    order = sorted(range(len(shares)), key=lambda i: shares[i] - parts[i], reverse=True)
    for i in order[: total - sum(parts)]:
        parts[i] += 1
    return parts


# --- the counter ----------------------------------------------------------------


class _Unavailable(Exception):
    """The count could not be made; the caller falls back to the estimate."""


class _Refused(_Unavailable):
    """The API refused the request itself (400, 413, 422): retrying will not help."""


class _LRU:
    """A small thread-safe LRU map from str keys to ints."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._data: OrderedDict[str, int] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> int | None:
        with self._lock:
            value = self._data.get(key)
            if value is not None:
                self._data.move_to_end(key)
            return value

    def put(self, key: str, value: int) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self._size:
                self._data.popitem(last=False)

    def __len__(self) -> int:
        return len(self._data)


class AnthropicTokenCounter:
    """Exact token counts from Claude's ``count_tokens`` endpoint, cached.

    Usable as ``CompactionOptions(token_counter=...)``: a callable over a list
    of LangChain messages returning an int. See the module docstring for what
    ``counter([m])`` and ``count_each(messages)`` mean and what they cost.

    Args:
        client_or_model_name: An ``anthropic.Anthropic`` client, or a model
            name (a client is then made from ``ANTHROPIC_API_KEY`` on first use).
        model: The model whose tokenizer counts; required with a client.
        system: A system prompt sent with every request of the conversation
            that is not among the messages (an agent's prompt), counted in
            ``overhead_tokens``.
        tools: The tools the conversation is sent with (API dicts or LangChain
            tools), counted in ``overhead_tokens``.
        cache_size: Per-message counts and prefix totals kept (each).
        retry_after: Seconds to stop calling the API after a network failure.
        use_langchain_anthropic: Convert messages with langchain-anthropic when
            installed (the same conversion ``ChatAnthropic`` sends); the
            built-in converter otherwise.
        fallback: Counts a list of messages when the API cannot; the built-in
            estimate by default.

    Example:
        >>> import anthropic, httpx2
        >>> from langchain_core.messages import HumanMessage
        >>> def handler(request):
        ...     return httpx2.Response(200, json={"input_tokens": 12})
        >>> client = anthropic.Anthropic(
        ...     api_key="test", http_client=httpx2.Client(transport=httpx2.MockTransport(handler)))
        >>> counter = AnthropicTokenCounter(client, model="claude-haiku-4-5")
        >>> counter.overhead_tokens, counter.total([HumanMessage("hello")])
        (12, 12)
    """

    def __init__(
        self,
        client_or_model_name: anthropic.Anthropic | str,
        *,
        model: str | None = None,
        system: str | None = None,
        tools: Sequence[Any] | None = None,
        cache_size: int = 4096,
        retry_after: float = 30.0,
        use_langchain_anthropic: bool = True,
        fallback: Callable[[Sequence[BaseMessage]], int] | None = None,
    ) -> None:
        if isinstance(client_or_model_name, str):
            if not client_or_model_name.strip():
                raise ConfigurationError("client_or_model_name", client_or_model_name, "pass a model name")
            if model is not None and model != client_or_model_name:
                raise ConfigurationError(
                    "model", model, f"a model name was already given ({client_or_model_name!r}); pass one of them"
                )
            self._client: anthropic.Anthropic | None = None
            self.model = client_or_model_name
        elif isinstance(client_or_model_name, anthropic.AsyncAnthropic):
            raise ConfigurationError(
                "client_or_model_name",
                client_or_model_name,
                "token counting runs inside the synchronous cut; pass anthropic.Anthropic(...) instead",
            )
        elif isinstance(client_or_model_name, anthropic.Anthropic):
            if not model:
                raise ConfigurationError(
                    "model", model, 'pass the model whose tokenizer counts, e.g. "claude-haiku-4-5"'
                )
            self._client = client_or_model_name
            self.model = model
        else:
            raise ConfigurationError(
                "client_or_model_name",
                client_or_model_name,
                "pass an anthropic.Anthropic client or a model name",
            )
        if isinstance(cache_size, bool) or not isinstance(cache_size, int) or cache_size < 1:
            raise ConfigurationError("cache_size", cache_size, "pass a positive number of entries, e.g. 4096")
        if isinstance(retry_after, bool) or not isinstance(retry_after, (int, float)) or retry_after < 0:
            raise ConfigurationError("retry_after", retry_after, "pass 0 or more seconds")
        if system is not None and not isinstance(system, str):
            raise ConfigurationError("system", system, "pass the system prompt as a string, or None")
        self.system = system or None
        self.tools = _convert_tools(tools)
        self.retry_after = float(retry_after)
        self._use_langchain_anthropic = use_langchain_anthropic
        self._fallback = fallback or estimate_message_tokens
        self._messages = _LRU(cache_size)  # fingerprint -> per-message count
        self._prefixes = _LRU(cache_size)  # chain hash -> exact total of that prefix
        self._shares = _LRU(cache_size)  # chain hash -> the last message's share
        self._overhead: int | None = None
        self._lock = threading.Lock()
        self._down_until = 0.0
        self._warned = False
        self.requests = 0
        """How many ``count_tokens`` requests this counter has made."""
        self.fallbacks = 0
        """How many counts fell back to the estimate."""

    # -- the client and the requests ------------------------------------------------

    def _get_client(self) -> anthropic.Anthropic:
        with self._lock:
            if self._client is None:
                if not (os.environ.get("ANTHROPIC_API_KEY") or os.environ.get("ANTHROPIC_AUTH_TOKEN")):
                    raise ConfigurationError(
                        "client_or_model_name",
                        self.model,
                        "no client was given and ANTHROPIC_API_KEY is not set; set it, or pass "
                        "anthropic.Anthropic(api_key=...) as the first argument",
                    )
                self._client = anthropic.Anthropic()
            return self._client

    def _system_param(self, extra: Sequence[str] = ()) -> str | list[dict[str, Any]] | None:
        texts = [t for t in ([self.system] if self.system else []) + list(extra) if t]
        if not texts:
            return None
        if len(texts) == 1:
            return texts[0]
        return [{"type": "text", "text": t} for t in texts]

    def _request(self, messages: list[ApiMessage], system_extra: Sequence[str] = ()) -> int:
        """One exact count; raises ``_Unavailable`` when it cannot be had."""
        if time.monotonic() < self._down_until:
            raise _Unavailable("the API failed recently")
        kwargs: dict[str, Any] = {"model": self.model, "messages": messages}
        system = self._system_param(system_extra)
        if system is not None:
            kwargs["system"] = system
        if self.tools:
            kwargs["tools"] = self.tools
        client = self._get_client()
        self.requests += 1
        try:
            result = client.messages.count_tokens(**kwargs)
        except anthropic.APIStatusError as exc:
            status = exc.status_code
            detail = exc.api_message or exc.message
            if status in _CONFIG_STATUS:
                raise ConfigurationError(
                    "client_or_model_name" if status != 404 else "model",
                    self.model,
                    f"count_tokens failed with {status}: {detail}; check the API key and the model name",
                ) from exc
            if status >= 500 or status in _TRANSIENT_STATUS:
                self._mark_down(f"{status} {detail}")
                raise _Unavailable(f"{status} {detail}") from exc
            raise _Refused(f"{status} {detail}") from exc
        except anthropic.APIConnectionError as exc:  # APITimeoutError included
            self._mark_down(f"{type(exc).__name__}: {exc.message}")
            raise _Unavailable(str(exc)) from exc
        self._warned = False
        return int(result.input_tokens)

    def _mark_down(self, reason: str) -> None:
        self._down_until = time.monotonic() + self.retry_after
        if not self._warned:
            self._warned = True
            logger.warning(
                "Anthropic count_tokens failed (%s); using the built-in estimate for %.0f s",
                reason,
                self.retry_after,
            )

    def _estimate(self, messages: Sequence[BaseMessage], why: str) -> int:
        self.fallbacks += 1
        value = int(self._fallback(messages))
        logger.debug("token count estimated (%s): %d", why, value)
        # Never zero: a message always costs its framing.
        return max(value, 1)

    # -- conversion -------------------------------------------------------------------

    def _converted(self, message: BaseMessage) -> tuple[str, list[ApiMessage], str | None]:
        """(fingerprint, API messages, system text) for one message."""
        if isinstance(message, SystemMessage):
            text = _text_of(message.content)
            return _digest("system", text), [], text
        api = _to_api(message, self.model, self._use_langchain_anthropic)
        return _digest("message", _json(api)), api, None

    @staticmethod
    def _tool_names(messages: Sequence[BaseMessage]) -> dict[str, str]:
        names: dict[str, str] = {}
        for message in messages:
            if isinstance(message, ToolMessage) and message.name:
                names[message.tool_call_id] = message.name
        return names

    # -- public counting --------------------------------------------------------------

    def _measured_overhead(self) -> int:
        """The overhead, measured on first use; raises ``_Unavailable``."""
        if self._overhead is None:
            self._overhead = self._request([_placeholder_user()])
        return self._overhead

    @property
    def overhead_tokens(self) -> int:
        """The fixed cost of a request: system prompt, tools, a placeholder turn.

        Measured once with the smallest valid request. Add it to the sum of the
        per-message counts to get the size of the whole request. While the API
        cannot be reached it is estimated (and measured on a later call).
        """
        try:
            return self._measured_overhead()
        except _Unavailable:
            estimate = 4 + (len(_json(self.tools)) // 4 if self.tools else 0)
            return estimate + (len(self.system) // 4 if self.system else 0)

    def count_message(self, message: BaseMessage) -> int:
        """The tokens of one message counted alone (see the module docstring)."""
        key, api, system_text = self._converted(message)
        cached = self._messages.get(key)
        if cached is not None:
            return cached
        try:
            overhead = self._measured_overhead()
            if system_text is not None:
                total = self._request([_placeholder_user()], [system_text])
            elif not api:
                total = overhead  # nothing the API would accept: an empty turn
            else:
                total = self._request(_valid_sequence(api, self._tool_names([message])))
        except _Refused as exc:
            logger.warning("Anthropic count_tokens refused a %s message (%s); estimating it", message.type, exc)
            return self._estimate([message], str(exc))
        except _Unavailable as exc:
            return self._estimate([message], str(exc))
        value = max(total - overhead, 0)
        self._messages.put(key, value)
        return value

    def count_each(self, messages: Sequence[BaseMessage]) -> list[int]:
        """One count per message; their sum is the exact request size less overhead.

        One request per new state of the conversation: a prefix counted
        before is not recounted, and its messages keep their counts.

        Args:
            messages: The conversation.

        Returns:
            A non-negative count per message.
        """
        messages = list(messages)
        converted = [self._converted(m) for m in messages]
        chain: list[str] = []
        previous = ""
        for key, _api, _system in converted:
            previous = _digest(previous, key)
            chain.append(previous)
        # The longest prefix whose total and every share are still cached.
        known, base, counts = 0, None, []
        for length in range(len(chain), 0, -1):
            prefix_total = self._prefixes.get(chain[length - 1])
            if prefix_total is not None:
                shares = [self._shares.get(h) for h in chain[:length]]
                if all(s is not None for s in shares):
                    known, base, counts = length, prefix_total, [int(s or 0) for s in shares]
                    break
        if known == len(messages):
            return counts
        rest = messages[known:]
        try:
            overhead = self._measured_overhead()
            if base is None:
                base = overhead
            total = self._request(*self._whole_request(messages, converted))
        except _Refused as exc:
            # The whole list was refused (repeated tool ids, orphan results...):
            # count the new messages one by one instead.
            logger.debug("count_tokens refused the whole list (%s); counting message by message", exc)
            return counts + [self.count_message(m) for m in rest]
        except _Unavailable as exc:
            return counts + [self._estimate([m], str(exc)) for m in rest]
        weights = [max(estimate_message_tokens([m]), 1) for m in rest]
        new = _largest_remainder(max(total - base, 0), weights)
        self._prefixes.put(chain[-1], total)
        for index, value in enumerate(new, start=known):
            self._shares.put(chain[index], value)
        return counts + new

    def _whole_request(
        self, messages: Sequence[BaseMessage], converted: Sequence[tuple[str, list[ApiMessage], str | None]]
    ) -> tuple[list[ApiMessage], list[str]]:
        system_texts: list[str] = []
        api: list[ApiMessage] = []
        for _key, parts, system_text in converted:
            if system_text is None:
                api.extend(parts)
            elif not api:
                system_texts.append(system_text)  # the leading system prompt
            elif system_text.strip():
                # The API has no system role mid-conversation; its text is
                # still read by the model, so count it as a user turn.
                api.append({"role": "user", "content": system_text})
        return _valid_sequence(api, self._tool_names(messages)), system_texts

    def total(self, messages: Sequence[BaseMessage]) -> int:
        """The exact input size of a request holding ``messages``, overhead included."""
        return self.overhead_tokens + sum(self.count_each(messages))

    def __call__(self, messages: Sequence[BaseMessage]) -> int:
        """Count ``messages`` (one message: ``count_message``; more: ``count_each``).

        Either way the count leaves out ``overhead_tokens``, so counts add up.
        """
        messages = list(messages)
        if len(messages) == 1:
            return self.count_message(messages[0])
        return sum(self.count_each(messages))

    @property
    def cache_info(self) -> dict[str, int]:
        """Entries cached and requests made, for tests and logs."""
        return {
            "messages": len(self._messages),
            "prefixes": len(self._prefixes),
            "requests": self.requests,
            "fallbacks": self.fallbacks,
        }


# --- calibration ----------------------------------------------------------------


def _model_of(message: AIMessage) -> str | None:
    metadata = message.response_metadata or {}
    model = metadata.get("model_name") or metadata.get("model")
    return str(model) if model else None


def _billed_input(message: AIMessage) -> int | None:
    usage = message.usage_metadata
    if not usage:
        return None
    value = usage.get("input_tokens")
    return int(value) if isinstance(value, int) and value > 0 else None


class CalibratedEstimate:
    """The built-in estimate, scaled by a ratio learned from billed usage.

    Each reply from Claude carries the input tokens it was billed for
    (``AIMessage.usage_metadata["input_tokens"]``, cache reads and writes
    included). Between two replies of the same model the billed input grows by
    exactly the tokens of the messages in between, so the ratio of that growth
    to the growth of the estimate is the estimate's error on this kind of
    content, with the fixed cost of system prompt and tools cancelled out.
    ``total(messages)`` then anchors on the last reply's billed input and adds
    the scaled estimate of only the messages since; ``__call__`` scales the
    estimate of any list (a per-message ``token_counter``).

    Args:
        model: The model whose ratio ``__call__`` applies; ``None`` uses the
            model of the most recently learned reply.
        default_ratio: The ratio before anything was learned.

    Example:
        >>> from langchain_core.messages import AIMessage, HumanMessage
        >>> def reply(text, billed):
        ...     return AIMessage(text, usage_metadata={"input_tokens": billed, "output_tokens": 5,
        ...                      "total_tokens": billed + 5}, response_metadata={"model_name": "claude-x"})
        >>> msgs = [HumanMessage("a" * 400), reply("ok", 150), HumanMessage("b" * 400), reply("ok", 360)]
        >>> calibrated = CalibratedEstimate()
        >>> round(calibrated.learn(msgs)["claude-x"], 2)
        1.94
    """

    def __init__(self, model: str | None = None, *, default_ratio: float = 1.0) -> None:
        low, high = _RATIO_BOUNDS
        if isinstance(default_ratio, bool) or not isinstance(default_ratio, (int, float)):
            raise ConfigurationError("default_ratio", default_ratio, "pass a number, e.g. 1.0")
        if not low <= default_ratio <= high:
            raise ConfigurationError("default_ratio", default_ratio, f"pass a ratio between {low} and {high}")
        self.model = model
        self.default_ratio = float(default_ratio)
        self._billed: dict[str, float] = {}
        self._estimated: dict[str, float] = {}
        self._single: dict[str, float] = {}
        self._seen: set[tuple[str, str]] = set()
        self._last_model: str | None = None
        self._lock = threading.Lock()

    @staticmethod
    def _since_summary(messages: Sequence[BaseMessage]) -> int:
        start = 0
        for index, message in enumerate(messages):
            if is_summary_message(message):
                start = index + 1
        return start

    def learn(self, messages: Sequence[BaseMessage]) -> dict[str, float]:
        """Learn from the replies in ``messages``; return the ratios now in force.

        Replies before the last compaction summary are skipped: their billed
        input counted messages the list no longer holds. A pair of replies is
        learned once, however often the conversation is passed in.
        """
        messages = list(messages)
        start = self._since_summary(messages)
        previous: dict[str, tuple[int, int, str]] = {}  # model -> (index, billed, key)
        for index in range(start, len(messages)):
            message = messages[index]
            if not isinstance(message, AIMessage):
                continue
            billed, model = _billed_input(message), _model_of(message)
            if billed is None or model is None:
                continue
            key = message.id or _digest(_json(message.content), str(billed))
            with self._lock:
                self._last_model = model
                if model in previous:
                    before, before_billed, before_key = previous[model]
                    grown = billed - before_billed
                    estimated = estimate_message_tokens(messages[before:index])
                    if grown > 0 and estimated > 0 and (before_key, key) not in self._seen:
                        self._seen.add((before_key, key))
                        self._billed[model] = self._billed.get(model, 0.0) + grown
                        self._estimated[model] = self._estimated.get(model, 0.0) + estimated
                else:
                    estimated = estimate_message_tokens(messages[start:index])
                    if estimated > 0:
                        # One reply alone: its billed input also holds the
                        # system prompt and tools, so this ratio errs high; it
                        # is used only until a pair of replies is seen.
                        self._single[model] = billed / estimated
            previous[model] = (index, billed, key)
        return self.ratios

    @property
    def ratios(self) -> dict[str, float]:
        """The learned ratio per model (billed tokens per estimated token)."""
        with self._lock:
            models = set(self._single) | set(self._billed)
        return {m: self.ratio(m) for m in sorted(models)}

    def ratio(self, model: str | None = None) -> float:
        """The ratio for ``model`` (default: ``self.model``, else the last learned)."""
        low, high = _RATIO_BOUNDS
        with self._lock:
            name = model or self.model or self._last_model
            if name is None:
                return self.default_ratio
            if self._estimated.get(name):
                value = self._billed[name] / self._estimated[name]
            else:
                value = self._single.get(name, self.default_ratio)
        return min(max(value, low), high)

    def __call__(self, messages: Sequence[BaseMessage]) -> int:
        """The estimate of ``messages`` times the ratio, rounded up."""
        return math.ceil(estimate_message_tokens(messages) * self.ratio())

    def total(self, messages: Sequence[BaseMessage]) -> int:
        """The input size of the next request: last billed input plus what came since.

        Learns from ``messages`` first. Without a reply carrying usage this is
        the scaled estimate of the whole list.
        """
        messages = list(messages)
        self.learn(messages)
        start = self._since_summary(messages)
        for index in range(len(messages) - 1, start - 1, -1):
            message = messages[index]
            if isinstance(message, AIMessage) and (billed := _billed_input(message)) is not None:
                output = message.usage_metadata["output_tokens"] if message.usage_metadata else 0
                anchor = billed + int(output or 0)
                rest = estimate_message_tokens(messages[index + 1 :]) if index + 1 < len(messages) else 0
                return anchor + math.ceil(rest * self.ratio(_model_of(message)))
        return self(messages)


# --- the summarizer --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AnthropicUsage:
    """The usage Claude reported for one summary call.

    Attributes:
        input_tokens: Uncached input tokens billed.
        output_tokens: Output tokens billed.
        cache_read_input_tokens: Input tokens read from the prompt cache.
        cache_creation_input_tokens: Input tokens written to the prompt cache.
        model: The model that answered.
        stop_reason: Why it stopped (``"max_tokens"`` means cut short).
        request_id: The API's request id, for support tickets.
    """

    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int = 0
    cache_creation_input_tokens: int = 0
    model: str = ""
    stop_reason: str | None = None
    request_id: str | None = None

    @property
    def total_input_tokens(self) -> int:
        """All input tokens: uncached, cache reads and cache writes."""
        return self.input_tokens + self.cache_read_input_tokens + self.cache_creation_input_tokens


class SummaryText(str):
    """The summary text, carrying the ``AnthropicUsage`` of the call that wrote it.

    A ``str`` in every way, so the engine treats it as any summary; a driver
    that wants the usage reads ``getattr(text, "usage", None)`` before it
    strips the text.
    """

    usage: AnthropicUsage | None
    aligned: bool = False
    """True when it was written from the request's prefix (the cache-aligned mode)."""

    def __new__(cls, text: str, usage: AnthropicUsage | None = None) -> SummaryText:
        """The text ``text`` with ``usage`` attached."""
        value = super().__new__(cls, text)
        value.usage = usage
        return value


def _uses_prefix(request: SummaryRequest) -> bool:
    """Whether ``request`` is sent cache-aligned: its own prefix, unchanged."""
    return bool(request.prefix) and not request.attempt and all(isinstance(m, BaseMessage) for m in request.prefix)


def _check_positive(name: str, value: object, advice: str, *, allow_zero: bool = False) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigurationError(name, value, advice)
    if value < 0 or (value == 0 and not allow_zero):
        raise ConfigurationError(name, value, advice)


def _advice(status: int | None, detail: str) -> str:
    lowered = detail.lower()
    if status == 400 and "too long" in lowered:
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
        f"compaction summarisation failed: {text}",
        chunk_index=request.chunk_index,
        chunk_count=request.chunk_count,
    )


class AnthropicSummarizer:
    """Writes compaction summaries with Claude through the Anthropic SDK.

    Implements the ``Summarizer`` protocol, so it goes wherever a model is
    accepted (``compact``, ``acompact``, the graph node, the middleware). Each
    request is one ``client.messages.create`` call with the request's system
    prompt and its prompt as the only user turn; the reply's text blocks,
    joined, are the summary. ``summarize`` uses ``client`` (an
    ``anthropic.Anthropic``); ``asummarize`` uses ``async_client`` (an
    ``anthropic.AsyncAnthropic``), or runs ``client`` in a worker thread when
    only that was given. Clients not given are made from ``ANTHROPIC_API_KEY``
    on first use.

    The SDK retries 408, 409, 429 and 5xx responses and connection errors
    itself (``max_retries``, default 2, with backoff honouring ``retry-after``);
    ``timeout`` bounds each HTTP attempt. Whatever still fails is raised as
    ``SummarizationError`` carrying the API's status and message, chained to
    the SDK's exception.

    Usage is kept: ``last_usage`` and ``usage_log`` (every call), and the text
    returned is a ``SummaryText`` carrying its call's ``usage``.

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
        >>> summarizer.summarize(SummaryRequest(system="s", prompt="p", messages=()))
        '## Goal\\n- ship it'
        >>> summarizer.last_usage.input_tokens
        90
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
        if (
            isinstance(max_tokens, bool)
            or not isinstance(max_tokens, int)
            or not 1 <= max_tokens <= _MAX_NONSTREAMING_TOKENS
        ):
            raise ConfigurationError(
                "max_tokens",
                max_tokens,
                f"pass a whole number from 1 to {_MAX_NONSTREAMING_TOKENS} (the SDK requires streaming above it); "
                "a checkpoint summary rarely needs more than 4096",
            )
        _check_positive("timeout", timeout, "pass a positive number of seconds, or None for the client's")
        if max_retries is not None and (isinstance(max_retries, bool) or not isinstance(max_retries, int)):
            raise ConfigurationError("max_retries", max_retries, "pass a whole number of retries, or None")
        _check_positive("max_retries", max_retries, "pass 0 or more retries", allow_zero=True)
        _check_positive("temperature", temperature, "pass a temperature from 0 to 1, or None", allow_zero=True)
        if temperature is not None and temperature > 1:
            raise ConfigurationError("temperature", temperature, "pass a temperature from 0 to 1, or None")
        self.model = model
        self.max_tokens = max_tokens
        self.timeout = timeout
        self.max_retries = max_retries
        self.temperature = temperature
        self.extra_headers = dict(extra_headers) if extra_headers else None
        # The conversation's own tools, sent with a cache-aligned request so
        # its prefix matches the agent's requests byte for byte.
        self.tools = _convert_tools(tools)
        self._client = client
        self._async_client = async_client
        self._configured: anthropic.Anthropic | None = None
        self._configured_async: anthropic.AsyncAnthropic | None = None
        self._lock = threading.Lock()
        self.usage_log: list[AnthropicUsage] = []
        """The usage of every call, in order."""
        self.last_usage: AnthropicUsage | None = None
        """The usage of the latest call."""

    @property
    def name(self) -> str:
        """``anthropic:<model>``."""
        return f"anthropic:{self.model}"

    def _options(self) -> dict[str, Any]:
        options: dict[str, Any] = {}
        if self.timeout is not None:
            options["timeout"] = self.timeout
        if self.max_retries is not None:
            options["max_retries"] = self.max_retries
        return options

    @staticmethod
    def _require_key() -> None:
        if not (os.environ.get("ANTHROPIC_API_KEY") or os.environ.get("ANTHROPIC_AUTH_TOKEN")):
            raise ConfigurationError(
                "client",
                None,
                "no client was given and ANTHROPIC_API_KEY is not set; set it, or pass "
                "client=anthropic.Anthropic(api_key=...)",
            )

    def _sync_client(self) -> anthropic.Anthropic:
        with self._lock:
            if self._configured is None:
                if self._client is None:
                    if self._async_client is not None:
                        raise ConfigurationError(
                            "client",
                            None,
                            "only async_client was given; call acompact/ainvoke, or also pass "
                            "client=anthropic.Anthropic(...)",
                        )
                    self._require_key()
                    self._client = anthropic.Anthropic()
                options = self._options()
                self._configured = self._client.with_options(**options) if options else self._client
            return self._configured

    def _async(self) -> anthropic.AsyncAnthropic | None:
        with self._lock:
            if self._configured_async is None:
                if self._async_client is None:
                    if self._client is not None:
                        return None  # run the given sync client in a thread
                    self._require_key()
                    self._async_client = anthropic.AsyncAnthropic()
                options = self._options()
                self._configured_async = self._async_client.with_options(**options) if options else self._async_client
            return self._configured_async

    def _prefix_params(self, request: SummaryRequest) -> dict[str, Any] | None:
        """A cache-aligned request: the conversation's own prefix, then the instruction."""
        prefix = request.prefix
        if not _uses_prefix(request):
            return None
        system: list[dict[str, Any]] = []
        api: list[ApiMessage] = []
        for message in prefix:
            assert isinstance(message, BaseMessage)
            if isinstance(message, SystemMessage):
                content = message.content
                blocks = [content] if isinstance(content, str) else content
                system += [{"type": "text", "text": b} if isinstance(b, str) else dict(b) for b in blocks]
            else:
                api += _to_api(message, self.model, True)
        api = _merged([*api, {"role": "user", "content": [{"type": "text", "text": request.prefix_prompt}]}])
        params: dict[str, Any] = {"model": self.model, "max_tokens": self.max_tokens, "messages": api}
        if len(system) == 1 and set(system[0]) == {"type", "text"}:
            params["system"] = system[0]["text"]  # as ChatAnthropic sends one plain system prompt
        elif system:
            params["system"] = system
        if self.tools:
            params["tools"] = self.tools
        return params

    def _params(self, request: SummaryRequest) -> dict[str, Any]:
        aligned = self._prefix_params(request)
        params = aligned or {
            "model": self.model,
            "max_tokens": self.max_tokens,
            "messages": [{"role": "user", "content": request.prompt}],
        }
        if request.system and aligned is None:
            params["system"] = request.system
        if self.temperature is not None:
            # anthropic>=1 dropped ``temperature`` from ``create``'s arguments
            # (current models ignore it); the API still reads it from the
            # body for older models, so it goes in ``extra_body``.
            params["extra_body"] = {"temperature": self.temperature}
        if self.extra_headers:
            params["extra_headers"] = self.extra_headers
        return params

    def _finish(self, response: Any, request: SummaryRequest, *, aligned: bool = False) -> SummaryText:
        usage_data = response.usage
        usage = AnthropicUsage(
            input_tokens=int(usage_data.input_tokens or 0),
            output_tokens=int(usage_data.output_tokens or 0),
            cache_read_input_tokens=int(getattr(usage_data, "cache_read_input_tokens", None) or 0),
            cache_creation_input_tokens=int(getattr(usage_data, "cache_creation_input_tokens", None) or 0),
            model=str(response.model),
            stop_reason=response.stop_reason,
            request_id=getattr(response, "_request_id", None),
        )
        with self._lock:
            self.usage_log.append(usage)
            self.last_usage = usage
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
        result = SummaryText(text, usage)
        result.aligned = aligned
        return result

    def summarize(self, request: SummaryRequest) -> str:
        """One blocking ``messages.create`` call; see ``Summarizer``."""
        client = self._sync_client()
        params = self._params(request)
        try:
            response = client.messages.create(**params)
        except anthropic.AnthropicError as exc:
            raise _summary_error(exc, request) from exc
        return self._finish(response, request, aligned=_uses_prefix(request))

    async def asummarize(self, request: SummaryRequest) -> str:
        """One awaited ``messages.create`` call; see ``Summarizer``."""
        client = self._async()
        if client is None:
            return await asyncio.to_thread(self.summarize, request)
        params = self._params(request)
        try:
            response = await client.messages.create(**params)
        except anthropic.AnthropicError as exc:
            raise _summary_error(exc, request) from exc
        return self._finish(response, request, aligned=_uses_prefix(request))

    def total_usage(self) -> AnthropicUsage:
        """The usage of every call so far, summed."""
        with self._lock:
            log = list(self.usage_log)
        return AnthropicUsage(
            input_tokens=sum(u.input_tokens for u in log),
            output_tokens=sum(u.output_tokens for u in log),
            cache_read_input_tokens=sum(u.cache_read_input_tokens for u in log),
            cache_creation_input_tokens=sum(u.cache_creation_input_tokens for u in log),
            model=self.model,
        )
