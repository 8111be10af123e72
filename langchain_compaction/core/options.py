"""Compaction options, validated at construction, and the budgets derived from them.

``CompactionOptions`` holds the budgets and the prompts (twelve fields); what a
feature needs is that feature's own options (``langchain_compaction.features``).
The 0.2 keywords that set features here work for one release, with a warning.

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
  and 8,192 tokens (the rest is room for the system prompt).

A feature derives its own budget from these (the checked-facts section from
the summary's, pins from the keep, the preparation mark from the threshold).
A value set is kept (``None``: derived); a set combination that leaves no room
raises ``ConfigurationError``. With the window unknown (0) automatic compaction
is off and pi's defaults apply.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from types import MappingProxyType
from typing import Any, ClassVar

from langchain_compaction.errors import ConfigurationError, unbindable

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

TokenCounterFn = Callable[[Sequence[Any]], int]
"""Counts the tokens of a list of messages, e.g. ``count_tokens_approximately``.

The adapters call it with one-message lists, so it sees LangChain messages.
"""


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
        summary_input: The largest summarizer request.
        fixed: What no compaction can remove (the system prompt and tool schemas sent with every request, leading
            system messages); landing, keep and summary are taken over the rest (``CompactionOptions.with_fixed``).
    """

    window: int
    reserve: int
    keep: int
    threshold: int | None
    landing: int | None
    summary_max: int
    summary_input: int
    fixed: int = 0

    @property
    def room(self) -> int | None:
        """What a compaction can aim for: the landing above the fixed part (``None`` without a window)."""
        return None if self.landing is None else self.landing - self.fixed

    def fits(self, size: int) -> bool:
        """Whether a request of ``size`` tokens leaves half the reserve for the reply (it may pass the threshold)."""
        return size + self.reserve // 2 <= self.window

    @property
    def most_kept(self) -> int | None:
        """What kept messages may hold: the threshold's room past the fixed part and the summary (None: no window)."""
        return None if self.threshold is None else max(self.threshold - self.fixed - self.summary_max, self.keep)


# -- validators: the one place each kind of value is checked (features use them too) --


def check_int(name: str, value: object, *, minimum: int | None, advice: str) -> int:
    """``value`` as a whole number of at least ``minimum`` (``None``: any), or the error that says what to pass."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigurationError(name, value, f"pass a whole number: {advice}")
    if minimum is not None and value < minimum:
        raise ConfigurationError(name, value, f"pass {advice}")
    return value


def check_flag(name: str, value: object) -> bool:
    """``value`` as a bool, or the error that says so."""
    if not isinstance(value, bool):
        raise ConfigurationError(name, value, "pass True or False")
    return value


def check_names(
    name: str, value: object, example: str = "a tuple of tool names, e.g. ('read_plan',)"
) -> tuple[str, ...]:
    """``value`` as a tuple of names (tools, by default), or the error that says what to pass (``example``)."""
    if isinstance(value, str) or not isinstance(value, (tuple, list)) or not all(isinstance(t, str) for t in value):
        raise ConfigurationError(name, value, f"pass {example}")
    return tuple(value)


MAX_SECONDS = 7 * 24 * 3600.0
"""The longest wait an option may name (a week): past it, clocks and thread joins overflow."""


def check_seconds(name: str, value: object, advice: str, *, zero: bool = False) -> float:
    """``value`` as seconds (more than 0, or 0 too with ``zero``; finite, at most ``MAX_SECONDS``), or the error."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not 0 <= value <= MAX_SECONDS  # (NaN compares false: refused too)
        or (value == 0 and not zero)
    ):
        raise ConfigurationError(name, value, f"{advice}; at most {MAX_SECONDS:,.0f} (a week)")
    return float(value)


def _check_text(name: str, value: object) -> None:
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise ConfigurationError(name, value, "pass a non-empty string, or None for the default")


def check_callable(name: str, value: object, advice: str, called_with: tuple[object, ...] = ()) -> None:
    """``value`` callable (with ``called_with``: it takes those arguments) or ``None``, or the error."""
    if value is not None and (not callable(value) or (called_with and (takes := unbindable(value, called_with)))):
        raise ConfigurationError(name, value, f"{advice}; it takes {takes}" if callable(value) else advice)


