"""Shard-channel subscriptions: ``SSUBSCRIBE`` on the node that serves each channel.

Every channel Wakeful uses is a shard channel (Redis 7.0+) named inside a partition's
hash tag (``keys.py``), so on a Redis Cluster a message stays on the master of the
partition's slot (a plain ``PUBLISH`` is broadcast over the cluster bus to every node)
and a subscription is made on that master. Three users share one
:class:`ShardChannels` per process (a store's ``channels``):

* the inbox doorbell (``doorbell.py``, on a cluster): each read inbox's own channel;
* the worker's cancel relay (``cancellation.CancelRequests``): each held partition's
  cancel channel, subscribed when the partition is acquired and dropped when it goes;
* a client's idle notices (``notices.py``): an entity's idle channel while a caller
  waits on it.

On a single Redis the same commands run on its one connection (:class:`OneNode`), so
both backends share this code; fakeredis serves ``SSUBSCRIBE`` / ``SPUBLISH`` too.

One pub/sub connection and one listener task per node. A channel has one handler,
called with each message's data. Every message is advisory (a waiter re-checks, a
reader reads again, a cancel is also an input in the entity's log), so a subscription
may be lost: when a node fails, is failed over, or gives a slot away (the server then
ends its subscriptions of that slot), or Redis refuses the subscription (an ACL
without the channel right), its channels' handlers are called with ``None`` (a
message may have been missed), and the channels are subscribed again on the node
serving their slot by then: after :data:`RESUBSCRIBE_S`, or :data:`REFUSED_RETRY_S`
after a refusal, until it works.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from redis.asyncio import Redis
from redis.exceptions import NoPermissionError, RedisError

from .acl import Refusals, missing_right
from .errors import describe
from .tasks import OwnedTasks

log = logging.getLogger("wakeful.channels")
RESUBSCRIBE_S = 0.5  # a subscription lost with its node is made again this much later
REFUSED_RETRY_S = 30.0  # one Redis refused (ACL) is tried again this much later
LISTEN_S = 1.0  # a listener's read timeout (it reads again; messages do not wait on it)

Handler = Callable[[bytes | None], None]
"""Called with each message's data; with ``None`` when the subscription was lost."""


class Nodes(Protocol):
    """Where a channel lives: :class:`~wakeful.routing.Router` on a cluster."""

    async def node_of(self, key: str | bytes) -> str: ...

    def client(self, name: str) -> Redis: ...

    def stale(self) -> None: ...


class OneNode:
    """A single Redis: the one node of every channel."""

    NAME = "redis"

    def __init__(self, redis: Redis) -> None:
        self._redis = redis

    async def node_of(self, key: str | bytes) -> str:
        return self.NAME

    def client(self, name: str) -> Redis:
        return self._redis

    def stale(self) -> None:
        """Nothing to refresh: there is no slot map."""


