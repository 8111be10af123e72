"""Cache-aligned summary requests: the conversation's own prefix, so the provider's prompt cache serves it.

The summarizer is sent the conversation's own messages before the cut,
unchanged (and, under ``create_agent``, the agent's system prompt and tool
schemas with them, as the agent sends them), then the summary instruction as a
final user message. Anthropic's cache reads cost a tenth of fresh input. It
is used when the region fits one request and the summarizer can send messages
(chat models, ``AnthropicSummarizer``); otherwise the transcript is sent.

What the agent's requests carry besides the messages (the ``Preamble``) is seen
only in the model call (``wrap_model_call``); it is remembered per
conversation, so one thread's prompt and tools never go with another's
summary request.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from langchain_compaction._lc.conversation import CONVERSATIONS_REMEMBERED
from langchain_compaction.core.bounded import Bounded
from langchain_compaction.core.options import CompactionOptions
from langchain_compaction.core.types import NO_PREAMBLE, Preamble
from langchain_compaction.errors import ConfigurationError
from langchain_compaction.features.base import Feature


@dataclass(frozen=True, slots=True)
class CacheAligned(Feature):
    """Send the summarizer the conversation's own prefix, byte for byte, so the prompt cache serves it.

    A prompt cache belongs to one model, so the saving holds only when the
    summarizer is the agent's own model. It cannot be combined with
    ``CompactionOptions(redact=...)``: redacting the prefix would change it,
    and an unchanged prefix is the mode's only benefit.

    Example:
        >>> CacheAligned().preamble(("thread", "t1"))
        Preamble(messages=(), tools=(), tokens=0)
    """

    name: ClassVar[str] = "cache_aligned"
    _preambles: Bounded[Preamble] = field(
        default_factory=lambda: Bounded(CONVERSATIONS_REMEMBERED), init=False, repr=False, compare=False
    )

    def bind(self, options: CompactionOptions) -> CacheAligned:
        """This feature, refused with ``redact`` (see the class docstring)."""
        if options.redact is not None:
            raise ConfigurationError(
                "features",
                self,
                "CacheAligned sends the conversation's own messages unchanged so the provider's prompt cache serves "
                "them; CompactionOptions(redact=...) would have to change them, losing the cache. Leave out one of "
                "the two",
            )
        return self

    def remember(self, key: Any, preamble: Preamble) -> None:
        """What the conversation's model requests carry besides its messages (seen in a model call)."""
        self._preambles.put(key, preamble)

    def preamble(self, key: Any) -> Preamble:
        """What the conversation's requests were last seen to carry (nothing, if never seen)."""
        return self._preambles.get(key) or NO_PREAMBLE
