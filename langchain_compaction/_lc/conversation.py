"""Which conversation a run belongs to, what a process may remember of it, and where its compaction goes.

A conversation is a thread and the graph inside it whose state holds the
messages: ``(thread_id, namespace)``, the namespace being the run's
``checkpoint_ns`` without the running node's own segment and without task ids
(LangGraph's rule for a namespace that names the same graph on every run).
Two sub-agents of one thread are two conversations; the same graph on the
next turn, on another worker or after a restart is the same one. A run
without a thread id (a graph with no checkpointer, ``compact()``) is keyed by
its first messages instead.

Everything a process remembers about a conversation (a prepared summary, the
request preamble of the last model call, whether its parent graph can be
written) is a ``Bounded`` cache entry under that key: at most a fixed number
of conversations, the least recently used dropped first, and always checked
against the conversation's record (``core.record``) before use.
"""

from __future__ import annotations

import hashlib
import logging
import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from langchain_core.messages import BaseMessage
from langgraph.types import Command

from langchain_compaction._lc.counting import LAST_CALLS_REMEMBERED
from langchain_compaction._lc.events import in_place
from langchain_compaction._lc.handed import AGENT_JUMP, Handed, leads
from langchain_compaction._lc.identity import canonical, content_size, prefix_digest
from langchain_compaction._lc.levels import IN_TASK, TOO_DEEP, parent_node, recast
from langchain_compaction._lc.steps import (
    CONFIG_KEY_DURABILITY,
    beside,
    configurable_of,
    parent_checkpoint,
    pulled,
    runs_beside_others,
    thread_of,
)
from langchain_compaction.core.bounded import Bounded
from langchain_compaction.core.effects import Flow
from langchain_compaction.errors import ConfigurationError

logger = logging.getLogger("langchain_compaction")

_V = TypeVar("_V")

CONVERSATIONS_REMEMBERED = 1024
"""How many conversations a process keeps in-memory state for (per adapter and kind), by default."""


def thread_label(thread_id: object) -> str:
    """A thread id (or namespace part) as a store namespace label.

    Labels cannot contain ``.`` or be empty, and some stores reject control
    characters, so ``%``, ``.`` and every control character are percent-encoded:
    the encoding is one to one, and ``"user.123"`` becomes ``"user%2E123"``.

    Example:
        >>> thread_label("user.123"), thread_label("50%.x"), thread_label("a\\x00b"), thread_label(0)
        ('user%2E123', '50%25%2Ex', 'a%00b', '0')
    """
    text = str(thread_id)
    out = "".join(f"%{ord(c):02X}" if c in "%." or ord(c) < 0x20 or ord(c) == 0x7F else c for c in text)
    return out or "%"


@dataclass(frozen=True, slots=True)
class Conversation:
    """Which conversation a run works on.

    Attributes:
        thread: The thread id (``None``: the run has none).
        namespace: The graphs, outermost first, between the thread's root and
            the graph whose state holds the messages (empty at the top).
        prefix: With no thread, a digest of the conversation's first messages.
    """

    thread: str | None
    namespace: tuple[str, ...] = ()
    prefix: str = ""

    @property
    def key(self) -> tuple[str, ...]:
        """What in-process caches key this conversation by."""
        if self.thread is None:
            return ("", self.prefix, *self.namespace)
        return ("thread", self.thread, *self.namespace)

    def labels(self) -> tuple[str, ...]:
        """The store namespace labels after a feature's prefix (a top-level graph: just the thread)."""
        assert self.thread is not None
        return (thread_label(self.thread), *(thread_label(p) for p in self.namespace))

    def up(self) -> Conversation:
        """The parent graph's conversation (one level up)."""
        return Conversation(self.thread, self.namespace[:-1], self.prefix)


def _task(config: Any) -> str:
    """Which parent task runs this subgraph: the run's namespace with task ids, less the node's (the caches' key).

    Every node call of one subgraph run has a namespace of its own (the
    agent's model calls of one turn, each ``before_model`` a task), and they
    share their parent's task and its checkpoint.
    """
    return str(configurable_of(config).get("checkpoint_ns") or "").rpartition("|")[0]


