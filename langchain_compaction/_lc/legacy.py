"""The 0.2 adapter keywords that now belong to a feature, accepted for one more release.

An adapter takes them as ``**deprecated`` and hands them here.

``prepare_wait``, ``prepare_in_store`` and ``prepare_lease`` are ``PrepareAhead``'s
options now, and ``archive=`` is the ``Archive`` feature; each still works, with
a ``DeprecationWarning`` that names its replacement
(``features.resolve`` turns them into features).
"""

from __future__ import annotations

import warnings
from typing import Any

_NEW = {
    "prepare_wait": "PrepareAhead(wait=...)",
    "prepare_in_store": "PrepareAhead(in_store=...)",
    "prepare_lease": "PrepareAhead(lease=...)",
    "archive": "Archive(...)",
}
"""The deprecated keywords, and what replaces each."""


def adapter_keywords(who: str, given: dict[str, Any], allowed: tuple[str, ...] = tuple(_NEW)) -> dict[str, Any]:
    """The deprecated keywords an adapter was given, as ``features.resolve`` takes them (each warned about once).

    Raises:
        TypeError: A keyword the adapter never took, as Python says it.
    """
    out: dict[str, Any] = {}
    for name, value in given.items():
        if name not in allowed:
            msg = f"{who}() got an unexpected keyword argument {name!r}"
            raise TypeError(msg)
        warnings.warn(
            f"{who}({name}=...) is deprecated and will be removed in 0.4; pass "
            f"features=[..., {_NEW[name]}] (from langchain_compaction.features)",
            DeprecationWarning,
            stacklevel=3,
        )
        if name == "archive":
            out["archive"] = value
        else:
            out.setdefault("prepare", {})[name[len("prepare_") :]] = value
    return out
