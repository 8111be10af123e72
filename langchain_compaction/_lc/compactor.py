"""What makes a compaction: the plan, what the features add, and the compacted list.

``Compactor`` holds what every compaction needs (the summarizer and its fallback, the options, the features
bound to them, the token cache) and makes the pieces ``Turn`` (``_lc.turn``) puts together: ``plan`` (a
cheaper step first, else the cut and the summary flow), ``finish`` (the summary message with what the features
add, laid out around the caller's own objects), a clearing's output, and a list whose misplaced summary is put
back.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from langchain_core.messages import BaseMessage
from typing_extensions import Self

from langchain_compaction._lc.advice import Told
from langchain_compaction._lc.conversation import CONVERSATIONS_REMEMBERED
from langchain_compaction._lc.convert import bridge_message, cleared_copy, summary_message, to_core
from langchain_compaction._lc.counting import (
    DEFAULT_CACHE_SIZE,
    TokenCountCache,
    count_messages,
    counts_and_core,
    working,
)
from langchain_compaction.core.bounded import Bounded
from langchain_compaction.core.effects import Call, Flow
from langchain_compaction.core.engine import DriverReport, Summarizer, summarize
from langchain_compaction.core.flow import SummaryFlow, compaction_flow
from langchain_compaction.core.layout import body_mark, compaction_result, compose_summary, layout, well_formed
from langchain_compaction.core.options import CompactionOptions
from langchain_compaction.core.plan import (
    Plan,
    grown_since_summary,
    leading_block,
    misplaced,
    narrowed,
    plan_compaction,
    reordered,
)
from langchain_compaction.core.record import KEPT_BEFORE_KEY, KEPT_FROM_KEY, LINEAGE_KEY, numbering, stamp, written_here
from langchain_compaction.core.result import CompactionResult
from langchain_compaction.core.types import Message, Preamble
from langchain_compaction.errors import ConfigurationError
from langchain_compaction.features import CacheAligned, Commit, Draft, Feature, RequireSections, resolve
from langchain_compaction.features.clearing import ClearingPlan, ClearToolOutputs
from langchain_compaction.features.prepared import PreparedSummary
from langchain_compaction.summarizers.chat_model import as_summarizer

if TYPE_CHECKING:
    from langchain_compaction._lc.turn import Turn

logger = logging.getLogger("langchain_compaction")
_T = TypeVar("_T")

Trigger = Literal["auto", "force", "overflow"]
"""``auto``: only when the trigger rule says so; ``force``: now."""

Output = tuple[CompactionResult, list[BaseMessage]]
"""A finished compaction: its figures and the compacted list."""


@dataclass(frozen=True, slots=True)
class Job:
    """A compaction planned over a LangChain list, ready to be driven.

    Attributes:
        messages: The caller's list.
        core: Its core form.
        counts: Token count per message.
        plan: The plan (``None`` when clearing old tool outputs is enough).
        flow: The summary flow for the plan (``None`` likewise).
        clearing: Which tool outputs to clear instead of summarizing, if that is enough.
        repeated: Whether it repeats a compaction a few turns old (and so keeps less).
        kept: Indices of the messages the output keeps.
        options: The options it was planned with (``Compactor.planning``).
    """

    messages: Sequence[BaseMessage]
    core: list[Message]
    counts: list[int]
    plan: Plan | None
    flow: SummaryFlow | None
    clearing: ClearingPlan | None = None
    repeated: bool = False
    kept: tuple[int, ...] = ()
    options: CompactionOptions | None = None


@dataclass(frozen=True, slots=True)
class Compactor:
    """What a compaction needs, and the pieces every compaction is made of.

    Attributes:
        summarizer: Writes the summaries.
        fallback: Takes over when the summarizer fails, if given.
        options: The options in force.
        features: The features, checked against the options.
        given: The features as the user gave them (bound again when the window is learnt).
        cache: Token counts per message, shared by every version of this turn.
        told: What was said once per conversation (a warning is not repeated every turn).
    """

    summarizer: Summarizer
    fallback: Summarizer | None
    options: CompactionOptions
    features: tuple[Feature, ...]
    given: tuple[Feature, ...]
    cache: TokenCountCache
    told: Told = field(default_factory=Told)
    tried: Bounded[tuple[str, int]] = field(default_factory=lambda: Bounded(CONVERSATIONS_REMEMBERED))
    """Per conversation, a compaction that committed (archived) and did not finish: its id and size (``stamp``).

    As many conversations as every per-conversation state (an outage fails them all at once: one pushed out
    before its retry archived its region again under a new id); dropped when the compaction finishes."""

    @classmethod
    def build(
        cls,
        model: Any,
        options: object,
        fallback: Any = None,
        features: Sequence[Feature] | None = None,
        *,
        where: Literal["graph", "history", "function"] = "graph",
        adapter: dict[str, Any] | None = None,
        cache_size: int = DEFAULT_CACHE_SIZE,
    ) -> Self:
        """Accept what a user passes (a model, options or ``None``, a fallback, features) and check it.

        Raises:
            ConfigurationError: An argument is not what it should be.
        """
        if options is None:
            options = CompactionOptions()
        if not isinstance(options, CompactionOptions):
            raise ConfigurationError("options", options, "pass CompactionOptions(context_window=...), or None")
        if isinstance(cache_size, bool) or not isinstance(cache_size, int) or cache_size < 1:
            raise ConfigurationError("cache_size", cache_size, f"pass a positive number (default {DEFAULT_CACHE_SIZE})")
        bound = resolve(features, options, where=where, adapter=adapter)
        given = tuple(features) if features is not None else bound
        backup = None if fallback is None else as_summarizer(fallback, field="fallback")
        cache = TokenCountCache(options, max_entries=cache_size)
        return cls(as_summarizer(model), backup, options, bound, given, cache)

    def with_window(self, context_window: int) -> Self:
        """This turn for another context window: the features bound again, the caches kept."""
        options = self.options.with_window(context_window)
        return replace(self, options=options, features=tuple(f.bind(options) for f in self.features))

    def feature(self, kind: type[Any]) -> Any:
        """The feature of ``kind`` in force, or ``None``."""
        return next((f for f in self.features if isinstance(f, kind)), None)

    def seam(self, name: str) -> list[Feature]:
        return [f for f in self.features if type(f).overrides(name)]

    def refuse(self, store: Any, instructions: object) -> None:
        """Raise what no turn may start with, first thing, before any model call.

        A server attaches its store at run time, so what the features need
        from it is said on the first turn, not at construction.
        """
        if not isinstance(instructions, str):
            raise ConfigurationError("custom_instructions", instructions, "pass a string ('' for none)")
        for feature in self.seam("require"):
            feature.require(store)

    def work(self, function: Callable[..., _T], /, *args: Any, **kwargs: Any) -> Call[_T]:
        """A long step (a plan, a finish, a count) off the event loop on the async path (``counting.working``)."""
        return working(self.options, function, *args, **kwargs)

    def plan(
        self,
        messages: Sequence[BaseMessage],
        core: list[Message],
        counts: list[int],
        *,
        instructions: str = "",
        trigger: Trigger = "force",
        overhead: int = 0,
        preamble: Preamble | None = None,
        keep: int | None = None,
        options: CompactionOptions | None = None,
    ) -> Job | None:
        """Plan a compaction of ``messages``: a cheaper step if one is enough, else the cut and the summary flow.

        ``options``: what to plan with (``planning``: the budget over what the compaction
        can remove); ``keep``: the recent tokens to keep instead of the budget's.
        """
        if options is None:
            options = self.planning(core, counts, overhead)
        if trigger == "auto":
            cheaper = self.seam("instead")
            if cheaper:
                protected = frozenset(self._protected(core, counts, 0, len(core))[0])
                for feature in cheaper:
                    clearing = feature.instead(core, counts, protected)
                    if clearing is not None:
                        return Job(messages, core, counts, None, None, clearing)
        keep, repeated = self._keep(core, counts, trigger, options) if keep is None else (keep, False)
        most = 0 if trigger == "overflow" else options.budget.most_kept  # (an exchange over it goes whole)
        plan = plan_compaction(core, counts, keep, force=trigger != "auto", protect=self._protected, most=most)
        if plan is None:
            return None
        shape = layout(core, plan, options)
        required: RequireSections | None = self.feature(RequireSections)
        flow = compaction_flow(
            core,
            plan,
            options,
            instructions.strip(),
            originals=tuple(messages),
            counts=counts,
            preamble=preamble,
            required=required.headings if required is not None else (),
            reserved=sum(f.reserve(options) for f in self.features),
        )
        kept = (*shape.head, *shape.kept)
        return Job(messages, core, counts, plan, flow, repeated=repeated, kept=kept, options=options)

    def planning(self, core: Sequence[Message], counts: Sequence[int], overhead: int = 0) -> CompactionOptions:
        """The options a compaction plans with: the budget over what it can remove.

        What it cannot remove is fixed: ``overhead`` (the system prompt and
        tool schemas a request sends besides the messages) and the leading
        system messages.
        """
        return planning_options(self.options, core, counts, overhead)

    def _protected(
        self, core: Sequence[Message], counts: Sequence[int], start: int, cut: int
    ) -> tuple[tuple[int, ...], int]:
        """What the features say may not be cut in ``[start, cut)`` (the ``protect`` seam); how many were left out."""
        kept: set[int] = set()
        over = 0
        for feature in self.seam("protect"):
            indices, left = feature.protect(core, counts, start, cut)
            kept.update(indices)
            over += left
        return tuple(sorted(kept)), over

    def _keep(
        self, core: Sequence[Message], counts: Sequence[int], trigger: Trigger, options: CompactionOptions
    ) -> tuple[int, bool]:
        """The keep budget for this compaction, and whether it repeats the previous one too soon.

        No death spiral: a compaction lands halfway between the fixed part and
        the threshold, so the next comes after about the distance from its
        landing to the threshold. When it comes back after less than half of
        that, what was kept was too large to land, so this compaction keeps
        half as much instead of summarizing the same way again (the turn says
        so, once per conversation).
        """
        budget = options.budget
        grown = grown_since_summary(core, counts) if trigger == "auto" else None
        if grown is None or budget.threshold is None or budget.landing is None:
            return budget.keep, False
        if grown >= (budget.threshold - budget.landing) // 2:
            return budget.keep, False
        return max(budget.keep // 2, 1), True

    def record(
        self, job: Job, namespace: tuple[str, ...], retry: tuple[str, int] | None = None
    ) -> tuple[list[int], list[int], dict[str, Any]]:
        """What ``job`` removes and the cleared copies it takes out (``taken_out``), and its record (``stamp``)."""
        assert job.plan is not None
        removed, cleared = taken_out(job.core, job.kept)
        cut = job.plan.cut
        base = {
            KEPT_FROM_KEY: job.messages[cut].id if cut < len(job.messages) else None,
            KEPT_BEFORE_KEY: [job.messages[i].id for i in job.kept if job.plan.start <= i < cut and job.messages[i].id],
        }
        return removed, cleared, stamp(job.core, job.kept, removed, base, namespace, retry=retry)

    def prepared_of(
        self, snapshot: list[BaseMessage], base: PreparedSummary | None, *, keep: int
    ) -> Flow[PreparedSummary | None]:
        """The background preparation of ``snapshot`` (on top of ``base`` when it still applies), keeping ``keep``."""
        chained = base is not None and base.matches(snapshot)
        target = base.output_for(snapshot) if base is not None and chained else snapshot
        counts, core = yield self.work(counts_and_core, target, self.options)
        job = yield self.work(
            self.plan,
            target,
            core,
            counts,
            keep=keep,
            preamble=None if self.feature(CacheAligned) is None else Preamble(),
        )
        if job is None or job.flow is None:
            return None
        report = yield from summarize(job.flow, self.summarizer, fallback=self.fallback, timeout=self.options.timeout)
        job = self.narrowed(job, report)  # nothing committed yet: what the chunks that answered cover is kept
        result, output = yield self.work(self.finish, job, report, {})
        if base is not None and chained:
            # One compaction, made in two steps: what both sent.
            result = replace(
                result,
                summarizer_calls=base.result.summarizer_calls + result.summarizer_calls,
                summarizer_input_tokens=base.result.summarizer_input_tokens + result.summarizer_input_tokens,
            )
        known = {id(m) for m in snapshot}
        written = [m for m in output if id(m) not in known]
        tokens = yield self.work(count_messages, written, [to_core(m) for m in written], self.options)
        logger.info("prepared a summary of %d messages in the background", result.messages_removed)
        return PreparedSummary.of(snapshot, result, output, written_tokens=sum(tokens))

    def narrowed(self, job: Job, report: DriverReport) -> Job:
        """``job`` as far as its summary got: when a later chunk failed, the cut moves back to that chunk.

        The summary of the chunks that succeeded is kept, and the rest of the
        region stays verbatim until the next compaction: a summarizer that
        fails now and then still shrinks a long backlog, chunk by chunk,
        where all or nothing would let it grow.
        """
        outcome = report.outcome
        if outcome.until is None or job.plan is None:
            return job
        plan = narrowed(job.plan, outcome.until)
        shape = layout(job.core, plan, job.options or self.options)
        logger.warning(
            "the summarizer failed on chunk %d (%s): the summary covers the %d chunk(s) before it, and the %d "
            "messages from there on stay verbatim until the next compaction",
            outcome.chunks + 1,
            outcome.failure,
            outcome.chunks,
            job.plan.cut - outcome.until,
        )
        return replace(job, plan=plan, kept=(*shape.head, *shape.kept))

    def finish(self, job: Job, report: DriverReport, record: dict[str, Any]) -> Output:
        """The compacted list (the caller's objects around what was written) and its figures.

        Args:
            job: From ``plan``.
            report: From the driver.
            record: The summary's record (``core.record.stamp``).

        Returns:
            The result and the compacted list.
        """
        assert job.plan is not None
        original, plan = job.messages, job.plan
        options = job.options or self.options
        shape = layout(job.core, plan, options, job.counts)
        # Whatever the summarizer wrote, the message is well formed: what the
        # library adds never lands inside a fence the summarizer left open.
        text = well_formed(report.outcome.summary)
        if report.failed:  # (a summarizer failing every time, a revoked key, would otherwise go unseen)
            logger.warning("the summarizer failed and the fallback, %s, answered: %s", report.summarizer, report.failed)
        draft = Draft(job.core, plan, shape.kept, text, options)
        added = [(f.name, f.add(draft)) for f in self.seam("add")]
        content, body = compose_summary(text, [a.section for _, a in added if a is not None])
        mark: dict[str, Any] = {"kind": "summary", "version": 2, **body_mark(content, body)}
        for _, addition in added:
            if addition is not None:
                mark.update(addition.mark)
        mark.update(record)
        written: list[BaseMessage] = [summary_message(content, mark, summary_id(record))]
        written += [bridge_message(shape.request, shape.note)] * shape.bridge
        output = shape.arranged(original, written)
        written_tokens = sum(count_messages(written, [to_core(m) for m in written], self.options))
        result = compaction_result(plan, shape, job.counts, written_tokens, report=report, options=options)
        parts = {name: dict(a.record) for name, a in added if a is not None and a.record}
        return replace(result, summary=text, repeated=job.repeated, parts=parts), output

    def _cleared(self, job: Job, clearing: ClearingPlan) -> Output:
        """The list with the outputs ``clearing`` names replaced by their placeholders (``cleared_copy``)."""
        output = list(job.messages)
        for index, texts in clearing.by_message().items():
            output[index] = cleared_copy(output[index], texts, job.counts[index])
        replaced = [output[i] for i in clearing.messages]
        placeholders = sum(count_messages(replaced, [to_core(m) for m in replaced], self.options))
        result = ClearToolOutputs.result(clearing, job.counts, placeholders)
        return result, output

    # -- what happens around a compaction ---------------------------------------------------------

    def _reorder(
        self, messages: Sequence[BaseMessage], core: Sequence[Message], counts: list[int]
    ) -> tuple[list[BaseMessage], list[Message], list[int]] | None:
        """Summaries found mid-history put back where they belong (``core.plan.reordered``); ``None`` if none is."""
        if not misplaced(core):
            return None
        shape = reordered(core, self.options.ensure_user_turn)
        out = [(messages[i], core[i], counts[i]) for i in shape.head]
        if shape.bridge:
            bridge = bridge_message()
            bridge_core = to_core(bridge)
            out.append((bridge, bridge_core, count_messages([bridge], [bridge_core], self.options)[0]))
        out += [(messages[i], core[i], counts[i]) for i in shape.kept]
        logger.info(
            "a summary was found mid-history (a subgraph's output merged into its parent): moved it to the front, "
            "%d -> %d messages",
            len(messages),
            len(out),
        )
        return [m for m, _, _ in out], [c for _, c, _ in out], [n for _, _, n in out]


def commit_of(
    messages: Sequence[BaseMessage],
    core: Sequence[Message],
    removed: Sequence[int],
    *,
    mark: Mapping[str, Any],
    conversation: Any,
    store: Any,
    cleared: Sequence[int] = (),
) -> Commit:
    """What the features' ``commit`` seam is given: the messages removed and the cleared copies taken out, placed."""
    where = positions(core)
    return Commit(
        [(p, messages[i]) for i in removed if (p := where[i]) is not None],
        mark,
        conversation,
        store,
        frozenset(m.id for m in messages if m.id),
        [(p, m.id) for i in cleared if (p := where[i]) is not None and (m := messages[i]).id],
    )


def taken_out(core: Sequence[Message], kept: Iterable[int]) -> tuple[list[int], list[int]]:
    """What a compaction keeping ``kept`` takes out: what leaves for good, and the placeholders of outputs cleared.

    A cleared output was archived when cleared (``leaves`` says why its placeholder is not archived again).
    """
    keep = set(kept)
    out = [i for i in range(len(core)) if i not in keep]
    return [i for i in out if leaves(core[i])], [i for i in out if core[i].mark.get("kind") == "cleared"]


def leaves(message: Message) -> bool:
    """Whether a message taken out of the state leaves it for good.

    Not what the library wrote, nor a message with an output cleared earlier
    (archived whole then: a user turn's other tool_result blocks cleared later too).
    """
    return not written_here(message) and message.mark.get("kind") != "cleared"


def positions(core: Sequence[Message]) -> tuple[int | None, ...]:
    return numbering(core).positions


def summary_id(record: dict[str, Any]) -> str:
    lineage = record.get(LINEAGE_KEY) or []
    return f"compaction-summary-{lineage[-1]}" if lineage else f"compaction-summary-{time.monotonic_ns():x}"


def planning_options(
    options: CompactionOptions, core: Sequence[Message], counts: Sequence[int], overhead: int = 0
) -> CompactionOptions:
    """``options`` with the fixed part a compaction cannot remove: ``overhead`` and the leading system messages."""
    head = sum(counts[i] for i in range(leading_block(core)) if not core[i].is_summary)
    return options.with_fixed(overhead + head)


def log(result: CompactionResult) -> None:
    """Log what a compaction did, at INFO."""
    cleared = result.part("clearing").get("cleared")
    if cleared:
        logger.info(
            "cleared %d old tool outputs instead of summarizing: %d -> %d tokens",
            cleared,
            result.original_tokens,
            result.compacted_tokens,
        )
        return
    logger.info(
        "compacted %d messages into a summary: %d -> %d tokens (cut at %d, %d summarizer call(s)%s)",
        result.messages_removed,
        result.original_tokens,
        result.compacted_tokens,
        result.cut_index,
        result.summarizer_calls,
        ", fallback used" if result.fallback_used else "",
    )


class Adapter:
    """What every adapter shows of its turn: the options and the features in force."""

    _turn: Turn

    @property
    def options(self) -> CompactionOptions:
        """The options in force."""
        return self._turn.options

    @property
    def features(self) -> tuple[Feature, ...]:
        """The features in force (``langchain_compaction.features``)."""
        return self._turn.features
