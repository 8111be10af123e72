"""Exact token counts from Claude's ``count_tokens`` endpoint.

- ``counter.count_each(messages)`` gives one count per message whose sum is
  the exact size of the whole request less ``counter.overhead_tokens`` (system
  prompt, tools, a one-character placeholder turn). It sends one request per
  new state of the conversation: the total of every prefix counted is cached
  by a hash chain over the messages' fingerprints, so when the conversation
  grows only the new messages share out the growth (by their estimates).
- ``counter([m])`` (how the adapters call a ``token_counter``) is the size of
  the smallest valid request holding ``m`` alone, less the same overhead,
  cached per message. A message that cannot stand alone is sent with the
  smallest partner the API accepts (a stub call before a tool result, say),
  so per-message counts err high by a few tokens, never low.

Messages are converted by the library's own converter and counted by the
SDK's public ``client.messages.count_tokens``. On a network failure (after the
SDK's retries) the counter falls back to the built-in estimate with a warning,
never to zero, and skips the API for ``retry_after`` seconds. A bad key or
model (401, 403, 404) raises ``ConfigurationError``: a counter that silently
estimates forever hides a bad key.
"""

from __future__ import annotations

import hashlib
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import anthropic
from langchain_core.messages import BaseMessage

from langchain_compaction._lc.convert import json_text
from langchain_compaction._lc.identity import fingerprint
from langchain_compaction.anthropic import validity, wire
from langchain_compaction.core.bounded import Bounded
from langchain_compaction.errors import ConfigurationError
from langchain_compaction.tokens import estimate_message_tokens

logger = logging.getLogger("langchain_compaction")

# Statuses that say the request itself is fine but the service is not.
_TRANSIENT_STATUS = frozenset({408, 409, 429})
_CONFIG_STATUS = frozenset({401, 403, 404})


class _Unavailable(Exception):
    """The count could not be made; the caller falls back to the estimate."""


class _Refused(_Unavailable):
    """The API refused the request itself (400, 413, 422): retrying will not help."""


def _chain(previous: str, key: str) -> str:
    """The next link of a hash chain over fingerprints: one hash per prefix."""
    return hashlib.blake2b(f"{previous}\x00{key}".encode(), digest_size=16).hexdigest()


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


def _client_and_model(client_or_model_name: object, model: str | None) -> tuple[anthropic.Anthropic | None, str]:
    """The client (``None``: made later from the environment) and the model name."""
    if isinstance(client_or_model_name, str):
        if not client_or_model_name.strip():
            raise ConfigurationError("client_or_model_name", client_or_model_name, "pass a model name")
        if model is not None and model != client_or_model_name:
            advice = f"a model name was already given ({client_or_model_name!r}); pass one of them"
            raise ConfigurationError("model", model, advice)
        return None, client_or_model_name
    if isinstance(client_or_model_name, anthropic.AsyncAnthropic):
        advice = "token counting runs inside the synchronous cut; pass anthropic.Anthropic(...) instead"
        raise ConfigurationError("client_or_model_name", client_or_model_name, advice)
    if not isinstance(client_or_model_name, anthropic.Anthropic):
        advice = "pass an anthropic.Anthropic client or a model name"
        raise ConfigurationError("client_or_model_name", client_or_model_name, advice)
    if not model:
        raise ConfigurationError("model", model, 'pass the model whose tokenizer counts, e.g. "claude-haiku-4-5"')
    return client_or_model_name, model


