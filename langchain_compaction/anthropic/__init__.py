"""Exact token counts and summaries through the Anthropic SDK.

``AnthropicTokenCounter`` asks ``client.messages.count_tokens`` for the exact
input size of LangChain messages (system prompt and tools included), for
``CompactionOptions(token_counter=...)``; ``AnthropicSummarizer`` writes the
summary with ``client.messages.create``, cache-aligned with the agent's own
requests when ``summary_mode="cache_aligned"``.

Modules: ``counter`` and ``summarizer`` hold the two classes; ``wire``
converts LangChain messages to the Messages API's format.
"""

from __future__ import annotations

from langchain_compaction.anthropic.counter import AnthropicTokenCounter
from langchain_compaction.anthropic.summarizer import AnthropicSummarizer

__all__ = ["AnthropicSummarizer", "AnthropicTokenCounter"]
