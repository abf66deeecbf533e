"""Wake pointers: at most one pending per entity, and never none while work is left."""

from __future__ import annotations

import asyncio

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from tests.apps.harness import until
from tests.script_helpers import two_inboxes_with_a_pointer
from wakeful import HandlerContext, Registry
from wakeful.store import Store

pytestmark = pytest.mark.anyio


def app(
    seen: list[object], gate: asyncio.Event | None = None, started: asyncio.Event | None = None
) -> Registry:
    reg = Registry()

    @reg.entity("sink")
    async def sink(ctx: HandlerContext) -> None:
        if started is not None:
            started.set()
        if gate is not None:
            await gate.wait()
        seen.extend(m.payload for m in ctx.wake.messages)

    return reg


async def inbox_len(rt, url: str) -> int:
    keys = rt.store.keys
    return await rt.store.redis.xlen(keys.inbox(keys.partition(url)))


async def test_a_burst_of_messages_adds_one_pointer(cluster):
    seen: list[object] = []
    client = await cluster.runtime(app(seen), run_worker=False)
    for i in range(50):
        await client.send("/sink/a", i)
    assert await inbox_len(client, "/sink/a") == 1
    assert (await client.store.meta("/sink/a"))[b"woke".decode()] == b"1"
    await cluster.runtime(app(seen))  # a worker: one wake takes the whole burst
    await client.wait_idle("/sink/a")
    assert seen == list(range(50))
    meta = await client.store.meta("/sink/a")
    assert "woke" not in meta  # acknowledged, nothing left to do


async def test_input_that_arrives_during_a_wake_gets_a_new_pointer(cluster):
    seen: list[object] = []
    gate, started = asyncio.Event(), asyncio.Event()
    rt = await cluster.runtime(app(seen, gate, started))
    await rt.send("/sink/a", "first")
    await asyncio.wait_for(started.wait(), 10)  # the wake has started and waits at the gate
    await rt.send("/sink/a", "second")  # a pointer is pending already: none is added
    gate.set()
    status = await rt.wait_idle("/sink/a", timeout=10)
    assert status.status == "idle"
    assert seen == ["first", "second"]


async def test_resume_adds_no_second_pointer_to_a_parked_entity_that_has_one(cluster):
    seen: list[object] = []
    client = await cluster.runtime(app(seen), run_worker=False)
    await client.send("/sink/a", "kept")
    assert await inbox_len(client, "/sink/a") == 1
    # Parked while its pointer is still pending (a message sent to a parked entity
    # gets a pointer; the owner acknowledges it later): resume must not add another.
    store = client.store
    await store.redis.hset(store.keys.meta("/sink/a"), "status", "failed")
    await client.resume("/sink/a")
    assert await inbox_len(client, "/sink/a") == 1
    assert (await client.status("/sink/a")).status == "pending"
    await cluster.runtime(app(seen))  # a worker: the one pointer wakes it
    assert (await client.wait_idle("/sink/a", timeout=10)).status == "idle"
    assert seen == ["kept"]
    assert "woke" not in await client.store.meta("/sink/a")


async def test_an_idle_keyspace_has_empty_inboxes(cluster):
    """Acknowledged pointers leave the inbox (bounded memory): after messages, outbox
    deliveries to other entities, a timer and a delete, every inbox is empty."""
    reg = Registry()

    @reg.entity("relay")
    async def relay(ctx: HandlerContext) -> None:
        for m in ctx.wake.messages:
            if m.payload == "ping":
                await ctx.send("/relay/" + ctx.entity_id + "-echo", "pong")
                await ctx.send(ctx.entity_url, "later", after=0.05)

    rt = await cluster.runtime(reg)
    urls = [f"/relay/e{i}" for i in range(20)]
    for url in urls:
        await rt.send(url, "ping")
        await rt.send(url, "again")
    await rt.wait_idle(urls[0], timeout=30)
    await rt.delete(urls[1])

    await rt.wait_all_idle(timeout=30)

    async def inboxes_empty() -> bool:
        keys = rt.store.keys
        lengths = [await rt.store.redis.xlen(keys.inbox(p)) for p in range(keys.partitions)]
        return sum(lengths) == 0

    await until(inboxes_empty, 30, "every inbox to be empty once the keyspace is idle")
    echoes = [(await rt.status(f"{u}-echo")).status for u in urls[2:]]
    assert echoes == ["idle"] * len(urls[2:])


