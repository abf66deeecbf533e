"""When a wake fails: retry it later, or park the entity.

A handler that raises is retried with exponential backoff (a ``handler_failed``
event records each attempt; the inputs stay unhandled). A retry takes only the
first input (:func:`first_unit`), so the input the handler fails on is isolated
and the others are handled by later wakes. After ``max_attempts`` the entity is
**parked**: an ``entity_failed`` event and
``status=failed`` in its metadata, its wake pointers acknowledged, its inputs
left in the log until an operator resumes it. Parking also finishes the run
the wake belonged to as failed, so subscribers waiting for it are notified.
Entities whose type is unknown or whose history cannot be read are parked the
same way, without retries.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable

from . import metrics
from .activation import PLAIN, Activation, CommitBatch
from .cache import WarmCache
from .config import Settings
from .delivery import Delivery
from .errors import describe
from .events import (
    RUNTIME_EVENT_MAX_BYTES,
    Created,
    EntityFailed,
    HandlerFailed,
    LogRecord,
    encode_event,
)
from .store import Store
from .ticket import WakeTicket, commit

log = logging.getLogger("wakeful.failures")


def first_unit(inputs: list[LogRecord]) -> list[LogRecord]:
    """What a retried wake takes: its first input (with the input after it when that
    is the entity's ``created`` event, which its first message comes with)."""
    return inputs[: 2 if inputs and isinstance(inputs[0].event, Created) else 1]


class RetryLater(Exception):
    """The wake failed and is retried after ``delay`` seconds (its pointers stay pending)."""

    def __init__(self, delay: float) -> None:
        super().__init__(delay)
        self.delay = delay


class Parking:
    def __init__(
        self,
        store: Store,
        settings: Settings,
        delivery: Delivery,
        cache: WarmCache,
        done: Callable[[WakeTicket], None],
    ) -> None:
        self.store = store
        self.settings = settings
        self.delivery = delivery
        self.cache = cache
        self._done = done  # the ticket's pointers are acknowledged

    async def handler_failed(
        self,
        ticket: WakeTicket,
        inputs: list[LogRecord],
        attempts: int,
        exc: Exception,
        act: Activation,
    ) -> None:
        """Record the failed attempt; raise :class:`RetryLater`, or park after the last one."""
        attempt = attempts + 1
        input_ids = [r.id for r in inputs]
        failure = HandlerFailed(
            error_type=type(exc).__name__,
            error=str(exc),
            traceback="".join(traceback.format_exception(exc))[-8000:],
            attempt=attempt,
            inputs=input_ids,
        )
        log.warning("handler of %s failed (attempt %d): %s", ticket.url, attempt, describe(exc))
        # A wake of several inputs is retried (one input at a time) rather than parked.
        if attempt < self.settings.max_attempts or len(first_unit(inputs)) < len(inputs):
            record = CommitBatch(
                events=[(PLAIN, encode_event(failure, limit=RUNTIME_EVENT_MAX_BYTES))]
            )
            await commit(self.store, ticket, record, fields={"attempts": attempt})
            s = self.settings
            raise RetryLater(min(s.retry_base_ms * 2 ** (attempt - 1), s.retry_max_ms) / 1000)
        error = describe(exc)
        # Subscribers must not wait forever: the run this wake belongs to finishes as
        # failed. What the failed attempt buffered never happened: take it and drop it.
        act.take_commit()
        act.finish_run("failed", error=error)
        await self.park(ticket, error, input_ids, attempt, failure, act.take_commit())

    async def park(
        self,
        ticket: WakeTicket,
        error: str,
        input_ids: list[str],
        attempts: int,
        failure: HandlerFailed | None = None,
        batch: CommitBatch | None = None,
    ) -> None:
        """Mark the entity failed. Its inputs stay in the log, unprocessed, until resumed.

        ``batch`` is what parking itself commits (the failed run's end and its notices)."""
        log.error("entity %s failed: %s", ticket.url, error)
        metrics.PARKED.inc()
        if batch is None:
            batch = CommitBatch()
        events = [(PLAIN, encode_event(failure, limit=RUNTIME_EVENT_MAX_BYTES))] if failure else []
        events += batch.events
        events.append(
            (PLAIN, encode_event(EntityFailed(error=error, attempts=attempts, inputs=input_ids)))
        )
        self.cache.forget(ticket.url)
        ids = await commit(
            self.store,
            ticket,
            CommitBatch(events=events),
            ack=True,
            fields={"status": "failed", "error": error, "attempts": attempts},
        )
        self._done(ticket)
        offset = 1 if failure else 0
        await self.delivery.after_commit(ticket, batch, ids[offset:])

    async def crashed(self, ticket: WakeTicket, exc: Exception) -> None:
        """The runtime itself failed on this entity (a bug, or metadata it cannot read):
        park it with the error in its status, rather than leave it stuck or retry it in
        a loop. An entity parked already is only acknowledged (not parked again)."""
        self.cache.forget(ticket.url)
        meta = await self.store.entity_meta(ticket.url)
        if meta is None or meta.parked:
            await commit(self.store, ticket, ack=True)
            self._done(ticket)
            return
        error = f"the runtime failed on this entity: {describe(exc)}"
        if problems := meta.problems():
            error += f" (corrupted metadata: {'; '.join(problems)})"
        await self.park(ticket.of_incarnation(meta.incarnation), error, [], meta.attempts)
