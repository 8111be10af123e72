"""``CompactionMiddleware``: compaction for LangChain v1 ``create_agent`` agents.

Install with ``pip install "langchain-compaction[agents]"``; importing this
module without ``langchain`` raises an ``ImportError`` that says so.

Why two hooks. The trigger must count what the model is really sent: the
state's messages *and* the request's system prompt and tool schemas (a large
tool set easily costs thousands of tokens, and LangChain's own
``SummarizationMiddleware`` leaves both out). ``before_model`` only sees the
state; ``wrap_model_call`` sees the ``ModelRequest`` (system message, tools,
messages) as it goes to the model. So:

* ``wrap_model_call`` measures the request's system prompt and tool schemas and
  records that overhead in the thread's state (a private key,
  ``compaction_overhead_tokens``, written only when it changes). It then checks
  the request as sent; if it is over budget (the first call of a thread, before
  any overhead was recorded, or after the tools or prompt grew), it compacts
  there, calls the model with ``request.override(messages=...)``, and persists
  the shrink by returning an ``ExtendedModelResponse`` whose ``Command``
  replaces the state's messages (``RemoveMessage(id=REMOVE_ALL_MESSAGES)``, the
  compacted list, then the model's reply).
* ``before_model`` is where compaction normally happens: it counts the state's
  messages plus the recorded overhead and, when over budget, returns
  ``{"messages": [RemoveMessage(id=REMOVE_ALL_MESSAGES), *compacted]}``, the
  same update LangChain's middleware returns; nothing when under budget.
* Overflow recovery lives in ``wrap_model_call`` too, because only it sees the
  model call fail: on ``ContextOverflowError`` (ChatAnthropic maps "prompt is
  too long" to it), or another error that says so (``_lc.overflow``), it
  compacts (to the window the error states, when none was known; else with a
  forced cut), retries once and persists the result as above. A second overflow propagates, and the state is unchanged.

Compacting only in ``wrap_model_call`` would also count exactly, but every
compaction would then be a side effect of the model node; recording the
overhead keeps the ordinary case a plain state update made before the model
node runs, visible as its own step, and the exact check in ``wrap_model_call``
only has to act when the record is missing or stale.

When ``wrap_model_call`` persists a compaction, the kept messages are written
back as the *state's* objects (matched by id), so a transient edit another
middleware made to the request (``ContextEditingMiddleware`` clearing tool
outputs, say) is not written into the state.

Cost per turn. Token counts are cached per message (``TokenCountCache``, the
same cache the LangGraph node uses: keyed by message id, checked by a content
hash), so a turn that adds k messages estimates k messages and only hashes the
rest. Tool schemas are estimated once per tool, the system prompt once per
``SystemMessage`` object.

Every hook is a line over one flow (``core.effects``): a generator that yields
each step (count, prepare, summarize, call the model) in its sync and async
form, driven by ``drive`` or ``adrive``. The compaction itself is the shared
turn's (``_lc.turn.Turn``, over ``_lc.compactor.Compactor``): there is no compaction logic here.

Put ``CompactionMiddleware`` last in ``middleware=[...]``: it is then the
innermost ``wrap_model_call``, so it sees the system prompt and tools that
other middleware set, and it recovers from an overflow before a model-fallback
middleware would switch models. (The ``Command`` of a compaction made in the
model call is applied after the model node's update and carries the reply as
this middleware got it: a reply an outer ``wrap_model_call`` rewrote is replaced
by the model's own on that call; the README says where to edit replies instead.)
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Annotated, Any, TypeAlias, cast

from typing_extensions import NotRequired

try:
    from langchain.agents.middleware.types import (
        AgentMiddleware,
        AgentState,
        ExtendedModelResponse,
        ModelRequest,
        ModelResponse,
        OmitFromSchema,
    )
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    msg = (
        "CompactionMiddleware needs LangChain v1 agents (langchain>=1.0, for "
        'create_agent middleware); install them with: pip install "langchain-compaction[agents]"'
    )
    raise ImportError(msg) from exc

from langchain_core.messages import AIMessage, AnyMessage, BaseMessage
from langgraph.runtime import Runtime
from langgraph.types import Command

from langchain_compaction._lc.conversation import Delivery, Nesting, conversation_of, namespace_of
from langchain_compaction._lc.convert import to_core, to_core_list
from langchain_compaction._lc.counting import DEFAULT_CACHE_SIZE, count_messages, counting
from langchain_compaction._lc.events import COMPACTION_EVENT, replacement
from langchain_compaction._lc.legacy import adapter_keywords
from langchain_compaction._lc.overflow import overflowed, stated_limit
from langchain_compaction._lc.overhead import added_messages, held_as_sent, sent_tools
from langchain_compaction._lc.runconfig import current, run_config
from langchain_compaction._lc.schemas import ToolSchemas
from langchain_compaction._lc.turn import Adapter, Outcome, Place, Trigger, Turn
from langchain_compaction.core.effects import Flow, adrive, drive, twin, user_call
from langchain_compaction.core.options import CompactionOptions
from langchain_compaction.core.result import CompactionResult
from langchain_compaction.core.types import Preamble
from langchain_compaction.errors import ConfigurationError
from langchain_compaction.features import Archive, CacheAligned, Feature
from langchain_compaction.features.recall import recall_tool

__all__ = ["COMPACTION_EVENT", "OVERHEAD_KEY", "CompactionAgentState", "CompactionMiddleware"]

logger = logging.getLogger("langchain_compaction")


OVERHEAD_KEY = "compaction_overhead_tokens"
"""Private state key: tokens of the system prompt and tool schemas last sent."""


class CompactionAgentState(AgentState[Any]):
    """The agent state ``CompactionMiddleware`` adds to ``create_agent``'s.

    Only plain data goes in: an int, so it round-trips through any checkpointer.
    """

    compaction_overhead_tokens: NotRequired[Annotated[int, OmitFromSchema(input=True, output=True)]]
    """Tokens of the system prompt and tool schemas of the last model request."""


_OBSERVER_FIX = "pass a plain function, or run the agent with ainvoke / astream, where it is awaited"

_CallResult: TypeAlias = "ModelResponse[Any] | AIMessage | ExtendedModelResponse[Any]"


class CompactionMiddleware(AgentMiddleware[CompactionAgentState, Any, Any], Adapter):
    """Keeps a ``create_agent`` conversation inside the model's context window.

    Before each model call, when the conversation plus the request's system
    prompt and tool schemas exceed ``context_window - reserve_tokens``, the
    older messages are summarized into a structured checkpoint (a system
    message) and the most recent ``keep_recent_tokens`` are kept verbatim,
    never separating a tool call from its results. The state's messages are
    replaced, so the checkpointed thread really shrinks. When the model still
    rejects the request as too long (``ContextOverflowError``, or an error of
    another class that says so, as langchain-openai's may), the middleware
    compacts and retries once (with a forced cut when no window is known).

    Without ``context_window`` (0, unknown) it reads the window from the agent
    model's profile (``model.profile["max_input_tokens"]``: 200,000 for current
    Claude models) at its first call, and every unset budget follows from it.
    When neither is known it says so once (a warning on the
    ``langchain_compaction`` logger) and compacts only to recover from an
    overflow; an overflow error that states the window (Anthropic's "N tokens
    > M maximum", OpenAI's "maximum context length is M") teaches it that
    window, for the retry and for the turns after it.

    Args:
        model: What writes the summaries: a chat model (e.g. a small, cheap
            one), a Runnable, a function from prompt text to summary text, or
            a summarizer such as ``ExtractiveSummarizer()`` (offline).
        options: Budgets and prompts; ``context_window`` should be the agent
            model's window.
        fallback: A summarizer used when ``model`` fails; the result then says
            ``fallback_used=True``. Without it a failed summary raises
            ``SummarizationError`` and the state is left unchanged.
        custom_instructions: Appended to every summary prompt, e.g.
            ``"keep the API design decisions"``.
        on_compaction: Called with each ``CompactionResult`` (an observer:
            an error it raises is logged, and the compaction goes ahead); an
            ``async`` one is awaited under ``ainvoke``/``astream`` and refused
            (``ConfigurationError``) under ``invoke``/``stream``. Every compaction
            is also dispatched as the custom event ``COMPACTION_EVENT`` (its
            ``CompactionRecord``) and logged at INFO.
        cache_size: How many per-message token counts to keep.
        nested: For an agent added as a node of a parent graph that shares its
            message list: ``"parent"`` (the default) writes a compaction made
            before a model call to the parent as well (``Command.PARENT``),
            which runs the agent again on the compacted list, so the parent
            shrinks too; ``"own"`` writes to the agent's state only.
        features: The features (``langchain_compaction.features``): checked
            facts and pins by default; with ``Archive()`` every message a
            compaction removes goes to the agent's LangGraph store
            (``create_agent(store=...)``) and the middleware registers the
            ``recall_messages`` tool that reads it back; ``PrepareAhead(at=0.7)``
            prepares the next summary in the background; ``CacheAligned()``
            sends the summarizer the agent's own prefix, system prompt and
            tools included.
        **deprecated: The 0.2 keywords ``prepare_wait``, ``prepare_in_store``,
            ``prepare_lease`` and ``archive`` (see ``_lc.legacy``).

    Raises:
        ConfigurationError: An argument is invalid.

    Example:
        >>> from langchain.agents import create_agent
        >>> from langchain_core.language_models import FakeListChatModel
        >>> from langchain_compaction import CompactionOptions
        >>> middleware = CompactionMiddleware(
        ...     lambda prompt: "## Goal\\n- answer the user",
        ...     CompactionOptions(context_window=200_000),
        ... )
        >>> agent = create_agent(FakeListChatModel(responses=["hi"]), middleware=[middleware])
        >>> agent.invoke({"messages": [("user", "hello")]})["messages"][-1].content
        'hi'
    """

    state_schema = CompactionAgentState

    def __init__(
        self,
        model: Any,
        options: CompactionOptions | None = None,
        *,
        fallback: Any = None,
        custom_instructions: str = "",
        on_compaction: Callable[[CompactionResult], object] | None = None,
        cache_size: int = DEFAULT_CACHE_SIZE,
        nested: Nesting = "parent",
        features: Sequence[Feature] | None = None,
        **deprecated: Any,
    ) -> None:
        super().__init__()
        if not isinstance(custom_instructions, str):
            raise ConfigurationError("custom_instructions", custom_instructions, "pass a string ('' for none)")
        if on_compaction is not None and not callable(on_compaction):
            raise ConfigurationError("on_compaction", on_compaction, "pass a function of one CompactionResult, or None")
        legacy = adapter_keywords("CompactionMiddleware", deprecated)
        self._turn = Turn.build(model, options, fallback, features, adapter=legacy, cache_size=cache_size)
        archived: Archive | None = self._turn.feature(Archive)
        # With the archive on, the agent gets the tool that reads it back.
        redact = self._turn.options.redact
        self.tools = [] if archived is None else [recall_tool(archived, redact=redact)]
        self._instructions = custom_instructions
        self._on_compaction = on_compaction
        self._tool_tokens = ToolSchemas()
        self._window_checked = self._turn.options.context_window > 0
        self._model_checked = False
        self._delivery = Delivery(nested, "CompactionMiddleware")
        self._system_tokens: tuple[BaseMessage, int] | None = None

    # -- hooks: one line each over the shared flows ---------------------------

    # A hook may also return a Command (create_agent's node applies it as a
    # node's return value); the base class declares only the dict.
    def before_model(  # type: ignore[override]
        self, state: CompactionAgentState, runtime: Runtime[Any]
    ) -> dict[str, Any] | Command[Any] | None:
        """Compact the state's messages when they and the recorded overhead are over budget."""
        return drive(self._state_flow(state, runtime))

    async def abefore_model(  # type: ignore[override]
        self, state: CompactionAgentState, runtime: Runtime[Any]
    ) -> dict[str, Any] | Command[Any] | None:
        """The async twin of ``before_model``."""
        with current(run_config(runtime)):  # (Python 3.10: LangGraph could not make it current)
            return await adrive(self._state_flow(state, runtime))

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> _CallResult:
        """Check the request as sent, record its overhead, recover from an overflow once."""
        return drive(self._call_flow(request, handler))

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> _CallResult:
        """The async twin of ``wrap_model_call``."""
        with current(run_config(getattr(request, "runtime", None))):
            return await adrive(self._call_flow(request, handler))

    # -- the flows ----------------------------------------------------------------

    def _compaction(
        self, messages: Sequence[BaseMessage], place: Place, trigger: Trigger
    ) -> Flow[list[BaseMessage] | None]:
        """One turn over ``messages``; the list to write (compacted, or a summary put back), or ``None``."""
        outcome: Outcome = yield from self._turn.run(messages, place, trigger=trigger, instructions=self._instructions)
        if outcome.result is not None and self._on_compaction is not None:
            # An observer, as LangChain's callback handlers are: its error is
            # logged, and the compaction (paid for) still goes ahead. An async
            # one on the sync path is refused: its body could never run.
            try:
                yield user_call(self._on_compaction, outcome.result, field="on_compaction", fix=_OBSERVER_FIX)
            except ConfigurationError:
                raise
            except Exception:
                logger.exception("on_compaction raised; the compaction goes ahead")
        return outcome.messages

    def _state_flow(self, state: Mapping[str, Any], runtime: Any = None) -> Flow[dict[str, Any] | Command[Any] | None]:
        messages: list[BaseMessage] = state.get("messages") or []
        config = run_config()
        own, conversation, parent = yield from self._delivery.conversation(config, messages)
        self._delivery.too_deep(config)  # said on the first turn at that depth, before any compaction
        place = Place(conversation, getattr(runtime, "store", None), config, state.get(OVERHEAD_KEY) or 0)
        compacted = yield from self._compaction(messages, place, "auto")
        if compacted is None:
            return None
        update = {"messages": replacement(compacted)}
        # An agent added as a node of a parent graph that shares its messages:
        # its state goes back merged by id, so write to the parent, which runs
        # the agent again on the compacted list (see CompactionNode(nested=...)).
        if parent is not None:
            sent = (own, compacted)
            command = yield from self._delivery.to_parent(
                config, update, state, parent, sent=sent, held=messages, own=(OVERHEAD_KEY,)
            )
            if command is not None:
                return command
        self._delivery.stayed(config)  # (here too where the parent's state it was given is not known)
        return update

    def _check_model(self, model: object) -> None:
        """Say once what of the agent's model defeats compaction."""
        if self._model_checked:
            return
        self._model_checked = True
        if getattr(getattr(model, "bound", model), "use_previous_response_id", False) is True:
            logger.warning(
                "CompactionMiddleware: the model sends previous_response_id (ChatOpenAI(use_previous_response_id="
                "True)): OpenAI then reads its own stored copy of the conversation up to the last kept reply, not "
                "the summary, so compaction shrinks nothing it reads; turn use_previous_response_id off"
            )

    def _learn_window(self, model: object) -> None:
        """Take the window from the agent model's profile when the options give none (once)."""
        if self._window_checked:
            return
        self._window_checked = True
        profile = getattr(model, "profile", None)
        window = profile.get("max_input_tokens") if isinstance(profile, Mapping) else None
        if isinstance(window, int) and not isinstance(window, bool) and window > 0:
            # One object holds the options, the features bound to them and the
            # caches: replaced whole, so nothing keeps the old window.
            try:
                self._turn = self._turn.with_window(window)
            except ConfigurationError as refused:
                logger.warning(
                    "CompactionMiddleware: the model's profile states a window of %d tokens, which the options do "
                    "not fit, so nothing is compacted ahead of time: %s",
                    window,
                    refused,
                )
                return
            logger.info("CompactionMiddleware: context window %d tokens, from the model's profile", window)
            return
        logger.warning(
            "CompactionMiddleware: no context_window was given and the model (%s) has no max_input_tokens in its "
            "profile, so nothing is compacted ahead of time until a 'prompt is too long' error states the window; "
            "pass CompactionOptions(context_window=...)",
            type(model).__name__,
        )

    def _learn_limit(self, error: Exception) -> None:
        """With no window known, take the one the provider's error states, so the retry is made to fit it."""
        if self._turn.options.context_window > 0:
            return
        limit = stated_limit(str(error))
        if limit is None:
            return
        try:
            turn = self._turn.with_window(limit)
        except ConfigurationError as refused:
            # The options do not fit the stated window (a keep_recent_tokens over
            # it): the retry goes on with a forced cut, as with no window stated.
            logger.warning("CompactionMiddleware: the provider's window of %d tokens does not fit: %s", limit, refused)
            return
        self._turn = turn
        logger.info("CompactionMiddleware: context window %d tokens, from the provider's error", limit)

    def _call_flow(self, request: ModelRequest[Any], handler: Callable[..., Any]) -> Flow[_CallResult]:
        self._check_model(request.model)
        self._learn_window(request.model)
        overhead, beside = yield counting(self.options, self._overhead, request)  # the system prompt and tools
        system = () if request.system_message is None else (request.system_message,)
        messages: list[BaseMessage] = list(request.messages)
        config = run_config()
        # A compaction made here is written to this graph's own state (a model
        # call cannot command the parent graph), but filed with the parent's.
        conversation = self._delivery.filed_under(conversation_of(config, messages))
        preamble = Preamble(system, sent_tools(request), overhead)
        aligned: CacheAligned | None = self._turn.feature(CacheAligned)
        if aligned is not None:
            aligned.remember(conversation.key, preamble)
        # One level down under nested="parent", what is made here lands
        # mid-history in the parent: only a request that would not fit is
        # compacted here; the next before_model compacts where it can write.
        deferred = self._delivery.nested == "parent" and bool(namespace_of(config))
        place = Place(
            conversation,
            getattr(getattr(request, "runtime", None), "store", None),
            config,
            overhead,
            preamble,
            deferred=deferred,
            writes=self._writes(request),
        )
        compacted = yield from self._compaction(messages, place, "auto")
        try:
            response = yield twin(handler, handler, self._with_messages(request, compacted))
        except Exception as error:
            if not overflowed(error):
                raise
            logger.warning("the model rejected the context as too long (%s); compacting and retrying once", error)
            self._learn_limit(error)
            compacted = yield from self._compaction(compacted or messages, place, "overflow")
            if compacted is None:
                raise  # nothing left to summarize: the overflow stands
            # A second overflow is thrown in here and propagates.
            response = yield twin(handler, handler, self._with_messages(request, compacted))
        if compacted is not None and deferred:
            self._delivery.unreachable("during the model call")
        return self._response(request, response, compacted, beside)

    @staticmethod
    def _writes(request: ModelRequest[Any]) -> Callable[[Sequence[BaseMessage], Sequence[int]], bool]:
        """Whether ``_response`` writes a compaction of ``request`` that takes out ``removed`` of ``messages``.

        One it will not write (see ``_response``) serves this call alone: the turn archives none of it, and the
        compaction ``before_model`` makes of the state on the next call archives those messages, once.
        """
        held = list(request.state.get("messages") or [])

        def writes(messages: Sequence[BaseMessage], removed: Sequence[int]) -> bool:
            out = set(removed)
            return held_as_sent(request.messages, held, [m for i, m in enumerate(messages) if i not in out])

        return writes

    @staticmethod
    def _with_messages(request: ModelRequest[Any], messages: list[BaseMessage] | None) -> ModelRequest[Any]:
        if messages is None:
            return request
        # Inner middleware see the compacted conversation in both places.
        sent = cast("list[AnyMessage]", messages)
        return request.override(messages=sent, state=cast("Any", {**request.state, "messages": sent}))

    def _response(
        self,
        request: ModelRequest[Any],
        response: ModelResponse[Any],
        compacted: list[BaseMessage] | None,
        overhead: int,
    ) -> ModelResponse[Any] | ExtendedModelResponse[Any]:
        update: dict[str, Any] = {}
        state_messages = list(request.state.get("messages") or [])
        if compacted is not None and held_as_sent(request.messages, state_messages, compacted):
            # Write back the state's own objects: a transient edit that an
            # outer middleware made to a message stays out of the state. A
            # message the compaction itself rewrote (a cleared tool output) is
            # a new object, not one of the request's: it is written as is.
            # When the request is not the state's list (an outer middleware
            # added or left out messages), nothing is written: before_model
            # compacts the state itself on the next call, the overhead being
            # recorded now. So is a list an outer middleware edited for this call
            # (ContextEditingMiddleware's cleared tool outputs): its summary
            # was made from the edits, and the state's originals must not go.
            by_id = {m.id: m for m in state_messages}
            sent = {id(m) for m in request.messages}
            kept = [by_id.get(m.id, m) if m.id and id(m) in sent else m for m in compacted]
            # The model node first adds the reply; this update then replaces
            # the whole list, so the reply goes last again.
            update["messages"] = [*replacement(kept), *response.result]
        if request.state.get(OVERHEAD_KEY) != overhead:
            update[OVERHEAD_KEY] = overhead
        if not update:
            return response
        return ExtendedModelResponse(model_response=response, command=Command(update=update))

    def _overhead(self, request: ModelRequest[Any]) -> tuple[int, int]:
        """Tokens of the request's system prompt and tools, and of those plus the messages the state does not hold.

        A message an outer middleware adds for the call only (retrieved context)
        is paid on every call: ``before_model`` leaves room for it in the state
        (the second figure is what it records).
        """
        system = request.system_message
        total = 0
        if system is not None:
            # It has no id, so the id-keyed cache would count it on every call
            # (a custom token_counter may be slow); create_agent passes the same
            # object each time, and a dynamic prompt is a new object.
            last = self._system_tokens
            if last is not None and last[0] is system:
                total += last[1]
            else:
                tokens = count_messages([system], [to_core(system)], self.options)[0]
                self._system_tokens = (system, tokens)
                total += tokens
        total += self._tool_tokens.tokens(sent_tools(request))
        added = added_messages(request.messages, request.state.get("messages") or [])
        return total, total + (sum(count_messages(added, to_core_list(added), self.options)) if added else 0)
