"""The client API: :class:`Runtime`.

``Runtime(registry)`` with no Redis URL is the embedded default: an in-process
fakeredis and a worker in the same process. With ``redis_url`` it is a client of
a shared Redis; pass ``run_worker=True`` to also run a worker in-process.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import msgspec
from redis.asyncio import Redis

from .actions import (
    ActionNotPendingError,
    Authorizer,
    answer_event,
    check_answer,
    check_client_tools,
    default_authorizer,
    expired,
)
from .config import Settings
from .connection import connect
from .contracts import Capability
from .errors import (
    EntityNotFoundError,
    EventDecodeError,
    RunFailedError,
    RunSuspendedError,
    UnknownEntityTypeError,
    WaitTimeoutError,
    WakefulError,
)
from .events import (
    ActionRequested,
    CancelRequested,
    Created,
    DeleteRequested,
    EntityFailed,
    HistoryEvent,
    LogRecord,
    Message,
    Resumed,
    RunFinished,
    UndecodableRecord,
    decode_entry,
    encode_event,
    pack,
)
from .fold import check_skipped, initial_state, rebuild
from .history import project
from .keys import Keyspace
from .live import LiveRecord, decode_live
from .notices import Notices
from .registry import Registry
from .state import ChildInfo, EntityState
from .status import EntityStatus, status_from_meta
from .store import Store, TargetMissingError
from .streamids import ZERO, id_gt
from .urls import entity_url, parse_url
from .worker import Worker

READ_COUNT = 1000  # entries per stream and read when following an entity


class Runtime:
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
    ) -> None:
        base = settings or Settings.from_env()
        if redis_url is not None:
            base = Settings(**{**_fields(base), "redis_url": redis_url})
        self.settings = base
        self.registry = registry or Registry()
        self.embedded = redis is None and base.redis_url is None
        self._run_worker = self.embedded if run_worker is None else run_worker
        self.capabilities = list(capabilities or [])
        self.action_authorizer = action_authorizer or default_authorizer
        self._redis = redis
        self._embedded_server: Any = None
        self.store: Store | None = None
        self.worker: Worker | None = None
        self._worker_task: asyncio.Task[None] | None = None
        self._published_types: dict[str, bytes] | None = None
        self._notices: Notices | None = None

    # -- lifecycle -------------------------------------------------------------

    async def start(self) -> Runtime:
        s = self.settings
        if self._redis is None:
            if self.embedded:
                from .embedded import embedded_redis

                self._redis = embedded_redis()
            else:
                self._redis = connect(s.redis_url)
        keys = Keyspace(s.prefix, s.partitions)
        self.store = Store(self._redis, keys, idempotency_ttl_ms=s.idempotency_ttl_s * 1000)
        self._notices = Notices(self._redis)
        await self.store.setup()
        if self._run_worker:
            self.worker = Worker(self.registry, self.store, s, capabilities=self.capabilities)
            self._worker_task = asyncio.create_task(self.worker.run(), name="wakeful-worker")
            await self._wait_worker_ready()
        return self

    async def _wait_worker_ready(self) -> None:
        assert self.worker is not None and self._worker_task is not None
        ready = asyncio.create_task(self.worker.ready.wait())
        await asyncio.wait({ready, self._worker_task}, return_when=asyncio.FIRST_COMPLETED)
        if self._worker_task.done():
            ready.cancel()
            self._worker_task.result()  # raises the worker's startup error

    async def close(self) -> None:
        if self.worker is not None and self._worker_task is not None:
            self.worker.stop()
            with contextlib.suppress(asyncio.CancelledError):
                await self._worker_task
        if self._notices is not None:
            await self._notices.aclose()
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
            raw = await self._store.redis.hgetall(self._store.keys.types)
            self._published_types = {k.decode(): v for k, v in raw.items()}
        if type_name not in self._published_types:
            known = sorted({*self.registry.names(), *self._published_types})
            raise UnknownEntityTypeError(type_name, known)

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
    ) -> str:
        """Append a message to the entity's log (creating the entity) and wake it.

        Returns the event id. The same ``idempotency_key`` twice returns the first
        event's id and appends nothing.
        """
        parsed = parse_url(url)
        await self._check_type(parsed.type)
        limit = self.settings.max_event_bytes
        message = encode_event(
            Message(
                payload=payload,
                sender=sender,
                identity=identity,
                client_data=client_data,
                idempotency_key=idempotency_key,
                client_tools=check_client_tools(client_tools) if client_tools is not None else None,
            ),
            limit=limit,
            what=f"message to {url}",
        )
        result = await self._store.append_input(
            url,
            parsed.type,
            created=encode_event(Created(type=parsed.type), limit=limit),
            events=[("i", message)],
            args=pack(None),
            idempotency_key=idempotency_key,
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
    ) -> str:
        """Create an entity with ``args`` (get-or-create) and optionally send it a message.

        If the entity exists with the same args, ``initial_message`` is delivered
        to it (use ``idempotency_key`` to make a retried call send it once); with
        different args it raises :class:`ArgsConflictError` and sends nothing.
        ``identity`` (trusted) and ``client_data`` (untrusted) travel with the
        initial message, as with :meth:`send`.
        """
        url = entity_url(type_name, entity_id)
        await self._check_type(type_name)
        if type_name in self.registry:
            args = self.registry.get(type_name).validate_args(args)
        else:
            args = msgspec.to_builtins(args)
        limit = self.settings.max_event_bytes
        message = None
        if initial_message is not None:
            message = encode_event(
                Message(
                    payload=initial_message,
                    sender=parent,
                    identity=identity,
                    client_data=client_data,
                    idempotency_key=idempotency_key,
                ),
                limit=limit,
                what=f"initial message to {url}",
            )
        await self._store.append_input(
            url,
            type_name,
            created=encode_event(
                Created(type=type_name, args=args, parent=parent), limit=limit, what="args"
            ),
            events=[("i", message)] if message is not None else [],
            args=pack(args),
            parent=parent or "",
            mode="create",
            idempotency_key=idempotency_key,
        )
        return url

    async def cancel(self, url: str, reason: str = "cancelled by client") -> str:
        """Cancel the entity's current run (it finishes as cancelled, subscribers are
        woken) and its children whose parent-close policy is ``cancel``."""
        event_id = await self._append_existing(url, CancelRequested(reason=reason, by="client"))
        # Stop the run now if a worker is running it; the input covers every other case.
        await self._store.redis.publish(self._store.keys.cancel_channel(url), reason)
        return event_id

    async def delete(self, url: str, *, wait: bool = True, timeout: float = 30.0) -> None:
        """Delete the entity: its run is cancelled, children handled per their
        parent-close policy, then its log, metadata and snapshot are removed."""
        await self._append_existing(url, DeleteRequested(by="client"))
        if not wait:
            return
        deadline = time.monotonic() + timeout
        while await self._store.meta(url):
            if time.monotonic() > deadline:
                raise WaitTimeoutError(f"{url} was not deleted within {timeout}s")
            await asyncio.sleep(0.02)

    async def _append_existing(self, url: str, event: CancelRequested | DeleteRequested) -> str:
        parsed = parse_url(url)
        try:
            result = await self._store.append_input(
                url,
                parsed.type,
                created=b"",
                events=[("i", encode_event(event))],
                mode="existing",
            )
        except TargetMissingError:
            raise EntityNotFoundError(url) from None
        return result.id

    async def resume(self, url: str, *, skip_failed: bool = False) -> None:
        """Un-park a failed entity. Its unprocessed inputs run again, unless ``skip_failed``
        moves the cursor past the inputs of the failure (dead-lettering them)."""
        meta = await self._meta(url)
        if meta.get("status") != b"failed":
            raise WakefulError(f"entity {url} is not failed; nothing to resume")
        skipped: list[str] = []
        if skip_failed:
            failure = await self._last_failure(url)
            skipped = failure.inputs if failure else []
        s = self._store
        k = s.keys
        fields: dict[str, Any] = {"status": "active", "attempts": 0, "error": ""}
        cursor = meta["cursor"].decode()
        for skip in skipped:
            if id_gt(skip, cursor):
                cursor = skip
        fields["cursor"] = cursor
        fields["woke"] = "1"  # with the pointer added below
        pipe = s.redis.pipeline(transaction=True)
        pipe.hset(k.meta(url), mapping=fields)
        pipe.xadd(k.log(url), {"e": encode_event(Resumed(skipped=skipped), limit=1 << 30)})
        pipe.xadd(k.inbox(k.partition(url)), {"u": url})
        await pipe.execute()

    async def _last_failure(self, url: str) -> EntityFailed | None:
        entries = await self._store.redis.xrevrange(self._store.keys.log(url), count=200)
        for entry_id, fields in entries:
            with contextlib.suppress(EventDecodeError):
                record = decode_entry(entry_id.decode(), fields, url)
                if isinstance(record.event, EntityFailed):
                    return record.event
        return None

    # -- reading ---------------------------------------------------------------

    # -- pending actions (client tools and approvals) ----------------------------

    async def pending_actions(self, url: str) -> list[ActionRequested]:
        """Tool calls of ``url`` that wait for a client's output or an approval."""
        return list((await self._folded(url)).system.actions.values())

    async def submit_tool_result(
        self, url: str, tool_call_id: str, output: Any, *, identity: dict[str, str] | None = None
    ) -> str:
        """Answer a client-routed tool call. The output is checked against the tool's
        output schema first: an invalid one is refused and the action stays pending."""
        return await self._answer(url, tool_call_id, "output", identity, output=output)

    async def fail_action(
        self, url: str, tool_call_id: str, error: str, *, identity: dict[str, str] | None = None
    ) -> str:
        return await self._answer(url, tool_call_id, "failed", identity, error=error)

    async def cancel_action(
        self, url: str, tool_call_id: str, *, identity: dict[str, str] | None = None
    ) -> str:
        return await self._answer(url, tool_call_id, "cancelled", identity, error="cancelled")

    async def approve(
        self,
        url: str,
        tool_call_id: str,
        *,
        edited_input: Any = None,
        identity: dict[str, str] | None = None,
    ) -> str:
        """Approve a call waiting for approval; ``edited_input`` replaces its input
        (checked against the tool's input schema)."""
        return await self._answer(
            url, tool_call_id, "approved", identity, edited_input=edited_input
        )

    async def deny(
        self, url: str, tool_call_id: str, reason: str, *, identity: dict[str, str] | None = None
    ) -> str:
        """Deny a call waiting for approval; the model gets ``reason`` and can act on it."""
        return await self._answer(url, tool_call_id, "denied", identity, error=reason)

    async def _answer(
        self,
        url: str,
        tool_call_id: str,
        decision: str,
        identity: dict[str, str] | None,
        **fields: Any,
    ) -> str:
        action = (await self._folded(url)).system.actions.get(tool_call_id)
        if action is not None and expired(action):
            event = answer_event(tool_call_id, "expired", None, error="expired before an answer")
            await self._store.settle_action(url, tool_call_id, encode_event(event))
            raise ActionNotPendingError(f"tool call {tool_call_id!r} of {url} expired")
        check_answer(
            action,
            url,
            tool_call_id,
            decision,
            identity,
            self.action_authorizer,
            **{k: v for k, v in fields.items() if k in ("output", "edited_input")},
        )
        event = encode_event(
            answer_event(tool_call_id, decision, identity, **fields),
            limit=self.settings.max_event_bytes,
            what=f"answer to tool call {tool_call_id!r}",
        )
        event_id = await self._store.settle_action(url, tool_call_id, event)
        if event_id is None:
            raise ActionNotPendingError(f"tool call {tool_call_id!r} of {url} was answered already")
        return event_id

    async def history(self, url: str) -> list[HistoryEvent]:
        """The agent journal of ``url``: user turns, assistant steps, tool intents and results."""
        return list((await self._folded(url)).system.history)

    async def conversation(self, url: str) -> list[dict[str, Any]]:
        """The conversation as the model sees it (Messages API messages)."""
        return project(await self.history(url))

    async def children(self, url: str) -> list[ChildInfo]:
        """The entities ``url`` spawned, with the status of their last finished run."""
        return list((await self._folded(url)).system.children.values())

    async def _meta(self, url: str) -> dict[str, bytes]:
        parse_url(url)
        meta = await self._store.meta(url)
        if not meta:
            raise EntityNotFoundError(url)
        return meta

    async def status(self, url: str) -> EntityStatus:
        return status_from_meta(url, await self._meta(url))

    async def list(self, type_name: str) -> list[str]:
        """Urls of all entities of ``type_name``."""
        await self._check_type(type_name)
        return await self._store.entity_urls(type_name)

    async def state(self, url: str) -> dict[str, list[Any]]:
        """The entity's collections as committed (snapshot + log), as plain data."""
        return (await self._folded(url)).to_builtins()

    async def _folded(self, url: str) -> EntityState:
        meta = await self._meta(url)
        collections = {}
        type_name = meta["type"].decode()
        if type_name in self.registry:
            collections = self.registry.get(type_name).state
        loaded = await self._store.load(url, None)
        snap_out = (loaded.meta.get("snap_out") or b"").decode()
        state = initial_state(collections, loaded.snapshot, snap_out)
        cursor = (loaded.meta.get("cursor") or b"").decode()
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
    ) -> AsyncIterator[LogRecord | UndecodableRecord | LiveRecord]:
        """The entity log after ``after``; with ``follow`` it waits for new events forever.

        With ``live=True`` it also follows the live stream (text deltas and tool
        progress, as :class:`LiveRecord`), from ``live_after`` or from now; a
        client that reconnects passes the last ids it saw of each stream. An
        entry that fails to decode is yielded as an :class:`UndecodableRecord`
        with its stream id, never skipped.
        """
        parse_url(url)
        keys = self._store.keys
        log_key, live_key = keys.log(url), keys.live(url)
        positions = {log_key: after or ZERO}
        if live:
            positions[live_key] = live_after or await self._live_tail(live_key)
            follow = True
        while True:
            batches = await self._store.read_streams(positions, None, READ_COUNT)
            if not batches and follow:
                batches = await self._store.read_streams(positions, block_ms, READ_COUNT)
            if not batches and not follow:
                return
            for key, entry_id, fields in _merged(batches, live_key, READ_COUNT):
                positions[key] = entry_id
                if key == live_key:
                    yield decode_live(entry_id, fields)
                    continue
                try:
                    yield decode_entry(entry_id, fields, url)
                except EventDecodeError as exc:
                    yield UndecodableRecord(entry_id, exc.reason, fields.get(b"e", b""))

    async def _live_tail(self, key: str) -> str:
        last = await self._store.redis.xrevrange(key, count=1)
        return last[0][0].decode() if last else ZERO

    async def log_position(self, url: str, *, back: int) -> str | None:
        """The id to pass as ``after`` to read only the last ``back`` entries of the log
        (None when the log has no more than that)."""
        parse_url(url)
        if back < 1:
            raise WakefulError(f"back must be at least 1, got {back}")
        newest = await self._store.redis.xrevrange(self._store.keys.log(url), count=back + 1)
        return newest[-1][0].decode() if len(newest) > back else None

    async def live_position(self, url: str) -> str:
        """The id of the newest live event of ``url``: pass it as ``live_after`` to follow
        only the live output that comes after this moment (take it before sending)."""
        parse_url(url)
        return await self._live_tail(self._store.keys.live(url))

    async def stream_until_idle(
        self,
        url: str,
        *,
        after: str | None = None,
        live_after: str | None = None,
        timeout: float = 60.0,
    ) -> AsyncIterator[LogRecord | UndecodableRecord | LiveRecord]:
        """The log (after ``after``) and live output (after ``live_after``) of ``url``
        until the entity is idle: every input handled, no awaited child running, or
        suspended on pending actions, or failed. Ends once every log entry written up
        to that moment has been yielded. Raises :class:`WaitTimeoutError` after
        ``timeout`` seconds without reaching idle.
        """
        parse_url(url)
        queue: asyncio.Queue[Any] = asyncio.Queue()
        done = object()
        position = {"read": after or ZERO, "tail": None}

        async def read() -> None:
            try:
                records = self.events(url, after=after, live=True, live_after=live_after)
                async for record in records:
                    queue.put_nowait(record)
                    if isinstance(record, LiveRecord):
                        continue
                    position["read"] = record.id
                    tail = position["tail"]
                    if tail is not None and not id_gt(tail, record.id):
                        break
            except Exception as exc:
                queue.put_nowait(exc)
            queue.put_nowait(done)

        async def watch() -> None:
            try:
                await self.wait_idle(url, timeout=timeout)
                last = await self._store.redis.xrevrange(self._store.keys.log(url), count=1)
                tail = position["tail"] = last[0][0].decode() if last else ZERO
                if not id_gt(tail, position["read"]):
                    reader.cancel()
                    queue.put_nowait(done)
            except Exception as exc:
                reader.cancel()
                queue.put_nowait(exc)

        reader = asyncio.create_task(read())
        watcher = asyncio.create_task(watch())
        try:
            while (item := await queue.get()) is not done:
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            for task in (reader, watcher):
                task.cancel()
            await asyncio.gather(reader, watcher, return_exceptions=True)

    async def types(self) -> list[str]:
        """Entity types known here: this registry's and those workers published."""
        raw = await self._store.redis.hkeys(self._store.keys.types)
        return sorted({*self.registry.names(), *(k.decode() for k in raw)})

    async def lease_owner(self, url: str) -> str | None:
        """``<worker>:<epoch>`` holding the lease of the partition ``url`` lives in."""
        parse_url(url)
        return await self._store.lease_owner(self._store.keys.partition(url))

    async def lag(self, url: str) -> tuple[int, int]:
        """``(inputs, ms)``: inputs appended but not yet handled, and the age of the oldest."""
        cursor = (await self._meta(url)).get("cursor", b"0-0").decode()
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
        delivered, no timers pending, and no child it awaits still running; or failed."""
        deadline = time.monotonic() + timeout
        channel = self._store.keys.idle_channel(url)
        assert self._notices is not None
        notice = await self._notices.watch(channel)
        try:
            while True:
                notice.clear()
                status = await self.status(url)
                if status.status in ("idle", "failed"):
                    return status
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise WaitTimeoutError(
                        f"{url} is still {status.status} after {timeout}s (cursor "
                        f"{status.cursor}, last input {status.last_input}, awaited children "
                        f"{status.awaited_children}, timers {status.timers}, undelivered "
                        f"effects {status.undelivered})"
                    )
                # A notice wakes us at once; re-check now and then regardless.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(notice.wait(), min(remaining, 0.25))
        finally:
            await self._notices.unwatch(channel, notice)

    async def ask(self, url: str, text: Any, *, timeout: float = 60.0, **send_options: Any) -> str:
        """Send ``text``, wait until the entity and the children it awaits are idle,
        and return the response of the last run that finished after the message.

        Raises :class:`RunFailedError` if that run failed or was cancelled, and
        :class:`WakefulError` if no run finished.
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
            raise RunFailedError(url, last.status, last.error)
        return last.response or ""


def _merged(
    batches: dict[str, list[tuple[str, dict[bytes, bytes]]]], live_key: str, count: int
) -> list[tuple[str, str, dict[bytes, bytes]]]:
    """Entries of the log and the live stream in time order (by the millisecond of their
    ids). Within one millisecond live output comes first: a step's deltas are written
    before the step is committed.

    A batch of ``count`` entries may have been cut short: entries of the other stream
    later than its last millisecond are left for the next read, which returns the
    rest of the cut stream first.
    """

    def ms(entry_id: str) -> int:
        return int(entry_id.split("-", 1)[0])

    cut = [ms(batch[-1][0]) for batch in batches.values() if len(batch) >= count]
    until = min(cut) if cut else None
    entries = [
        (ms(entry_id), key != live_key, index, key, entry_id, fields)
        for key, batch in batches.items()
        for index, (entry_id, fields) in enumerate(batch)
        if until is None or ms(entry_id) <= until
    ]
    entries.sort(key=lambda e: e[:3])
    return [(key, entry_id, fields) for *_, key, entry_id, fields in entries]


def _fields(settings: Settings) -> dict[str, Any]:
    import dataclasses

    return {f.name: getattr(settings, f.name) for f in dataclasses.fields(settings)}
