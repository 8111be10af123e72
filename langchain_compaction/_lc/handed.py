"""What a parent graph gave a subgraph's run, and what a compaction sent up from that run carries with it.

A compaction sent to the parent (``Command.PARENT``) ends the subgraph's
run, and what the run wrote to its other keys (a tool's to-do list, a
node's notes) would end with it: those go up too. What it only read is left
alone: a key is carried when its value differs from the parent's as the
parent task was given it, so a parent's reducer is not applied to what it
already holds (``Delivery.to_parent`` reads that state; ``Handed`` is it).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.messages import BaseMessage

AGENT_JUMP = "jump_to"
"""A LangChain agent's one-step jump (``create_agent``): it is the subgraph's own, never its parent's."""


def leads(values: Sequence[Any], messages: Sequence[BaseMessage]) -> bool:
    """Whether the parent's ``values`` (its message list) lead ``messages``, by id."""
    ids = [getattr(m, "id", None) for m in values]
    return ids == [m.id for m in messages[: len(ids)]]


def _changed(value: object, given: object) -> bool:
    """Whether a subgraph's ``value`` differs from what its parent gave it (an odd ``__eq__``: taken as changed)."""
    try:
        return bool(value != given)
    except Exception:
        return True


def state_values(state: Any) -> dict[str, Any]:
    """A graph state's keys and values: a dict, a dataclass or a pydantic model."""
    if isinstance(state, Mapping):
        return {key: value for key, value in state.items() if isinstance(key, str)}
    fields = getattr(type(state), "model_fields", None) or getattr(state, "__dataclass_fields__", None)
    if isinstance(fields, Mapping):
        return {name: getattr(state, name) for name in fields if hasattr(state, name)}
    return {}


@dataclass(frozen=True, slots=True)
class Handed:
    """The parent's state as a parent task was given it.

    Attributes:
        messages: The parent's message list (``None``: it held none, or not as a list).
        values: The parent's other keys.
    """

    messages: Sequence[Any] | None
    values: Mapping[str, Any]

    @classmethod
    def of(cls, channels: Mapping[str, Any], key: str) -> Handed:
        """The state a parent's checkpoint holds (its ``channel_values``), its messages under ``key``."""
        messages = channels.get(key)
        listed = messages if isinstance(messages, list) and messages else None
        return cls(listed, {name: value for name, value in channels.items() if name != key})

    def leads(self, held: Sequence[BaseMessage]) -> bool:
        """Whether the parent's messages lead ``held`` (the ones a compaction was made from), or it held none."""
        return self.messages is None or leads(self.messages, held)

    def carried(self, state: Any, stay: Collection[str]) -> dict[str, Any]:
        """The keys of the subgraph's ``state`` its run changed (new ones too), but those in ``stay``."""
        values = self.values
        return {
            name: value
            for name, value in state_values(state).items()
            if name not in stay and (name not in values or _changed(value, values[name]))
        }

    def after(self, written: Sequence[BaseMessage], update: Mapping[str, Any]) -> Handed:
        """The parent's state once it takes a compaction sent up: ``written`` its messages, ``update`` on the rest.

        ``update`` holds what went up besides the messages (the carried keys,
        the compaction's result), as the parent's last-value channels keep it.
        """
        return Handed(list(written), {**self.values, **update})
