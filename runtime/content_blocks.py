"""Content blocks a message carries to the model: text, images and documents.

``rt.send(url, "What is this?", content=[attachment("photo.png")])`` (and the
gateway's ``content`` field, and ``wakeful send --file``) give a message blocks in
the Messages API's own shapes. They are checked here before anything is written,
against what the API accepts, so that a block it would refuse never reaches the
journal (where it would fail that run and every later one):

* ``text``: a non-blank ``text``;
* ``image``: a ``base64`` source of ``image/jpeg``, ``image/png``, ``image/gif`` or
  ``image/webp`` whose bytes are that format (the API refuses a mismatch), at most
  5 MB and 8000 px a side; or a ``url`` source (http or https);
* ``document``: a ``base64`` PDF (at most 32 MB and 100 pages), a ``text`` source
  (``text/plain``), or a ``url`` source; with an optional ``title``, ``context`` and
  ``citations: {"enabled": bool}``.

No other key is allowed (``cache_control`` is the runtime's: it places the prompt
cache's breakpoints itself). A refusal is an :class:`InvalidContentError` that names
the block (``content[1]``) and says what is wrong.
"""

from __future__ import annotations

import base64
import binascii
import mimetypes
import os
import re
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .errors import InvalidContentError

__all__ = [
    "IMAGE_MEDIA_TYPES",
    "attachment",
    "check_block",
    "check_content",
    "describe_block",
    "estimate_block_tokens",
]

IMAGE_MEDIA_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
MAX_IMAGE_BYTES = 5 * 1024 * 1024  # the API's limit per image
MAX_IMAGE_SIDE = 8000  # pixels
MAX_PDF_BYTES = 32 * 1024 * 1024  # the API's request limit
MAX_PDF_PAGES = 100
MAX_BLOCKS = 100
MAX_TITLE = 500
IMAGE_TOKENS = 1600  # what the API charges an image at most (it scales larger ones down)
PDF_PAGE_TOKENS = 3000  # a page's text and its image, roughly

_TEXT_TYPES = {".txt": "text/plain", ".md": "text/plain", ".csv": "text/plain"}
_PAGE = re.compile(rb"/Type\s*/Page(?![a-zA-Z])")
_KEYS = {
    "text": {"type", "text"},
    "image": {"type", "source"},
    "document": {"type", "source", "title", "context", "citations"},
}


def check_content(blocks: Any, what: str = "content", *, deep: bool = True) -> list[dict[str, Any]]:
    """``blocks`` as a list of checked block dicts (copies), or an
    :class:`InvalidContentError` naming the first bad one. ``deep=False`` checks the
    shapes only, not the bytes (for content already checked when it was sent)."""
    if not isinstance(blocks, list):
        raise InvalidContentError(
            f"{what} must be a list of content blocks, got {type(blocks).__name__}", what
        )
    if len(blocks) > MAX_BLOCKS:
        raise InvalidContentError(
            f"{what} has {len(blocks)} blocks, over the limit of {MAX_BLOCKS}", what
        )
    return [check_block(block, f"{what}[{i}]", deep=deep) for i, block in enumerate(blocks)]


def check_block(block: Any, where: str, *, deep: bool = True) -> dict[str, Any]:
    """One block, checked (a copy); ``where`` names it in the error."""

    def fail(why: str) -> InvalidContentError:
        return InvalidContentError(f"{where}: {why}", where)

    if not isinstance(block, dict):
        raise fail(f"a content block is an object, got {type(block).__name__}")
    kind = block.get("type")
    if kind not in _KEYS:
        raise fail(
            f"type {kind!r} is not a content block a message may carry (text, image, document)"
        )
    extra = sorted(set(block) - _KEYS[kind])
    if extra:
        cache = " (cache_control is set by the runtime)" if "cache_control" in extra else ""
        raise fail(
            f"unknown key{'s' if len(extra) > 1 else ''} {', '.join(map(repr, extra))} for a {kind} block{cache}"
        )
    if kind == "text":
        text = block.get("text")
        if not isinstance(text, str) or not text.strip():
            raise fail("a text block needs a non-blank 'text'")
        return dict(block)
    source = block.get("source")
    if not isinstance(source, dict):
        raise fail(f"a {kind} block needs a 'source' object")
    checked = _linked_source(source, fail)  # a url or a file: either kind takes them
    if checked is None:
        check_source = _image_source if kind == "image" else _document_source
        checked = check_source(source, deep, fail)
    if kind == "document":
        _document_fields(block, fail)
    return {**block, "source": checked}


