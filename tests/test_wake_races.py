"""Races of the warm path and the outbox's acknowledgement, found by a review: a
postponed delivery whose acknowledgement fails too must not strand the sender's
pointer, and a cancel heard after the preloading read must reach the wake."""

from __future__ import annotations

import asyncio

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from tests.test_warm_wakes import SENDER, TARGET, app
from wakeful import delivery
from wakeful.delivery import Chain

pytestmark = pytest.mark.anyio


async def test_a_postponed_mark_whose_ack_fails_too_does_not_strand_the_pointer(
    cluster, monkeypatch
):
    """A wake's final commit with an outbox leaves its pointer
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
    assert rt.store is not None and rt.worker is not None
    # The mark as its own commit, after the delivery (as on a cluster): on one Redis it
    # would go in the commit's round trip, and its failure there falls back to this.
    monkeypatch.setattr(rt.worker.delivery, "prepare", lambda ticket, batch, ack=False: Chain([]))
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


async def test_a_cancel_heard_after_the_preloading_read_reaches_the_wake():
    """With a preload the wake's log is the one read at inbox-read
    time, not at its load. A cancel written after that read (not in the preload) whose
    notice comes before the wake arms its signal (here: while the wake waits for a
    slot) goes to the slot's old signal, and arm() replaces it: this wake never sees
    it, neither as an input nor as a signal, and runs to its end (an agent run the
    client cancelled keeps calling the model and tools). Before the warm path the log
    was read inside the activation, right before arm."""
    from wakeful.cache import WarmCache
    from wakeful.config import Settings
    from wakeful.runners import Runners
    from wakeful.store import Loaded, Pointer, Preloaded
    from wakeful.ticket import WakeTicket

    preload = Preloaded(Loaded({}, None, None, []), truncated=False)
    gate = asyncio.Event()
    outcome: dict[str, object] = {}

    async def activate(ticket: WakeTicket) -> None:
        if ticket.url == "/a/busy":
            await gate.wait()  # holds the only slot
        else:  # what the pipeline does right before the handler
            outcome["preload used"] = ticket.preload is not None
            outcome["signal cancelled"] = ticket.cancels.arm().cancelled
        runners.done(ticket)

    async def crashed(ticket: WakeTicket, exc: Exception) -> None:
        raise AssertionError(exc)

    stats = {"commits_fenced": 0}
    cache = WarmCache(10, lambda url: None)
    settings = Settings(max_concurrency=1)
    runners = Runners(settings, "w", cache, stats, lambda p: "t1", activate, crashed)
    async with asyncio.TaskGroup() as group:
        runners.open(group)
        runners.adopt(0)
        runners.schedule(Pointer(0, "1-0", "/a/busy"))
        await asyncio.sleep(0.01)
        mark = runners.reading([0])  # the read is sent: the preload is read now
        runners.schedule(Pointer(0, "2-0", "/a/x", preload), mark)
        runners.read_done(mark)
        await asyncio.sleep(0.01)  # /a/x waits for the slot
        runners.cancel("/a/x", "stop")  # rt.cancel: its input is after the preload
        gate.set()
        await runners.idle.wait()
        runners.close()
    # The wake either loads (and sees the cancel input) or keeps the cancel signal.
    assert not outcome["preload used"] or outcome["signal cancelled"], outcome
