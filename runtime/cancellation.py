"""The signal that tells a wake to stop, and why.

It sits low in the layers because everything that runs during a wake checks
it: the handler context, the agent loop, every tool (it is the ``signal``
argument of ``execute``) and the worker, which sets it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Literal

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
        self._event = asyncio.Event()
        self.reason: str | None = None
        self.kind: StopKind | None = None
        self._lease_valid = lease_valid
        self._callbacks: list[Callable[[], None]] = []

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def cancel(self, reason: str, kind: StopKind = "cancel") -> None:
        if not self._event.is_set():
            self.reason = reason
            self.kind = kind
            self._event.set()
            callbacks, self._callbacks = self._callbacks, []
            for callback in callbacks:
                callback()

    def on_cancel(self, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` when the signal fires (at once if it has); return what
        removes it. A race against the signal so needs no task waiting on it."""
        if self._event.is_set():
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
        await self._event.wait()
        return self.reason


def _nothing() -> None:
    return None
