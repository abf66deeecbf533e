"""The state fold: an entity's log entries, decoded and folded into its state, once.

The worker folds the log tail before each wake, and the client folds the whole
log to answer ``state``/``history``/``children``. Both must agree entry for entry
(which entries count as inputs after the cursor, which undecodable entries an
operator skipped), so they share :func:`rebuild`. It lives beside the state (not
in the worker) because the client, a layer above the worker, needs it too.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import EventDecodeError, SnapshotError, UnreadableHistoryError
from .events import Event, LogRecord, Resumed, decode_entry
from .state import EntityState
from .streamids import ZERO, id_gt

log = logging.getLogger("wakeful.fold")

Entry = tuple[str, dict[bytes, bytes]]


@dataclass(slots=True)
class Rebuilt:
    """The outcome of a fold.

    ``records`` has one record per entry, in log order (an undecodable entry is a
    bare :class:`Event` placeholder, so the last record is the last entry read);
    ``inputs`` are the decoded inputs after the cursor; ``undecodable`` are the
    entries after the cursor that failed to decode (not yet handled: the wake
    parks on them); ``handled_undecodable`` those at or before it.
    """

    state: EntityState
    records: list[LogRecord]
    inputs: list[LogRecord]
    undecodable: list[EventDecodeError]
    handled_undecodable: list[EventDecodeError]


def initial_state(
    collections: dict[str, Any],
    snapshot: bytes | None,
    snapshot_out: str,
    chunks: Mapping[bytes, bytes] | None = None,
    url: str = "",
) -> EntityState:
    """The state to fold from: the snapshot (with the conversation chunks it references,
    read in the same script) if there is one, else empty collections."""
    if snapshot:
        try:
            return EntityState.from_snapshot(snapshot, collections, snapshot_out or ZERO, chunks)
        except SnapshotError as exc:  # name the entity
            raise type(exc)(exc.reason, url) from None
    return EntityState(collections)


def rebuild(url: str, state: EntityState, entries: list[Entry], cursor: str) -> Rebuilt:
    """Fold ``entries`` (in log order) into ``state``; collect the inputs after ``cursor``."""
    cursor = cursor or ZERO
    out = Rebuilt(state, [], [], [], [])
    for entry_id, fields in entries:
        try:
            record = decode_entry(entry_id, fields, url)
        except EventDecodeError as exc:
            (out.undecodable if id_gt(entry_id, cursor) else out.handled_undecodable).append(exc)
            out.records.append(LogRecord(entry_id, Event()))
            continue
        out.records.append(record)
        state.fold(entry_id, record.event, len(fields.get(b"e", b"")))
        if record.event.is_input and id_gt(entry_id, cursor):
            out.inputs.append(record)
    return out


def check_skipped(undecodable: list[EventDecodeError], records: list[LogRecord]) -> None:
    """An undecodable entry at or before the cursor may only be one an operator skipped
    (``resume(skip_failed=True)`` lists it in a ``resumed`` event). Anything else, such
    as a state event written by a newer version, leaves the state unknown: raise."""
    if not undecodable:
        return
    skipped = {i for r in records if isinstance(r.event, Resumed) for i in r.event.skipped}
    unexpected = [exc for exc in undecodable if exc.stream_id not in skipped]
    for exc in undecodable:
        if exc.stream_id in skipped:
            log.info("skipping dead-lettered undecodable event %s of %s", exc.stream_id, exc.url)
    if unexpected:
        raise UnreadableHistoryError(unexpected)
