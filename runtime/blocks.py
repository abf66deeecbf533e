"""Checking content blocks before they are journaled.

A block in the journal is sent to the model with every later request of the
conversation, so one the Messages API refuses (an ``image/svg+xml`` image, an empty
text, a 30 MB picture) would fail that run and every one after it. What a tool
returns for the model (its content, ``to_model_output``) is checked here first:
a block that does not pass is a bug of the tool, reported as one (the model gets an
error result, the operator the full error), and never journaled.

Checked: the block types a tool result may hold (``text``, ``image``, ``document``,
``search_result``); text that is a non-blank string; image sources (base64 of
``image/jpeg``, ``image/png``, ``image/gif`` or ``image/webp`` whose bytes are of
that type, at most :data:`MAX_IMAGE_BYTES` decoded; an ``http(s)`` url; a file id);
document sources (base64 PDF up to :data:`MAX_DOCUMENT_BYTES`, plain text, content
blocks, a url, a file id); and tool names against the API's rule
``^[a-zA-Z0-9_-]{1,64}$``.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from typing import Any

from .errors import InvalidBlockError, ToolContractError

__all__ = [
    "IMAGE_TYPES",
    "MAX_DOCUMENT_BYTES",
    "MAX_IMAGE_BYTES",
    "TOOL_NAME",
    "check_block",
    "check_tool_name",
    "model_blocks",
]

TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")  # the Messages API's rule for tool names
MAX_IMAGE_BYTES = 5 * 1024 * 1024  # the API's limit for one image
MAX_DOCUMENT_BYTES = 32 * 1024 * 1024  # the API's limit for a PDF request
# The first bytes of each accepted image type: the API refuses data of another type.
IMAGE_TYPES: dict[str, tuple[bytes, ...]] = {
    "image/jpeg": (b"\xff\xd8\xff",),
    "image/png": (b"\x89PNG\r\n\x1a\n",),
    "image/gif": (b"GIF87a", b"GIF89a"),
    "image/webp": (b"RIFF",),  # then 4 bytes of size and b"WEBP" (checked below)
}
_RESULT_TYPES = ("text", "image", "document", "search_result")


def check_tool_name(name: object) -> None:
    """Raise :class:`ToolContractError` unless ``name`` is a tool name the API takes."""
    if not isinstance(name, str) or not TOOL_NAME.fullmatch(name):
        raise ToolContractError(
            f"tool name {name!r} is not accepted by the Messages API: it must be 1 to 64 "
            "letters, digits, '_' or '-'"
        )


def model_blocks(content: object) -> list[dict[str, Any]]:
    """A tool's content for the model as checked blocks: a str is one text block, a
    single block dict is a list of one (``to_model_output`` may return "an image
    block"), a list is checked block by block. Raises :class:`InvalidBlockError`
    naming the block and why."""
    if isinstance(content, str):
        return [{"type": "text", "text": content or "(empty)"}]
    if isinstance(content, Mapping):
        content = [content]
    if not isinstance(content, list | tuple):
        raise InvalidBlockError(
            f"tool content must be a str, a content block (a dict) or a list of blocks, "
            f"not {type(content).__name__}"
        )
    if not content:
        return [{"type": "text", "text": "(empty)"}]
    blocks = []
    for i, block in enumerate(content):
        check_block(block, f"block {i}", allowed=_RESULT_TYPES)
        blocks.append(dict(block))
    return blocks


def check_block(block: object, where: str, *, allowed: tuple[str, ...] = _RESULT_TYPES) -> None:
    """Raise :class:`InvalidBlockError` (naming ``where``) unless the API takes ``block``."""
    if not isinstance(block, Mapping):
        raise InvalidBlockError(f"{where} is a {type(block).__name__}, not a content block dict")
    kind = block.get("type")
    if kind not in allowed:
        raise InvalidBlockError(
            f"{where} has type {kind!r}; a tool result holds blocks of type {', '.join(allowed)}"
        )
    if kind == "text":
        _text(block.get("text"), f"{where} (text)")
    elif kind == "image":
        _image_source(block.get("source"), f"{where} (image)")
    elif kind == "document":
        _document_source(block.get("source"), f"{where} (document)")
    elif kind == "search_result":
        for key in ("source", "title"):
            if not isinstance(block.get(key), str) or not block[key]:
                raise InvalidBlockError(f"{where} (search_result) needs a non-empty {key!r}")
        inner = block.get("content")
        if not isinstance(inner, list) or not inner:
            raise InvalidBlockError(f"{where} (search_result) needs a list of text blocks")
        for j, item in enumerate(inner):
            check_block(item, f"{where} content {j}", allowed=("text",))


def _text(text: object, where: str) -> None:
    if not isinstance(text, str) or not text.strip():
        raise InvalidBlockError(f"{where}: the text must be a non-blank string, got {text!r:.40}")


def _source(source: object, where: str) -> Mapping[str, Any]:
    if not isinstance(source, Mapping):
        raise InvalidBlockError(f"{where} needs a 'source' dict")
    return source


def _decoded(data: object, where: str, limit: int) -> bytes:
    if not isinstance(data, str) or not data:
        raise InvalidBlockError(f"{where}: 'data' must be a non-empty base64 string")
    if len(data) > (limit + 2) // 3 * 4 + 4:  # before decoding: the size tells already
        raise InvalidBlockError(
            f"{where}: about {len(data) * 3 // 4} bytes, over the limit of {limit} bytes"
        )
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise InvalidBlockError(f"{where}: 'data' is not valid base64 ({exc})") from None
    if len(raw) > limit:
        raise InvalidBlockError(f"{where}: {len(raw)} bytes, over the limit of {limit} bytes")
    return raw


def _remote(source: Mapping[str, Any], where: str) -> bool:
    """Check a url or file source; False if ``source`` is neither."""
    kind = source.get("type")
    if kind == "url":
        url = source.get("url")
        if not isinstance(url, str) or not url.startswith(("https://", "http://")):
            raise InvalidBlockError(f"{where}: a url source needs an http(s) 'url', got {url!r}")
        return True
    if kind == "file":
        if not isinstance(source.get("file_id"), str) or not source["file_id"]:
            raise InvalidBlockError(f"{where}: a file source needs a 'file_id'")
        return True
    return False


def _image_source(source: object, where: str) -> None:
    source = _source(source, where)
    if _remote(source, where):
        return
    if source.get("type") != "base64":
        raise InvalidBlockError(
            f"{where}: source type {source.get('type')!r}; expected base64, url or file"
        )
    media_type = source.get("media_type")
    if media_type not in IMAGE_TYPES:
        raise InvalidBlockError(
            f"{where}: media type {media_type!r} is not accepted; the API takes "
            f"{', '.join(IMAGE_TYPES)}"
        )
    raw = _decoded(source.get("data"), where, MAX_IMAGE_BYTES)
    signature = raw.startswith(IMAGE_TYPES[media_type])
    if media_type == "image/webp":
        signature = signature and raw[8:12] == b"WEBP"
    if not signature:
        raise InvalidBlockError(f"{where}: the data is not a {media_type} image")


def _document_source(source: object, where: str) -> None:
    source = _source(source, where)
    if _remote(source, where):
        return
    kind = source.get("type")
    if kind == "base64":
        if source.get("media_type") != "application/pdf":
            raise InvalidBlockError(
                f"{where}: base64 documents must be application/pdf, "
                f"not {source.get('media_type')!r}"
            )
        raw = _decoded(source.get("data"), where, MAX_DOCUMENT_BYTES)
        if not raw.startswith(b"%PDF"):
            raise InvalidBlockError(f"{where}: the data is not a PDF")
    elif kind == "text":
        if source.get("media_type") != "text/plain":
            raise InvalidBlockError(f"{where}: a text source must be text/plain")
        _text(source.get("data"), where)
    elif kind == "content":
        inner = source.get("content")
        if isinstance(inner, str):
            _text(inner, where)
        elif isinstance(inner, list) and inner:
            for j, item in enumerate(inner):
                check_block(item, f"{where} content {j}", allowed=("text", "image"))
        else:
            raise InvalidBlockError(f"{where}: a content source needs a str or a list of blocks")
    else:
        raise InvalidBlockError(
            f"{where}: source type {kind!r}; expected base64, text, content, url or file"
        )
