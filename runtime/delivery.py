"""Delivering an entity's outbox: its effects, to their targets, exactly once.

Effects are committed first (an ``outbox`` event, or a ``timer_fired`` event
when a timer comes due), then delivered here, each with the SEND script on the
target's partition and the effect's idempotency key, and finally recorded as
delivered (``meta.out_done``). A crash anywhere in between leaves the entity's
wake pointer pending, and the next activation calls :meth:`Delivery.pending`,
which delivers again; the keys make the repeats no-ops.

The effects of one outbox go to their targets concurrently (each target's in
order), in a task group: if one target's delivery fails, the others are
cancelled and the whole outbox is retried later, so no delivery outlives the
call that started it.

On one Redis (no replica wait, no tracer), the sends of an outbox a wake just made
go in the round trip of the commit that writes it, right behind it, and the mark
behind them (:meth:`prepare`, then ``Store.commit``'s ``sends`` and ``mark``): each
send runs only if the commit and the sends before it did, so a fenced commit delivers
nothing, and the mark only if every send ran and none was refused; what did not run
is sent as above, and then marked with the refusals. A crash at any point leaves the
same state as a crash in the plain delivery: the outbox either marked delivered, or
not and delivered again later, the keys making repeats no-ops.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import msgspec

from . import metrics, tracing
from .activation import INPUT, OUTBOX, PLAIN, CommitBatch
from .errors import ArgsConflictError, EventDecodeError, FencedError, NotSentError, WakefulError
from .events import (
    RUNTIME_EVENT_MAX_BYTES,
    ActionSettled,
    Created,
    DeliveryFailed,
    Effect,
    Message,
    Outbox,
    Subscribed,
    TimerFired,
    decode_entry,
    encode_event,
    pack,
)
from .store import (
    TRANSIENT_ERRORS,
    ChainedMark,
    EntityGoneError,
    ReadAs,
    SendCall,
    Store,
    TargetMissingError,
)
from .tasks import all_of
from .ticket import WakeTicket, commit
from .tracing import Carrier

log = logging.getLogger("wakeful.delivery")
# Errors after which the outbox stays pending: the next activation delivers it again.
_POSTPONED: tuple[type[BaseException], ...] = (FencedError, EntityGoneError, *TRANSIENT_ERRORS)
# A delivery's outcome that is the sender's to hear (a DeliveryFailed input), or dropped.
_REFUSED: tuple[type[Exception], ...] = (ArgsConflictError, TargetMissingError, WakefulError)
# At most this many sends go in a commit's round trip (a larger fan-out goes after it,
# to its targets concurrently).
CHAINED_SENDS_MAX = 64


class SendRead(Protocol):
    """A send's read of its target partition's new pointers (``listeners.SendRead``):
    made with ``read_as``; once the send returned or raised an error, :meth:`finish`
    hands what it read to the runners; on a crash or a cancel, :meth:`lost` leaves it
    to the lease keeper's sweep."""

    @property
    def read_as(self) -> ReadAs: ...

    async def finish(self) -> None: ...

    def lost(self) -> None: ...


class LocalReads(Protocol):
    """The worker's inbox reading, as a delivery uses it (``listeners.Listeners``): a
    send to a partition held here reads the pointers it adds in its own script, and
    hands them to the runners as the inbox read would."""

    def local_read(self, partition: int) -> SendRead | None: ...


@dataclass(slots=True)
class PreparedSend:
    """An effect's send, made ready before the commit that writes its outbox."""

    effect: Effect
    call: SendCall
    local: SendRead | None  # the send reads its target partition's pointers here


@dataclass(slots=True)
class Chain:
    """An outbox's sends made ready to go in the round trip of the commit that writes
    it (:meth:`Delivery.prepare`), and the mark to go after them (None: no sends)."""

    sends: list[PreparedSend]
    mark: ChainedMark | None = None

    @property
    def calls(self) -> list[SendCall]:
        return [item.call for item in self.sends]


_NO_CHAIN = Chain([])


