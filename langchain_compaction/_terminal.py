"""What the command line shows on a terminal: colours, tables, a chunked summary's progress.

No LangChain here: ``--help`` loads none.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from langchain_compaction.core.types import SummaryReply, SummaryRequest


class Style:
    """ANSI colours when the stream is a terminal and NO_COLOR is unset."""

    def __init__(self, stream: TextIO) -> None:
        self.on = stream.isatty() and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb"

    def __call__(self, text: str, code: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.on else text

    def bold(self, text: str) -> str:
        return self(text, "1")

    def dim(self, text: str) -> str:
        return self(text, "2")

    def green(self, text: str) -> str:
        return self(text, "32")

    def yellow(self, text: str) -> str:
        return self(text, "33")


def table(rows: Sequence[Sequence[str]], header: Sequence[str], style: Style) -> str:
    """``rows`` under ``header`` in aligned columns (the first left-aligned, the others right)."""
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(str(c).rjust(w) if i else str(c).ljust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([style.bold(line(header)), rule, *(line(r) for r in rows)])


@dataclass
class Progress:
    """Wraps a summarizer to show progress on stderr while chunks run."""

    inner: Any
    stream: TextIO
    quiet: bool

    @property
    def name(self) -> str:
        return str(self.inner.name)

    def _show(self, request: SummaryRequest) -> None:
        if not self.quiet and request.chunk_count > 1:
            # On a terminal each step overwrites the last; in a log or a pipe each has its own line. (The
            # count is planned: a long summary of one chunk makes one more.)
            number, live = request.chunk_index + 1, self.stream.isatty()
            step = f"summarizing chunk {number} of about {max(request.chunk_count, number)}"
            print(
                f"\r{step}" if live else step,
                end="" if live and number < request.chunk_count else "\n",
                file=self.stream,
            )
            self.stream.flush()

    def summarize(self, request: SummaryRequest) -> str | SummaryReply:
        self._show(request)
        return self.inner.summarize(request)  # type: ignore[no-any-return]

    async def asummarize(self, request: SummaryRequest) -> str | SummaryReply:
        self._show(request)
        return await self.inner.asummarize(request)  # type: ignore[no-any-return]
