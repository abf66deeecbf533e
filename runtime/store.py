"""All Redis access of the runtime: the scripts and the few plain commands.

Nothing above this module speaks a Redis command, so the data path is:
client -> :meth:`Store.append_input` (SEND script) -> inbox -> worker
:meth:`Store.read_inbox` -> :meth:`Store.load` (LOAD script) -> handler ->
:meth:`Store.commit` (COMMIT script). Replies are decoded in ``replies.py``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

from redis.asyncio import Redis
from redis.asyncio.client import Pipeline
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.typing import KeyT, StreamIdT

from . import lua
from .batching import AutoPipeline
from .errors import ArgsConflictError, ConfigError, FencedError
from .keys import GROUP, Keyspace
from .replies import EntityMeta, Entry, as_str, parse_meta, stream_entries
from .streamids import ZERO

__all__ = ["TRANSIENT_ERRORS", "EntityMeta", "Entry", "Loaded", "Pointer", "SendResult", "Store"]

# The store's connections speak RESP2 and do not decode (decode_responses=False), so
# replies are lists and bytes; redis-py's annotations cover every protocol and mode,
# and the casts below narrow them to that shape.

# Errors that mean "Redis is unreachable for now": callers retry later, nothing is lost.
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    RedisConnectionError,
    RedisTimeoutError,
    OSError,
)


class Script:
    """A Lua script and its SHA1, to run it by ``EVALSHA``."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()


SEND = Script(lua.SEND)
LOAD = Script(lua.LOAD)
COMMIT = Script(lua.COMMIT)
ACQUIRE = Script(lua.ACQUIRE)
RENEW = Script(lua.RENEW)
RELEASE = Script(lua.RELEASE)
HEARTBEAT = Script(lua.HEARTBEAT)
FIRE = Script(lua.FIRE)
DELETE = Script(lua.DELETE)
CANCEL_TIMER = Script(lua.CANCEL_TIMER)
SETTLE = Script(lua.SETTLE)
RESUME = Script(lua.RESUME)
ALL_SCRIPTS = (
    SEND,
    LOAD,
    COMMIT,
    FIRE,
    DELETE,
    CANCEL_TIMER,
    SETTLE,
    RESUME,
    ACQUIRE,
    RENEW,
    RELEASE,
    HEARTBEAT,
)


class TargetMissingError(Exception):
    """A delivery that must not create its target found no entity there."""


class EntityGoneError(Exception):
    """The entity was deleted (or deleted and re-created) while a wake ran."""


@dataclass(frozen=True, slots=True)
class SendResult:
    id: str  # the last event appended (or the one an idempotency key found)
    created_id: str  # the entity's incarnation
    appended: bool


@dataclass(frozen=True, slots=True)
class Loaded:
    """What a wake reads: the metadata, the snapshot and the log after it."""

    meta: dict[str, bytes]  # the raw hash (empty if the entity is gone)
    info: EntityMeta | None  # the same, parsed (None if the entity is gone)
    snapshot: bytes | None
    entries: list[Entry]


@dataclass(frozen=True, slots=True)
class StreamBatch:
    """New entries of an entity's log and live stream (see :meth:`Store.read_entity`)."""

    log: list[Entry]
    live: list[Entry]


@dataclass(frozen=True, slots=True)
class Pointer:
    """A wake pointer read from a partition inbox."""

    partition: int
    entry_id: str
    url: str


