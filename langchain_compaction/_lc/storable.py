"""Values a LangGraph store can take whatever they hold: the one rule for every item this library writes.

PostgreSQL's ``jsonb`` refuses a NUL character in a string (a binary file's
header read by a tool, the separator inside a checked fact's key): the write
fails, and every later write of the thread with it. SQLite's and
PostgreSQL's stores also refuse what is not plain JSON data, which the
checkpointer's own serializer takes (a tool's artifact with dates, a table
whose keys are numbers: ``DataFrame.to_dict()``). Such a value is kept as
JSON text instead, under its key with ``_json`` added: dates written out,
keys as text and anything else as ``str``; the NUL becomes the six characters
``\\u0000``. Plain values are kept as they are, so items written before
this rule read the same.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Mapping
from typing import Any


def storable(key: str, data: Any) -> dict[str, Any]:
    """``{key: data}``, or ``{key + "_json": its JSON text}`` when a store could not take ``data``.

    Example:
        >>> storable("message", {"content": "a\\x00b"})
        {'message_json': '{"content": "a\\\\u0000b"}'}
    """
    plain = _plain(data)
    text = json.dumps(plain)
    return {key: data} if plain == data and "\\u0000" not in text else {f"{key}_json": text}


def stored(value: Mapping[str, Any], key: str) -> Any:
    """What ``storable(key, ...)`` kept in ``value``; raises ``KeyError`` or ``ValueError`` on a foreign value."""
    data = value.get(key)
    return json.loads(value[f"{key}_json"]) if data is None else data


def _plain(value: object) -> object:
    """``value`` as plain JSON data: string keys, lists, dates written out, anything else its text."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    if isinstance(value, dict):
        return {key if isinstance(key, str) else str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_plain(item) for item in value]
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    return str(value)