def namespace_of(config: Any) -> tuple[str, ...]:
    """The graphs around the running node, outermost first, without task ids (see the module docstring)."""
    raw = str(configurable_of(config).get("checkpoint_ns") or "")
    parts = [recast(p) for p in raw.split("|") if p and not p.isdigit()]
    return tuple(parts[:-1])


def conversation_of(config: Any, messages: Sequence[BaseMessage] = ()) -> Conversation:
    """The conversation a run's ``config`` works on (keyed by ``messages``' start when it has no thread)."""
    thread = thread_of(config)
    if thread is not None:
        return Conversation(thread, namespace_of(config))
    return Conversation(None, namespace_of(config), opening(messages))


def opening_length(messages: Sequence[BaseMessage]) -> int:
    """How many messages ``opening`` reads: the leading system messages and the two after them."""
    lead = 0
    while lead < len(messages) and getattr(messages[lead], "type", None) == "system":
        lead += 1
    return min(lead + 2, len(messages))


def opening(messages: Sequence[BaseMessage]) -> str:
    """A digest of how a conversation opens: its leading system messages and the two messages after them.

    Each is taken by its type, id and content: a key for what a process
    remembers (checked against the record before use), made on every turn of
    a run without a thread, so it does not read a summary's whole mark as
    ``fingerprint`` does (a summary's id is new with each compaction). The
    same message objects, their contents the same size (``content_size``, as
    the token cache tells an edit), give the digest made last time: a turn
    does not hash a long summary again.
    """
    head = tuple(messages[: opening_length(messages)])
    sizes = tuple(map(content_size, head))
    ids = tuple(map(id, head))
    known = _OPENINGS.get(ids)
    # (The entry holds the objects, so their ids cannot be reused meanwhile.)
    if known is not None and known[1] == sizes and all(map(operator.is_, known[0], head)):
        return known[2]
    digest = hashlib.blake2b(digest_size=12)
    for message in head:
        content = message.content
        body = content if type(content) is str else canonical(content)
        digest.update(f"{message.type}\x00{message.id}\x00{len(body)}\x00".encode("utf-8", "surrogatepass"))
        digest.update(body.encode("utf-8", "surrogatepass"))
    value = digest.hexdigest()
    _OPENINGS.put(ids, (head, sizes, value))
    return value


_OPENINGS: Bounded[tuple[tuple[BaseMessage, ...], tuple[int, ...], str]] = Bounded(LAST_CALLS_REMEMBERED)
"""The openings digested last (as many as the token cache remembers conversations), by their messages' ids."""


# -- where a compaction is written ----------------------------------------------------------


CONFIG_KEY_SEND = "__pregel_send"
"""Where LangGraph gives every task of a run its writer (no public name for it): set only inside a graph run."""


Nesting = Literal["parent", "own"]
"""Where an adapter in a subgraph writes a compaction: the parent's state (one level up), or its own."""

_GIVEN_UNKNOWN = (
    "it could not read again the parent's state this run was given when it compacted: the parent's checkpoint its "
    "step started from is gone (a thread's checkpoints deleted or pruned while it ran), could not be read (the "
    "saver's error is logged), or was never written (durability='exit') while the parent's last one no longer "
    "leads the subgraph's messages. It wrote "
    "that compaction to its own state, so what the run wrote reaches the parent with the subgraph's output, the "
    "summary after the parent's history there until a later turn puts it back in place; run the graph with "
    "durability 'async' (the default) or 'sync', and delete or prune a thread's checkpoints only between its runs"
)
"""Said once where ``Delivery._given`` cannot tell what the parent gave the run (the compaction stays below)."""


