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

from tests.test_retention import note_texts, notes_registry

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
