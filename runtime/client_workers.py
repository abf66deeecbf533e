"""The workers serving a keyspace: who is alive, which partitions each leases.

The operator's half of :class:`~wakeful.client.Runtime` (``wakeful workers``, the
health checks): reads of the worker registry, the partition leases and the
dead-letter streams, and the hint a timeout gives when no worker serves an entity.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from .config import Settings
from .store import Store
from .urls import parse_url


@dataclasses.dataclass
class WorkerInfo:
    """A live worker in the registry: its id, the partitions whose leases it holds,
    and when it last heartbeat (derived from the expiry, ``2 * lease_ttl_ms`` after it)."""

    id: str
    partitions: list[int]
    last_heartbeat_ms: int  # ms ago
    expires_in_ms: int


class WorkerListing:
    """The live workers, the partitions they hold, and what they could not use."""

    settings: Settings

    if TYPE_CHECKING:

        @property
        def _store(self) -> Store: ...  # the runtime's store

    async def bad_items(self, count: int = 100) -> list[dict[str, str]]:
        """Wake pointers and timers the workers could not use and moved to their
        partition's dead-letter stream (newest first, up to ``count`` per partition):
        ``partition``, ``id``, ``kind`` (pointer | timer), ``key``, ``item``, ``reason``,
        ``detail`` (a pointer's fields, a timer's data) and ``worker``."""
        return await self._store.bad_items(count)

    async def lease_owner(self, url: str) -> str | None:
        """``<worker>:<epoch>`` holding the lease of the partition ``url`` lives in."""
        parse_url(url)
        return await self._store.lease_owner(self._store.keys.partition(url))

    async def workers(self) -> list[WorkerInfo]:
        """The live workers (registry ``<prefix>:workers``) and the partitions each holds."""
        live = await self._store.live_workers()
        holders = await self._store.lease_holders()
        window = 2 * self.settings.lease_ttl_ms
        return [
            WorkerInfo(
                id=worker,
                partitions=sorted(p for p, w in holders.items() if w == worker),
                last_heartbeat_ms=max(window - expires, 0),
                expires_in_ms=expires,
            )
            for worker, expires in sorted(live)
        ]

    async def partition_owners(self) -> dict[int, str | None]:
        """Partition -> the live worker holding its lease, or None if none serves it."""
        live = {w for w, _ in await self._store.live_workers()}
        holders = await self._store.lease_holders()
        return {p: w if w in live else None for p, w in holders.items()}

    async def partition_owner(self, partition: int) -> str | None:
        """The live worker serving ``partition``, or None."""
        return (await self.partition_owners())[partition]

    async def _no_worker_hint(self, url: str) -> str:
        """``"; no worker ..."`` when no live worker holds the partition of ``url``."""
        partition = self._store.keys.partition(url)
        owner = await self.partition_owner(partition)
        if owner is not None:
            return ""
        if not await self._store.live_workers():
            return "; no worker runs on this keyspace: start `wakeful worker APP`"
        return f"; no worker holds partition {partition} yet"
