"""Recurring schedules in Redis: the store's schedule half (a base of ``Store``).

An entity's schedules are the hash ``cron:<url>`` (schedule id -> packed
:class:`~wakeful.schedules.CronSpec`) and one member ``<url>|<id>`` each in its
partition's sorted set ``crondue`` (score: the next occurrence, epoch ms). Both
are in the entity's partition slot, so the ``CRON_*`` scripts change them, the
entity's log and its metadata together. Writes from a handler are fenced by
the partition lease; a client's writes are not (like a client's message), but
every write checks the entity's incarnation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import msgspec

from .errors import EntityNotFoundError, FencedError, InvalidScheduleError
from .replies import as_str
from .schedules import MAX_PER_ENTITY, CronSchedule, CronSpec, decode_spec, listed
from .script_runner import (
    CRON_DELETE,
    CRON_FIRE,
    CRON_PURGE,
    CRON_QUARANTINE,
    CRON_UPSERT,
    ScriptRunner,
)


@dataclass(frozen=True, slots=True)
class DueSchedule:
    """A schedule whose next occurrence (``due_ms``) has come, as read."""

    partition: int
    url: str
    id: str
    due_ms: int
    spec: bytes  # as stored: the fire step checks it is still this


@dataclass(frozen=True, slots=True)
class BadSchedule:
    """A member of a partition's schedule set the worker cannot use, and why."""

    partition: int
    member: bytes
    reason: str
    detail: str = ""  # what its spec held

    def describe(self) -> str:
        return f"bad schedule {self.member!r} of partition {self.partition}: {self.reason}"


