"""Redis replies as Python values: text, stream entries, the metadata hash.

The store decodes what Redis returns here and nowhere else: one helper for text
(:func:`as_str`), one for stream entries (:func:`stream_entries`) and one parse of an
entity's metadata hash into :class:`EntityMeta` (:func:`parse_meta`), so no
caller picks fields out of a ``dict[str, bytes]`` and decodes them ad hoc.
"""

from __future__ import annotations

from typing import Any

import msgspec

from .streamids import ZERO, id_gt

_ZERO = ZERO.encode()

Entry = tuple[str, dict[bytes, bytes]]
"""A stream entry: its id and its fields."""


def as_str(value: bytes | str) -> str:
    """A reply value as text (the store's connections answer bytes; str passes through)."""
    return value.decode() if isinstance(value, bytes) else value


def stream_entries(raw: list[Any] | None) -> list[Entry]:
    """Normalise stream entries from a Lua reply ([id, [f, v, ...]]) or redis-py."""
    out: list[Entry] = []
    for entry_id, fields in raw or ():
        if isinstance(fields, list):
            fields = dict(zip(fields[::2], fields[1::2], strict=True))
        out.append((as_str(entry_id), fields or {}))
    return out


class EntityMeta(msgspec.Struct, frozen=True):
    """An entity's metadata hash (``<prefix>:{pN}:meta:<url>``), parsed.

    Attribute names say what a field holds; the Redis field names stay as they
    are so existing data stays readable (``created`` holds the incarnation id,
    ``last_in`` the last input, ``waiting`` the awaited children, ...). A
    struct, not a dataclass: it is built on every wake, and a frozen dataclass
    takes about twenty times as long to construct.
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


def parse_meta(fields: dict[str, bytes]) -> EntityMeta | None:
    """The metadata hash as :class:`EntityMeta`; None if it is empty (no such entity).

    Runs on every wake, so each field is decoded inline (one lookup, one decode)."""
    if not fields:
        return None
    get = fields.get
    return EntityMeta(
        type=(get("type") or b"").decode(),
        status=(get("status") or b"").decode(),
        cursor=(get("cursor") or _ZERO).decode(),
        incarnation=(get("created") or b"").decode(),
        last_input=(get("last_in") or _ZERO).decode(),
        args=get("args") or b"",
        parent=(get("parent") or b"").decode() or None,
        out_last=(get("out_last") or _ZERO).decode(),
        out_done=(get("out_done") or _ZERO).decode(),
        snapshot_upto=(get("snap_upto") or b"").decode() or None,
        snapshot_out=(get("snap_out") or _ZERO).decode(),
        attempts=int(get("attempts") or 0),
        error=(get("error") or b"").decode() or None,
        partial=(get("partial") or b"").decode(),
        awaited_children=int(get("waiting") or 0),
        timers=int(get("timers") or 0),
        pending_actions=int(get("actions") or 0),
        has_pointer=bool(get("woke")),
    )
