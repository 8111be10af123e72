"""The archive: compacted messages kept word for word, and the tool that reads them back.

Turn it on with the ``Archive`` feature (``CompactionNode(...,
features=[*default_features(), Archive()])``, the same for
``CompactionMiddleware``) on a graph or agent that has a LangGraph store; chat memory keeps its own with
``CompactingChatMessageHistory(..., archive=<a history>)`` and reads it back
with ``recall()`` or ``recall_tool(history=...)``.

Example:
    >>> tool = recall_tool()
    >>> tool.name, sorted(tool.args)
    ('recall_messages', ['end', 'ids', 'limit', 'query', 'start'])
"""

from __future__ import annotations

from langchain_compaction.features.archive import ARCHIVE_NAMESPACE, RECALL_TOOL_NAME, Archive
from langchain_compaction.features.recall import recall_tool

__all__ = ["ARCHIVE_NAMESPACE", "RECALL_TOOL_NAME", "Archive", "recall_tool"]
