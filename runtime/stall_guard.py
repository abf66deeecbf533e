"""Leases kept through a stalled event loop, by a thread of the worker's own.

A worker renews its partition leases from its event loop. A handler that blocks
the loop (``time.sleep``, a synchronous HTTP or model client, long CPU work) stops
every renewal with it: past ``lease_ttl_ms`` the worker loses every partition it
holds, the blocked wake's commit is refused when it ends, and the wake runs again,
and blocks again, for good. The long loop passes of a loaded machine lapse leases
the same way.

:class:`StallGuard` is a daemon thread with an event loop and a Redis connection of
its own. Twice a heartbeat it asks the worker's loop to run a probe
(``call_soon_threadsafe``); while the leases' last renewal is overdue (one and a half
heartbeats old) and the probe has waited less than ``stall_limit_ms``, it renews the
held leases itself:
the same fenced script, so a lease released or taken over meanwhile is not brought
back, and each renewal moves the lease's local expiry only forward. (It does not
heartbeat: a stall past two leases drops the worker from the list of live ones,
so others try to take its partitions, and cannot while its leases hold; a
heartbeat in flight at shutdown would have listed a worker that had left.) A loop
stalled past ``stall_limit_ms`` lets its
leases lapse as before: a wedged process does not hold its partitions for good. A
process that is stopped or killed (SIGSTOP, kill -9, a frozen VM) stops this
thread with it, so lapses and zombies are what they were.

It also says what stalls the loop, once a stall passes half a lease: the worker's
stack at that moment (where a handler blocks), and how long the stall lasted once
it ends. The same split is Kafka's: a heartbeat thread keeps the membership, and a
bound on the time between polls catches a consumer that makes no progress.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable

import anyio

from .config import Settings
from .leases import LeaseKeeper
from .store import Store

log = logging.getLogger("wakeful.stall_guard")


class StallGuard:
    """Renews ``keeper``'s leases from a thread while the worker's loop is stalled."""

    def __init__(
        self,
        keeper: LeaseKeeper,
        settings: Settings,
        worker_id: str,
        make_store: Callable[[], Store],
    ) -> None:
        self._keeper = keeper
        self._settings = settings
        self._worker_id = worker_id
        self._make_store = make_store  # called in the thread: its client is that loop's
        self._interval = settings.heartbeat_ms / 1000  # the worker's renewal period
        self._limit = settings.stall_limit_ms / 1000
        self._worker_loop: asyncio.AbstractEventLoop | None = None
        self._worker_thread = 0
        self._thread: threading.Thread | None = None
        self._own_loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._stopping = threading.Event()
        # The probe in flight on the worker's loop: when it was posted (monotonic), or None.
        self._probe_posted: float | None = None
        self._stall_reported = False
        self._limit_reported = False
        self.renewals = 0  # lease renewals this thread made (each one a stall it bridged)

    # -- the worker's side -------------------------------------------------------------

    def start(self) -> None:
        """Start the thread (from the worker's loop); a no-op with ``stall_limit_ms`` 0."""
        if self._limit <= 0 or self._thread is not None:
            return
        self._worker_loop = asyncio.get_running_loop()
        self._worker_thread = threading.get_ident()
        self._thread = threading.Thread(
            target=self._main, name=f"wakeful-stall-guard-{self._worker_id}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop renewing at once; the thread ends soon after (it is a daemon)."""
        self._stopping.set()
        loop, stop = self._own_loop, self._stop
        if loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):  # its loop has closed already
                loop.call_soon_threadsafe(stop.set)

    async def join(self) -> None:
        """Wait for the thread to end (after :meth:`stop`), without blocking the loop."""
        thread = self._thread
        if thread is not None and thread.is_alive():
            await asyncio.to_thread(thread.join, self._interval * 2 + 1)

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _probe_ran(self, posted: float) -> None:
        """On the worker's loop: the probe posted at ``posted`` ran."""
        if self._probe_posted != posted:
            return
        self._probe_posted = None
        stalled = time.monotonic() - posted
        if self._stall_reported:
            log.warning(
                "worker %s: its event loop runs again after a stall of at least %.1f s",
                self._worker_id,
                stalled,
            )
        self._stall_reported = self._limit_reported = False

    # -- the thread ----------------------------------------------------------------------

    def _main(self) -> None:
        try:
            asyncio.run(self._run())
        except Exception:  # never silently: the leases are then the loop's alone again
            log.exception("worker %s: the stall guard stopped", self._worker_id)

    async def _run(self) -> None:
        self._own_loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        if self._stopping.is_set():
            return
        store = self._make_store()
        try:
            while not self._stopping.is_set():
                with anyio.move_on_after(self._interval / 2):
                    await self._stop.wait()
                if self._stopping.is_set():
                    return
                try:
                    await self._check(store)
                except Exception as exc:  # Redis away: the worker's own tick reports it
                    log.debug(
                        "worker %s: the stall guard's renewal failed: %s", self._worker_id, exc
                    )
        finally:
            await store.close_routes()
            await store.redis.aclose()

    def _post_probe(self, now: float) -> float:
        """How long the worker's loop has not run the probe; posts one if none waits."""
        posted = self._probe_posted
        if posted is not None:
            return now - posted
        loop = self._worker_loop
        if loop is None or loop.is_closed():
            return 0.0
        self._probe_posted = now
        try:
            loop.call_soon_threadsafe(self._probe_ran, now)
        except RuntimeError:  # the worker's loop closed meanwhile
            self._probe_posted = None
        return 0.0

    async def _check(self, store: Store) -> None:
        now = time.monotonic()
        stalled = self._post_probe(now)
        if stalled >= self._limit:
            if not self._limit_reported:
                self._limit_reported = True
                log.error(
                    "worker %s: its event loop has not run for %.0f s (stall_limit_ms): its "
                    "leases are left to lapse, and other workers take its partitions over",
                    self._worker_id,
                    stalled,
                )
            return
        if stalled >= self._settings.lease_ttl_ms / 2000 and not self._stall_reported:
            self._stall_reported = True
            log.warning(
                "worker %s: its event loop has not run for at least %.1f s: something blocks it (a "
                "handler calling time.sleep or a synchronous client, or long CPU work: run "
                "that with anyio.to_thread.run_sync). Its leases are held meanwhile, for up "
                "to stall_limit_ms. The loop is at:\n%s",
                self._worker_id,
                stalled,
                self._worker_stack(),
            )
        if now - self._keeper.renewed_at < 1.5 * self._interval:
            return  # the last renewal is recent: the loop's own, or this thread's
        await self._renew(store)

    async def _renew(self, store: Store) -> None:
        held = list(dict(self._keeper.held).items())  # a copy made in one step
        ttl_ms = self._settings.lease_ttl_ms
        started = time.monotonic()
        results = await store.renew_all([(p, lease.token) for p, lease in held], ttl_ms)
        for (_, lease), renewed in zip(held, results, strict=True):
            if not isinstance(renewed, Exception) and renewed:
                lease.extend(started + ttl_ms / 1000)
                self.renewals += 1
        # A lease found lost is left to the worker's own tick, which drops it.
        self._keeper.renewed_at = max(self._keeper.renewed_at, started)

    def _worker_stack(self) -> str:
        frame = sys._current_frames().get(self._worker_thread)
        if frame is None:
            return "  (unknown)"
        return "".join(traceback.format_stack(frame, limit=8)).rstrip()
