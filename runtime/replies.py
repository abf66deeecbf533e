"""Redis replies as Python values: text, stream entries, the metadata hash.

The store decodes what Redis returns here and nowhere else: one helper for text
(:func:`as_str`), one for stream entries (:func:`stream_entries`) and one parse of an
entity's metadata hash into :class:`EntityMeta` (:func:`parse_meta`), so no
caller picks fields out of a ``dict[str, bytes]`` and decodes them ad hoc.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .streamids import ZERO, id_gt

Entry = tuple[str, dict[bytes, bytes]]
"""A stream entry: its id and its fields."""


def as_str(value: bytes | str) -> str:
    """A reply value as text (replies are bytes; fakeredis sometimes answers str)."""
    return value.decode() if isinstance(value, bytes) else value


def stream_entries(raw: list[Any] | None) -> list[Entry]:
    """Normalise stream entries from a Lua reply ([id, [f, v, ...]]) or redis-py."""
    out: list[Entry] = []
    for entry_id, fields in raw or ():
        if isinstance(fields, list):
            fields = dict(zip(fields[::2], fields[1::2], strict=True))
        out.append((as_str(entry_id), fields or {}))
    return out


@dataclass(frozen=True, slots=True)
class EntityMeta:
    """An entity's metadata hash (``<prefix>:{pN}:meta:<url>``), parsed.

    Attribute names say what a field holds; the Redis field names stay as they
    are so existing data stays readable (``created`` holds the incarnation id,
    ``last_in`` the last input, ``waiting`` the awaited children, ...).
    """

    type: str
    status: str  # "active", or "failed" (parked)
    cursor: str  # the last log entry the entity has handled
    incarnation: str  # field "created": the id of the Created event of this incarnation
    last_input: str  # field "last_in"
    args: bytes  # packed creation args (b"" if none)
    parent: str | None
    out_last: str  # the last outbox event
    out_done: str  # the last outbox event delivered
    snapshot_upto: str | None  # field "snap_upto": the snapshot holds events up to here
    snapshot_out: str  # field "snap_out": and outputs up to here
    attempts: int  # failed attempts at the current inputs
    error: str | None  # why the entity is parked
    partial: str  # "<first> <last>" inputs of an attempt whose effects began
    awaited_children: int  # field "waiting"
    timers: int  # pending timers
    pending_actions: int  # field "actions": tool calls waiting for an answer
    has_pointer: bool  # field "woke": a wake pointer is pending in the inbox

    @property
    def parked(self) -> bool:
        return self.status == "failed"

    @property
    def undelivered(self) -> bool:
        """Outbox events are written but not all delivered yet."""
        return id_gt(self.out_last, self.out_done)


def _field(fields: dict[str, bytes], name: str) -> str:
    value = fields.get(name)
    return as_str(value) if value else ""


def _number(fields: dict[str, bytes], name: str) -> int:
    return int(fields.get(name) or 0)


def parse_meta(fields: dict[str, bytes]) -> EntityMeta | None:
    """The metadata hash as :class:`EntityMeta`; None if it is empty (no such entity)."""
    if not fields:
        return None
    return EntityMeta(
        type=_field(fields, "type"),
        status=_field(fields, "status"),
        cursor=_field(fields, "cursor") or ZERO,
        incarnation=_field(fields, "created"),
        last_input=_field(fields, "last_in") or ZERO,
        args=fields.get("args") or b"",
        parent=_field(fields, "parent") or None,
        out_last=_field(fields, "out_last") or ZERO,
        out_done=_field(fields, "out_done") or ZERO,
        snapshot_upto=_field(fields, "snap_upto") or None,
        snapshot_out=_field(fields, "snap_out") or ZERO,
        attempts=_number(fields, "attempts"),
        error=_field(fields, "error") or None,
        partial=_field(fields, "partial"),
        awaited_children=_number(fields, "waiting"),
        timers=_number(fields, "timers"),
        pending_actions=_number(fields, "actions"),
        has_pointer=bool(fields.get("woke")),
    )
