"""What a compaction writes: the summary message's text, the output's order, the figures.

Three things every adapter needs and none computes on its own:

- ``compose_summary`` / ``summary_body``: the one layout of a summary message
  (header, the notice that it is data, the summarizer's text, then any section
  the library itself adds), and how to read the summarizer's text back from a
  summary written by this or any earlier version.
- ``layout``: the order of the compacted conversation, as indices into the
  caller's list: ``[leading system messages, summary, (bridge), *kept]``,
  where the bridge is a one-line user turn put after the summary when the kept
  part does not open with one. Each adapter maps the indices back to its own
  objects, so kept messages are the caller's, never rebuilt.
- ``compaction_result`` / ``clearing_result``: the token arithmetic of the
  result.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from langchain_compaction.core import prompts
from langchain_compaction.core.cut import unread_exchange, unread_tools
from langchain_compaction.core.lines import clip, normalize
from langchain_compaction.core.options import CompactionOptions
from langchain_compaction.core.plan import Layout, Plan
from langchain_compaction.core.redact import apply_redactor
from langchain_compaction.core.result import CompactionResult
from langchain_compaction.core.section import SECTION_HEADING, SECTION_NOTE, Fences
from langchain_compaction.core.subjects import singular
from langchain_compaction.core.types import Message

BODY_KEY = "body_chars"
"""Key in a summary's mark: how many characters of its content are the header and the summarizer's text."""
WRITTEN_KEY = "content_chars"
"""Key in a summary's mark: how many characters its content had as written (longer: someone added to it)."""
ADDED_KEY = "added_lines"
"""Key in a summary's mark: a short digest of each line the library added under the summary (``line_digest``)."""

# How the library begins what it adds under a summary (its checked facts and
# the archive's note); read only in summaries without ``BODY_KEY`` (0.2's).
_ADDED_IN_0_2 = ("## Checked facts\n(", "(Earlier messages of this conversation are archived")

if TYPE_CHECKING:
    from langchain_compaction.core.engine import DriverReport


_CONTROL = re.compile(r"[\x00-\x08\x0b\x0e-\x1f\x7f]")
# A line of the prompt's template copied as it is: "[What ... ?]", "- [x] [Completed tasks]" (any box: "- [y]").
_WORD = re.compile(r"\w+")
# (Each run of spaces is read by one ``\s*``: two side by side were quadratic on a long blank line.)
_ITEM = r"^\s*(?:(?:[-*]|\d+\.)\s*)?(?:\[[^\]\n]{0,2}\]\s*)?"  # a list item's bullet and check box, if any
_PLACEHOLDER = re.compile(_ITEM + r"\[[^\]\n]{3,}\](?:\s*:\s*\[[^\]\n]*\])?\s*$")
# Every line of the prompts but their headings (a heading the prompt asks for
# is the summary's own, not an echo), folded.
_PROMPTS = (prompts.CHECKPOINT_PROMPT, prompts.UPDATE_PROMPT, prompts.SYSTEM_PROMPT, prompts.CACHE_ALIGNED_PROMPT)
_ANY_PROMPT_LINE = frozenset(
    normalize(line)
    for prompt in _PROMPTS
    for line in prompt.splitlines()
    if line.strip() and not line.lstrip().startswith("#")
)
# The words of each phrase the prompts' templates put in brackets ("[Completed
# tasks/changes]"): a bracketed line is an echo only when its phrases use no
# other word. A model that writes its own items in the template's style
# ("- [x] [Added retry logic to src/client.py]") keeps them.
_BRACKETED = re.compile(r"\[([^\]\n]{3,})\]")
_BULLET = re.compile(_ITEM)


def _words(text: str) -> frozenset[str]:
    """The words of ``text``, folded and in the singular (a model echoes "example" for "examples")."""
    return frozenset(map(singular, _WORD.findall(text.lower())))


