"""Idle notices for waiting clients, over the process's shard-channel subscriptions.

Each commit that moves an entity's cursor publishes on the entity's idle channel
(``<prefix>:{<prefix>:pN}:idle:<url>``, a shard channel in its partition's slot). A
client waiting for several entities (or many ``ask`` calls at once) shares one
subscription connection per node (``shard_channels.py``) instead of holding one
connection per wait, which would exhaust the connection pool at about a hundred
concurrent waits. On a Redis Cluster each channel is subscribed on the master serving
its slot, and again on the new one after a failover.

A notice is advisory: a waiter re-checks the status every quarter second anyway, and
a lost subscription (a node failed, Redis refused it) wakes every waiter of its
channel, so it re-checks at once.
"""

from __future__ import annotations

import asyncio

from .shard_channels import ShardChannels


class Notices:
    def __init__(self, channels: ShardChannels) -> None:
        self._channels = channels
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._lock = asyncio.Lock()

    async def watch(self, channel: str) -> asyncio.Event:
        """Start watching ``channel``; the returned event is set on each notice.

        The subscription is sent when this returns, so a notice published once Redis
        has it is not missed. Call :meth:`unwatch` when done.
        """
        event = asyncio.Event()
        async with self._lock:
            first = channel not in self._waiters
            self._waiters.setdefault(channel, set()).add(event)
            if first:
                await self._channels.subscribe(channel, lambda _data: self._notify(channel))
        return event

    def _notify(self, channel: str) -> None:
        for event in self._waiters.get(channel, ()):
            event.set()

    async def unwatch(self, channel: str, event: asyncio.Event) -> None:
        async with self._lock:
            waiters = self._waiters.get(channel)
            if waiters is None:
                return
            waiters.discard(event)
            if not waiters:
                del self._waiters[channel]
                await self._channels.unsubscribe(channel)

    async def aclose(self) -> None:
        """Drop every watch (the subscriptions belong to the store's channels)."""
        async with self._lock:
            for channel in list(self._waiters):
                await self._channels.unsubscribe(channel)
            self._waiters.clear()
