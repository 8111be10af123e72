"""Compaction options: the reference's defaults, validated at construction."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from langchain_compaction.errors import ConfigurationError

DEFAULT_RESERVE_TOKENS = 16384
"""Tokens kept free for the model's reply (the reference's default)."""

DEFAULT_KEEP_RECENT_TOKENS = 20000
"""Tokens of recent messages kept verbatim (the reference's default)."""

DEFAULT_SUMMARY_INPUT_TOKENS = 100_000
"""Largest summarizer request when the context window is unknown."""

TokenCounterFn = Callable[[Sequence[Any]], int]
"""Counts the tokens of a list of messages, e.g. ``count_tokens_approximately``.

The adapters call it with one-message lists, so it sees LangChain messages.
"""


def _check_int(name: str, value: object, *, minimum: int, advice: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigurationError(name, value, f"pass a whole number of tokens, {advice}")
    if value < minimum:
        raise ConfigurationError(name, value, advice)


@dataclass(frozen=True, slots=True)
class CompactionOptions:
    """How much context to keep and how to summarize the rest.

    Attributes:
        context_window: The model's context window in tokens; 0 means unknown,
            which turns automatic compaction off (``should_compact`` is false).
        reserve_tokens: Tokens kept free for the reply: compaction fires when
            the context exceeds ``context_window - reserve_tokens``.
        keep_recent_tokens: Tokens of the most recent messages kept verbatim.
        summary_prompt: Replaces the default checkpoint prompt.
        update_prompt: Replaces the default prompt used to update a previous
            summary; when only ``summary_prompt`` is given, updates use it too.
        system_prompt: Replaces the summarizer's system prompt.
        token_counter: Counts tokens instead of the built-in estimate; any
            callable over a list of LangChain messages.
        summary_input_tokens: The largest request sent to the summarizer; a
            larger compacted region is summarized in chunks, each updating the
            running summary. ``None`` derives it from the window (the window
            less the reserve), or 100,000 when the window is unknown.
        timeout: Seconds one summary call may take before it fails with
            ``SummaryTimeoutError``; ``None`` for no limit.
        redact: A function from text to text applied to everything the
            summarizer is shown (messages, tool calls and results, the
            previous summary) and so to what the extractive summarizer copies;
            ``redact_secrets`` is a ready one. Off by default.
        summary_max_tokens: The most tokens a summary may take; a longer one
            is asked for once more, shorter, then left to ``fallback=`` (or
            raises). ``None`` derives it: half of what the window leaves after
            the reserve and the kept messages, between 1,024 and 8,192 (8,192
            when the window is unknown).
        require_sections: Also reject a summary that lacks any checkpoint
            heading (Goal, Constraints & Preferences, Progress, Done, In
            Progress, Blocked, Key Decisions, Next Steps, Critical Context).
            Off by default: a custom ``summary_prompt`` or a plain function
            may rightly write another format.
        clear_tool_outputs: Before summarizing, try the cheapest step:
            replace the content of old tool results (outside the keep budget
            and older than the last ``keep_tool_uses``) with a placeholder;
            when that alone brings the context to halfway between the keep
            budget and the threshold, no summary is made. Off by default: a
            cleared output is lost to the summary that comes later.
        keep_tool_uses: The most recent tool results never cleared.
        clear_exclude_tools: Names of tools whose output is never cleared.
        clear_min_tokens: Tool results smaller than this are not cleared.
        summary_mode: ``"transcript"`` (the default) sends the summarizer a
            fenced transcript of the compacted messages. ``"cache_aligned"``
            sends the conversation's own messages before the cut, unchanged,
            then the summary instruction as a final user message, so a
            provider prompt cache (Anthropic's reads cost a tenth of fresh
            input) serves the prefix; used when the region fits one request
            and the summarizer supports it (chat models, ``AnthropicSummarizer``),
            else the transcript is sent.
        ensure_user_turn: When the kept messages do not start with a user
            turn (an agent compacted mid-loop keeps an assistant tool call
            first), put a one-line user message after the summary: Anthropic's
            API rejects a conversation whose first turn is not the user's.

    Example:
        >>> opts = CompactionOptions(context_window=200_000)
        >>> opts.reserve_tokens, opts.keep_recent_tokens
        (16384, 20000)
    """

    context_window: int = 0
    reserve_tokens: int = DEFAULT_RESERVE_TOKENS
    keep_recent_tokens: int = DEFAULT_KEEP_RECENT_TOKENS
    summary_prompt: str | None = None
    update_prompt: str | None = None
    system_prompt: str | None = None
    token_counter: TokenCounterFn | None = None
    summary_input_tokens: int | None = None
    timeout: float | None = None
    redact: Callable[[str], str] | None = None
    summary_max_tokens: int | None = None
    require_sections: bool = False
    clear_tool_outputs: bool = False
    keep_tool_uses: int = 3
    clear_exclude_tools: tuple[str, ...] = ()
    clear_min_tokens: int = 100
    summary_mode: Literal["transcript", "cache_aligned"] = "transcript"
    ensure_user_turn: bool = True

    def __post_init__(self) -> None:
        _check_int(
            "context_window",
            self.context_window,
            minimum=0,
            advice="pass the model's window in tokens, or 0 if unknown",
        )
        _check_int(
            "reserve_tokens",
            self.reserve_tokens,
            minimum=0,
            advice=f"pass 0 or more (default {DEFAULT_RESERVE_TOKENS})",
        )
        _check_int(
            "keep_recent_tokens",
            self.keep_recent_tokens,
            minimum=1,
            advice=f"pass a positive budget (default {DEFAULT_KEEP_RECENT_TOKENS})",
        )
        window = self.context_window
        if window:
            if self.reserve_tokens >= window:
                raise ConfigurationError(
                    "reserve_tokens",
                    self.reserve_tokens,
                    f"it must be smaller than context_window={window}; "
                    f"pass a reserve that leaves room for the conversation, e.g. reserve_tokens={window // 8}",
                )
            room = window - self.reserve_tokens
            if self.keep_recent_tokens >= room:
                raise ConfigurationError(
                    "keep_recent_tokens",
                    self.keep_recent_tokens,
                    f"keeping that much leaves no room: compaction fires above "
                    f"context_window - reserve_tokens = {room} tokens; "
                    f"pass keep_recent_tokens below {room}, e.g. {room // 2}",
                )
        if self.summary_input_tokens is not None:
            _check_int(
                "summary_input_tokens",
                self.summary_input_tokens,
                minimum=1000,
                advice="pass at least 1000 tokens, or None to derive it from the window",
            )
        for name in ("summary_prompt", "update_prompt", "system_prompt"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ConfigurationError(name, value, "pass a non-empty string, or None for the default")
        if self.token_counter is not None and not callable(self.token_counter):
            raise ConfigurationError(
                "token_counter",
                self.token_counter,
                "pass a callable over a list of messages, e.g. count_tokens_approximately",
            )
        if self.summary_max_tokens is not None:
            _check_int(
                "summary_max_tokens",
                self.summary_max_tokens,
                minimum=64,
                advice="pass at least 64 tokens, or None to derive it from the window",
            )
        _check_int("keep_tool_uses", self.keep_tool_uses, minimum=0, advice="pass 0 or more (default 3)")
        _check_int("clear_min_tokens", self.clear_min_tokens, minimum=0, advice="pass 0 or more (default 100)")
        if isinstance(self.clear_exclude_tools, str) or not all(isinstance(t, str) for t in self.clear_exclude_tools):
            raise ConfigurationError(
                "clear_exclude_tools", self.clear_exclude_tools, "pass a tuple of tool names, e.g. ('read_plan',)"
            )
        if self.summary_mode not in ("transcript", "cache_aligned"):
            raise ConfigurationError("summary_mode", self.summary_mode, "pass 'transcript' or 'cache_aligned'")
        if self.redact is not None and not callable(self.redact):
            raise ConfigurationError("redact", self.redact, "pass a function from text to text, e.g. redact_secrets")
        if self.timeout is not None and (
            isinstance(self.timeout, bool) or not isinstance(self.timeout, (int, float)) or self.timeout <= 0
        ):
            raise ConfigurationError("timeout", self.timeout, "pass a positive number of seconds, or None")

    @property
    def effective_summary_max_tokens(self) -> int:
        """The summary budget in force (see ``summary_max_tokens``)."""
        if self.summary_max_tokens is not None:
            return self.summary_max_tokens
        if self.context_window:
            room = self.context_window - self.reserve_tokens - self.keep_recent_tokens
            return min(max(room // 2, 1024), 8192)
        return 8192

    @property
    def effective_summary_input_tokens(self) -> int:
        """The summarizer request budget in force (see ``summary_input_tokens``)."""
        if self.summary_input_tokens is not None:
            return self.summary_input_tokens
        if self.context_window:
            return max(self.context_window - self.reserve_tokens, 1000)
        return DEFAULT_SUMMARY_INPUT_TOKENS
