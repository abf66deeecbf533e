"""The hot wake path: what a wake reads and writes beyond its handler.

A wake that talks to another entity has its pointers acknowledged by the delivery,
so its commit adds no pointer that would cost a wake of its own. Pointers read by
the WAKES script come with their entities' metadata and log after the cursor, so a
warm (or new) entity wakes without a load; a warm state that another owner moved
past, a re-created entity, a crash after the skipped load and a fenced zombie are
each handled as a load would be: nothing lost, nothing applied twice."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import OutOfMemoryError

from tests.faults import SimulatedCrash, lapse_soon
from tests.script_helpers import two_inboxes_with_a_pointer
from wakeful import Collection, HandlerContext, Message, Registry, Runtime, Settings
from wakeful.cache import WarmCache
from wakeful.delivery import Chain
from wakeful.errors import RedisFullError, ReplicaWaitError
from wakeful.events import Created, DeliveryFailed, encode_event, pack
from wakeful.keys import GROUP
from wakeful.runners import Runners, Slots
from wakeful.store import SEND_WAKE, SEND_WAKE_AFTER, Loaded, Pointer, Preloaded, Script, Store
from wakeful.ticket import WakeTicket

pytestmark = pytest.mark.anyio

SENDER, TARGET = "/sender/s", "/target/t"


def app(seen: list[object]) -> Registry:
    reg = Registry()

    @reg.entity("sender")
    async def sender(ctx: HandlerContext) -> None:
        for message in ctx.wake.messages:
            await ctx.send(TARGET, message.payload)

    @reg.entity("target")
    async def target(ctx: HandlerContext) -> None:
        seen.extend(m.payload for m in ctx.wake.messages)

    return reg


async def pointers_of(rt: Runtime, url: str) -> list[str]:
    """The ids of the wake pointers to ``url`` left in its partition inbox."""
    assert rt.store is not None
    keys = rt.store.keys
    entries = await rt.store.redis.xrange(keys.inbox(keys.partition(url)))
    return [entry_id.decode() for entry_id, fields in entries if fields[b"u"].decode() == url]


async def test_a_wake_that_sends_is_acknowledged_by_its_delivery_without_a_second_wake(cluster):
    seen: list[object] = []
    rt = await cluster.runtime(app(seen))
    assert rt.worker is not None and rt.store is not None
    await rt.send(SENDER, "hello")
    assert (await rt.wait_idle(SENDER)).status == "idle"
    assert (await rt.wait_idle(TARGET)).status == "idle"
    assert seen == ["hello"]
    # Once the sender is idle (its outbox delivered) nothing is left for it: no pointer
    # pending, and no wake ran (or will run) only to acknowledge one.
    assert await pointers_of(rt, SENDER) == []
    assert b"woke" not in await rt.store.meta(SENDER)
    assert rt.worker.stats["activations"] == 2  # the sender's wake and the target's


async def test_messages_that_arrive_during_the_delivery_get_a_pointer_from_its_mark(cluster):
    seen: list[object] = []
    rt = await cluster.runtime(app(seen))
    for n in range(20):
        await rt.send(SENDER, n)
    assert (await rt.wait_idle(SENDER)).status == "idle"
    assert (await rt.wait_idle(TARGET)).status == "idle"
    assert sorted(seen) == list(range(20))  # type: ignore[type-var]
    assert await pointers_of(rt, SENDER) == []


# -- wakes that use what the inbox read brought along --------------------------------


class Note(msgspec.Struct):
    key: str
    text: str


def notes_app(gate: asyncio.Event | None = None) -> Registry:
    """``notes`` keeps one row per message; ``gate`` entities wait for ``gate``."""
    reg = Registry()

    @reg.entity("notes", state={"notes": Collection(primary_key="key", row=Note)})
    async def notes(ctx: HandlerContext) -> None:
        for record in ctx.wake.events:
            if isinstance(record.event, Message):
                ctx.db.actions.notes_insert(row=Note(record.id, str(record.event.payload)))

    @reg.entity("gate")
    async def gate_handler(ctx: HandlerContext) -> None:
        if gate is not None and ctx.entity_url == "/gate/g0":
            await gate.wait()

    return reg


async def texts(rt: Runtime, url: str) -> list[str]:
    return [n["text"] for n in (await rt.state(url))["notes"]]


async def until(check: Callable[[], Awaitable[bool]], timeout: float, what: str) -> None:
    async with asyncio.timeout(timeout):
        while not await check():
            await asyncio.sleep(0.02)  # polling a condition, not waiting a fixed time


async def hold_the_reader(rt: Runtime, gate: asyncio.Event, url: str) -> None:
    """Fill the worker's backlog (one slot, a wake that waits for ``gate``, three behind
    it): its reader stops reading until the gate opens, so pointers made meanwhile are
    read later, together. The last of the three is in ``url``'s partition, so its last
    read found pointers there, and its next read of that partition is by the WAKES
    script (with the entities' data).

    It first waits for the worker's earlier wakes to let go of their pointers: a
    pointer still tracked would fill the backlog in a gate pointer's place, and the
    reader, reading on once it is let go, could read the test's next pointers plainly
    (without their entities' data)."""
    assert rt.worker is not None and rt.store is not None
    runners = rt.worker.runners
    await until(lambda: _true(runners.backlog() == 0), 20, "the earlier wakes' end")
    partition = rt.store.keys.partition(url)
    busy = next(
        f"/gate/b{n}" for n in range(10_000) if rt.store.keys.partition(f"/gate/b{n}") == partition
    )
    for gate_url in ("/gate/g0", "/gate/g1", "/gate/g2", busy):
        await rt.send(gate_url, "hold")
    await until(
        lambda: _true(runners.backlog() >= 4 and runners.running(busy)), 20, "a full backlog"
    )


def in_wake_of(url: str) -> bool:
    """Whether the code running now is a wake of ``url`` (its runner's task)."""
    task = asyncio.current_task()
    return task is not None and task.get_name() == f"wake {url}"


async def _true(value: bool) -> bool:
    return value


async def test_pointers_read_with_their_entities_wake_without_a_load(cluster):
    client = await cluster.runtime(notes_app(), run_worker=False)
    urls = [f"/notes/n{i}" for i in range(30)]
    for url in urls:  # new entities, before any worker runs: its first read takes them all
        await client.send(url, f"hello {url}")
        await client.send(url, "again")
    rt = await cluster.runtime(notes_app())
    assert rt.worker is not None
    for url in urls:
        assert (await rt.wait_idle(url)).status == "idle"
        assert await texts(rt, url) == [f"hello {url}", "again"]
    assert rt.worker.stats["loads_skipped"] == len(urls)
    for url in urls:  # warm now: the next wakes read nothing but their pointers either
        await client.send(url, "third")
    for url in urls:
        assert (await rt.wait_idle(url)).status == "idle"
        assert await texts(rt, url) == [f"hello {url}", "again", "third"]


async def test_a_warm_state_behind_another_owners_commits_is_reloaded(cluster):
    """A worker keeps an entity warm when its partition moves away; the next owner
    handles messages (moving the cursor past entries the warm state never read), and
    deletes and re-creates another entity. When the partition comes back, what the
    inbox read brings (the log after the cursor) lacks those entries, or is another
    incarnation's: the wake must load after its own position, or start cold. (Every
    commit writes a snapshot: a state folded wrong would be what the client reads.)"""
    moving = {"lease_ttl_ms": 3000, "heartbeat_interval_ms": 333, "snapshot_every": 1}
    first = await cluster.runtime(notes_app(), **moving)
    assert first.worker is not None and first.store is not None
    keys = first.store.keys
    urls = {
        p: [f"/notes/w{p}-{i}" for i in range(1000) if keys.partition(f"/notes/w{p}-{i}") == p][:2]
        for p in range(keys.partitions)
    }
    for pair in urls.values():  # warm in the first worker, in every partition
        for url in pair:
            await first.send(url, "a")
            assert (await first.wait_idle(url)).status == "idle"
    second = await cluster.runtime(notes_app(), **moving)
    assert second.worker is not None
    await until(lambda: _moved(first, second), 20, "a partition to move to the second worker")
    p = next(iter(second.worker.leases))
    url, again = urls[p]
    for text in ("b1", "b2"):  # two wakes: the first one's writes are behind the cursor
        await second.send(url, text)
        assert (await second.wait_idle(url)).status == "idle"
    await second.delete(again)
    await until(lambda: _gone(second, again), 20, "the delete")
    await second.send(again, "new")
    assert (await second.wait_idle(again)).status == "idle"
    second.worker.listeners.stop_reading()
    await second.worker.listeners.reading_done.wait()
    await second.send(url, "c")  # their pointers wait for the first worker's next read
    await second.send(again, "newer")
    await second.close()
    cluster.runtimes.remove(second)
    assert (await first.wait_idle(url, timeout=20)).status == "idle"
    assert (await first.wait_idle(again, timeout=20)).status == "idle"
    assert await texts(first, url) == ["a", "b1", "b2", "c"]
    assert await texts(first, again) == ["new", "newer"]


async def _moved(first: Runtime, second: Runtime) -> bool:
    assert first.worker is not None and second.worker is not None
    mine = set(second.worker.leases)
    return bool(mine) and not mine & set(first.worker.leases)


async def test_a_warm_entity_deleted_and_re_created_starts_from_its_new_incarnation(cluster):
    gate = asyncio.Event()
    rt = await cluster.runtime(notes_app(gate), max_concurrency=1)
    assert rt.worker is not None
    url = "/notes/d"
    await rt.send(url, "old")
    assert (await rt.wait_idle(url)).status == "idle"  # warm now
    await rt.delete(url)
    await until(lambda: _true(not rt.worker.runners.running(url)), 20, "the delete")
    await until(lambda: _gone(rt, url), 20, "the delete")
    await hold_the_reader(rt, gate, url)
    await rt.send(url, "new")  # a new incarnation, read with its pointer
    skipped = rt.worker.stats["loads_skipped"]
    gate.set()
    assert (await rt.wait_idle(url)).status == "idle"
    assert rt.worker.stats["loads_skipped"] > skipped
    assert await texts(rt, url) == ["new"]


async def _gone(rt: Runtime, url: str) -> bool:
    assert rt.store is not None
    return not await rt.store.meta(url)


@pytest.mark.parametrize("point", ["wake:preloaded", "wake:before-commit"])
async def test_a_crash_after_a_skipped_load_loses_nothing_and_applies_nothing_twice(cluster, point):
    gate = asyncio.Event()
    first = await cluster.runtime(notes_app(gate), max_concurrency=1)
    assert first.worker is not None
    url = "/notes/c"
    await first.send(url, "one")
    assert (await first.wait_idle(url)).status == "idle"  # warm
    crashed = asyncio.Event()

    def hook(name: str) -> None:
        # The gate entities' wakes pass the same points, perhaps while this entity's
        # runner waits for the slot: only its own wake crashes.
        if name == point and in_wake_of(url) and not crashed.is_set():
            crashed.set()
            first.worker.kill()
            raise SimulatedCrash(name)

    await hold_the_reader(first, gate, url)
    await first.send(url, "two")
    await first.send(url, "three")
    first.worker.fault_hook = hook
    gate.set()
    await asyncio.wait_for(crashed.wait(), 15)
    assert first.worker.stats["loads_skipped"] >= 1
    await lapse_soon(first)
    await first.close()
    cluster.runtimes.remove(first)
    second = await cluster.runtime(notes_app())
    assert (await second.wait_idle(url, timeout=30)).status == "idle"
    assert await texts(second, url) == ["one", "two", "three"]


async def test_a_zombie_with_a_warm_state_and_a_preload_writes_nothing(cluster):
    """A worker whose lease was taken over keeps its warm state and what its read
    brought; its commit is fenced (the lease token), and the new owner handles the
    message once."""
    gate = asyncio.Event()
    first = await cluster.runtime(notes_app(gate), max_concurrency=1)
    assert first.worker is not None and first.store is not None
    url = "/notes/z"
    await first.send(url, "one")
    assert (await first.wait_idle(url)).status == "idle"  # warm
    keys = first.store.keys
    p = keys.partition(url)
    taken = asyncio.Event()

    def hook(name: str) -> None:
        if name == "wake:before-commit" and in_wake_of(url):
            taken.set()

    await hold_the_reader(first, gate, url)
    await first.send(url, "two")
    first.worker.fault_hook = hook
    # Another owner's token: the first worker's commit must be refused.
    await first.store.redis.set(keys.lease(p), "someone-else:1")
    gate.set()
    await asyncio.wait_for(taken.wait(), 15)
    # Its wake read nothing but the pointer (the gate entities' wakes count too).
    await until(lambda: _true(first.worker.stats["loads_skipped"] >= 1), 20, "a preloaded wake")
    await until(lambda: _true(first.worker.stats["commits_fenced"] >= 1), 20, "the fence")
    log_ids = [i for i, _ in await first.store.read_log(url)]
    await first.store.redis.delete(keys.lease(p))
    first.worker.fault_hook = None
    assert (await first.wait_idle(url, timeout=30)).status == "idle"
    assert await texts(first, url) == ["one", "two"]
    assert len([i for i, _ in await first.store.read_log(url)]) > len(log_ids)


async def test_a_preload_read_while_the_entity_woke_here_or_the_lease_moved_is_not_used():
    """What the inbox read brought is used only if no activation of the entity started
    or ended in this worker while the read was in flight (its commits may be missing),
    and under the lease it was read under (another owner may have committed)."""
    preload = Preloaded(Loaded({}, None, None, []), truncated=False)
    seen: list[Preloaded | None] = []

    async def activate(ticket: WakeTicket) -> None:
        seen.append(ticket.preload)
        runners.done(ticket)

    async def crashed(ticket: WakeTicket, exc: Exception) -> None:
        raise AssertionError(exc)

    stats = {"commits_fenced": 0}
    cache = WarmCache(10, lambda url: None)
    lease = ["t1"]
    runners = Runners(Settings(), "w", cache, stats, lambda p: lease[0], activate, crashed)
    async with asyncio.TaskGroup() as group:
        runners.open(group)
        runners.adopt(0)
        mark = runners.reading([0])  # a read is sent; nothing woke the entity since: fresh
        runners.schedule(Pointer(0, "1-0", "/notes/x", preload), mark)
        runners.read_done(mark)
        await runners.idle.wait()
        mark = runners.reading([0])  # a read is sent, and the entity wakes meanwhile (swept)
        runners.schedule(Pointer(0, "2-0", "/notes/x"))
        await runners.idle.wait()
        runners.schedule(Pointer(0, "3-0", "/notes/x", preload), mark)  # it returns: stale
        runners.read_done(mark)
        await runners.idle.wait()
        mark = runners.reading([0])  # a read is sent, and the lease is lost and taken again
        lease[0] = "t2"
        runners.schedule(Pointer(0, "4-0", "/notes/y", preload), mark)
        runners.read_done(mark)
        await runners.idle.wait()
        runners.close()
    assert seen == [preload, None, None, None]


async def test_each_read_in_flight_keeps_its_own_mark():
    """The inbox read and the reads deliveries make with their sends are in flight at
    once: a read sent after an activation ended may use what it brought, while one sent
    before it may not, whatever returned in between, and however many entries the
    runners prune meanwhile."""
    preload = Preloaded(Loaded({}, None, None, []), truncated=False)
    seen: list[Preloaded | None] = []

    async def activate(ticket: WakeTicket) -> None:
        seen.append(ticket.preload)
        runners.done(ticket)

    async def crashed(ticket: WakeTicket, exc: Exception) -> None:
        raise AssertionError(exc)

    cache = WarmCache(10, lambda url: None)
    runners = Runners(Settings(), "w", cache, {}, lambda p: "t1", activate, crashed)
    async with asyncio.TaskGroup() as group:
        runners.open(group)
        runners.adopt(0)
        blocking = runners.reading([0])  # the inbox read, blocked
        runners.schedule(Pointer(0, "1-0", "/notes/x"))  # swept: /notes/x wakes here
        await runners.idle.wait()
        delivery = runners.reading([0])  # a delivery's send, after that wake
        runners.schedule(Pointer(0, "2-0", "/notes/x", preload), delivery)
        runners.read_done(delivery)
        await runners.idle.wait()
        for n in range(10_000):  # other entities' wakes, and a read that returns: a prune
            runners.cancel(f"/notes/other{n}", "stop")
        runners.read_done(runners.reading([0]))
        runners.schedule(Pointer(0, "3-0", "/notes/x", preload), blocking)  # stale
        runners.read_done(blocking)
        await runners.idle.wait()
        runners.close()
    assert seen == [None, preload, None]


async def test_a_delivery_to_a_partition_held_here_wakes_its_target_without_a_load(cluster):
    """A send a wake's delivery makes to an entity whose partition this worker holds
    reads the pointer it adds in the same script (SEND_WAKE), with the target's metadata
    and log tail: the target's wake loads nothing, and no inbox read is needed."""
    seen: list[object] = []
    rt = await cluster.runtime(app(seen))
    assert rt.worker is not None and rt.store is not None
    if rt.store.router is not None:
        pytest.skip("on a cluster a send never reads (the doorbell wakes the reader)")
    loaded: list[str] = []
    load = rt.store.load

    async def counting(url: str, after: str | None, page: int = 1000) -> Loaded:
        loaded.append(url)
        return await load(url, after, page)

    rt.store.load = counting  # type: ignore[method-assign]
    for n in range(5):
        await rt.send(SENDER, n)
        assert (await rt.wait_idle(SENDER)).status == "idle"
        assert (await rt.wait_idle(TARGET)).status == "idle"
    assert seen == [0, 1, 2, 3, 4]
    assert TARGET not in loaded, loaded
    assert rt.worker.stats["local_reads"] == 5


async def test_a_send_reads_only_for_a_partition_this_worker_reads(cluster):
    """A delivery's send reads its target's pointers only where the inbox reader would
    read them: a held, valid lease not being handed over, a subscribed cancel channel
    (a wake must not start before), room in the backlog, a worker not stopping."""
    rt = await cluster.runtime(app([]))
    assert rt.worker is not None and rt.store is not None
    if rt.store.router is not None:
        pytest.skip("on a cluster a send never reads")
    listeners, runners = rt.worker.listeners, rt.worker.runners
    p = rt.store.keys.partition(TARGET)
    await until(lambda: _true(listeners.cancels.hears(p)), 20, "the cancel channel")

    def reads() -> bool:
        read = listeners.local_read(p)
        if read is not None:
            runners.read_done(read.mark)
        return read is not None

    assert reads()
    lease = rt.worker.leases[p]
    lease.draining = True  # being handed over
    assert not reads()
    lease.draining = False
    valid_until, lease.valid_until = lease.valid_until, 0.0  # lapsed here
    assert not reads()
    lease.valid_until = valid_until
    listeners.cancels._held.discard(p)  # its cancel channel not subscribed yet
    assert not reads()
    listeners.cancels._held.add(p)
    runners._tracked[p].update(f"{n}-0" for n in range(rt.settings.max_concurrency * 4))
    assert not reads()  # the backlog is full
    runners._tracked[p].clear()
    assert reads()
    listeners.stop_reading()
    assert not reads()


def after_send_wake(
    rt: Runtime, failure: Callable[[Any], BaseException], *, chained: bool = False
) -> list[int]:
    """Make the first SEND_WAKE of ``rt``'s store run and then raise ``failure(reply)``;
    returns the partitions the runners strand from then on. ``chained``: the send goes
    in the round trip of its sender's commit (SEND_WAKE_AFTER, the default on one
    Redis), and that round trip's reply is lost; else the outbox is delivered after the
    commit (as on a cluster, with a tracer, or for a large fan-out)."""
    assert rt.store is not None and rt.worker is not None
    run, run_chain, strand = rt.store._run, rt.store._run_chain, rt.worker.runners.strand
    stranded: list[int] = []
    failed: list[bool] = []

    async def failing(script: Script, keys: list[str], args: list[Any], **kw: Any) -> Any:
        reply = await run(script, keys, args, **kw)
        if script is SEND_WAKE and not failed:
            failed.append(True)
            raise failure(reply)
        return reply

    async def failing_chain(calls: list[tuple[Script, list[str], list[Any]]]) -> list[Any]:
        replies = await run_chain(calls)
        if any(script is SEND_WAKE_AFTER for script, _, _ in calls) and not failed:
            failed.append(True)
            raise failure(replies)
        return replies

    def stranding(partition: int) -> None:
        stranded.append(partition)
        strand(partition)

    rt.store._run = failing  # type: ignore[method-assign]
    rt.store._run_chain = failing_chain  # type: ignore[method-assign]
    if not chained:
        rt.worker.delivery.prepare = lambda ticket, batch, ack=False: Chain([])  # type: ignore[method-assign]
    rt.worker.runners.strand = stranding  # type: ignore[method-assign]
    return stranded


@pytest.mark.parametrize("chained", [False, True], ids=["after-commit", "with-commit"])
async def test_a_send_whose_reply_is_lost_leaves_what_it_read_to_the_sweep(cluster, chained):
    """The script ran and read the target's pointer for this worker, but its reply
    never came (a connection lost): the pointer is pending here, unscheduled. The
    partition is stranded, and the worker's own sweep wakes the target a lease period
    later; the redelivery of the outbox is deduplicated. The same when the send went
    in its sender's commit's round trip, whose reply is lost: the wake runs again (it
    delivers the outbox its commit wrote, the keys deduplicating)."""
    seen: list[object] = []
    rt = await cluster.runtime(app(seen), lease_ttl_ms=1000)
    assert rt.store is not None
    if rt.store.router is not None:
        pytest.skip("on a cluster a send never reads")
    lost = RedisConnectionError("the reply was lost")
    stranded = after_send_wake(rt, lambda reply: lost, chained=chained)
    await rt.send(SENDER, "hello")
    assert (await rt.wait_idle(SENDER, timeout=30)).status == "idle"
    assert (await rt.wait_idle(TARGET, timeout=30)).status == "idle"
    assert seen == ["hello"]
    assert stranded == [rt.store.keys.partition(TARGET)]


async def test_sends_a_broken_chain_left_unsent_are_delivered_after_it_in_order(cluster):
    """The sends of a commit's round trip after one that errored do not run (the chain
    is broken): the worker sends them itself, in order, each once."""
    seen: list[object] = []
    reg = Registry()

    @reg.entity("sender")
    async def sender(ctx: HandlerContext) -> None:
        for _ in ctx.wake.messages:
            for text in ("one", "two", "three"):
                await ctx.send(TARGET, text)

    @reg.entity("target")
    async def target(ctx: HandlerContext) -> None:
        seen.extend(m.payload for m in ctx.wake.messages)

    rt = await cluster.runtime(reg)
    assert rt.store is not None
    if rt.store.router is not None:
        pytest.skip("on a cluster the sends go after the commit")
    run_chain = rt.store._run_chain
    broken: list[int] = []

    async def breaking(calls: list[tuple[Script, list[str], list[Any]]]) -> list[Any]:
        if len(calls) < 4 or broken:
            return await run_chain(calls)
        broken.append(len(calls))  # the commit and the first send run; the rest do not
        replies = await run_chain(calls[:2])
        return [*replies, *(RedisConnectionError("not run") for _ in calls[2:])]

    rt.store._run_chain = breaking  # type: ignore[method-assign]
    await rt.send(SENDER, "go")
    assert (await rt.wait_idle(SENDER, timeout=30)).status == "idle"
    await until(lambda: _true(len(seen) >= 3), 30, "the three messages")
    assert (await rt.wait_idle(TARGET, timeout=30)).status == "idle"
    assert broken == [5]  # the commit, three sends, the mark
    assert seen == ["one", "two", "three"]


@pytest.mark.parametrize("chained", [False, True], ids=["after-commit", "with-commit"])
async def test_a_send_refused_by_a_full_redis_is_delivered_later_not_failed(cluster, chained):
    """A send that a Redis at its memory limit refused is delivered again later (the
    outbox stays undelivered), not reported to its sender as a failed delivery: the
    message arrives once, and the sender hears of no failure."""
    seen: list[object] = []
    rt = await cluster.runtime(app(seen))
    assert rt.store is not None and rt.worker is not None
    if chained and rt.store.router is not None:
        pytest.skip("on a cluster the sends go after the commit")
    send, run_chain = rt.store.send, rt.store._run_chain
    refused: list[bool] = []

    async def full_once(call: Any) -> Any:
        if call.url == TARGET and not refused:
            refused.append(True)
            raise RedisFullError("OOM command not allowed when used memory > 'maxmemory'")
        return await send(call)

    async def chain_full_once(calls: list[tuple[Script, list[str], list[Any]]]) -> list[Any]:
        if len(calls) < 2 or refused:
            return await run_chain(calls)
        refused.append(True)  # the commit runs; its send is refused as Redis would
        replies = await run_chain(calls[:1])
        return [*replies, *(OutOfMemoryError("OOM command not allowed") for _ in calls[1:])]

    rt.store.send = full_once  # type: ignore[method-assign]
    rt.store._run_chain = chain_full_once  # type: ignore[method-assign]
    if not chained:
        rt.worker.delivery.prepare = lambda ticket, batch, ack=False: Chain([])  # type: ignore[method-assign]
    await rt.send(SENDER, "hello")
    await until(lambda: _true(seen == ["hello"]), 30, "the message to arrive")
    assert (await rt.wait_idle(SENDER, timeout=30)).status == "idle"
    assert refused == [True]
    failed = [r.event async for r in rt.events(SENDER) if isinstance(r.event, DeliveryFailed)]
    assert failed == []


async def test_a_send_applied_with_too_few_replicas_schedules_what_it_read(cluster):
    """The script ran and its reply came, with too few replicas confirming it
    (ReplicaWaitError): what it read is scheduled at once, not left to a sweep."""
    seen: list[object] = []
    rt = await cluster.runtime(app(seen), lease_ttl_ms=60_000)
    assert rt.store is not None
    if rt.store.router is not None:
        pytest.skip("on a cluster a send never reads")
    stranded = after_send_wake(rt, lambda reply: ReplicaWaitError("SEND_WAKE", 0, 1, 10, reply))
    await rt.send(SENDER, "hello")
    assert (await rt.wait_idle(SENDER, timeout=20)).status == "idle"
    assert (await rt.wait_idle(TARGET, timeout=20)).status == "idle"
    assert seen == ["hello"]
    assert stranded == []


async def test_wake_slots_bound_the_wakes_in_order_and_a_cancelled_waiter_leaks_none():
    slots = Slots(2)
    inside: list[int] = []
    most = 0
    order: list[int] = []
    release = asyncio.Event()

    async def wake(n: int) -> None:
        nonlocal most
        async with slots:
            order.append(n)
            inside.append(n)
            most = max(most, len(inside))
            await release.wait()
            inside.remove(n)

    async with asyncio.TaskGroup() as group:
        tasks = [group.create_task(wake(n)) for n in range(6)]
        while len(order) < 2:
            await asyncio.sleep(0)  # let the first two in (yield, no wall time)
        tasks[2].cancel()  # a waiter given up: its place goes to the next
        release.set()
        await asyncio.gather(*tasks[3:])
    assert most == 2
    assert order == [0, 1, 3, 4, 5]
    async with slots, slots:  # both slots are free again
        pass


def test_a_started_holder_takes_its_turn_with_the_waiters():
    """``Slots.start`` runs its holder at once while a slot is free, and otherwise when
    a slot is handed on, in turn with the holders that wait for one; a holder that
    declines (its runner ended meanwhile) passes the slot on."""
    slots = Slots(1)
    began: list[str] = []

    def holder(name: str, takes: bool = True) -> Callable[[], bool]:
        def begin() -> bool:
            began.append(name)
            return takes

        return begin

    slots.start(holder("a"))  # free: at once
    slots.start(holder("b"))  # queued
    slots.start(holder("c", takes=False))
    slots.start(holder("d"))
    assert began == ["a"]
    slots.release()  # a's slot goes to b
    assert began == ["a", "b"]
    slots.release()  # b's: c declines, so d has it
    assert began == ["a", "b", "c", "d"]
    slots.release()  # d's: now free
    slots.start(holder("e"))
    assert began == ["a", "b", "c", "d", "e"]


def bare_runners(
    slots: int,
    activate: Callable[[WakeTicket], Awaitable[None]],
    crashed: Callable[[WakeTicket, Exception], Awaitable[None]],
) -> Runners:
    """Runners with ``slots`` slots under a lease that never lapses, and no worker."""
    settings = Settings(max_concurrency=slots)
    cache = WarmCache(10, lambda url: None)
    return Runners(settings, "w", cache, {}, lambda p: "t", activate, crashed)


def wake_tasks() -> int:
    """The runners' tasks that exist now (each is named after its entity's wake)."""
    return sum(t.get_name().startswith("wake ") for t in asyncio.all_tasks())


async def test_a_burst_of_pointers_makes_no_more_wake_tasks_than_slots():
    """A read of many pointers starts a runner's task only once a slot is free for it:
    with two slots, never more than two wake tasks exist, and every entity wakes once,
    in the order its pointer came."""
    release = asyncio.Event()
    woke: list[str] = []
    most = 0

    async def activate(ticket: WakeTicket) -> None:
        nonlocal most
        most = max(most, wake_tasks())
        woke.append(ticket.url)
        await release.wait()
        runners.done(ticket)

    async def crashed(ticket: WakeTicket, exc: Exception) -> None:
        raise AssertionError(exc)

    runners = bare_runners(2, activate, crashed)
    urls = [f"/notes/n{i}" for i in range(20)]
    async with asyncio.TaskGroup() as group:
        runners.open(group)
        runners.adopt(0)
        for n, url in enumerate(urls):
            runners.schedule(Pointer(0, f"{n + 1}-0", url))
        assert wake_tasks() == 2
        while len(woke) < 2:
            await asyncio.sleep(0)  # let the first two in (yield, no wall time)
        release.set()
        await runners.idle.wait()
        runners.close()
    assert woke == urls
    assert most == 2
    assert runners.backlog() == 0


async def test_closing_ends_every_runner_still_waiting_for_a_slot_however_many():
    """A worker stopping with hundreds of runners queued for a slot: closing the runners
    ends the queued ones at once (their pointers pending, for the next owner), and the
    slots the running ones give back go to no one. A hand-off that recursed through the
    queue overflowed the stack past about 500 runners, inside a running wake, which
    parked that entity with a RecursionError."""
    crashes: list[Exception] = []

    async def activate(ticket: WakeTicket) -> None:
        await asyncio.Event().wait()  # a long model call

    async def crashed(ticket: WakeTicket, exc: Exception) -> None:
        crashes.append(exc)

    runners = bare_runners(4, activate, crashed)
    async with asyncio.TaskGroup() as group:
        runners.open(group)
        runners.adopt(0)
        for n in range(2000):
            runners.schedule(Pointer(0, f"{n + 1}-0", f"/notes/n{n}"))
        await runners.drain(0)  # the grace is over: the running wakes are told to stop
        runners.close()
        assert wake_tasks() == 4
        await runners.stop_all()
    assert crashes == []
    assert runners.idle.is_set()
    assert runners.stranded() == {0}  # pending, for the lease keeper's sweep
    slots = runners._slots
    async with asyncio.timeout(10), slots, slots, slots, slots:
        pass  # every slot was given back


async def test_a_runner_cancelled_before_its_first_step_gives_its_slot_and_place_up():
    """A runner's task is made when a slot is handed to it; a stopping worker can cancel
    it before it ran a step (none of its code runs then). Its slot and its place go
    anyway: the runners end idle, every slot free."""
    go = asyncio.Event()

    async def activate(ticket: WakeTicket) -> None:
        runners.done(ticket)
        if ticket.url == "/notes/a":
            await go.wait()

    async def crashed(ticket: WakeTicket, exc: Exception) -> None:
        raise AssertionError(exc)

    runners = bare_runners(1, activate, crashed)
    async with asyncio.TaskGroup() as group:
        runners.open(group)
        runners.adopt(0)
        runners.schedule(Pointer(0, "1-0", "/notes/a"))
        runners.schedule(Pointer(0, "2-0", "/notes/b"))
        while not go._waiters:  # type: ignore[attr-defined]
            await asyncio.sleep(0)  # a runs and waits (yield, no wall time)
        go.set()
        while not any(t.get_name() == "wake /notes/b" for t in asyncio.all_tasks()):
            await asyncio.sleep(0)  # a ends, and hands its slot to b: b's task is made
        runners.close()
        await runners.stop_all()  # cancels b's task before its first step
    assert runners.idle.is_set()
    assert not runners.running("/notes/b")
    async with asyncio.timeout(10), runners._slots:
        pass  # its slot was given back


async def one_redis_store(cluster: Any) -> Store:
    """A client's store, for the inbox-read tests: on a cluster the inboxes are read
    without the WAKES script, so those skip."""
    rt = await cluster.runtime(run_worker=False)
    store = rt.store
    assert store is not None
    if store.router is not None:
        pytest.skip("on a cluster the inboxes are read without the WAKES script")
    return store


async def test_an_inbox_without_its_group_costs_the_other_partitions_no_pointer(cluster):
    """The WAKES scripts of one read run per partition: one that fails (its consumer
    group is gone, as after a Redis restart without persistence) has delivered nothing,
    but the others delivered their pointers to this worker, so they are returned."""
    store = await one_redis_store(cluster)
    keys = store.keys
    urls, first, second = await two_inboxes_with_a_pointer(store)
    await store.redis.xgroup_destroy(keys.inbox(second), GROUP)
    read = await store.read_wake_pointers([first, second], "me", 10, 0)
    assert [p.url for p in read if isinstance(p, Pointer)] == [urls[first]]
    again = await store.read_wake_pointers([first, second], "me", 10, 0)
    assert [p.url for p in again if isinstance(p, Pointer)] == [urls[second]]


async def test_wakes_reads_only_the_partitions_busy_lately(cluster):
    """WAKES is a script call per partition: it reads the partitions a read found
    pointers in lately, and the others alongside with one plain XREADGROUP, so a
    pointer there is not left behind a busy partition (it comes without its entity's
    data, and its partition is read with WAKES from then on). A read that finds nothing
    (the worker is idle) leaves no partition busy."""
    store = await one_redis_store(cluster)
    keys = store.keys
    urls, first, second = await two_inboxes_with_a_pointer(store)
    wakes: list[list[str]] = []
    run = store._run

    async def counted(script: Script, keys_: list[str], args: list[Any], **kw: Any) -> Any:
        if script.name == "WAKES":
            wakes.append(keys_)
        return await run(script, keys_, args, **kw)

    async def read() -> dict[int, bool]:
        """One read: the partitions of its pointers, and whether each came preloaded."""
        found = await store.read_wake_pointers(partitions, "me", 10, 1)
        return {p.partition: p.preload is not None for p in found if isinstance(p, Pointer)}

    store._run = counted  # type: ignore[method-assign]
    partitions = [first, second]
    assert await read() == {first: True, second: True}  # every partition, at start
    assert sorted(k for [k] in wakes) == sorted(keys.inbox(p) for p in partitions)
    assert await read() == {}  # idle: nothing is busy any more
    wakes.clear()
    await store.redis.xadd(keys.inbox(first), {"u": urls[first]})
    assert await read() == {first: False}  # the blocking read, bare
    assert wakes == []
    await store.redis.xadd(keys.inbox(first), {"u": urls[first]})
    await store.redis.xadd(keys.inbox(second), {"u": urls[second]})
    assert await read() == {first: True, second: False}  # the other read alongside
    assert wakes == [[keys.inbox(first)]]
    wakes.clear()
    await store.redis.xadd(keys.inbox(first), {"u": urls[first]})
    await store.redis.xadd(keys.inbox(second), {"u": urls[second]})
    assert await read() == {first: True, second: True}  # both busy now
    assert sorted(k for [k] in wakes) == sorted(keys.inbox(p) for p in partitions)


async def test_a_plain_read_alongside_wakes_whose_reply_is_lost_names_its_partitions(cluster):
    """The plain read of the partitions not read with WAKES ran but its reply was lost:
    the WAKES read's pointers are returned, and those partitions are passed to
    ``unsure`` (their pointers are pending here unseen)."""
    store = await one_redis_store(cluster)
    keys = store.keys
    urls, first, second = await two_inboxes_with_a_pointer(store)
    await store.read_wake_pointers([first], "me", 10, 0)  # the first is busy, the second not
    await store.redis.xadd(keys.inbox(first), {"u": urls[first]})
    plain = store._read_plain

    async def losing(partitions: list[int], *args: Any) -> Any:
        await plain(partitions, *args)
        raise RedisConnectionError("Connection closed by server.")

    store._read_plain = losing  # type: ignore[method-assign]
    unsure: list[int] = []
    read = await store.read_wake_pointers([first, second], "me", 10, 0, unsure.append)
    assert [p.url for p in read if isinstance(p, Pointer)] == [urls[first]]
    assert unsure == [second]
    assert (await store.redis.xpending(keys.inbox(second), GROUP))["pending"] == 1


async def test_a_partition_whose_read_may_have_been_served_is_named_for_a_sweep(cluster):
    """One partition's WAKES script ran but its reply was lost (a connection broken in
    between), while the other's came: the other's pointer is returned, and the first
    partition is passed to ``unsure``, since its pointer is now pending for this
    consumer, which never saw it (the listener strands it, for the lease keeper's
    sweep)."""
    store = await one_redis_store(cluster)
    keys = store.keys
    urls, first, second = await two_inboxes_with_a_pointer(store)
    run = store._run

    async def losing(script: Script, keys_: list[str], args: list[Any], **kw: Any) -> Any:
        reply = await run(script, keys_, args, **kw)
        if keys_ == [keys.inbox(second)]:
            raise RedisConnectionError("Connection closed by server.")
        return reply

    store._run = losing  # type: ignore[method-assign]
    unsure: list[int] = []
    read = await store.read_wake_pointers([first, second], "me", 10, 0, unsure.append)
    assert [p.url for p in read if isinstance(p, Pointer)] == [urls[first]]
    assert unsure == [second]
    assert (await store.redis.xpending(keys.inbox(second), GROUP))["pending"] == 1


async def test_a_send_refused_in_the_commit_round_trip_reaches_its_sender_and_the_rest_go(cluster):
    """A spawn its target refuses (the child was made meanwhile with other args): the
    sends after it in the chain still go, the mark at the chain's end does not run, and
    the worker marks the outbox with the refusal as the sender's input."""
    seen: list[object] = []
    failed: list[DeliveryFailed] = []
    reg = Registry()
    rt: Runtime

    @reg.entity("sender")
    async def sender(ctx: HandlerContext) -> None:
        failed.extend(r.event for r in ctx.wake.events if isinstance(r.event, DeliveryFailed))
        if ctx.wake.messages:
            await ctx.spawn("target", "t", {"x": 2})
            await ctx.send("/target/other", "after the refusal")
            # The child appears now, with other args, before the commit delivers.
            assert rt.store is not None
            created = encode_event(Created(type="target", args={"x": 1}))
            await rt.store.append_input(
                TARGET, "target", created=created, args=pack({"x": 1}), mode="create"
            )

    @reg.entity("target")
    async def target(ctx: HandlerContext) -> None:
        seen.extend(m.payload for m in ctx.wake.messages)

    rt = await cluster.runtime(reg)
    assert rt.worker is not None
    await rt.send(SENDER, "go")
    await until(lambda: _true(bool(failed)), 30, "the refusal's input")
    assert [(f.kind, f.target) for f in failed] == [("spawn", TARGET)]
    await until(lambda: _true(seen == ["after the refusal"]), 30, "the send after it")
    assert (await rt.wait_idle(SENDER, timeout=30)).status == "idle"
    assert (await rt.status(TARGET)).args == {"x": 1}


async def test_an_outbox_whose_sends_all_go_is_marked_in_its_commits_round_trip(cluster):
    """On one Redis the mark goes behind the sends: a wake that sends is one round trip
    (its commit, its sends, the mark acknowledging its pointer), not two."""
    rt = await cluster.runtime(app([]))
    assert rt.worker is not None and rt.store is not None
    await rt.send(SENDER, "hello")
    assert (await rt.wait_idle(SENDER, timeout=30)).status == "idle"
    assert (await rt.wait_idle(TARGET, timeout=30)).status == "idle"
    fields = await rt.store.meta(SENDER)
    assert fields["out_done"] == fields["out_last"]
    chained = rt.store.chains_sends
    assert rt.worker.stats["marks_chained"] == (1 if chained else 0)