class ShardChannels:
    """The shard-channel subscriptions of one process (see the module docstring).

    ``rule`` is the ACL channel rule that grants them all (``&<prefix>:*``), for the
    log line of a refusal."""

    def __init__(self, nodes: Nodes, rule: str) -> None:
        self._nodes = nodes
        self._rule = rule
        self._handlers: dict[str, Handler] = {}  # wanted channel -> its handler
        self._where: dict[str, str] = {}  # subscribed channel -> its node
        self._subs: dict[str, Any] = {}  # node -> its pub/sub
        self._listeners: dict[str, asyncio.Task[None]] = {}
        self._lock = asyncio.Lock()
        self._tasks = OwnedTasks(log)
        self._retry: asyncio.Task[None] | None = None
        self._hurry = asyncio.Event()  # a channel was lost while the retry waits longer
        self._refused_at: dict[str, float] = {}
        self._unconfirmed: dict[
            str, list[str]
        ] = {}  # node -> SSUBSCRIBEs not answered yet  # channel -> time.monotonic() of a refusal
        self._refusals = Refusals(log, logging.WARNING)

    def subscribed(self, channel: str) -> bool:
        """Whether ``channel`` is subscribed now (not waiting for a retry)."""
        return channel in self._where

    async def subscribe(self, channel: str, handler: Handler) -> None:
        """Listen on ``channel``: messages go to ``handler`` from now on. If the node
        cannot be reached, it is tried again later (see the module docstring)."""
        async with self._lock:
            self._handlers[channel] = handler
            if channel not in self._where and not await self._place(channel):
                self._retry_in(RESUBSCRIBE_S)

    async def unsubscribe(self, channel: str) -> None:
        async with self._lock:
            self._handlers.pop(channel, None)
            self._refused_at.pop(channel, None)
            node = self._where.pop(channel, None)
            if node is None:
                return
            if not any(n == node for n in self._where.values()):
                await self._drop(node)  # its last channel: close the connection
                return
            with contextlib.suppress(Exception):  # gone already: nothing to undo
                await self._subs[node].sunsubscribe(channel)

    async def _place(self, channel: str) -> bool:
        """SSUBSCRIBE ``channel`` on its node; False if that failed (node dropped)."""
        try:
            node = await self._nodes.node_of(channel)
        except (RedisError, OSError) as exc:
            log.warning("finding the node of %s failed: %s", channel, exc)
            return False
        pubsub = self._subs.get(node)
        if pubsub is None:
            pubsub = self._subs[node] = self._nodes.client(node).pubsub()
        try:
            await pubsub.ssubscribe(channel)
        # Any error: a subscription is advisory, and redis-py may raise others than
        # RedisError from a connection another task is closing (AttributeError on its
        # gone writer, seen after a failover): never fail the caller (the inbox reader).
        except Exception as exc:
            log.warning("subscribing to %s on %s failed: %s", channel, node, exc)
            self._nodes.stale()
            await self._drop(node)
            return False
        self._where[channel] = node
        self._unconfirmed.setdefault(node, []).append(channel)
        listener = self._listeners.get(node)
        if listener is None or listener.done():
            self._listeners[node] = self._tasks.start(
                self._listen(node, pubsub), name=f"wakeful-channels {node}"
            )
        return True

    async def _listen(self, node: str, pubsub: Any) -> None:
        """Hand each message of ``node`` to its channel's handler, until the node fails
        (its channels are then lost: see :meth:`_lose`)."""
        try:
            while True:
                if not self._listening(node, pubsub):  # dropped (see _drop)
                    return
                try:
                    message = await pubsub.get_message(timeout=LISTEN_S)
                except NoPermissionError as exc:  # one SSUBSCRIBE refused; the rest stand
                    if not self._refused(node, pubsub, exc):
                        raise
                    continue
                if message is not None:
                    self._dispatch(node, message)
        except NoPermissionError as exc:  # a refusal that names no channel
            self._report_refusal(str(exc))
            await self._lose(node, pubsub, REFUSED_RETRY_S)
        except Exception as exc:  # as in _place: the node's channels are lost, not the listener
            log.warning("shard-channel subscriptions on %s interrupted: %s", node, describe(exc))
            self._nodes.stale()
            await self._lose(node, pubsub, RESUBSCRIBE_S)

    def _listening(self, node: str, pubsub: Any) -> bool:
        return self._subs.get(node) is pubsub

    def _dispatch(self, node: str, message: dict[str, Any]) -> None:
        kind = message.get("type")
        channel = _text(message.get("channel"))
        if kind == "smessage":
            self._call(channel, message.get("data"))
        elif kind == "ssubscribe":
            with contextlib.suppress(ValueError):  # a resubscription of redis-py's own
                self._unconfirmed.get(node, []).remove(channel)
        elif kind == "sunsubscribe" and self._where.get(channel) == node:
            # Not asked for (an unsubscribe forgets the channel first): the server ended
            # it, as Redis does for a slot it gave away. Subscribe where the slot is now.
            self._where.pop(channel, None)
            self._nodes.stale()
            self._call(channel, None)
            self._retry_in(RESUBSCRIBE_S)

    def _refused(self, node: str, pubsub: Any, exc: NoPermissionError) -> bool:
        """Redis refused a subscription: the oldest one of ``node`` not confirmed yet (a
        node answers its subscriptions in order; Redis 7.0's error does not name the
        channel). That channel is lost and tried again in :data:`REFUSED_RETRY_S`.
        False if no subscription was waiting for its answer."""
        unconfirmed = self._unconfirmed.get(node)
        if not unconfirmed:
            return False
        channel = unconfirmed.pop(0)
        self._report_refusal(channel)
        for name in (channel, channel.encode()):  # nor let redis-py resubscribe it
            pubsub.shard_channels.pop(name, None)
        if self._where.get(channel) == node:
            self._where.pop(channel)
            self._refused_at[channel] = time.monotonic()
            self._call(channel, None)
            self._retry_in(RESUBSCRIBE_S)
        return True

    def _report_refusal(self, what: str) -> None:
        refused = missing_right(self._rule, f"subscribe to {what}")
        self._refusals.report(
            f"{refused}; its notices reach this process late (waits re-check every "
            f"quarter second, a cancel stops a run at its next wake); trying again every "
            f"{REFUSED_RETRY_S:.0f} s"
        )

    def _call(self, channel: str, data: bytes | None) -> None:
        handler = self._handlers.get(channel)
        if handler is None:
            return
        try:
            handler(data)
        except Exception:  # one bad message or handler must not end the listener
            log.exception("the handler of shard channel %s failed", channel)

    async def _lose(self, node: str, pubsub: Any, retry_s: float) -> None:
        async with self._lock:
            if self._subs.get(node) is not pubsub:  # a newer subscription of the node
                return
            lost = [c for c, n in self._where.items() if n == node]
            self._listeners.pop(node, None)
            await self._drop(node)
        for channel in lost:
            self._call(channel, None)
        self._retry_in(retry_s)

    def _retry_in(self, delay_s: float) -> None:
        if self._retry is None or self._retry.done():
            self._hurry.clear()
            self._retry = self._tasks.start(self._resubscribe(delay_s), name="wakeful-channels")
        elif delay_s <= RESUBSCRIBE_S:
            self._hurry.set()  # a retry waits for a refusal's time: a loss is sooner

    async def _resubscribe(self, delay_s: float) -> None:
        """Subscribe the wanted channels that are not, after ``delay_s`` (a backoff: the
        node may still be failing over) and again until all are; a channel Redis
        refused, only :data:`REFUSED_RETRY_S` after its refusal."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._hurry.wait(), delay_s)
                await asyncio.sleep(RESUBSCRIBE_S)  # hurried: still the backoff of a loss
            self._hurry.clear()
            async with self._lock:
                now = time.monotonic()
                for channel in [c for c in self._handlers if c not in self._where]:
                    if now - self._refused_at.get(channel, -REFUSED_RETRY_S) >= REFUSED_RETRY_S:
                        self._refused_at.pop(channel, None)
                        await self._place(channel)
                missing = [c for c in self._handlers if c not in self._where]
                if not missing:
                    return
                due = min(
                    self._refused_at.get(c, now - REFUSED_RETRY_S) + REFUSED_RETRY_S
                    for c in missing
                )
                delay_s = max(RESUBSCRIBE_S, due - now)

    async def _drop(self, node: str) -> None:
        """Forget ``node``'s subscriptions and close its connection (under the lock)."""
        pubsub = self._subs.pop(node, None)
        self._where = {c: n for c, n in self._where.items() if n != node}
        self._unconfirmed.pop(node, None)
        listener = self._listeners.pop(node, None)
        while listener is not None and listener is not asyncio.current_task():
            # Ended before its connection closes under it. Cancelled until it ends: on
            # Python 3.11 a wait_for inside the read whose wait completes as the cancel
            # comes swallows that cancel (and the listener would read on forever).
            listener.cancel()
            done, _ = await asyncio.wait({listener}, timeout=0.05)
            if done:
                break
        if pubsub is not None:
            with contextlib.suppress(Exception):  # the connection is gone already
                await pubsub.aclose()

    async def aclose(self) -> None:
        self._handlers.clear()
        async with self._lock:
            for node in list(self._subs):
                await self._drop(node)  # its listener first (see there)
        await self._tasks.aclose()  # the retry, if one waits
        self._listeners.clear()


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
