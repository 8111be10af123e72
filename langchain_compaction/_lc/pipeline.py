"""The compaction pipeline every adapter shares: prepare, summarize, finish.

A ``Compactor`` holds what a compaction needs (the summarizer, the fallback,
the options) and runs the three steps over a LangChain message list:

1. ``prepare``: convert and count (or take the adapter's cached counts), ask
   the one trigger rule when the compaction is automatic, try clearing old tool
   outputs first when the options say so, plan the cut and create the summary
   flow. Pure; on async paths it runs off the event loop.
2. ``compaction``: the summarizer calls (``core.engine.summarize``), then
   ``finish``, as one flow an adapter drives sync or async (``core.effects``).
3. ``finish``: lay the output out (``core.layout``) and map it back to the
   caller's own objects: ``[leading system messages, summary, (bridge),
   *kept]``, with the result's figures.

The adapters differ only in where the output goes.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, TypeVar, cast

from langchain_core.callbacks import adispatch_custom_event, dispatch_custom_event
from langchain_core.messages import BaseMessage
from langchain_core.runnables import Runnable, RunnableConfig
from langchain_core.runnables.config import ensure_config, get_callback_manager_for_config
from langgraph.graph.message import REMOVE_ALL_MESSAGES

from langchain_compaction._lc.archive import numbering
from langchain_compaction._lc.convert import (
    SUMMARY_MARK,
    as_dict,
    bridge_message,
    is_compaction_message,
    summary_message,
    to_core,
    to_core_list,
)
from langchain_compaction._lc.counting import count_messages, counts_and_core
from langchain_compaction._lc.prepared import PREPARE_EVENT, PREPARE_WAIT_SECONDS, PreparedSummary, Preparer
from langchain_compaction.core.clearing import ClearingPlan, plan_clearing
from langchain_compaction.core.context import context_tokens, needs_compaction, stage
from langchain_compaction.core.effects import Call, Flow, adrive, blocking, drive, twin
from langchain_compaction.core.engine import DriverReport, Summarizer, summarize
from langchain_compaction.core.facts import check_compaction
from langchain_compaction.core.flow import SummaryFlow, compaction_flow
from langchain_compaction.core.layout import clearing_result, compaction_result, compose_summary, layout
from langchain_compaction.core.options import CompactionOptions
from langchain_compaction.core.plan import (
    REPEAT_TURNS,
    Pins,
    Plan,
    misplaced,
    plan_compaction,
    reordered,
    turns_since_summary,
)
from langchain_compaction.core.result import CompactionResult
from langchain_compaction.core.types import NO_PREAMBLE, Message, Preamble
from langchain_compaction.errors import ConfigurationError, InvalidMessagesError
from langchain_compaction.summarizers.chat_model import as_summarizer

logger = logging.getLogger("langchain_compaction")

_T = TypeVar("_T")

COMPACTION_EVENT = "langchain_compaction"
"""Name of the LangChain custom event dispatched after each compaction.

Its data is the ``CompactionRecord`` (``CompactionResult.to_dict()``).
"""

Trigger = Literal["auto", "force"]
"""``auto``: only when the trigger rule says so (clearing first, if enabled); ``force``: now."""

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
    """

    messages: Sequence[BaseMessage]
    core: list[Message]
    counts: list[int]
    plan: Plan | None
    flow: SummaryFlow | None
    clearing: ClearingPlan | None = None
    repeated: bool = False


def _check_messages(messages: object) -> Sequence[BaseMessage]:
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        msg = (
            f"messages is a {type(messages).__name__}, not a list of messages; pass a list of "
            "LangChain messages (convert_to_messages converts dicts, tuples and strings)"
        )
        raise InvalidMessagesError(msg)
    return messages