_TEMPLATE_PHRASES = tuple(
    _words(phrase)
    for prompt in (
        prompts.CHECKPOINT_PROMPT,
        prompts.UPDATE_PROMPT,
        prompts.SYSTEM_PROMPT,
        prompts.CACHE_ALIGNED_PROMPT,
    )
    for phrase in _BRACKETED.findall(prompt)
)
_MARKUP = str.maketrans("", "", "[]*")
# The marker lines of the transcript a summarizer is shown (``core.transcript``): "<</msg-405d4ab9>>".
_MARKER = re.compile(r"<</?msg-[0-9a-f]{8}[^>\n]*>>")
_SECTION_NAME = normalize(SECTION_HEADING.lstrip("# "))


def _plain(line: str) -> str:
    """``line`` folded, without brackets and emphasis: a template line copied with them stripped is the same."""
    return normalize(line.translate(_MARKUP))


# (Each sentence of a line too: "Keep each section concise." echoes a longer line's first.)
_PLAIN_PROMPT_LINES = frozenset(
    p for line in _ANY_PROMPT_LINE for p in (_plain(line), *map(_plain, re.split(r"(?<=\.) ", line))) if len(p) > 12
)
# Those a summarizer's text loses wherever they stand (long enough to be telling);
# an answer made of nothing but prompt lines is no summary (``echoes_prompt``).
_PROMPT_LINES = frozenset(line for line in _ANY_PROMPT_LINE if len(line) > 16)
# The library's own lines: a summarizer that writes them (echoed from a tool's
# output, say) would make its text look like the library's section.
_LIBRARY_LINES = frozenset(
    normalize(line)
    for line in (SECTION_HEADING, SECTION_NOTE, prompts.SUMMARY_HEADER, *prompts.SUMMARY_NOTICE.splitlines())
    if line.strip()
)


def well_formed(summary: str) -> str:
    """A summarizer's text made safe to lay out: template and prompt lines it echoed dropped, fences and HTML closed.

    Whatever the summarizer wrote, what the library adds after it must not
    end up inside a code block the summarizer opened and never closed, and a
    template placeholder it copied ("[Any constraints ...]") is not a summary.

    Example:
        >>> well_formed("## Goal\\n- ship it\\n- [Or \\"(none)\\" if none were mentioned]\\n```py\\nx = 1")
        '## Goal\\n- ship it\\n```py\\nx = 1\\n```'
    """
    kept: list[str] = []
    fences = Fences()
    html = ""  # the end of an HTML block a line opened (CommonMark: it runs until that end, whatever lies between)
    # Control characters say nothing in a summary, and a NUL is refused by
    # PostgreSQL's jsonb (a store that keeps prepared summaries).
    for line in _CONTROL.sub("", summary).splitlines():
        code = fences.step(line)
        if _echoed(line, code=code):
            continue
        kept.append(line.rstrip())
        if html and html in line.lower():
            html = ""
        elif not html and not code and (opened := _HTML_BLOCK.match(line)):
            end = f"</{opened.group(1).lower()}>" if opened.group(1) else "-->"
            html = "" if end in line[opened.end() :].lower() else end
    if fences.open:
        kept.append(fences.closing)
    return "\n".join([*kept, html] if html else kept).strip()


# What opens an HTML block that only its own end closes: a comment, a <pre>, <script>, <style> or <textarea>.
_HTML_BLOCK = re.compile(r" {0,3}(?:<!--|<(pre|script|style|textarea)(?=[\s>]|$))", re.IGNORECASE)


def echoes_prompt(summary: str) -> bool:
    """Whether ``summary`` holds nothing but headings and the prompts' own lines (the instructions echoed back)."""
    # (The fences of a template copied inside a code block are no content of their own.)
    content = [line.strip() for line in well_formed(summary).splitlines() if not line.lstrip().startswith("#")]
    return all(normalize(line) in _ANY_PROMPT_LINE for line in content if line and not line.startswith(("```", "~~~")))


