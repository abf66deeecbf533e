"""A worker whose background loop dies stops as a whole: no silent half-alive worker.

Before the loops had an owner, a loop that raised (the inbox reader, the timer
loop) ended alone while the lease loop went on renewing: the worker kept its
partitions and woke nothing on them, and ``wakeful worker`` kept running.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from typing import Any

import pytest

from tests.apps import crashy
from tests.apps.harness import until
from wakeful import Worker

pytestmark = pytest.mark.anyio


class LoopBug(Exception):
    """An unexpected error inside one of the worker's loops."""


@pytest.mark.parametrize("store_call", ["first_due", "read_inbox"])
async def test_a_dying_loop_stops_the_worker_and_its_lease_renewal(cluster, store_call):
    rt = await cluster.runtime(crashy.registry, run_worker=False)
    store = rt.store
    worker = Worker(crashy.registry, store, rt.settings)
    task = asyncio.create_task(worker.run())
    try:
        await asyncio.wait_for(worker.ready.wait(), 10)
        assert worker.leases  # it holds partitions and renews them

        async def broken(*args: Any, **kwargs: Any) -> Any:
            raise LoopBug(f"{store_call} broke")

        setattr(store, store_call, broken)  # the loop that calls it dies at its next turn
        with pytest.raises(LoopBug):
            await asyncio.wait_for(task, 10)
    finally:
        if not task.done():
            worker.kill()
            await asyncio.gather(task, return_exceptions=True)
    # Renewal stopped with it, and the leases were handed back for another worker.
    assert worker.leases == {}
    owners = [await store.lease_owner(p) for p in range(rt.settings.partitions)]
    assert not [o for o in owners if o and o.startswith(worker.id)]


APP = """
from wakeful import Registry
from wakeful.store import Store

registry = Registry()


@registry.entity("noop")
async def noop(ctx):
    pass


async def broken_timer_check(self, partitions):
    raise RuntimeError("the timer loop broke")


Store.first_due = broken_timer_check  # the timer loop dies once partitions are held
"""


def test_wakeful_worker_exits_non_zero_when_a_loop_dies(tmp_path, server_url, prefix):
    (tmp_path / "brokenapp.py").write_text(APP)
    env = {**os.environ, "WAKEFUL_PREFIX": prefix, "WAKEFUL_PARTITIONS": "4"}
    command = [sys.executable, "-m", "wakeful.cli", "worker", "brokenapp:registry"]
    result = subprocess.run(
        [*command, "--redis", server_url],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert "the timer loop broke" in result.stderr


async def test_an_embedded_worker_that_dies_says_so_at_once(
    cluster, caplog: pytest.LogCaptureFixture
):
    """A Runtime with its own worker logs the worker's end when it happens, not only when
    the runtime is closed (sends keep succeeding while nothing wakes)."""
    rt = await cluster.runtime(crashy.registry)

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise LoopBug("first_due broke")

    rt.store.first_due = broken  # type: ignore[method-assign]
    assert rt.worker is not None
    await asyncio.wait_for(rt.worker.stopped.wait(), 10)

    async def logged() -> bool:
        return any("embedded worker stopped" in r.getMessage() for r in caplog.records)

    await until(logged, 10, "the runtime to log its worker's end")
    cluster.runtimes.remove(rt)  # closed here: close() raises the worker's error
    with pytest.raises(LoopBug):
        await rt.close()
