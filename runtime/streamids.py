"""Redis stream ids (``<ms>-<seq>``) compare as number pairs, not as strings."""

from __future__ import annotations

import re

from .errors import WakefulError

ZERO = "0-0"
_ID = re.compile(r"([0-9]{1,20})(?:-([0-9]{1,20}))?")
_U64 = (1 << 64) - 1  # each part of an id is an unsigned 64-bit number


def is_stream_id(text: str, *, seq_optional: bool = False) -> bool:
    """Whether ``text`` is a stream id Redis reads from: ``<ms>-<seq>``, both parts
    decimal and within 64 bits (``<ms>`` alone too with ``seq_optional``). A longer
    number passes a digits-only pattern, and Redis then refuses the read with
    ``Invalid stream ID``, as an error of the server instead of the input."""
    match = _ID.fullmatch(text)
    if match is None or (match.group(2) is None and not seq_optional):
        return False
    return all(int(part) <= _U64 for part in match.groups() if part is not None)


def check_position(value: str | None, name: str) -> None:
    """Refuse a position to read after (``after``, ``live_after``) that is not a
    stream id, naming it, before Redis is asked."""
    if value is not None and not is_stream_id(value, seq_optional=True):
        raise WakefulError(f"{name} {value!r} is not an event id (like 1700000000000-0)")


def parse_id(stream_id: str) -> tuple[int, int]:
    ms, _, seq = stream_id.partition("-")
    return int(ms), int(seq or 0)


def id_gt(a: str, b: str) -> bool:
    if a == b:  # the usual case (e.g. every outbox event delivered): nothing to parse
        return False
    return parse_id(a) > parse_id(b)


def max_id(ids: list[str]) -> str:
    return max(ids, key=parse_id)
