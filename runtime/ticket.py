"""The wake ticket: what one activation of one entity carries through the engine.

An activation starts from the wake pointers the runner collected; once the
entity is loaded its incarnation is known and the :class:`WakeTicket` is
complete. Every step after (rebuild, handler, commit, delivery, parking,
deletion) takes the ticket instead of a list of loose parameters, and every
commit goes through :func:`commit`, which turns a :class:`CommitBatch` into the
one fenced COMMIT script call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import metrics
from .activation import CommitBatch
from .cancellation import CancelSignal
from .state import SnapshotWrite
from .store import ChainedMark, Preloaded, SendCall, Store

_NOTHING = CommitBatch()


@dataclass(slots=True)
class CancelSlot:
    """Where cancel requests for an entity's runner land: the signal of its current wake.

    The pipeline arms a fresh signal right before the handler runs, so a request
    that came earlier (during the load, or for the previous wake) does not stop
    it; a client's cancel that raced with the load is an input of this wake.
    ``lease_valid`` (set by the runner) is the armed signal's lease check."""

    signal: CancelSignal = field(default_factory=CancelSignal)
    lease_valid: Callable[[], bool] | None = None

    def arm(self) -> CancelSignal:
        self.signal = CancelSignal(self.lease_valid)
        return self.signal


@dataclass(frozen=True, slots=True)
class WakeTicket:
    """One activation: the entity, the lease it runs under, the pointers it answers.

    ``cancels`` is the runner's cancel slot (a client cancels, the lease is lost,
    the worker stops). ``created`` is the entity's incarnation ("" when the entity is gone): a
    commit made for another incarnation is refused as gone. ``pointer_ids`` are
    the ids of the wake pointers (in the partition inbox) the activation
    acknowledges once it commits. ``preload`` is what the read of its pointer brought
    along, when it is still as fresh as a load would be (see ``Runners.schedule``).
    """

    url: str
    partition: int
    token: str
    pointer_ids: list[str]
    cancels: CancelSlot
    created: str = ""
    preload: Preloaded | None = None

    def of_incarnation(self, created: str) -> WakeTicket:
        """This ticket, once the load told which incarnation of the entity it wakes."""
        return WakeTicket(
            self.url, self.partition, self.token, self.pointer_ids, self.cancels, created
        )


async def commit(
    store: Store,
    ticket: WakeTicket,
    batch: CommitBatch = _NOTHING,
    *,
    ack: bool = False,
    cursor: str = "",
    fields: dict[str, Any] | None = None,
    snapshot: SnapshotWrite | None = None,
    snapshot_seen: str = "",
    snapshot_out: str = "",
    sends: Sequence[SendCall] = (),
    mark: ChainedMark | None = None,
    delivered: str = "",
) -> list[str]:
    """Commit ``batch`` (events, timers, actions) for ``ticket``, fenced by its lease.

    ``ack`` acknowledges the ticket's wake pointers; ``cursor`` moves the cursor
    past the inputs handled; ``fields`` set metadata; ``snapshot`` writes a snapshot
    with the conversation chunks it seals (and drops those it no longer references);
    ``sends``, and then ``mark``, go in the same round trip (``Store.commit``);
    ``delivered`` is the outbox a delivery's mark records.
    Returns the ids of the appended events, in order."""
    with metrics.commit():
        return await store.commit(
            ticket.url,
            ticket.token,
            events=batch.events,
            cursor=cursor,
            acks=ticket.pointer_ids if ack else [],
            fields=fields,
            created=ticket.created,
            snapshot=snapshot.data if snapshot is not None else b"",
            chunks=snapshot.chunks if snapshot is not None else (),
            drop_chunks=snapshot.drop if snapshot is not None else (),
            snapshot_seen=snapshot_seen,
            sends=sends,
            mark=mark,
            delivered=delivered,
            snapshot_out=snapshot_out,
            timers=[(t.member, t.due_ms, t.data) for t in batch.timers],
            actions=batch.actions,
            closed_actions=batch.closed_actions,
        )