def _echoed(line: str, *, code: bool) -> bool:
    """Whether a summary line is a template placeholder, a prompt line or (outside ``code``) one of the library's own.

    A template copied inside a code block is still the template; a copy of the
    library's lines there is the summarizer's quotation (read back as its text).
    """
    # A placeholder, or one of three words or more copied without its brackets: "- Current work" may be the
    # summary's, "- Any constraints mentioned by user" is the template's.
    placeholder = _PLACEHOLDER.match(line) is not None
    phrases = [_words(p) for p in _BRACKETED.findall(line)] if placeholder else [_words(_BULLET.sub("", line))]
    if (placeholder or len(phrases[0]) >= 3) and all(
        any(words <= template for template in _TEMPLATE_PHRASES) for words in phrases
    ):
        return True
    folded, plain = normalize(line), _plain(line)
    if folded in _PROMPT_LINES or plain in _PLAIN_PROMPT_LINES or _MARKER.fullmatch(line.strip()):
        return True
    # The library's lines, and its section's name however it is set off ("### Checked facts:", "**Checked facts**").
    return not code and (folded in _LIBRARY_LINES or plain.strip("#: ") == _SECTION_NAME)


def compose_summary(summary: str, sections: Sequence[str] = ()) -> tuple[str, int]:
    """The content of a summary message, and where the summarizer's part of it ends.

    Args:
        summary: The summarizer's text.
        sections: Sections the library adds after it (each feature's, in order).

    Returns:
        The header line, the notice, the summary, then the sections; and the
        length of everything before the sections (recorded as ``BODY_KEY``).

    Example:
        >>> content, body = compose_summary("## Goal\\n- ship", ["## Added\\n- x"])
        >>> content.splitlines()[0], content[body:].strip()
        ('[Conversation summary — earlier messages were compacted]', '## Added\\n- x')
    """
    head = "\n\n".join(p for p in (f"{prompts.SUMMARY_HEADER}\n{prompts.SUMMARY_NOTICE}", summary.strip()) if p)
    added = [s.strip() for s in sections if s.strip()]
    return "\n\n".join([head, *added]), len(head)


def body_mark(content: str, body: int) -> dict[str, Any]:
    """The keys of a summary's mark that say where its parts are (``compose_summary``'s content and body).

    Besides the two lengths, each line the library added is recorded by a
    short digest: an edit that shortens or lengthens the library's sections
    (a fact line deleted, a line written among them) still tells the
    library's lines from the user's.
    """
    return {BODY_KEY: body, WRITTEN_KEY: len(content), ADDED_KEY: sorted(_digests(content[body:]))}


def line_digest(line: str) -> str:
    """A short digest of one line, as ``ADDED_KEY`` records it (its surrounding whitespace aside)."""
    return hashlib.blake2b(line.strip().encode("utf-8", "surrogatepass"), digest_size=5).hexdigest()


def _digests(text: str) -> set[str]:
    return {line_digest(line) for line in text.splitlines() if line.strip()}


def summary_body(content: str, mark: Mapping[str, Any] | None = None) -> str:
    """The summarizer's text of a summary message, without the header, the notice and what the library added.

    What features added under it (the checked facts, the archive's note) is
    left out: they keep their own record in the summary's mark, so a
    summarizer updating the summary never copies the library's lines. What
    someone added to the message since (an ``update_state`` that appends a
    line, or writes into the summary) is the summary's, and kept.

    Args:
        content: A summary message's text.
        mark: Its mark, when it has one (``body_mark``'s keys).

    Returns:
        What ``compose_summary`` was given as ``summary``, with what was added to it since.
    """
    mark = mark or {}
    body_chars, written = mark.get(BODY_KEY), mark.get(WRITTEN_KEY)
    if not isinstance(body_chars, int):  # (0.2's: the sections found by how they begin)
        body = _unheaded(content)
        found = [i for i in (body.find(start) for start in _ADDED_IN_0_2) if i >= 0]
        return body[: min(found)].rstrip() if found else body
    if not isinstance(written, int):
        written = len(content)  # (a mark from before edits were looked for: taken as unedited)
    tail = content[body_chars:]
    if len(content) == written and body_chars > 0 and (ADDED_KEY not in mark or not _theirs(tail, mark, 0)):
        return _unheaded(content[:body_chars])  # as written (the lines under it, each the library's)
    # Edited: its sections found by their heading nearest to where they were written.
    starts = [i for start in _ADDED_IN_0_2 for i in _all(content, "\n\n" + start)]
    if not starts:
        return _unheaded(content)  # (its sections edited away: all of it is the summary's)
    at = min(starts, key=lambda i: abs(i - body_chars))
    added = _theirs(content[at:], mark, written - body_chars)
    body = _unheaded(content[:at])
    return f"{body}\n\n{added}" if added else body


