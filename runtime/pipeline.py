"""The wake pipeline: load -> rebuild -> run the handler -> commit (or park, or delete).

:meth:`WakePipeline.activate` takes a :class:`WakeTicket` for one entity and:

1. **loads** the entity (metadata, snapshot and log tail in one script call; the
   warm cache spares the snapshot and the replay, and what the read of the pointer
   brought along spares the call, when it covers it: ``_from_preload``),
2. delivers an outbox a crash left undelivered,
3. **rebuilds** the state (:func:`wakeful.fold.rebuild`) and collects the inputs
   after the cursor,
4. routes: nothing to do (acknowledge), unreadable (park), a delete request
   (delete), else a **wake**: run the handler on the inputs and **commit** with
   one fenced script that appends the writes, advances the cursor and
   acknowledges the wake pointers; then deliver the outbox.

A worker that lost its lease cannot commit, so a zombie writes nothing.
Failures of the handler go to :class:`~wakeful.failures.Parking`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from . import tracing
from .activation import INPUT, Activation, CommitBatch
from .cache import Cached, WarmCache
from .cancellation import CancelSignal
from .config import Settings
from .context import HandlerContext
from .database import Database
from .delivery import Delivery
from .errors import (
    EventDecodeError,
    FencedError,
    UnknownEntityTypeError,
    UnreadableHistoryError,
    WakeInterrupted,
)
from .events import CancelRequested, DeleteRequested, LogRecord, Message, MessageHeld, unpack
from .failures import Parking, first_unit
from .fold import Rebuilt, check_skipped, initial_state, rebuild
from .live import LivePublisher
from .registry import EntityType, Registry
from .retention import Retention
from .run_owner import split_inputs
from .scope import CURRENT_TOOL_CALL
from .services import HandlerServices
from .state import EntityState
from .store import TRANSIENT_ERRORS, EntityMeta, Loaded, Preloaded, Store
from .streamids import ZERO, id_gt, max_id
from .ticket import WakeTicket, commit
from .urls import parse_url
from .wake import WakeInfo

log = logging.getLogger("wakeful.pipeline")
# Errors that end the wake without a trace in the log: the runner retries or gives up.
_UNCOMMITTED: tuple[type[BaseException], ...] = (FencedError, *TRANSIENT_ERRORS)


@dataclass(slots=True)
class Wake:
    """One handler run: the folded state, the inputs it handles, where the fold stopped.

    ``remember=False`` when the state was folded past inputs this wake leaves for
    the next one: it must not be cached."""

    ticket: WakeTicket
    entity_type: EntityType
    meta: EntityMeta
    state: EntityState
    inputs: list[LogRecord]
    pos: str  # the last log entry folded into ``state``
    since: int  # entries folded since the last snapshot
    remember: bool = True


class WakePipeline:
    def __init__(
        self,
        *,
        registry: Registry,
        store: Store,
        settings: Settings,
        services: HandlerServices,
        delivery: Delivery,
        cache: WarmCache,
        stats: dict[str, int],
        fault: Callable[[str], None],
        done: Callable[[WakeTicket], None],
        retention: Retention,
    ) -> None:
        self.registry = registry
        self.store = store
        self.settings = settings
        self.services = services
        self.delivery = delivery
        self.cache = cache
        self.stats = stats
        self._fault = fault
        self._done = done  # the ticket's pointers are acknowledged (or given up)
        self.parking = Parking(store, settings, delivery, cache, done)
        self.retention = retention

    # -- load, rebuild, route --------------------------------------------------

    async def activate(self, ticket: WakeTicket) -> None:
        self.stats["activations"] += 1
        loaded, cached = await self._load(ticket)
        meta = loaded.info
        if meta is None:  # deleted entity: nothing to wake, just acknowledge the pointers
            await commit(self.store, ticket, ack=True)
            self._done(ticket)
            return
        ticket = ticket.of_incarnation(meta.incarnation)
        if meta.corrupt:  # a field it cannot read: the runner parks it, naming the field
            raise ValueError(f"corrupted metadata of {ticket.url}: {meta.corrupt}")
        try:
            entity_type = self.registry.get(meta.type)
        except UnknownEntityTypeError as exc:
            error = str(exc)
            if await self.store.type_published(meta.type):
                error += (
                    f"; another worker of this keyspace runs {meta.type!r}, the worker that "
                    "owns this entity's partition does not: every worker on a keyspace must "
                    "run the same app"
                )
            await self.parking.park(ticket, error, [], meta.attempts)
            return
        if meta.undelivered:
            await self.delivery.pending(ticket, meta.out_done)
        parked = meta.parked
        try:
            folded = self._fold(ticket.url, entity_type, cached, loaded, meta)
        except UnreadableHistoryError as exc:  # the state is unknown: park (once)
            self.cache.forget(ticket.url)
            if parked:
                await commit(self.store, ticket, ack=True)
                self._done(ticket)
            else:
                await self.parking.park(ticket, str(exc), exc.stream_ids, 0)
            return
        pos = folded.records[-1].id if folded.records else (cached.pos if cached else ZERO)
        since = (cached.since_snapshot if cached else 0) + len(loaded.entries)
        wake = Wake(ticket, entity_type, meta, folded.state, folded.inputs, pos, since)
        if parked or not (folded.inputs or folded.undecodable):
            await self._nothing_to_do(wake, parked)
        elif folded.undecodable:
            await self._up_to_undecodable(wake, folded.undecodable)
        elif any(isinstance(r.event, DeleteRequested) for r in wake.inputs):
            await self._delete(wake)
        else:
            with tracing.wake_span(ticket.url, wake.inputs, meta.attempts):
                await self._run(wake)

    async def _load(self, ticket: WakeTicket) -> tuple[Loaded, Cached | None]:
        """The entity's metadata and log after the warm state (all of it if not warm):
        from what the pointer's read brought along if that covers it, else one LOAD."""
        url = ticket.url
        cached = self.cache.get(url)
        loaded = _from_preload(ticket.preload, cached) if ticket.preload else None
        if loaded is not None:
            self.stats["loads_skipped"] += 1
            self._fault("wake:preloaded")
        else:
            loaded = await self.store.load(url, cached.pos if cached else None)
        if (
            cached is not None
            and loaded.info is not None
            and cached.created != loaded.info.incarnation
        ):
            self.cache.forget(url)  # deleted and re-created: the warm state is another's
            return await self.store.load(url, None), None
        trimmed = loaded.meta.get("trimmed")
        if cached is not None and trimmed is not None and id_gt(trimmed.decode(), cached.pos):
            # Another owner wrote a snapshot meanwhile and trimmed the log behind it: the
            # entries after the warm state are gone, so start from that snapshot instead.
            self.cache.forget(url)
            return await self.store.load(url, None), None
        return loaded, cached

    def _fold(
        self,
        url: str,
        entity_type: EntityType,
        cached: Cached | None,
        loaded: Loaded,
        meta: EntityMeta,
    ) -> Rebuilt:
        """Fold the loaded log tail into the state; collect the inputs after the cursor."""
        if cached is not None:
            state = cached.state
        else:
            state = initial_state(
                entity_type.state, loaded.snapshot, meta.snapshot_out, loaded.chunks, url
            )
        folded = rebuild(url, state, loaded.entries, meta.cursor)
        check_skipped(folded.handled_undecodable, folded.records)
        return folded

    async def _nothing_to_do(self, wake: Wake, parked: bool) -> None:
        """Parked, or every input was already handled by an earlier wake: acknowledge."""
        ticket = wake.ticket
        if parked:
            # Not cached: the warm position would pass the unhandled inputs, and the
            # wake after a resume must read them again.
            self.cache.forget(ticket.url)
        else:
            self.cache.remember(ticket.url, wake.state, wake.pos, ticket.created, wake.since)
        await commit(self.store, ticket, ack=True)
        self._done(ticket)

    async def _up_to_undecodable(self, wake: Wake, undecodable: list[EventDecodeError]) -> None:
        """Handle the inputs before the unreadable entry first (the next wake parks on it),
        so that skipping it later skips nothing else; or park now if there are none."""
        first_bad = undecodable[0].stream_id
        readable = [r for r in wake.inputs if id_gt(first_bad, r.id)]
        if readable and not any(isinstance(r.event, DeleteRequested) for r in readable):
            wake.inputs, wake.remember = readable, False  # folded past them: not cached
            await self._run(wake)
            return
        error = "; ".join(str(e) for e in undecodable)
        await self.parking.park(wake.ticket, error, [e.stream_id for e in undecodable], 0)

    # -- the handler -----------------------------------------------------------

    async def _run(self, wake: Wake) -> None:
        """Run the handler on ``wake.inputs`` and commit."""
        attempts = wake.meta.attempts
        if attempts and len(first_unit(wake.inputs)) < len(wake.inputs):
            # A retry after a failure takes one input: the one that fails is isolated,
            # and only it is parked with (and dead-lettered by ``resume --skip-failed``).
            wake.inputs, wake.remember = first_unit(wake.inputs), False
        # A run belongs to the identity that started it: messages of another identity
        # wait for it to finish (held), and one wake's messages share one identity.
        split = split_inputs(wake.state.system, wake.inputs, wake.meta.owner)
        if split.held:
            await self._hold(wake, split.held)
            return
        if len(split.taken) < len(wake.inputs):
            wake.inputs, wake.remember = split.taken, False  # folded past the rest
        ticket, meta, state, inputs = wake.ticket, wake.meta, wake.state, wake.inputs
        system = state.system
        open_run, open_identity, held = system.run, system.run_identity, dict(system.held)
        act = self._activation(ticket, state, wake.entity_type, inputs, split.identity)
        cancel = next(
            (r.event for r in reversed(inputs) if isinstance(r.event, CancelRequested)), None
        )
        if cancel is not None:
            act.cancel_effects(cancel.reason)
        # A commit point inside the wake leaves the cursor where it is: mark the inputs
        # as partly handled ("<first> <last>": the last input any attempt that got past
        # a commit point had), so that a retried wake knows which of its inputs earlier
        # attempts had (ctx.wake.resumed_upto). Inputs are handled in log order and the
        # cursor only moves forward, so every input after the cursor up to <last> was
        # had by some attempt, whichever attempt it was.
        partial = meta.partial
        resumed_upto = _attempted_upto(partial, inputs[0].id)
        flush = _Flush(self, ticket, act, resumed_upto)
        live = LivePublisher(self.store.append_live, ticket.url)
        ctx = self._context(wake, act, flush, live, resumed_upto, ticket.cancels.arm())
        self.stats["handler_calls"] += 1
        try:
            with tracing.handler_span(ticket.url, meta.type):
                await wake.entity_type.handler(ctx)
            batch = act.take_commit()
        except _UNCOMMITTED:
            self.cache.forget(ticket.url)
            raise
        except WakeInterrupted as exc:  # lease lost or shutting down: resume elsewhere
            log.info("wake of %s interrupted: %s", ticket.url, exc)
            self.cache.forget(ticket.url)
            self._done(ticket)
            return
        except Exception as exc:
            self.cache.forget(ticket.url)  # the state holds writes that never committed
            system.run, system.run_identity, system.held = open_run, open_identity, held
            await self.parking.handler_failed(ticket, inputs, attempts, exc, act)
            return
        except BaseExceptionGroup as group:  # a handler's own task group was interrupted
            if group.subgroup(WakeInterrupted) is None:
                raise
            log.info("wake of %s interrupted: %s", ticket.url, group)
            self.cache.forget(ticket.url)
            self._done(ticket)
            return
        finally:
            await live.aclose()
        # The mark goes once the cursor passes every input it covers (a retry that
        # handles fewer inputs than an earlier attempt had leaves it for the next wake).
        marked = flush.last if flush.flushed else resumed_upto
        covered = marked is None or not id_gt(marked, max_id([r.id for r in wake.inputs]))
        await self._commit(
            wake, batch, handled_partial=(bool(partial) or flush.flushed) and covered
        )

    async def _hold(self, wake: Wake, held: list[LogRecord]) -> None:
        """Messages of another identity than the open run's: journal them as held and
        move the cursor past them, in one commit (the run releases them when it
        finishes); the handler does not run."""
        act = self._activation(wake.ticket, wake.state, wake.entity_type, held)
        for record in held:
            assert isinstance(record.event, Message)
            act.record(MessageHeld(input_id=record.id, message=record.event))
        # Not cached if the state was folded past inputs after them.
        wake.remember = wake.remember and len(held) == len(wake.inputs)
        wake.inputs = held
        resumed_upto = _attempted_upto(wake.meta.partial, held[0].id)
        covered = resumed_upto is None or not id_gt(resumed_upto, held[-1].id)
        await self._commit(
            wake, act.take_commit(), handled_partial=bool(wake.meta.partial) and covered
        )

    def _context(
        self,
        wake: Wake,
        act: Activation,
        flush: _Flush,
        live: LivePublisher,
        resumed_upto: str | None,
        signal: CancelSignal,
    ) -> HandlerContext:
        parsed = parse_url(wake.ticket.url)
        raw_args = wake.meta.args
        return HandlerContext(
            entity_url=wake.ticket.url,
            entity_type=parsed.type,
            entity_id=parsed.id,
            args=wake.entity_type.typed_args(unpack(raw_args) if raw_args else None),
            wake=WakeInfo(wake.inputs, resumed_upto=resumed_upto, on_input=act.handling),
            first_wake=wake.meta.cursor == ZERO,
            db=act.db,
            signal=signal,
            flush=flush,
            activation=act,
            services=self.services,
            live=live,
        )

    async def _commit(self, wake: Wake, batch: CommitBatch, *, handled_partial: bool) -> None:
        """The wake's final commit: its writes, the cursor past its inputs, the acks."""
        ticket, state = wake.ticket, wake.state
        since = wake.since + len(batch.events)
        snapshot = None
        # A wake that leaves inputs it read for the next one (wake.remember is False)
        # writes no snapshot: it would cover them, and a cold load would never see them.
        if since >= self.settings.snapshot_every and wake.remember:
            snapshot = state.snapshot_write()
            state.nbytes = snapshot.nbytes
            since = 0
        fields: dict[str, object] = {}
        if wake.meta.attempts:
            fields["attempts"] = 0
        if handled_partial:
            fields["partial"] = ""  # these inputs are handled now
        self._fault("wake:before-commit")
        if snapshot is not None:
            self._fault("snapshot:before-commit")  # with its conversation chunks
        awaited = state.system.awaited_children()
        if awaited != wake.meta.awaited_children:
            fields["waiting"] = awaited
        # With an outbox the pointers are acknowledged by the delivery's mark, not here:
        # no fresh pointer, and no wake that would only acknowledge it (see after_commit).
        deferred = batch.outbox is not None
        chain = self.delivery.prepare(ticket, batch, ack=deferred)
        handed = False  # the sends' reads are after_commit's to end from then on
        try:
            ids = await commit(
                self.store,
                ticket,
                batch,
                ack=not deferred,
                cursor=max_id([r.id for r in wake.inputs]),
                fields=fields,
                snapshot=snapshot,
                snapshot_seen=wake.pos,
                snapshot_out=state.applied,
                sends=chain.calls,
                mark=chain.mark,
            )
            if snapshot is not None:
                state.written(snapshot)  # its chunks are in Redis now
                self._fault("snapshot:after-commit")
            _note_applied(state, batch.events, ids)
            self._fault("wake:after-commit")
            if wake.remember:
                self.cache.remember(ticket.url, state, wake.pos, ticket.created, since)
            else:
                self.cache.forget(ticket.url)
            if not deferred:
                self._done(ticket)
            handed = True
            try:
                await self.delivery.after_commit(ticket, batch, ids, ack=deferred, chain=chain)
            finally:
                if deferred:
                    self._done(ticket)
        finally:
            if not handed:
                await self.delivery.release(chain)
        if snapshot is not None:  # the log before it may go now (what no guarantee needs)
            await self.retention.after_snapshot(ticket)

    # -- deletion --------------------------------------------------------------

    async def _delete(self, wake: Wake) -> None:
        """Finish the open run as cancelled, cancel children per policy, then delete."""
        ticket = wake.ticket
        act = self._activation(ticket, wake.state, wake.entity_type, wake.inputs)
        act.cancel_effects("entity deleted")
        batch = act.take_commit()
        if batch:
            ids = await commit(self.store, ticket, CommitBatch(events=batch.events))
            if batch.outbox is not None:
                # The notices must land before the log goes.
                await self.delivery.deliver(ticket.url, batch.outbox.effects)
                await commit(self.store, ticket, fields={"out_done": ids[-1]})
        self.cache.forget(ticket.url)
        await self.services.release_capabilities(ticket.url)
        # Its recurring schedules first: a crash after this only leaves the delete to redo.
        await self.store.purge_schedules(ticket.url, ticket.token)
        await self.store.delete(ticket.url, ticket.token, ticket.created, ticket.pointer_ids)
        self._done(ticket)
        log.info("entity %s deleted", ticket.url)

    def _activation(
        self,
        ticket: WakeTicket,
        state: EntityState,
        entity_type: EntityType,
        inputs: list[LogRecord],
        identity: dict[str, str] | None = None,
    ) -> Activation:
        return Activation(
            url=ticket.url,
            created=ticket.created,
            state=state,
            db=Database(state, entity_type.state),
            inputs=inputs,
            max_event_bytes=self.settings.max_event_bytes,
            identity=identity,
        )


