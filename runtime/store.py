"""All Redis access of the runtime: the scripts and the few plain commands.

Nothing above this module builds a key or speaks a Redis command, so the data
path is: client -> :meth:`Store.append_input` (SEND script) -> inbox ->
worker :meth:`Store.read_inbox` -> :meth:`Store.load` (LOAD script) -> handler
-> :meth:`Store.commit` (COMMIT script).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from . import lua
from .batching import AutoPipeline
from .errors import ArgsConflictError, ConfigError, EntityGoneError, FencedError, TargetMissingError
from .keys import GROUP, Keyspace

Entry = tuple[str, dict[bytes, bytes]]

# Errors that mean "Redis is unreachable for now": callers retry later, nothing is lost.
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    RedisConnectionError,
    RedisTimeoutError,
    OSError,
)


class Script:
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
ALL_SCRIPTS = (
    SEND,
    LOAD,
    COMMIT,
    FIRE,
    DELETE,
    CANCEL_TIMER,
    SETTLE,
    ACQUIRE,
    RENEW,
    RELEASE,
    HEARTBEAT,
)


@dataclass(frozen=True, slots=True)
class SendResult:
    id: str
    created_id: str
    appended: bool


@dataclass(frozen=True, slots=True)
class Loaded:
    meta: dict[str, bytes]
    snapshot: bytes | None
    entries: list[Entry]


@dataclass(frozen=True, slots=True)
class Pointer:
    """A wake pointer read from a partition inbox."""

    partition: int
    entry_id: str
    url: str


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _entries(raw: list[Any]) -> list[Entry]:
    """Normalise stream entries from a Lua reply ([id, [f, v, ...]]) or redis-py."""
    out: list[Entry] = []
    for entry_id, fields in raw:
        if isinstance(fields, list):
            fields = dict(zip(fields[::2], fields[1::2], strict=True))
        out.append((_s(entry_id), fields or {}))
    return out


class Store:
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
        stored = int(await self.redis.hget(self.keys.config, "partitions"))
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
        for attempt in (0, 1):
            try:
                return await self.batch.execute(
                    lambda pipe: pipe.evalsha(script.sha, len(keys), *keys, *args)
                )
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
        events: list[tuple[str, bytes]] = (),  # type: ignore[assignment]
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
        code, event_id, created_id = int(reply[0]), _s(reply[1]), _s(reply[2])
        if code == -1:
            raise ArgsConflictError(url)
        if code == -2:
            raise TargetMissingError(url)
        return SendResult(event_id, created_id, code == 1)

    # -- reading -------------------------------------------------------------

    async def load(self, url: str, after: str | None, page: int = 1000) -> Loaded:
        """Metadata plus the log after ``after`` (or after the snapshot when None)."""
        k = self.keys
        meta_flat, snapshot, raw = await self._run(
            LOAD, [k.meta(url), k.snap(url), k.log(url)], [after or "", page]
        )
        meta = {_s(f): v for f, v in zip(meta_flat[::2], meta_flat[1::2], strict=True)}
        entries = _entries(raw)
        while len(raw) == page:
            raw = await self.redis.xrange(k.log(url), f"({entries[-1][0]}", "+", count=page)
            entries.extend(_entries(raw))
        return Loaded(meta, snapshot, entries)

    async def read_log(self, url: str, after: str | None = None, count: int = 1000) -> list[Entry]:
        start = f"({after}" if after and after != "0-0" else "-"
        return _entries(await self.redis.xrange(self.keys.log(url), start, "+", count=count))

    async def append_live(self, url: str, events: list[bytes], maxlen: int = 1000) -> None:
        key = self.keys.live(url)

        def stage(pipe: Any) -> None:
            for data in events:
                pipe.xadd(key, {"e": data}, maxlen=maxlen, approximate=True)

        await self.batch.execute(stage)

    async def read_streams(
        self, positions: dict[str, str], block_ms: int | None, count: int = 1000
    ) -> dict[str, list[Entry]]:
        """XREAD several streams (keys of one partition) from their positions."""
        reply = await self.redis.xread(positions, count=count, block=block_ms)
        return {_s(key): _entries(entries) for key, entries in (reply or [])}

    async def meta(self, url: str) -> dict[str, bytes]:
        raw = await self.redis.hgetall(self.keys.meta(url))
        return {_s(f): v for f, v in raw.items()}

    async def snapshot(self, url: str) -> bytes | None:
        return await self.redis.get(self.keys.snap(url))

    async def entity_urls(self, type_name: str) -> list[str]:
        pipe = self.redis.pipeline(transaction=False)
        for p in range(self.keys.partitions):
            pipe.smembers(self.keys.typeset(p, type_name))
        members = await pipe.execute()
        return sorted(_s(url) for group in members for url in group)

    # -- commits -------------------------------------------------------------

    async def commit(
        self,
        url: str,
        token: str,
        *,
        events: list[tuple[str, bytes]] = (),  # type: ignore[assignment]
        cursor: str = "",
        acks: list[str] = (),  # type: ignore[assignment]
        fields: dict[str, Any] | None = None,
        created: str = "",
        snapshot: bytes = b"",
        snapshot_seen: str = "",
        snapshot_out: str = "",
        timers: list[tuple[str, int, bytes]] = (),  # type: ignore[assignment]
        actions: list[str] = (),  # type: ignore[assignment]
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
        status = _s(reply[0])
        if status == "FENCED":
            raise FencedError(f"commit for {url} refused: lease {token} of partition {p} is lost")
        if status == "GONE":
            raise EntityGoneError(url)
        return [_s(i) for i in reply[1:]]

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
        return [(p, _s(m)) for p, members in zip(partitions, replies, strict=True) for m in members]

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
        return _s(reply[1]) if int(reply[0]) == 1 else None

    async def timers_of(self, url: str, created: str) -> list[tuple[str, int, bytes]]:
        """Pending timers of one incarnation of ``url``: (member, due ms, data)."""
        k = self.keys
        p = k.partition(url)
        # Urls and stream ids contain no glob characters (see urls.py).
        pattern = f"{url}|{created}|*"
        found: list[tuple[str, int]] = []
        async for member, score in self.redis.zscan_iter(k.timers(p), match=pattern, count=500):
            found.append((_s(member), int(score)))
        if not found:
            return []
        data = await self.redis.hmget(k.timerdata(p), [m for m, _ in found])
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
        return [_s(w) for w in reply]

    async def acquire(self, partition: int, worker_id: str, ttl_ms: int) -> str | None:
        k = self.keys
        reply = await self._run(
            ACQUIRE, [k.lease(partition), k.epoch(partition)], [worker_id, ttl_ms]
        )
        return _s(reply) if reply else None

    async def renew(self, partition: int, token: str, ttl_ms: int) -> bool:
        return bool(await self._run(RENEW, [self.keys.lease(partition)], [token, ttl_ms]))

    async def release(self, partition: int, token: str) -> bool:
        return bool(await self._run(RELEASE, [self.keys.lease(partition)], [token]))

    async def lease_owner(self, partition: int) -> str | None:
        value = await self.redis.get(self.keys.lease(partition))
        return _s(value) if value else None

    async def ensure_group(self, partition: int) -> None:
        try:
            await self.redis.xgroup_create(self.keys.inbox(partition), GROUP, id="0", mkstream=True)
        except ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    async def read_inbox(
        self, partitions: list[int], consumer: str, count: int, block_ms: int
    ) -> list[Pointer]:
        streams = {self.keys.inbox(p): ">" for p in partitions}
        reply = await self.redis.xreadgroup(GROUP, consumer, streams, count=count, block=block_ms)
        by_key = {self.keys.inbox(p): p for p in partitions}
        return [
            Pointer(by_key[_s(stream)], _s(entry_id), _s(fields[b"u"]))
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
            next_start, entries = _s(reply[0]), reply[1]
            out.extend(
                Pointer(partition, _s(eid), _s(fields[b"u"])) for eid, fields in entries if fields
            )
            if next_start == "0-0":
                return out
            start = next_start
