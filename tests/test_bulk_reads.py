"""Bulk reads: the statuses and states of many entities in one call (issue 19)."""

from __future__ import annotations

import pytest

from tests.test_smoke import counter_registry
from wakeful import EntityNotFoundError
from wakeful.errors import InvalidUrlError

pytestmark = pytest.mark.anyio


async def test_statuses_and_states_of_many_entities_equal_the_single_reads(cluster, monkeypatch):
    rt = await cluster.runtime(counter_registry())
    urls = [f"/counter/c{i}" for i in range(30)]
    for n, url in enumerate(urls):
        for i in range(n % 3 + 1):
            await rt.send(url, {"i": i})
    await rt.wait_all_idle(timeout=20)
    wanted = [*urls, "/counter/missing"]

    singles = {url: await rt.status(url) for url in urls}
    states = {url: await rt.state(url) for url in urls}
    pipelines: list[int] = []
    rt = await cluster.runtime(counter_registry(), run_worker=False)  # no worker's reads
    real = rt.store.redis.pipeline

    def counting(*args, **kwargs):
        pipelines.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(rt.store.redis, "pipeline", counting)
    many = await rt.statuses(wanted)
    assert list(many) == wanted  # in the order given
    assert many["/counter/missing"] is None  # reported, not raised
    assert {url: many[url] for url in urls} == singles
    # one pipeline per partition holding some of them (4 partitions), not one per url
    assert len(pipelines) <= rt.settings.partitions
    pipelines.clear()
    read = await rt.states(wanted)
    assert read["/counter/missing"] is None
    assert {url: read[url] for url in urls} == states
    assert read[urls[2]] == {"counts": [{"key": "total", "n": 3}]}
    assert len(pipelines) <= rt.settings.partitions


async def test_a_bad_url_refuses_the_whole_bulk_read(cluster):
    rt = await cluster.runtime(counter_registry(), run_worker=False)
    with pytest.raises(InvalidUrlError):
        await rt.statuses(["/counter/a", "not a url"])
    assert await rt.statuses([]) == {}
    assert await rt.states(["/counter/nobody"]) == {"/counter/nobody": None}
    with pytest.raises(EntityNotFoundError):
        await rt.status("/counter/nobody")  # the single read still raises
