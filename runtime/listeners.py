"""The worker's listeners: the inbox reader, the timer loop and the cancel relay.

* :meth:`Listeners.read_inboxes` blocks on XREADGROUP over the owned inboxes
  and hands each wake pointer to the entity's runner (holding back while the
  backlog is full), and puts back the pointers of partitions it lost meanwhile;
* :meth:`Listeners.fire_timers` fires the due timers of the owned partitions,
  and the due occurrences of their recurring schedules (``schedule_firing.py``),
  sleeping until the earliest due time it knows of (``due_times.py``);
* :meth:`Listeners.relay_cancels` passes ``rt.cancel`` requests (the held
  partitions' shard channels) to the wake they concern, if it runs here.

Each is a loop of the worker's task group: Redis being unreachable is retried
here. A bad item (a wake pointer without its url, a malformed timer member, a
timer that fails to fire) is logged and moved to the partition's dead-letter
stream, and the loop goes on; anything else ends the loop with an error, which
stops the worker.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import anyio

from .cancellation import CancelRequests
from .config import Settings
from .due_times import SCHEDULE, TIMER, DueTimes
from .errors import describe
from .leases import LeaseKeeper
from .runners import ReadMark, Runners
from .schedule_firing import ScheduleFiring
from .store import TRANSIENT_ERRORS, BadItem, Pointer, ReadAs, Store

log = logging.getLogger("wakeful.listeners")
FIRE_ATTEMPTS = 3  # a timer that fails to fire this often in a row is moved aside
TIMER_RETRY_S = 0.25  # the timer loop's next pass after Redis failed it
MIN_TIMER_SLEEP_S = 0.005  # between two passes, at least (a timer due now fires now)


@dataclass(frozen=True, slots=True)
class SendRead:
    """A delivery's send that reads its target partition's new pointers for this
    worker (see :meth:`Listeners.local_read`)."""

    read_as: ReadAs
    partition: int
    mark: ReadMark
    listeners: Listeners

    async def finish(self) -> None:
        """The send returned or raised: schedule what it read; if its reply never came,
        give up what it may have read to the lease keeper's sweep."""
        if self.read_as.replied:
            await self.listeners.take(self.read_as.read, self.mark)
        else:
            self.lost()

    def lost(self) -> None:
        """The worker crashed (in a test) or the send was cancelled: what it read stays
        pending here, for the lease keeper's sweep."""
        self.listeners.strand(self.partition, self.mark)


