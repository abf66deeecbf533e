"""The worker: owns partitions through fenced leases and wakes entity handlers.

One worker process runs three kinds of task:

* the **lease loop** heartbeats the worker into ``<prefix>:workers``, computes
  which partitions it should own (rendezvous hashing over the live workers),
  renews, acquires and hands back leases, and sweeps each owned inbox for wake
  pointers that a crashed or fenced owner read but never acknowledged;
* the **read loop** blocks on XREADGROUP over the owned inboxes and hands each
  wake pointer to the entity's runner;
* one **runner** per busy entity runs its activations one at a time (single
  writer), at most ``max_concurrency`` activations at once worker-wide.

An activation (:meth:`Worker._activate`) loads the entity (warm cache or
snapshot + log tail, one script call), runs the handler on the inputs after the
cursor, and commits with one fenced script that appends the writes, advances the
cursor and acknowledges the wake pointers. A worker that lost its lease cannot
commit, so a zombie writes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
import traceback
import zlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
from redis.exceptions import ResponseError

from .activation import INPUT, PLAIN, Activation, CommitBatch
from .agent import WakeInterrupted
from .config import Settings
from .context import CancelSignal, HandlerContext, WakeInfo
from .contracts import Capability, CapabilityPool
from .delivery import Delivery
from .errors import (
    EntityNotFoundError,
    EventDecodeError,
    FencedError,
    UnknownEntityTypeError,
    UnreadableHistoryError,
)
from .events import (
    CancelRequested,
    DeleteRequested,
    EntityFailed,
    Event,
    HandlerFailed,
    LogRecord,
    Resumed,
    decode_entry,
    decode_event,
    encode_event,
    unpack,
)
from .live import LivePublisher
from .registry import EntityType, Registry
from .scope import CURRENT_TOOL_CALL
from .state import Database, EntityState
from .status import EntityStatus, Schedule, status_from_meta
from .store import TRANSIENT_ERRORS, EntityGoneError, Loaded, Pointer, Store
from .streamids import ZERO, id_gt, max_id
from .urls import parse_url

log = logging.getLogger("wakeful.worker")
_TRANSIENT = TRANSIENT_ERRORS


async def _wait(awaitable: Awaitable[object], timeout: float) -> None:
    """Await ``awaitable`` for at most ``timeout`` seconds.

    Not ``asyncio.wait_for``: on Python 3.11 it swallows a cancellation that
    arrives just as the awaitable completes. ``stop()`` sets the very event the
    read loop waits on right before cancelling that loop, so shutdown hung.
    """
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout):
            await awaitable


def new_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"


def rendezvous_owner(partition: int, workers: list[str]) -> str | None:
    """The worker that should own ``partition``: stable, and moves few partitions on change."""
    if not workers:
        return None
    return max(workers, key=lambda w: zlib.crc32(f"{w}/{partition}".encode()))


@dataclass
class Lease:
    token: str
    valid_until: float  # time.monotonic(); conservative: measured from before the renew call
    draining: bool = False

    def valid(self) -> bool:
        return time.monotonic() < self.valid_until


@dataclass
class Runner:
    """Runs the activations of one entity, one at a time."""

    url: str
    partition: int
    entries: list[str] = field(default_factory=list)
    task: asyncio.Task[None] | None = None
    signal: CancelSignal = field(default_factory=CancelSignal)


@dataclass
class Cached:
    """Warm state of an entity: valid for incarnation ``created``, folded up to ``pos``."""

    state: EntityState
    pos: str
    created: str
    since_snapshot: int


class _Retry(Exception):
    def __init__(self, delay: float) -> None:
        self.delay = delay


class Worker:
    def __init__(
        self,
        registry: Registry,
        store: Store,
        settings: Settings,
        *,
        worker_id: str | None = None,
        capabilities: list[Capability[Any]] | None = None,
    ) -> None:
        self.registry = registry
        self.capabilities = {c.name: c for c in capabilities or []}
        self._pools: dict[str, CapabilityPool] = {}
        self.store = store
        self.settings = settings
        self.id = worker_id or new_worker_id()
        self.leases: dict[int, Lease] = {}
        self._runners: dict[str, Runner] = {}
        self._tracked: dict[int, set[str]] = {}
        self._cache: OrderedDict[str, Cached] = OrderedDict()
        self._slots = asyncio.Semaphore(settings.max_concurrency)
        self._tasks: list[asyncio.Task[None]] = []
        self._stopping = asyncio.Event()
        self._leases_changed = asyncio.Event()
        self._room = asyncio.Event()
        self._last_sweep = 0.0
        self.ready = asyncio.Event()
        # Tests inject crashes here: called with the name of each commit point.
        self.fault_hook: Callable[[str], None] | None = None
        self._killed = False
        self.stats = {
            "activations": 0,
            "handler_calls": 0,
            "commits_fenced": 0,
            "effects_delivered": 0,
        }
        self.delivery = Delivery(store, self._fault, self.stats)

    # -- lifecycle -------------------------------------------------------------

    def _fault(self, point: str) -> None:
        if self.fault_hook is not None:
            self.fault_hook(point)

    def kill(self) -> None:
        """Die like ``kill -9`` would: stop every task now, release nothing (for tests)."""
        self._killed = True
        for runner in self._runners.values():
            if runner.task is not None:
                runner.task.cancel()
        for task in self._tasks:
            task.cancel()
        self._stopping.set()

    def stop(self) -> None:
        """Ask for a graceful shutdown; :meth:`run` returns once it is done."""
        self._stopping.set()
        self._leases_changed.set()

    async def run(self) -> None:
        await self.store.setup()
        await self.store.redis.hset(
            self.store.keys.types,
            mapping={t.name: msgspec.json.encode(t.manifest()) for t in self.registry},
        )
        log.info("worker %s starting", self.id)
        lease_task = asyncio.create_task(self._lease_loop(), name="wakeful-leases")
        read_task = asyncio.create_task(self._read_loop(), name="wakeful-read")
        timer_task = asyncio.create_task(self._timer_loop(), name="wakeful-timers")
        cancel_task = asyncio.create_task(self._cancel_loop(), name="wakeful-cancels")
        self._tasks = [lease_task, read_task, timer_task, cancel_task]
        try:
            await self._stopping.wait()
        finally:
            for task in (read_task, timer_task, cancel_task):
                await self._reap(task)
            if not self._killed:
                await self._drain(self.settings.shutdown_grace_s)
            await self._reap(lease_task)
            if not self._killed:
                await self._release_all()
            for url in list(self._pools):
                await self._release_capabilities(url)
            log.info("worker %s stopped", self.id)

    async def _reap(self, task: asyncio.Task[None]) -> None:
        # Cancel until it ends: on Python 3.11 a cancellation can be swallowed by an
        # asyncio.wait_for inside redis-py (it sends with one when socket_timeout is
        # set), and a loop that survives its single cancel would hang the shutdown.
        while not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=0.1)
        try:
            await task
        except asyncio.CancelledError:
            pass
        except BaseException:
            if not self._killed:  # after kill() whatever the task died of is expected
                raise

    async def _drain(self, grace: float) -> None:
        """Let running activations finish; after ``grace`` seconds, cancel them."""
        tasks = [r.task for r in self._runners.values() if r.task]
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=grace)
        for runner in list(self._runners.values()):
            runner.signal.cancel("worker shutting down", kind="shutdown")
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=5)

    async def _release_all(self) -> None:
        with contextlib.suppress(*_TRANSIENT):
            for partition, lease in list(self.leases.items()):
                await self.store.release(partition, lease.token)
            await self.store.heartbeat(self.id, None)
        self.leases.clear()

    # -- leases ----------------------------------------------------------------

    async def _lease_loop(self) -> None:
        interval = self.settings.heartbeat_ms / 1000
        while True:
            try:
                await self._lease_tick()
                self.ready.set()
            except _TRANSIENT as exc:
                log.warning("worker %s: lease tick failed: %s", self.id, exc)
                self._expire_invalid_leases()
            except Exception:  # never let the lease loop die: the worker would stall silently
                log.exception("worker %s: lease tick failed", self.id)
                self._expire_invalid_leases()
            await asyncio.sleep(interval)

    async def _lease_tick(self) -> None:
        s = self.settings
        live = await self.store.heartbeat(self.id, s.lease_ttl_ms * 2)
        if self.id not in live:
            live.append(self.id)
        desired = {p for p in range(s.partitions) if rendezvous_owner(p, live) == self.id}
        changed = False

        for partition, lease in list(self.leases.items()):
            started = time.monotonic()
            if await self.store.renew(partition, lease.token, s.lease_ttl_ms):
                lease.valid_until = started + s.lease_ttl_ms / 1000
            else:
                self._lose(partition, "lease lost")
                changed = True

        for partition in sorted(desired - self.leases.keys()):
            started = time.monotonic()
            token = await self.store.acquire(partition, self.id, s.lease_ttl_ms)
            if token is None:
                continue  # still held by its previous owner; it hands it over when it sees us
            self.leases[partition] = Lease(token, started + s.lease_ttl_ms / 1000)
            self._tracked.setdefault(partition, set())
            await self.store.ensure_group(partition)
            for pointer in await self.store.claim_pending(partition, self.id, 0):
                self._schedule(pointer)
            log.info("worker %s acquired partition %d (%s)", self.id, partition, token)
            changed = True

        for partition, lease in list(self.leases.items()):
            if partition not in desired and not lease.draining:
                lease.draining = True  # stop reading; released once its runners are done
                changed = True
            if lease.draining and not self._busy(partition):
                await self.store.release(partition, lease.token)
                self.leases.pop(partition, None)
                self._tracked.pop(partition, None)
                log.info("worker %s handed over partition %d", self.id, partition)

        now = time.monotonic()
        if now - self._last_sweep >= s.lease_ttl_ms / 1000:
            self._last_sweep = now
            for partition, lease in list(self.leases.items()):
                if lease.draining:
                    continue
                for pointer in await self.store.claim_pending(partition, self.id, s.lease_ttl_ms):
                    self._schedule(pointer)
        if changed:
            self._leases_changed.set()

    def _expire_invalid_leases(self) -> None:
        for partition, lease in list(self.leases.items()):
            if not lease.valid():
                self._lose(partition, "lease expired (Redis unreachable)")

    def _lose(self, partition: int, reason: str) -> None:
        log.warning("worker %s lost partition %d: %s", self.id, partition, reason)
        self.leases.pop(partition, None)
        self._tracked.pop(partition, None)
        for runner in self._runners.values():
            if runner.partition == partition:
                runner.signal.cancel(reason, kind="lease")
                runner.entries.clear()
        self._leases_changed.set()

    def _busy(self, partition: int) -> bool:
        return any(r.partition == partition for r in self._runners.values())

    def _token(self, partition: int) -> str | None:
        lease = self.leases.get(partition)
        return lease.token if lease is not None and lease.valid() else None

    # -- reading ---------------------------------------------------------------

    async def _read_loop(self) -> None:
        s = self.settings
        max_backlog = s.max_concurrency * 4
        while True:
            partitions = [
                p for p, lease in self.leases.items() if not lease.draining and lease.valid()
            ]
            if not partitions:
                self._leases_changed.clear()
                await _wait(self._leases_changed.wait(), s.heartbeat_ms / 1000)
                continue
            if self._backlog() >= max_backlog:
                self._room.clear()
                await _wait(self._room.wait(), 1.0)
                continue
            try:
                pointers = await self.store.read_inbox(
                    partitions, self.id, s.read_count, s.block_ms
                )
            except ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                for p in partitions:  # Redis lost the group (restart without persistence)
                    await self.store.ensure_group(p)
                continue
            except _TRANSIENT as exc:
                log.warning("worker %s: inbox read failed: %s", self.id, exc)
                await asyncio.sleep(0.2)
                continue
            for pointer in pointers:
                if self._token(pointer.partition) is not None:
                    self._schedule(pointer)

    def _backlog(self) -> int:
        return sum(len(t) for t in self._tracked.values())

    def _schedule(self, pointer: Pointer) -> None:
        tracked = self._tracked.get(pointer.partition)
        if tracked is None or pointer.entry_id in tracked:
            return
        tracked.add(pointer.entry_id)
        runner = self._runners.get(pointer.url)
        if runner is None:
            runner = self._runners[pointer.url] = Runner(pointer.url, pointer.partition)
        runner.entries.append(pointer.entry_id)
        if runner.task is None:
            runner.task = asyncio.create_task(self._run_entity(runner), name=f"wake {pointer.url}")

    def _untrack(self, partition: int, entries: list[str]) -> None:
        tracked = self._tracked.get(partition)
        if tracked is not None:
            tracked.difference_update(entries)
        self._room.set()

    # -- activations -------------------------------------------------------------

    async def _run_entity(self, runner: Runner) -> None:
        try:
            while runner.entries and self._token(runner.partition) is not None:
                entries, runner.entries = runner.entries, []
                try:
                    async with self._slots:
                        await self._activate(runner, entries)
                except _Retry as retry:
                    runner.entries[:0] = entries  # keep them (unacked) for the next attempt
                    await self._sleep_or_lose(runner, retry.delay)
                except EntityGoneError:  # deleted or re-created meanwhile: look again
                    self._cache.pop(runner.url, None)
                    runner.entries[:0] = entries
                except FencedError as exc:
                    self.stats["commits_fenced"] += 1
                    log.warning("worker %s: %s", self.id, exc)
                    self._cache.pop(runner.url, None)
                    self._untrack(runner.partition, entries)
                except _TRANSIENT as exc:
                    log.warning("worker %s: wake of %s interrupted: %s", self.id, runner.url, exc)
                    self._cache.pop(runner.url, None)
                    runner.entries[:0] = entries
                    await self._sleep_or_lose(runner, 0.5)
        except (
            Exception
        ):  # a bug in the runtime itself: keep the worker alive, leave entries pending
            log.exception("worker %s: runner of %s crashed", self.id, runner.url)
            self._cache.pop(runner.url, None)
        except BaseException:
            if not self._killed:  # after kill() the task just ends, whatever stopped it
                raise
        finally:
            self._untrack(runner.partition, runner.entries)
            self._runners.pop(runner.url, None)

    async def _sleep_or_lose(self, runner: Runner, delay: float) -> None:
        await _wait(runner.signal.wait(), delay)

    async def _activate(self, runner: Runner, entries: list[str]) -> None:
        url, partition = runner.url, runner.partition
        token = self._token(partition)
        if token is None:
            return
        self.stats["activations"] += 1
        cached = self._cache.get(url)
        loaded = await self.store.load(url, cached.pos if cached else None)
        created = _text(loaded.meta, "created")
        if cached is not None and cached.created != created:
            self._cache.pop(url, None)
            cached = None
            loaded = await self.store.load(url, None)
            created = _text(loaded.meta, "created")
        meta = loaded.meta
        if not meta:  # deleted entity: nothing to wake, just acknowledge the pointers
            await self.store.commit(url, token, acks=entries)
            self._untrack(partition, entries)
            return

        cursor = _text(meta, "cursor")
        try:
            entity_type = self.registry.get(_text(meta, "type"))
        except UnknownEntityTypeError as exc:
            await self._park(
                url, token, entries, created, str(exc), [], int(meta.get("attempts", 0))
            )
            return
        out_done = _text(meta, "out_done") or ZERO
        if id_gt(_text(meta, "out_last") or ZERO, out_done):
            await self.delivery.pending(url, token, created, out_done)
        parked = meta.get("status") == b"failed"
        try:
            state, records, inputs, undecodable = self._rebuild(
                url, entity_type, cached, loaded, cursor
            )
        except UnreadableHistoryError as exc:  # the state is unknown: park (once)
            self._cache.pop(url, None)
            if parked:
                await self.store.commit(url, token, acks=entries, created=created)
                self._untrack(partition, entries)
            else:
                await self._park(url, token, entries, created, str(exc), exc.stream_ids, 0)
            return
        pos = records[-1].id if records else (cached.pos if cached else ZERO)
        since = (cached.since_snapshot if cached else 0) + len(loaded.entries)

        if parked or not (inputs or undecodable):
            # Parked, or every input was already handled by an earlier wake.
            if parked:
                # Not cached: the warm position would pass the unhandled inputs, and the
                # wake after a resume must read them again.
                self._cache.pop(url, None)
            else:
                self._remember(url, state, pos, created, since)
            await self.store.commit(url, token, acks=entries, created=created)
            self._untrack(partition, entries)
            return
        if undecodable:
            first_bad = undecodable[0].stream_id
            readable = [r for r in inputs if id_gt(first_bad, r.id)]
            if readable and not any(isinstance(r.event, DeleteRequested) for r in readable):
                # Handle the inputs before the unreadable entry first (the next wake parks
                # on it), so that skipping it later skips nothing else. The state was folded
                # past them: not cached.
                await self._wake(
                    runner,
                    entity_type,
                    token,
                    entries,
                    meta,
                    state,
                    readable,
                    pos,
                    since,
                    remember=False,
                )
                return
            error = "; ".join(str(e) for e in undecodable)
            await self._park(
                url, token, entries, created, error, [e.stream_id for e in undecodable], 0
            )
            return
        if any(isinstance(r.event, DeleteRequested) for r in inputs):
            await self._delete(url, token, entries, created, state, entity_type, inputs)
            return
        await self._wake(runner, entity_type, token, entries, meta, state, inputs, pos, since)

    def _rebuild(
        self,
        url: str,
        entity_type: EntityType,
        cached: Cached | None,
        loaded: Loaded,
        cursor: str,
    ) -> tuple[EntityState, list[LogRecord], list[LogRecord], list[EventDecodeError]]:
        """Fold the loaded log tail into the state; collect the inputs after the cursor."""
        if cached is not None:
            state = cached.state
        elif loaded.snapshot is not None:
            state = EntityState.from_snapshot(
                loaded.snapshot, entity_type.state, _text(loaded.meta, "snap_out") or ZERO
            )
        else:
            state = EntityState(entity_type.state)
        records: list[LogRecord] = []
        inputs: list[LogRecord] = []
        undecodable: list[EventDecodeError] = []
        handled_undecodable: list[EventDecodeError] = []
        for entry_id, fields in loaded.entries:
            try:
                record = decode_entry(entry_id, fields, url)
            except EventDecodeError as exc:
                (undecodable if id_gt(entry_id, cursor) else handled_undecodable).append(exc)
                records.append(LogRecord(entry_id, Event()))
                continue
            records.append(record)
            state.fold(entry_id, record.event)
            if record.event.is_input and id_gt(entry_id, cursor):
                inputs.append(record)
        check_skipped(handled_undecodable, records)
        return state, records, inputs, undecodable

    def _activation(
        self,
        url: str,
        created: str,
        state: EntityState,
        entity_type: EntityType,
        inputs: list[LogRecord],
    ) -> Activation:
        return Activation(
            url=url,
            created=created,
            state=state,
            db=Database(state, entity_type.state),
            inputs=inputs,
            max_event_bytes=self.settings.max_event_bytes,
        )

    async def _wake(
        self,
        runner: Runner,
        entity_type: EntityType,
        token: str,
        entries: list[str],
        meta: dict[str, bytes],
        state: EntityState,
        inputs: list[LogRecord],
        pos: str,
        since: int,
        *,
        remember: bool = True,
    ) -> None:
        """Run the handler on ``inputs`` and commit. ``remember=False`` when the state was
        folded past inputs this wake leaves for the next one: it must not be cached."""
        url, partition = runner.url, runner.partition
        created = _text(meta, "created")
        attempts = int(meta.get("attempts", 0))
        open_run = state.system.run
        act = self._activation(url, created, state, entity_type, inputs)
        cancel = next(
            (r.event for r in reversed(inputs) if isinstance(r.event, CancelRequested)), None
        )
        if cancel is not None:
            act.cancel_effects(cancel.reason)

        # A commit point inside the wake leaves the cursor where it is: mark the inputs
        # as partly handled ("<first> <last>" input of the attempt), so that a retried
        # wake knows which of its inputs an earlier attempt had (ctx.wake.resumed_upto).
        first_input, last_input = inputs[0].id, inputs[-1].id
        partial = _text(meta, "partial")
        attempted_first, _, attempted_last = partial.partition(" ")
        resumed_upto = attempted_last if attempted_first == first_input else None
        flushed = False

        async def flush() -> None:
            nonlocal flushed
            batch = act.take_commit(CURRENT_TOOL_CALL.get())
            if batch:
                flushed = True
                self._fault("flush:before-commit")
                ids = await self.store.commit(
                    url,
                    token,
                    events=batch.events,
                    fields={"partial": f"{first_input} {resumed_upto or last_input}"},
                    created=created,
                    timers=[(t.member, t.due_ms, t.data) for t in batch.timers],
                    actions=batch.actions,
                )
                _note_applied(state, batch.events, ids)
                self._fault("flush:after-commit")
                await self.delivery.after_commit(url, token, created, batch, ids)

        runner.signal = signal = CancelSignal()
        live = LivePublisher(self.store.append_live, url)

        parsed = parse_url(url)
        raw_args = meta.get("args")
        ctx = HandlerContext(
            entity_url=url,
            entity_type=parsed.type,
            entity_id=parsed.id,
            args=entity_type.typed_args(unpack(raw_args) if raw_args else None),
            wake=WakeInfo(inputs, resumed_upto=resumed_upto),
            first_wake=_text(meta, "cursor") == ZERO,
            db=act.db,
            signal=signal,
            flush=flush,
            activation=act,
            services=self,
            live=live,
        )
        self.stats["handler_calls"] += 1
        try:
            await entity_type.handler(ctx)
            batch = act.take_commit()
        except (FencedError, *_TRANSIENT):
            self._cache.pop(url, None)
            raise
        except WakeInterrupted as exc:  # lease lost or shutting down: resume elsewhere
            log.info("wake of %s interrupted: %s", url, exc)
            self._cache.pop(url, None)
            self._untrack(partition, entries)
            return
        except Exception as exc:
            self._cache.pop(url, None)  # the in-memory state holds writes that never committed
            state.system.run = open_run
            await self._handler_failed(url, token, entries, created, inputs, attempts, exc, act)
            return
        finally:
            await live.drain()

        since += len(batch.events)
        snapshot = b""
        if since >= self.settings.snapshot_every:
            snapshot = state.snapshot()
            since = 0
        fields: dict[str, Any] = {}
        if attempts:
            fields["attempts"] = 0
        if partial or flushed:
            fields["partial"] = ""  # these inputs are handled now
        self._fault("wake:before-commit")
        awaited = state.system.awaited_children()
        if awaited != int(meta.get("waiting") or 0):
            fields["waiting"] = awaited
        ids = await self.store.commit(
            url,
            token,
            events=batch.events,
            cursor=max_id([r.id for r in inputs]),
            acks=entries,
            created=created,
            snapshot=snapshot,
            snapshot_seen=pos,
            snapshot_out=state.applied,
            fields=fields,
            timers=[(t.member, t.due_ms, t.data) for t in batch.timers],
            actions=batch.actions,
        )
        _note_applied(state, batch.events, ids)
        self._fault("wake:after-commit")
        if remember:
            self._remember(url, state, pos, created, since)
        else:
            self._cache.pop(url, None)
        self._untrack(partition, entries)
        await self.delivery.after_commit(url, token, created, batch, ids)

    async def _handler_failed(
        self,
        url: str,
        token: str,
        entries: list[str],
        created: str,
        inputs: list[LogRecord],
        attempts: int,
        exc: Exception,
        act: Activation,
    ) -> None:
        attempt = attempts + 1
        input_ids = [r.id for r in inputs]
        failure = HandlerFailed(
            error_type=type(exc).__name__,
            error=str(exc),
            traceback="".join(traceback.format_exception(exc))[-8000:],
            attempt=attempt,
            inputs=input_ids,
        )
        log.warning("handler of %s failed (attempt %d): %r", url, attempt, exc)
        if attempt < self.settings.max_attempts:
            await self.store.commit(
                url,
                token,
                events=[(PLAIN, encode_event(failure, limit=1 << 30))],
                fields={"attempts": attempt},
                created=created,
            )
            s = self.settings
            raise _Retry(min(s.retry_base_ms * 2 ** (attempt - 1), s.retry_max_ms) / 1000)
        error = f"{type(exc).__name__}: {exc}"
        # Subscribers must not wait forever: the run this wake belongs to finishes as failed.
        parked = self._activation(url, created, act.state, EntityType("-", _no_handler), inputs)
        act.db.actions.take_pending()
        parked.finish_run("failed", error=error)
        await self._park(url, token, entries, created, error, input_ids, attempt, failure, parked)

    async def _park(
        self,
        url: str,
        token: str,
        entries: list[str],
        created: str,
        error: str,
        input_ids: list[str],
        attempts: int,
        failure: HandlerFailed | None = None,
        act: Activation | None = None,
    ) -> None:
        """Mark the entity failed. Its inputs stay in the log, unprocessed, until resumed."""
        log.error("entity %s failed: %s", url, error)
        batch = act.take_commit() if act is not None else CommitBatch()
        events = [(PLAIN, encode_event(failure, limit=1 << 30))] if failure else []
        events += batch.events
        events.append(
            (PLAIN, encode_event(EntityFailed(error=error, attempts=attempts, inputs=input_ids)))
        )
        self._cache.pop(url, None)
        ids = await self.store.commit(
            url,
            token,
            events=events,
            acks=entries,
            fields={"status": "failed", "error": error, "attempts": attempts},
            created=created,
        )
        self._untrack(self.store.keys.partition(url), entries)
        offset = 1 if failure else 0
        await self.delivery.after_commit(url, token, created, batch, ids[offset:])

    async def _delete(
        self,
        url: str,
        token: str,
        entries: list[str],
        created: str,
        state: EntityState,
        entity_type: EntityType,
        inputs: list[LogRecord],
    ) -> None:
        """Finish the open run as cancelled, cancel children per policy, then delete."""
        act = self._activation(url, created, state, entity_type, inputs)
        act.cancel_effects("entity deleted")
        batch = act.take_commit()
        if batch:
            ids = await self.store.commit(url, token, events=batch.events, created=created)
            if batch.outbox is not None:
                await self.delivery.deliver(
                    url, batch.outbox.effects
                )  # must land before the log goes
                await self.store.commit(url, token, fields={"out_done": ids[-1]}, created=created)
        self._cache.pop(url, None)
        await self._release_capabilities(url)
        await self.store.delete(url, token, created, entries)
        self._untrack(self.store.keys.partition(url), entries)
        log.info("entity %s deleted", url)

    # -- timers --------------------------------------------------------------------

    async def _timer_loop(self) -> None:
        """Fire due timers of the owned partitions; sleeps until the next one (max 250 ms)."""
        while True:
            delay = 0.25
            try:
                partitions = [p for p, lease in self.leases.items() if not lease.draining]
                if partitions:
                    now = int(time.time() * 1000)
                    for partition, member in await self.store.due_timers(partitions, now):
                        token = self._token(partition)
                        if token is not None:
                            self._fault("timer:before-fire")
                            await self.store.fire_timer(partition, token, member)
                            self._fault("timer:after-fire")
                    upcoming = await self.store.next_timer_ms(partitions)
                    if upcoming is not None:
                        delay = min(delay, max(0.0, (upcoming - time.time() * 1000) / 1000))
            except _TRANSIENT as exc:
                log.warning("worker %s: timer check failed: %s", self.id, exc)
            await asyncio.sleep(max(delay, 0.005))

    # -- cancellation of running wakes ---------------------------------------------

    async def _cancel_loop(self) -> None:
        """``rt.cancel`` publishes on ``<prefix>:cancel:<url>``; stop that wake if it runs here.

        The cancel request is also an input in the entity's log, so a wake that
        starts later (or on another worker) still sees it."""
        prefix = self.store.keys.cancel_channel("")
        while True:
            pubsub = self.store.redis.pubsub()
            try:
                await pubsub.psubscribe(prefix + "*")
                while True:
                    message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1.0)
                    if message is None or message.get("type") != "pmessage":
                        continue
                    url = _decode(message["channel"])[len(prefix) :]
                    runner = self._runners.get(url)
                    if runner is not None:
                        runner.signal.cancel(_decode(message["data"]) or "cancelled", kind="cancel")
            except _TRANSIENT as exc:
                log.warning("worker %s: cancel listener reconnecting: %s", self.id, exc)
                await asyncio.sleep(0.5)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()

    # -- services for handler contexts ---------------------------------------------

    async def entity_type(self, type_name: str) -> EntityType | None:
        if type_name in self.registry:
            return self.registry.get(type_name)
        published = await self.store.redis.hexists(self.store.keys.types, type_name)
        if not published:
            raise UnknownEntityTypeError(type_name, self.registry.names())
        return None

    async def status(self, url: str) -> EntityStatus:
        meta = await self.store.meta(url)
        if not meta:
            raise EntityNotFoundError(url)
        return status_from_meta(url, meta)

    async def schedules(self, url: str, created: str) -> list[Schedule]:
        out = []
        for member, due_ms, data in await self.store.timers_of(url, created):
            event = decode_event(data, url=url)
            for effect in getattr(event, "effects", []):
                out.append(Schedule(member.split("|", 2)[2], effect.target, effect.payload, due_ms))
        return out

    async def cancel_schedule(self, url: str, created: str, schedule_id: str) -> bool:
        token = self._token(self.store.keys.partition(url))
        if token is None:
            raise FencedError(f"the lease of {url}'s partition is lost")
        return await self.store.cancel_timer(url, token, f"{url}|{created}|{schedule_id}")

    def capabilities_for(self, url: str) -> CapabilityPool:
        pool = self._pools.get(url)
        if pool is None:
            pool = self._pools[url] = CapabilityPool(url, self.capabilities)
        return pool

    async def _release_capabilities(self, url: str) -> None:
        pool = self._pools.pop(url, None)
        if pool is not None:
            await pool.cleanup()

    def _remember(self, url: str, state: EntityState, pos: str, created: str, since: int) -> None:
        self._cache[url] = Cached(state, pos, created, since)
        self._cache.move_to_end(url)
        while len(self._cache) > self.settings.cache_size:
            evicted, _ = self._cache.popitem(last=False)
            if evicted in self._pools and evicted not in self._runners:
                asyncio.get_running_loop().create_task(self._release_capabilities(evicted))


async def _no_handler(ctx: HandlerContext) -> None:  # pragma: no cover - placeholder type
    raise AssertionError("not a handler")


def _note_applied(state: EntityState, events: list[tuple[str, bytes]], ids: list[str]) -> None:
    """After a commit: its outputs were applied before they were written."""
    for (flag, _), event_id in zip(events, ids, strict=True):
        if flag != INPUT:
            state.applied = event_id


def _decode(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def check_skipped(undecodable: list[EventDecodeError], records: list[LogRecord]) -> None:
    """An undecodable entry at or before the cursor may only be one an operator skipped
    (``resume(skip_failed=True)`` lists it in a ``resumed`` event). Anything else, such
    as a state event written by a newer version, leaves the state unknown: raise."""
    if not undecodable:
        return
    skipped = {i for r in records if isinstance(r.event, Resumed) for i in r.event.skipped}
    unexpected = [exc for exc in undecodable if exc.stream_id not in skipped]
    for exc in undecodable:
        if exc.stream_id in skipped:
            log.info("skipping dead-lettered undecodable event %s of %s", exc.stream_id, exc.url)
    if unexpected:
        raise UnreadableHistoryError(unexpected)


def _text(meta: dict[str, bytes], field: str) -> str:
    return (meta.get(field) or b"").decode()
