"""Redis stream ids (``<ms>-<seq>``) compare as number pairs, not as strings."""

from __future__ import annotations

ZERO = "0-0"


def parse_id(stream_id: str) -> tuple[int, int]:
    ms, _, seq = stream_id.partition("-")
    return int(ms), int(seq or 0)


def id_gt(a: str, b: str) -> bool:
    if a == b:  # the usual case (e.g. every outbox event delivered): nothing to parse
        return False
    return parse_id(a) > parse_id(b)


def max_id(ids: list[str]) -> str:
    return max(ids, key=parse_id)
