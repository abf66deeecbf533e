"""Reading entities: metadata, snapshots, logs and live streams, published types.

The read half of :class:`~wakeful.store.Store` (which adds every write, the
partition leases, the inbox and timers): plain Redis reads, decoded through
``replies.py``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, cast

import msgspec
from redis.asyncio.client import Pipeline
from redis.exceptions import ResponseError
from redis.typing import KeyT, StreamIdT

from .connection import block_ms as block_ms_for
from .keys import GROUP
from .replies import (
    EntityMeta,
    Entry,
    as_str,
    parse_identity,
    parse_meta,
    registry_text,
    stream_entries,
    text_keys,
    unreadable_meta,
)
from .script_runner import LOAD, ScriptRunner
from .streamids import ZERO

BULK_BATCH = 500  # urls per pipeline of a bulk read (each pipeline is one round trip)
BULK_AT_ONCE = 4  # pipelines of one bulk read in flight at once

# The casts narrow redis-py's replies to what the store's connections return (RESP2,
# no decoding: lists and bytes); see store.py.


class Loaded(msgspec.Struct, frozen=True):
    """What a wake reads: the metadata, the snapshot and the log after it. (A struct,
    not a frozen dataclass: one is made per wake, and the dataclass takes several
    times as long to construct.)"""

    meta: dict[str, bytes]  # the raw hash (empty if the entity is gone)
    info: EntityMeta | None  # the same, parsed (None if the entity is gone)
    snapshot: bytes | None
    entries: list[Entry]
    # the conversation chunks the snapshot references (field -> chunk), read with it
    chunks: dict[bytes, bytes] = msgspec.field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StreamBatch:
    """New entries of an entity's log and live stream (see :meth:`Store.read_entity`)."""

    log: list[Entry]
    live: list[Entry]


