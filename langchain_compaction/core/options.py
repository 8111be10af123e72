"""Compaction options, validated at construction, and the budgets derived from them.

Every budget is derived from the options in one place, ``CompactionOptions.budget``
(``derive_budget``); nothing else computes one. The rule, for a window ``W``:

- reserve (kept free for the reply): 16,384 tokens, pi's default, or ``W // 8``
  when that is smaller (a 24,000-token window reserves 3,000);
- threshold: automatic compaction fires above ``W - reserve``;
- landing: after a compaction the context should be at most half the
  threshold, so the next turns do not compact again at once;
- keep (recent tokens kept verbatim): 20,000, pi's default, or three fifths of
  the landing when that is smaller;
- summary: two thirds of what the landing leaves after the keep, between 256
  and 8,192 tokens (the rest is room for the system prompt);
- checked facts: the section the library adds under the summary takes at
  most a quarter of the summary's budget, between 128 and 2,048 tokens, plus
  whatever the summarizer's text left unused of its own budget;
- clearing old tool outputs aims at the landing;
- preparing a summary ahead (``prepare_at``) starts above ``prepare_at`` times
  the threshold, which must lie above the landing, or every compaction would
  start a new preparation at once.

A value the user sets is kept as set (``None`` means derived); a set
combination that leaves no room raises ``ConfigurationError`` at construction.
With the window unknown (0) automatic compaction is off and pi's defaults apply.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from langchain_compaction.errors import ConfigurationError

DEFAULT_RESERVE_TOKENS = 16384
"""Tokens kept free for the model's reply (pi's default)."""

DEFAULT_KEEP_RECENT_TOKENS = 20000
"""Tokens of recent messages kept verbatim (pi's default)."""

DEFAULT_SUMMARY_INPUT_TOKENS = 100_000
"""Largest summarizer request when the context window is unknown."""

DEFAULT_SUMMARY_MAX_TOKENS = 8192
"""The largest summary budget derived (and the budget when the window is unknown)."""

MIN_SUMMARY_TOKENS = 256
"""The smallest summary budget derived: a checkpoint needs a few lines per section."""

MIN_FACTS_TOKENS = 128
"""The smallest budget of the checked-facts section: a few constraints and paths."""

MAX_FACTS_TOKENS = 2048
"""The largest budget of the checked-facts section."""

_PREPARE_ADVICE = (
    "pass a share of the threshold above the landing (half the threshold) and below 1, e.g. 0.7, "
    "or None to summarize at the threshold"
)

TokenCounterFn = Callable[[Sequence[Any]], int]
"""Counts the tokens of a list of messages, e.g. ``count_tokens_approximately``.

The adapters call it with one-message lists, so it sees LangChain messages.
"""

SummaryMode = Literal["transcript", "cache_aligned"]
"""What the summarizer is sent: a fenced transcript, or the conversation's own prefix."""


@dataclass(frozen=True, slots=True)
class Budget:
    """Every token budget in force, derived from the options in one place.

    Attributes:
        window: The context window (0: unknown).
        reserve: Tokens kept free for the reply.
        keep: Recent tokens kept verbatim.
        threshold: Automatic compaction fires above this many tokens;
            ``None`` when the window is unknown (automatic compaction off).
        landing: Where a compaction aims to bring the context (half the
            threshold; ``None`` without a window).
        summary_max: The most tokens a summary may take.
        facts_max: The tokens the checked-facts section may always take (0
            when checking is off); it may also take what the summary left
            unused of ``summary_max``.
        summary_input: The largest summarizer request.
        clearing_target: Where clearing old tool outputs aims to bring the
            context (``None`` without a window).
        prepare: Above this many tokens an adapter prepares the next summary
            in the background (``None`` without ``prepare_at`` or a window).
        pinned_max: The most tokens of pinned messages written back after a
            summary (half the keep budget unless set).
    """

    window: int
    reserve: int
    keep: int
    threshold: int | None
    landing: int | None
    summary_max: int
    summary_input: int
    clearing_target: int | None
    facts_max: int = 0
    prepare: int | None = None
    pinned_max: int = 0


def _check_int(name: str, value: object, *, minimum: int, advice: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigurationError(name, value, f"pass a whole number of tokens, {advice}")
    if value < minimum:
        raise ConfigurationError(name, value, advice)


def _check_text(name: str, value: object) -> None:
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise ConfigurationError(name, value, "pass a non-empty string, or None for the default")


def _check_callable(name: str, value: object, advice: str) -> None:
    if value is not None and not callable(value):
        raise ConfigurationError(name, value, advice)


@dataclass(frozen=True, slots=True)
class CompactionOptions:
    """How much context to keep and how to summarize the rest.

    Automatic compaction (the adapters, ``auto_compact``, ``should_compact``)
    fires when the context exceeds ``context_window - reserve_tokens``; the one
    way to turn it off is ``context_window=0`` (the window is unknown), which
    leaves manual compaction (``compact()``, ``/compact``) working.

    Attributes:
        context_window: The model's context window in tokens; 0 means unknown,
            which turns automatic compaction off.
        reserve_tokens: Tokens kept free for the reply; ``None`` (or 0, as in
            pi's options) derives it: 16,384, or ``context_window // 8`` when
            that is smaller.
        keep_recent_tokens: Tokens of the most recent messages kept verbatim;
            ``None`` (or 0) derives it: 20,000, or less in a small window so
            that a compaction lands at most at half the threshold.
        summary_prompt: Replaces the default checkpoint prompt.
        update_prompt: Replaces the default prompt used to update a previous
            summary; when only ``summary_prompt`` is given, updates use it too.
        system_prompt: Replaces the summarizer's system prompt.
        token_counter: Counts tokens instead of the built-in estimate; any
            callable over a list of LangChain messages. On async paths it runs
            in a worker thread, never on the event loop.
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
            raises). ``None`` derives it: two thirds of what half the
            threshold leaves after the kept messages, between 256 and 8,192
            (8,192 when the window is unknown).
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
        check_facts: Find the facts a continuing agent needs in the compacted
            messages (the user's constraints and identifiers, files read and
            modified, unresolved errors, tool calls made, the last request;
            see ``core.facts``), check the summary against them, and add what
            it does not state in a "Checked facts" section under it, within
            a quarter of the summary's budget. On by default, for every
            summarizer.
        pin_tools: Tools whose latest call, with its results, is never
            summarized: it is written back verbatim after the summary (a plan
            or todo list the agent keeps working from; deepagents' and
            LangChain's ``write_todos`` by default). Messages marked
            ``additional_kwargs={"compaction_pin": True}`` are kept the same way.
        pinned_max_tokens: The most tokens pinned messages may keep (half the
            keep budget unless set); the oldest pins over it are summarized,
            and the result says how many (``pinned_over_cap``).
        prepare_at: A share of the threshold (e.g. ``0.7``) above which the
            node, the middleware and chat memory prepare the next summary in
            the background, so the threshold applies it without waiting for
            the model; it must lie above the landing (half the threshold).
            ``None`` (the default) summarizes at the threshold. It means
            nothing to ``compact()``, which compacts at once, and is refused
            there.

    Example:
        >>> budget = CompactionOptions(context_window=200_000).budget
        >>> budget.reserve, budget.keep, budget.threshold, budget.summary_max
        (16384, 20000, 183616, 8192)
        >>> budget = CompactionOptions(context_window=24_000).budget
        >>> budget.reserve, budget.keep, budget.threshold, budget.landing, budget.summary_max
        (3000, 6300, 21000, 10500, 2800)
    """

    context_window: int = 0
    reserve_tokens: int | None = None
    keep_recent_tokens: int | None = None
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
    summary_mode: SummaryMode = "transcript"
    ensure_user_turn: bool = True
    check_facts: bool = True
    pin_tools: tuple[str, ...] = ("write_todos",)
    pinned_max_tokens: int | None = None
    prepare_at: float | None = None

    def __post_init__(self) -> None:
        share = self.prepare_at
        if share is not None and (isinstance(share, bool) or not isinstance(share, (int, float)) or not 0 < share < 1):
            raise ConfigurationError("prepare_at", share, _PREPARE_ADVICE)
        self._check_budgets()
        self._check_optional_budgets()
        for name in ("summary_prompt", "update_prompt", "system_prompt"):
            _check_text(name, getattr(self, name))
        _check_callable(
            "token_counter",
            self.token_counter,
            "pass a callable over a list of messages, e.g. count_tokens_approximately",
        )
        _check_callable("redact", self.redact, "pass a function from text to text, e.g. redact_secrets")
        self._check_clearing()
        for name in ("require_sections", "clear_tool_outputs", "ensure_user_turn", "check_facts"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigurationError(name, getattr(self, name), "pass True or False")
        self._check_prepare()
        if self.summary_mode not in ("transcript", "cache_aligned"):
            raise ConfigurationError("summary_mode", self.summary_mode, "pass 'transcript' or 'cache_aligned'")
        if self.timeout is not None and (
            isinstance(self.timeout, bool) or not isinstance(self.timeout, (int, float)) or self.timeout <= 0
        ):
            raise ConfigurationError("timeout", self.timeout, "pass a positive number of seconds, or None")

    def _check_budgets(self) -> None:
        _check_int("context_window", self.context_window, minimum=0, advice="pass the model's window, or 0 if unknown")
        for name in ("reserve_tokens", "keep_recent_tokens"):
            value = getattr(self, name)
            if value is not None:
                _check_int(name, value, minimum=0, advice="pass a positive number, or None (or 0) to derive it")
                if value == 0:  # as in pi's options, zero means the default
                    object.__setattr__(self, name, None)
        window = self.context_window
        if not window:
            return
        if self.reserve_tokens is not None and self.reserve_tokens >= window:
            raise ConfigurationError(
                "reserve_tokens",
                self.reserve_tokens,
                f"it must be smaller than context_window={window}; "
                f"pass a reserve that leaves room for the conversation, e.g. reserve_tokens={window // 8}, or None",
            )
        threshold = derive_budget(self).threshold
        assert threshold is not None  # the window is known
        if self.keep_recent_tokens is not None and self.keep_recent_tokens >= threshold:
            raise ConfigurationError(
                "keep_recent_tokens",
                self.keep_recent_tokens,
                f"keeping that much leaves no room: compaction fires above "
                f"context_window - reserve_tokens = {threshold} tokens; "
                f"pass keep_recent_tokens below {threshold}, e.g. {threshold * 3 // 10}, or None to derive it",
            )

    def _check_optional_budgets(self) -> None:
        for name, minimum in (("summary_input_tokens", 1000), ("summary_max_tokens", 64)):
            value = getattr(self, name)
            if value is not None:
                advice = f"pass at least {minimum} tokens, or None to derive it from the window"
                _check_int(name, value, minimum=minimum, advice=advice)

    def _check_clearing(self) -> None:
        _check_int("keep_tool_uses", self.keep_tool_uses, minimum=0, advice="pass 0 or more (default 3)")
        _check_int("clear_min_tokens", self.clear_min_tokens, minimum=0, advice="pass 0 or more (default 100)")
        for name in ("clear_exclude_tools", "pin_tools"):
            tools = getattr(self, name)
            if (
                isinstance(tools, str)
                or not isinstance(tools, (tuple, list))
                or not all(isinstance(t, str) for t in tools)
            ):
                raise ConfigurationError(name, tools, "pass a tuple of tool names, e.g. ('read_plan',)")
        if self.pinned_max_tokens is not None:
            _check_int("pinned_max_tokens", self.pinned_max_tokens, minimum=0, advice="pass 0 or more, or None")

    def _check_prepare(self) -> None:
        share = self.prepare_at
        if share is None:
            return
        budget = derive_budget(self)
        mark, landing = budget.prepare, budget.landing
        if (mark <= landing) if mark is not None and landing is not None else share <= 0.5:
            raise ConfigurationError("prepare_at", share, _PREPARE_ADVICE)

    @property
    def budget(self) -> Budget:
        """Every budget in force (see ``derive_budget``)."""
        return derive_budget(self)


def derive_budget(options: CompactionOptions) -> Budget:
    """Every budget in force for ``options``: the one place budgets are derived (see the module docstring).

    Args:
        options: The options.

    Returns:
        The budgets.
    """
    window = options.context_window
    reserve = options.reserve_tokens
    if reserve is None:
        reserve = min(DEFAULT_RESERVE_TOKENS, window // 8) if window else DEFAULT_RESERVE_TOKENS
    threshold = window - reserve if window else None
    landing = threshold // 2 if threshold is not None else None
    keep = options.keep_recent_tokens
    if keep is None:
        keep = min(DEFAULT_KEEP_RECENT_TOKENS, landing * 3 // 5) if landing is not None else DEFAULT_KEEP_RECENT_TOKENS
    summary_max = options.summary_max_tokens
    if summary_max is None:
        room = (landing - keep) * 2 // 3 if landing is not None else DEFAULT_SUMMARY_MAX_TOKENS
        summary_max = min(max(room, MIN_SUMMARY_TOKENS), DEFAULT_SUMMARY_MAX_TOKENS)
    summary_input = options.summary_input_tokens
    if summary_input is None:
        summary_input = max(threshold, 1000) if threshold is not None else DEFAULT_SUMMARY_INPUT_TOKENS
    facts_max = min(max(summary_max // 4, MIN_FACTS_TOKENS), MAX_FACTS_TOKENS) if options.check_facts else 0
    prepare = int(threshold * options.prepare_at) if threshold is not None and options.prepare_at is not None else None
    pinned_max = options.pinned_max_tokens if options.pinned_max_tokens is not None else keep // 2
    return Budget(
        window, reserve, keep, threshold, landing, summary_max, summary_input, landing, facts_max, prepare, pinned_max
    )