def lose_first_read_reply(rt, url: str) -> list[int]:
    """Make the worker's first inbox read that brings ``url``'s pointer run on the
    server and then raise a connection error, as when Redis served the read and died (or the
    connection broke) before its reply came: the pointers are pending for this worker,
    which never saw them. Returns the partitions the runners strand from then on."""
    store, runners = rt.worker.listeners.store, rt.worker.runners
    read, strand = store.read_wake_pointers, runners.strand
    stranded: list[int] = []
    lost: list[bool] = []

    async def losing(partitions, consumer, count, block_ms, *args, **kwargs):
        pointers = await read(partitions, consumer, count, block_ms, *args, **kwargs)
        if not lost and any(getattr(p, "url", None) == url for p in pointers):
            lost.append(True)
            raise RedisConnectionError("Connection closed by server.")
        return pointers

    def stranding(partition: int) -> None:
        stranded.append(partition)
        strand(partition)

    store.read_wake_pointers = losing
    runners.strand = stranding
    return stranded


@pytest.mark.parametrize("sweep", ["answered", "its reply lost too"])
async def test_an_inbox_read_whose_reply_is_lost_wakes_its_entities_later(cluster, sweep):
    """A read the server served but whose reply never came leaves the pointers pending
    for this (live) worker, which keeps its lease: nobody else claims them. The read's
    partitions are stranded, so the worker's own sweep takes them a lease period later
    and the entity wakes; before, it stayed pending for good (the chaos run's lost
    messages after a Redis restart). A sweep whose claim loses its reply the same way
    (the pointers it took look fresh then) sweeps again a lease period later."""
    seen: list[object] = []
    rt = await cluster.runtime(app(seen), lease_ttl_ms=1000)
    keeper = rt.worker.lease_keeper
    # Past the sweep a lease period after each acquisition, which would hide the loss.
    await until(lambda: _true(keeper.held and not keeper._sweep_at), 30, "the first sweeps")
    stranded = lose_first_read_reply(rt, "/sink/a")
    lost_claims: list[int] = []
    if sweep == "its reply lost too":
        claim = keeper.store.claim_pending

        async def losing(partition: int, *args: object, **kwargs: object) -> list:
            pointers = await claim(partition, *args, **kwargs)  # type: ignore[arg-type]
            if pointers and not lost_claims:
                lost_claims.append(partition)
                raise RedisConnectionError("Connection closed by server.")
            return pointers

        keeper.store.claim_pending = losing
    await rt.send("/sink/first", "ends the read in flight, which is not watched")
    await rt.wait_idle("/sink/first", timeout=30)
    await rt.send("/sink/a", "hello")
    assert (await rt.wait_idle("/sink/a", timeout=30)).status == "idle"
    assert seen[1:] == ["hello"]
    p = rt.store.keys.partition("/sink/a")
    assert p in stranded
    assert lost_claims == ([p] if sweep == "its reply lost too" else [])


@pytest.mark.parametrize("delay_s", [0, 1.2], ids=["at once", "applied late"])
async def test_a_claim_whose_reply_is_lost_at_acquisition_is_swept_again(
    cluster, monkeypatch, delay_s
):
    """The claim that takes over a dead owner's pending pointers when a partition is
    acquired ran on the server, but its reply never came (Redis died or the connection
    broke in between): the pointers are pending for the new owner, idle 0, and it
    never saw them. They are taken once idle for a lease period; before, nothing took
    them and the entity stayed pending for as long as the new owner lived. Also when
    the claim reached Redis later than a one-off sweep a lease period after the
    acquisition would look (a stalled Redis): the renewal counts them at every tick."""
    seen: list[object] = []
    client = await cluster.runtime(app(seen), run_worker=False)
    store = client.store
    p = store.keys.partition("/sink/a")
    await store.ensure_group(p)
    await client.send("/sink/a", "hello")
    assert await store.read_inbox([p], "a-dead-worker", 10, 100)  # its read, never acked
    claim = Store.claim_pending
    lost: list[int] = []

    async def losing(self: Store, partition: int, *args: object, **kwargs: object) -> list:
        if partition == p and not lost:
            await asyncio.sleep(delay_s)  # the fault: the command waits in a stalled Redis
        pointers = await claim(self, partition, *args, **kwargs)  # type: ignore[arg-type]
        if pointers and not lost:
            lost.append(partition)
            raise RedisConnectionError("Connection closed by server.")
        return pointers

    monkeypatch.setattr(Store, "claim_pending", losing)
    rt = await cluster.runtime(app(seen), lease_ttl_ms=1000)
    assert (await rt.wait_idle("/sink/a", timeout=30)).status == "idle"
    assert seen == ["hello"]
    assert lost == [p]


async def _true(value: object) -> bool:
    return bool(value)