class EntityReads(ScriptRunner):
    """Reads of entity data (see the module docstring)."""

    async def load(self, url: str, after: str | None, page: int = 1000) -> Loaded:
        """Metadata plus the log after ``after`` (or after the snapshot, and the
        snapshot with its conversation chunks, when None)."""
        k = self.keys
        meta_flat, snapshot, raw, chunks_flat = await self._run(
            LOAD, [k.meta(url), k.snap(url), k.log(url), k.conv(url)], [after or "", page]
        )
        meta = text_keys(meta_flat)
        chunks = dict(zip(chunks_flat[::2], chunks_flat[1::2], strict=True))
        log = stream_entries(raw)
        while len(raw) == page:
            raw = await self.redis.xrange(k.log(url), f"({log[-1][0]}", "+", count=page)
            log.extend(stream_entries(raw))
        return Loaded(meta, parse_meta(meta), snapshot, log, chunks)

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
        the entity's partition), blocking up to ``block_ms`` (at most half the socket
        timeout, see :func:`~wakeful.connection.block_ms`). None if there are none."""
        log_key, live_key = self.keys.log(url), self.keys.live(url)
        positions: dict[KeyT, StreamIdT] = {log_key: log_after}
        if live_after is not None:
            positions[live_key] = live_after
        reply = cast(
            "list[list[Any]] | None",
            await self.redis.xread(
                positions,
                count=count,
                block=None if block_ms is None else block_ms_for(self.redis, block_ms),
            ),
        )
        if not reply:
            return None
        by_key = {as_str(key): stream_entries(raw) for key, raw in reply}
        return StreamBatch(by_key.get(log_key, []), by_key.get(live_key, []))

    async def trimmed_upto(self, url: str) -> str | None:
        """The last entry log retention trimmed from the entity's log (None: none)."""
        value = await self.redis.hget(self.keys.meta(url), "trimmed")
        return as_str(value) if value else None

    async def meta(self, url: str) -> dict[str, bytes]:
        """The raw metadata hash (empty if there is no such entity)."""
        raw = cast("dict[bytes, bytes]", await self.redis.hgetall(self.keys.meta(url)))
        return {as_str(f): v for f, v in raw.items()}

    async def entity_meta(self, url: str) -> EntityMeta | None:
        """The parsed metadata (None if there is no such entity)."""
        return parse_meta(await self.meta(url))

    async def ownerships(self, urls: list[str]) -> list[tuple[bool, dict[str, str] | None]]:
        """For each entity: whether it exists, and its owner (None: none recorded, or
        a field that is not an identity), in one round trip."""
        pipe = self.redis.pipeline(transaction=False)
        for url in urls:
            pipe.hmget(self.keys.meta(url), ["created", "owner"])
        out: list[tuple[bool, dict[str, str] | None]] = []
        for created, owner in await pipe.execute():
            try:
                identity = parse_identity(owner) if owner else None
            except ValueError:
                identity = None
            out.append((created is not None, identity))
        return out

    async def snapshot(self, url: str) -> bytes | None:
        return cast("bytes | None", await self.redis.get(self.keys.snap(url)))

    async def entity_urls(self, type_name: str) -> list[str]:
        members = await self._every_partition(
            lambda pipe, p: pipe.smembers(self.keys.typeset(p, type_name))
        )
        return sorted(as_str(url) for group in _raised(members) for url in group)

    async def published_types(self) -> dict[str, bytes]:
        """Manifests the workers published: type name -> manifest JSON."""
        raw = cast("dict[bytes, bytes]", await self.redis.hgetall(self.keys.types))
        return {as_str(name): manifest for name, manifest in raw.items()}

    async def live_workers(self) -> list[tuple[str, int]]:
        """``(worker id, ms until its heartbeat expires)`` of every live worker, by
        Redis's clock (the registry ``<prefix>:workers``, score = expiry)."""
        workers = self.keys.workers

        def stage(pipe: Pipeline) -> None:  # TIME of the node holding the registry
            pipe.time()
            pipe.zrange(workers, 0, -1, withscores=True)

        (seconds, micros), members = await self._in_slot(workers, stage)
        now = int(seconds) * 1000 + int(micros) // 1000
        return [(registry_text(w), int(score) - now) for w, score in members if int(score) > now]

    async def lease_holders(self) -> dict[int, str | None]:
        """Partition -> the worker id whose lease it is (None: no lease held)."""
        values = _raised(await self._every_partition(lambda pipe, p: pipe.get(self.keys.lease(p))))
        return {
            p: registry_text(value).rsplit(":", 1)[0] if value else None
            for p, value in enumerate(values)
        }

    async def partition_counts(self) -> list[tuple[int, int, int, int]]:
        """``(partition, pointers in the inbox, of them pending, timers)`` of each
        partition (the metrics' gauges). An inbox without its group yet has none pending."""
        k = self.keys
        inboxes, pendings, timer_counts = await asyncio.gather(
            self._every_partition(lambda pipe, p: pipe.xlen(k.inbox(p))),
            self._every_partition(lambda pipe, p: pipe.xpending(k.inbox(p), GROUP)),
            self._every_partition(lambda pipe, p: pipe.zcard(k.timers(p))),
        )
        counts = []
        for p in range(self.keys.partitions):
            inbox, pending, timers = inboxes[p], pendings[p], timer_counts[p]
            pending_count = pending.get("pending", 0) if isinstance(pending, dict) else 0
            counts.append((p, _count(inbox), int(pending_count or 0), _count(timers)))
        return counts

    async def published_type_names(self) -> list[str]:
        """Names of the types the workers published."""
        return [as_str(name) for name in await self.redis.hkeys(self.keys.types)]

    # -- reads of many entities at once: grouped by partition (the keys of one partition
    # share its hash tag), one pipeline of up to BULK_BATCH entities per round trip. An
    # entity that does not exist is reported in its place, never raised.

    async def _pipelined(self, urls: list[str], stage: Any) -> list[Any]:
        """``stage(pipe, url)`` for each url, pipelined per partition; the replies in
        the order of ``urls`` (an error reply stays in its place, as the exception)."""
        by_partition: dict[int, list[int]] = {}
        for i, url in enumerate(urls):
            by_partition.setdefault(self.keys.partition(url), []).append(i)
        batches = [
            group[start : start + BULK_BATCH]
            for group in by_partition.values()
            for start in range(0, len(group), BULK_BATCH)
        ]
        out: list[Any] = [None] * len(urls)
        gate = asyncio.Semaphore(BULK_AT_ONCE)

        async def run(batch: list[int]) -> None:
            async with gate:
                if self.router is not None:  # on the partition's master (a batch: one slot)
                    by_item = await self.router.per_node(
                        {i: self.keys.meta(urls[i]) for i in batch},
                        lambda pipe, i: stage(pipe, urls[i]),
                    )
                    replies = [by_item[i] for i in batch]
                else:
                    pipe = self.redis.pipeline(transaction=False)
                    for i in batch:
                        stage(pipe, urls[i])
                    replies = await pipe.execute(raise_on_error=False)
            for i, reply in zip(batch, replies, strict=True):
                out[i] = reply

        await asyncio.gather(*(run(batch) for batch in batches))
        return out

    async def metas_of(self, urls: list[str]) -> list[EntityMeta | None]:
        """The parsed metadata of each entity (None: no such entity)."""

        def stage(pipe: Pipeline, url: str) -> None:
            pipe.hgetall(self.keys.meta(url))

        out: list[EntityMeta | None] = []
        for reply in await self._pipelined(urls, stage):
            if isinstance(reply, ResponseError) and "WRONGTYPE" in str(reply):
                # One damaged key is that entity's problem, not every listed entity's.
                out.append(unreadable_meta(f"its metadata key is not a hash ({reply})"))
                continue
            if isinstance(reply, Exception):
                raise reply
            raw = cast("dict[bytes, bytes]", reply)
            out.append(parse_meta({as_str(f): v for f, v in raw.items()}))
        return out

    async def loads(self, urls: list[str], page: int = 1000) -> list[Loaded]:
        """:meth:`load` (from the snapshot) of each entity; a gone entity's has no
        metadata (``info`` None)."""
        k = self.keys

        def stage(pipe: Pipeline, url: str) -> None:
            keys = [k.meta(url), k.snap(url), k.log(url), k.conv(url)]
            sha = LOAD.sha if self.router is None else LOAD.cluster_sha
            pipe.evalsha(sha, len(keys), *keys, "", page)

        out: list[Loaded] = []
        for url, reply in zip(urls, await self._pipelined(urls, stage), strict=True):
            if isinstance(reply, Exception) or len(reply[2]) == page:
                # NOSCRIPT (a restarted Redis) or a long log: the single read handles it
                out.append(await self.load(url, None, page))
                continue
            meta_flat, snapshot, raw, chunks_flat = reply
            meta = text_keys(meta_flat)
            chunks = dict(zip(chunks_flat[::2], chunks_flat[1::2], strict=True))
            out.append(Loaded(meta, parse_meta(meta), snapshot, stream_entries(raw), chunks))
        return out


def _count(reply: Any) -> int:
    """A count reply, or 0 for an error in its place (a missing key or group)."""
    return int(reply) if isinstance(reply, int) else 0


def _raised(replies: list[Any]) -> list[Any]:
    """``replies``, the first error among them raised."""
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return replies
