"""Reading an entity as committed: its state, status, journal, conversation and children.

The reading half of :class:`~wakeful.client.Runtime`: each read folds the entity's
snapshot and log (``fold.py``) or reads its metadata, and writes nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any

from .errors import EntityNotFoundError, EventDecodeError, MetadataError, SnapshotError
from .events import (
    HistoryEvent,
    LogRecord,
    RuntimeErrorRecorded,
    ToolData,
    TrimmedRecord,
    UndecodableRecord,
)
from .fold import check_skipped, initial_state, rebuild
from .history import project
from .live import LiveRecord
from .registry import Registry
from .state import ChildInfo, EntityState
from .status import EntityStatus, RunInfo, entity_status
from .store import EntityMeta, Store
from .urls import parse_url


class StateReads:
    """The committed state of an entity and what is derived from it."""

    registry: Registry

    if TYPE_CHECKING:

        @property
        def _store(self) -> Store: ...  # the runtime's store

        def events(  # LogReads' (before this class in Runtime's bases)
            self, url: str, *, after: str | None = None
        ) -> AsyncGenerator[LogRecord | UndecodableRecord | LiveRecord | TrimmedRecord, None]: ...

    async def history(self, url: str) -> list[HistoryEvent]:
        """The agent journal of ``url``: user turns, assistant steps, tool intents and results."""
        return list((await self._folded(url)).system.history)

    async def tool_data(self, url: str) -> dict[str, Any]:
        """The tool data of ``url``'s calls (the latest write of each), by tool call id."""
        return {
            record.event.tool_call_id: record.event.data
            async for record in self.events(url)
            if isinstance(record, LogRecord) and isinstance(record.event, ToolData)
        }

    async def runtime_errors(self, url: str) -> list[RuntimeErrorRecorded]:
        """The full errors of the bugs that failed runs of ``url`` (tracebacks, secret
        values included), oldest first. For operators: the gateway never sends these
        events to HTTP clients, who see only the redacted error of the run."""
        return [
            record.event
            async for record in self.events(url)
            if isinstance(record, LogRecord) and isinstance(record.event, RuntimeErrorRecorded)
        ]

    async def conversation(self, url: str) -> list[dict[str, Any]]:
        """The conversation as the model sees it (Messages API messages)."""
        return project(await self.history(url))

    async def children(self, url: str) -> list[ChildInfo]:
        """The entities ``url`` spawned, with the status of their last finished run."""
        return list((await self._folded(url)).system.children.values())

    async def _entity_meta(self, url: str) -> EntityMeta:
        parse_url(url)
        meta = await self._store.entity_meta(url)
        if meta is None:
            raise EntityNotFoundError(url)
        return meta

    async def ownership(self, url: str) -> tuple[bool, dict[str, str] | None]:
        """Whether the entity exists, and the identity that owns it (None: none
        recorded), in one read of its metadata (for authorisers)."""
        parse_url(url)
        [found] = await self._store.ownerships([url])
        return found

    async def ownerships(self, urls: list[str]) -> list[tuple[bool, dict[str, str] | None]]:
        """:meth:`ownership` of many entities, in one round trip."""
        return await self._store.ownerships(urls)

    async def status(self, url: str, *, runs: bool = False) -> EntityStatus:
        """Where the entity stands; with ``runs`` also its current and last finished
        run (read from its state, so it costs a load of the entity). A state that
        cannot be read (a damaged snapshot or log entry) is reported, not raised: the
        status is ``failed``, and ``error`` says why unless the entity is parked already."""
        status = entity_status(url, await self._entity_meta(url))
        if not runs:
            return status
        try:
            system = (await self._folded(url)).system
        except (SnapshotError, EventDecodeError) as exc:  # reported, as corrupt metadata is
            if status.status == "failed":
                return status  # parked: its error says why
            return dataclasses.replace(status, status="failed", error=str(exc))
        current = None
        if system.run is not None:
            word = "suspended" if system.actions else "running"
            current = RunInfo(system.run, word, system.run_started_ms)
        last = system.last_run
        return dataclasses.replace(
            status,
            run=current,
            last_run=RunInfo(last.run_id, last.status, last.at_ms, last.error) if last else None,
        )

    async def state(self, url: str) -> dict[str, list[Any]]:
        """The entity's collections as committed (snapshot + log), as plain data."""
        return (await self._folded(url)).to_builtins()

    async def _folded(self, url: str) -> EntityState:
        parse_url(url)
        loaded = await self._store.load(url, None)
        meta = loaded.info
        if meta is None:
            raise EntityNotFoundError(url)
        if problems := meta.problems():  # a position to fold from cannot be read
            raise MetadataError("; ".join(problems), url)
        collections = {}
        if meta.type in self.registry:
            collections = self.registry.get(meta.type).state
        state = initial_state(collections, loaded.snapshot, meta.snapshot_out, loaded.chunks, url)
        cursor = meta.cursor
        folded = rebuild(url, state, loaded.entries, cursor)
        if folded.undecodable:  # an unhandled entry: its input is unknown, not skippable
            raise folded.undecodable[0]
        check_skipped(folded.handled_undecodable, folded.records)  # fine only if skipped
        return folded.state
