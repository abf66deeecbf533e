"""The inbox doorbell on a Redis Cluster: wait for new wake pointers without polling.

A read of several inboxes in one blocking XREADGROUP is CROSSSLOT on a cluster, so
the reader reads each partition's inbox without blocking (one pipeline per master)
and, when none had a pointer, waits here. Every script that adds a pointer rings the
inbox's shard channel (``SPUBLISH <inbox key>``, in the partition's slot; see
``lua.py``); :class:`Doorbell` subscribes (``SSUBSCRIBE``) to the inboxes being read,
one pub/sub connection and one listener task per master, and :meth:`Doorbell.wait`
returns at the first ring, or after the timeout (the safety net: a ring is advisory,
a pointer is found by the next read whatever happened to its ring).

No ring is lost between a read and the wait: :meth:`Doorbell.clear` is called before
the read, and a ring that comes after it is kept until :meth:`Doorbell.wait`. A
master that fails loses its subscriptions; they are made again (at most every
:data:`RESUBSCRIBE_S`) on the node serving the slot by then.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

from redis.exceptions import RedisError

from .keys import Keyspace
from .routing import Router
from .tasks import OwnedTasks

log = logging.getLogger("wakeful.doorbell")
RESUBSCRIBE_S = 0.5


class Doorbell:
    def __init__(self, router: Router, keys: Keyspace) -> None:
        self._router = router
        self._keys = keys
        self._rung = asyncio.Event()
        self._subs: dict[str, Any] = {}  # node -> its pub/sub
        self._listeners: dict[str, asyncio.Task[None]] = {}
        self._where: dict[int, str] = {}  # partition -> node it is subscribed on
        self._wanted: set[int] = set()
        self._synced = 0.0
        self._tasks = OwnedTasks(log)

    def clear(self) -> None:
        """Before a read: forget rings so far (the read sees their pointers)."""
        self._rung.clear()

    async def wait(self, partitions: list[int], timeout_s: float) -> None:
        """Until a ring of one of ``partitions`` (subscribing to them first), or
        ``timeout_s``."""
        wanted = set(partitions)
        if wanted != self._wanted or (
            wanted != self._where.keys() and time.monotonic() - self._synced >= RESUBSCRIBE_S
        ):
            self._wanted, self._synced = wanted, time.monotonic()
            await self._sync(wanted)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._rung.wait(), timeout_s)

    async def _sync(self, wanted: set[int]) -> None:
        for p, node in list(self._where.items()):
            inbox = self._keys.inbox(p)
            if p not in wanted or await self._router.node_of(inbox) != node:
                self._where.pop(p)
                with contextlib.suppress(Exception):
                    await self._subs[node].execute_command("SUNSUBSCRIBE", inbox)
        for p in sorted(wanted - self._where.keys()):
            inbox = self._keys.inbox(p)
            node = await self._router.node_of(inbox)
            pubsub = self._subs.get(node)
            if pubsub is None:
                pubsub = self._subs[node] = self._router.client(node).pubsub()
            try:
                await pubsub.ssubscribe(inbox)
            except (RedisError, OSError) as exc:
                log.warning("subscribing to the doorbell of partition %d failed: %s", p, exc)
                self._router.stale()
                await self._drop(node)
                continue
            self._where[p] = node
            if node not in self._listeners or self._listeners[node].done():
                self._listeners[node] = self._tasks.start(
                    self._listen(node, pubsub), name=f"wakeful-doorbell {node}"
                )

    async def _listen(self, node: str, pubsub: Any) -> None:
        """Set the ring on every message of ``node``; on an error drop the node (its
        partitions subscribe again at a later wait) and ring, so the reader reads."""
        try:
            while True:
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                if message is not None and message.get("type") == "smessage":
                    self._rung.set()
        except (RedisError, OSError) as exc:
            log.warning("the doorbell of %s is interrupted: %s", node, exc)
            self._router.stale()
            if self._subs.get(node) is pubsub:  # not a newer subscription of the node
                self._listeners.pop(node, None)
                await self._drop(node)
            self._rung.set()

    async def _drop(self, node: str) -> None:
        pubsub = self._subs.pop(node, None)
        self._where = {p: n for p, n in self._where.items() if n != node}
        if pubsub is not None:
            with contextlib.suppress(Exception):
                await pubsub.aclose()

    async def aclose(self) -> None:
        await self._tasks.aclose()
        self._listeners.clear()
        for node in list(self._subs):
            await self._drop(node)
