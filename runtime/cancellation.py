"""The signal that tells a wake to stop, and why; and the cancel requests that set it.

It sits low in the layers because everything that runs during a wake checks
it: the handler context, the agent loop, every tool (it is the ``signal``
argument of ``execute``) and the worker, which sets it.

``rt.cancel`` publishes ``<url>\n<reason>`` on the shard channel of the entity's
partition (``Keyspace.cancel_channel``, in the partition's slot); a worker listens
on the channels of the partitions it holds (:class:`CancelRequests`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Literal

from .keys import Keyspace
from .shard_channels import ShardChannels

StopKind = Literal["cancel", "lease", "shutdown"]


class CancelSignal:
    """Set when the wake must stop.

    ``kind`` says why: ``"cancel"`` (a client cancelled the run: finish it as
    cancelled), ``"lease"`` (the worker lost the partition) or ``"shutdown"``
    (the worker is stopping). For the last two the wake's work is not lost: it
    resumes on the next owner.

    ``lease_valid`` (set by the worker) tells whether the wake's lease is still held,
    by its local deadline: :meth:`lease_lapsed` asks it right before a paid or
    effectful call, since after a pause (a frozen VM, SIGSTOP) no timer has fired yet.
    """

    def __init__(self, lease_valid: Callable[[], bool] | None = None) -> None:
        self._cancelled = False
        # Made by the first ``wait`` only: most signals are never waited on (one is
        # armed for every wake), and an ``asyncio.Event`` is not free.
        self._event: asyncio.Event | None = None
        self.reason: str | None = None
        self.kind: StopKind | None = None
        self._lease_valid = lease_valid
        self._callbacks: list[Callable[[], None]] = []

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def cancel(self, reason: str, kind: StopKind = "cancel") -> None:
        if not self._cancelled:
            self.reason = reason
            self.kind = kind
            self._cancelled = True
            if self._event is not None:
                self._event.set()
            callbacks, self._callbacks = self._callbacks, []
            for callback in callbacks:
                callback()

    def on_cancel(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` when the signal fires (at once if it has); return what
        removes it. A race against the signal so needs no task waiting on it."""
        if self._cancelled:
            callback()
            return _nothing
        self._callbacks.append(callback)

        def remove() -> None:
            if callback in self._callbacks:
                self._callbacks.remove(callback)

        return remove

    def lease_lapsed(self) -> bool:
        """Whether the lease the wake runs under lapsed (judged now, by its deadline);
        if so the signal is set too (kind ``"lease"``)."""
        if self._lease_valid is None or self._lease_valid():
            return False
        self.cancel("the lease of the partition lapsed", kind="lease")
        return True

    async def wait(self) -> str | None:
        if not self._cancelled:
            if self._event is None:
                self._event = asyncio.Event()
            await self._event.wait()
        return self.reason


def _nothing() -> None:
    return None


class CancelRequests:
    """The worker's cancel requests: :meth:`next` yields ``(url, reason)`` pairs.

    One shard channel per held partition (``partitions()``), through the process's
    shard-channel subscriptions. :meth:`sync` subscribes the partitions acquired and
    drops the ones released; the inbox reader calls it before each read, so a
    partition's channel is subscribed before any of its wakes starts, and
    :meth:`next` at each call. :meth:`close` drops them all."""

    def __init__(
        self, channels: ShardChannels, keys: Keyspace, partitions: Callable[[], list[int]]
    ) -> None:
        self._channels = channels
        self._keys = keys
        self._partitions = partitions
        self._held: set[int] = set()
        self._lock = asyncio.Lock()  # the reader and the relay both sync
        self._requests: asyncio.Queue[tuple[str, str]] = asyncio.Queue()

    def _heard(self, data: bytes | None) -> None:
        if data is None:  # the subscription was lost: a missed cancel is in the log
            return
        # Anyone may publish here: text that is not UTF-8 must not end the listener.
        url, _, reason = data.decode(errors="replace").partition("\n")
        if url:
            self._requests.put_nowait((url, reason))

    async def sync(self) -> None:
        """Subscribe the channels of the partitions held now, drop the others."""
        held = set(self._partitions())
        if held == self._held:
            return
        async with self._lock:
            held = set(self._partitions())
            for p in self._held - held:
                await self._channels.unsubscribe(self._keys.cancel_channel(p))
            for p in sorted(held - self._held):
                await self._channels.subscribe(self._keys.cancel_channel(p), self._heard)
            self._held = held

    def hears(self, partition: int) -> bool:
        """Whether ``partition``'s channel is subscribed (a wake there may start)."""
        return partition in self._held

    async def next(self, timeout: float) -> tuple[str, str] | None:
        """The next cancel request, or None if none came within ``timeout`` seconds."""
        await self.sync()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                return await self._requests.get()
        return None

    async def close(self) -> None:
        async with self._lock:
            for p in self._held:
                await self._channels.unsubscribe(self._keys.cancel_channel(p))
            self._held = set()