def _image_source(
    source: dict[str, Any], deep: bool, fail: Callable[[str], Exception]
) -> dict[str, Any]:
    """An image's source other than a url or a file."""
    kind = source.get("type")
    if kind != "base64":
        raise fail(f"an image source is 'base64', 'url' or 'file', got {kind!r}")
    _only(source, {"type", "media_type", "data"}, "image source", fail)
    media_type = source.get("media_type")
    if media_type not in IMAGE_MEDIA_TYPES:
        raise fail(
            f"media type {media_type!r} is not one the API takes for images "
            f"({', '.join(IMAGE_MEDIA_TYPES)})"
        )
    data = _base64_data(source, deep, "image", fail)
    if data is not None:
        if len(data) > MAX_IMAGE_BYTES:
            raise fail(f"the image is {len(data)} bytes, over the API's {MAX_IMAGE_BYTES}")
        size = image_size(data, media_type)
        if size is None:
            raise fail(f"the data is not a {media_type} image (its bytes do not match)")
        width, height = size
        if max(width, height) > MAX_IMAGE_SIDE or min(width, height) < 1:
            raise fail(
                f"the image is {width}x{height} px; the API takes 1 to {MAX_IMAGE_SIDE} px a side"
            )
    return dict(source)


def _document_source(
    source: dict[str, Any], deep: bool, fail: Callable[[str], Exception]
) -> dict[str, Any]:
    """A document's source other than a url or a file."""
    kind = source.get("type")
    if kind == "content":
        return _content_source(source, deep, fail)
    if kind == "text":
        _only(source, {"type", "media_type", "data"}, "document source", fail)
        if source.get("media_type") != "text/plain":
            raise fail("a text document's media type is 'text/plain'")
        data = source.get("data")
        if not isinstance(data, str) or not data.strip():
            raise fail("a text document needs non-blank 'data'")
        return dict(source)
    if kind != "base64":
        raise fail(
            f"a document source is 'base64' (a PDF), 'text', 'content', 'url' or 'file', "
            f"got {kind!r}"
        )
    _only(source, {"type", "media_type", "data"}, "document source", fail)
    if source.get("media_type") != "application/pdf":
        raise fail(
            f"media type {source.get('media_type')!r}: a base64 document is an "
            "'application/pdf' (send text as a 'text' source)"
        )
    data = _base64_data(source, deep, "document", fail)
    if data is not None:
        if not data.startswith(b"%PDF-"):
            raise fail("the data is not a PDF (it does not start with %PDF-)")
        if len(data) > MAX_PDF_BYTES:
            raise fail(f"the PDF is {len(data)} bytes, over the API's {MAX_PDF_BYTES}")
        pages = len(_PAGE.findall(data))
        if pages > MAX_PDF_PAGES:
            raise fail(f"the PDF has {pages} pages, over the API's {MAX_PDF_PAGES}")
    return dict(source)


def _document_fields(block: dict[str, Any], fail: Callable[[str], Exception]) -> None:
    for name in ("title", "context"):
        value = block.get(name)
        if value is not None and not isinstance(value, str):
            raise fail(f"a document's {name!r} is text, got {type(value).__name__}")
    title = block.get("title")
    if isinstance(title, str) and not 1 <= len(title) <= MAX_TITLE:
        raise fail(f"a document's title is 1 to {MAX_TITLE} characters")
    citations = block.get("citations")
    if citations is not None and (
        not isinstance(citations, dict)
        or set(citations) != {"enabled"}
        or not isinstance(citations["enabled"], bool)
    ):
        raise fail('a document\'s \'citations\' is {"enabled": true} or {"enabled": false}')


