"""Idle notices for waiting clients, over one shared pub/sub connection.

Each commit that moves an entity's cursor publishes on ``<prefix>:idle:<url>``.
A client waiting for several entities (or many ``ask`` calls at once) shares
one subscription connection instead of holding one connection per wait, which
would exhaust the connection pool at about a hundred concurrent waits.

The reader task is started by the first watch and ends when nobody watches; it
belongs to the :class:`Notices` (an :class:`~wakeful.tasks.OwnedTasks`), which
cancels it on :meth:`Notices.aclose`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import NoPermissionError

from .acl import Refusals, missing_right
from .tasks import OwnedTasks

log = logging.getLogger("wakeful.notices")


class Notices:
    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._pubsub: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._lock = asyncio.Lock()
        self._tasks = OwnedTasks(log)
        self._refusals = Refusals(log, logging.WARNING)

    async def watch(self, channel: str) -> asyncio.Event:
        """Start watching ``channel``; the returned event is set on each notice.

        The subscription is active when this returns, so a notice published
        afterwards is not missed. Call :meth:`unwatch` when done.
        """
        event = asyncio.Event()
        async with self._lock:
            if self._pubsub is None:
                self._pubsub = self._redis.pubsub()
            first = channel not in self._waiters
            self._waiters.setdefault(channel, set()).add(event)
            if first:
                await self._pubsub.subscribe(channel)
            if self._reader is None or self._reader.done():
                self._reader = self._tasks.start(self._read(), name="wakeful-idle-notices")
        return event

    async def unwatch(self, channel: str, event: asyncio.Event) -> None:
        async with self._lock:
            waiters = self._waiters.get(channel)
            if waiters is None:
                return
            waiters.discard(event)
            if not waiters:
                del self._waiters[channel]
                with contextlib.suppress(Exception):
                    await self._pubsub.unsubscribe(channel)

    async def _read(self) -> None:
        while self._waiters:
            try:
                message = await self._pubsub.get_message(
                    ignore_subscribe_messages=True, timeout=1.0
                )
            except NoPermissionError:  # a SUBSCRIBE refused: the waiters poll
                channel = next(iter(self._waiters), "<prefix>:idle:")
                pattern = channel.partition(":idle:")[0] + ":idle:*"  # of <prefix>:idle:<url>
                refused = missing_right(f"&{pattern}", f"subscribe to {channel}")
                self._refusals.report(
                    f"{refused}; waits see changes when they re-check (a quarter second)"
                )
                continue
            except Exception as exc:  # waiters fall back to re-checking the status
                log.warning("idle notices interrupted: %s", exc)
                await asyncio.sleep(0.1)
                continue
            if message is None:
                continue
            channel = message["channel"]
            channel = channel.decode() if isinstance(channel, bytes) else channel
            for event in self._waiters.get(channel, ()):
                event.set()

    async def aclose(self) -> None:
        await self._tasks.aclose()
        if self._pubsub is not None:
            with contextlib.suppress(Exception):
                await self._pubsub.aclose()
