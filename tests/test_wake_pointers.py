"""Wake pointers: at most one pending per entity, and never none while work is left."""

from __future__ import annotations

import asyncio

import pytest

from tests.apps.harness import until
from wakeful import HandlerContext, Registry

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
