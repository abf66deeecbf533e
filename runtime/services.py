"""What a handler's context may ask of the worker, as one explicit object.

:class:`HandlerServices` implements the ``Services`` protocol of
:mod:`wakeful.context`: type lookup, status of other entities, the entity's
timers and recurring schedules, and its capability pool. The handler context and the tool adapters
talk to it, never to the worker itself.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .capabilities import Capability, CapabilityPool
from .errors import EntityNotFoundError, FencedError, UnknownEntityTypeError
from .events import decode_event
from .registry import EntityType, Registry
from .schedules import CronSchedule, make_spec
from .status import EntityStatus, Schedule, entity_status
from .store import Store


class HandlerServices:
    def __init__(
        self,
        registry: Registry,
        store: Store,
        capabilities: list[Capability[Any]],
        token: Callable[[int], str | None],
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.registry = registry
        self.store = store
        self.capabilities = {c.name: c for c in capabilities}
        self._token = token  # the fencing token of a partition, None if not held
        self._pools: dict[str, CapabilityPool] = {}
        self._clock = clock  # epoch seconds: the first occurrence of a schedule is after it

    async def entity_type(self, type_name: str) -> EntityType | None:
        if type_name in self.registry:
            return self.registry.get(type_name)
        if not await self.store.type_published(type_name):
            raise UnknownEntityTypeError(type_name, self.registry.names())
        return None

    async def status(self, url: str) -> EntityStatus:
        meta = await self.store.entity_meta(url)
        if meta is None:
            raise EntityNotFoundError(url)
        return entity_status(url, meta)

    async def schedules(self, url: str, created: str) -> list[Schedule]:
        out = []
        for member, due_ms, data in await self.store.timers_of(url, created):
            event = decode_event(data, url=url)
            for effect in getattr(event, "effects", []):
                out.append(Schedule(member.split("|", 2)[2], effect.target, effect.payload, due_ms))
        return out

    async def cancel_schedule(self, url: str, created: str, schedule_id: str) -> bool:
        timer = f"{url}|{created}|{schedule_id}"
        return await self.store.cancel_timer(url, self._lease(url), timer)

    def _lease(self, url: str) -> str:
        """The fencing token of ``url``'s partition, held by this worker."""
        token = self._token(self.store.keys.partition(url))
        if token is None:
            raise FencedError(f"the lease of {url}'s partition is lost")
        return token

    async def upsert_cron_schedule(
        self,
        url: str,
        created: str,
        schedule_id: str,
        expression: str,
        timezone: str,
        payload: Any,
        limit: int,
    ) -> CronSchedule:
        now_ms = int(self._clock() * 1000)
        spec, packed, first_ms = make_spec(
            schedule_id, expression, timezone, payload, created, limit=limit, now_ms=now_ms
        )
        return await self.store.upsert_schedule(url, spec, packed, first_ms, token=self._lease(url))

    async def cron_schedules(self, url: str, created: str) -> list[CronSchedule]:
        return await self.store.schedules_of(url, created)

    async def delete_cron_schedule(self, url: str, created: str, schedule_id: str) -> bool:
        return await self.store.delete_schedule(url, created, schedule_id, token=self._lease(url))

    def capabilities_for(self, url: str) -> CapabilityPool:
        pool = self._pools.get(url)
        if pool is None:
            pool = self._pools[url] = CapabilityPool(url, self.capabilities)
        return pool

    def has_capabilities(self, url: str) -> bool:
        return url in self._pools

    def pooled(self) -> list[str]:
        return list(self._pools)

    async def release_capabilities(self, url: str) -> None:
        pool = self._pools.pop(url, None)
        if pool is not None:
            await pool.cleanup()
