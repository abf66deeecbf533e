"""What the gateway reads from a request: bodies, query parameters and headers, strictly.

Every malformed input is refused here with an :class:`HTTPError` (400, or 413
for a body over the limit, 415 for a body not sent as JSON) that names the
input and what is wrong, before the gateway writes anything or starts a stream:

* a body is read against its limit as it arrives (a ``Content-Length`` over it
  is refused before a byte is read), and must be strict JSON (no ``NaN`` or
  ``Infinity``, integers that the log can hold, at most ``MAX_JSON_DEPTH``
  levels of nesting) holding an object;
* a number in the query is ASCII digits in its range (``?tail=²`` is not one);
* a resume position (``Last-Event-ID`` or ``?after=``) is ``<log id>|<live id>``
  of stream ids, either part empty; a listing's ``?after=`` is an entity url.
"""

from __future__ import annotations

import re
from typing import Any

from starlette.requests import ClientDisconnect, Request

from .errors import HTTPError, InvalidEventError, InvalidPayloadError, InvalidUrlError
from .json_values import decode_json
from .streamids import is_stream_id
from .urls import parse_url

_DIGITS = re.compile(r"[0-9]{1,9}")
_LENGTH = re.compile(r"[0-9]{1,20}")


async def read_body(request: Request, max_bytes: int) -> dict[str, Any]:
    """The request's JSON object (``{}`` for an empty body)."""
    # Only JSON: a browser sends a cross-site form or text/plain POST without asking,
    # but must ask (CORS preflight, which the gateway never grants) before sending JSON.
    media_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if media_type != "application/json":
        raise HTTPError(
            415,
            "UnsupportedMediaType",
            f"send the body as JSON with Content-Type: application/json "
            f"(got {media_type or 'no content type'})",
        )
    raw = await _read_limited(request, max_bytes)
    if not raw:
        return {}
    data = parse_json(raw, "request body")
    if not isinstance(data, dict):
        raise HTTPError(400, "MalformedJSON", "request body must be a JSON object")
    return data


async def _read_limited(request: Request, max_bytes: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None:
        if not _LENGTH.fullmatch(declared.strip()):
            raise HTTPError(400, "BadHeader", f"Content-Length {declared!r} is not a number")
        if int(declared) > max_bytes:  # refused before a byte of it is read
            raise HTTPError(
                413, "BodyTooLarge", f"request body is {int(declared)} bytes, over {max_bytes}"
            )
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in request.stream():
            size += len(chunk)
            if size > max_bytes:
                raise HTTPError(413, "BodyTooLarge", f"request body is over {max_bytes} bytes")
            chunks.append(chunk)
    except ClientDisconnect:  # nobody is left to answer; nothing was written
        raise HTTPError(400, "ClientDisconnected", "the client left before its body") from None
    return b"".join(chunks)


def parse_json(raw: bytes, what: str) -> Any:
    """Strict JSON (json_values.decode_json), a 400 naming what is wrong otherwise."""
    try:
        return decode_json(raw, what)
    except InvalidPayloadError as exc:
        raise HTTPError(400, "MalformedJSON", str(exc)) from None


def message_fields(data: dict[str, Any]) -> dict[str, Any]:
    """The message a ``POST .../messages`` body sends: a ``payload``, ``content``
    blocks, or both (the blocks themselves are checked by ``Runtime.send``: a bad one
    is a 422 naming it, ``content[1]``, before anything is written)."""
    if "payload" not in data and "content" not in data:
        raise HTTPError(400, "MissingField", "the body needs a 'payload' or 'content' blocks")
    content = data.get("content")
    if "content" in data and not isinstance(content, list):
        raise HTTPError(
            422,
            "InvalidContentError",
            f"content must be a list of content blocks, got {type(content).__name__}",
        )
    return {
        "payload": data.get("payload"),
        "client_data": data.get("client_data"),
        "client_tools": data.get("client_tools"),
        "content": content,
    }


def text_field(data: dict[str, Any], name: str, url: str) -> str | None:
    """The body's ``name`` (a ``reason``, an ``error``) for ``url``: a string, or None
    when it is absent or null. Anything else is a 400 ``InvalidEventError`` naming the
    field, as the runtime refuses it: never made into text (``str(123)`` would tell
    the model "denied: 123", and ``str(None)`` "denied: None")."""
    value = data.get(name)
    if value is None or isinstance(value, str):
        return value
    kind = type(value).__name__
    raise InvalidEventError(f"field {name!r} for {url} must be a string, got {kind}", name)


def query_int(request: Request, name: str, default: int, low: int, high: int) -> int:
    """The query parameter ``name`` as a whole number in ``low..high``."""
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if not _DIGITS.fullmatch(raw) or not low <= int(raw) <= high:
        raise HTTPError(
            400, "BadQuery", f"{name} must be a whole number between {low} and {high}, got {raw!r}"
        )
    return int(raw)


def query_url(request: Request, name: str) -> str:
    """The query parameter ``name`` as an entity url (a listing's ``?after=<last url>``),
    ``""`` when it is absent or empty."""
    raw = request.query_params.get(name, "")
    if raw:
        try:
            parse_url(raw)
        except InvalidUrlError as exc:
            raise HTTPError(
                400, "BadQuery", f"{name} {raw!r} is not an entity url: {exc.reason}"
            ) from None
    return raw


_TRUE = ("1", "true")
_FALSE = ("0", "false")


def query_flag(request: Request, name: str, default: bool) -> bool:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    if raw.lower() in _TRUE:
        return True
    if raw.lower() in _FALSE:
        return False
    raise HTTPError(400, "BadQuery", f"{name} must be 1, 0, true or false, got {raw!r}")


def resume_position(request: Request) -> tuple[str | None, str | None]:
    """Where an event stream resumes: ``Last-Event-ID`` (or ``?after=``) is
    ``<log id>|<live id>``, the positions after the last event seen."""
    header = request.headers.get("last-event-id")
    what, cursor = (
        ("Last-Event-ID", header) if header else ("after", request.query_params.get("after"))
    )
    if not cursor:
        return None, None
    log_id, _, live_id = cursor.partition("|")
    for part in (log_id, live_id):
        if part and not is_stream_id(part):
            raise HTTPError(
                400,
                "BadQuery" if what == "after" else "BadHeader",
                f"{what} {cursor!r} is not a position: expected <log id>|<live id> "
                "of event ids like 1700000000000-0 (either may be empty)",
            )
    return log_id or None, live_id or None
