"""Routing to the nodes of a Redis Cluster: the slot map, one client and one
auto-pipeline per master.

The scripts, the partition leases and the inbox reads go to the master of their
partition's slot through a plain client of that node (hiredis packing, a queueing
pool of its own). Not through redis-py's ``RedisCluster`` pipeline: when one node
fails, that pipeline closes the whole cluster client to refresh its topology, and
with it the connections that commands to healthy masters are waiting on, so one
dead master stalled every partition. Here a node's failure fails only the commands
sent to that node; the slot map is refreshed (``CLUSTER SLOTS`` from any node that
answers, at most every :data:`REFRESH_MIN_S`) and the commands of that node's
partitions find the promoted replica once the cluster has promoted it.

Redirections: ``MOVED`` updates the slot and sends again, ``ASK`` sends once to the
importing node after ``ASKING``, ``TRYAGAIN`` / ``CLUSTERDOWN`` (a slot being moved,
a failover under way) wait a little and send again; a command whose outcome is
unknown (the connection broke after it went out) is never resent: it is raised.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, cast

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.crc import key_slot
from redis.exceptions import AskError, ClusterDownError, MovedError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .batching import AutoPipeline, Stage
from .connection import ClusterClient, node_client

log = logging.getLogger("wakeful.routing")
SLOTS = 16384
REFRESH_MIN_S = 0.1  # slot map refreshes after failures: at most this often
REDIRECTS = 12  # MOVED / TRYAGAIN / CLUSTERDOWN answers a command may get before it fails
RETRY_BASE_S, RETRY_MAX_S = 0.02, 0.5  # backoff while a slot moves or a failover runs


class Router:
    """The slot map of one cluster client and a client and auto-pipeline per node."""

    def __init__(self, cluster: Redis) -> None:
        self._cluster = cast("ClusterClient", cluster)
        # per node, as the cluster client's own (a queueing pool here: callers wait)
        self._max_connections = int(self._cluster.options.get("max_connections", 100))
        self._slots: list[str] = []  # slot -> "host:port" of its master
        self._known: list[str] = [f"{h}:{p}" for h, p in self._cluster.seeds]
        self._clients: dict[str, Redis] = {}
        self._batches: dict[str, AutoPipeline] = {}
        self._lock = asyncio.Lock()
        self._refreshed = 0.0  # time.monotonic() of the last refresh
        self._refresh_task: asyncio.Task[None] | None = None

    # -- the slot map ----------------------------------------------------------

    async def refresh(self, *, force: bool = True) -> None:
        """Read the slot map from the first node that answers (the masters known last,
        then every other node seen, then the seeds)."""
        async with self._lock:
            if self._slots and not force:
                return
            if self._slots and time.monotonic() - self._refreshed < REFRESH_MIN_S:
                return
            error: BaseException | None = None
            order = list(dict.fromkeys([*self.primaries(), *self._known]))
            for name in order:
                try:
                    reply = await self.client(name).execute_command("CLUSTER SLOTS")
                except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
                    error = exc
                    continue
                self._apply(reply)
                self._refreshed = time.monotonic()
                return
            raise RedisConnectionError(f"no node of the Redis Cluster answers ({error})")

    def _apply(self, reply: list[Any]) -> None:
        slots = list(self._slots) if self._slots else [""] * SLOTS
        seen: list[str] = []
        for start, end, master, *replicas in reply:
            name = _name(master)
            slots[int(start) : int(end) + 1] = [name] * (int(end) - int(start) + 1)
            seen += [name, *(_name(r) for r in replicas)]
        self._slots = slots
        self._known = list(dict.fromkeys([*seen, *self._known]))

    def stale(self) -> None:
        """A node failed or redirected: refresh the slot map soon (in the background)."""
        running = self._refresh_task is not None and not self._refresh_task.done()
        if not running and time.monotonic() - self._refreshed >= REFRESH_MIN_S:
            # kept: the loop holds tasks weakly
            self._refresh_task = asyncio.get_running_loop().create_task(self._refresh_quietly())

    async def _refresh_quietly(self) -> None:
        try:
            await self.refresh()
        except Exception as exc:  # the next command that fails asks again
            log.warning("refreshing the Redis Cluster slot map failed: %s", exc)

    async def node_of(self, key: str | bytes) -> str:
        """``host:port`` of the master serving ``key``'s slot."""
        if not self._slots:
            await self.refresh(force=False)
        raw = key.encode() if isinstance(key, str) else key
        return self._slots[key_slot(raw)] or await self._unserved(key_slot(raw))

    async def _unserved(self, slot: int) -> str:
        await self.refresh()
        if not self._slots[slot]:
            raise ClusterDownError(f"CLUSTERDOWN no node serves slot {slot}")
        return self._slots[slot]

    def primaries(self) -> list[str]:
        """The masters of the current slot map (each serving at least one slot)."""
        return list(dict.fromkeys(n for n in self._slots if n))

    async def masters(self) -> list[str]:
        if not self._slots:
            await self.refresh(force=False)
        return self.primaries()

    def moved(self, error: AskError) -> None:
        """``MOVED slot host:port``: that slot is served there now."""
        if self._slots:
            self._slots[int(error.slot_id)] = f"{error.host}:{error.port}"
        self.stale()

    # -- clients ---------------------------------------------------------------

    def client(self, name: str) -> Redis:
        client = self._clients.get(name)
        if client is None:
            host, _, port = name.rpartition(":")
            client = node_client(self._cluster, host, int(port), self._max_connections)
            self._clients[name] = client
        return client

    def batch(self, name: str) -> AutoPipeline:
        batch = self._batches.get(name)
        if batch is None:
            batch = self._batches[name] = AutoPipeline(self.client(name))
        return batch

    async def execute(self, key: str, stage: Stage) -> Any:
        """Run ``stage``'s commands (all of ``key``'s slot) on that slot's master through
        its auto-pipeline, following redirections (see the module docstring)."""
        delay = RETRY_BASE_S
        redirected: str | None = None  # MOVED names the node: the next try goes there
        for _ in range(REDIRECTS):
            name, redirected = redirected or await self.node_of(key), None
            try:
                return await self.batch(name).execute(stage)
            except MovedError as exc:
                log.debug("MOVED %s %s:%s", exc.slot_id, exc.host, exc.port)
                # Not only through the slot map: a refresh that read a node's stale view
                # (a restarted node before it learns it lost its slots) must not send
                # the retry back there.
                redirected = f"{exc.host}:{exc.port}"
                self.moved(exc)
            except AskError as exc:
                log.debug("ASK %s %s:%s", exc.slot_id, exc.host, exc.port)
                return await self._asking(f"{exc.host}:{exc.port}", stage)
            except (TryAgainError, ClusterDownError) as exc:
                log.debug("%s: retrying in %.0f ms", exc, delay * 1000)
                self.stale()
                await asyncio.sleep(delay)
                delay = min(RETRY_MAX_S, delay * 2)
            except (RedisConnectionError, RedisTimeoutError, OSError):
                self.stale()
                raise
        return await self.batch(await self.node_of(key)).execute(stage)

    async def _asking(self, name: str, stage: Stage) -> Any:
        pipe = self.client(name).pipeline(transaction=False)
        pipe.execute_command("ASKING")
        stage(pipe)
        replies = (await pipe.execute(raise_on_error=False))[1:]
        error = next((r for r in replies if isinstance(r, Exception)), None)
        if error is not None:
            raise error
        return replies[0] if len(replies) == 1 else replies

    async def per_node(
        self, keys: dict[Any, str], stage: Callable[[Pipeline, Any], object]
    ) -> dict[Any, Any]:
        """One pipeline per master: ``stage(pipe, item)`` for every item of ``keys``
        (item -> a key of its slot), the nodes in parallel. Each item's reply, or the
        exception in its place: one node's failure leaves the others' replies."""
        if not self._slots:
            await self.refresh(force=False)
        groups: dict[str, list[Any]] = {}
        for item, key in keys.items():
            groups.setdefault(await self.node_of(key), []).append(item)

        async def run(name: str, items: list[Any]) -> list[Any]:
            pipe = self.client(name).pipeline(transaction=False)
            for item in items:
                stage(pipe, item)
            try:
                return await pipe.execute(raise_on_error=False)
            except Exception as exc:
                self.stale()
                return [exc] * len(items)

        replies = await asyncio.gather(*(run(n, items) for n, items in groups.items()))
        out: dict[Any, Any] = {}
        for items, answers in zip(groups.values(), replies, strict=True):
            for item, answer in zip(items, answers, strict=True):
                if isinstance(answer, AskError):
                    self.moved(answer) if isinstance(answer, MovedError) else self.stale()
                out[item] = answer
        return out

    async def aclose(self) -> None:
        if self._refresh_task is not None:
            self._refresh_task.cancel()
        clients, self._clients, self._batches = list(self._clients.values()), {}, {}
        for client in clients:
            await client.aclose()


def _name(node: list[Any]) -> str:
    host = node[0].decode() if isinstance(node[0], bytes) else str(node[0])
    return f"{host}:{int(node[1])}"
