"""REVIEW FINDINGS (branch `review`): tests that show defects found in the review of
cbe8e2f..main. A failing test here shows a defect; it is not a regression of this
branch's own code."""

from __future__ import annotations

import asyncio

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from tests.test_warm_wakes import SENDER, TARGET, app
from wakeful import delivery

pytestmark = pytest.mark.anyio


async def test_REVIEW_mark_and_ack_both_postponed_strand_the_senders_pointer(
    cluster, monkeypatch
):
    """REVIEW FINDING 1: a wake's final commit with an outbox leaves its pointer
    unacknowledged for the delivery's mark. If the mark fails (a Redis blip) and the
    ack of _ack_postponed fails too (the same blip), the pointer stays pending for
    this worker, untracked and never marked stranded: meta.woke stays set, so no later
    send adds a pointer, and the entity never wakes again while this worker holds the
    partition (no sweep: the lease keeper sweeps only after acquisitions or
    stranded wakes)."""
    seen: list[object] = []
    real = delivery.commit
    fails = [2]  # the mark, then the ack after the postponed delivery

    async def flaky(*args, **kwargs):  # type: ignore[no-untyped-def]
        ticket = args[1]
        if ticket.url == SENDER and fails[0] > 0:
            fails[0] -= 1
            raise RedisConnectionError("a blip")
        return await real(*args, **kwargs)

    monkeypatch.setattr(delivery, "commit", flaky)
    rt = await cluster.runtime(app(seen), lease_ttl_ms=2000)
    assert rt.store is not None
    await asyncio.sleep(3)  # past the one sweep a lease period after the acquisitions
    await rt.send(SENDER, "hello")
    async with asyncio.timeout(10):
        while fails[0] > 0 or "hello" not in seen:
            await asyncio.sleep(0.05)
    await rt.send(SENDER, "again")
    try:
        async with asyncio.timeout(8):  # four lease periods (a sweep comes after one)
            while "again" not in seen:
                await asyncio.sleep(0.1)
    except TimeoutError:
        meta = await rt.store.meta(SENDER)
        pytest.fail(f"the sender never woke again for its second message (meta {meta})")
    assert (await rt.wait_idle(TARGET)).status == "idle"
