"""Redis replies as Python values: text, stream entries, the metadata hash.

The store decodes what Redis returns here and nowhere else: one helper for text
(:func:`as_str`), one for stream entries (:func:`stream_entries`) and one parse of an
entity's metadata hash into :class:`EntityMeta` (:func:`parse_meta`), so no
caller picks fields out of a ``dict[str, bytes]`` and decodes them ad hoc.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from .streamids import ZERO, id_gt

_ZERO = ZERO.encode()
_STREAM_ID = re.compile(r"\d+-\d+")
_PARTIAL = re.compile(r"\d+-\d+ \d+-\d+")  # field "partial": "<first> <last>"

Entry = tuple[str, dict[bytes, bytes]]
"""A stream entry: its id and its fields."""


def as_str(value: bytes | str) -> str:
    """A reply value as text (the store's connections answer bytes; str passes through)."""
    return value.decode() if isinstance(value, bytes) else value


def registry_text(value: bytes | str) -> str:
    """A member of the worker registry (``<prefix>:workers``), or a lease, as text. Worker ids are
    ASCII; a member that is not UTF-8 (written by hand or a broken tool) is escaped
    rather than raised, so that it cannot stop the lease tick of every worker: it is
    listed by ``wakeful workers`` and leaves the registry when its score expires."""
    if isinstance(value, str):
        return value
    return value.decode(errors="backslashreplace")


def stream_entries(raw: list[Any] | None) -> list[Entry]:
    """Normalise stream entries from a Lua reply ([id, [f, v, ...]]) or redis-py."""
    out: list[Entry] = []
    for entry_id, fields in raw or ():
        if isinstance(fields, list):
            if len(fields) == 2:  # one field (every log entry: "e"): no slices
                fields = {fields[0]: fields[1]}
            else:
                fields = dict(zip(fields[::2], fields[1::2], strict=True))
        out.append((entry_id.decode() if isinstance(entry_id, bytes) else entry_id, fields or {}))
    return out


def text_keys(flat: list[Any]) -> dict[str, Any]:
    """A hash read as a flat reply ``[field, value, ...]`` (HGETALL in a script), its
    fields as text: ``{"cursor": b"1-0", ...}``."""
    names = [f.decode() if isinstance(f, bytes) else f for f in flat[::2]]
    return dict(zip(names, flat[1::2], strict=True))


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
    owner: dict[str, str] | None = None  # the identity that created it (None: none recorded)
    corrupt: str = ""  # fields that could not be read (taken as 0 or replaced), if any
    corrupt_fields: tuple[str, ...] = ()  # their names

    @property
    def parked(self) -> bool:
        return self.status == "failed"

    @property
    def undelivered(self) -> bool:
        """Outbox events are written but not all delivered yet."""
        return id_gt(self.out_last, self.out_done)

    def problems(self) -> list[str]:
        """What is wrong with the stored fields (empty if nothing). Checked when reading
        the metadata failed, not on every wake."""
        return ([self.corrupt] if self.corrupt else []) + self.bad_positions()

    def bad_fields(self) -> list[str]:
        """The names of the fields :meth:`problems` reports."""
        ids = self._positions()
        bad = [*self.corrupt_fields, *(n for n, v in ids.items() if not _STREAM_ID.fullmatch(v))]
        return bad + (["partial"] if self._bad_partial() else [])

    def bad_positions(self) -> list[str]:
        """The stream-id fields (cursor, outbox marks, the ``partial`` mark) that are not
        stream ids."""
        bad = [
            f"field {name!r} is {value!r}, not a stream id"
            for name, value in self._positions().items()
            if not _STREAM_ID.fullmatch(value)
        ]
        if self._bad_partial():
            bad.append(f"field 'partial' is {self.partial!r}, not '<first id> <last id>'")
        return bad

    def _bad_partial(self) -> bool:
        return bool(self.partial) and not _PARTIAL.fullmatch(self.partial)

    def _positions(self) -> dict[str, str]:
        return {
            "cursor": self.cursor,
            "last_in": self.last_input,
            "out_last": self.out_last,
            "out_done": self.out_done,
            "snap_out": self.snapshot_out,
            "snap_upto": self.snapshot_upto or ZERO,
        }


_identity_decoder = msgspec.json.Decoder(dict[str, str])


def parse_identity(raw: bytes) -> dict[str, str]:
    """The ``owner`` field: an identity as JSON text (``keys.identity_text``)."""
    return _identity_decoder.decode(raw)


def parse_meta(fields: dict[str, bytes]) -> EntityMeta | None:
    """The metadata hash as :class:`EntityMeta`; None if it is empty (no such entity).

    Runs on every wake, so each field is decoded inline (one lookup, one decode). A
    field that cannot be read (not a number, not UTF-8) is named in ``corrupt``."""
    if not fields:
        return None
    try:
        return _parse_meta(fields)
    except ValueError:  # a field is corrupted (UnicodeDecodeError is a ValueError too)
        return _parse_meta_carefully(fields)


def unreadable_meta(reason: str) -> EntityMeta:
    """The metadata of an entity whose metadata key cannot be read at all (it holds
    another type): every field empty, ``reason`` in ``corrupt``, so that its status is
    ``failed`` with the reason, like a corrupted field's."""
    return _parse_meta_carefully({}, reason)


def _parse_meta(fields: dict[str, bytes]) -> EntityMeta:
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
        owner=parse_identity(owner) if (owner := get("owner")) else None,
    )


def _parse_meta_carefully(fields: dict[str, bytes], unreadable: str = "") -> EntityMeta:
    """:func:`parse_meta` for a hash with a corrupted field: what cannot be read is
    replaced (text) or taken as 0 (numbers), and named in ``corrupt``."""
    problems: dict[str, str] = {"meta": unreadable} if unreadable else {}

    def text(name: str, default: bytes = b"") -> str:
        raw = fields.get(name) or default
        try:
            return raw.decode()
        except UnicodeDecodeError:
            problems[name] = f"field {name!r} is {raw!r}, not UTF-8"
            return raw.decode(errors="replace")

    def number(name: str) -> int:
        raw = fields.get(name) or b"0"
        try:
            return int(raw)
        except ValueError:
            problems[name] = f"field {name!r} is {raw!r}, not a number"
            return 0

    def owner() -> dict[str, str] | None:
        raw = fields.get("owner")
        try:
            return parse_identity(raw) if raw else None
        except ValueError:
            problems["owner"] = f"field 'owner' is {raw!r}, not an identity"
            return None

    return EntityMeta(
        type=text("type"),
        status=text("status"),
        cursor=text("cursor", _ZERO),
        incarnation=text("created"),
        last_input=text("last_in", _ZERO),
        args=fields.get("args") or b"",
        parent=text("parent") or None,
        out_last=text("out_last", _ZERO),
        out_done=text("out_done", _ZERO),
        snapshot_upto=text("snap_upto") or None,
        snapshot_out=text("snap_out", _ZERO),
        attempts=number("attempts"),
        error=text("error") or None,
        partial=text("partial"),
        awaited_children=number("waiting"),
        timers=number("timers"),
        pending_actions=number("actions"),
        has_pointer=bool(fields.get("woke")),
        owner=owner(),
        corrupt="; ".join(problems.values()),
        corrupt_fields=tuple(problems),
    )
