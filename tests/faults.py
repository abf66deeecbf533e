"""Fault injection for in-process workers: die at the N-th visit of a commit point.

A killed worker keeps its leases and its registry entry until they expire. The test
runtimes' leases are long (conftest.py: a loaded machine must not lapse them while
the worker lives), so :func:`lapse_soon` shortens what a dead worker left behind:
as if its leases and heartbeat had been short all along, but without exposing the
living worker to lapses under load.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from wakeful import Registry, Runtime


class SimulatedCrash(BaseException):
    """Raised at a commit point: the worker dies there like a killed process."""


LAPSE_MS = 400  # a dead worker's leases and heartbeat run out this soon


async def lapse_soon(rt: Runtime, ms: int = LAPSE_MS) -> None:
    """The leases and the heartbeat that ``rt``'s killed worker left behind expire in
    ``ms`` (they do expire by themselves; this only makes the wait short)."""
    assert rt.worker is not None and rt.store is not None
    keys, redis, worker_id = rt.store.keys, rt.store.redis, rt.worker.id
    for p in range(keys.partitions):
        token = await redis.get(keys.lease(p))
        if token is not None and token.decode().rsplit(":", 1)[0] == worker_id:
            await redis.pexpire(keys.lease(p), ms)
    seconds, micros = await redis.time()
    if await redis.zscore(keys.workers, worker_id) is not None:
        await redis.zadd(keys.workers, {worker_id: seconds * 1000 + micros // 1000 + ms}, xx=True)


def arm_crash(rt: Runtime, point: str, hit: int = 1) -> asyncio.Event:
    """Kill ``rt``'s worker (no cleanup, leases kept) the ``hit``-th time it reaches the
    fault point ``point``; the event returned is set when it did."""
    worker = rt.worker
    assert worker is not None
    crashed = asyncio.Event()
    seen = 0

    def hook(name: str) -> None:
        nonlocal seen
        if name == point and not crashed.is_set():
            seen += 1
            if seen == hit:
                crashed.set()
                worker.kill()
                raise SimulatedCrash(name)

    worker.fault_hook = hook
    return crashed


async def crash_and_recover(
    cluster: Any,
    registry: Registry,
    url: str,
    message: Any,
    point: str,
    hit: int,
    *,
    timeout: float = 30,
    setup: Callable[[Runtime], Awaitable[Any]] | None = None,
    trigger: Callable[[Runtime], Awaitable[Any]] | None = None,
    before_restart: Callable[[Runtime], Awaitable[Any]] | None = None,
) -> Runtime:
    """Send ``message`` to ``url`` on a worker that is killed (no cleanup, leases kept
    until they expire: soon, see :func:`lapse_soon`) at the ``hit``-th time it reaches
    ``point``; then start a
    fresh worker, wait until ``url`` is idle again, and return that runtime.

    ``setup`` runs on the first worker before the fault is armed; ``trigger``, if
    given, replaces sending ``message`` as what leads to the crash point;
    ``before_restart`` runs on the dead worker's runtime (as a client) before the
    fresh worker starts."""
    first = await cluster.runtime(registry)
    if setup is not None:
        await setup(first)
    crashed = arm_crash(first, point, hit)
    if trigger is not None:
        await trigger(first)
    else:
        await first.send(url, message)
    await asyncio.wait_for(crashed.wait(), 15)  # the crash point must really be reached
    await lapse_soon(first)
    if before_restart is not None:
        await before_restart(first)
    await first.close()
    cluster.runtimes.remove(first)
    second = await cluster.runtime(registry)
    status = await second.wait_idle(url, timeout=timeout)
    assert status.status == "idle", status
    return second