class Delivery:
    def __init__(self, store: Store, fault: Callable[[str], None], stats: dict[str, int]) -> None:
        self.store = store
        self._fault = fault
        self.stats = stats
        # Set by the worker once its listeners exist (they need the runners, which need
        # the pipeline, which needs this): None, every send leaves its pointer unread.
        self.local: LocalReads | None = None

    def prepare(self, ticket: WakeTicket, batch: CommitBatch, *, ack: bool = False) -> Chain:
        """The sends of ``batch``'s outbox, to go in its commit's round trip, and the
        mark after them, which acknowledges the ticket's pointers if ``ack`` (see the
        module docstring); none where they cannot (a cluster, the replica wait, a
        tracer: each delivery has its own span, an expiry: not a send, a large
        fan-out). Pass them to the commit and then to :meth:`after_commit`, or to
        :meth:`release` if the commit raised."""
        store = self.store
        outbox = batch.outbox
        if (
            outbox is None
            or not outbox.effects
            or not store.chains_sends
            or len(outbox.effects) > CHAINED_SENDS_MAX
            or any(effect.kind == "expire" for effect in outbox.effects)
            or tracing.tracing_on()
        ):
            return _NO_CHAIN
        sender = ticket.url
        prepared: list[PreparedSend] = []
        try:
            for effect in outbox.effects:
                call, local = self._send_call(sender, effect, None)
                prepared.append(PreparedSend(effect, call, local))
        except BaseException:
            for item in prepared:  # nothing was sent: their reads end (swept for nothing)
                if item.local is not None:
                    item.local.lost()
            raise
        return Chain(prepared, ChainedMark(ticket.pointer_ids if ack else []))

    async def release(self, chain: Chain) -> None:
        """The commit the sends went with raised, or what followed it before
        :meth:`after_commit`: what they read is scheduled if their replies came (none,
        if the commit was refused), else left to the lease keeper's sweep."""
        for item in chain.sends:
            if item.local is not None:
                await item.local.finish()

    async def after_commit(
        self,
        ticket: WakeTicket,
        batch: CommitBatch,
        ids: list[str],
        *,
        ack: bool = False,
        chain: Chain = _NO_CHAIN,
    ) -> None:
        """Deliver the outbox a commit just wrote. If this fails, the wake pointer makes
        the next activation (here or on another worker) retry.

        ``ack``: the commit left the ticket's pointers unacknowledged (a wake's final
        commit with an outbox), and the mark acknowledges them. Acknowledged in the
        commit, they would make the commit add a fresh pointer for the undelivered
        outbox, and that pointer a wake that only acknowledges it. Until the mark the
        wake's own pointer stays pending, so a crash before it leaves it to the next
        owner's sweep, which delivers again as after any crash inside a wake. A
        postponed delivery acknowledges them at once, and the commit's rule adds the
        fresh pointer that retries it.

        ``chain``: what :meth:`prepare` made ready and the commit ran. If its mark ran
        (every send went, none refused), the outbox is marked and ``ack`` done."""
        if batch.outbox is None:
            return
        url = ticket.url
        outbox_id = next(
            i for (flag, _), i in zip(batch.events, ids, strict=False) if flag == OUTBOX
        )
        try:
            if chain.sends:
                failures = await self._chained(url, chain.sends)
            else:
                failures = await self.deliver(url, batch.outbox.effects)
            # On the chained path the mark may be in already: a crash here then finds
            # the outbox delivered and marked, which is just as good.
            self._fault("deliver:before-mark")
            if chain.mark is not None and chain.mark.done and not failures:
                self.stats["marks_chained"] += 1  # (it runs only if no send was refused)
                return
            await self._mark(ticket, outbox_id, failures, ack=ack)
        except _POSTPONED as exc:
            log.warning("delivery of %s's outbox %s postponed: %s", url, outbox_id, exc)
            if ack:
                await self._ack_postponed(ticket)

    async def _ack_postponed(self, ticket: WakeTicket) -> None:
        """Acknowledge the wake's pointers after a postponed delivery: the commit adds a
        fresh pointer for the undelivered outbox (fenced: a lost lease leaves the pointer
        to the next owner's sweep)."""
        try:
            await commit(self.store, ticket, ack=True)
        except TRANSIENT_ERRORS:
            # The lease is still held: left pending here, the pointer would never be
            # swept (meta.woke stays set, so no send points again). The runner keeps it
            # and tries the wake again (which delivers the outbox again, then acks).
            raise
        except _POSTPONED as exc:  # fenced or gone: the next owner's claim takes it
            log.warning("acknowledging the wake of %s postponed: %s", ticket.url, exc)

    async def pending(self, ticket: WakeTicket, out_done: str) -> None:
        """Deliver every outbox after ``out_done``, in order (after a crash or a fired timer)."""
        url = ticket.url
        position = out_done
        while True:
            entries = await self.store.read_log(url, position, count=500)
            if not entries:
                return
            for entry_id, fields in entries:
                position = entry_id
                try:
                    event = decode_entry(entry_id, fields, url).event
                except EventDecodeError:
                    continue
                if isinstance(event, Outbox | TimerFired):
                    failures = await self.deliver(url, event.effects)
                    self._fault("deliver:before-mark")
                    await self._mark(ticket, entry_id, failures)

    async def _mark(
        self,
        ticket: WakeTicket,
        outbox_id: str,
        failures: list[DeliveryFailed],
        *,
        ack: bool = False,
    ) -> None:
        """Record the outbox as delivered; failed deliveries become inputs of the sender.
        With ``ack``, the wake's pointers are acknowledged in the same commit."""
        events = [(INPUT, encode_event(f, limit=RUNTIME_EVENT_MAX_BYTES)) for f in failures]
        await commit(
            self.store,
            ticket,
            CommitBatch(events=events),
            ack=ack,
            delivered=outbox_id,
        )

    async def deliver(self, sender: str, effects: list[Effect]) -> list[DeliveryFailed]:
        """Deliver effects: targets concurrently, each target's effects in order."""
        by_target: dict[str, list[Effect]] = {}
        for effect in effects:
            by_target.setdefault(effect.target, []).append(effect)
        failures: list[DeliveryFailed] = []

        async def deliver_to(target_effects: list[Effect]) -> None:
            for effect in target_effects:
                try:
                    await self._one(sender, effect)
                except _POSTPONED:  # a full Redis, too few replicas: delivered again later
                    raise
                except _REFUSED as exc:
                    _refused(sender, effect, exc, failures)

        await all_of([deliver_to(group) for group in by_target.values()])
        self._delivered(effects)
        return failures

    async def _chained(self, sender: str, prepared: list[PreparedSend]) -> list[DeliveryFailed]:
        """The outcomes of the sends that went with the commit; those that did not run
        (the chain broke: a send errored) are delivered now, in order."""
        failures: list[DeliveryFailed] = []
        done = 0  # the sends taken care of, reads included
        try:
            for item in prepared:
                reply = item.call.reply
                if reply is None or isinstance(reply, Exception):
                    break  # it did not run, nor did any after it
                refused = False
                try:
                    self.store.send_result(item.call, reply)
                except NotSentError:
                    break
                except _REFUSED as exc:
                    _refused(sender, item.effect, exc, failures)
                    refused = True
                if item.local is not None and not refused:
                    self.stats["local_reads"] += 1
                    self._fault("deliver:read-here")  # read here, not scheduled yet
                done += 1
                if item.local is not None:
                    await item.local.finish()
                if not refused:
                    self._fault(f"deliver:after-{item.effect.kind}")
        except BaseException:
            for item in prepared[done:]:  # what they may have read waits for the sweep
                if item.local is not None:
                    item.local.lost()
            raise
        self._delivered([item.effect for item in prepared[:done]])
        left = prepared[done:]
        for item in left:
            if item.local is not None:
                await item.local.finish()
        if left:
            failures += await self.deliver(sender, [item.effect for item in left])
        return failures

    def _delivered(self, effects: list[Effect]) -> None:
        self.stats["effects_delivered"] += len(effects)
        for effect in effects:
            metrics.EFFECTS_DELIVERED.labels(effect.kind).inc()

    async def _one(self, sender: str, effect: Effect) -> None:
        with tracing.deliver_span(sender, effect.kind, effect.target, effect.trace) as trace:
            await self._deliver_one(sender, effect, trace)

    async def _deliver_one(self, sender: str, effect: Effect, trace: Carrier | None) -> None:
        """Append ``effect`` to its target; the events it appends carry ``trace``."""
        if effect.kind == "expire":  # a pending action's time is up (if still pending)
            expired = ActionSettled(
                tool_call_id=effect.payload,
                decision="expired",
                error="no answer before the action expired",
                at_ms=int(time.time() * 1000),
            )
            await self.store.settle_action(effect.target, effect.payload, encode_event(expired))
            self._fault("deliver:after-expire")
            return
        call, local = self._send_call(sender, effect, trace)
        try:
            await self.store.send(call)
            if local is not None:
                self._fault("deliver:read-here")
        except Exception:  # refused, or applied with too few replicas: take what it read
            if local is not None:
                await local.finish()
            raise
        except BaseException:  # a crash or a cancel: what it read waits for the sweep
            if local is not None:
                local.lost()
            raise
        if local is not None:
            self.stats["local_reads"] += 1
            await local.finish()
        self._fault(f"deliver:after-{effect.kind}")

    def _send_call(
        self, sender: str, effect: Effect, trace: Carrier | None
    ) -> tuple[SendCall, SendRead | None]:
        """The send that appends ``effect`` (not an expiry) to its target, and the read of
        the target's partition it makes if this worker holds it."""
        target_type = effect.target.split("/")[1]
        created = encode_event(
            Created(type=target_type, parent=None, trace=trace), limit=RUNTIME_EVENT_MAX_BYTES
        )
        events: list[tuple[str, bytes]] = []
        args = b""
        parent = ""
        mode = "existing"
        if effect.kind == "spawn":
            mode, parent, args = "create", sender, pack(effect.args)
            created = encode_event(
                Created(type=target_type, args=effect.args, parent=sender, trace=trace),
                limit=RUNTIME_EVENT_MAX_BYTES,
            )
            if effect.subscribe is not None:
                events.append(
                    (PLAIN, encode_event(Subscribed(subscriber=sender, spec=effect.subscribe)))
                )
        elif effect.kind == "subscribe":
            assert effect.subscribe is not None
            events.append(
                (PLAIN, encode_event(Subscribed(subscriber=sender, spec=effect.subscribe)))
            )
        elif effect.kind == "send":
            mode = "send"
        elif effect.notice is not None:  # notify, cancel
            notice = msgspec.structs.replace(effect.notice, trace=trace)
            events.append((INPUT, encode_event(notice, limit=RUNTIME_EVENT_MAX_BYTES)))
        if effect.has_payload:
            # On behalf of the run that sent it: the target's run (a spawned child's
            # first run) belongs to that identity, and so does a child it creates.
            message = Message(
                payload=effect.payload,
                sender=sender,
                identity=effect.identity,
                idempotency_key=effect.key,
                trace=trace,
            )
            events.append((INPUT, encode_event(message, limit=RUNTIME_EVENT_MAX_BYTES)))
        partition = self.store.keys.partition(effect.target)
        local = self.local.local_read(partition) if self.local is not None else None
        call = self.store.send_call(
            effect.target,
            target_type,
            created=created,
            events=events,
            args=args,
            parent=parent,
            mode=mode,
            idempotency_key=effect.key,
            owner=effect.identity,
            read_as=local.read_as if local is not None else None,
        )
        return call, local


def _refused(sender: str, effect: Effect, exc: Exception, failures: list[DeliveryFailed]) -> None:
    """A send the target refused (other args, no such entity): the sender hears of a
    message, a spawn or a subscription; a notice for an entity that is gone is dropped."""
    if effect.kind in ("spawn", "send", "subscribe"):
        failures.append(DeliveryFailed(kind=effect.kind, target=effect.target, error=str(exc)))
    else:
        log.info("dropped %s from %s to %s: %s", effect.kind, sender, effect.target, exc)