class _Flush:
    """``ctx.flush()``: a commit point inside the wake (the cursor stays where it is)."""

    def __init__(
        self, pipeline: WakePipeline, ticket: WakeTicket, act: Activation, resumed: str | None
    ) -> None:
        self._pipeline = pipeline
        self._ticket = ticket
        self._act = act
        self._resumed = resumed  # the mark of earlier attempts (see WakePipeline._run)
        self.last = resumed
        self.flushed = False

    async def __call__(self) -> None:
        act = self._act
        batch = act.take_commit(CURRENT_TOOL_CALL.get())
        if not batch:
            return
        pipeline, ticket = self._pipeline, self._ticket
        self.flushed = True
        # This attempt had its inputs up to the last one the handler asked
        # ``ctx.wake.attempted`` about (it is on that one now: a per-input flush does
        # not claim the inputs after it), or all of them if it never asked.
        had = act.asked or act.inputs[-1].id
        self.last = max_id([self._resumed or ZERO, had])
        partial = f"{act.wake_id} {self.last}"
        pipeline._fault("flush:before-commit")
        chain = pipeline.delivery.prepare(ticket, batch)
        handed = False  # as in WakePipeline._commit
        try:
            ids = await commit(
                pipeline.store,
                ticket,
                batch,
                fields={"partial": partial},
                sends=chain.calls,
                mark=chain.mark,
            )
            _note_applied(self._act.state, batch.events, ids)
            pipeline._fault("flush:after-commit")
            handed = True
            await pipeline.delivery.after_commit(ticket, batch, ids, chain=chain)
        finally:
            if not handed:
                await pipeline.delivery.release(chain)


