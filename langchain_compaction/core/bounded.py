"""A bounded, thread-safe cache: the one the library keeps every in-memory state in.

Per conversation (preparations, preambles, token counts, warnings said) and
per text (what a message says, ``core.readings``): at most ``size`` entries,
the least recently used dropped first.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Generic, TypeVar

_V = TypeVar("_V")


class Bounded(Generic[_V]):
    """A dict of at most ``size`` entries; the least recently used go first. Thread-safe.

    Example:
        >>> cache = Bounded(2)
        >>> cache.put("a", 1); cache.put("b", 2); cache.put("c", 3)
        >>> cache.get("a"), cache.get("c"), len(cache)
        (None, 3, 2)
    """

    def __init__(self, size: int) -> None:
        self.size = max(int(size), 1)
        self._items: OrderedDict[Any, _V] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: Any) -> _V | None:
        """The entry under ``key`` (now the most recently used), or ``None``."""
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: Any, value: _V) -> None:
        """Keep ``value`` under ``key``, dropping the least recently used entry past the bound."""
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)

    def pop(self, key: Any, expected: _V | None = None) -> _V | None:
        """Remove and return the entry under ``key`` (only if it is ``expected``, when given)."""
        with self._lock:
            value = self._items.get(key)
            if value is None or (expected is not None and value is not expected):
                return None
            del self._items[key]
            return value

    def clear(self) -> None:
        """Drop every entry."""
        with self._lock:
            self._items.clear()

    def retain(self, keep: Callable[[_V], bool]) -> None:
        """Drop every entry ``keep`` says no to (a forked child drops the work of threads it did not inherit)."""
        with self._lock:
            for key in [k for k, v in self._items.items() if not keep(v)]:
                del self._items[key]

    def after_fork(self) -> None:
        """A fresh lock, in a forked child: the parent's thread that held it did not come along."""
        self._lock = threading.Lock()