def _check_settings(cache_size: object, retry_after: object, system: object) -> None:
    if isinstance(cache_size, bool) or not isinstance(cache_size, int) or cache_size < 1:
        raise ConfigurationError("cache_size", cache_size, "pass a positive number of entries, e.g. 4096")
    if isinstance(retry_after, bool) or not isinstance(retry_after, (int, float)) or retry_after < 0:
        raise ConfigurationError("retry_after", retry_after, "pass 0 or more seconds")
    if system is not None and not isinstance(system, str):
        raise ConfigurationError("system", system, "pass the system prompt as a string, or None")


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
        fallback: Callable[[Sequence[BaseMessage]], int] | None = None,
    ) -> None:
        self._client, self.model = _client_and_model(client_or_model_name, model)
        _check_settings(cache_size, retry_after, system)
        self.system = system or None
        self.tools = wire.convert_tools(tools)
        self.retry_after = float(retry_after)
        self._fallback = fallback or estimate_message_tokens
        self._messages: Bounded[int] = Bounded(cache_size)  # fingerprint -> per-message count
        self._prefixes: Bounded[int] = Bounded(cache_size)  # chain hash -> exact total of that prefix
        self._shares: Bounded[int] = Bounded(cache_size)  # chain hash -> the last message's share
        self._overhead: int | None = None
        self._lock = threading.Lock()
        self._down_until = 0.0
        self._warned = False
        self.requests = 0
        """How many ``count_tokens`` requests this counter has made."""
        self.fallbacks = 0
        """How many counts fell back to the estimate."""

    def _get_client(self) -> anthropic.Anthropic:
        with self._lock:
            if self._client is None:
                if not (os.environ.get("ANTHROPIC_API_KEY") or os.environ.get("ANTHROPIC_AUTH_TOKEN")):
                    advice = "ANTHROPIC_API_KEY is not set; set it, or pass anthropic.Anthropic(api_key=...) first"
                    raise ConfigurationError("client_or_model_name", self.model, advice)
                self._client = anthropic.Anthropic()
            return self._client

    def _request(self, messages: list[validity.ApiMessage], system_extra: Sequence[str] = ()) -> int:
        """One exact count; raises ``_Unavailable`` when it cannot be had."""
        if time.monotonic() < self._down_until:
            raise _Unavailable("the API failed recently")
        kwargs: dict[str, Any] = {"model": self.model, "messages": messages}
        system = wire.system_param([self.system or "", *system_extra])
        if system is not None:
            kwargs["system"] = system
        if self.tools:
            kwargs["tools"] = self.tools
        client = self._get_client()
        self.requests += 1
        try:
            result = client.messages.count_tokens(**kwargs)
        except anthropic.APIStatusError as exc:
            raise self._status_error(exc) from exc
        except anthropic.APIConnectionError as exc:  # APITimeoutError included
            self._mark_down(f"{type(exc).__name__}: {exc.message}")
            raise _Unavailable(str(exc)) from exc
        self._warned = False
        return int(result.input_tokens)

    def _status_error(self, exc: anthropic.APIStatusError) -> Exception:
        status, detail = exc.status_code, exc.api_message or exc.message
        if status in _CONFIG_STATUS:
            advice = f"count_tokens failed with {status}: {detail}; check the API key and the model name"
            return ConfigurationError("model" if status == 404 else "client_or_model_name", self.model, advice)
        if status >= 500 or status in _TRANSIENT_STATUS:
            self._mark_down(f"{status} {detail}")
            return _Unavailable(f"{status} {detail}")
        return _Refused(f"{status} {detail}")

    def _mark_down(self, reason: str) -> None:
        self._down_until = time.monotonic() + self.retry_after
        if not self._warned:
            self._warned = True
            logger.warning(
                "Anthropic count_tokens failed (%s); using the built-in estimate for %.0f s", reason, self.retry_after
            )

    def _estimate(self, messages: Sequence[BaseMessage], why: str) -> int:
        self.fallbacks += 1
        value = int(self._fallback(messages))
        logger.debug("token count estimated (%s): %d", why, value)
        return max(value, 1)  # never zero: a message always costs its framing

    def _measured_overhead(self) -> int:
        """The overhead, measured on first use; raises ``_Unavailable``."""
        if self._overhead is None:
            self._overhead = self._request([validity.placeholder_user()])
        return self._overhead

    def _measured(self, messages: Sequence[BaseMessage]) -> int:
        """The exact size of the smallest valid request holding ``messages``; raises ``_Unavailable``."""
        api, system = wire.counting_request(messages)
        if api == [validity.placeholder_user()] and not any(system):
            return self._measured_overhead()  # the overhead's own request: not sent twice
        return self._request(api, system)

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
            estimate = 4 + (len(json_text(self.tools)) // 4 if self.tools else 0)
            return estimate + (len(self.system) // 4 if self.system else 0)

    def count_message(self, message: BaseMessage) -> int:
        """The tokens of one message counted alone (see the module docstring)."""
        key = fingerprint(message)
        cached = self._messages.get(key)
        if cached is not None:
            return cached
        try:
            overhead = self._measured_overhead()
            total = self._measured([message])
        except _Refused as exc:
            logger.warning("Anthropic count_tokens refused a %s message (%s); estimating it", message.type, exc)
            return self._estimate([message], str(exc))
        except _Unavailable as exc:
            return self._estimate([message], str(exc))
        value = max(total - overhead, 0)
        self._messages.put(key, value)
        return value

    def _cached_prefix(self, chain: Sequence[str]) -> tuple[int, int | None, list[int]]:
        """The longest prefix whose total and every share are cached: (length, total, shares)."""
        for length in range(len(chain), 0, -1):
            prefix_total = self._prefixes.get(chain[length - 1])
            if prefix_total is not None:
                shares = [self._shares.get(h) for h in chain[:length]]
                if all(s is not None for s in shares):
                    return length, prefix_total, [int(s or 0) for s in shares]
        return 0, None, []

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
        chain: list[str] = []
        for message in messages:
            chain.append(_chain(chain[-1] if chain else "", fingerprint(message)))
        known, base, counts = self._cached_prefix(chain)
        if known == len(messages):
            return counts
        rest = messages[known:]
        try:
            overhead = self._measured_overhead()
            total = self._measured(messages)
        except _Refused as exc:
            # The whole list was refused (repeated tool ids...): count the new
            # messages one by one instead.
            logger.debug("count_tokens refused the whole list (%s); counting message by message", exc)
            return counts + [self.count_message(m) for m in rest]
        except _Unavailable as exc:
            return counts + [self._estimate([m], str(exc)) for m in rest]
        weights = [max(estimate_message_tokens([m]), 1) for m in rest]
        new = _largest_remainder(max(total - (overhead if base is None else base), 0), weights)
        self._prefixes.put(chain[-1], total)
        for index, value in enumerate(new, start=known):
            self._shares.put(chain[index], value)
        return counts + new

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