class Store:
    """The runtime's one Redis speaker: scripts for every atomic change, plain reads."""

    def __init__(self, redis: Redis, keys: Keyspace, *, idempotency_ttl_ms: int) -> None:
        self.redis = redis
        self.keys = keys
        self.idempotency_ttl_ms = idempotency_ttl_ms
        self.batch = AutoPipeline(redis)

    # -- setup ---------------------------------------------------------------

    async def setup(self) -> None:
        """Load the scripts and check the partition count against the keyspace."""
        await self.load_scripts()
        await self.redis.hsetnx(self.keys.config, "partitions", self.keys.partitions)
        stored = int(await self.redis.hget(self.keys.config, "partitions") or 0)
        if stored != self.keys.partitions:
            raise ConfigError(
                f"keyspace {self.keys.prefix!r} was set up with {stored} partitions, "
                f"but this process is configured with {self.keys.partitions}; "
                "set WAKEFUL_PARTITIONS to match"
            )

    async def load_scripts(self) -> None:
        pipe = self.redis.pipeline(transaction=False)
        for script in ALL_SCRIPTS:
            pipe.script_load(script.source)
        await pipe.execute()

    async def _run(self, script: Script, keys: list[str], args: list[Any]) -> Any:
        """Run a script through the auto-pipeline, reloading it after a Redis restart."""

        def stage(pipe: Pipeline) -> None:
            pipe.evalsha(script.sha, len(keys), *keys, *args)

        for attempt in (0, 1):
            try:
                return await self.batch.execute(stage)
            except NoScriptError:
                if attempt:
                    raise
                await self.load_scripts()
            except ResponseError as exc:
                if attempt or "NOSCRIPT" not in str(exc):
                    raise
                await self.load_scripts()
        raise AssertionError("unreachable")

    # -- inputs --------------------------------------------------------------

    async def append_input(
        self,
        url: str,
        type_name: str,
        *,
        created: bytes,
        events: Sequence[tuple[str, bytes]] = (),
        args: bytes = b"",
        parent: str = "",
        mode: str = "send",
        idempotency_key: str | None = None,
    ) -> SendResult:
        """Append events to an entity's log and a wake pointer to its inbox, atomically.

        ``events`` are ``(flag, encoded event)`` pairs, flag ``"i"`` for inputs.
        ``mode`` is ``send`` (create the entity if missing), ``create``
        (get-or-create with ``args``; raises :class:`ArgsConflictError`) or
        ``existing`` (raises :class:`TargetMissingError` if missing).
        """
        k = self.keys
        p = k.partition(url)
        idem_key = k.idem(url, idempotency_key) if idempotency_key else k.idem(url, "-")
        reply = await self._run(
            SEND,
            [k.log(url), k.meta(url), k.inbox(p), idem_key, k.typeset(p, type_name)],
            [
                url,
                type_name,
                str(self.idempotency_ttl_ms) if idempotency_key else "",
                mode,
                args,
                created,
                parent,
                len(events),
                *(x for pair in events for x in pair),
            ],
        )
        code, event_id, created_id = int(reply[0]), as_str(reply[1]), as_str(reply[2])
        if code == -1:
            raise ArgsConflictError(url)
        if code == -2:
            raise TargetMissingError(url)
        return SendResult(event_id, created_id, code == 1)

    async def publish_cancel(self, url: str, reason: str) -> None:
        """Tell the worker running ``url`` (if any) to stop its run now."""
        await self.redis.publish(self.keys.cancel_channel(url), reason)

    async def resume(self, url: str, resumed: bytes, skipped: Sequence[str] = ()) -> bool:
        """Un-park a failed entity (RESUME script): active again, the cursor moved past
        ``skipped`` inputs, ``resumed`` (the encoded Resumed event) appended, and a wake
        pointer unless it has one. False if the entity is not failed."""
        k = self.keys
        reply = await self._run(
            RESUME,
            [k.meta(url), k.log(url), k.inbox(k.partition(url))],
            [url, resumed, *skipped],
        )
        return int(reply) == 1

    # -- reading -------------------------------------------------------------

    async def load(self, url: str, after: str | None, page: int = 1000) -> Loaded:
        """Metadata plus the log after ``after`` (or after the snapshot when None)."""
        k = self.keys
        meta_flat, snapshot, raw = await self._run(
            LOAD, [k.meta(url), k.snap(url), k.log(url)], [after or "", page]
        )
        meta = {as_str(f): v for f, v in zip(meta_flat[::2], meta_flat[1::2], strict=True)}
        log = stream_entries(raw)
        while len(raw) == page:
            raw = await self.redis.xrange(k.log(url), f"({log[-1][0]}", "+", count=page)
            log.extend(stream_entries(raw))
        return Loaded(meta, parse_meta(meta), snapshot, log)

    async def read_log(self, url: str, after: str | None = None, count: int = 1000) -> list[Entry]:
        start = f"({after}" if after and after != ZERO else "-"
        return stream_entries(await self.redis.xrange(self.keys.log(url), start, "+", count=count))

    async def newest_log_entries(self, url: str, count: int) -> list[Entry]:
        """The last ``count`` entries of the entity's log, newest first."""
        return stream_entries(await self.redis.xrevrange(self.keys.log(url), count=count))

    async def newest_live_id(self, url: str) -> str:
        """The id of the newest entry of the entity's live stream (``0-0`` if none)."""
        last = stream_entries(await self.redis.xrevrange(self.keys.live(url), count=1))
        return last[0][0] if last else ZERO

    async def append_live(self, url: str, events: list[bytes], maxlen: int = 1000) -> None:
        key = self.keys.live(url)

        def stage(pipe: Pipeline) -> None:
            for data in events:
                pipe.xadd(key, {"e": data}, maxlen=maxlen, approximate=True)

        await self.batch.execute(stage)

    async def read_entity(
        self, url: str, log_after: str, live_after: str | None, block_ms: int | None, count: int
    ) -> StreamBatch | None:
        """New entries of the entity's log after ``log_after`` and, unless ``live_after``
        is None, of its live stream after ``live_after``: one XREAD (both keys are in
        the entity's partition), blocking up to ``block_ms``. None if there are none."""
        log_key, live_key = self.keys.log(url), self.keys.live(url)
        positions: dict[KeyT, StreamIdT] = {log_key: log_after}
        if live_after is not None:
            positions[live_key] = live_after
        reply = cast(
            "list[list[Any]] | None",
            await self.redis.xread(positions, count=count, block=block_ms),
        )
        if not reply:
            return None
        by_key = {as_str(key): stream_entries(raw) for key, raw in reply}
        return StreamBatch(by_key.get(log_key, []), by_key.get(live_key, []))

    async def meta(self, url: str) -> dict[str, bytes]:
        """The raw metadata hash (empty if there is no such entity)."""
        raw = cast("dict[bytes, bytes]", await self.redis.hgetall(self.keys.meta(url)))
        return {as_str(f): v for f, v in raw.items()}

    async def entity_meta(self, url: str) -> EntityMeta | None:
        """The parsed metadata (None if there is no such entity)."""
        return parse_meta(await self.meta(url))

    async def snapshot(self, url: str) -> bytes | None:
        return cast("bytes | None", await self.redis.get(self.keys.snap(url)))

    async def entity_urls(self, type_name: str) -> list[str]:
        pipe = self.redis.pipeline(transaction=False)
        for p in range(self.keys.partitions):
            pipe.smembers(self.keys.typeset(p, type_name))
        members = await pipe.execute()
        return sorted(as_str(url) for group in members for url in group)

    async def published_types(self) -> dict[str, bytes]:
        """Manifests the workers published: type name -> manifest JSON."""
        raw = cast("dict[bytes, bytes]", await self.redis.hgetall(self.keys.types))
        return {as_str(name): manifest for name, manifest in raw.items()}

    async def published_type_names(self) -> list[str]:
        """Names of the types the workers published."""
        return [as_str(name) for name in await self.redis.hkeys(self.keys.types)]

    # -- commits -------------------------------------------------------------

    async def commit(
        self,
        url: str,
        token: str,
        *,
        events: Sequence[tuple[str, bytes]] = (),
        cursor: str = "",
        acks: Sequence[str] = (),
        fields: dict[str, Any] | None = None,
        created: str = "",
        snapshot: bytes = b"",
        snapshot_seen: str = "",
        snapshot_out: str = "",
        timers: Sequence[tuple[str, int, bytes]] = (),
        actions: Sequence[str] = (),
    ) -> list[str]:
        """Fenced commit: append events, ack wake pointers, advance the cursor, add timers.

        ``events`` are ``(flag, encoded event)`` pairs: ``"e"`` plain, ``"i"``
        input, ``"o"`` outbox. A snapshot holds every event up to
        ``snapshot_seen`` (the last entry the wake read) and every output up to
        the last output this commit appends (or ``snapshot_out`` if it appends
        none); see ``state.fold``. Raises :class:`FencedError` if ``token`` no longer
        holds the partition lease, :class:`EntityGoneError` if the entity's
        incarnation changed.
        """
        k = self.keys
        p = k.partition(url)
        flat_fields = [x for pair in (fields or {}).items() for x in pair]
        reply = await self._run(
            COMMIT,
            [
                k.lease(p),
                k.log(url),
                k.meta(url),
                k.inbox(p),
                k.snap(url),
                k.timers(p),
                k.timerdata(p),
                k.actions(url),
            ],
            [
                token,
                GROUP,
                cursor,
                created,
                snapshot,
                snapshot_seen,
                snapshot_out,
                k.idle_channel(url),
                url,
                len(events),
                len(acks),
                len(flat_fields),
                len(timers),
                len(actions),
                *(x for pair in events for x in pair),
                *acks,
                *flat_fields,
                *(x for timer in timers for x in timer),
                *actions,
            ],
        )
        status = as_str(reply[0])
        if status == "FENCED":
            raise FencedError(f"commit for {url} refused: lease {token} of partition {p} is lost")
        if status == "GONE":
            raise EntityGoneError(url)
        return [as_str(i) for i in reply[1:]]

    async def delete(self, url: str, token: str, created: str, acks: list[str]) -> bool:
        """Fenced: delete the entity's log, metadata and snapshot."""
        k = self.keys
        p = k.partition(url)
        type_name = url.split("/")[1]
        reply = await self._run(
            DELETE,
            [
                k.lease(p),
                k.log(url),
                k.meta(url),
                k.snap(url),
                k.typeset(p, type_name),
                k.inbox(p),
                k.actions(url),
            ],
            [token, created, url, GROUP, k.idle_channel(url), *acks],
        )
        if int(reply) == -1:
            raise FencedError(f"delete of {url} refused: lease {token} of partition {p} is lost")
        return int(reply) == 1

    # -- timers --------------------------------------------------------------

    async def due_timers(
        self, partitions: list[int], now_ms: int, limit: int = 100
    ) -> list[tuple[int, str]]:
        pipe = self.redis.pipeline(transaction=False)
        for p in partitions:
            pipe.zrangebyscore(self.keys.timers(p), "-inf", now_ms, start=0, num=limit)
        replies = await pipe.execute()
        return [
            (p, as_str(m)) for p, members in zip(partitions, replies, strict=True) for m in members
        ]

    async def next_timer_ms(self, partitions: list[int]) -> int | None:
        pipe = self.redis.pipeline(transaction=False)
        for p in partitions:
            pipe.zrange(self.keys.timers(p), 0, 0, withscores=True)
        replies = await pipe.execute()
        dues = [int(score) for reply in replies for _, score in reply]
        return min(dues) if dues else None

    async def settle_action(self, url: str, tool_call_id: str, event: bytes) -> str | None:
        """Append the answer to a pending action, unless it was answered already.

        Returns the event id, or None if the action is not pending (unknown, or
        settled by a concurrent answer)."""
        k = self.keys
        p = k.partition(url)
        reply = await self._run(
            SETTLE,
            [k.actions(url), k.log(url), k.meta(url), k.inbox(p)],
            [tool_call_id, event, url],
        )
        return as_str(reply[1]) if int(reply[0]) == 1 else None

    async def timers_of(self, url: str, created: str) -> list[tuple[str, int, bytes]]:
        """Pending timers of one incarnation of ``url``: (member, due ms, data)."""
        k = self.keys
        p = k.partition(url)
        # Urls and stream ids contain no glob characters (see urls.py).
        pattern = f"{url}|{created}|*"
        found: list[tuple[str, int]] = []
        async for member, score in self.redis.zscan_iter(k.timers(p), match=pattern, count=500):
            found.append((as_str(member), int(score)))
        if not found:
            return []
        data = cast(
            "list[bytes | None]", await self.redis.hmget(k.timerdata(p), [m for m, _ in found])
        )
        return sorted(
            ((m, due, d) for (m, due), d in zip(found, data, strict=True) if d is not None),
            key=lambda t: t[1],
        )

    async def cancel_timer(self, url: str, token: str, member: str) -> bool:
        """Fenced: remove a pending timer of ``url``; False if it fired or is gone."""
        k = self.keys
        p = k.partition(url)
        reply = int(
            await self._run(
                CANCEL_TIMER,
                [k.lease(p), k.timers(p), k.timerdata(p), k.meta(url)],
                [token, member],
            )
        )
        if reply == -1:
            raise FencedError(f"cancelling a timer of {url} refused: lease {token} is lost")
        return reply == 1

    async def fire_timer(self, partition: int, token: str, member: str) -> int:
        url, created, _ = member.split("|", 2)
        k = self.keys
        return int(
            await self._run(
                FIRE,
                [
                    k.lease(partition),
                    k.timers(partition),
                    k.timerdata(partition),
                    k.meta(url),
                    k.log(url),
                    k.inbox(partition),
                ],
                [token, member, url, created],
            )
        )

    # -- partitions: leases, inbox -------------------------------------------

    async def heartbeat(self, worker_id: str, ttl_ms: int | None) -> list[str]:
        reply = await self._run(
            HEARTBEAT, [self.keys.workers], [worker_id, "" if ttl_ms is None else ttl_ms]
        )
        return [as_str(w) for w in reply]

    async def acquire(self, partition: int, worker_id: str, ttl_ms: int) -> str | None:
        k = self.keys
        reply = await self._run(
            ACQUIRE, [k.lease(partition), k.epoch(partition)], [worker_id, ttl_ms]
        )
        return as_str(reply) if reply else None

    async def renew(self, partition: int, token: str, ttl_ms: int) -> bool:
        return bool(await self._run(RENEW, [self.keys.lease(partition)], [token, ttl_ms]))

    async def release(self, partition: int, token: str) -> bool:
        return bool(await self._run(RELEASE, [self.keys.lease(partition)], [token]))

    async def lease_owner(self, partition: int) -> str | None:
        value = await self.redis.get(self.keys.lease(partition))
        return as_str(value) if value else None

    async def ensure_group(self, partition: int) -> None:
        try:
            await self.redis.xgroup_create(self.keys.inbox(partition), GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def read_inbox(
        self, partitions: list[int], consumer: str, count: int, block_ms: int
    ) -> list[Pointer]:
        streams: dict[KeyT, StreamIdT] = {self.keys.inbox(p): ">" for p in partitions}
        reply = cast(
            "list[list[Any]] | None",
            await self.redis.xreadgroup(GROUP, consumer, streams, count=count, block=block_ms),
        )
        by_key = {self.keys.inbox(p): p for p in partitions}
        return [
            Pointer(by_key[as_str(stream)], as_str(entry_id), as_str(fields[b"u"]))
            for stream, entries in (reply or [])
            for entry_id, fields in entries
            if fields
        ]

    async def claim_pending(
        self, partition: int, consumer: str, min_idle_ms: int, count: int = 1000
    ) -> list[Pointer]:
        """Take over pointers read but never acked by anyone (a crashed or fenced owner)."""
        key = self.keys.inbox(partition)
        out: list[Pointer] = []
        start = "0-0"
        while True:
            reply = await self.redis.xautoclaim(
                key, GROUP, consumer, min_idle_ms, start_id=start, count=count
            )
            next_start, entries = as_str(reply[0]), reply[1]
            out.extend(
                Pointer(partition, as_str(eid), as_str(fields[b"u"]))
                for eid, fields in entries
                if fields
            )
            if next_start == "0-0":
                return out
            start = next_start
