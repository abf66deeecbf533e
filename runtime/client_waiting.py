"""Waiting for entities: until one or all are idle, and for the answer to a message.

The waiting half of :class:`~wakeful.client.Runtime`: a wait listens on the entity's
idle notices (``notices.py``) and checks again on each, with a quarter-second poll as
a floor; :meth:`ask` sends, waits and turns the last run's end into an answer or an
error.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from .connection import AUTHENTICATION_ERRORS
from .errors import (
    RunFailedError,
    RunRefusedError,
    RunSuspendedError,
    RunTruncatedError,
    WaitTimeoutError,
    WakefulError,
)
from .events import ActionRequested, LogRecord, RunFinished, TrimmedRecord, UndecodableRecord
from .live import LiveRecord
from .notices import Notices
from .status import EntityStatus
from .store import TRANSIENT_ERRORS, Store
from .tasks import all_of

T = TypeVar("T")


class IdleWaiting:
    """Waits on entities' idle notices, and :meth:`ask`'s send-and-wait."""

    _notices: Notices | None

    async def wait_idle(self, url: str, timeout: float = 30.0) -> EntityStatus:
        """Wait until the entity is idle: every input sent so far handled, its effects
        delivered, no timers pending, and no child it awaits still running; or suspended
        (its run waits for pending actions), or failed."""
        last: EntityStatus | None = None

        async def settled() -> EntityStatus | None:
            nonlocal last
            last = await self.status(url)
            return last if last.at_rest else None

        status = await self._until_notified(url, timeout, settled)
        if status is not None:
            return status
        assert last is not None
        raise WaitTimeoutError(
            f"{url} is still {last.status} after {timeout}s (cursor {last.cursor}, last "
            f"input {last.last_input}, awaited children {last.awaited_children}, timers "
            f"{last.timers}, undelivered effects {last.undelivered})"
            + await self._no_worker_hint(url)
        )

    async def _until_notified(
        self, url: str, timeout: float, check: Callable[[], Awaitable[T | None]]
    ) -> T | None:
        """``check()`` until it gives a value: at once, on every notice on the entity's
        idle channel (its commits and its deletion publish there) and every quarter
        second regardless. None if ``timeout`` seconds pass first (after a last check).

        A check that fails on a lost connection (a pooled connection from before a Redis
        restart, a failover) is a check that found nothing yet: the wait goes on, and
        only if no check ever got an answer is the last such error raised."""
        deadline = time.monotonic() + timeout
        channel = self._store.keys.idle_channel(url)
        assert self._notices is not None
        notice = await self._notices.watch(channel)
        answered = False
        try:
            while True:
                notice.clear()
                try:
                    result = await check()
                except AUTHENTICATION_ERRORS:
                    raise  # a ConnectionError to redis-py, but no wait fixes it
                except TRANSIENT_ERRORS:
                    if not answered and time.monotonic() >= deadline:
                        raise
                    result = None
                else:
                    answered = True
                if result is not None:
                    return result
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(remaining, 0.25)):
                        await notice.wait()
        finally:
            await self._notices.unwatch(channel, notice)

    async def ask(self, url: str, text: Any, *, timeout: float = 60.0, **send_options: Any) -> str:
        """Send ``text``, wait until the entity and the children it awaits are idle,
        and return the response of the last run that finished after the message.

        Raises :class:`RunFailedError` if that run failed or was cancelled (its
        subclasses :class:`RunTruncatedError` if the answer was cut off,
        :class:`RunRefusedError` if the model refused; ``response`` holds what it did
        answer), and :class:`WakefulError` if no run finished.
        """
        sent = await self.send(url, text, **send_options)
        status = await self.wait_idle(url, timeout=timeout)
        if status.status == "failed":
            raise RunFailedError(url, "failed", status.error)
        if status.pending_actions:
            pending = await self.pending_actions(url)
            raise RunSuspendedError(url, [a.tool_call_id for a in pending])
        last: RunFinished | None = None
        async for record in self.events(url, after=sent):
            if isinstance(record, LogRecord) and isinstance(record.event, RunFinished):
                last = record.event
        if last is None:
            raise WakefulError(f"{url} finished handling the message without finishing a run")
        if last.status != "completed":
            error = {"truncated": RunTruncatedError, "refused": RunRefusedError}.get(
                last.status, RunFailedError
            )
            raise error(
                url, last.status, last.error, response=last.response, stop_reason=last.stop_reason
            )
        return last.response or ""

    async def wait_all_idle(
        self, types: Iterable[str] | None = None, timeout: float = 30.0
    ) -> dict[str, EntityStatus]:
        """Wait until every entity (of ``types``, default every known type) is idle as
        :meth:`wait_idle` means it, and return their statuses by url.

        It waits on the entities' idle notices, not by polling, and lists the keyspace
        again after each round (children spawned meanwhile count too); it returns when two
        consecutive rounds find the same entities idle at the same positions, so nothing
        moved in between. :class:`WaitTimeoutError` names an entity still busy."""
        deadline = time.monotonic() + timeout
        names = None if types is None else sorted(set(types))
        previous: dict[str, tuple[str, str]] | None = None
        while True:
            urls = await (self.list() if names is None else self._urls_of(names))
            found = await self._wait_each_idle(urls, max(deadline - time.monotonic(), 0.0))
            positions = {url: (st.cursor, st.last_input) for url, st in found.items()}
            if positions == previous:
                return dict(sorted(found.items()))
            if previous is not None and time.monotonic() >= deadline:
                raise WaitTimeoutError(
                    f"the keyspace was still changing after {timeout}s "
                    f"({len(positions)} entities, each idle when checked)"
                )
            previous = positions

    async def _wait_each_idle(self, urls: list[str], timeout: float) -> dict[str, EntityStatus]:
        # One bulk read first: only the entities not at rest yet are waited on, each.
        found = {url: st for url, st in (await self.statuses(urls)).items() if st and st.at_rest}

        async def settle(url: str) -> None:
            found[url] = await self.wait_idle(url, timeout=timeout)

        busy = [url for url in urls if url not in found]
        if busy:
            await all_of([settle(url) for url in busy])
        return {url: found[url] for url in urls}

    async def _urls_of(self, types: list[str]) -> list[str]:
        urls: list[str] = []
        for type_name in types:
            urls.extend(await self.list(type_name))
        return sorted(urls)

    if TYPE_CHECKING:  # last: ``list`` in the annotations above is the builtin

        @property
        def _store(self) -> Store: ...  # the runtime's store

        async def status(self, url: str, *, runs: bool = False) -> EntityStatus: ...

        async def statuses(self, urls: Iterable[str]) -> dict[str, EntityStatus | None]: ...

        async def _no_worker_hint(self, url: str) -> str: ...

        async def send(self, url: str, payload: Any, *args: Any, **options: Any) -> str: ...

        async def pending_actions(self, url: str) -> list[ActionRequested]: ...

        def events(  # LogReads' (before this class in Runtime's bases)
            self, url: str, *, after: str | None = None
        ) -> AsyncGenerator[LogRecord | UndecodableRecord | LiveRecord | TrimmedRecord, None]: ...

        async def list(self, type_name: str | None = None) -> list[str]: ...