def _theirs(tail: str, mark: Mapping[str, Any], length: int) -> str:
    """What someone wrote into ``tail`` (the library's sections as they stand now), in order.

    With the digests of the library's lines (``ADDED_KEY``), every other line
    is theirs, wherever it stands; a mark without them (0.3's first summaries)
    knows only the sections' ``length`` as written, and takes what follows it.
    """
    recorded = mark.get(ADDED_KEY)
    if not isinstance(recorded, list):
        return tail[length:].strip()
    ours = set(recorded)
    return "\n".join(line for line in tail.splitlines() if line.strip() and line_digest(line) not in ours).strip()


def _unheaded(content: str) -> str:
    """``content`` without the header and notice a summary message opens with.

    A note someone wrote above the header stays, before the summary: the
    header is the library's wherever it stands (a summarizer shown it would
    copy it, and the next summary would carry it twice).
    """
    body = content.strip()
    at = body.find(prompts.SUMMARY_HEADER)
    note = ""
    if at > 0 and body[at - 1] == "\n":
        note, body = body[:at].strip(), body[at:]
    for line in (prompts.SUMMARY_HEADER, prompts.SUMMARY_NOTICE, prompts.LANGCHAIN_SUMMARY_PREFIX):
        if body.startswith(line):
            body = body[len(line) :].lstrip()
    return f"{note}\n\n{body}" if note and body else note or body


def _all(text: str, part: str) -> list[int]:
    """Where ``part`` starts in ``text``, every time."""
    found, at = [], text.find(part)
    while at >= 0:
        found.append(at)
        at = text.find(part, at + 1)
    return found


def layout(
    messages: Sequence[Message], plan: Plan, options: CompactionOptions, counts: Sequence[int] | None = None
) -> Layout:
    """The order of the compacted conversation for ``plan``.

    Args:
        messages: The conversation.
        plan: The plan.
        options: The options in force (``ensure_user_turn``).
        counts: The messages' token counts, for what the bridge says of a
            tool's output the summary took unread (``None``: nothing).

    Returns:
        The layout.
    """
    kept = (*plan.provider_prefix, *plan.pinned, *range(plan.cut, len(messages)))
    # Anthropic's API rejects a conversation whose first turn is not the
    # user's (or that has none): an agent compacted mid-loop keeps its tool
    # call first, or nothing (a thinking loop summarized whole).
    bridge = options.ensure_user_turn and (not kept or messages[kept[0]].role != "user")
    # A provider's fenced prefix that opens with the user's turn ends with its
    # block's reply: a loop kept after it would follow one assistant turn with
    # another and open without its thinking. The bridge goes after the prefix.
    fenced = len(plan.provider_prefix)
    after = (
        fenced if options.ensure_user_turn and not bridge and fenced and _opens_otherwise(messages, kept, fenced) else 0
    )
    bridge = bridge or after > 0
    request = open_request(messages, kept[after:], plan.cut) if bridge else ""
    if request and options.redact is not None:  # (what the bridge repeats goes through redact= like the summary)
        request = clip(apply_redactor(options.redact, request), BRIDGE_REQUEST_CHARS)
    note = unread_note(messages, counts, unread_exchange(messages, plan.cut)) if bridge and counts else ""
    return Layout(plan.keep_head, bridge, kept, request, after, note)


