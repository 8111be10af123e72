"""The one turn: check, stage, compact (or apply a prepared compaction), commit, announce.

Every adapter calls ``Turn.run`` once per turn and only reads its inputs and writes its output: the node and
the middleware read the state (and the overhead the request adds), chat memory reads its store; each writes
what it gets back (a state update, a ``Command``, a store rewrite). ``run`` is a flow (``core.effects``): the
same lines drive the sync and the async paths.

1. check: the token cache counts what is new (a cold worker first asks the last reply's reported usage,
   ``due_by_usage``); a summary found mid-history is put back in place (``core.plan.reordered``); what the
   request carries besides the messages is the adapter's count, or what the usage says if more
   (``core.context.sent_besides``: a node does not see its model node's prompt and tools);
2. stage (``core.context.stage``), the one trigger rule: under the preparation mark nothing; past it a
   preparation starts in the background; over the threshold a prepared compaction is applied if one is ready
   (none is waited for while the request still fits the window);
3. compact: planned over what it can remove (``Compactor.planning``; with no room, not at all: ``advice``),
   a cheaper step first (``ClearToolOutputs``), else the cut, the summarizer calls (``core.engine``) and what
   the features add (``finish``);
4. commit: the record is stamped (``core.record``) and each feature's ``commit`` seam runs (the archive
   writes) before anything is written;
5. announce: the result goes to the log, callbacks and the custom stream.

The features are parts (``langchain_compaction.features``): the turn calls, at each seam, the features that
implement it, and knows no feature by name but the three that change its course (prepare ahead,
cache-aligned requests, required sections).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from langchain_core.messages import BaseMessage
from langchain_core.runnables import RunnableConfig

from langchain_compaction._lc.advice import FIXED, NO_ROOM, no_room
from langchain_compaction._lc.compactor import (
    Adapter,
    Compactor,
    Job,
    Output,
    Trigger,
    commit_of,
    leaves,
    log,
    summary_id,
    taken_out,
)
from langchain_compaction._lc.conversation import Conversation
from langchain_compaction._lc.convert import SUMMARY_MARK, message_list
from langchain_compaction._lc.counting import counts_and_core
from langchain_compaction._lc.events import COMPACTION_EVENT, PREPARE_EVENT, atell, in_run, tell
from langchain_compaction.core.context import context_tokens, sent_besides, stage
from langchain_compaction.core.cut import kept_start_fits
from langchain_compaction.core.effects import Call, Flow, twin
from langchain_compaction.core.engine import Summarizer, summarize
from langchain_compaction.core.options import Budget, CompactionOptions
from langchain_compaction.core.record import KEPT_BEFORE_KEY, KEPT_FROM_KEY, LINEAGE_KEY, stamp
from langchain_compaction.core.result import CompactionResult
from langchain_compaction.core.types import Message, Preamble
from langchain_compaction.features import CacheAligned, PrepareAhead
from langchain_compaction.features.prepared import PreparedSummary

__all__ = ["Adapter", "Outcome", "Place", "Trigger", "Turn"]

logger = logging.getLogger("langchain_compaction")


@dataclass(frozen=True, slots=True)
class Place:
    """Where a turn runs: which conversation, its store, and what the request adds besides the messages.

    Attributes:
        conversation: The conversation (``_lc.conversation``).
        store: The graph's LangGraph store, if any.
        config: The run's config (for events and traces).
        overhead: Tokens the request carries besides the messages.
        preamble: What the request carries besides the messages, for a cache-aligned summary.
        guard: Runs the compaction (a flow) under the adapter's condition, as
            a call that returns ``None`` when it may not (chat memory's lease).
        refresh: Reads the conversation again (and counts it), first thing under the guard.
        deferred: Made only when the request would not fit the window, nothing prepared (an agent's model
            call one level down, where a compaction lands mid-history; ``before_model`` does both).
        writes: Whether the adapter will write a compaction that takes out ``removed`` of ``messages``
            (``None``: it writes every one); one it will not serves the request alone and is committed by no
            feature (nothing archived: the compaction the adapter writes later commits those messages).
    """

    conversation: Conversation
    store: Any = None
    config: RunnableConfig | None = None
    overhead: int = 0
    preamble: Preamble | None = None
    guard: Callable[[Flow[Any]], Call[Any]] | None = None
    refresh: Callable[[], Flow[tuple[list[BaseMessage], tuple[list[int], list[Message]]]]] | None = None
    deferred: bool = False
    writes: Callable[[Sequence[BaseMessage], Sequence[int]], bool] | None = None


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a turn did.

    Attributes:
        result: The compaction's figures (``None``: nothing was compacted).
        messages: The list to write (the compacted one, or one whose misplaced summary was put back); ``None``: none.
        source: The conversation it was made from (what the adapter read, or read again under its guard).
    """

    result: CompactionResult | None = None
    messages: list[BaseMessage] | None = None
    source: list[BaseMessage] | None = None


@dataclass(frozen=True, slots=True)
class _Staged:
    """The conversation a turn works on, counted, with any misplaced summary put back; ``read``: as read."""

    messages: list[BaseMessage]
    core: Sequence[Message]
    counts: list[int]
    read: list[BaseMessage]

    @property
    def reordered(self) -> bool:
        return self.messages is not self.read


@dataclass(frozen=True, slots=True)
class _Asked:
    """What the adapter asked of a compaction."""

    place: Place
    trigger: Trigger
    instructions: str
    summarizer: Summarizer | None


@dataclass(frozen=True, slots=True)
class Turn(Compactor):
    """The one turn every adapter runs (see the module docstring); the pieces are ``Compactor``'s."""

    # -- the turn ------------------------------------------------------------------------

    def run(
        self,
        messages: Sequence[BaseMessage],
        place: Place,
        *,
        trigger: Trigger = "auto",
        instructions: str = "",
        summarizer: Summarizer | None = None,
        traced: Any = None,
        counted: tuple[list[int], Sequence[Message]] | None = None,
    ) -> Flow[Outcome]:
        """One turn over ``messages`` (see the module docstring).

        Args:
            messages: The conversation.
            place: Where the turn runs.
            trigger: ``"auto"`` asks the trigger rule; ``"force"`` compacts now.
            instructions: Appended to the summary prompt.
            summarizer: Summarizes instead of the turn's own.
            traced: Run the compaction in a run of its own, with this input
                (a node's state), so traces show it (``None``: no run).
            counted: The messages' counts and core forms, when the adapter keeps them.
        """
        self.refuse(place.store, instructions)
        messages = message_list(messages)
        prepare: PrepareAhead | None = self.feature(PrepareAhead)
        mark = prepare.mark if prepare is not None else None
        if trigger == "auto":
            if self.options.budget.threshold is None:
                return Outcome()
            first = mark if mark is not None else self.options.budget.threshold
            if counted is None and (yield self.cache.quick_check(messages, first, place.conversation.key)) is False:
                return Outcome()  # the provider's reported usage says it fits: nothing else to count
        if counted is None:
            counted = yield self.cache.count(messages, place.conversation.key)
        staged = self._staged(messages, counted)
        besides = sent_besides(staged.core, staged.counts, place.overhead, self.options.budget.window)
        place = replace(place, overhead=besides)
        unchanged = Outcome(messages=staged.messages, source=staged.read) if staged.reordered else Outcome()
        if trigger == "auto" and not (yield from self._due(staged, place, prepare)):
            return unchanged
        ask = _Asked(place, trigger, instructions.strip(), summarizer)

        def compaction(config: RunnableConfig | None) -> Flow[Outcome]:
            return self._compaction(staged, replace(ask, place=replace(place, config=config)))

        if place.guard is not None:
            outcome = yield place.guard(compaction(place.config))
        elif traced is not None:
            outcome = yield in_run(traced, compaction, place.config)
        else:
            outcome = yield from compaction(place.config)
        return outcome if outcome is not None and outcome.messages is not None else unchanged

    def _due(self, staged: _Staged, place: Place, prepare: PrepareAhead | None) -> Flow[bool]:
        """Whether an automatic turn compacts now; past the preparation mark, it starts one in the background."""
        # The mark over what a compaction can remove: a fixed part raises the landing, and the mark with it.
        planned = self.planning(staged.core, staged.counts, place.overhead).budget if prepare is not None else None
        mark = prepare.mark_for(planned) if prepare is not None and planned is not None else None
        where = stage(staged.core, staged.counts, self.options, place.overhead, mark)
        if place.deferred:
            return where == "due" and not self._room(staged, place)
        if where == "prepare" and prepare is not None and planned is not None:
            yield from self._ahead(prepare, staged.messages, staged.counts, place, planned)
        return where == "due"

    def _staged(self, messages: Sequence[BaseMessage], counted: tuple[list[int], Sequence[Message]]) -> _Staged:
        counts, core = counted
        fixed = self._reorder(messages, core, counts)
        if fixed is None:
            read = list(messages)
            return _Staged(read, core, counts, read)
        return _Staged(fixed[0], fixed[1], fixed[2], list(messages))

    def _compaction(self, staged: _Staged, ask: _Asked) -> Flow[Outcome]:
        """The compaction itself: a prepared one applied, or one made now; committed; announced.

        With ``place.refresh`` (chat memory, under its lease) the conversation
        is read again first: another writer may have compacted meanwhile.
        """
        place = ask.place
        if place.refresh is not None:
            messages, counted = yield from place.refresh()
            staged = self._staged(messages, counted)
            due = stage(staged.core, staged.counts, self.options, place.overhead)
            if ask.trigger == "auto" and due != "due":
                return Outcome()
        options = self._planning(staged, ask)
        if options is None:
            return Outcome()
        started = time.monotonic()
        prepare: PrepareAhead | None = self.feature(PrepareAhead)
        output: Output | None = None
        waited = 0.0
        spent = (0, 0)
        if ask.trigger == "auto" and prepare is not None:
            # Nothing is waited for while the request still fits the window:
            # a preparation still running is applied on a later turn.
            room = self._room(staged, place)
            found, waited, spent = yield from prepare.take(
                place.conversation, staged.messages, place.store, wait=not room
            )
            if found is not None:
                output = yield from self._apply(found, staged, place)
            elif room:
                yield from self._ahead(prepare, staged.messages, staged.counts, place, options.budget)
                return Outcome()
        applied = output is not None
        if output is None:
            output = yield from self._now(staged, ask, options)
            if output is None:
                return Outcome()
        result, compacted = output
        self.cache.forget_taken(staged.messages, compacted)  # (no longer counted: their core forms go)
        # What was sent for it, exactly: preparations discarded since the last compaction (their prefix changed) too.
        result = replace(
            result,
            wait_seconds=time.monotonic() - started,
            summarizer_calls=result.summarizer_calls + spent[0],
            summarizer_input_tokens=result.summarizer_input_tokens + spent[1],
        )
        if prepare is not None and ask.trigger == "auto":
            result = result.with_part("prepared", applied=applied, waited=round(waited, 3), discarded_calls=spent[0])
        read = (staged.core, staged.counts)
        result = self.told.standing(place.conversation.key, result, options.budget, place.overhead, read)
        log(result)
        yield twin(tell, atell, COMPACTION_EVENT, result.to_dict(), place.config)
        return Outcome(result, compacted, staged.read)  # what was read: a store compares it with what it holds

    def _planning(self, staged: _Staged, ask: _Asked) -> CompactionOptions | None:
        """The options to plan with (the budget over what a compaction can remove); ``None`` when there is no room.

        Without room above the fixed part (``advice.no_room``) an automatic
        compaction is not made: each would cost a summary call for nothing.
        The conversation is told once, with the figures and the fix.
        """
        place = ask.place
        options = self.planning(staged.core, staged.counts, place.overhead)
        budget = options.budget
        if ask.trigger == "auto" and no_room(budget):
            self.told.once(
                place.conversation.key, NO_ROOM, budget.fixed, budget.threshold, budget.window, budget.reserve
            )
            return None
        if budget.fixed and budget.landing is not None and budget.fixed > (self.options.budget.landing or 0):
            self.told.once(place.conversation.key, FIXED, budget.fixed, budget.threshold, budget.landing, budget.keep)
        return options

    def _now(self, staged: _Staged, ask: _Asked, options: CompactionOptions) -> Flow[Output | None]:
        """A compaction made on the spot: planned, summarized, finished; ``None`` when there is nothing to do."""
        place = ask.place
        job = yield self.work(
            self.plan,
            staged.messages,
            staged.core,
            staged.counts,
            instructions=ask.instructions,
            trigger=ask.trigger,
            overhead=place.overhead,
            preamble=self._preamble(place),
            options=options,
        )
        if job is None:
            return None
        output: Output | None = yield from self._made(job, place, ask.summarizer)
        return output

    def _room(self, staged: _Staged, place: Place) -> bool:
        """Whether the request, over the threshold, still leaves half the reserve for the reply."""
        budget = self.options.budget
        return budget.fits(context_tokens(staged.core, staged.counts, place.overhead, budget.window))

    def _preamble(self, place: Place) -> Preamble | None:
        aligned: CacheAligned | None = self.feature(CacheAligned)
        if aligned is None:
            return None
        return place.preamble if place.preamble is not None else aligned.preamble(place.conversation.key)

    def _made(self, job: Job, place: Place, summarizer: Summarizer | None) -> Flow[Output | None]:
        """The compaction of ``job``: committed first (the archive), then summarized and finished."""
        if job.clearing is not None:
            removed = [i for i in job.clearing.messages if leaves(job.core[i])]
            size = context_tokens(job.core, job.counts, place.overhead, self.options.budget.window)
            parts = yield from self._commit(
                job.messages, job.core, removed=removed, record={}, place=place, size=size, cleared=True
            )
            if parts is None:
                return None
            cleared, output = self._cleared(job, job.clearing)
            return replace(cleared, parts={**cleared.parts, **parts}), output
        assert job.flow is not None
        key = place.conversation.key
        retry = self.tried.get(key)
        removed, placeholders, record = self.record(job, place.conversation.namespace, retry)
        size = context_tokens(job.core, job.counts, place.overhead, self.options.budget.window)
        parts = yield from self._commit(
            job.messages, job.core, removed=removed, record=record, place=place, size=size, cleared_out=placeholders
        )
        if parts is None:
            job.flow.close()
            return None
        if parts:  # archived: a retry after a failed or cancelled summary takes the same id (``stamp``)
            sid = record[LINEAGE_KEY][-1]
            self.tried.put(key, retry if retry is not None and retry[0] == sid else (sid, len(removed)))
        report = yield from summarize(
            job.flow, summarizer or self.summarizer, fallback=self.fallback, timeout=self.options.timeout
        )
        if report.outcome.failure is not None:
            if self.seam("commit"):
                # What the features committed (the archive) is the whole region's.
                raise report.outcome.failure
            job = self.narrowed(job, report)
            removed, _, record = self.record(job, place.conversation.namespace)
        # Finishing counts what was written, with the user's counter if any:
        # off the event loop on the async path.
        result, output = yield self.work(self.finish, job, report, record)
        self.tried.pop(key)
        return replace(result, parts={**result.parts, **parts}), output

    def _commit(
        self,
        messages: Sequence[BaseMessage],
        core: Sequence[Message],
        *,
        removed: Sequence[int],
        record: dict[str, Any],
        place: Place,
        size: int,
        cleared: bool = False,
        cleared_out: Sequence[int] = (),
    ) -> Flow[dict[str, dict[str, Any]] | None]:
        """Each feature's ``commit`` seam, in order; their figures, or ``None`` when the compaction is held back.

        A feature that holds the compaction back (an archive that could not write, with ``on_error="warn"``) is obeyed
        while the context still fits the window with half the reserve to spare: no summary is paid for, and the next
        turn tries again. Past that the compaction goes ahead, and the log says how many messages only the summary
        keeps.
        """
        committers = self.seam("commit")
        figures: dict[str, dict[str, Any]] = {}
        if not committers:
            return figures
        if place.writes is not None and not place.writes(messages, removed):
            return {feature.name: {"request_only": True} for feature in committers}
        mark = {**record, "cleared": True} if cleared else record
        commit = commit_of(
            messages, core, removed, mark=mark, conversation=place.conversation, store=place.store, cleared=cleared_out
        )
        budget = self.options.budget
        for feature in committers:
            got = yield from feature.commit(commit)
            if got is not None:
                figures[feature.name] = dict(got)
                continue
            if budget.fits(size):
                logger.warning(
                    "%s held the compaction back this turn (it fits the window still)", type(feature).__name__
                )
                return None
            logger.warning(
                "%s could not take the %d message(s) this compaction removes and the context no longer fits the "
                "window: compacting anyway, they are kept only in the summary",
                type(feature).__name__,
                len(commit.removed),
            )
            figures[feature.name] = {"skipped": True}
        return figures

    # -- planning and finishing ------------------------------------------------------------------

    def _ahead(
        self, prepare: PrepareAhead, messages: Sequence[BaseMessage], counts: list[int], place: Place, budget: Budget
    ) -> Flow[None]:
        """Past the preparation mark: start preparing the next compaction in the background.

        The compaction is planned to land when it is applied, at the threshold: the messages that come in meanwhile stay
        verbatim after it, so it keeps fewer of today's (the keep budget less the room still left before the threshold;
        a quarter of it at least). A finished preparation is built on by a new one only when, applied at the threshold,
        it would leave the context above halfway from the landing to the threshold (the agent went on faster than
        planned): one summary call per compaction, about. ``budget`` is the one a compaction plans with (over its fixed
        part).
        """
        conversation = place.conversation
        assert budget.threshold is not None  # preparing needs a window
        assert budget.landing is not None
        size = sum(counts) + place.overhead
        base = prepare.finished(conversation, messages)
        ceiling = (budget.landing + budget.threshold) // 2
        if base is not None and base.tokens_for(counts) + place.overhead + max(budget.threshold - size, 0) <= ceiling:
            return
        keep = max(budget.keep - max(budget.threshold - size, 0), budget.keep // 4, 1)
        compact = functools.partial(self.prepared_of, keep=keep)
        started = yield from prepare.ahead(compact, conversation, messages, base, place.store)
        if started:
            logger.info("the context passed the preparation mark: preparing the next summary in the background")
            data = {"thread": conversation.thread or "", "messages": len(messages)}
            yield twin(tell, atell, PREPARE_EVENT, data, place.config)

    def _apply(self, prepared: PreparedSummary, staged: _Staged, place: Place) -> Flow[Output | None]:
        """``prepared`` applied to the staged conversation, stamped with the conversation's record as it is now.

        What came after the messages it was made from stays verbatim after it: no summary call is made on this turn
        (if the agent went on faster, the next turns prepare again). ``None`` (made on the spot) where the request would
        not fit the window with half the reserve: a tool output too large for it came since, summarized then.
        """
        messages, core = staged.messages, staged.core
        combined = prepared.output_for(messages)
        counts, _ = yield self.work(counts_and_core, combined, self.options)
        if not self.options.budget.fits(sum(counts) + place.overhead):
            return None  # (past the threshold only while half the reserve fits: ``Budget.fits``)
        result = replace(prepared.result, compacted_tokens=sum(counts))  # (where that leaves the request: the turn's)
        where = {id(m): i for i, m in enumerate(messages)}
        kept = [where[id(m)] for m in combined if id(m) in where]
        removed, cleared = taken_out(core, kept)
        summary_at = next(i for i, m in enumerate(combined) if id(m) not in where)
        first_kept = next((where[id(m)] for m in combined[summary_at + 1 :] if id(m) in where), len(core))
        # Prepared mid-loop, it may have taken a thinking loop whole, and the replies since would open it.
        if not kept_start_fits(core, first_kept):
            return None  # compacted on the spot instead
        summary = combined[summary_at]
        # (A try on the spot whose summary failed archived what this takes out first: its id is kept.)
        key = place.conversation.key
        # It keeps what came after its base too: the first of that is the first it kept. What it wrote
        # back from before its cut (a pin, one it took out messages after) keeps its own position.
        last = max(removed, default=-1)
        after = [where[id(m)] for m in combined[summary_at + 1 :] if id(m) in where]
        first_id = next((messages[i].id for i in after if i > last), None)
        back = [messages[i].id for i in after if i < last and messages[i].id]
        mark = {**summary.additional_kwargs[SUMMARY_MARK], KEPT_FROM_KEY: first_id, KEPT_BEFORE_KEY: back}
        record = stamp(core, kept, removed, mark, place.conversation.namespace, retry=self.tried.get(key))
        parts = yield from self._commit(
            messages, core, removed=removed, record=record, place=place, size=sum(counts), cleared_out=cleared
        )
        if parts is None:
            return None
        self.tried.pop(key)
        combined[summary_at] = summary.model_copy(
            update={"id": summary_id(record), "additional_kwargs": {**summary.additional_kwargs, SUMMARY_MARK: record}}
        )
        # The cut: the first message the summary kept after what it covers.
        kept_from = record.get(KEPT_FROM_KEY)
        cut = next((i for i, m in enumerate(messages) if kept_from is not None and m.id == kept_from), len(messages))
        return (
            replace(
                result,
                original_tokens=sum(staged.counts),  # counted when the turn staged it
                messages_removed=len(messages) - len(kept),
                cut_index=cut,
                messages_kept=len(kept),
                parts={**result.parts, **parts},
            ),
            combined,
        )
