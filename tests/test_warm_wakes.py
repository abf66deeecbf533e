"""The cost of a wake that talks to another entity: its outbox is acknowledged by the
delivery, so the commit adds no pointer that would cost a wake of its own."""

from __future__ import annotations

import pytest

from wakeful import HandlerContext, Registry, Runtime

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