LEGACY_KEYWORDS: dict[str, str] = {
    "check_facts": "CheckedFacts (pass features without it to turn checking off)",
    "pin_tools": "Pins(tools=...)",
    "pinned_max_tokens": "Pins(max_tokens=...)",
    "clear_tool_outputs": "ClearToolOutputs()",
    "keep_tool_uses": "ClearToolOutputs(keep_tool_uses=...)",
    "clear_exclude_tools": "ClearToolOutputs(exclude_tools=...)",
    "clear_min_tokens": "ClearToolOutputs(min_tokens=...)",
    "prepare_at": "PrepareAhead(at=...)",
    "summary_mode": "CacheAligned() (for 'cache_aligned')",
    "require_sections": "RequireSections()",
}
"""Keywords of ``CompactionOptions`` 0.2 that moved to a feature, and where (``features.from_legacy`` builds it)."""


_LEGACY_FLAGS = frozenset({"check_facts", "clear_tool_outputs"})  # (the ones that were on/off switches)


def _legacy_values(given: dict[str, Any]) -> dict[str, Any]:
    """The deprecated keywords that were passed, each warned about once, with a light type check."""
    out: dict[str, Any] = {}
    for name, value in given.items():
        if value is _UNSET:
            continue
        warnings.warn(
            f"CompactionOptions({name}=...) is deprecated and will be removed in 0.4; pass the feature to the "
            f"adapter instead: features=[..., {LEGACY_KEYWORDS[name]}] (from langchain_compaction.features)",
            DeprecationWarning,
            stacklevel=3,  # (the caller of CompactionOptions(...): its __init__ calls this)
        )
        if name in _LEGACY_FLAGS or (name == "require_sections" and isinstance(value, str)):
            check_flag(name, value)  # ("false" would turn clearing on: a cleared output is gone from the state)
        out[name] = value
    return out


class _Unset:
    def __repr__(self) -> str:
        return "<unset>"


_UNSET: Any = _Unset()


