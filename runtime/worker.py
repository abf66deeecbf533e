"""The worker: owns partitions through fenced leases and wakes entity handlers.

:class:`Worker` composes the engine's rooms and owns their tasks:

* :class:`~wakeful.leases.LeaseKeeper` (the heartbeat and the leases),
* :class:`~wakeful.listeners.Listeners` (inbox reader, timers, cancel relay),
* :class:`~wakeful.runners.Runners` (one runner per busy entity),
* :class:`~wakeful.pipeline.WakePipeline` (load -> rebuild -> handler -> commit),
* :class:`~wakeful.sweep.RetentionSweep` (trims the logs of idle entities),
* :class:`~wakeful.services.HandlerServices` (what handler contexts may ask).

Every loop and runner is a task of one task group tree: if a loop dies, the
whole worker stops (lease renewal stops with it, so another worker takes the
partitions over) and :meth:`Worker.run` raises. :meth:`Worker.stop` shuts down
gracefully: stop reading, let running wakes finish (``shutdown_grace_s``), hand
the leases back.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import anyio
import msgspec

from . import leases as lease_room
from .cache import WarmCache
from .capabilities import Capability
from .config import Settings
from .connection import dedicated
from .delivery import Delivery
from .errors import ConfigError, describe
from .leases import Lease, LeaseKeeper
from .listeners import Listeners
from .pipeline import WakePipeline
from .registry import Registry
from .retention import Exporter, JsonlExporter, Retention
from .runners import Runners
from .services import HandlerServices
from .stall_guard import StallGuard
from .store import Store
from .sweep import RetentionSweep
from .tasks import first_error
from .ticket import WakeTicket

log = logging.getLogger("wakeful.worker")
LEASE_CONNECTIONS = 2  # the lease loop's own pool: a tick runs one command at a time


class Worker:
    def __init__(
        self,
        registry: Registry,
        store: Store,
        settings: Settings,
        *,
        worker_id: str | None = None,
        capabilities: list[Capability[Any]] | None = None,
        archive: Exporter | None = None,
    ) -> None:
        self.registry = registry
        self.store = store
        self.settings = settings
        self.id = worker_id or lease_room.new_worker_id()
        # Tests inject crashes here: called with the name of each commit point.
        self.fault_hook: Callable[[str], None] | None = None
        # The clock of recurring schedules (epoch seconds); tests move their own.
        self.clock: Callable[[], float] = time.time
        self.stats = {
            "activations": 0,
            "handler_calls": 0,
            "commits_fenced": 0,
            "effects_delivered": 0,
            "loads_skipped": 0,  # wakes that used what the read of their pointer brought along
            "local_reads": 0,  # sends of deliveries that read their target's pointers too
            "marks_chained": 0,  # outboxes marked delivered in their commit's round trip
        }
        self._stopping = asyncio.Event()
        self.stopped = asyncio.Event()  # set when run() ends, whether it returns or raises
        self._killed = False
        self._scope: anyio.CancelScope | None = None
        self.services = HandlerServices(
            registry, store, capabilities or [], self._token, clock=self._now
        )
        self.delivery = Delivery(store, self._fault, self.stats)
        self.cache = WarmCache(settings.cache_size, self._evicted, settings.cache_max_bytes)
        self.retention = Retention(store, settings, _exporter(settings, archive), self._fault)
        self.runners = Runners(
            settings, self.id, self.cache, self.stats, self._token, self._wake, self._crashed
        )
        self.pipeline = WakePipeline(
            registry=registry,
            store=store,
            settings=settings,
            services=self.services,
            delivery=self.delivery,
            cache=self.cache,
            stats=self.stats,
            fault=self._fault,
            done=self.runners.done,
            retention=self.retention,
        )
        # Lease renewal never queues behind the runners' commands: its own two connections.
        self._lease_redis = dedicated(store.redis, LEASE_CONNECTIONS)
        self._lease_store = lease_store = Store(
            self._lease_redis, store.keys, idempotency_ttl_ms=store.idempotency_ttl_ms
        )
        self.lease_keeper = LeaseKeeper(lease_store, settings, self.id, self.runners)
        self.lease_keeper.on_acquired.append(self._publish_types)
        # Keeps the leases while the loop is stalled: a thread, with a connection of its own.
        self.stall_guard = StallGuard(
            self.lease_keeper,
            settings,
            self.id,
            lambda: Store(
                dedicated(store.redis, 1), store.keys, idempotency_ttl_ms=store.idempotency_ttl_ms
            ),
        )
        self.listeners = Listeners(
            store, settings, self.id, self.lease_keeper, self.runners, self._fault, self._now
        )
        self.delivery.local = self.listeners  # a delivery reads the pointers it adds here
        self.sweep = RetentionSweep(
            store, settings, self.retention, self.lease_keeper, self.runners.running, self.stats
        )

    @property
    def leases(self) -> dict[int, Lease]:
        """The partitions held now, with their leases."""
        return self.lease_keeper.held

    @property
    def ready(self) -> asyncio.Event:
        """Set once the first lease tick went through."""
        return self.lease_keeper.ready

    # -- lifecycle -------------------------------------------------------------

    def kill(self) -> None:
        """Die like ``kill -9`` would: stop every task now, release nothing (for tests)."""
        self._killed = True
        self.runners.killed = True
        self.stall_guard.stop()
        if self._scope is not None:
            self._scope.cancel()
        self._stopping.set()

    def stop(self) -> None:
        """Ask for a graceful shutdown; :meth:`run` returns once it is done."""
        self._stopping.set()
        self.lease_keeper.changed.set()

    async def run(self) -> None:
        """Run until :meth:`stop` (returns) or until a loop fails (raises its error)."""
        try:
            await self._run()
        finally:
            self.stall_guard.stop()
            with anyio.CancelScope(shield=True):
                await self.stall_guard.join()
                await self._lease_store.close_routes()
                await self._lease_redis.aclose()
            self.stopped.set()

    async def _run(self) -> None:
        if not self.registry.names():
            # It would lease partitions and park every entity there as of an unknown type.
            raise ConfigError(
                "the worker's registry has no entity types; register at least one "
                "(@registry.entity(...)) before starting a worker"
            )
        await self.store.setup(wait_for_redis=True)
        policy = await self.store.eviction_policy()
        if policy not in (None, "noeviction"):
            log.warning(
                "Redis runs with maxmemory-policy %s: at maxmemory it may evict Wakeful's "
                "keys (logs, metadata, leases) and lose entities' state; set it to "
                "noeviction, so that a full Redis refuses writes instead",
                policy,
            )
        others = set(await self.store.published_type_names()) - set(self.registry.names())
        await self._publish_types()
        if others:
            log.warning(
                "worker %s does not run the entity types %s, which other workers of this "
                "keyspace registered: every worker on a keyspace must run the same app, "
                "since any of them may own any entity's partition (an entity of a type its "
                "owner lacks fails there, 'unknown entity type')",
                self.id,
                ", ".join(sorted(others)),
            )
        log.info("worker %s starting", self.id)
        failure: BaseException | None = None
        self.stall_guard.start()
        try:
            await self._run_rooms()
        except BaseException as exc:  # a loop died, or the worker was cancelled or killed
            failure = exc
        self.stall_guard.stop()  # the leases go back now: renew none of them again
        if not self._killed:
            await self.lease_keeper.release_all()
        for url in self.services.pooled():
            await self._release_capabilities(url)
        if failure is not None and not self._killed:
            error = first_error(failure)
            if not isinstance(error, asyncio.CancelledError):
                log.error("worker %s stopped: %s", self.id, describe(error))
            raise error
        log.info("worker %s stopped", self.id)

    async def _run_rooms(self) -> None:
        async with anyio.create_task_group() as worker_group:
            self._scope = worker_group.cancel_scope
            if self._killed:
                worker_group.cancel_scope.cancel()
            worker_group.start_soon(self.lease_keeper.run, name="wakeful-leases")
            async with asyncio.TaskGroup() as runner_group:
                self.runners.open(runner_group)
                try:
                    async with anyio.create_task_group() as loops:
                        loops.start_soon(self.listeners.read_inboxes, name="wakeful-read")
                        loops.start_soon(self.listeners.fire_timers, name="wakeful-timers")
                        loops.start_soon(self.listeners.relay_cancels, name="wakeful-cancels")
                        if self.settings.retention_sweep_s > 0:
                            loops.start_soon(self.sweep.run, name="wakeful-sweep")
                        await self._stopping.wait()
                        if not self._killed:  # let the read in flight end (stop_reading)
                            self.listeners.stop_reading()
                            with anyio.move_on_after(self.settings.block_ms / 1000 + 1):
                                await self.listeners.reading_done.wait()
                        loops.cancel_scope.cancel()
                    if not self._killed:
                        await self.runners.drain(self.settings.shutdown_grace_s)
                finally:
                    self.runners.close()
                    with anyio.CancelScope(shield=True):  # also when killed or failing
                        await self.runners.stop_all()
            worker_group.cancel_scope.cancel()  # the lease loop: after the last wake

    async def _publish_types(self) -> None:
        """Record the registry's types in Redis (clients refuse a type no worker runs).
        Again after every acquisition: a Redis that lost its data lost them too."""
        await self.store.publish_types(
            {t.name: msgspec.json.encode(t.manifest()) for t in self.registry}
        )

    def _fault(self, point: str) -> None:
        if self.fault_hook is not None:
            self.fault_hook(point)

    # -- wiring between the rooms -----------------------------------------------

    def _now(self) -> float:
        return self.clock()

    def _token(self, partition: int) -> str | None:
        return self.lease_keeper.token(partition)

    async def _wake(self, ticket: WakeTicket) -> None:
        await self.pipeline.activate(ticket)

    async def _crashed(self, ticket: WakeTicket, exc: Exception) -> None:
        await self.pipeline.parking.crashed(ticket, exc)

    def _evicted(self, url: str) -> None:
        """An entity left the warm cache: free its capabilities unless it runs."""
        if self.services.has_capabilities(url) and not self.runners.running(url):
            self.runners.own(self._release_capabilities, url, name=f"release {url}")

    async def _release_capabilities(self, url: str) -> None:
        try:
            await self.services.release_capabilities(url)
        except Exception:  # a failing cleanup must not stop the worker
            log.exception("worker %s: releasing the capabilities of %s failed", self.id, url)


def _exporter(settings: Settings, archive: Exporter | None) -> Exporter | None:
    """The exporter of trimmed log entries: the one given, else JSON Lines files in
    ``settings.archive_dir`` if set, else none."""
    if archive is not None:
        return archive
    return JsonlExporter(settings.archive_dir) if settings.archive_dir else None
