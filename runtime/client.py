"""The client API: :class:`Runtime`.

``Runtime(registry)`` with no Redis URL is the embedded default: an in-process
fakeredis and a worker in the same process. With ``redis_url`` it is a client of
a shared Redis; pass ``run_worker=True`` to also run a worker in-process.

This module holds its lifecycle (start, close, the embedded worker) and its writes
(send, create, cancel, delete, compact, resume); the rest comes from its base
classes, one job each: ``client_events`` (the log followed), ``client_reads``
(an entity as committed), ``client_waiting`` (idle waits and ``ask``),
``client_workers``, ``client_actions``, ``client_schedules`` and ``client_log``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any, Literal

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
from .client_events import LogReads
from .client_log import LogExport
from .client_reads import StateReads
from .client_schedules import RecurringSchedules
from .client_waiting import IdleWaiting
from .client_workers import WorkerInfo as WorkerInfo
from .client_workers import WorkerListing
from .config import Settings
from .connection import connect
from .content_blocks import check_content
from .errors import (
    EntityNotFoundError,
    EventDecodeError,
    NotFailedError,
    UnknownEntityTypeError,
    WaitTimeoutError,
    WakefulError,
    describe,
)
from .events import (
    RUNTIME_EVENT_MAX_BYTES,
    CancelRequested,
    ConversationRequested,
    Created,
    DeleteRequested,
    EntityFailed,
    Message,
    Resumed,
    decode_entry,
    encode_event,
    pack,
)
from .json_values import json_builtins
from .keys import Keyspace, check_idempotency_key
from .notices import Notices
from .registry import Registry
from .retention import Exporter
from .store import Store, TargetMissingError
from .streamids import id_gt
from .urls import entity_url, parse_url
from .worker import Worker

log = logging.getLogger("wakeful.client")


class Runtime(
    LogReads,
    StateReads,
    IdleWaiting,
    WorkerListing,
    PendingActions,
    RecurringSchedules,
    LogExport,
    BulkReads,
):
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
        self._notices = Notices(self.store.channels)
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
            log.error(
                "the embedded worker stopped, no wake runs until a restart: %s", describe(error)
            )

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
        check_idempotency_key(idempotency_key)
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
        check_idempotency_key(idempotency_key)
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

    async def types(self) -> list[str]:
        """Entity types known here: this registry's and those workers published."""
        published = await self._store.published_type_names()
        return sorted({*self.registry.names(), *published})

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
