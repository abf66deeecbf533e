"""A graceful stop lets the inbox read in flight finish instead of cutting it short.

A blocking XREADGROUP that is cancelled may still be served: fakeredis keeps the
blocked read of a gone client and hands it the next pointer, and a real Redis does
the same for a client whose connection it has not yet seen close. The pointer then
waits, delivered to a worker that stopped, until the next owner's pending sweep (a
lease period later). So a stopping worker reads no more, lets its last read end
(at most ``block_ms``), handles what it got, and only then hands its leases back.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.apps.harness import until
from tests.test_retention import note_texts, notes_registry
from wakeful import HandlerContext, Registry
from wakeful.tasks import all_of

pytestmark = pytest.mark.anyio
URL = "/notes/stop"


async def test_a_graceful_stop_cuts_no_inbox_read_short(cluster):
    first = await cluster.runtime(notes_registry())
    assert first.store is not None and first.worker is not None
    reads = first.store.read_wake_pointers
    cut: list[str] = []
    reading = asyncio.Event()

    async def watched(*args: Any, **kwargs: Any) -> Any:
        reading.set()
        try:
            return await reads(*args, **kwargs)
        except asyncio.CancelledError:
            cut.append("a read was cancelled")
            raise

    first.store.read_wake_pointers = watched  # type: ignore[method-assign]
    await first.send(URL, "add a")
    assert (await first.wait_idle(URL)).status == "idle"
    reading.clear()
    await asyncio.wait_for(reading.wait(), 10)  # a read blocks now
    await first.close()
    cluster.runtimes.remove(first)
    assert cut == []
    # The next worker takes every pointer sent meanwhile at once (no pending sweep).
    await next_worker_takes_a_new_message(cluster)


async def next_worker_takes_a_new_message(cluster: Any) -> None:
    second = await cluster.runtime(notes_registry())
    await second.send(URL, "add b")
    assert (await second.wait_idle(URL, timeout=5)).status == "idle"
    assert await note_texts(second, URL) == ["a", "b"]


async def test_a_worker_stopping_with_wakes_queued_for_a_slot_fails_and_loses_none(cluster):
    """A worker stops while hundreds of wakes wait for one of its slots (the running
    ones wait on a model, past the grace). The queued ones end without a task, their
    pointers pending; nothing is parked; and the next worker handles every message,
    each once."""
    release = asyncio.Event()
    handled: dict[str, int] = {}
    registry = Registry()

    @registry.entity("slow")
    async def slow(ctx: HandlerContext) -> None:
        await release.wait()  # the first worker's wakes never get past this
        handled[ctx.entity_url] = handled.get(ctx.entity_url, 0) + len(ctx.wake.messages)

    first = await cluster.runtime(registry, max_concurrency=200, shutdown_grace_s=0.1)
    assert first.worker is not None
    urls = [f"/slow/s{n}" for n in range(800)]
    await all_of([first.send(url, "go") for url in urls])
    runners = first.worker.runners
    # The worker reads until its backlog is four times its slots: 600 wakes queued (a
    # hand-off of the slots that recursed through them overflowed the stack).
    await until(lambda: _true(runners.backlog() == len(urls)), 30, "a full backlog")
    await first.close()
    cluster.runtimes.remove(first)
    release.set()
    second = await cluster.runtime(registry)
    statuses = await second.wait_all_idle(["slow"], timeout=60)
    assert {url: st.status for url, st in statuses.items()} == dict.fromkeys(urls, "idle")
    assert handled == dict.fromkeys(urls, 1)


async def _true(value: bool) -> bool:
    return value