@dataclass(frozen=True, init=False)
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
        summary_max_tokens: The most tokens a summary may take; a longer one
            is asked for once more, shorter, then left to ``fallback=`` (or
            raises). ``None`` derives it: two thirds of what half the
            threshold leaves after the kept messages, between 256 and 8,192
            (8,192 when the window is unknown).
        summary_input_tokens: The largest request sent to the summarizer; a
            larger compacted region is summarized in chunks, each updating the
            running summary. ``None`` derives it from the window (the window
            less the reserve), or 100,000 when the window is unknown.
        summary_prompt: Replaces the default checkpoint prompt.
        update_prompt: Replaces the default prompt used to update a previous
            summary; when only ``summary_prompt`` is given, updates use it too.
        system_prompt: Replaces the summarizer's system prompt.
        token_counter: Counts tokens instead of the built-in estimate; any
            callable over a list of LangChain messages. On async paths it runs
            in a worker thread, never on the event loop.
        timeout: Seconds one summary call may take before it fails with
            ``SummaryTimeoutError``; ``None`` for no limit. It is also passed
            to the model's client where the library knows how.
        redact: A function from text to text applied to everything the
            summarizer is shown (messages, tool calls and results, the
            previous summary), and so to what the extractive summarizer copies,
            the checked facts and what the recall tool returns;
            ``redact_secrets`` is a ready one. Off by default.
        ensure_user_turn: When the kept messages do not start with a user
            turn (an agent compacted mid-loop keeps an assistant tool call
            first), put a one-line user message after the summary: Anthropic's
            API rejects a conversation whose first turn is not the user's.

    The 0.2 keywords ``check_facts``, ``pin_tools``, ``pinned_max_tokens``,
    ``clear_tool_outputs``, ``keep_tool_uses``, ``clear_exclude_tools``,
    ``clear_min_tokens``, ``prepare_at``, ``summary_mode`` and
    ``require_sections`` are accepted for one more release, with a
    ``DeprecationWarning`` naming the feature that replaces each.

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
    ensure_user_turn: bool = True
    legacy: ClassVar[Mapping[str, Any]] = MappingProxyType({})
    """The deprecated keywords given to this instance (read by ``features.resolve``); not an option."""

    def __init__(  # noqa: PLR0917 - the fields 0.2 took by position, in its order; the rest by keyword only
        self,
        context_window: int = 0,
        reserve_tokens: int | None = None,
        keep_recent_tokens: int | None = None,
        summary_prompt: str | None = None,
        update_prompt: str | None = None,
        system_prompt: str | None = None,
        token_counter: TokenCounterFn | None = None,
        summary_input_tokens: int | None = None,
        timeout: float | None = None,
        redact: Callable[[str], str] | None = None,
        summary_max_tokens: int | None = None,
        *,
        ensure_user_turn: bool = True,
        check_facts: bool = _UNSET,
        pin_tools: tuple[str, ...] = _UNSET,
        pinned_max_tokens: int | None = _UNSET,
        clear_tool_outputs: bool = _UNSET,
        keep_tool_uses: int = _UNSET,
        clear_exclude_tools: tuple[str, ...] = _UNSET,
        clear_min_tokens: int = _UNSET,
        prepare_at: float | None = _UNSET,
        summary_mode: str = _UNSET,
        require_sections: bool = _UNSET,
    ) -> None:
        values = {
            "context_window": context_window,
            "reserve_tokens": reserve_tokens,
            "keep_recent_tokens": keep_recent_tokens,
            "summary_max_tokens": summary_max_tokens,
            "summary_input_tokens": summary_input_tokens,
            "summary_prompt": summary_prompt,
            "update_prompt": update_prompt,
            "system_prompt": system_prompt,
            "token_counter": token_counter,
            "timeout": timeout,
            "redact": redact,
            "ensure_user_turn": ensure_user_turn,
        }
        for name, value in values.items():
            object.__setattr__(self, name, value)
        legacy = _legacy_values(
            {
                "check_facts": check_facts,
                "pin_tools": pin_tools,
                "pinned_max_tokens": pinned_max_tokens,
                "clear_tool_outputs": clear_tool_outputs,
                "keep_tool_uses": keep_tool_uses,
                "clear_exclude_tools": clear_exclude_tools,
                "clear_min_tokens": clear_min_tokens,
                "prepare_at": prepare_at,
                "summary_mode": summary_mode,
                "require_sections": require_sections,
            }
        )
        if legacy:
            object.__setattr__(self, "legacy", MappingProxyType(legacy))
        self._check()

    def _check(self) -> None:
        for name in ("summary_input_tokens", "summary_max_tokens"):  # (before the budgets add them up)
            value = getattr(self, name)
            if value is not None:
                minimum = 1000 if name == "summary_input_tokens" else 64
                check_int(name, value, minimum=minimum, advice=f"at least {minimum}, or None to derive it")
        self._check_budgets()
        for name in ("summary_prompt", "update_prompt", "system_prompt"):
            _check_text(name, getattr(self, name))
        advice = "pass a callable over a list of messages, e.g. count_tokens_approximately"
        check_callable("token_counter", self.token_counter, advice, called_with=([],))
        check_callable("redact", self.redact, "pass a function from text to text, e.g. redact_secrets", ("text",))
        check_flag("ensure_user_turn", self.ensure_user_turn)
        if self.timeout is not None:
            check_seconds("timeout", self.timeout, "pass a positive number of seconds, or None")

    def _check_budgets(self) -> None:
        check_int("context_window", self.context_window, minimum=0, advice="the model's window, or 0 if unknown")
        for name in ("reserve_tokens", "keep_recent_tokens"):
            value = getattr(self, name)
            if value is not None:
                check_int(name, value, minimum=0, advice="a positive number, or None (or 0) to derive it")
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
        threshold = self.budget.threshold
        assert threshold is not None  # the window is known
        if self.keep_recent_tokens is not None and self.keep_recent_tokens >= threshold:
            raise ConfigurationError(
                "keep_recent_tokens",
                self.keep_recent_tokens,
                f"keeping that much leaves no room: compaction fires above "
                f"context_window - reserve_tokens = {threshold} tokens; "
                f"pass keep_recent_tokens below {threshold}, e.g. {threshold * 3 // 10}, or None to derive it",
            )
        summary = self.summary_max_tokens
        keep = self.budget.keep
        if summary is not None and keep + summary >= threshold:
            raise ConfigurationError(
                "summary_max_tokens",
                summary,
                f"a summary that long beside the {keep} tokens kept verbatim would not bring the context under "
                f"context_window - reserve_tokens = {threshold} tokens; pass summary_max_tokens below "
                f"{threshold - keep}, e.g. {max((threshold - keep) // 3, 64)}, or None to derive it",
            )

    @cached_property
    def budget(self) -> Budget:
        """Every budget in force (see ``derive_budget``); derived once, the options being frozen."""
        return derive_budget(self)

    def with_fixed(self, fixed: int) -> CompactionOptions:
        """These options with ``fixed`` tokens no compaction can remove: the same fields, the budget over the rest.

        A compaction plans with them (``derive_budget``): with a long system
        prompt or many tools, the landing, keep and summary are taken over what
        it can remove, so it lands halfway between the fixed part and the
        threshold instead of above a landing it cannot reach.
        """
        if fixed <= 0:
            return self
        copy = self.with_window(self.context_window)
        copy.__dict__["budget"] = derive_budget(self, fixed)  # (``budget`` is cached: the copy's is for its part)
        return copy

    def _fields(self) -> dict[str, Any]:
        """The twelve fields by name (what the options are, the deprecated keywords aside)."""
        return {name: getattr(self, name) for name in _FIELDS}

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CompactionOptions):
            return NotImplemented
        return self._fields() == other._fields() and dict(self.legacy) == dict(other.legacy)

    def __hash__(self) -> int:
        return hash(tuple(self._fields().values()))

    def __reduce__(self) -> tuple[Any, ...]:
        # (Pickled and deep-copied with the deprecated keywords given, without warning again.)
        return (_rebuilt, (self._fields(), dict(self.legacy)))

    def with_window(self, context_window: int) -> CompactionOptions:
        """These options for another context window (the deprecated keywords carried over)."""
        return _rebuilt({**self._fields(), "context_window": context_window}, dict(self.legacy))


