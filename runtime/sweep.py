"""The retention sweep: trims the logs of entities that never wake again.

A wake that writes a snapshot trims what it may of the entity's log right away
(:mod:`wakeful.retention`), but entries younger than the retention window must
stay, and an entity that never wakes again would keep them for good. So every
partition has a sorted set of the entities whose logs can lose entries later
(``<prefix>:{pN}:trimdue``, url -> when, in ms): the commit that writes a
snapshot files the entity there (due now), and every trim files it again for
when its oldest entry leaves the window, or takes it out when only a new
snapshot can free more (see ``TRIM`` in ``lua.py``).

Every ``retention_sweep_s`` the worker reads the due members of the partitions it
owns (one round trip for all of them: the idle cost) and trims each entity with
the same fenced, export-first trim a wake uses. It is rate-limited (at most
:data:`BATCH` members a partition a tick, the next tick sooner when a batch was
full) and skips entities that run here now (their wakes trim them). A crash
anywhere loses nothing: the member stays in the set until a trim files it anew,
and the trim itself is safe to repeat. A member that is no entity url of its
partition is logged and moved to the partition's dead-letter stream; a trim that
fails is logged and tried again ``retry`` later; the loop goes on either way.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Protocol

import anyio

from .config import Settings
from .errors import ArchiveError, FencedError
from .retention import Retention
from .store import TRANSIENT_ERRORS, BadItem, Store, url_of

log = logging.getLogger("wakeful.sweep")

BATCH = 100  # members of one partition trimmed per tick, at most
SOON_S = 1.0  # the next tick after a full batch


class Leases(Protocol):
    """What the sweep asks of the worker's lease keeper."""

    def active(self) -> list[int]:
        """Partitions held and not being handed over."""

    def token(self, partition: int) -> str | None:
        """The fencing token of ``partition`` while its lease is valid."""

    async def quarantine(self, bad: BadItem) -> None:
        """Log ``bad`` and move it to its partition's dead-letter stream."""


class RetentionSweep:
    """The worker's sweep loop (:meth:`run`) and one pass of it (:meth:`tick`)."""

    def __init__(
        self,
        store: Store,
        settings: Settings,
        retention: Retention,
        leases: Leases,
        running: Callable[[str], bool],
        stats: dict[str, int],
    ) -> None:
        self.store = store
        self.interval = settings.retention_sweep_s
        self.retention = retention
        self.leases = leases
        self.running = running
        self.stats = stats
        stats.setdefault("swept", 0)  # entities whose logs the sweep trimmed
        stats.setdefault("sweep_trimmed", 0)  # entries it trimmed

    async def run(self) -> None:
        """Tick every ``retention_sweep_s`` (sooner after a full batch). A failed tick
        is logged and the loop goes on."""
        while True:
            full = False
            try:
                full = await self.tick()
            except TRANSIENT_ERRORS as exc:
                log.warning("retention sweep postponed: %s", exc)
            except Exception:
                log.exception("retention sweep failed; it runs again at its next tick")
            await anyio.sleep(min(self.interval, SOON_S) if full else self.interval)

    async def tick(self) -> bool:
        """Trim every due entity of the owned partitions (up to :data:`BATCH` each);
        whether a batch was full (more may be due)."""
        partitions = self.leases.active()
        if not partitions:
            return False
        now_ms = int(time.time() * 1000)
        full = False
        for partition, members in await self.store.trim_due(partitions, now_ms, BATCH):
            full = full or len(members) >= BATCH
            for member in members:
                if not await self._one(partition, member):
                    break  # the lease is gone or Redis cannot take more now
        return full

    async def _one(self, partition: int, member: bytes) -> bool:
        """Trim one member's entity; False if the partition's pass should stop."""
        token = self.leases.token(partition)
        if token is None:
            return False
        url = self._url(partition, member)
        if isinstance(url, BadItem):
            await self.leases.quarantine(url)
            return True
        if self.running(url):
            return True  # its wake trims it after its snapshot; still due at the next tick
        try:
            trimmed = await self.retention.trim(url, token)
        except FencedError:
            return False
        except TRANSIENT_ERRORS:
            raise
        except Exception as exc:  # the archive hook refused, or the entity's data is bad
            retry_ms = self.retention.retry_ms
            log.error(
                "retention sweep: trimming the log of %s failed (%s); it is kept as it is "
                "and tried again in %d s",
                url,
                exc,
                retry_ms // 1000,
                exc_info=exc.cause if isinstance(exc, ArchiveError) else exc,
            )
            await self.store.postpone_trim(partition, member, int(time.time() * 1000) + retry_ms)
            return True
        if trimmed.count:
            self.stats["swept"] += 1
            self.stats["sweep_trimmed"] += trimmed.count
            log.debug("retention sweep trimmed %d entries of %s", trimmed.count, url)
        return True

    def _url(self, partition: int, member: bytes) -> str | BadItem:
        """The entity url ``member`` names, or why it names none of ``partition``."""
        url, reason = url_of(self.store.keys, partition, member)
        if reason:
            key = self.store.keys.trimdue(partition)
            return BadItem(partition, "sweep", key, member, reason)
        return url
