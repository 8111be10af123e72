"""Every error the library raises on purpose.

```
CompactionError                    base: catch this to catch them all
├── ConfigurationError(ValueError)  bad options or arguments, raised at construction
├── InvalidMessagesError(ValueError) a message list the library cannot read
├── ConversationFileError(ValueError) a conversation file the command line cannot read
├── SummarizationError             the summary could not be made; nothing was changed
│   ├── EmptySummaryError          the summarizer returned "" or whitespace
│   ├── InvalidSummaryError        the summary failed its check twice (too long, sections missing)
│   └── SummaryTimeoutError        the summary call ran past ``timeout``
└── StoreError                     a chat-history store failed during a rewrite
```

Each error carries the data that explains it as attributes, and its message
says what to do instead. Errors raised while summarizing are chained (``from``)
to the underlying exception.
"""

from __future__ import annotations

import inspect

__all__ = [
    "CompactionError",
    "ConfigurationError",
    "ConversationFileError",
    "EmptySummaryError",
    "InvalidMessagesError",
    "InvalidSummaryError",
    "StoreError",
    "SummarizationError",
    "SummaryTimeoutError",
]


class CompactionError(Exception):
    """Base of every error langchain-compaction raises on purpose."""


class ConfigurationError(CompactionError, ValueError):
    """An option or argument is invalid.

    Attributes:
        field: The name of the offending option.
        value: The value that was passed.
    """

    def __init__(self, field: str, value: object, advice: str) -> None:
        self.field = field
        self.value = value
        super().__init__(f"{field}={value!r} is invalid: {advice}")


class InvalidMessagesError(CompactionError, ValueError):
    """The message list cannot be compacted as given.

    Attributes:
        index: The position of the offending message, when one is to blame.
    """

    def __init__(self, message: str, *, index: int | None = None) -> None:
        self.index = index
        super().__init__(message)


class ConversationFileError(CompactionError, ValueError):
    """A conversation file that cannot be read.

    Attributes:
        where: Where the problem is (``"line 3"``, ``"message 5"``, ...).
    """

    def __init__(self, problem: str, *, where: str = "") -> None:
        self.where = where
        super().__init__(f"{where}: {problem}" if where else problem)


class SummarizationError(CompactionError):
    """The summarizer failed; the caller's messages were left unchanged.

    Attributes:
        chunk_index: The chunk of the compacted region being summarized.
        chunk_count: How many chunks the region had.
    """

    def __init__(self, message: str, *, chunk_index: int = 0, chunk_count: int = 1) -> None:
        self.chunk_index = chunk_index
        self.chunk_count = chunk_count
        super().__init__(message)


class EmptySummaryError(SummarizationError):
    """The summarizer returned an empty or whitespace-only summary."""


class InvalidSummaryError(SummarizationError):
    """The summary was rejected twice by its check (over budget, sections missing)."""


class SummaryTimeoutError(SummarizationError):
    """The summary call did not finish within the configured timeout.

    Attributes:
        timeout: The limit, in seconds.
    """

    def __init__(
        self,
        timeout: float,
        *,
        chunk_index: int = 0,
        chunk_count: int = 1,
        detail: str = "",
        advice: str = "raise CompactionOptions.timeout or use a faster summarizer",
    ) -> None:
        self.timeout = timeout
        why = f" ({detail})" if detail else ""
        super().__init__(
            f"compaction summarisation failed: no summary within timeout={timeout}s{why}; {advice}",
            chunk_index=chunk_index,
            chunk_count=chunk_count,
        )


class StoreError(CompactionError):
    """A chat-history store failed while the library rewrote it.

    Attributes:
        operation: What was being done (``"read"``, ``"clear"``, ``"write"``).
    """

    def __init__(self, message: str, *, operation: str) -> None:
        self.operation = operation
        super().__init__(message)


def unbindable(function: object, arguments: tuple[object, ...]) -> str:
    """The signature of a ``function`` that cannot be called with ``arguments``, as text; "" when it can.

    "" too when it has no signature to read (a builtin): the call will say.
    """
    try:
        # (The function as called: a decorator's wrapper, not what functools.wraps names.)
        signature = inspect.signature(function, follow_wrapped=False)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return ""
    try:
        signature.bind(*arguments)
    except TypeError:
        return str(signature)
    return ""
