"""Partition leases: which partitions this worker owns, acquired, renewed and handed back.

A worker may wake an entity only while it holds the fenced lease of the entity's
partition. The :class:`LeaseKeeper` heartbeats the worker into
``<prefix>:workers``, computes the partitions it should own (rendezvous hashing
over the live workers, so a change of membership moves few partitions), renews
the leases it holds, acquires the ones it should own, and hands back the ones it
should not once their wakes are done. On acquiring a partition it takes the wake
pointers its previous owner read but never acknowledged, and sweeps once more a lease
period later (for a read that was in flight); an idle worker's tick is a heartbeat and
one renewal call for all its leases (``lease_store.py``).

What runs the entities of a partition is a :class:`PartitionUser` (the
worker's runners): it is told when a partition is adopted or lost and gets the
swept pointers.

Failures stay local to their partition: each lease is renewed on its own (on a Redis
Cluster each goes to its partition's master, concurrently), so a master that
is down costs only the partitions it holds, which lapse when their lease runs out;
the others are renewed, acquired and swept as usual. The heartbeat failing (the
worker registry's master is down) does not stop the renewals either: the tick goes
on with the workers it saw last.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import time
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import anyio

from . import metrics
from .config import Settings
from .errors import RedisFullError, describe
from .lease_store import Renewal
from .store import TRANSIENT_ERRORS, BadItem, Pointer, Store

log = logging.getLogger("wakeful.leases")


def new_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


def rendezvous_owner(partition: int, workers: list[str]) -> str | None:
    """The worker that should own ``partition``: stable, and moves few partitions on change."""
    if not workers:
        return None
    return max(workers, key=lambda w: zlib.crc32(f"{w}/{partition}".encode()))


@dataclass
class Lease:
    token: str
    valid_until: float  # time.monotonic(); conservative: measured from before the renew call
    draining: bool = False

    def valid(self) -> bool:
        return time.monotonic() < self.valid_until

    def extend(self, until: float) -> None:
        """A renewal sent at ``until - ttl`` went through. Never moves the expiry back:
        the stall guard's thread renews too, and an older renewal's answer can come
        later."""
        if until > self.valid_until:
            self.valid_until = until


def _cause(exc: BaseException) -> str:
    """Why a lease tick failed, in words: a full Redis is not an unreachable one."""
    if isinstance(exc, RedisFullError):
        return "Redis is full"
    return "Redis unreachable"


class PartitionUser(Protocol):
    """What runs the entities of the partitions the keeper holds."""

    def adopt(self, partition: int) -> None:
        """The partition is now held: start tracking its wake pointers."""

    def abandon(self, partition: int, reason: str) -> None:
        """The partition is lost or handed over: stop its wakes, forget its pointers."""

    def schedule(self, pointer: Pointer) -> None:
        """Wake the entity of ``pointer`` (a pointer swept from the partition's inbox)."""

    def busy(self, partition: int) -> bool:
        """Whether a wake of the partition is still running."""

    def stranded(self) -> set[int]:
        """Partitions whose pointers a wake left pending unacknowledged, since last asked."""

    def tracked(self, partition: int) -> int:
        """How many of the partition's pointers are scheduled here and not yet done."""


class LeaseKeeper:
    """The leases of one worker; :meth:`run` is its heartbeat loop."""

    def __init__(self, store: Store, settings: Settings, worker_id: str, user: PartitionUser):
        self.store = store
        self.settings = settings
        self.worker_id = worker_id
        self.user = user
        self.held: dict[int, Lease] = {}
        self.changed = asyncio.Event()  # the set of readable partitions changed
        self.on_change: list[Callable[[], None]] = []  # told too (the timer loop)
        # Awaited after a tick that acquired partitions, until they all go through once:
        # what the worker keeps in Redis beside its leases (its types) is put back, since
        # an acquisition also follows a Redis that lost its data (a restart without
        # persistence, a failover to an empty replica), which took the leases with it.
        self.on_acquired: list[Callable[[], Awaitable[None]]] = []
        self._acquired_pending = False
        self.ready = asyncio.Event()  # set after the first successful tick
        self._sweep_at: dict[int, float] = {}  # partition -> when to sweep it again
        self._pending: dict[int, Renewal] = {}  # the last renewal's pending counts
        self._live: list[str] = [worker_id]  # the workers the last heartbeat saw
        self._failing: str | None = None  # the cause of the failing ticks, while they fail
        self._said: dict[str, str] = {}  # topic -> the failure last warned of (_warn_once)
        # When the last renewal that Redis answered was sent (time.monotonic()): the
        # stall guard renews in its place once this is overdue (stall_guard.py).
        self.renewed_at = time.monotonic()

    # -- queries -------------------------------------------------------------

    def token(self, partition: int) -> str | None:
        """The fencing token of ``partition`` if its lease is held and still valid."""
        lease = self.held.get(partition)
        return lease.token if lease is not None and lease.valid() else None

    def readable(self) -> list[int]:
        """Partitions whose inboxes to read: held, valid, not being handed over."""
        return [p for p in self.held if self.is_readable(p)]

    def is_readable(self, partition: int) -> bool:
        """Whether ``partition`` is one of :meth:`readable`."""
        lease = self.held.get(partition)
        return lease is not None and not lease.draining and lease.valid()

    def active(self) -> list[int]:
        """Partitions held and not being handed over (their timers fire here)."""
        return [p for p, lease in self.held.items() if not lease.draining]

    # -- the loop ------------------------------------------------------------

    async def run(self) -> None:
        """Tick every heartbeat. A failed tick is logged and retried: leases that could
        not be renewed in time are dropped (their wakes stop), so nothing writes on
        a lease another worker may hold by now."""
        interval = self.settings.heartbeat_ms / 1000
        while True:
            try:
                await self.tick()
                self.ready.set()
                self._report(None)
            except TRANSIENT_ERRORS as exc:
                self._report(exc)
                self.expire_invalid(_cause(exc))
            except Exception:  # a failed tick must not end the heartbeat: retry it
                log.exception("worker %s: lease tick failed", self.worker_id)
                self.expire_invalid("the lease tick failed")
            await anyio.sleep(interval)

    def _report(self, exc: BaseException | None) -> None:
        """Log a failed tick by its real cause, once while it lasts, and its end."""
        cause = None if exc is None else _cause(exc)
        if cause == self._failing:
            if exc is not None:
                log.debug("worker %s: lease tick failed again: %s", self.worker_id, exc)
            return
        if exc is None:
            log.warning("worker %s: lease ticks go through again", self.worker_id)
        elif isinstance(exc, RedisFullError):
            log.warning(
                "worker %s: Redis is full (maxmemory reached, policy noeviction): it refuses "
                "the heartbeat, so no partition is taken over until memory is freed; the "
                "leases held are still renewed [%s]",
                self.worker_id,
                exc.detail,
            )
        else:
            log.warning("worker %s: lease tick failed (%s): %s", self.worker_id, cause, exc)
        self._failing = cause

    def _warn_once(self, topic: str, failure: BaseException, message: str, *args: object) -> None:
        """Warn of ``failure`` on ``topic`` once while it lasts (debug after): a Redis
        outage fails the heartbeat and every partition's acquisition at every tick, and
        would otherwise repeat the same lines several times a second."""
        said = type(failure).__name__  # by kind: its text changes (closed, then refused)
        if self._said.get(topic) == said:
            log.debug(message, *args)
            return
        self._said[topic] = said
        log.warning(message, *args)

    def _went_through(self, topic: str) -> None:
        self._said.pop(topic, None)

    async def tick(self) -> None:
        """Heartbeat, renew, acquire, hand over, sweep. Raises (a transient error) only
        when nothing of it went through: the heartbeat and every renewal failed."""
        s = self.settings
        beat: BaseException | None = None
        try:
            live = await self.store.heartbeat(self.worker_id, s.lease_ttl_ms * 2)
            self._went_through("heartbeat")
        except RedisFullError:
            # A full Redis refuses the heartbeat's ZADD, but not a renewal (PEXPIRE grows
            # nothing): keep what is held, take nothing new until memory is freed.
            await self._renew()
            raise
        except TRANSIENT_ERRORS as exc:  # the registry's master is down: go on as last seen
            beat, live = exc, list(self._live)
            self._warn_once(
                "heartbeat", exc, "worker %s: heartbeat failed: %s", self.worker_id, exc
            )
        if self.worker_id not in live:
            live.append(self.worker_id)
        self._live = live
        desired = {p for p in range(s.partitions) if rendezvous_owner(p, live) == self.worker_id}
        changed, renewed = await self._renew()
        self.expire_invalid()
        if beat is not None and not renewed:
            raise beat
        acquired = await self._acquire(desired)
        changed = acquired or changed
        self._acquired_pending = self._acquired_pending or acquired
        await self._after_acquired()
        changed = await self._hand_over(desired) or changed
        await self._reconcile()
        await self._sweep()
        if changed:
            self._changed()

    async def _after_acquired(self) -> None:
        """Run the ``on_acquired`` hooks; a failure is logged and tried at the next tick."""
        if not self._acquired_pending:
            return
        try:
            for hook in self.on_acquired:
                await hook()
        except TRANSIENT_ERRORS as exc:
            log.warning("worker %s: after acquiring partitions: %s", self.worker_id, exc)
            return
        self._acquired_pending = False

    def _changed(self) -> None:
        self.changed.set()
        for tell in self.on_change:
            tell()

    async def _renew(self) -> tuple[bool, bool]:
        """Renew every held lease in one call (on a cluster, concurrently and each on
        its own: one whose master is down keeps its lease until it runs out, the others
        are renewed). Returns (a lease was lost, a renewal went through or there was
        none to do)."""
        ttl_ms = self.settings.lease_ttl_ms
        held = list(self.held.items())
        started = time.monotonic()
        try:
            results = await self.store.renew_all(
                [(p, lease.token) for p, lease in held], ttl_ms, self.worker_id
            )
        except Exception as exc:  # one node, one call: none of them went through
            self._warn_once(
                "renew", exc, "worker %s: renewing its leases failed: %s", self.worker_id, exc
            )
            return False, False
        self._went_through("renew")
        lost, answered = False, not held
        if any(not isinstance(r, Exception) for r in results):
            self.renewed_at = started
        for (partition, lease), result in zip(held, results, strict=True):
            if isinstance(result, Exception):
                self._warn_once(
                    f"renew {partition}",
                    result,
                    "worker %s: renewing the lease of partition %d failed: %s",
                    self.worker_id,
                    partition,
                    result,
                )
                continue
            self._went_through(f"renew {partition}")
            answered = True
            if result:
                lease.extend(started + ttl_ms / 1000)
                self._pending[partition] = result
            elif self.held.get(partition) is lease:
                self.lose(partition, "lease lost")
                lost = True
        return lost, answered

    async def _acquire(self, desired: set[int]) -> bool:
        """Try to acquire each desired partition not held, concurrently; one that fails
        is logged and tried again at the next tick."""
        wanted = sorted(desired - self.held.keys())
        results = await asyncio.gather(
            *(self._acquire_one(p) for p in wanted), return_exceptions=True
        )
        failed: list[tuple[int, Exception]] = []
        for partition, result in zip(wanted, results, strict=True):
            if isinstance(result, BaseException):
                if not isinstance(result, Exception):
                    raise result
                failed.append((partition, result))
        if failed:  # one line for them all: in an outage, every partition fails alike
            self._warn_once(
                "acquire",
                failed[0][1],
                "worker %s: acquiring partition(s) %s failed: %s",
                self.worker_id,
                ", ".join(str(p) for p, _ in failed),
                describe(failed[0][1]),
            )
        elif wanted:
            self._went_through("acquire")
        # held, even if setting up its group or sweeping it failed: readers should know
        return any(p in self.held for p in wanted)

    async def _acquire_one(self, partition: int) -> bool:
        ttl_ms = self.settings.lease_ttl_ms
        started = time.monotonic()
        token = await self.store.acquire(partition, self.worker_id, ttl_ms)
        if token is None:
            return False  # still held by its previous owner; it hands it over when it sees us
        self.held[partition] = Lease(token, started + ttl_ms / 1000)
        self.user.adopt(partition)
        log.info("worker %s acquired partition %d (%s)", self.worker_id, partition, token)
        # Once more a lease period on: a pointer its previous owner read after this
        # claim (a zombie's read in flight) is idle by then, and taken; and so is one
        # this claim took over if it fails here (Redis may have applied it, its reply
        # lost). Scheduled first, so that a failure below cannot skip it.
        self._sweep_at[partition] = time.monotonic() + ttl_ms / 1000
        await self.store.ensure_group(partition)
        await self._take_pending(partition, 0)
        return True

    async def _hand_over(self, desired: set[int]) -> bool:
        changed = False
        for partition, lease in list(self.held.items()):
            if partition not in desired and not lease.draining:
                lease.draining = True  # stop reading; released once its runners are done
                changed = True
            if lease.draining and not self.user.busy(partition):
                try:
                    await self.store.release(partition, lease.token)
                except TRANSIENT_ERRORS as exc:  # it runs out on its own
                    log.warning(
                        "worker %s: releasing partition %d failed: %s",
                        self.worker_id,
                        partition,
                        exc,
                    )
                self.held.pop(partition, None)
                self.user.abandon(partition, "handed over")
                log.info("worker %s handed over partition %d", self.worker_id, partition)
        return changed

    async def _sweep(self) -> None:
        """A lease period after each acquisition: take over the pointers still pending
        for another worker, idle longer than the lease (read by the previous owner
        after the acquisition's claim, and not put back: see ``Listeners._put_back``);
        and a lease period after a wake here gave up on its pointers unacknowledged
        (its lease was invalid for a moment, parking failed): take them again. Not every
        tick: an idle worker sends nothing for it."""
        ttl_ms = self.settings.lease_ttl_ms
        now = time.monotonic()
        for partition in self.user.stranded():  # idle for a lease period by then
            self._sweep_at[partition] = max(self._sweep_at.get(partition, 0.0), now + ttl_ms / 1000)
        for partition, when in list(self._sweep_at.items()):
            lease = self.held.get(partition)
            if lease is None or lease.draining:
                del self._sweep_at[partition]
                continue
            if now < when:
                continue
            try:
                await self._take_pending(partition, ttl_ms)
            except TRANSIENT_ERRORS as exc:  # its master is down: the others go on
                log.warning(
                    "worker %s: sweeping the inbox of partition %d failed: %s",
                    self.worker_id,
                    partition,
                    exc,
                )
                # Again a lease period on: a claim Redis applied without its reply
                # reaching here made the pointers it took look fresh (idle 0).
                self._sweep_at[partition] = time.monotonic() + ttl_ms / 1000
                continue
            del self._sweep_at[partition]

    async def _reconcile(self) -> None:
        """Reconcile the pending pointers the renewal counted with the ones this worker
        tracks, for each held partition (docs/design.md, "Pending pointers are
        reconciled"):

        * a pointer pending for another consumer is one nobody will process (a read
          that reached Redis after this worker's acquisition claim, by a worker that
          died before putting it back): taken over at once;
        * more pointers pending for this worker than it tracks are reads whose reply
          never came, or pointers a wake gave up: taken once idle for a lease period.

        Each renewal looks again, so a claim that fails, or whose reply is lost (its
        pointers then look fresh), is retried at a later tick: nothing is left to a
        one-off sweep."""
        pending, self._pending = self._pending, {}
        ttl_ms = self.settings.lease_ttl_ms
        for partition, renewal in sorted(pending.items()):
            lease = self.held.get(partition)
            if lease is None or lease.draining:
                continue
            try:
                if renewal.others_pending:
                    log.info(
                        "worker %s: taking over %d pointer(s) of partition %d pending for "
                        "another worker (read after this worker acquired the partition)",
                        self.worker_id,
                        renewal.others_pending,
                        partition,
                    )
                    await self._take(
                        partition, await self.store.claim_others(partition, self.worker_id)
                    )
                if renewal.own_pending > self.user.tracked(partition):
                    await self._take_pending(partition, ttl_ms)
            except TRANSIENT_ERRORS as exc:  # the next renewal counts them again
                log.warning(
                    "worker %s: taking over the pointers of partition %d failed: %s",
                    self.worker_id,
                    partition,
                    exc,
                )
            except Exception:  # not expected: the other partitions, and the tick, go on
                log.exception(
                    "worker %s: taking over the pointers of partition %d failed",
                    self.worker_id,
                    partition,
                )

    async def _take_pending(self, partition: int, min_idle_ms: int) -> None:
        """Schedule the partition's pending pointers idle for ``min_idle_ms``; move a bad
        one aside. A partition whose claim fails is logged and swept again later, so
        the other partitions' leases are still renewed and acquired."""
        try:
            pointers = await self.store.claim_pending(partition, self.worker_id, min_idle_ms)
        except TRANSIENT_ERRORS:
            raise
        except Exception:
            log.exception(
                "worker %s: sweeping the inbox of partition %d failed", self.worker_id, partition
            )
            return
        await self._take(partition, pointers)

    async def _take(self, partition: int, pointers: list[Pointer | BadItem]) -> None:
        """Schedule pointers claimed for ``partition``; move a bad one aside."""
        metrics.REDELIVERIES.inc(len(pointers))
        for pointer in pointers:
            if isinstance(pointer, BadItem):
                await self.quarantine(pointer)
            else:
                self.user.schedule(pointer)

    async def quarantine(self, bad: BadItem) -> None:
        """Log ``bad`` and move it to its partition's dead-letter stream (while we hold
        the lease); a failure is logged, and the item is met again at a later sweep."""
        log.error(
            "worker %s: %s; moved to %s",
            self.worker_id,
            bad.describe(),
            self.store.keys.bad(bad.partition),
        )
        token = self.token(bad.partition)
        if token is None:
            return
        try:
            await self.store.quarantine(bad, token, self.worker_id)
        except TRANSIENT_ERRORS:
            raise
        except Exception:
            log.exception("worker %s: moving %s aside failed", self.worker_id, bad.describe())

    # -- losing and releasing -------------------------------------------------

    def expire_invalid(self, cause: str = "Redis unreachable") -> None:
        """Drop the leases that ran out while ticks failed (``cause``: why they did)."""
        for partition, lease in list(self.held.items()):
            if not lease.valid():
                self.lose(partition, f"lease expired ({cause})")

    def lose(self, partition: int, reason: str) -> None:
        log.warning("worker %s lost partition %d: %s", self.worker_id, partition, reason)
        self.held.pop(partition, None)
        self.user.abandon(partition, reason)
        self._changed()

    async def release_all(self) -> None:
        """Hand back every lease and leave the worker set (graceful shutdown)."""
        try:
            for partition, lease in list(self.held.items()):
                await self.store.release(partition, lease.token)
            await self.store.heartbeat(self.worker_id, None)
        except TRANSIENT_ERRORS:
            pass  # Redis is gone: the leases expire on their own
        self.held.clear()