class Delivery:
    """Where an adapter in a subgraph writes its compaction: the parent's state, or its own.

    A subgraph's state goes back to its parent merged by id, so a summary
    written only in the subgraph lands mid-history in the parent, which never
    shrinks. One level down (``nested="parent"``), the compaction is sent to
    the parent (``Command.PARENT``), which runs the subgraph's node again on
    the compacted list. LangGraph gives a subgraph added as a node and a graph
    invoked inside a node function the same namespace, and in the second the
    parent node re-runs with the messages it had: so the compaction sent up is
    remembered per conversation, and when the next run of that conversation
    does not carry it, the parent did not take it; from then on that
    conversation's compactions are written to its own state, and a warning
    (once) names ``nested="own"``.

    Args:
        nested: ``"parent"`` or ``"own"``.
        who: The adapter, for the warnings.
    """

    def __init__(self, nested: Nesting, who: str) -> None:
        if nested not in ("parent", "own"):
            raise ConfigurationError("nested", nested, "pass 'parent' or 'own'")
        self.nested = nested
        self.who = who
        # What was sent up, and the parent's state once it takes it (``Handed.after``), per conversation.
        self._sent: Bounded[tuple[int, str, Handed | None]] = Bounded(CONVERSATIONS_REMEMBERED)
        self._own: Bounded[bool] = Bounded(CONVERSATIONS_REMEMBERED)
        self._holds: Bounded[bool] = Bounded(CONVERSATIONS_REMEMBERED)  # per parent task (its checkpoint_ns)
        self._unread: Bounded[bool] = Bounded(CONVERSATIONS_REMEMBERED)  # parent tasks with no checkpoint to read
        self._filed: Bounded[Conversation] = Bounded(CONVERSATIONS_REMEMBERED)  # the parent's, where it holds it
        self._left: Bounded[Handed] = Bounded(CONVERSATIONS_REMEMBERED)  # per parent task re-run after a send-up
        self._warned: set[str] = set()

    def conversation(
        self, config: Any, messages: Sequence[BaseMessage], messages_key: str = "messages"
    ) -> Flow[tuple[Conversation, Conversation, str | None]]:
        """This run's conversation, the one a compaction belongs to, and the parent node to send it to (if any).

        Also settles whether the last compaction sent to the parent was taken
        (see the class docstring), and whether the parent holds this
        conversation at all (``_parent_holds``).
        """
        own = conversation_of(config, messages)
        self._filed.pop(own.key)
        parent = parent_node(config) if self.nested == "parent" else None
        if parent is None or parent == TOO_DEEP or own.thread is None:
            return own, own, None
        sent = self._sent.pop(own.key)
        took = sent is not None and len(messages) >= sent[0] and prefix_digest(messages[: sent[0]]) == sent[1]
        if took:
            # The node runs again on the list it sent up: the parent holds it, whatever its last checkpoint says,
            # for the rest of this run too (the node the parent's edge leads to runs beside it once: no branch).
            self._holds.put(_task(config), True)
            left = None if sent is None else sent[2]
            if left is not None:  # (what the parent gives this task: its checkpoint may never be written)
                self._left.put(_task(config), left)
        # (A graph run by a @task has no parent state to send to: a command would reach the task.)
        if not took and (
            parent == IN_TASK or not (yield from self._parent_holds(config, messages, messages_key, parent))
        ):
            if parent != IN_TASK and self._unread.get(_task(config)):
                return own, own, None  # nothing told: said once a compaction stays here (``stayed``)
            self.say(
                "own",
                "it runs on messages its parent's state does not hold, or beside other nodes of its parent (a task "
                "sent with Send, parallel branches, a graph invoked inside a node function, a tool, an @entrypoint "
                "or a @task with messages of its own): it writes compactions to its own state there, which the "
                "graph returns, since sent up they would replace the parent's conversation or reach a state that "
                "does not hold it; pass nested='own' to say so",
            )
            return own, own, None
        if sent is not None and not took:
            self._own.put(own.key, True)
            self.say(
                "own",
                "its parent did not take the compaction it sent up (a graph invoked inside a node function, or one "
                "with a checkpointer of its own): it now writes compactions to its own state; pass nested='own' to "
                "say so",
            )
        if self._own.get(own.key):
            return own, own, None
        self._filed.put(own.key, own.up())
        return own, own.up(), parent

    def filed_under(self, own: Conversation) -> Conversation:
        """The conversation ``conversation`` last filed this run's under (its own when not asked yet).

        A compaction made where it cannot be sent up (a model call one level
        down) still belongs to the conversation the parent holds: it is
        archived, counted and retried there, as the compactions sent up are,
        so a message is archived once and recalled where the others are.
        """
        return self._filed.get(own.key) or own

    def _parent_holds(self, config: Any, messages: Sequence[BaseMessage], key: str, node: str) -> Flow[bool]:
        """Whether the parent graph's state holds this run's conversation, read from its checkpoint.

        A task sent with ``Send`` runs the subgraph on a payload of the
        parent's choosing, and a compaction sent up from there would replace
        the parent's whole conversation with the task's. The parent's
        checkpoint of this step tells: a node the step runs by an edge has a
        trigger waiting there, a task sent with ``Send`` has none, and nodes
        running beside it (parallel branches) have theirs. Then the parent's
        messages (by id) must lead this run's. Where no checkpoint of the
        parent can be read (no checkpointer, nothing saved yet), nothing tells
        a subgraph added as a node from a graph run inside a node function or
        a tool: the compaction stays here (``stayed`` says what follows). Read
        once per parent task.
        """
        configurable = configurable_of(config)
        where = _task(config)
        known = self._holds.get(where)
        if known is not None:
            return known
        found, exact = yield from parent_checkpoint(configurable)
        if found is None:
            self._holds.put(where, False)
            self._unread.put(where, True)
            return False
        checkpoint = found.checkpoint
        values = checkpoint.get("channel_values", {}).get(key)
        if exact and (not pulled(checkpoint, node) or beside(checkpoint, node)):
            holds = False  # no edge runs the node this step (a task sent with Send), or others run beside it
        elif key not in checkpoint.get("channel_versions", {}):
            holds = False  # the parent never had the key: the subgraph's messages are its own (messages_key=...)
        elif not isinstance(values, list) or not values:
            return True
        else:
            holds = leads(values, messages)
        self._holds.put(where, holds)
        return holds

    def to_parent(
        self,
        config: Any,
        update: dict[str, Any],
        state: Any,
        goto: str,
        *,
        sent: tuple[Conversation, Sequence[BaseMessage]] | None,
        held: Sequence[BaseMessage],
        key: str = "messages",
        own: Sequence[str] = (),
    ) -> Flow[Command[Any] | None]:
        """The command that writes ``update`` to the parent graph, which runs the subgraph's node (``goto``) again.

        The subgraph's run ends there, and what it wrote to its other keys
        in this run (a tool's to-do list, a node's notes) would end with it:
        those go up too. What it only read is left alone: a key is carried
        when its value differs from the parent's as this task was given it,
        so a parent's reducer is not applied to what it already holds. That
        state is read again at the compaction (``_given``), not kept in memory
        between the task's first check and its compaction, where other
        conversations could push it out. Where it is not known (the parent's
        checkpoint gone or unreadable), ``None``: the compaction is written to
        the subgraph's own state, whose run goes on and hands the parent
        everything it wrote.
        LangGraph drops the keys the parent does not have; ``own`` names keys
        that stay below (the library's own; an agent's jump always does).

        Args:
            config: The run's config (which parent task this is).
            update: The compaction's update (the messages, the result).
            state: The subgraph's state as the node or middleware got it.
            goto: The parent's node that runs the subgraph.
            sent: The conversation and the message list written, if any (see ``sent``).
            held: The messages the compaction was made from (the parent's must lead them).
            key: The state key holding them.
            own: State keys never written to the parent.
        """
        given = yield from self._given(config, held, key)
        if given is None:
            return None
        carried = given.carried(state, {*own, *update, AGENT_JUMP})
        if sent is not None:
            # (The parent's state is kept only where its step's checkpoint is never written for the re-run
            # to read: durability "exit". Elsewhere it would hold a whole state per send-up for nothing.)
            up = {name: value for name, value in {**carried, **update}.items() if name != key}
            kept = configurable_of(config).get(CONFIG_KEY_DURABILITY) == "exit"
            self.sent(*sent, left=given.after(sent[1], up) if kept else None)
        return Command(graph=Command.PARENT, update={**carried, **update}, goto=goto)

    def _given(self, config: Any, held: Sequence[BaseMessage], key: str) -> Flow[Handed | None]:
        """The parent's state as this task was given it, if it leads ``held``; ``None`` (said once): unknown.

        Read from the parent's checkpoint the run's config names, where it
        was written. Where it was not (durability ``"exit"`` writes none
        during a run, and the parent's last one is a run old), the node's own
        re-run after a send-up takes the state that send-up left the parent
        in (``Handed.after``), and any other task the parent's last
        checkpoint. A saver's error reading it (a dropped connection) is
        taken as its being gone: the summary is already paid for.
        """
        left = self._left.pop(_task(config))
        try:
            found, exact = yield from parent_checkpoint(configurable_of(config))
        except Exception as error:
            self.say(
                "given error",
                f"reading its parent's checkpoint again when it compacted raised {error!r}: it went on as if the "
                "checkpoint were gone",
            )
            found, exact = None, False
        read = None if found is None else Handed.of(found.checkpoint.get("channel_values", {}), key)
        given = read if read is not None and (exact or left is None) else left
        if given is not None and given.leads(held):
            return given
        self.say("given", _GIVEN_UNKNOWN)
        return None

    def sent(self, conversation: Conversation, messages: Sequence[BaseMessage], left: Handed | None = None) -> None:
        """Remember that ``messages`` (the list written) were sent to the parent of ``conversation``'s subgraph.

        When the parent takes them, the subgraph's node runs again on exactly
        that list (and what follows it), given ``left`` (the parent's state
        then, if known); anything else means it did not.
        """
        self._sent.put(conversation.key, (len(messages), prefix_digest(messages), left))

    def stayed(self, config: Any) -> None:
        """Say once that a compaction stayed in the subgraph because no checkpoint of its parent could be read.

        Said on a turn that compacts, not on one that only looked: a turn
        that compacts nothing loses nothing, and a later one may read the
        parent's checkpoint and reach it.
        """
        if not self._unread.get(_task(config)):
            return
        self.say(
            "unread",
            "it compacted in a subgraph where no checkpoint of its parent could be read (a parent compiled without "
            "a checkpointer, or a thread's first turn run with durability='exit'), where nothing tells a parent "
            "holding these messages from a supervisor whose tool runs this graph: it wrote the compaction to its "
            "own state. A parent that holds them gets the subgraph's list merged by id, the summary after the whole "
            "history, so a parent node after the subgraph that sends that list to a model itself sends a system "
            "message mid-history, until a turn reads the parent's checkpoint (never, without a checkpointer); to "
            "compact the parent on such turns, put a CompactionNode before the subgraph's node in the parent (or, "
            "with a checkpointer, run a thread's first turn with durability 'async' or 'sync'); nested='own' is "
            "for messages that are not the parent's",
        )

    def too_deep(self, config: Any) -> bool:
        """Whether this run is nested more than one level down (say so once)."""
        if self.nested != "parent" or parent_node(config) != TOO_DEEP:
            return False
        self.say(
            "too deep",
            "it runs in a subgraph nested more than one level deep, where LangGraph lets it update only its own "
            "state: its summaries land mid-history in the outer graphs, whose checkpointed state never shrinks "
            "(requests stay valid: the summary is put back in place each turn); put the compaction in the "
            "outermost graph that holds the conversation (a CompactionNode before the subgraph's node there), "
            "or pass nested='own' if this subgraph's messages are its own",
        )
        return True

    def unreachable(self, where: str) -> None:
        """Say once that a compaction was made where the parent's state cannot be written."""
        self.say(
            where,
            f"it compacted where the parent graph's state cannot be written ({where}): the summary lands "
            "mid-history there and is put back in place on the next turn; add the compaction to the outermost "
            "graph that holds the conversation",
        )

    def beside(
        self, config: Any, current: Sequence[BaseMessage], target: Sequence[BaseMessage]
    ) -> Flow[list[Any] | None]:
        """A compaction written message by message (``in_place``) where other nodes run beside the node.

        They write in the same step, and a replacement of the whole list
        applied after theirs would wipe what they wrote. ``None``: the
        replacement will do (no node beside it, or nothing to tell).
        """
        if not (yield from runs_beside_others(config)):
            return None
        update = in_place(current, target)
        if update is None:
            self.say(
                "beside",
                "it runs in one step with other nodes and could not write its compaction message by message, so "
                "what they write in that step may be replaced: run it before the fan-out, not beside it",
            )
        return update

    def say(self, kind: str, text: str) -> None:
        """Log ``text`` as a warning once per ``kind`` (this adapter's)."""
        if kind in self._warned:
            return
        self._warned.add(kind)
        logger.warning("%s: %s", self.who, text)
