"""An idle worker polls nothing, yet timers fire on time and hand-overs lose no time.

The timer loop sleeps until the earliest due time it knows of (``due_times.py``):
a timer a handler sets is learned from its commit, not from a poll, so with the
safety-net read a minute away it still fires at its time. A pointer that a worker's
inbox read gets for a partition it handed over while the read was in flight goes
back into the inbox at once (``Listeners._put_back``), so the new owner handles it
now, not a lease period later in a pending sweep (here the lease is a minute).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from typing import Any

import pytest

from tests.apps.harness import until
from tests.test_retention import note_texts, notes_registry
from wakeful import HandlerContext, Registry

pytestmark = pytest.mark.anyio
NO_POLL = {"timer_poll_ms": 60_000}  # the safety-net read never comes during a test
LONG_LEASE = {"lease_ttl_ms": 60_000, "heartbeat_interval_ms": 200}
PRECISION_MS = 5_000  # the documented bound is tens of ms; generous for a loaded machine


def alarm_registry(fired: list[int], rang: asyncio.Event) -> Registry:
    reg = Registry()

    @reg.entity("alarm")
    async def alarm(ctx: HandlerContext) -> None:
        for m in ctx.wake.messages:
            if m.payload in ("arm", "arm later"):
                later = m.payload == "arm later"
                after = dt.timedelta(milliseconds=3000 if later else 300)
                await ctx.send(ctx.entity_url, "rang", after=after)
            elif m.payload == "rang":
                fired.append(int(time.time() * 1000))
                rang.set()

    return reg


async def test_a_timer_set_while_the_worker_is_idle_fires_at_its_time_without_a_poll(cluster):
    fired: list[int] = []
    rang = asyncio.Event()
    rt = await cluster.runtime(alarm_registry(fired, rang), **NO_POLL)
    assert rt.store is not None
    url = "/alarm/idle"
    p = rt.store.keys.partition(url)
    await rt.send(url, "arm")
    [(_, due)] = await until(
        lambda: rt.store.redis.zrange(rt.store.keys.timers(p), 0, -1, withscores=True),
        10,
        "the timer to be set",
    )
    await asyncio.wait_for(rang.wait(), 20)  # without the commit's hint: at the poll, 60 s
    assert 0 <= fired[0] - int(due) < PRECISION_MS


async def test_a_partition_taken_over_fires_its_timers_without_a_poll(cluster):
    fired_first: list[int] = []
    first = await cluster.runtime(alarm_registry(fired_first, asyncio.Event()), **NO_POLL)
    assert first.store is not None
    url = "/alarm/moving"
    p = first.store.keys.partition(url)
    await first.send(url, "arm later")
    [(_, due)] = await until(
        lambda: first.store.redis.zrange(first.store.keys.timers(p), 0, -1, withscores=True),
        10,
        "the timer to be set",
    )
    await first.close()  # gracefully: its leases are handed back at once
    cluster.runtimes.remove(first)
    fired: list[int] = []
    rang = asyncio.Event()
    second = await cluster.runtime(alarm_registry(fired, rang), **NO_POLL)
    await asyncio.wait_for(rang.wait(), 20)  # read when the partition was acquired
    assert fired_first == [] and 0 <= fired[0] - int(due) < PRECISION_MS
    assert second.worker is not None and p in second.worker.leases


async def test_a_pointer_read_across_a_hand_over_reaches_the_new_owner_at_once(cluster):
    first = await cluster.runtime(notes_registry(), **LONG_LEASE)
    assert first.store is not None and first.worker is not None
    read_first = Gate(first.store)
    await read_first.holding.wait()  # its next read covers every partition, and waits
    covered = set(read_first.partitions)

    second = await cluster.runtime(notes_registry(), **LONG_LEASE)
    assert second.store is not None and second.worker is not None
    read_second = Gate(second.store)  # the new owner must not read the pointer itself
    keeper = second.worker.lease_keeper

    async def handed_over() -> set[int]:
        moved = set(keeper.held) - set(first.worker.leases)
        return {p for p in moved if p in keeper._sweep_at}  # acquired, pending taken

    moved = await until(handed_over, 20, "a partition handed over to the second worker")
    p = min(moved & covered)
    url = next(
        u for u in (f"/notes/h{i}" for i in range(1000)) if first.store.keys.partition(u) == p
    )
    await read_second.holding.wait()
    await first.send(url, "add moved")
    read_first.go.set()  # the read decided before the hand-over gets the pointer
    await read_first.returned.wait()
    read_second.go.set()
    assert (await second.wait_idle(url, timeout=10)).status == "idle"
    assert await note_texts(second, url) == ["moved"]


class Gate:
    """Holds ``store``'s next inbox read (with the partitions it was asked for) until
    :attr:`go`; later reads pass."""

    def __init__(self, store: Any) -> None:
        self.read = store.read_wake_pointers
        self.holding = asyncio.Event()
        self.go = asyncio.Event()
        self.returned = asyncio.Event()
        self.partitions: list[int] = []
        store.read_wake_pointers = self.gated

    async def gated(self, partitions: list[int], *args: Any, **kwargs: Any) -> Any:
        if not self.holding.is_set():
            self.partitions = list(partitions)
            self.holding.set()
            await self.go.wait()
            try:
                return await self.read(partitions, *args, **kwargs)
            finally:
                self.returned.set()
        await self.go.wait()
        return await self.read(partitions, *args, **kwargs)


async def test_a_wake_given_up_while_its_lease_was_invalid_runs_once_the_lease_is_back(cluster):
    """No inbox is swept every lease period any more: a pointer a wake leaves pending
    (its lease was invalid for a moment, then renewed) is taken again a lease period on."""
    rt = await cluster.runtime(notes_registry(), lease_ttl_ms=1000)
    assert rt.worker is not None
    runners, leases = rt.worker.runners, rt.worker.leases
    schedule = runners.schedule
    invalidated: list[int] = []

    def lapsing(pointer: Any, mark: Any = None) -> None:
        schedule(pointer, mark)
        if not invalidated:  # its runner finds no valid lease; the next tick renews it
            invalidated.append(pointer.partition)
            leases[pointer.partition].valid_until = 0.0

    keeper = rt.worker.lease_keeper

    async def acquisitions_swept() -> bool:
        return not keeper._sweep_at  # the sweeps after acquiring are behind us

    await until(acquisitions_swept, 20, "the sweeps a lease period after acquiring")
    runners.schedule = lapsing  # type: ignore[method-assign]
    url = "/notes/stranded"
    await rt.send(url, "add once")
    assert (await rt.wait_idle(url, timeout=20)).status == "idle"
    assert invalidated and await note_texts(rt, url) == ["once"]


async def test_an_idle_reader_only_blocks(cluster, monkeypatch):
    """The WAKES read (a script call per partition) is tried only after a read that found
    pointers: an idle worker's reader sends one blocking XREADGROUP per block, and
    nothing per partition (``Store.read_inbox``)."""
    from wakeful.store import Store

    reads: list[str] = []
    watch: dict[str, Any] = {}  # from: where the idle reads start; enough: set at six
    read_inbox, read_preloaded = Store.read_inbox, Store._read_preloaded

    async def counted_read(self: Store, *args: Any) -> Any:
        reads.append("read")
        if "from" in watch and reads[watch["from"] :].count("read") >= 6:
            watch["enough"].set()
        return await read_inbox(self, *args)

    async def counted_preloaded(self: Store, *args: Any) -> Any:
        reads.append("wakes")
        return await read_preloaded(self, *args)

    monkeypatch.setattr(Store, "read_inbox", counted_read)
    monkeypatch.setattr(Store, "_read_preloaded", counted_preloaded)
    fired: list[int] = []
    rt = await cluster.runtime(alarm_registry(fired, asyncio.Event()), **NO_POLL)
    await rt.send("/alarm/quiet", "hello")
    await rt.wait_idle("/alarm/quiet")
    watch["enough"] = asyncio.Event()
    watch["from"] = start = len(reads)
    await asyncio.wait_for(watch["enough"].wait(), 30)  # six reads, each a block
    idle = reads[start:]
    assert idle.count("wakes") <= 1, idle  # at most the one after the last busy read
    await rt.send("/alarm/quiet", "again")  # and a pointer is still read at once
    await rt.wait_idle("/alarm/quiet")
