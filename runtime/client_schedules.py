"""Recurring schedules of an entity, from a client: the schedule half of ``Runtime``.

A client's writes are not fenced by a lease (like a client's message); each checks
the entity's incarnation in the same script, so a schedule never outlives a delete
into a re-created entity. The first occurrence is computed from :attr:`clock`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .config import Settings
from .errors import EntityNotFoundError
from .schedules import CronSchedule, check_id, make_spec
from .store import Store
from .urls import parse_url


class RecurringSchedules:
    """Upsert, list and delete the recurring schedules of an entity."""

    settings: Settings
    clock: Callable[[], float]  # epoch seconds

    @property
    def _store(self) -> Store:
        raise NotImplementedError  # the runtime's store

    async def _incarnation(self, url: str) -> str:
        parse_url(url)
        meta = await self._store.entity_meta(url)
        if meta is None:
            raise EntityNotFoundError(url)
        return meta.incarnation

    async def upsert_cron_schedule(
        self,
        url: str,
        schedule_id: str,
        expression: str,
        *,
        timezone: str = "UTC",
        payload: Any = None,
    ) -> CronSchedule:
        """Create or replace the recurring schedule ``schedule_id`` of the existing entity
        ``url``: at each occurrence of the cron ``expression`` (5 fields) in the IANA
        ``timezone`` the entity gets a message with ``payload`` from ``schedule:<id>``.

        Upserting an unchanged schedule keeps its next occurrence. Raises
        InvalidScheduleError naming a bad id, expression or time zone, and
        EntityNotFoundError if ``url`` does not exist."""
        created = await self._incarnation(url)
        spec, packed, first_ms = make_spec(
            schedule_id,
            expression,
            timezone,
            payload,
            created,
            limit=self.settings.max_event_bytes,
            now_ms=int(self.clock() * 1000),
        )
        return await self._store.upsert_schedule(url, spec, packed, first_ms)

    async def cron_schedules(self, url: str) -> list[CronSchedule]:
        """The recurring schedules of ``url``, the soonest next occurrence first."""
        return await self._store.schedules_of(url, await self._incarnation(url))

    async def delete_cron_schedule(self, url: str, schedule_id: str) -> bool:
        """Delete a recurring schedule of ``url``; False if it has none with this id."""
        check_id(schedule_id)
        return await self._store.delete_schedule(url, await self._incarnation(url), schedule_id)