def _linked_source(
    source: dict[str, Any], fail: Callable[[str], Exception]
) -> dict[str, Any] | None:
    """A source that points at the bytes (a ``url`` or a ``file``, which an image and a
    document both take), checked; None for a source of another type."""
    kind = source.get("type")
    if kind == "url":
        return _url_source(source, fail)
    if kind == "file":
        return _file_source(source, fail)
    return None


def _url_source(source: dict[str, Any], fail: Callable[[str], Exception]) -> dict[str, Any]:
    _only(source, {"type", "url"}, "url source", fail)
    url = source.get("url")
    if not isinstance(url, str) or not re.fullmatch(r"https?://[^\s/?#]+[^\s]*", url):
        raise fail(f"the source's url {url!r} is not an http or https URL")
    return dict(source)


def _file_source(source: dict[str, Any], fail: Callable[[str], Exception]) -> dict[str, Any]:
    _only(source, {"type", "file_id"}, "file source", fail)
    if not isinstance(source.get("file_id"), str) or not source["file_id"]:
        raise fail("a file source needs a 'file_id'")
    return dict(source)


def _content_source(
    source: dict[str, Any], deep: bool, fail: Callable[[str], Exception]
) -> dict[str, Any]:
    """A document made of blocks: a str, or a list of text and image blocks."""
    _only(source, {"type", "content"}, "content source", fail)
    inner = source.get("content")
    if isinstance(inner, str) and inner.strip():
        return dict(source)
    if not isinstance(inner, list) or not inner:
        raise fail("a content source needs a non-blank str or a list of blocks")
    checked = []
    for i, block in enumerate(inner):
        if not isinstance(block, dict) or block.get("type") not in ("text", "image"):
            raise fail(f"content {i} of a content source is a text or an image block")
        try:
            checked.append(check_block(block, f"content {i}", deep=deep))
        except InvalidContentError as exc:
            raise fail(str(exc)) from None
    return {**source, "content": checked}


def _only(
    source: dict[str, Any], keys: set[str], what: str, fail: Callable[[str], Exception]
) -> None:
    extra = sorted(set(source) - keys)
    if extra:
        raise fail(
            f"unknown key{'s' if len(extra) > 1 else ''} {', '.join(map(repr, extra))} in the {what}"
        )


def _base64_data(
    source: dict[str, Any], deep: bool, what: str, fail: Callable[[str], Exception]
) -> bytes | None:
    """A base64 source's bytes to check (``deep``), or None once ``data`` is known to be
    text (a shallow check: content checked when it was sent)."""
    if deep:
        return _decoded(source.get("data"), fail)
    if not isinstance(source.get("data"), str) or not source["data"]:
        raise fail(f"the {what}'s 'data' must be base64 text")
    return None


def _decoded(data: Any, fail: Callable[[str], Exception]) -> bytes:
    if not isinstance(data, str) or not data:
        raise fail("'data' must be base64 text")
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise fail("'data' is not base64 (standard alphabet, padded, no line breaks)") from None


# -- the bytes of an image -------------------------------------------------------------


def image_size(data: bytes, media_type: str) -> tuple[int, int] | None:
    """``(width, height)`` of an image of ``media_type``, or None if the bytes are not
    one (the header is read, not the whole image)."""
    try:
        if (
            media_type == "image/png"
            and data.startswith(b"\x89PNG\r\n\x1a\n")
            and data[12:16] == b"IHDR"
        ):
            width, height = struct.unpack(">II", data[16:24])
            return int(width), int(height)
        if media_type == "image/gif" and data[:6] in (b"GIF87a", b"GIF89a"):
            width, height = struct.unpack("<HH", data[6:10])
            return int(width), int(height)
        if media_type == "image/webp" and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
            return _webp_size(data)
        if media_type == "image/jpeg" and data.startswith(b"\xff\xd8\xff"):
            return _jpeg_size(data)
    except struct.error:
        return None
    return None


