"""Helpers for the script-by-script tests: a Store on the test's keyspace, and views of the
Redis keys a script leaves (the stable surface the Lua refactor must keep)."""

from __future__ import annotations

from typing import Any

from wakeful.keys import GROUP
from wakeful.store import Store
from wakeful.streamids import id_gt

PARTITIONS = 4


def s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


async def partition_keys(store: Store, url: str) -> set[str]:
    """Every key of the partition ``url`` lives in, but its lease and epoch."""
    k = store.keys
    p = k.partition(url)
    found = {s(key) async for key in store.redis.scan_iter(match=f"{k.tag(p)}:*", count=1000)}
    return found - {k.lease(p), k.epoch(p)}


async def emptied_log(store: Store, url: str) -> str:
    """The key of a deleted entity's log, checked to be what DELETE leaves: an empty stream
    that keeps its last id (so a re-create gets a later incarnation) and expires."""
    log = store.keys.log(url)
    assert await store.redis.xlen(log) == 0
    assert await store.redis.pttl(log) > 0
    return log


async def unacked(store: Store, url: str) -> list[str]:
    """Ids of the pointers to ``url`` in its partition inbox that nobody has acknowledged:
    not yet read by the group, or read and still pending."""
    p = store.keys.partition(url)
    inbox = store.keys.inbox(p)
    [group] = [g for g in await store.redis.xinfo_groups(inbox) if s(g["name"]) == GROUP]
    last = s(group["last-delivered-id"])
    pending = {
        s(e["message_id"]) for e in await store.redis.xpending_range(inbox, GROUP, "-", "+", 10_000)
    }
    return [
        s(i)
        for i, fields in await store.redis.xrange(inbox)
        if fields == {b"u": url.encode()} and (id_gt(s(i), last) or s(i) in pending)
    ]


async def inbox_entries(store: Store, url: str) -> list[tuple[str, dict[bytes, bytes]]]:
    """The whole partition inbox of ``url`` (acknowledged or not)."""
    inbox = store.keys.inbox(store.keys.partition(url))
    return [(s(i), f) for i, f in await store.redis.xrange(inbox)]


async def log(store: Store, url: str) -> list[tuple[str, bytes]]:
    """The entity log as (id, event bytes)."""
    return [(i, f[b"e"]) for i, f in await store.read_log(url)]


async def meta(store: Store, url: str) -> dict[str, str]:
    return {k: s(v) for k, v in (await store.meta(url)).items()}


async def create(store: Store, url: str, *events: bytes, **kwargs: Any) -> tuple[str, list[str]]:
    """A new entity with input events; returns (created id, ids of the inputs)."""
    before = await store.read_log(url)
    assert before == []
    result = await store.append_input(
        url, url.split("/")[1], created=b"C", events=[("i", e) for e in events], **kwargs
    )
    ids = [i for i, _ in await log(store, url)]
    assert ids[0] == result.created_id
    return result.created_id, ids[1:]


async def lease(store: Store, url: str, worker: str = "w1") -> tuple[int, str]:
    p = store.keys.partition(url)
    token = await store.acquire(p, worker, 60_000)
    assert token is not None
    return p, token


async def take_over(store: Store, p: int, old: str, heir: str = "heir") -> str:
    """The lease of ``old`` runs out (its key expires) and ``heir`` takes the partition."""
    await store.redis.delete(store.keys.lease(p))
    new = await store.acquire(p, heir, 60_000)
    assert new is not None and new != old
    return new


async def read_pointer(store: Store, url: str, consumer: str = "w1") -> str:
    """Read the partition inbox as a worker does; it holds one new pointer for ``url``."""
    p = store.keys.partition(url)
    [pointer] = [x for x in await store.read_inbox([p], consumer, 100, 100) if x.url == url]
    return pointer.entry_id


async def state(store: Store, url: str) -> tuple[Any, ...]:
    """Everything a script on ``url``'s partition can change, for before/after checks."""
    k = store.keys
    p = k.partition(url)
    r = store.redis
    return (
        sorted(await partition_keys(store, url)),
        await log(store, url),
        await meta(store, url),
        await r.get(k.snap(url)),
        await r.hgetall(k.actions(url)),
        await inbox_entries(store, url),
        await unacked(store, url),
        await r.zrange(k.timers(p), 0, -1, withscores=True),
        await r.hgetall(k.timerdata(p)),
        await r.get(k.lease(p)),
    )


async def two_inboxes_with_a_pointer(store: Store) -> tuple[dict[int, str], int, int]:
    """The first two partitions, each with its group and one wake pointer in its inbox:
    (partition -> the pointer's url, first, second)."""
    keys = store.keys
    urls = {keys.partition(f"/notes/g{i}"): f"/notes/g{i}" for i in range(100)}
    first, second = sorted(urls)[:2]
    for p in (first, second):
        await store.ensure_group(p)
        await store.redis.xadd(keys.inbox(p), {"u": urls[p]})
    return urls, first, second
