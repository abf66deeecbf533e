"""Following an entity's log and live output, and where a reader stands in them.

The log-reading half of :class:`~wakeful.client.Runtime`: the generators of
``following.py`` bound to the runtime's store, the positions to start them from,
and the lag of the inputs not yet handled.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING

from .errors import WakefulError
from .events import LogRecord, TrimmedRecord, UndecodableRecord
from .following import follow_entity, until_idle
from .live import LiveRecord
from .status import EntityStatus
from .store import EntityMeta, Store
from .streamids import check_position
from .urls import parse_url


class LogReads:
    """An entity's log and live stream, followed or read up to a point."""

    if TYPE_CHECKING:

        @property
        def _store(self) -> Store: ...  # the runtime's store

        async def _entity_meta(self, url: str) -> EntityMeta: ...

        async def wait_idle(self, url: str, timeout: float = 30.0) -> EntityStatus: ...

    async def events(
        self,
        url: str,
        *,
        after: str | None = None,
        follow: bool = False,
        live: bool = False,
        live_after: str | None = None,
        block_ms: int = 5000,
    ) -> AsyncGenerator[LogRecord | UndecodableRecord | LiveRecord | TrimmedRecord, None]:
        """The entity log after ``after``; with ``follow`` it waits for new events forever.

        With ``live=True`` it also follows the live stream (text deltas and tool
        progress, as :class:`LiveRecord`), from ``live_after`` or from now; a
        client that reconnects passes the last ids it saw of each stream. An
        entry that fails to decode is yielded as an :class:`UndecodableRecord`
        with its stream id, never skipped. A range that log retention trimmed
        (``after`` before it, or the whole history) is a :class:`TrimmedRecord`
        naming the last entry gone, never a silent jump.
        """
        parse_url(url)
        check_position(after, "after")
        check_position(live_after, "live_after")
        records = follow_entity(
            self._store,
            url,
            after=after,
            follow=follow,
            live=live,
            live_after=live_after,
            block_ms=block_ms,
        )
        async with contextlib.aclosing(records):
            async for record in records:
                yield record

    async def log_position(self, url: str, *, back: int) -> str | None:
        """The id to pass as ``after`` to read only the last ``back`` entries of the log
        (None when the log has no more than that)."""
        parse_url(url)
        if back < 1:
            raise WakefulError(f"back must be at least 1, got {back}")
        newest = await self._store.newest_log_entries(url, back + 1)
        return newest[-1][0] if len(newest) > back else None

    async def live_position(self, url: str) -> str:
        """The id of the newest live event of ``url``: pass it as ``live_after`` to follow
        only the live output that comes after this moment (take it before sending)."""
        parse_url(url)
        return await self._store.newest_live_id(url)

    async def stream_until_idle(
        self,
        url: str,
        *,
        after: str | None = None,
        live_after: str | None = None,
        timeout: float = 60.0,
    ) -> AsyncGenerator[LogRecord | UndecodableRecord | LiveRecord | TrimmedRecord, None]:
        """The log (after ``after``) and live output (after ``live_after``) of ``url``
        until the entity is idle: every input handled, no awaited child running, or
        suspended on pending actions, or failed. Ends once every log entry written up
        to that moment has been yielded. Raises :class:`WaitTimeoutError` after
        ``timeout`` seconds without reaching idle.
        """
        parse_url(url)
        records = self.events(url, after=after, live=True, live_after=live_after)
        idle = functools.partial(self.wait_idle, url, timeout=timeout)
        stream = until_idle(self._store, url, records, after=after, idle=idle)
        async with contextlib.aclosing(stream):  # its tasks end when this generator does
            async for record in stream:
                yield record

    async def lag(self, url: str) -> tuple[int, int]:
        """``(inputs, ms)``: inputs appended but not yet handled, and the age of the oldest."""
        cursor = (await self._entity_meta(url)).cursor
        pending, oldest = 0, None
        async for record in self.events(url, after=cursor):
            if isinstance(record, LogRecord) and not record.event.is_input:
                continue
            pending += 1
            oldest = oldest or record.id
        age = int(time.time() * 1000) - int(oldest.split("-")[0]) if oldest else 0
        return pending, max(age, 0)
