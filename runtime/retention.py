"""Log retention: an entity's log keeps what a guarantee needs and the retention window.

After a wake writes a snapshot, the partition owner trims the entity's log of the
entries the snapshot covers (the fenced TRIM script, ``lua.py``); entries that must
wait for the retention window are trimmed later by the worker's sweep
(:mod:`wakeful.sweep`), even if the entity never wakes again. The script keeps
every entry after the snapshot's position or the cursor, every undelivered outbox,
the entries younger than ``retention_s`` and the newest ``retention_entries``; a
parked entity keeps its whole log. Pending actions, timers, the open run's journal
and the agent conversation are not read from the log at all: they live in the
snapshot's state (and the actions hash, the timer set), so no trim can lose them.

Before entries go, an optional exporter gets them (:data:`Exporter`; a JSON Lines
file per entity with ``archive_dir``), so an audit trail can outlive Redis. Export
is at least once: a crash between the export and the trim exports the same entries
again at the next snapshot, each line carrying its entry id. A failed export keeps
the log as it is (nothing is trimmed that the exporter did not take).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import quote

from .config import Settings
from .errors import ArchiveError, EventDecodeError, FencedError, RedisFullError
from .events import decode_entry, plain
from .replies import Entry
from .store import TRANSIENT_ERRORS, Store, Trimmed
from .streamids import id_gt
from .ticket import WakeTicket

log = logging.getLogger("wakeful.retention")

Exporter = Callable[[str, list[dict[str, Any]]], Awaitable[None]]
"""``await exporter(url, records)``: the entries about to be trimmed from ``url``'s
log, oldest first, as JSON-ready records (see :func:`entry_record`). Raising keeps
them in the log."""

_PAGE = 1000  # entries per read when exporting
# Errors after which the log stays as it is until the next snapshot: nothing is lost.
_LATER: tuple[type[BaseException], ...] = (FencedError, RedisFullError, *TRANSIENT_ERRORS)


def entry_record(url: str, entry_id: str, fields: dict[bytes, bytes]) -> dict[str, Any]:
    """One log entry as a JSON-ready record: ``{"url", "id", "kind", "event"}``; an entry
    that does not decode keeps its raw bytes as hex under ``"raw"`` and says why."""
    try:
        event = decode_entry(entry_id, fields, url).event
    except EventDecodeError as exc:
        return {
            "url": url,
            "id": entry_id,
            "kind": "undecodable",
            "error": exc.reason,
            "raw": fields.get(b"e", b"").hex(),
        }
    data = plain(event)
    return {"url": url, "id": entry_id, "kind": data.get("t", "?"), "event": data}


def json_lines(records: Iterable[dict[str, Any]]) -> str:
    """Records as JSON Lines (one object a line, each ending in a newline)."""
    return "".join(json.dumps(r, default=str, ensure_ascii=False) + "\n" for r in records)


class JsonlExporter:
    """An exporter that appends each entity's trimmed entries to
    ``<directory>/<url, percent-encoded>.jsonl`` and syncs the file before the trim."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)

    def path(self, url: str) -> Path:
        return self.directory / f"{quote(url, safe='')}.jsonl"

    async def __call__(self, url: str, records: list[dict[str, Any]]) -> None:
        await asyncio.to_thread(self._append, self.path(url), json_lines(records))

    def _append(self, path: Path, text: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())


async def read_entries(store: Store, url: str, upto: str | None = None) -> list[Entry]:
    """The entity's log from its first entry (up to ``upto`` inclusive, if given)."""
    out: list[Entry] = []
    position: str | None = None
    while True:
        page = await store.read_log(url, position, count=_PAGE)
        for entry in page:
            if upto is not None and id_gt(entry[0], upto):
                return out
            out.append(entry)
        if len(page) < _PAGE:
            return out
        position = page[-1][0]


class Retention:
    """Trims an entity's log after each snapshot and when the sweep finds it due (see
    the module docstring)."""

    def __init__(
        self,
        store: Store,
        settings: Settings,
        exporter: Exporter | None,
        fault: Callable[[str], None],
    ) -> None:
        self.store = store
        self.retention_ms = int(settings.retention_s * 1000)
        self.keep = settings.retention_entries
        # A parked entity or an undelivered outbox holds the log: look again this much later.
        self.retry_ms = max(self.retention_ms, int(settings.retention_sweep_s * 1000), 60_000)
        self.exporter = exporter
        self._fault = fault

    async def after_snapshot(self, ticket: WakeTicket) -> int:
        """Trim what the snapshot just written lets go; the number of entries trimmed.
        Never fails the wake (it is committed): a trim that cannot happen now happens
        at the sweep (the commit filed the entity in its partition's sweep set)."""
        try:
            return (await self.trim(ticket.url, ticket.token)).count
        except _LATER as exc:
            log.info("trimming the log of %s postponed: %s", ticket.url, exc)
        except ArchiveError as exc:
            log.error("%s; the sweep tries again", exc, exc_info=exc.cause)
        except Exception:
            log.exception("trimming the log of %s failed; it is kept as it is", ticket.url)
        return 0

    async def trim(self, url: str, token: str) -> Trimmed:
        """Export (if an exporter is set) and trim what may go of ``url``'s log, fenced by
        ``token``; files the entity in the sweep set for its next trim. Raises what
        stopped it (nothing is trimmed that the exporter did not take)."""
        cap = ""
        if self.exporter is not None:
            plan = await self.store.trim_log(
                url, token, retention_ms=self.retention_ms, keep=self.keep, dry=True
            )
            if plan.last:
                entries = await read_entries(self.store, url, plan.last)
                records = [entry_record(url, i, f) for i, f in entries]
                try:
                    await self.exporter(url, records)
                except Exception as exc:  # the user's hook: its OSError is no Redis error
                    raise ArchiveError(url, exc) from exc
                self._fault("trim:after-export")
                cap = plan.before  # what came after the plan was not exported: it stays
            else:
                cap = "0-1"  # nothing to export: trim nothing, only file the entity
        self._fault("trim:before")
        trimmed = await self.store.trim_log(
            url,
            token,
            retention_ms=self.retention_ms,
            keep=self.keep,
            cap=cap,
            retry_ms=self.retry_ms,
        )
        self._fault("trim:after")
        if trimmed.count:
            log.debug("trimmed %d entries of %s up to %s", trimmed.count, url, trimmed.last)
        return trimmed
