"""The client API: :class:`Runtime`.

``Runtime(registry)`` with no Redis URL is the embedded default: an in-process
fakeredis and a worker in the same process. With ``redis_url`` it is a client of
a shared Redis; pass ``run_worker=True`` to also run a worker in-process.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable
from typing import Any, Literal, TypeVar

import msgspec
from redis.asyncio import Redis

from . import tracing
from .actions import (
    Authorizer,
    check_client_tools,
    default_authorizer,
)
from .capabilities import Capability
from .client_actions import PendingActions
from .client_bulk import BulkReads
from .client_log import LogExport
from .client_schedules import RecurringSchedules
from .config import Settings
from .connection import connect
from .content_blocks import check_content
from .errors import (
    EntityNotFoundError,
    EventDecodeError,
    NotFailedError,
    RunFailedError,
    RunRefusedError,
    RunSuspendedError,
    RunTruncatedError,
    UnknownEntityTypeError,
    WaitTimeoutError,
    WakefulError,
)
from .events import (
    RUNTIME_EVENT_MAX_BYTES,
    CancelRequested,
    ConversationRequested,
    Created,
    DeleteRequested,
    EntityFailed,
    HistoryEvent,
    LogRecord,
    Message,
    Resumed,
    RunFinished,
    RuntimeErrorRecorded,
    ToolData,
    TrimmedRecord,
    UndecodableRecord,
    decode_entry,
    encode_event,
    pack,
)
from .fold import check_skipped, initial_state, rebuild
from .following import follow_entity, until_idle
from .history import project
from .json_values import json_builtins
from .keys import Keyspace
from .live import LiveRecord
from .notices import Notices
from .registry import Registry
from .retention import Exporter
from .state import ChildInfo, EntityState
from .status import EntityStatus, RunInfo, entity_status
from .store import EntityMeta, Store, TargetMissingError
from .streamids import id_gt
from .tasks import all_of
from .urls import entity_url, parse_url
from .worker import Worker

T = TypeVar("T")
log = logging.getLogger("wakeful.client")


@dataclasses.dataclass
class WorkerInfo:
    """A live worker in the registry: its id, the partitions whose leases it holds,
    and when it last heartbeat (derived from the expiry, ``2 * lease_ttl_ms`` after it)."""

    id: str
    partitions: list[int]
    last_heartbeat_ms: int  # ms ago
    expires_in_ms: int


class Runtime(PendingActions, RecurringSchedules, LogExport, BulkReads):
    def __init__(
        self,
        registry: Registry | None = None,
        *,
        redis_url: str | None = None,
        settings: Settings | None = None,
        run_worker: bool | None = None,
        redis: Redis | None = None,
        capabilities: list[Capability[Any]] | None = None,
        action_authorizer: Authorizer | None = None,
        archive: Exporter | None = None,
    ) -> None:
        base = settings or Settings.from_env()
        if redis_url is not None:
            base = dataclasses.replace(base, redis_url=redis_url)
        self.settings = base
        self.registry = registry or Registry()
        self.embedded = redis is None and base.redis_url is None
        self._run_worker = self.embedded if run_worker is None else run_worker
        self.capabilities = list(capabilities or [])
        self.action_authorizer = action_authorizer or default_authorizer
        self.archive = archive  # the worker's exporter of trimmed log entries (retention.py)
        self._redis = redis
        self._worker_redis: Redis | None = None  # the worker's own, when we connect
        self._embedded_server: Any = None
        self.store: Store | None = None
        self.worker: Worker | None = None
        self._worker_task: asyncio.Task[None] | None = None
        self._published_types: dict[str, bytes] | None = None
        self._notices: Notices | None = None
        self.clock: Callable[[], float] = time.time  # of recurring schedules (and the worker's)

    # -- lifecycle -------------------------------------------------------------

    async def start(self) -> Runtime:
        s = self.settings
        if self._redis is None:
            self._redis = self._connect()
            if self._run_worker:  # its own connections: clients never starve its leases
                self._worker_redis = self._connect()
        keys = Keyspace(s.prefix, s.partitions)
        ttl_ms = s.idempotency_ttl_s * 1000
        wait = {"replica_wait": s.replica_wait, "replica_wait_ms": s.replica_wait_ms}
        self.store = Store(self._redis, keys, idempotency_ttl_ms=ttl_ms, **wait)
        self._notices = Notices(self._redis)
        # A worker is a daemon: it waits for a Redis that is not up yet; a client fails.
        await self.store.setup(wait_for_redis=self._run_worker)
        if self._run_worker:
            worker_store = self.store
            if self._worker_redis is not None:
                worker_store = Store(self._worker_redis, keys, idempotency_ttl_ms=ttl_ms, **wait)
            self.worker = Worker(
                self.registry,
                worker_store,
                s,
                capabilities=self.capabilities,
                archive=self.archive,
            )
            self.worker.clock = self._now
            # The runtime owns the worker task: close() stops it and awaits it (raising
            # its error), and a start that fails or is cancelled cancels it.
            self._worker_task = asyncio.create_task(self.worker.run(), name="wakeful-worker")
            self._worker_task.add_done_callback(self._worker_ended)
            try:
                await self._wait_worker_ready(self.worker, self._worker_task)
            except BaseException:
                self._worker_task.cancel()
                await asyncio.wait({self._worker_task})
                raise
        return self

    def _now(self) -> float:
        return self.clock()

    def _worker_ended(self, task: asyncio.Task[None]) -> None:
        """Say at once when the embedded worker stops on its own (close() raises it too)."""
        if not task.cancelled() and (error := task.exception()) is not None:
            log.error("the embedded worker stopped, no wake runs until a restart: %r", error)

    def _connect(self) -> Redis:
        """A new client with its own pool: of ``redis_url``, or of the embedded server."""
        s = self.settings
        if s.redis_url is None:
            from .embedded import embedded_redis

            if self._embedded_server is None:
                import fakeredis

                self._embedded_server = fakeredis.FakeServer()
            return embedded_redis(self._embedded_server)
        return connect(
            s.redis_url,
            socket_timeout_s=s.socket_timeout_s,
            max_connections=s.max_connections,
            pool_timeout_s=s.pool_timeout_s,
        )

    @staticmethod
    async def _wait_worker_ready(worker: Worker, worker_task: asyncio.Task[None]) -> None:
        """Return once the worker serves; raise its start-up error if it ends first."""
        async with asyncio.TaskGroup() as group:
            ready = group.create_task(worker.ready.wait(), name="wakeful-worker-ready")
            await asyncio.wait({ready, worker_task}, return_when=asyncio.FIRST_COMPLETED)
            ready.cancel()
        if worker_task.done():
            worker_task.result()  # raises the worker's start-up error

    async def close(self) -> None:
        try:
            if self.worker is not None and self._worker_task is not None:
                self.worker.stop()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._worker_task
        finally:
            if self._notices is not None:
                await self._notices.aclose()
            stores = [self.store, self.worker.store if self.worker is not None else None]
            for store in {id(st): st for st in stores if st is not None}.values():
                await store.close_routes()  # a cluster's per-node clients
            if self._worker_redis is not None:
                await self._worker_redis.aclose()
            if self._redis is not None:
                await self._redis.aclose()

    async def __aenter__(self) -> Runtime:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def _store(self) -> Store:
        if self.store is None:
            raise WakefulError("the runtime is not started: use 'async with Runtime(...)'")
        return self.store

    # -- sending ---------------------------------------------------------------

    async def _check_type(self, type_name: str) -> None:
        """Sending to an unregistered type fails at the sender."""
        if type_name in self.registry:
            return
        if self._published_types is None or type_name not in self._published_types:
            self._published_types = await self._store.published_types()
        if type_name not in self._published_types:
            known = sorted({*self.registry.names(), *self._published_types})
            error = UnknownEntityTypeError(type_name, known)
            if not self._published_types and not await self._store.live_workers():
                error.args = (
                    f"{error}; no worker has registered its types on this keyspace "
                    f"(prefix {self.settings.prefix!r}) and none runs: start "
                    "`wakeful worker APP` (or `serve --worker`) first",
                )
            raise error

    async def send(
        self,
        url: str,
        payload: Any,
        *,
        idempotency_key: str | None = None,
        identity: dict[str, str] | None = None,
        client_data: Any = None,
        sender: str | None = None,
        client_tools: list[dict[str, Any]] | None = None,
        expect_owner: str = "",
        content: list[dict[str, Any]] | None = None,
    ) -> str:
        """Append a message to the entity's log (creating the entity) and wake it.

        Returns the event id. The same ``idempotency_key`` twice from the same
        ``identity`` returns the first event's id and appends nothing (keys are
        kept per identity: another identity's key is a new key). An entity this
        creates is owned by ``identity``. ``expect_owner`` (the gateway's: the
        :func:`~wakeful.keys.owner_mark` its authoriser saw) makes the send write
        nothing and raise :class:`OwnerChangedError` if the owner is another now.
        ``content``: content blocks (images, documents, text; see
        :func:`~wakeful.content_blocks.attachment`) the model gets after the payload's
        text, checked first: a block the API would refuse is an
        :class:`InvalidContentError` naming it, and nothing is written.
        """
        if content is not None:
            content = check_content(content)
        parsed = parse_url(url)
        await self._check_type(parsed.type)
        limit = self.settings.max_event_bytes
        with tracing.send_span(url) as trace:
            message = encode_event(
                Message(
                    payload=payload,
                    sender=sender,
                    identity=identity,
                    client_data=client_data,
                    idempotency_key=idempotency_key,
                    client_tools=(
                        check_client_tools(client_tools, self.settings)
                        if client_tools is not None
                        else None
                    ),
                    trace=trace,
                    content=content,
                ),
                limit=limit,
                what=f"message to {url}",
                from_client=True,
            )
            result = await self._store.append_input(
                url,
                parsed.type,
                created=encode_event(Created(type=parsed.type, trace=trace), limit=limit),
                events=[("i", message)],
                args=pack(None),
                idempotency_key=idempotency_key,
                idempotency_identity=identity,
                owner=identity,
                expect_owner=expect_owner,
            )
        return result.id

    async def create(
        self,
        type_name: str,
        entity_id: str,
        args: Any = None,
        *,
        initial_message: Any = None,
        parent: str | None = None,
        idempotency_key: str | None = None,
        identity: dict[str, str] | None = None,
        client_data: Any = None,
        expect_owner: str = "",
    ) -> str:
        """Create an entity with ``args`` (get-or-create) and optionally send it a message.

        If the entity exists with the same args, ``initial_message`` is delivered
        to it (use ``idempotency_key`` to make a retried call send it once); with
        different args it raises :class:`ArgsConflictError` and sends nothing.
        ``identity`` (trusted) and ``client_data`` (untrusted) travel with the
        initial message, as with :meth:`send`; an entity this creates is owned by
        ``identity``, and ``expect_owner`` is checked as by :meth:`send`.
        """
        url = entity_url(type_name, entity_id)
        await self._check_type(type_name)
        args = json_builtins(args, "args")  # NaN, too deep: refused before any check
        if type_name in self.registry:
            args = self.registry.get(type_name).validate_args(args)
        limit = self.settings.max_event_bytes
        with tracing.send_span(url, "create") as trace:
            message = None
            if initial_message is not None:
                message = encode_event(
                    Message(
                        payload=initial_message,
                        sender=parent,
                        identity=identity,
                        client_data=client_data,
                        idempotency_key=idempotency_key,
                        trace=trace,
                    ),
                    limit=limit,
                    what=f"initial message to {url}",
                    from_client=True,
                )
            await self._store.append_input(
                url,
                type_name,
                created=encode_event(
                    Created(type=type_name, args=args, parent=parent, trace=trace),
                    limit=limit,
                    what="args",
                    from_client=True,
                ),
                events=[("i", message)] if message is not None else [],
                args=pack(args),
                parent=parent or "",
                mode="create",
                idempotency_key=idempotency_key,
                idempotency_identity=identity,
                owner=identity,
                expect_owner=expect_owner,
            )
        return url

    async def cancel(self, url: str, reason: str = "cancelled by client") -> str:
        """Cancel the entity's current run (it finishes as cancelled, subscribers are
        woken) and its children whose parent-close policy is ``cancel``."""
        event_id = await self._append_existing(url, CancelRequested(reason=reason, by="client"))
        # Stop the run now if a worker is running it; the input covers every other case.
        await self._store.publish_cancel(url, reason)
        return event_id

    async def delete(self, url: str, *, wait: bool = True, timeout: float = 30.0) -> None:
        """Delete the entity: its run is cancelled, children handled per their
        parent-close policy, then its log, metadata and snapshot are removed."""
        await self._append_existing(url, DeleteRequested(by="client"))
        if not wait:
            return

        async def gone() -> bool | None:
            return True if not await self._store.meta(url) else None

        if await self._until_notified(url, timeout, gone) is None:
            raise WaitTimeoutError(f"{url} was not deleted within {timeout}s")

    async def compact(self, url: str, *, wait: bool = True, timeout: float = 60.0) -> bool:
        """Ask the entity's agent to summarise the older turns of its conversation (its
        model writes the summary, at the next wake in which the handler runs the agent).
        With ``wait``, wait until the entity is idle and tell whether it compacted."""
        return await self._conversation_request(url, "compact", wait, timeout)

    async def reset_conversation(
        self, url: str, *, wait: bool = True, timeout: float = 60.0
    ) -> bool:
        """Ask the entity's agent to drop every turn of its conversation before its open
        run (the log keeps them); the next run starts afresh. With ``wait``, wait until
        the entity is idle and tell whether it dropped any."""
        return await self._conversation_request(url, "reset", wait, timeout)

    async def _conversation_request(
        self, url: str, action: Literal["compact", "reset"], wait: bool, timeout: float
    ) -> bool:
        event_id = await self._append_existing(url, ConversationRequested(action=action))
        if not wait:
            return False
        await self.wait_idle(url, timeout)
        done = (await self._folded(url)).system.conversation_upto
        return bool(done) and not id_gt(event_id, done)

    async def _append_existing(
        self, url: str, event: CancelRequested | DeleteRequested | ConversationRequested
    ) -> str:
        parsed = parse_url(url)
        tag = str(event.__struct_config__.tag)
        try:
            with tracing.send_span(url, tag) as trace:
                event = msgspec.structs.replace(event, trace=trace)
                result = await self._store.append_input(
                    url,
                    parsed.type,
                    created=b"",
                    events=[("i", encode_event(event, what=f"{tag} of {url}"))],
                    mode="existing",
                )
        except TargetMissingError:
            raise EntityNotFoundError(url) from None
        return result.id

    async def resume(self, url: str, *, skip_failed: bool = False) -> list[str]:
        """Un-park a failed entity. Its unprocessed inputs run again, unless ``skip_failed``
        moves the cursor past the inputs of the failure (dead-lettering them). Returns
        the ids of the inputs skipped (none without ``skip_failed``)."""
        not_failed = NotFailedError(url)
        meta = await self._entity_meta(url)
        if not meta.parked:
            raise not_failed
        # Resume rewrites ``attempts``; any other unreadable field stays, and the cursor
        # (or an outbox mark) decides which inputs run again: refuse rather than guess.
        if [name for name in meta.bad_fields() if name != "attempts"]:
            problems = meta.problems()
            raise WakefulError(
                f"cannot resume {url}: its metadata is corrupted ({'; '.join(problems)}), "
                "so the runtime cannot tell which inputs were handled; repair the field "
                "in Redis or delete the entity"
            )
        skipped: list[str] = []
        if skip_failed:
            failure = await self._last_failure(url)
            skipped = failure.inputs if failure else []
        resumed = encode_event(Resumed(skipped=skipped), limit=RUNTIME_EVENT_MAX_BYTES)
        if not await self._store.resume(url, resumed, skipped):
            raise not_failed  # resumed (or deleted) by someone else meanwhile
        return skipped

    async def _last_failure(self, url: str) -> EntityFailed | None:
        for entry_id, fields in await self._store.newest_log_entries(url, 200):
            with contextlib.suppress(EventDecodeError):
                record = decode_entry(entry_id, fields, url)
                if isinstance(record.event, EntityFailed):
                    return record.event
        return None

    # -- reading ---------------------------------------------------------------

    async def history(self, url: str) -> list[HistoryEvent]:
        """The agent journal of ``url``: user turns, assistant steps, tool intents and results."""
        return list((await self._folded(url)).system.history)

    async def tool_data(self, url: str) -> dict[str, Any]:
        """The tool data of ``url``'s calls (the latest write of each), by tool call id."""
        return {
            record.event.tool_call_id: record.event.data
            async for record in self.events(url)
            if isinstance(record, LogRecord) and isinstance(record.event, ToolData)
        }

    async def runtime_errors(self, url: str) -> list[RuntimeErrorRecorded]:
        """The full errors of the bugs that failed runs of ``url`` (tracebacks, secret
        values included), oldest first. For operators: the gateway never sends these
        events to HTTP clients, who see only the redacted error of the run."""
        return [
            record.event
            async for record in self.events(url)
            if isinstance(record, LogRecord) and isinstance(record.event, RuntimeErrorRecorded)
        ]

    async def conversation(self, url: str) -> list[dict[str, Any]]:
        """The conversation as the model sees it (Messages API messages)."""
        return project(await self.history(url))

    async def children(self, url: str) -> list[ChildInfo]:
        """The entities ``url`` spawned, with the status of their last finished run."""
        return list((await self._folded(url)).system.children.values())

    async def _entity_meta(self, url: str) -> EntityMeta:
        parse_url(url)
        meta = await self._store.entity_meta(url)
        if meta is None:
            raise EntityNotFoundError(url)
        return meta

    async def ownership(self, url: str) -> tuple[bool, dict[str, str] | None]:
        """Whether the entity exists, and the identity that owns it (None: none
        recorded), in one read of its metadata (for authorisers)."""
        parse_url(url)
        [found] = await self._store.ownerships([url])
        return found

    async def ownerships(self, urls: list[str]) -> list[tuple[bool, dict[str, str] | None]]:
        """:meth:`ownership` of many entities, in one round trip."""
        return await self._store.ownerships(urls)

    async def status(self, url: str, *, runs: bool = False) -> EntityStatus:
        """Where the entity stands; with ``runs`` also its current and last finished
        run (read from its state, so it costs a load of the entity)."""
        status = entity_status(url, await self._entity_meta(url))
        if not runs:
            return status
        system = (await self._folded(url)).system
        current = None
        if system.run is not None:
            word = "suspended" if system.actions else "running"
            current = RunInfo(system.run, word, system.run_started_ms)
        last = system.last_run
        return dataclasses.replace(
            status,
            run=current,
            last_run=RunInfo(last.run_id, last.status, last.at_ms, last.error) if last else None,
        )

    async def state(self, url: str) -> dict[str, list[Any]]:
        """The entity's collections as committed (snapshot + log), as plain data."""
        return (await self._folded(url)).to_builtins()

    async def _folded(self, url: str) -> EntityState:
        parse_url(url)
        loaded = await self._store.load(url, None)
        meta = loaded.info
        if meta is None:
            raise EntityNotFoundError(url)
        collections = {}
        if meta.type in self.registry:
            collections = self.registry.get(meta.type).state
        state = initial_state(collections, loaded.snapshot, meta.snapshot_out, loaded.chunks, url)
        cursor = meta.cursor
        folded = rebuild(url, state, loaded.entries, cursor)
        if folded.undecodable:  # an unhandled entry: its input is unknown, not skippable
            raise folded.undecodable[0]
        check_skipped(folded.handled_undecodable, folded.records)  # fine only if skipped
        return folded.state

    async def events(
        self,
        url: str,
        *,
        after: str | None = None,
        follow: bool = False,
        live: bool = False,
        live_after: str | None = None,
        block_ms: int = 5000,
    ) -> AsyncGenerator[LogRecord | UndecodableRecord | LiveRecord | TrimmedRecord, None]:
        """The entity log after ``after``; with ``follow`` it waits for new events forever.

        With ``live=True`` it also follows the live stream (text deltas and tool
        progress, as :class:`LiveRecord`), from ``live_after`` or from now; a
        client that reconnects passes the last ids it saw of each stream. An
        entry that fails to decode is yielded as an :class:`UndecodableRecord`
        with its stream id, never skipped. A range that log retention trimmed
        (``after`` before it, or the whole history) is a :class:`TrimmedRecord`
        naming the last entry gone, never a silent jump.
        """
        parse_url(url)
        records = follow_entity(
            self._store,
            url,
            after=after,
            follow=follow,
            live=live,
            live_after=live_after,
            block_ms=block_ms,
        )
        async with contextlib.aclosing(records):
            async for record in records:
                yield record

    async def log_position(self, url: str, *, back: int) -> str | None:
        """The id to pass as ``after`` to read only the last ``back`` entries of the log
        (None when the log has no more than that)."""
        parse_url(url)
        if back < 1:
            raise WakefulError(f"back must be at least 1, got {back}")
        newest = await self._store.newest_log_entries(url, back + 1)
        return newest[-1][0] if len(newest) > back else None

    async def live_position(self, url: str) -> str:
        """The id of the newest live event of ``url``: pass it as ``live_after`` to follow
        only the live output that comes after this moment (take it before sending)."""
        parse_url(url)
        return await self._store.newest_live_id(url)

    async def stream_until_idle(
        self,
        url: str,
        *,
        after: str | None = None,
        live_after: str | None = None,
        timeout: float = 60.0,
    ) -> AsyncGenerator[LogRecord | UndecodableRecord | LiveRecord | TrimmedRecord, None]:
        """The log (after ``after``) and live output (after ``live_after``) of ``url``
        until the entity is idle: every input handled, no awaited child running, or
        suspended on pending actions, or failed. Ends once every log entry written up
        to that moment has been yielded. Raises :class:`WaitTimeoutError` after
        ``timeout`` seconds without reaching idle.
        """
        parse_url(url)
        records = self.events(url, after=after, live=True, live_after=live_after)
        idle = functools.partial(self.wait_idle, url, timeout=timeout)
        stream = until_idle(self._store, url, records, after=after, idle=idle)
        async with contextlib.aclosing(stream):  # its tasks end when this generator does
            async for record in stream:
                yield record

    async def types(self) -> list[str]:
        """Entity types known here: this registry's and those workers published."""
        published = await self._store.published_type_names()
        return sorted({*self.registry.names(), *published})

    async def bad_items(self, count: int = 100) -> list[dict[str, str]]:
        """Wake pointers and timers the workers could not use and moved to their
        partition's dead-letter stream (newest first, up to ``count`` per partition):
        ``partition``, ``id``, ``kind`` (pointer | timer), ``key``, ``item``, ``reason``,
        ``detail`` (a pointer's fields, a timer's data) and ``worker``."""
        return await self._store.bad_items(count)

    async def lease_owner(self, url: str) -> str | None:
        """``<worker>:<epoch>`` holding the lease of the partition ``url`` lives in."""
        parse_url(url)
        return await self._store.lease_owner(self._store.keys.partition(url))

    async def lag(self, url: str) -> tuple[int, int]:
        """``(inputs, ms)``: inputs appended but not yet handled, and the age of the oldest."""
        cursor = (await self._entity_meta(url)).cursor
        pending, oldest = 0, None
        async for record in self.events(url, after=cursor):
            if isinstance(record, LogRecord) and not record.event.is_input:
                continue
            pending += 1
            oldest = oldest or record.id
        age = int(time.time() * 1000) - int(oldest.split("-")[0]) if oldest else 0
        return pending, max(age, 0)

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

    async def _no_worker_hint(self, url: str) -> str:
        """``"; no worker ..."`` when no live worker holds the partition of ``url``."""
        partition = self._store.keys.partition(url)
        owner = await self.partition_owner(partition)
        if owner is not None:
            return ""
        if not await self._store.live_workers():
            return "; no worker runs on this keyspace: start `wakeful worker APP`"
        return f"; no worker holds partition {partition} yet"

    # -- workers ---------------------------------------------------------------

    async def workers(self) -> list[WorkerInfo]:
        """The live workers (registry ``<prefix>:workers``) and the partitions each holds."""
        live = await self._store.live_workers()
        holders = await self._store.lease_holders()
        window = 2 * self.settings.lease_ttl_ms
        return [
            WorkerInfo(
                id=worker,
                partitions=sorted(p for p, w in holders.items() if w == worker),
                last_heartbeat_ms=max(window - expires, 0),
                expires_in_ms=expires,
            )
            for worker, expires in sorted(live)
        ]

    async def partition_owners(self) -> dict[int, str | None]:
        """Partition -> the live worker holding its lease, or None if none serves it."""
        live = {w for w, _ in await self._store.live_workers()}
        holders = await self._store.lease_holders()
        return {p: w if w in live else None for p, w in holders.items()}

    async def partition_owner(self, partition: int) -> str | None:
        """The live worker serving ``partition``, or None."""
        return (await self.partition_owners())[partition]

    async def _until_notified(
        self, url: str, timeout: float, check: Callable[[], Awaitable[T | None]]
    ) -> T | None:
        """``check()`` until it gives a value: at once, on every notice on the entity's
        idle channel (its commits and its deletion publish there) and every quarter
        second regardless. None if ``timeout`` seconds pass first (after a last check)."""
        deadline = time.monotonic() + timeout
        channel = self._store.keys.idle_channel(url)
        assert self._notices is not None
        notice = await self._notices.watch(channel)
        try:
            while True:
                notice.clear()
                result = await check()
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

    # Last, so that ``list`` in the annotations above is the builtin, not this method.
    async def list(self, type_name: str | None = None) -> list[str]:
        """Urls of all entities of ``type_name``, or of every known type (sorted)."""
        if type_name is None:
            urls: list[str] = []
            for name in await self.types():
                urls.extend(await self._store.entity_urls(name))
            return sorted(urls)
        await self._check_type(type_name)
        return await self._store.entity_urls(type_name)