async def test_a_cluster_node_whose_read_may_have_been_served_is_named_for_a_sweep(cluster):
    """On a cluster, one partition's XREADGROUP ran but its reply was lost (a node's
    connection broken in between) while the others' came: the others' pointers are
    returned and that partition is passed to ``unsure``, for the listener to strand."""
    client = await cluster.runtime(run_worker=False)
    store = client.store
    if store.router is None:
        pytest.skip("one Redis reads all its partitions in one command")
    keys = store.keys
    urls, first, second = await two_inboxes_with_a_pointer(store)
    per_node = store.router.per_node

    async def losing(by_partition, command):
        replies = await per_node(by_partition, command)
        if second in replies:
            replies[second] = RedisConnectionError("Connection closed by server.")
        return replies

    store.router.per_node = losing
    unsure: list[int] = []
    read = await store.read_wake_pointers([first, second], "me", 10, 0, unsure.append)
    assert [p.url for p in read] == [urls[first]]
    assert unsure == [second]
    assert (await store.redis.xpending(keys.inbox(second), "workers"))["pending"] == 1


@pytest.mark.parametrize("claim", ["answered", "its reply lost"])
async def test_a_pointer_another_worker_read_late_is_taken_over_by_the_owner(cluster, claim):
    """Another worker's read reached Redis after this worker acquired the partition
    (it was paused between checking its lease and sending the read, say) and that
    worker died before putting the pointer back: it is pending for a consumer that will
    never process it, and the acquisition's sweeps are long past. The owner's renewal
    finds it, and the owner takes it over; before, the entity stayed pending for as
    long as the owner held the partition. A takeover whose reply is lost (the pointer
    is the owner's now, untracked, and looks fresh) is made good at a later renewal."""
    seen: list[object] = []
    rt = await cluster.runtime(app(seen), lease_ttl_ms=1000)
    keeper, store = rt.worker.lease_keeper, rt.worker.listeners.store
    await until(lambda: _true(keeper.held and not keeper._sweep_at), 30, "the first sweeps")
    lost: list[int] = []
    if claim == "its reply lost":
        claim_others = keeper.store.claim_others

        async def losing(partition: int, owner: str) -> list:
            pointers = await claim_others(partition, owner)
            if pointers and not lost:
                lost.append(partition)
                raise RedisConnectionError("Connection closed by server.")
            return pointers

        keeper.store.claim_others = losing
    read, at_gate, gate = store.read_wake_pointers, asyncio.Event(), asyncio.Event()

    async def gated(*args, **kwargs):
        at_gate.set()
        await gate.wait()
        return await read(*args, **kwargs)

    store.read_wake_pointers = gated
    await asyncio.wait_for(at_gate.wait(), 30)  # the worker has no read in flight now
    await rt.send("/sink/a", "hello")
    p = rt.store.keys.partition("/sink/a")
    [late] = await rt.store.read_inbox([p], "a-worker-that-died", 10, 0)
    assert late.url == "/sink/a"
    gate.set()
    assert (await rt.wait_idle("/sink/a", timeout=30)).status == "idle"
    assert seen == ["hello"]
    assert lost == ([p] if claim == "its reply lost" else [])


async def test_a_timer_fired_while_its_entity_runs_is_delivered_though_the_wake_then_sends(cluster):
    """The timer's outbox lands in the log while a wake of its entity runs, and that
    wake then commits an outbox of its own and delivers it: the mark of the later one
    must not record the timer's as delivered too, or its message is lost."""
    seen: list[object] = []
    fired = asyncio.Event()
    reg = app(seen)

    @reg.entity("clock")
    async def clock(ctx: HandlerContext) -> None:
        for m in ctx.wake.messages:
            if m.payload == "arm":
                await ctx.send("/sink/s", "tick", after=0.5)
            elif m.payload == "slow":
                await fired.wait()  # the timer fires meanwhile
                await ctx.send("/sink/s", "after")

    rt = await cluster.runtime(reg)
    assert rt.store is not None
    url = "/clock/c"
    await rt.send(url, "arm")
    await until(lambda: _timers(rt, url, 1), 30, "the timer to be set")
    await rt.send(url, "slow")

    async def timer_fired() -> bool:
        if await _timers(rt, url, 0):
            fired.set()
        return fired.is_set()

    await until(timer_fired, 30, "the timer to fire while the wake waits")
    await until(lambda: _has(seen, "tick", "after"), 30, "both messages at the sink")
    assert sorted(map(str, seen)) == ["after", "tick"]
    assert (await rt.wait_idle(url, timeout=30)).status == "idle"
    fields = await rt.store.meta(url)
    assert fields["out_done"] == fields["out_last"]


async def _timers(rt, url: str, n: int) -> bool:
    return (await rt.status(url)).timers == n


async def _has(seen: list[object], *payloads: str) -> bool:
    return all(p in seen for p in payloads)