def _rebuilt(fields: dict[str, Any], legacy: dict[str, Any]) -> CompactionOptions:
    """Options made again from their fields and the deprecated keywords they were given (unpickling)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return CompactionOptions(**fields, **legacy)


_FIELDS = (
    "context_window",
    "reserve_tokens",
    "keep_recent_tokens",
    "summary_max_tokens",
    "summary_input_tokens",
    "summary_prompt",
    "update_prompt",
    "system_prompt",
    "token_counter",
    "timeout",
    "redact",
    "ensure_user_turn",
)


MIN_ROOM_TOKENS = 128
"""The least room a compaction needs above the fixed part (a short summary and the newest message)."""


def derive_budget(options: CompactionOptions, fixed: int = 0) -> Budget:
    """Every budget in force for ``options``: the one place budgets are derived (see the module docstring).

    Args:
        options: The options.
        fixed: Tokens no compaction can remove (the system prompt and tools
            sent with every request, leading system messages): the landing is
            halfway from them to the threshold, and the keep and the summary
            fit in that half (a keep or summary set by the user too, when it
            would not).

    Returns:
        The budgets.
    """
    window = options.context_window
    reserve = options.reserve_tokens
    if reserve is None:
        reserve = min(DEFAULT_RESERVE_TOKENS, window // 8) if window else DEFAULT_RESERVE_TOKENS
    threshold = window - reserve if window else None
    fixed = max(fixed, 0)
    landing = (threshold + min(fixed, threshold)) // 2 if threshold is not None else None
    room = landing - fixed if landing is not None else None
    keep = options.keep_recent_tokens
    if keep is None:
        keep = (
            max(min(DEFAULT_KEEP_RECENT_TOKENS, room * 3 // 5), 1) if room is not None else DEFAULT_KEEP_RECENT_TOKENS
        )
    elif fixed and room is not None and keep >= room:
        keep = max(room * 3 // 5, 1)
    summary_max = options.summary_max_tokens
    # Over a fixed part, the summary fits what the landing leaves (a short one, at the least).
    floor = min(MIN_SUMMARY_TOKENS, max((room or 0) - keep, 64)) if fixed else MIN_SUMMARY_TOKENS
    if summary_max is None:
        left = (room - keep) * 2 // 3 if room is not None else DEFAULT_SUMMARY_MAX_TOKENS
        summary_max = min(max(left, floor), DEFAULT_SUMMARY_MAX_TOKENS)
    elif fixed and room is not None and keep + summary_max > room:
        summary_max = max((room - keep) * 2 // 3, floor)
    summary_input = options.summary_input_tokens
    if summary_input is None:
        summary_input = max(threshold, 1000) if threshold is not None else DEFAULT_SUMMARY_INPUT_TOKENS
    return Budget(window, reserve, keep, threshold, landing, summary_max, summary_input, fixed)
