"""Fault injection for in-process workers: die at the N-th visit of a commit point."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from wakeful import Registry, Runtime


class SimulatedCrash(BaseException):
    """Raised at a commit point: the worker dies there like a killed process."""


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
    until they expire) at the ``hit``-th time it reaches ``point``; then start a
    fresh worker, wait until ``url`` is idle again, and return that runtime.

    ``setup`` runs on the first worker before the fault is armed; ``trigger``, if
    given, replaces sending ``message`` as what leads to the crash point;
    ``before_restart`` runs on the dead worker's runtime (as a client) before the
    fresh worker starts."""
    first = await cluster.runtime(registry, lease_ttl_ms=400)
    if setup is not None:
        await setup(first)
    assert first.worker is not None
    crashed = asyncio.Event()
    seen = 0

    def hook(name: str) -> None:
        nonlocal seen
        if name == point:
            seen += 1
            if seen == hit:
                crashed.set()
                first.worker.kill()
                raise SimulatedCrash(name)

    first.worker.fault_hook = hook
    if trigger is not None:
        await trigger(first)
    else:
        await first.send(url, message)
    await asyncio.wait_for(crashed.wait(), 15)  # the crash point must really be reached
    if before_restart is not None:
        await before_restart(first)
    await first.close()
    cluster.runtimes.remove(first)
    second = await cluster.runtime(registry, lease_ttl_ms=400)
    status = await second.wait_idle(url, timeout=timeout)
    assert status.status == "idle", status
    return second