class Listeners:
    def __init__(
        self,
        store: Store,
        settings: Settings,
        worker_id: str,
        leases: LeaseKeeper,
        runners: Runners,
        fault: Callable[[str], None],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.settings = settings
        self.worker_id = worker_id
        self.leases = leases
        self.runners = runners
        self._fault = fault
        self._fire_failures: dict[str, int] = {}  # timer member -> failed fires in a row
        self.schedules = ScheduleFiring(store, worker_id, leases.token, fault, clock)
        self.due = DueTimes()  # when the timer loop looks next
        leases.on_change.append(self.due.changed.set)  # adopted partitions: read them
        self.cancels = CancelRequests(store.channels, store.keys, leases.active)
        self._stop_reading = False
        self.reading_done = anyio.Event()  # set once read_inboxes returned

    def stop_reading(self) -> None:
        """Read no more wake pointers (a graceful stop). The read in flight is let
        finish (at most ``block_ms``) rather than cancelled: a read cut short may still
        be served by the server (a blocked read whose client has gone), and a pointer
        delivered to a worker that stopped waits for the pending sweep, a lease period."""
        self._stop_reading = True
        self.leases.changed.set()
        self.runners.room.set()

    async def read_inboxes(self) -> None:
        try:
            await self._read_inboxes()
        finally:
            self.reading_done.set()

    async def _read_inboxes(self) -> None:
        s = self.settings
        while not self._stop_reading:
            partitions = self.leases.readable()
            if not partitions:
                self.leases.changed.clear()
                if self._stop_reading:
                    break
                with anyio.move_on_after(s.heartbeat_ms / 1000):
                    await self.leases.changed.wait()
                continue
            if self._backlog_full():
                self.runners.room.clear()
                if self._stop_reading:
                    break
                with anyio.move_on_after(1.0):
                    await self.runners.room.wait()
                continue
            mark = self.runners.reading(partitions)
            try:
                await self.cancels.sync()  # before a wake of a new partition can start
                pointers = await self.store.read_wake_pointers(
                    partitions, self.worker_id, s.read_count, s.block_ms, self.runners.strand
                )
            except TRANSIENT_ERRORS as exc:
                # Redis may have served the read and lost its reply (it died, or the
                # connection broke, in between): its pointers are pending here, and
                # nobody else claims them from a live worker. Sweep them later.
                for partition in partitions:
                    self.runners.strand(partition)
                self.runners.read_done(mark)
                log.warning("worker %s: inbox read failed: %s", self.worker_id, exc)
                await anyio.sleep(0.2)
                continue
            except BaseException:
                self.runners.read_done(mark)
                raise
            await self.take(pointers, mark)

    def _backlog_full(self) -> bool:
        return self.runners.backlog() >= self.settings.max_concurrency * 4

    def local_read(self, partition: int) -> SendRead | None:
        """How a delivery by this worker to an entity of ``partition`` reads that
        partition's new pointers in the send's own script (``Store.append_input``), or
        None where it must not: a partition not readable here (not held, lapsing, or
        being handed over), its cancel channel not yet subscribed (a wake must not start
        before), a full backlog, a worker stopping, a cluster."""
        token = self.leases.token(partition)
        if (
            token is None
            or self._stop_reading
            or self.store.router is not None
            or not self.leases.is_readable(partition)
            or not self.cancels.hears(partition)
            or self._backlog_full()
        ):
            return None
        mark = self.runners.reading([partition])
        read_as = ReadAs(token, self.worker_id, self.settings.read_count)
        return SendRead(read_as, partition, mark, self)

    async def take(self, pointers: Sequence[Pointer | BadItem], mark: ReadMark) -> None:
        """Schedule the pointers a read brought (with what they preloaded), then move the
        bad ones aside and put back those of partitions lost while the read was in
        flight. Scheduling comes first and awaits nothing, so a take cut short by a
        cancel or an error leaves no good pointer unscheduled; what it had left to move
        stays pending, and its partitions are swept."""
        bad: list[BadItem] = []
        strays: dict[int, list[str]] = {}
        try:
            for pointer in pointers:
                if isinstance(pointer, BadItem):
                    bad.append(pointer)
                elif self.leases.token(pointer.partition) is not None:
                    self.runners.schedule(pointer, mark)
                else:  # the partition went while the read was in flight
                    strays.setdefault(pointer.partition, []).append(pointer.entry_id)
        finally:
            self.runners.read_done(mark)
        try:
            for item in bad:
                await self._quarantine(item)
            await self._put_back(strays)
        except BaseException:
            for partition in {b.partition for b in bad} | set(strays):
                self.runners.strand(partition)
            raise

    def strand(self, partition: int, mark: ReadMark) -> None:
        """A read of ``partition`` whose reply never came: what it read (if anything)
        is pending here, unscheduled; the lease keeper sweeps it a lease period later."""
        self.runners.strand(partition)
        self.runners.read_done(mark)

    async def _put_back(self, strays: dict[int, list[str]]) -> None:
        """Pointers read for partitions this worker no longer holds (handed over, or
        lapsed, while the read was in flight) go back into their inboxes at once, so the
        new owner reads them now rather than in a pending sweep a lease period later.
        One that cannot be put back stays pending here: the new owner's sweep after its
        acquisition takes it."""
        for partition, ids in strays.items():
            try:
                await self.store.requeue(partition, self.worker_id, ids)
            except TRANSIENT_ERRORS as exc:
                log.warning(
                    "worker %s: putting back %d pointers of partition %d failed: %s",
                    self.worker_id,
                    len(ids),
                    partition,
                    exc,
                )

    async def _quarantine(self, bad: BadItem) -> None:
        try:
            await self.leases.quarantine(bad)
        except TRANSIENT_ERRORS as exc:  # it stays pending: a later sweep meets it again
            if bad.kind == "pointer":
                self.runners.strand(bad.partition)
            log.warning(
                "worker %s: moving %s aside failed: %s", self.worker_id, bad.describe(), exc
            )

    async def fire_timers(self) -> None:
        """Fire due timers and schedule occurrences of the owned partitions. Sleeps until
        the earliest due time it knows of (``due_times.py``), a hint of an earlier one,
        a change of the owned partitions, or the safety-net read (``timer_poll_ms``)."""
        self.store.due_hints.append(self.due.hint)
        try:
            await self._timer_loop()
        finally:
            self.store.due_hints.remove(self.due.hint)

    async def _timer_loop(self) -> None:
        poll_s = self.settings.timer_poll_ms / 1000
        next_poll = 0.0  # time.monotonic() of the next safety-net read
        while True:
            self.due.changed.clear()  # a hint from now on ends the sleep below
            delay = TIMER_RETRY_S
            try:
                partitions = self.leases.active()
                self.due.keep_only(partitions)
                if time.monotonic() >= next_poll:
                    await self._read_due(partitions)
                    next_poll = time.monotonic() + poll_s
                else:  # adopted since the last pass: read when their timers are due
                    await self._read_due([p for p in partitions if p not in self.due.known()])
                await self._fire_pass()
                delay = self._until_next(next_poll)
            except TRANSIENT_ERRORS as exc:
                log.warning("worker %s: timer check failed: %s", self.worker_id, exc)
            with anyio.move_on_after(max(delay, MIN_TIMER_SLEEP_S)):
                await self.due.changed.wait()

    async def _read_due(self, partitions: list[int]) -> None:
        """Read the earliest due times of ``partitions`` into :attr:`due`."""
        if not partitions:
            return
        seen = self.due.reading()
        try:
            read = await self.store.first_due(partitions)
        except BaseException:
            self.due.abandon(seen)
            raise
        self.due.apply(seen, read)

    async def _fire_pass(self) -> None:
        """Fire what is due in the partitions whose lease is valid, then read their
        next due times."""
        held = self._valid(self.due.known())
        now_ms = int(time.time() * 1000)
        timers = [p for p in self.due.due(TIMER, now_ms) if p in held]
        schedules = [
            p for p in self.due.due(SCHEDULE, int(self.schedules.clock() * 1000)) if p in held
        ]
        if timers:
            await self._fire_due(timers, now_ms)
        if schedules:
            await self.schedules.fire_due(schedules)
        await self._read_due(sorted(set(timers) | set(schedules)))

    def _until_next(self, next_poll: float) -> float:
        """Seconds until the next pass: the earliest due time of a valid lease, or the
        safety-net read."""
        held = self._valid(self.due.known())
        waits = [next_poll - time.monotonic()]
        timer = self.due.earliest(TIMER, held)
        if timer is not None:
            waits.append((timer - time.time() * 1000) / 1000)
        schedule = self.due.earliest(SCHEDULE, held)
        if schedule is not None:
            waits.append((schedule - self.schedules.clock() * 1000) / 1000)
        return min(waits)

    def _valid(self, partitions: set[int]) -> set[int]:
        return {p for p in partitions if self.leases.token(p) is not None}

    async def _fire_due(self, partitions: list[int], now: int) -> None:
        for timer in await self.store.due_timers(partitions, now):
            if isinstance(timer, BadItem):
                await self._quarantine(timer)
                continue
            partition, member = timer
            token = self.leases.token(partition)
            if token is not None:
                self._fault("timer:before-fire")
                try:
                    await self.store.fire_timer(partition, token, member)
                except TRANSIENT_ERRORS:
                    raise
                except Exception as exc:  # this timer cannot fire now: go on with the others
                    await self._fire_failed(partition, member, exc)
                    continue
                self._fire_failures.pop(member, None)
                self._fault("timer:after-fire")

    async def _fire_failed(self, partition: int, member: str, exc: Exception) -> None:
        """A timer whose FIRE script fails: retried at the next passes, and moved to the
        dead-letter stream after :data:`FIRE_ATTEMPTS` failures in a row."""
        failures = self._fire_failures[member] = self._fire_failures.get(member, 0) + 1
        reason = f"firing it failed {failures} times: {describe(exc)}"
        if failures < FIRE_ATTEMPTS:
            log.warning("worker %s: timer %r: %s", self.worker_id, member, reason)
            return
        self._fire_failures.pop(member, None)
        key = self.store.keys.timers(partition)
        await self._quarantine(BadItem(partition, "timer", key, member.encode(), reason))

    async def relay_cancels(self) -> None:
        """``rt.cancel`` publishes on the shard channel of the entity's partition; stop
        that wake if it runs here. The channels of the held partitions are subscribed
        (``cancellation.CancelRequests``); a subscription Redis refused or lost is made
        again by the process's shard-channel subscriptions (``shard_channels.py``), which
        log a refusal with the rule to add. The cancel request is also an input in the
        entity's log, so a wake that starts later (or on another worker) still sees it."""
        try:
            while True:
                try:
                    request = await self.cancels.next(timeout=1.0)
                except TRANSIENT_ERRORS as exc:  # not expected: the subscriptions retry
                    log.warning("worker %s: cancel requests: %s", self.worker_id, exc)
                    await anyio.sleep(0.5)
                    continue
                if request is not None:
                    url, reason = request
                    self.runners.cancel(url, reason or "cancelled")
        finally:
            with anyio.CancelScope(shield=True):
                await self.cancels.close()