UNREAD_NOTE = (
    "The last tool call and its output ({tools}, {tokens:,} tokens) were too large to keep in the context: only "
    "the summary above holds what the output said. To see it again, ask for less of it (a range, a page, a filtered or "
    "truncated output) rather than repeating the same call."
)
"""What the bridge says when the summary took a tool exchange the model had not answered (``unread_exchange``)."""


def unread_note(messages: Sequence[Message], counts: Sequence[int], start: int | None) -> str:
    """What the bridge tells the model of the exchange the summary took unread (``UNREAD_NOTE``); "" if none."""
    if start is None:
        return ""
    tools, tokens = unread_tools(messages, counts, start)
    return UNREAD_NOTE.format(tools=tools, tokens=tokens)


def _opens_otherwise(messages: Sequence[Message], kept: Sequence[int], fenced: int) -> bool:
    """Whether what is kept after a fenced prefix ending with a reply opens with another turn than the user's."""
    return (
        fenced < len(kept) and messages[kept[fenced - 1]].role == "assistant" and messages[kept[fenced]].role != "user"
    )


BRIDGE_REQUEST_KEY = "request"
"""Key in a bridge's mark: the user's request it repeats (carried to the next bridge while the loop runs)."""
BRIDGE_REQUEST_CHARS = 1_000
"""The most characters of the user's request a bridge repeats."""


def open_request(messages: Sequence[Message], kept: Sequence[int], cut: int) -> str:
    """The user's request a tool loop still works on, when a compaction takes it into the summary ("" if none).

    The loop still runs when the conversation ends with a tool's result and
    no user turn is kept: the request is the last user turn before the cut,
    or what the bridge of an earlier compaction repeated. Repeated in the
    bridge, the model sees what was asked, and so does a middleware that reads
    the last user message (LangChain's ``LLMToolSelectorMiddleware`` picks the
    tools by it), not a line about the summary.
    """
    if not messages or not messages[-1].is_result or any(messages[i].asks for i in kept):
        return ""
    for index in range(cut - 1, -1, -1):
        message = messages[index]
        if not message.asks:
            continue
        if message.label == "bridge":
            carried = message.mark.get(BRIDGE_REQUEST_KEY)
            return carried if isinstance(carried, str) else ""
        return "" if message.is_summary else clip(message.text, BRIDGE_REQUEST_CHARS)
    return ""


def compaction_result(
    plan: Plan,
    shape: Layout,
    counts: Sequence[int],
    written_tokens: int,
    *,
    report: DriverReport,
    options: CompactionOptions,
) -> CompactionResult:
    """The figures of one summary compaction.

    Args:
        plan: The plan it followed.
        shape: Its layout.
        counts: Token count per message of the input.
        written_tokens: Tokens of what the library wrote (summary and bridge).
        report: What the summary flow and its driver reported.
        options: The options in force.

    Returns:
        The result.
    """
    outcome, usage = report.outcome, report.usage
    compacted = sum(counts[i] for i in (*shape.head, *shape.kept)) + written_tokens
    threshold, landing = options.budget.threshold, options.budget.landing
    return CompactionResult(
        summary=outcome.summary,
        original_tokens=sum(counts),
        compacted_tokens=compacted,
        messages_removed=plan.removed,
        cut_index=plan.cut,
        messages_kept=len(shape.head) + len(shape.kept),
        summarizer_calls=outcome.calls,
        chunks=outcome.chunks,
        updated_previous_summary=outcome.updated_previous,
        forced=plan.forced,
        fallback_used=report.fallback_used,
        summarizer=report.summarizer,
        summarizer_input_tokens=outcome.input_tokens,
        shortened_messages=outcome.shortened,
        over_budget=threshold is not None and compacted > threshold,
        above_landing=landing is not None and compacted > landing,
        summarizer_billed_input_tokens=usage.input_tokens,
        summarizer_output_tokens=usage.output_tokens,
        summarizer_cache_read_tokens=usage.cache_read_input_tokens,
        summarizer_cache_write_tokens=usage.cache_creation_input_tokens,
    )
