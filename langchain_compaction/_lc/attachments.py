"""Attachments in LangChain content: images, files and documents, as the core counts and shows them.

An image or a binary file is never carried: the summarizer is told its kind,
media type and link, and it is counted at a fixed cost, or at a PDF's pages
(``core.tokens.pdf_tokens``). A document that holds text (Anthropic's
``document`` block with a ``text`` or ``content`` source, LangChain's
``text-plain`` block) is text the model reads: it is counted by its text and
shown to the summarizer whole, labelled as a document (quoted material, so
checked facts never take it for the user's own words).
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from langchain_compaction.core.tokens import pdf_tokens
from langchain_compaction.core.types import Part

ATTACHMENT_BLOCKS = frozenset(
    {
        "image",
        "image_url",
        "input_image",
        "file",
        "input_file",
        "audio",
        "video",
        "document",
        "input_audio",
        "text-plain",
        "media",
    }
)
"""Content block types that attach something rather than say it (``input_file``: OpenAI's Responses API;
``media``: langchain-google-genai's inline or linked image, audio, video or PDF)."""

_FILES = frozenset({"document", "file", "input_file", "media"})
"""The kinds that may hold a PDF, whose pages are counted."""


def attachment_part(block: dict[str, Any], kind: str) -> Part:
    """The part an attachment block becomes: its text when it holds text, else a description with its cost."""
    source = _source(block)
    title = block.get("title")
    media = block.get("mime_type") or block.get("media_type") or source.get("media_type")
    text = _document_text(block, kind, source, media)
    if text is not None:
        label = ", ".join(str(p) for p in (title, media) if p)
        return Part("data", f"[document{': ' + label if label else ''}]\n{text}")
    tokens = 0
    if kind in _FILES and media in ("application/pdf", None):
        # (Only a file that is or may be a PDF is decoded: an image never is.)
        data = _payload(block, source)
        if data is not None and data[:5] == b"%PDF-":
            tokens = pdf_tokens(data)
    return Part("image", _describe(block, kind, source, media), tokens)


def lifted(value: Any, found: list[Part], depth: int = 0) -> Any:
    """``value`` (an unknown block's JSON) with each attachment nested in it taken out, its part put in ``found``.

    A screenshot inside a ``tool_result`` of a user turn (Anthropic's
    computer use, as ``convert_to_messages`` reads it), a v1 ``non_standard``
    block or an OpenAI ``function_call_output`` costs an attachment, not its
    base64 counted as text, and is described after the block.
    """
    if depth > _NESTING or not isinstance(value, (dict, list)):
        return value
    if isinstance(value, list):
        return [lifted(item, found, depth + 1) for item in value]
    kind = value.get("type")
    # (Only one that carries its bytes: a tool's listing of {"type": "file", "path": ...} is text to read.)
    if depth and isinstance(kind, str) and kind in ATTACHMENT_BLOCKS and _carries_bytes(value):
        found.append(attachment_part(value, kind))
        return "(attachment, after this block)"
    return {key: lifted(item, found, depth + 1) for key, item in value.items()}


def _carries_bytes(block: dict[str, Any]) -> bool:
    """Whether an attachment block holds its bytes inline (base64 or a data: URL), not a link or an id."""
    source, nested, image_url = _source(block), block.get("file"), block.get("image_url")
    data = (block.get("base64"), block.get("data"), source.get("data"))
    urls = (
        block.get("url"),
        block.get("file_data"),
        nested.get("file_data") if isinstance(nested, dict) else None,
        image_url.get("url") if isinstance(image_url, dict) else image_url,
    )
    return any(isinstance(d, (str, bytes)) and d for d in data) or any(
        isinstance(u, str) and u.startswith("data:") for u in urls
    )


_NESTING = 8
"""How deep an unknown block is searched for attachments."""


def _describe(block: dict[str, Any], kind: str, source: dict[str, Any], media: object) -> str:
    """What the summarizer is told about an attachment: its kind, media type, name and URL (never inline data)."""
    image_url = block.get("image_url")
    candidates = (
        block.get("url"),
        image_url.get("url") if isinstance(image_url, dict) else image_url,
        source.get("url"),
        block.get("file_url"),
        block.get("file_uri"),
    )
    # A link the agent can refer to later; a data: URL is the payload itself.
    url = next((u for u in candidates if isinstance(u, str) and u.startswith(("http://", "https://"))), None)
    # The name the user gave it ("which report did I send?"): LangChain's, OpenAI's nested file, a document's title.
    nested = block.get("file")
    names = (block.get("filename"), nested.get("filename") if isinstance(nested, dict) else None, block.get("title"))
    name = next((n for n in names if isinstance(n, str) and n.strip()), None)
    return " ".join(str(p) for p in (kind, media, name, url) if p)


def _source(block: dict[str, Any]) -> dict[str, Any]:
    raw = block.get("source")
    return raw if isinstance(raw, dict) else {}


def _document_text(block: dict[str, Any], kind: str, source: dict[str, Any], media: object) -> str | None:
    """The text a document block holds (``None`` for a binary file, a link or a file id)."""
    if kind == "text-plain" or (kind == "file" and block.get("source_type") == "text"):
        # (LangChain's older plain-text file keeps its text under "text", or
        # "url" as langchain-core reads it: ChatAnthropic sends it as a text document.)
        older = block.get("url") if kind == "file" else None  # (a text-plain block's url is a link)
        text = next((t for t in (block.get("text"), older) if isinstance(t, str)), None)
        if text is not None:
            return text
        data = _decoded(block.get("base64"))
        return data.decode("utf-8", "replace") if data is not None else None
    if kind in _FILES and isinstance(media, str) and media.startswith("text/"):
        # A text file sent inline (base64) is read as the text it is.
        data = _payload(block, source)
        if data is not None:
            return data.decode("utf-8", "replace")
    if kind != "document":
        return None
    if source.get("type") == "text" and isinstance(source.get("data"), str):
        return str(source["data"])
    content = source.get("content") if source.get("type") == "content" else None
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [b.get("text") for b in content if isinstance(b, dict) and b.get("type") == "text"]
        return "\n".join(t for t in texts if isinstance(t, str))
    return None


def _payload(block: dict[str, Any], source: dict[str, Any]) -> bytes | None:
    """The bytes of a file sent inline (Anthropic's base64 source, LangChain's ``base64`` or ``data``, a data: URL)."""
    if source.get("type") == "base64":
        return _decoded(source.get("data"))
    if block.get("source_type") == "base64":  # (LangChain's older blocks: ``data`` beside ``source_type``)
        return _decoded(block.get("data"))
    if isinstance(block.get("base64"), str):
        return _decoded(block["base64"])
    if block.get("type") == "media":  # (Gemini's: base64 text, or the bytes themselves)
        data = block.get("data")
        return bytes(data) if isinstance(data, (bytes, bytearray)) else _decoded(data)
    nested = block.get("file")
    url = block.get("file_data") or (nested.get("file_data") if isinstance(nested, dict) else None)
    if isinstance(url, str) and url.startswith("data:") and ";base64," in url:
        return _decoded(url.split(";base64,", 1)[1])
    return None


def _decoded(data: Any) -> bytes | None:
    if not isinstance(data, str):
        return None
    try:
        return base64.b64decode(data, validate=False)
    except (binascii.Error, ValueError):
        return None
