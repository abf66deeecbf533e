"""What JSON can carry: the rule for every value that comes from outside.

The API speaks JSON, and what it takes in is stored (as msgpack) and later sent
back out as JSON, over HTTP and server-sent events. So a value from outside (an
HTTP body, a CLI ``--input``, a value given to the client API) must be one that
every reader can read back: no ``NaN`` or ``Infinity`` (not JSON: an SSE stream
carrying them is unreadable, a JSON response cannot be built), no integer the
log cannot hold, no nesting deeper than :data:`MAX_JSON_DEPTH`. Values the
runtime derives itself are not held to this; readers render what JSON cannot
carry as ``null``.
"""

from __future__ import annotations

import math
import re
from typing import Any

import msgspec

from .errors import InvalidPayloadError

MAX_JSON_DEPTH = 64
"""How deeply lists and maps from outside may nest (HTTP bodies, the client API's
values). Deeper values cannot be read back by every reader (recursive
consumers such as the JSON encoder have a stack limit), so they are refused."""

_INT_MIN, _INT_MAX = -(1 << 63), (1 << 64) - 1  # what msgpack, and so the log, can hold

# msgpack bytes that start a map or an array (fixmap, fixarray, array16/32, map16/32),
# and the float markers: a value without enough of them needs no walk.
_CONTAINER_BYTES = bytes([*range(0x80, 0xA0), 0xDC, 0xDD, 0xDE, 0xDF])
_NOT_CONTAINER = bytes(b for b in range(256) if b not in _CONTAINER_BYTES)


def may_be_loose(data: bytes) -> bool:
    """A cheap screen of msgpack bytes: False only if no float and little nesting."""
    if b"\xca" in data or b"\xcb" in data:
        return True
    return len(data.translate(None, _NOT_CONTAINER)) > MAX_JSON_DEPTH


def json_builtins(value: Any, what: str) -> Any:
    """``value`` from outside as plain lists, maps and scalars, checked by
    :func:`check_json_value` (InvalidPayloadError, never a RecursionError)."""
    try:
        plain = msgspec.to_builtins(value)
    except RecursionError:
        raise InvalidPayloadError(
            f"{what} is nested deeper than {MAX_JSON_DEPTH} levels of lists and maps"
        ) from None
    except TypeError as exc:
        raise InvalidPayloadError(f"{what} cannot be encoded: {exc}") from None
    check_json_value(plain, what)
    return plain


def check_json_value(value: Any, what: str, *, max_depth: int = MAX_JSON_DEPTH) -> None:
    """Refuse a value (of plain lists, maps and scalars) that JSON cannot carry.

    NaN and the infinities are not JSON (an SSE stream carrying them is unreadable,
    and a JSON response cannot be built); integers outside -2**63 .. 2**64-1 cannot
    be stored; lists and maps may nest ``max_depth`` levels. Raises
    InvalidPayloadError naming where the value breaks a rule.
    """
    if _json_ok(value, max_depth):
        return
    raise InvalidPayloadError(f"{what}: {_json_problem(value, max_depth)}")


def _json_ok(value: Any, max_depth: int) -> bool:
    """The fast pass: no paths kept (a refused value is walked again to name the spot)."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        kind = type(node)
        if kind is dict or kind is list:
            if depth > max_depth:
                return False
            stack.extend((v, depth + 1) for v in (node.values() if kind is dict else node))
        elif kind is float:
            if not math.isfinite(node):
                return False
        elif kind is int and not _INT_MIN <= node <= _INT_MAX:
            return False
    return True


def _json_problem(value: Any, max_depth: int) -> str:
    stack: list[tuple[Any, int, str]] = [(value, 1, "$")]
    while stack:
        node, depth, path = stack.pop()
        kind = type(node)
        if kind is dict or kind is list:
            if depth > max_depth:
                return f"nested deeper than {max_depth} levels of lists and maps (at {path})"
            items = node.items() if kind is dict else enumerate(node)
            stack.extend(
                (v, depth + 1, f"{path}.{k}" if kind is dict else f"{path}[{k}]") for k, v in items
            )
        elif kind is float and not math.isfinite(node):
            return f"{node} at {path} is not JSON (NaN and Infinity are refused)"
        elif kind is int and not _INT_MIN <= node <= _INT_MAX:
            return f"the integer at {path} is out of range (-2**63 to 2**64-1)"
    return "not JSON"


def decode_json(raw: bytes | str, what: str) -> Any:
    """Strict JSON: what ``json.loads`` would let through and the API could not carry
    (``NaN``, ``Infinity``, integers past 64 bits, deep nesting) is refused with an
    InvalidPayloadError naming ``what``."""
    data = raw.encode() if isinstance(raw, str) else raw
    try:
        value = msgspec.json.decode(data)
    except RecursionError:
        raise InvalidPayloadError(
            f"{what} is nested deeper than {MAX_JSON_DEPTH} levels of lists and maps"
        ) from None
    except msgspec.ValidationError as exc:  # a number too large for any reader
        raise InvalidPayloadError(f"{what} is not valid JSON: {exc}") from None
    except msgspec.DecodeError as exc:
        raise InvalidPayloadError(f"{what} is not JSON: {_decode_error(data, exc)}") from None
    check_json_value(value, what)
    return value


_AT_BYTE = re.compile(r"\(byte (\d+)\)")
# A string escape of half a UTF-16 surrogate pair without its other half (\ud800 not
# followed by \udc00-\udfff, or one of those not after \ud800-\udbff), after an even
# run of backslashes ("\\ud800" is a backslash and the text "ud800").
_LONE_SURROGATE = re.compile(
    rb"(?<!\\)(?:\\\\)*"
    rb"(\\ud[89ab][0-9a-f]{2}(?!\\ud[c-f])|(?<!\\ud[89ab][0-9a-f]{2})\\ud[c-f][0-9a-f]{2})",
    re.IGNORECASE,
)


def _decode_error(raw: bytes, exc: msgspec.DecodeError) -> str:
    """msgspec's message, saying so when the culprit is a JavaScript constant, text
    that is not UTF-8 or half a surrogate pair."""
    match = _AT_BYTE.search(str(exc))
    if match is not None and raw.startswith((b"NaN", b"Infinity"), int(match.group(1))):
        return f"{exc}: NaN and Infinity are not JSON numbers"
    try:
        raw.decode()
    except UnicodeDecodeError as error:
        return f"it is not UTF-8 ({error})"
    lone = _LONE_SURROGATE.search(raw)
    if lone is not None:  # msgspec says "Input data was truncated" for \ud800 alone
        return (
            f"the string escape {lone.group(1).decode()} at byte {lone.start(1)} is half "
            "of a UTF-16 surrogate pair, without its other half: not a Unicode character"
        )
    return str(exc)
