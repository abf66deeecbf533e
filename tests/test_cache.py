"""The worker's warm cache: bounded by entity count and by bytes."""

from __future__ import annotations

import pytest

from wakeful import HandlerContext, Registry
from wakeful.cache import WarmCache
from wakeful.state import EntityState


def sized(nbytes: int) -> EntityState:
    state = EntityState()
    state.nbytes = nbytes
    return state


def test_the_warm_cache_is_bounded_by_bytes_as_well_as_by_count():
    evicted: list[str] = []
    cache = WarmCache(100, evicted.append, max_bytes=1000)
    for i in range(5):
        cache.remember(f"/a/{i}", sized(400), "0-1", "c", 0)
    assert len(cache) == 2 and cache.nbytes == 800
    assert evicted == ["/a/0", "/a/1", "/a/2"]  # least recently remembered first
    cache.remember("/a/3", sized(100), "0-2", "c", 0)  # remembered again: counted once
    assert cache.nbytes == 500 and len(cache) == 2
    cache.remember("/a/big", sized(5000), "0-1", "c", 0)  # alone over the bound: kept
    assert cache.get("/a/big") is not None and len(cache) == 1 and cache.nbytes == 5000
    cache.forget("/a/big")
    assert cache.nbytes == 0 and len(cache) == 0


@pytest.mark.anyio
async def test_a_worker_counts_the_bytes_of_warm_state(cluster):
    reg = Registry()

    @reg.entity("notes")
    async def notes(ctx: HandlerContext) -> None:
        ctx.record_run()
        ctx.reply("noted")

    rt = await cluster.runtime(reg, cache_max_bytes=1)
    for url in ("/notes/a", "/notes/b"):
        await rt.send(url, "x" * 2000)
        await rt.wait_idle(url)
    assert rt.worker is not None
    cache = rt.worker.cache
    assert len(cache) == 1 and cache.get("/notes/b") is not None
    assert cache.nbytes >= 2000  # the message's bytes were counted
