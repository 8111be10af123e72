"""The 0.2 adapter keywords that now belong to a feature, accepted for one more release.

``prepare_wait``, ``prepare_in_store`` and ``prepare_lease`` are ``PrepareAhead``'s
options now, and ``archive=`` is the ``Archive`` feature; each still works, with
a ``DeprecationWarning`` that names its replacement
(``features.resolve`` turns them into features).
"""

from __future__ import annotations

import warnings
from typing import Any


class _Unset:
    def __repr__(self) -> str:
        return "<unset>"


UNSET: Any = _Unset()
"""The default of a deprecated keyword: not given."""

_NEW = {
    "prepare_wait": "PrepareAhead(wait=...)",
    "prepare_in_store": "PrepareAhead(in_store=...)",
    "prepare_lease": "PrepareAhead(lease=...)",
    "archive": "Archive(...)",
}


def adapter_keywords(who: str, **given: Any) -> dict[str, Any]:
    """The deprecated keywords an adapter was given, as ``features.resolve`` takes them (each warned about once)."""
    out: dict[str, Any] = {}
    for name, value in given.items():
        if value is UNSET:
            continue
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
