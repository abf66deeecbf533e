"""Firing recurring schedules: part of the worker's timer loop (``listeners.py``).

For each due schedule of an owned partition the worker decodes its spec,
computes the occurrence after this one with croniter (the first one after now,
so a schedule that missed several occurrences while no worker ran fires once,
not once per missed occurrence) and runs the CRON_FIRE script, which appends
the occurrence's message and moves the schedule to its next occurrence in one
step, if the schedule is still due as read. So an occurrence fires exactly once
whatever crashes: before the script nothing is written, after it the
schedule's score has moved on (see docs/design.md, "Recurring schedules").
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import msgspec

from .errors import WakefulError, describe
from .events import RUNTIME_EVENT_MAX_BYTES
from .schedule_store import BadSchedule, DueSchedule
from .schedules import decode_spec, next_occurrence_ms, occurrence_event
from .store import TRANSIENT_ERRORS, Store

log = logging.getLogger("wakeful.schedules")
FIRE_ATTEMPTS = 3  # a schedule whose fire step fails this often in a row is moved aside


class ScheduleFiring:
    def __init__(
        self,
        store: Store,
        worker_id: str,
        token: Callable[[int], str | None],
        fault: Callable[[str], None],
        clock: Callable[[], float],
    ) -> None:
        self.store = store
        self.worker_id = worker_id
        self._token = token  # the fencing token of a partition, None if not held
        self._fault = fault
        self.clock = clock  # epoch seconds (time.time; tests pass a clock they move)
        self._failures: dict[bytes, int] = {}  # member -> failed fire steps in a row

    async def fire_due(self, partitions: list[int]) -> None:
        """Fire the due schedules of ``partitions`` (the timer loop reads their next
        occurrences afterwards, with its timers')."""
        now_ms = int(self.clock() * 1000)
        for due in await self.store.due_schedules(partitions, now_ms):
            if isinstance(due, BadSchedule):
                await self._quarantine(due)
            else:
                await self._fire(due, now_ms)

    async def _fire(self, due: DueSchedule, now_ms: int) -> None:
        token = self._token(due.partition)
        if token is None:
            return
        member = f"{due.url}|{due.id}".encode()
        if not due.spec:  # its spec is gone: the fire step removes the member
            await self.store.fire_schedule(due, token, "", 0, b"")
            return
        try:
            spec = decode_spec(due.spec)
            next_ms = next_occurrence_ms(spec.expression, spec.timezone, max(now_ms, due.due_ms))
            event = occurrence_event(spec, due.due_ms, limit=RUNTIME_EVENT_MAX_BYTES)
        except (msgspec.DecodeError, msgspec.ValidationError, WakefulError) as exc:
            detail = due.spec.decode(errors="replace")[:1000]
            reason = f"it cannot be fired: {describe(exc)}"
            await self._quarantine(BadSchedule(due.partition, member, reason, detail))
            return
        self._fault("schedule:before-fire")
        try:
            await self.store.fire_schedule(due, token, spec.incarnation, next_ms, event)
        except TRANSIENT_ERRORS:
            raise
        except Exception as exc:  # this one cannot fire now: go on with the others
            await self._failed(due, member, exc)
            return
        self._failures.pop(member, None)
        self._fault("schedule:after-fire")

    async def _failed(self, due: DueSchedule, member: bytes, exc: Exception) -> None:
        failures = self._failures[member] = self._failures.get(member, 0) + 1
        reason = f"firing it failed {failures} times: {describe(exc)}"
        if failures < FIRE_ATTEMPTS:
            log.warning("worker %s: schedule %r: %s", self.worker_id, member, reason)
            return
        self._failures.pop(member, None)
        detail = due.spec.decode(errors="replace")[:1000]
        await self._quarantine(BadSchedule(due.partition, member, reason, detail))

    async def _quarantine(self, bad: BadSchedule) -> None:
        log.warning("worker %s: %s; moving it aside", self.worker_id, bad.describe())
        token = self._token(bad.partition)
        if token is None:
            return
        try:
            await self.store.quarantine_schedule(bad, token, self.worker_id)
        except TRANSIENT_ERRORS as exc:  # it stays: a later pass meets it again
            log.warning(
                "worker %s: moving %s aside failed: %s", self.worker_id, bad.describe(), exc
            )
