"""The inbox doorbell on a Redis Cluster: wait for new wake pointers without polling.

A read of several inboxes in one blocking XREADGROUP is CROSSSLOT on a cluster, so
the reader reads each partition's inbox without blocking (one pipeline per master)
and, when none had a pointer, waits here. Every script that adds a pointer rings the
inbox's shard channel (``SPUBLISH <inbox key>``, in the partition's slot; see
``lua.py``); :class:`Doorbell` subscribes to the inboxes being read through the
process's shard-channel subscriptions (``shard_channels.py``: one connection per
master), and :meth:`Doorbell.wait` returns at the first ring, or after the timeout
(the safety net: a ring is advisory, a pointer is found by the next read whatever
happened to its ring).

No ring is lost between a read and the wait: :meth:`Doorbell.clear` is called before
the read, and a ring that comes after it is kept until :meth:`Doorbell.wait`. A lost
subscription (a master failed) rings too, so the reader reads at once; it is made
again on the node serving the slot by then.
"""

from __future__ import annotations

import asyncio
import contextlib

from .keys import Keyspace
from .shard_channels import ShardChannels


class Doorbell:
    def __init__(self, channels: ShardChannels, keys: Keyspace) -> None:
        self._channels = channels
        self._keys = keys
        self._rung = asyncio.Event()
        self._wanted: set[int] = set()

    def clear(self) -> None:
        """Before a read: forget rings so far (the read sees their pointers)."""
        self._rung.clear()

    def _ring(self, data: bytes | None) -> None:
        self._rung.set()

    async def wait(self, partitions: list[int], timeout_s: float) -> None:
        """Until a ring of one of ``partitions`` (subscribing to them first, and
        dropping the partitions no longer read), or ``timeout_s``."""
        wanted = set(partitions)
        if wanted != self._wanted:
            for p in self._wanted - wanted:
                await self._channels.unsubscribe(self._keys.inbox(p))
            for p in sorted(wanted - self._wanted):
                await self._channels.subscribe(self._keys.inbox(p), self._ring)
            self._wanted = wanted
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._rung.wait(), timeout_s)
