"""A handler that blocks the event loop does not cost the worker its leases.

A handler calling ``time.sleep`` (or a synchronous client, or long CPU work) stops
the worker's event loop, and with it the loop's lease renewals. Past the lease, the
worker lost every partition, the blocked wake's commit was refused, and the wake ran
again and blocked again, for good. The stall guard (``stall_guard.py``) renews the
leases from a thread of its own while the loop is stalled, up to ``stall_limit_ms``,
and names where the loop is stuck.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest

from wakeful import HandlerContext, Registry

pytestmark = pytest.mark.anyio

LEASE_MS = 2000  # renewed every 666 ms; the guard looks every 333 ms
URL = "/blocker/a"


def blocking_app(block_s: float) -> tuple[Registry, list[float]]:
    """An entity whose first wake blocks the event loop for ``block_s`` seconds."""
    calls: list[float] = []
    reg = Registry()

    @reg.entity("blocker")
    async def blocker(ctx: HandlerContext) -> None:
        calls.append(time.monotonic())
        if len(calls) == 1:
            time.sleep(block_s)  # blocking work in an async handler: the mistake under test

    return reg, calls


async def test_a_handler_blocking_the_loop_past_its_lease_runs_once_and_commits(cluster, caplog):
    reg, calls = blocking_app(2.5 * LEASE_MS / 1000)
    rt: Any = await cluster.runtime(reg, lease_ttl_ms=LEASE_MS)
    caplog.set_level(logging.WARNING, logger="wakeful")
    await rt.send(URL, {})
    status = await rt.wait_idle(URL, timeout=60)

    assert status.status == "idle"
    assert len(calls) == 1, "the blocked wake lost its lease and ran again"
    assert rt.worker.stats["commits_fenced"] == 0
    assert rt.worker.stall_guard.renewals > 0
    # The warning says where the loop is stuck: the handler's blocking line.
    warning = next(r.getMessage() for r in caplog.records if "has not run for" in r.getMessage())
    assert "in blocker" in warning and "time.sleep(block_s)" in warning
    assert any("runs again after a stall" in r.getMessage() for r in caplog.records)
    assert not any("lost partition" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("backend", ["fake"], indirect=True)
async def test_a_loop_stalled_past_the_stall_limit_lets_its_leases_lapse(cluster, caplog):
    """The bound: a wedged loop does not hold its partitions for good."""
    reg, calls = blocking_app(3.5 * LEASE_MS / 1000)
    rt: Any = await cluster.runtime(reg, lease_ttl_ms=LEASE_MS, stall_limit_ms=LEASE_MS // 2)
    caplog.set_level(logging.WARNING, logger="wakeful")
    await rt.send(URL, {})
    await rt.wait_idle(URL, timeout=60)

    assert len(calls) == 2, "the stalled wake's commit should have been refused, and run again"
    assert rt.worker.stats["commits_fenced"] >= 1
    assert any("left to lapse" in r.getMessage() for r in caplog.records)


async def test_the_guard_thread_ends_with_the_worker(cluster):
    reg, _ = blocking_app(0)
    rt: Any = await cluster.runtime(reg)
    guard = rt.worker.stall_guard
    assert guard.alive
    await rt.close()
    assert not guard.alive


async def test_no_guard_thread_with_a_stall_limit_of_zero(cluster):
    reg, _ = blocking_app(0)
    rt: Any = await cluster.runtime(reg, stall_limit_ms=0)
    assert not rt.worker.stall_guard.alive