def _from_preload(preload: Preloaded, cached: Cached | None) -> Loaded | None:
    """What a LOAD would read, from the metadata and log tail the inbox read brought
    along (the same atomic read, made a little earlier: see ``Runners.schedule``), or
    None if they do not cover it. They hold the log after the cursor: a warm state
    needs the log after its position, so the cursor must not be past it (another owner
    handled inputs this worker never read); a cold one needs the whole log, so no
    snapshot and no cursor yet (a new entity). A truncated tail is never enough."""
    loaded = preload.loaded
    meta = loaded.info
    if meta is None:  # gone: a load would say so too
        return loaded
    if preload.truncated:
        return None
    if cached is None:
        if meta.cursor != ZERO or "snap_upto" in loaded.meta:
            return None
        return loaded
    if id_gt(meta.cursor, cached.pos):
        return None
    entries = [entry for entry in loaded.entries if id_gt(entry[0], cached.pos)]
    return Loaded(loaded.meta, meta, None, entries)


def _attempted_upto(partial: str, first_input: str) -> str | None:
    """The last input an earlier attempt that got past a commit point had, if it is
    one of this wake's (at or after ``first_input``); None for no mark or a stale one."""
    last = partial.rpartition(" ")[2]
    if not last or id_gt(first_input, last):
        return None
    return last


def _note_applied(state: EntityState, events: list[tuple[str, bytes]], ids: list[str]) -> None:
    """After a commit: its outputs were applied before they were written."""
    for (flag, data), event_id in zip(events, ids, strict=True):
        if flag != INPUT:  # an input is counted when it is read back and folded
            state.applied = event_id
            state.nbytes += len(data)