def _webp_size(data: bytes) -> tuple[int, int] | None:
    chunk = data[12:16]
    if chunk == b"VP8 " and data[23:26] == b"\x9d\x01\x2a":
        width, height = struct.unpack("<HH", data[26:30])
        return width & 0x3FFF, height & 0x3FFF
    if chunk == b"VP8L" and data[20:21] == b"\x2f":
        bits = int.from_bytes(data[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X":
        width = int.from_bytes(data[24:27], "little") + 1
        height = int.from_bytes(data[27:30], "little") + 1
        return width, height
    return None


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    i = 2
    while i + 9 < len(data):
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0x01, 0xD8) or 0xD0 <= marker <= 0xD7:  # no length
            i += 2
            continue
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):  # a start of frame
            height, width = struct.unpack(">HH", data[i + 5 : i + 9])
            return int(width), int(height)
        (length,) = struct.unpack(">H", data[i + 2 : i + 4])
        i += 2 + length
    return None


# -- making and reading blocks -----------------------------------------------------------


def attachment(
    source: str | os.PathLike[str] | bytes,
    media_type: str | None = None,
    *,
    title: str | None = None,
) -> dict[str, Any]:
    """A content block for a file (a path) or for bytes: an image (JPEG, PNG, GIF,
    WebP), a PDF document, or a text document (``.txt``, ``.md``, ``.csv`` or
    ``text/plain``). The media type comes from the bytes (or the file's name for
    text) unless given. Checked like any block: a file the API would refuse is an
    :class:`InvalidContentError` naming it."""
    name = "bytes"
    if isinstance(source, bytes):
        data = source
    else:
        path = Path(source)
        name = str(path)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise InvalidContentError(
                f"{name}: cannot read it: {exc.strerror or exc}", name
            ) from None
        if media_type is None:
            media_type = (
                _TEXT_TYPES.get(path.suffix.lower()) or sniff(data) or mimetypes.guess_type(name)[0]
            )
    media_type = media_type or sniff(data)
    usable = media_type is not None and (
        media_type.startswith("image/") or media_type in ("application/pdf", "text/plain")
    )
    if not usable:  # an image of another type is named by the check below
        what = f" (it is {media_type})" if media_type else ""
        raise InvalidContentError(
            f"{name}: not an image (JPEG, PNG, GIF, WebP), a PDF or a text file{what}", name
        )
    assert media_type is not None
    block: dict[str, Any]
    if media_type == "text/plain":
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidContentError(f"{name}: a text document must be UTF-8", name) from None
        block = {
            "type": "document",
            "source": {"type": "text", "media_type": "text/plain", "data": text},
        }
    else:
        encoded = base64.b64encode(data).decode("ascii")
        kind = "document" if media_type == "application/pdf" else "image"
        block = {
            "type": kind,
            "source": {"type": "base64", "media_type": media_type, "data": encoded},
        }
    if title is not None:
        if block["type"] != "document":
            raise InvalidContentError(f"{name}: only a document takes a title", name)
        block["title"] = title
    try:
        [checked] = check_content([block], name)
    except InvalidContentError as exc:
        raise InvalidContentError(str(exc).replace(f"{name}[0]", name), name) from None
    return checked


def sniff(data: bytes) -> str | None:
    """The media type the bytes are, by their signature, if the API takes it."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "image/gif"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    if data.startswith(b"%PDF-"):
        return "application/pdf"
    return None


def describe_block(block: dict[str, Any]) -> str:
    """How a block reads where only text is shown: its text, or ``[image]``,
    ``[document: title]``."""
    kind = block.get("type")
    if kind == "text":
        return str(block.get("text", ""))
    title = block.get("title")
    return f"[{kind}: {title}]" if title else f"[{kind}]"


def estimate_block_tokens(block: dict[str, Any]) -> int | None:
    """Tokens an image or a base64 document costs, roughly (its base64 text would be
    counted at 50 times what the API charges); None for any other block."""
    source = block.get("source") if block.get("type") in ("image", "document") else None
    if not isinstance(source, dict) or source.get("type") != "base64":
        return None
    if block["type"] == "image":
        return IMAGE_TOKENS
    try:
        pages = len(_PAGE.findall(base64.b64decode(source.get("data", ""))))
    except (binascii.Error, ValueError, TypeError):
        pages = 0
    return max(1, pages) * PDF_PAGE_TOKENS
