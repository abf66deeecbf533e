"""Why a handler runs (:class:`WakeInfo`, ``ctx.wake``) and what wakes it next
(:class:`Wake`, the subscription specs of ``ctx.spawn`` and ``ctx.observe``).

Both sit below the handler context so that the runtime's own tools and the agent
loop can use them without importing the context.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from .events import (
    CancelRequested,
    Changed,
    ChildRunFinished,
    Created,
    DeliveryFailed,
    Event,
    LogRecord,
    Message,
    Subscription,
)
from .streamids import id_gt

EventT = TypeVar("EventT", bound=Event)


class Wake:
    """Subscription specs for ``ctx.spawn(wake=...)`` and ``ctx.observe(wake=...)``."""

    @staticmethod
    def run_finished(include_response: bool = True) -> Subscription:
        """Wake me each time a run of that entity finishes (with its response)."""
        return Subscription(kind="run_finished", include_response=include_response)

    @staticmethod
    def change(collections: list[str] | None = None, debounce: float = 0.0) -> Subscription:
        """Wake me when those collections change; with ``debounce`` (seconds), once per burst."""
        if debounce < 0:
            raise ValueError(f"debounce must be >= 0 seconds, got {debounce}")
        return Subscription(
            kind="change",
            collections=list(collections) if collections is not None else None,
            debounce_ms=int(debounce * 1000),
        )


@dataclass(frozen=True)
class WakeInfo:
    """Why the handler runs: the input events after the entity's cursor, in log order.

    A retried wake can follow an attempt that got past a commit point
    (``ctx.flush()``, an agent step) before it crashed or failed: what that
    attempt wrote up to there is durable and is in ``ctx.db`` now, and the
    handler runs again from the top. ``resumed_upto`` is then the last input
    that attempt had (inputs after it arrived since), and ``attempted(record)``
    tells whether an input was among them: work done for such an input before a
    commit point must be safe to redo, or be skipped (the agent loop resumes
    from its journal this way).
    """

    events: list[LogRecord]
    resumed_upto: str | None = None
    # Told the input the handler is on (``attempted`` is asked per input): effect keys
    # are counted per input, so skipping one cannot shift the keys of the next.
    on_input: Callable[[str], None] | None = field(default=None, repr=False, compare=False)

    @property
    def resumed(self) -> bool:
        """An earlier attempt at (some of) these inputs got past a commit point."""
        return self.resumed_upto is not None

    def attempted(self, record: LogRecord | str) -> bool:
        """Whether an earlier attempt that got past a commit point had this input.

        Asking also tells the runtime that the handler is now on this input: the
        sends, spawns and derived ids it makes until it asks about the next one get
        idempotency keys counted for this input, so they are the same whether or not
        an attempt skipped the inputs before it."""
        record_id = record if isinstance(record, str) else record.id
        if self.on_input is not None:
            self.on_input(record_id)
        if self.resumed_upto is None:
            return False
        return not id_gt(record_id, self.resumed_upto)

    @property
    def id(self) -> str:
        """The wake's identity: the id of its first input (stable when the wake is retried)."""
        return self.events[0].id if self.events else "0-0"

    @property
    def messages(self) -> list[Message]:
        return self.of_type(Message)

    @property
    def created(self) -> Created | None:
        found = self.of_type(Created)
        return found[0] if found else None

    @property
    def runs_finished(self) -> list[ChildRunFinished]:
        """Finished runs of entities this one waits on (``Wake.run_finished``)."""
        return self.of_type(ChildRunFinished)

    @property
    def changes(self) -> list[Changed]:
        return self.of_type(Changed)

    @property
    def cancelled(self) -> CancelRequested | None:
        found = self.of_type(CancelRequested)
        return found[-1] if found else None

    @property
    def delivery_failures(self) -> list[DeliveryFailed]:
        return self.of_type(DeliveryFailed)

    @property
    def kinds(self) -> list[str]:
        return [str(type(r.event).__struct_config__.tag) for r in self.events]

    def of_type(self, kind: type[EventT]) -> list[EventT]:
        """The input events of one kind (a struct of :mod:`wakeful.events`), in log order."""
        return [r.event for r in self.events if isinstance(r.event, kind)]
