"""What writes the summaries, and the seam for your own.

Anything passed as ``model=`` becomes a ``Summarizer``: a LangChain chat model
or Runnable (``summarizers.chat_model.ChatModelSummarizer``), a function from
prompt text to summary text (``summarizers.chat_model.CallableSummarizer``), or
an object with ``name``, ``summarize`` and ``asummarize``, such as the offline
``ExtractiveSummarizer`` or ``langchain_compaction.anthropic.AnthropicSummarizer``.
A summarizer receives a ``SummaryRequest`` and returns text or a ``SummaryReply``.
"""

from langchain_compaction.core.engine import Summarizer
from langchain_compaction.core.types import SummaryReply, SummaryRequest
from langchain_compaction.summarizers.extractive import ExtractiveSummarizer

__all__ = ["ExtractiveSummarizer", "Summarizer", "SummaryReply", "SummaryRequest"]