@dataclass(frozen=True, slots=True)
class Compactor:
    """What a compaction needs, and the three steps that make one.

    Attributes:
        summarizer: Writes the summaries.
        fallback: Takes over when the summarizer fails, if given.
        options: The options in force.
        note: A line the library writes under each summary (the archive's
            pointer to the recall tool), or "".
    """

    summarizer: Summarizer
    fallback: Summarizer | None
    options: CompactionOptions
    note: str = ""

    @classmethod
    def build(cls, model: Any, options: object, fallback: Any = None, note: str = "") -> Compactor:
        """Accept what a user passes (a model, options or ``None``, a fallback) and check it.

        Raises:
            ConfigurationError: An argument is not what it should be.
        """
        if options is None:
            options = CompactionOptions()
        if not isinstance(options, CompactionOptions):
            raise ConfigurationError("options", options, "pass CompactionOptions(context_window=...), or None")
        backup = None if fallback is None else as_summarizer(fallback, field="fallback")
        return cls(as_summarizer(model), backup, options, note)

    def prepare(
        self,
        messages: Sequence[BaseMessage],
        instructions: str = "",
        *,
        trigger: Trigger,
        counts: Sequence[int] | None = None,
        core: Sequence[Message] | None = None,
        overhead: int = 0,
        preamble: Preamble = NO_PREAMBLE,
    ) -> Job | None:
        """Plan a compaction of ``messages``; ``None`` if there is nothing to do.

        Args:
            messages: The conversation.
            instructions: Appended to the summary prompt.
            trigger: ``"auto"`` asks the trigger rule first; ``"force"`` compacts now.
            counts: Token counts per message, when the caller has them cached.
            core: The core form of each message, when the caller has it cached.
            overhead: Tokens the request carries besides the messages.
            preamble: What the request carries besides the messages, for a
                cache-aligned summary request.

        Returns:
            The job, or ``None``.
        """
        if not isinstance(instructions, str):
            raise ConfigurationError("custom_instructions", instructions, "pass a string ('' for none)")
        messages = _check_messages(messages)
        converted = list(core) if core is not None and len(core) == len(messages) else to_core_list(messages)
        sizes = list(counts) if counts is not None else count_messages(messages, converted, self.options)
        if trigger == "auto":
            if not needs_compaction(converted, sizes, self.options, overhead):
                return None
            clearing = self._clearing(converted, sizes)
            if clearing is not None:
                return Job(messages, converted, sizes, None, None, clearing)
        keep, repeated = self._keep(converted, trigger)
        pins = Pins(tuple(self.options.pin_tools), self.options.budget.pinned_max)
        plan = plan_compaction(converted, sizes, keep, force=trigger == "force", pins=pins)
        if plan is None:
            return None
        flow = compaction_flow(
            converted,
            plan,
            self.options,
            instructions.strip(),
            originals=tuple(messages),
            counts=sizes,
            preamble=preamble,
        )
        return Job(messages, converted, sizes, plan, flow, repeated=repeated)

    def _keep(self, core: Sequence[Message], trigger: Trigger) -> tuple[int, bool]:
        """The keep budget for this compaction, and whether it repeats one a few turns old.

        No death spiral: when the threshold is crossed again within
        ``REPEAT_TURNS`` replies, what was kept is too large for the landing
        target, so this compaction keeps half as much instead of summarizing
        the same way again.
        """
        keep = self.options.budget.keep
        since = turns_since_summary(core) if trigger == "auto" else None
        if since is None or since > REPEAT_TURNS:
            return keep, False
        logger.warning(
            "compaction fired again %d assistant turn(s) after the previous one: the messages kept were too large "
            "to land under the target; keeping %d tokens instead of %d this time",
            since,
            keep // 2,
            keep,
        )
        return max(keep // 2, 1), True

    def _clearing(self, core: Sequence[Message], counts: Sequence[int]) -> ClearingPlan | None:
        options, budget = self.options, self.options.budget
        if not options.clear_tool_outputs or budget.clearing_target is None:
            return None
        return plan_clearing(
            core,
            counts,
            keep_recent_tokens=budget.keep,
            target_tokens=budget.clearing_target,
            keep_tool_uses=options.keep_tool_uses,
            exclude_tools=(*options.clear_exclude_tools, *options.pin_tools),  # pinned outputs stay whole
            min_tokens=options.clear_min_tokens,
        )

    def reorder(
        self, messages: Sequence[BaseMessage], core: Sequence[Message], counts: Sequence[int]
    ) -> tuple[list[BaseMessage], list[Message], list[int]] | None:
        """Summaries found mid-history put back where they belong (``core.plan.reordered``); ``None`` if none is.

        Returns:
            The messages, their core forms and counts, reordered, with what the
            newest summary covers gone and a bridge where one is needed.
        """
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

    def compaction(self, job: Job, summarizer: Summarizer | None = None) -> Flow[Output]:
        """Summarize ``job`` (with ``summarizer`` instead of the compactor's, if given), then finish.

        Returns:
            A flow for ``drive`` / ``adrive`` that returns the result and the compacted list.
        """
        started = time.monotonic()
        report = None
        if job.flow is not None:
            report = yield from summarize(
                job.flow, summarizer or self.summarizer, fallback=self.fallback, timeout=self.options.timeout
            )
        # Finishing counts what was written, with the user's counter if any:
        # off the event loop on the async path.
        result, output = yield blocking(self.finish, job, report)
        return replace(result, wait_seconds=time.monotonic() - started), output

    # -- summaries prepared ahead (``prepare_at``; see ``_lc.prepared``) ------------------

    def staged(
        self,
        preparer: Preparer[PreparedSummary] | None,
        messages: Sequence[BaseMessage],
        core: Sequence[Message],
        counts: Sequence[int],
        *,
        thread: str,
        store: Any = None,
        config: RunnableConfig | None = None,
        overhead: int = 0,
    ) -> Flow[tuple[bool, Output | None]]:
        """What an automatic compaction does where the context stands (``core.context.stage``).

        Under the threshold nothing, but past the preparation mark a summary
        is started in the background; at the threshold a prepared one is
        taken if it applies.

        Returns:
            Whether a compaction is due, and the prepared compaction to apply
            (``None``: compact on the spot).
        """
        where = stage(core, counts, self.options, overhead)
        if where != "due":
            if where == "prepare":
                yield from self.ahead(preparer, messages, counts, thread=thread, store=store, config=config)
            return False, None
        ready = yield from self.prepared(preparer, messages, counts, thread=thread, store=store, overhead=overhead)
        return True, ready

    def ahead(
        self,
        preparer: Preparer[Any] | None,
        messages: Sequence[BaseMessage],
        counts: Sequence[int],
        *,
        thread: str,
        store: Any = None,
        config: RunnableConfig | None = None,
    ) -> Flow[bool]:
        """Start preparing the next summary of ``messages`` in the background; whether one was started.

        The caller has found the context past the preparation mark and under
        the threshold (``core.context.stage``). A finished preparation that
        would no longer land under the landing target if applied now (the
        conversation went on) is built on by a new one, so the threshold
        still finds one ready that lands.
        """
        if preparer is None:
            return False
        base = preparer.finished(thread)
        if base is not None:
            landing = self.options.budget.landing
            if not isinstance(base, PreparedSummary) or landing is None or base.tokens_for(counts) <= landing:
                return False
        started: bool = yield twin(preparer.start, preparer.astart, thread, messages, store, base)
        if started:
            logger.info("the context passed prepare_at: preparing the next summary in the background")
            yield twin(tell, atell, PREPARE_EVENT, {"thread": thread, "messages": len(messages)}, config)
        return started

    def prepared(
        self,
        preparer: Preparer[PreparedSummary] | None,
        messages: Sequence[BaseMessage],
        counts: Sequence[int],
        *,
        thread: str,
        store: Any = None,
        overhead: int = 0,
    ) -> Flow[Output | None]:
        """At the threshold: the summary prepared for ``messages`` applied, or ``None`` to compact on the spot."""
        if preparer is None:
            return None
        started = time.monotonic()
        found, _ = yield twin(preparer.take, preparer.atake, thread, messages, store)
        if found is None:
            return None
        result, output = yield from self.apply_prepared(found, messages, sum(counts), overhead)
        return replace(result, from_prepared=True, wait_seconds=time.monotonic() - started), output

    def apply_prepared(
        self, prepared: PreparedSummary, messages: Sequence[BaseMessage], original_tokens: int, overhead: int = 0
    ) -> Flow[Output]:
        """``prepared`` applied to ``messages``: its summary, then everything after its cut.

        The conversation grew since it was made; when the result would not
        land under the landing target, the messages between its cut and
        today's are folded in by one ordinary compaction, which updates the
        prepared summary (a small request, never a full re-summary).
        """
        combined = prepared.output_for(messages)
        counts, core = yield blocking(counts_and_core, combined, self.options)
        result = replace(prepared.result, compacted_tokens=sum(counts))
        landing = self.options.budget.landing
        if landing is not None and context_tokens(core, counts, overhead) > landing:
            job = yield blocking(self.prepare, combined, trigger="force", counts=counts, core=core, overhead=overhead)
            if job is not None:
                folded, combined = yield from self.compaction(job)
                calls = prepared.result.summarizer_calls + folded.summarizer_calls
                result = replace(folded, summarizer_calls=calls, chunks=prepared.result.chunks + folded.chunks)
        # The figures, against the conversation as it is now.
        where = {id(m): i for i, m in enumerate(messages)}
        kept = [where[id(m)] for m in combined if id(m) in where]
        after = next((i for i, m in enumerate(combined) if id(m) not in where), len(combined))
        first_kept = next((where[id(m)] for m in combined[after:] if id(m) in where), len(messages))
        return (
            replace(
                result,
                original_tokens=original_tokens,
                messages_removed=len(messages) - len(kept),
                cut_index=first_kept,
                messages_kept=len(kept),
            ),
            combined,
        )

    def finish(self, job: Job, report: DriverReport | None) -> Output:
        """The compacted list, as the caller's own objects around what was written, and its figures.

        Args:
            job: From ``prepare``.
            report: From the driver (``None`` for a clearing).

        Returns:
            The result and the compacted list.
        """
        if job.clearing is not None:
            return self._finish_clearing(job, job.clearing)
        assert job.plan is not None  # a summary job ...
        assert report is not None  # ... was driven
        original = job.messages
        shape = layout(job.core, job.plan, self.options)
        # What the summary covers ends at the cut; messages from before it
        # that are written back (pinned, before a provider block) are listed.
        kept_from = original[job.plan.cut].id if job.plan.cut < len(original) else None
        # Checked summaries: what the summarizer dropped of the facts in force,
        # the library adds under it; the facts are recorded to carry them on.
        checked = check_compaction(job.core, job.plan, shape.kept, report.outcome.summary, self.options)
        sections = [self.note, checked.section if checked is not None else ""]
        summary = compose_summary(report.outcome.summary, sections)
        facts = checked.facts if checked is not None else ()
        # Where the kept part starts in the whole conversation, so an archive
        # numbers what this compaction removes without reading the store.
        positions, following, compactions = numbering(original)
        cut = job.plan.cut
        position = positions[cut] if cut < len(original) and positions[cut] is not None else following
        kept_before = [(original[i].id, positions[i]) for i in shape.kept if i < cut]
        written: list[BaseMessage] = [
            summary_message(
                summary,
                last_message_id=original[-1].id,
                kept_from=kept_from,
                facts=facts,
                position=position,
                number=compactions + 1,
                kept_before=kept_before,
            )
        ]
        if shape.bridge:
            written.append(bridge_message())
        output = [*(original[i] for i in shape.head), *written, *(original[i] for i in shape.kept)]
        written_tokens = sum(count_messages(written, [to_core(m) for m in written], self.options))
        result = compaction_result(
            job.plan, shape, job.counts, written_tokens, report=report, options=self.options, facts=checked
        )
        result = replace(result, repeated=job.repeated)
        _log(result, self.options)
        return result, output

    def _finish_clearing(self, job: Job, clearing: ClearingPlan) -> Output:
        output = list(job.messages)
        for index, text in zip(clearing.indices, clearing.contents):
            message = output[index]
            mark = {"kind": "cleared", "tokens": job.counts[index]}
            output[index] = message.model_copy(
                update={"content": text, "additional_kwargs": {**message.additional_kwargs, SUMMARY_MARK: mark}}
            )
        replaced = [output[i] for i in clearing.indices]
        placeholders = sum(count_messages(replaced, [to_core(m) for m in replaced], self.options))
        result = clearing_result(clearing, job.counts, placeholders)
        logger.info(
            "cleared %d old tool outputs instead of summarizing: %d -> %d tokens",
            result.tool_outputs_cleared,
            result.original_tokens,
            result.compacted_tokens,
        )
        return result, output


def check_wait(wait_seconds: object) -> float:
    """``prepare_wait`` as seconds; refused unless it is a number of seconds."""
    if isinstance(wait_seconds, bool) or not isinstance(wait_seconds, (int, float)) or wait_seconds < 0:
        raise ConfigurationError(
            "prepare_wait", wait_seconds, f"pass seconds (0 or more; {PREPARE_WAIT_SECONDS} by default)"
        )
    return float(wait_seconds)


def preparer_for(compactor: Compactor, wait_seconds: object, lease: object) -> Preparer[PreparedSummary] | None:
    """The adapter's ``Preparer`` when its options prepare ahead (``prepare_at``), else ``None``.

    Raises:
        ConfigurationError: ``wait_seconds`` or ``lease`` is not what it should be.
    """
    seconds = check_wait(wait_seconds)
    if lease is not None and not callable(lease):
        raise ConfigurationError("prepare_lease", lease, "pass a function from a thread id to a lock, or None")
    if compactor.options.prepare_at is None:
        return None

    def prepare(snapshot: list[BaseMessage], base: PreparedSummary | None) -> Flow[PreparedSummary | None]:
        # On top of an earlier preparation when it still applies: its summary
        # is updated with what came since, never redone.
        chained = base is not None and base.matches(snapshot)
        target = base.output_for(snapshot) if base is not None and chained else snapshot
        job = yield blocking(compactor.prepare, target, trigger="force")
        if job is None:
            return None
        result, output = yield from compactor.compaction(job)
        if base is not None and chained:
            result = replace(result, summarizer_calls=base.result.summarizer_calls + result.summarizer_calls)
        known = {id(m) for m in snapshot}
        written = [m for m in output if id(m) not in known]
        tokens = yield blocking(count_messages, written, to_core_list(written), compactor.options)
        logger.info("prepared a summary of %d messages in the background", result.messages_removed)
        return PreparedSummary.of(snapshot, result, output, written_tokens=sum(tokens))

    return Preparer(prepare, wait_seconds=seconds, lease=lease)


def _log(result: CompactionResult, options: CompactionOptions) -> None:
    if result.over_budget:
        # The kept part alone is over the threshold (one huge recent message):
        # nothing more can be summarized without touching what must be kept.
        logger.warning(
            "the compacted context is still over budget: %d tokens > %d (the kept messages alone are too large)",
            result.compacted_tokens,
            options.budget.threshold,
        )
    if result.pinned_over_cap:
        logger.warning(
            "%d pinned exchange(s) were summarized: the pinned messages would pass pinned_max_tokens=%d "
            "(raise it, or pin less)",
            result.pinned_over_cap,
            options.budget.pinned_max,
        )
    logger.info(
        "compacted %d messages into a summary: %d -> %d tokens (cut at %d, %d summarizer call(s)%s)",
        result.messages_removed,
        result.original_tokens,
        result.compacted_tokens,
        result.cut_index,
        result.summarizer_calls,
        ", fallback used" if result.fallback_used else "",
    )


def _listening(config: RunnableConfig | None) -> bool:
    # dispatch_custom_event raises outside a run (a hook called directly, as in
    # a unit test of the hook); there is then no one to tell.
    return get_callback_manager_for_config(ensure_config(config)).parent_run_id is not None


def _to_custom_stream(name: str, data: Any) -> None:
    # Inside a graph, ``stream_mode="custom"`` shows it too.
    try:
        from langgraph.config import get_stream_writer

        writer = get_stream_writer()
    except (ImportError, RuntimeError, KeyError):
        return  # not inside a graph: nobody streams
    writer({name: data})


def tell(name: str, data: Any, config: RunnableConfig | None = None) -> None:
    """Tell whoever listens: the callbacks' custom event ``name``, and a graph's custom stream."""
    _to_custom_stream(name, data)
    if _listening(config):
        dispatch_custom_event(name, data, config=config)


async def atell(name: str, data: Any, config: RunnableConfig | None = None) -> None:
    """The async twin of ``tell``."""
    _to_custom_stream(name, data)
    if _listening(config):
        await adispatch_custom_event(name, data, config=config)


def announce(result: CompactionResult, config: RunnableConfig | None = None) -> None:
    """Tell whoever listens about ``result`` (``COMPACTION_EVENT``)."""
    tell(COMPACTION_EVENT, result.to_dict(), config)


async def aannounce(result: CompactionResult, config: RunnableConfig | None = None) -> None:
    """The async twin of ``announce``."""
    await atell(COMPACTION_EVENT, result.to_dict(), config)


TOO_DEEP = "\x00too deep"
"""What ``parent_node`` says of a subgraph nested more than one level down."""


def parent_node(config: RunnableConfig | None) -> str | None:
    """The parent graph's node that runs this subgraph, one level down; ``TOO_DEEP`` deeper; ``None`` at the top.

    A node's ``checkpoint_ns`` names every enclosing node (``parent:<task>|node:<task>``);
    ``Command(graph=Command.PARENT)`` reaches exactly one level up.
    """
    namespace = str(((config or {}).get("configurable") or {}).get("checkpoint_ns") or "")
    parts = [p for p in namespace.split("|") if p]
    if len(parts) < 2:
        return None
    return parts[-2].split(":", 1)[0] if len(parts) == 2 else TOO_DEEP


def replacement(messages: Sequence[BaseMessage]) -> list[BaseMessage | dict[str, Any]]:
    """The state update that replaces a message list with ``messages`` (an ``add_messages`` list).

    What this library wrote (the summary, the bridge, the removal of the old
    list) goes as plain message dicts, which the ``add_messages`` reducer turns
    back into messages: LangGraph's ``messages`` stream emits every message
    object a node returns that was not in its input, and a chat UI should not
    show a compaction's internals. Kept messages stay the caller's objects
    (they were in the input, so they are not emitted again either).
    """
    remove: dict[str, Any] = {"type": "remove", "id": REMOVE_ALL_MESSAGES, "content": ""}
    return [remove, *(as_dict(m) if is_compaction_message(m) else m for m in messages)]


def _in_run(
    runnable: Runnable[Any, _T], flow: Callable[[RunnableConfig], Flow[_T]], value: Any, config: RunnableConfig | None
) -> _T:
    def run(_value: Any, config: RunnableConfig) -> _T:
        return drive(flow(config))

    # LangChain passes ``config`` to a function that names it (its stubs list
    # only the run-manager forms).
    return runnable._call_with_config(cast("Callable[[Any], _T]", run), value, config)


async def _ain_run(
    runnable: Runnable[Any, _T], flow: Callable[[RunnableConfig], Flow[_T]], value: Any, config: RunnableConfig | None
) -> _T:
    async def run(_value: Any, config: RunnableConfig) -> _T:
        return await adrive(flow(config))

    return await runnable._acall_with_config(cast("Callable[[Any], Awaitable[_T]]", run), value, config)


def in_run(
    runnable: Runnable[Any, _T], flow: Callable[[RunnableConfig], Flow[_T]], value: Any, config: RunnableConfig | None
) -> Call[_T]:
    """A step that runs ``flow(run_config)`` inside a traced run of ``runnable`` (callbacks see it)."""
    return twin(_in_run, _ain_run, runnable, flow, value, config)
