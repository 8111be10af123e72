"""What a provider's error says when a request was too long for the model's window.

LangChain's providers raise ``ContextOverflowError`` for it, when they
recognize the error: langchain-openai 1.8 with openai 3.x does not (the code
``context_length_exceeded`` is no longer in the message it reads), and raises
``OpenAIInvalidRequestError``. The middleware recovers from an overflow
however it was raised (``overflowed``), and learns the window it states.
"""

from __future__ import annotations

import re

from langchain_core.exceptions import ContextOverflowError

# What a provider says of a request over the window, and the code OpenAI gives it.
# (Anthropic's other answer: "input length and `max_tokens` exceed context limit"; Gemini's "input token
# count ... exceeds the maximum number of tokens allowed"; Mistral's "too large for model with N maximum
# context length"; xAI's "maximum prompt length is".)
_OVERFLOW = re.compile(
    r"maximum context length\b|prompt is too long|context_length_exceeded|exceeds the context window"
    r"|input tokens exceed the configured limit|context window exceeds|exceed context limit"
    r"|input token count.{0,80}exceeds the maximum|maximum prompt length is",
    re.IGNORECASE,
)
_OVERFLOW_CODES = frozenset({"context_length_exceeded"})


def overflowed(error: BaseException) -> bool:
    """Whether ``error`` says the request was over the model's window, whatever class its client raised.

    Only a provider's answer counts (an error with the HTTP status of a request refused, 400 or 413): a
    guardrail's ``ValueError`` or an interrupt that quotes "prompt is too long" is no overflow to retry.

    Example:
        >>> class BadRequest(Exception):
        ...     status_code = 400
        >>> overflowed(BadRequest("This model's maximum context length is 128000 tokens.")), overflowed(
        ...     ValueError("prompt is too long")
        ... )
        (True, False)
    """
    if isinstance(error, ContextOverflowError):
        return True
    if _status(error) not in (400, 413):
        return False
    return getattr(error, "code", None) in _OVERFLOW_CODES or _OVERFLOW.search(str(error)) is not None


def _status(error: BaseException) -> object:
    """The HTTP status a client's error carries (``None`` when it carries none).

    As its own (OpenAI's, Anthropic's), its response's (httpx's
    ``HTTPStatusError``), or its response metadata's (botocore's
    ``ClientError``: Bedrock).
    """
    status = getattr(error, "status_code", None)
    if status is not None:
        return status
    response = getattr(error, "response", None)
    if isinstance(response, dict):
        metadata = response.get("ResponseMetadata")
        return metadata.get("HTTPStatusCode") if isinstance(metadata, dict) else None
    return getattr(response, "status_code", None)


# How providers state the limit a request went over: Anthropic's "prompt is too
# long: 210019 tokens > 200000 maximum", OpenAI's "maximum context length is
# 128000 tokens".
_STATED_LIMIT = re.compile(
    r"(\d[\d,]*)\s+(?:tokens\s+)?maximum\b|maximum context length is\s+(\d[\d,]*)", re.IGNORECASE
)


def stated_limit(message: str) -> int | None:
    """The context window an overflow error states, if it states one.

    Example:
        >>> stated_limit("prompt is too long: 210019 tokens > 200000 maximum")
        200000
        >>> stated_limit("This model's maximum context length is 128,000 tokens. However, you requested 130,000")
        128000
        >>> stated_limit("prompt is too long") is None
        True
    """
    found = _STATED_LIMIT.search(message)
    if found is None:
        return None
    limit = int((found.group(1) or found.group(2)).replace(",", ""))
    return limit if limit > 0 else None