class ScheduleStore(ScriptRunner):
    """Upsert, list, delete and fire recurring schedules (see the module docstring)."""

    async def upsert_schedule(
        self,
        url: str,
        spec: CronSpec,
        packed: bytes,
        next_ms: int,
        *,
        token: str | None = None,
    ) -> CronSchedule:
        """Write ``spec`` (for the incarnation it names) with its next occurrence
        ``next_ms``; a spec stored already as it is keeps its next occurrence. Returns the
        schedule as stored."""
        k = self.keys
        p = k.partition(url)
        reply = await self._run(
            CRON_UPSERT,
            [k.lease(p), k.meta(url), k.crons(url), k.crondue(p)],
            [token or "", url, spec.id, packed, spec.incarnation, next_ms, MAX_PER_ENTITY],
        )
        status = int(reply[0])
        self._refused(status, url, token, "upserting a schedule")
        if status == -3:
            raise InvalidScheduleError(
                "id", spec.id, f"{url} has {MAX_PER_ENTITY} schedules already, the limit"
            )
        stored_ms = int(float(reply[1]))
        self._hint_due("schedule", p, stored_ms)
        return listed(spec, stored_ms)

    async def delete_schedule(
        self, url: str, incarnation: str, schedule_id: str, *, token: str | None = None
    ) -> bool:
        """Remove a schedule; False if there is none with this id."""
        k = self.keys
        p = k.partition(url)
        reply = int(
            await self._run(
                CRON_DELETE,
                [k.lease(p), k.meta(url), k.crons(url), k.crondue(p)],
                [token or "", url, schedule_id, incarnation],
            )
        )
        self._refused(reply, url, token, "deleting a schedule")
        return reply == 1

    @staticmethod
    def _refused(reply: int, url: str, token: str | None, what: str) -> None:
        if reply == -1:
            raise FencedError(f"{what} of {url} refused: lease {token} is lost")
        if reply == -2:
            raise EntityNotFoundError(url)

    async def schedules_of(self, url: str, incarnation: str) -> list[CronSchedule]:
        """The recurring schedules of one incarnation of ``url``, soonest first."""
        k = self.keys
        p = k.partition(url)
        raw = cast("dict[bytes, bytes]", await self.redis.hgetall(k.crons(url)))
        if not raw:
            return []
        ids = [as_str(i) for i in raw]
        pipe = self.redis.pipeline(transaction=False)
        for schedule_id in ids:
            pipe.zscore(k.crondue(p), f"{url}|{schedule_id}")
        scores = await pipe.execute()
        out = []
        for data, score in zip(raw.values(), scores, strict=True):
            try:
                spec = decode_spec(data)
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue  # the worker moves it aside when it comes due
            if spec.incarnation == incarnation and score is not None:
                out.append(listed(spec, int(score)))
        return sorted(out, key=lambda s: (s.next_ms, s.id))

    async def purge_schedules(self, url: str, token: str) -> int:
        """Fenced: remove every schedule of ``url`` (the entity is being deleted)."""
        k = self.keys
        p = k.partition(url)
        reply = int(
            await self._run(CRON_PURGE, [k.lease(p), k.crons(url), k.crondue(p)], [token, url])
        )
        if reply == -1:
            raise FencedError(f"removing the schedules of {url} refused: lease {token} is lost")
        return reply

    async def due_schedules(
        self, partitions: list[int], now_ms: int, limit: int = 100
    ) -> list[DueSchedule | BadSchedule]:
        """Schedules whose next occurrence is at or before ``now_ms``, with their specs."""
        k = self.keys
        pipe = self.redis.pipeline(transaction=False)
        for p in partitions:
            pipe.zrangebyscore(k.crondue(p), "-inf", now_ms, start=0, num=limit, withscores=True)
        found: list[tuple[int, str, str, int]] = []
        out: list[DueSchedule | BadSchedule] = []
        for p, members in zip(partitions, await pipe.execute(), strict=True):
            for member, score in members:
                try:
                    url, sep, schedule_id = member.decode().rpartition("|")
                except UnicodeDecodeError:
                    out.append(BadSchedule(p, member, "it is not UTF-8"))
                    continue
                if not (sep and url and schedule_id):
                    out.append(BadSchedule(p, member, "it is not '<url>|<schedule id>'"))
                elif k.partition(url) != p:
                    reason = f"its url {url!r} belongs to partition {k.partition(url)}"
                    out.append(BadSchedule(p, member, reason))
                else:
                    found.append((p, url, schedule_id, int(score)))
        if not found:
            return out
        pipe = self.redis.pipeline(transaction=False)
        for _, url, schedule_id, _ in found:
            pipe.hget(k.crons(url), schedule_id)
        for (p, url, schedule_id, due_ms), spec in zip(found, await pipe.execute(), strict=True):
            if spec is None:  # deleted since: the fire step removes the member
                spec = b""
            out.append(DueSchedule(p, url, schedule_id, due_ms, spec))
        return out

    async def next_schedule_ms(self, partitions: list[int]) -> int | None:
        pipe = self.redis.pipeline(transaction=False)
        for p in partitions:
            pipe.zrange(self.keys.crondue(p), 0, 0, withscores=True)
        dues = [int(score) for reply in await pipe.execute() for _, score in reply]
        return min(dues) if dues else None

    async def fire_schedule(
        self, due: DueSchedule, token: str, incarnation: str, next_ms: int, event: bytes
    ) -> int:
        """Fenced, one step: append the occurrence ``event`` and move the schedule to
        ``next_ms``, if it is still due as read. 1 fired | 0 not as read | -1 fenced |
        -2 removed (its entity is gone)."""
        k = self.keys
        p = due.partition
        return int(
            await self._run(
                CRON_FIRE,
                [
                    k.lease(p),
                    k.crondue(p),
                    k.crons(due.url),
                    k.meta(due.url),
                    k.log(due.url),
                    k.inbox(p),
                ],
                [token, due.url, due.id, due.due_ms, due.spec, incarnation, next_ms, event],
            )
        )

    async def quarantine_schedule(self, bad: BadSchedule, token: str, worker_id: str) -> int:
        """Fenced: move a schedule member the worker cannot use to the dead-letter stream."""
        k = self.keys
        p = bad.partition
        return int(
            await self._run(
                CRON_QUARANTINE,
                [k.lease(p), k.bad(p), k.crondue(p)],
                [token, bad.member, bad.reason, bad.detail, worker_id],
            )
        )
