"""What a handler's context may ask of the worker, as one explicit object.

:class:`HandlerServices` implements the ``Services`` protocol of
:mod:`wakeful.context`: type lookup, status of other entities, the entity's
schedules, and its capability pool. The handler context and the tool adapters
talk to it, never to the worker itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .capabilities import Capability, CapabilityPool
from .errors import EntityNotFoundError, FencedError, UnknownEntityTypeError
from .events import decode_event
from .registry import EntityType, Registry
from .status import EntityStatus, Schedule, entity_status
from .store import Store


class HandlerServices:
    def __init__(
        self,
        registry: Registry,
        store: Store,
        capabilities: list[Capability[Any]],
        token: Callable[[int], str | None],
    ) -> None:
        self.registry = registry
        self.store = store
        self.capabilities = {c.name: c for c in capabilities}
        self._token = token  # the fencing token of a partition, None if not held
        self._pools: dict[str, CapabilityPool] = {}

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
        token = self._token(self.store.keys.partition(url))
        if token is None:
            raise FencedError(f"the lease of {url}'s partition is lost")
        return await self.store.cancel_timer(url, token, f"{url}|{created}|{schedule_id}")

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
