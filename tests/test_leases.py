"""Partition leases: fencing of stale tokens, and rebalancing between workers."""

from __future__ import annotations

import asyncio
import itertools
import logging

import pytest

import wakeful.leases as lease_module
from tests.apps import crashy
from tests.apps.harness import assert_exactly_once, until, wait_all_idle
from wakeful import FencedError, Registry, StateChanged
from wakeful.events import Op, encode_event, pack
from wakeful.leases import rendezvous_owner

pytestmark = pytest.mark.anyio
PARTITIONS = 4


async def inbox_view(store, p: int) -> tuple:
    """Everything a commit could change on the partition, for before/after comparison."""
    inbox = store.keys.inbox(p)
    pending = await store.redis.xpending(inbox, "workers")
    return (pending["pending"], await store.redis.xlen(inbox))


@pytest.mark.parametrize("how", ["expired", "taken_over"])
async def test_commit_with_a_stale_token_is_fenced_and_changes_nothing(cluster, how):
    rt = await cluster.runtime(crashy.registry, run_worker=False)  # we play the worker
    store = rt.store
    url = "/counter/zombie"
    p = store.keys.partition(url)
    await store.ensure_group(p)
    await rt.send(url, {"i": 1})
    [pointer] = await store.read_inbox([p], "zombie", 10, 100)
    old = await store.acquire(p, "zombie", 1000)
    assert old is not None
    assert await store.acquire(p, "other", 1000) is None, "a held lease must not be granted"

    # The lease runs out while the zombie is paused (GC, network partition, SIGSTOP...).
    await store.redis.pexpire(store.keys.lease(p), 1)

    async def gone() -> bool:
        return await store.lease_owner(p) is None

    await until(gone, 5, "the lease to expire")
    new = await store.acquire(p, "zombie" if how == "expired" else "heir", 1000)
    assert new is not None and new != old
    assert int(new.rsplit(":", 1)[1]) > int(old.rsplit(":", 1)[1]), "epochs must grow"

    meta = await store.meta(url)
    log_before = await store.read_log(url)
    inbox_before = await inbox_view(store, p)
    state = encode_event(StateChanged(ops=[Op("insert", "seen", "k", pack({"key": "k"}))]))
    commit = {
        "events": [("e", state)],
        "cursor": log_before[-1][0],
        "acks": [pointer.entry_id],
        "fields": {"attempts": 7},
        "created": meta["created"].decode(),
    }
    with pytest.raises(FencedError):
        await store.commit(url, old, **commit)
    assert await store.read_log(url) == log_before
    assert await store.meta(url) == meta
    assert await inbox_view(store, p) == inbox_before == (1, 1)
    assert not await store.renew(p, old, 1000), "a stale token must not renew"
    assert not await store.release(p, old), "a stale token must not release the new lease"
    assert await store.lease_owner(p) == new

    # The same commit under the current token goes through: the refusal was the fence.
    await store.commit(url, new, **commit)
    assert len(await store.read_log(url)) == len(log_before) + 1
    assert (await store.meta(url))["cursor"].decode() == log_before[-1][0]
    assert await inbox_view(store, p) == (0, 0)  # acknowledged and gone from the inbox


async def test_timer_and_delete_scripts_refuse_a_stale_token(cluster):
    """Firing or cancelling a timer and deleting an entity are fenced like commits."""
    rt = await cluster.runtime(crashy.registry, run_worker=False)
    store = rt.store
    url = "/counter/fenced-timer"
    p = store.keys.partition(url)
    await store.ensure_group(p)
    await rt.send(url, {"i": 1})
    [pointer] = await store.read_inbox([p], "zombie", 10, 100)
    old = await store.acquire(p, "zombie", 1000)
    assert old is not None
    meta = await store.meta(url)
    created = meta["created"].decode()
    timer = encode_event(StateChanged(ops=[]))
    member = f"{url}|{created}|t1"
    await store.commit(url, old, created=created, timers=[(member, 0, timer)])
    assert (await store.meta(url))["timers"] == b"1"

    await store.redis.pexpire(store.keys.lease(p), 1)

    async def gone() -> bool:
        return await store.lease_owner(p) is None

    await until(gone, 5, "the lease to expire")
    new = await store.acquire(p, "heir", 1000)
    assert new is not None

    timers_before = await store.redis.zrange(store.keys.timers(p), 0, -1)
    log_before = await store.read_log(url)
    meta_before = await store.meta(url)
    assert await store.fire_timer(p, old, member) == -1
    with pytest.raises(FencedError):
        await store.cancel_timer(url, old, member)
    with pytest.raises(FencedError):
        await store.delete(url, old, created, [pointer.entry_id])
    assert (
        await store.redis.zrange(store.keys.timers(p), 0, -1) == timers_before == [member.encode()]
    )
    assert await store.read_log(url) == log_before
    assert await store.meta(url) == meta_before
    # Under the current token each goes through: the refusals were the fence.
    assert await store.fire_timer(p, new, member) == 1
    assert len(await store.read_log(url)) == len(log_before) + 1
    assert await store.delete(url, new, created, [pointer.entry_id])
    assert await store.meta(url) == {}


def split_ids() -> tuple[str, str]:
    """Two worker ids whose rendezvous split gives each at least one of the partitions."""
    for n in itertools.count():
        a, b = f"wa{n}-x", f"wb{n}-x"
        if {rendezvous_owner(p, [a, b]) for p in range(PARTITIONS)} == {a, b}:
            return a, b
    raise AssertionError("unreachable")


async def test_leases_rebalance_when_workers_join_and_leave(cluster, prefix, monkeypatch):
    a_id, b_id = split_ids()
    ids = iter([a_id, b_id])
    monkeypatch.setattr(lease_module, "new_worker_id", lambda: next(ids))
    side = cluster.redis()
    reg = crashy.build_registry(lambda: side, prefix)
    sender = await cluster.runtime(reg, run_worker=False)
    store = sender.store

    async def owners() -> list[str | None]:
        tokens = [await store.lease_owner(p) for p in range(PARTITIONS)]
        return [t.rsplit(":", 1)[0] if t else None for t in tokens]

    a = await cluster.runtime(reg)
    assert a.worker.id == a_id

    async def a_owns_all() -> bool:
        return await owners() == [a_id] * PARTITIONS

    await until(a_owns_all, 10, "the only worker to own every partition")

    urls = [f"/counter/r{i}" for i in range(8)]
    sent: dict[str, list[str]] = {u: [] for u in urls}
    stop = asyncio.Event()
    double_owned: list[tuple[int, str]] = []
    runtimes = [a]

    async def keep_sending() -> None:
        for n in itertools.count():
            if stop.is_set():
                return
            url = urls[n % len(urls)]
            sent[url].append(await sender.send(url, {"i": n}))
            await asyncio.sleep(0.003)

    async def watch_leases() -> None:
        """No partition is ever used by two workers at once.

        A worker uses a partition while it holds a valid lease on it, except a
        lease it is handing back (draining, or the worker is stopping) once no
        wake of that partition runs any more."""
        while not stop.is_set():
            held: dict[int, str] = {}
            for rt in runtimes:
                w = rt.worker
                leaving = w._stopping.is_set()
                for p, lease in list(w.leases.items()):
                    if lease.valid() and (not (lease.draining or leaving) or w.runners.busy(p)):
                        if p in held:
                            double_owned.append((p, f"{held[p]} and {w.id}"))
                        held[p] = w.id
            await asyncio.sleep(0.002)

    async def messages_flow() -> None:
        """Wait until more messages went out: the moves happen while messages flow."""
        start = sum(map(len, sent.values()))

        async def more() -> bool:
            return sum(map(len, sent.values())) >= start + 10

        await until(more, 30, "messages to flow between the moves")

    tasks = [asyncio.create_task(keep_sending()), asyncio.create_task(watch_leases())]
    try:
        await messages_flow()
        b = await cluster.runtime(reg)
        runtimes.append(b)
        assert b.worker.id == b_id
        expected = [rendezvous_owner(p, [a_id, b_id]) for p in range(PARTITIONS)]

        async def split() -> bool:
            return await owners() == expected

        await until(split, 10, f"leases to converge to the split {expected}")
        want_a = {p for p, owner in enumerate(expected) if owner == a_id}
        want_b = set(range(PARTITIONS)) - want_a

        async def workers_agree() -> bool:
            # Redis shows a lease as soon as the acquire script ran; the worker records it
            # when the reply arrives, a moment later.
            return set(a.worker.leases) == want_a and set(b.worker.leases) == want_b

        await until(workers_agree, 10, "each worker to hold the leases Redis shows")
        assert want_a and want_b, "each worker owns part of the partitions"
        await messages_flow()

        await a.close()  # a leaves gracefully: b takes everything back
        runtimes.remove(a)

        async def b_owns_all() -> bool:
            return await owners() == [b_id] * PARTITIONS

        await until(b_owns_all, 10, "the remaining worker to take every partition back")
        assert set(b.worker.leases) == set(range(PARTITIONS))
        await messages_flow()
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    try:
        await wait_all_idle(sender, urls, 15)
        await assert_exactly_once(sender, sent)
        assert not double_owned, f"a partition had two owners at once: {double_owned[:5]}"
        overlaps = int(await side.get(crashy.side_key(prefix, "overlaps")) or 0)
        assert overlaps == 0
    finally:
        await side.aclose()


@pytest.mark.redis_only
async def test_a_redis_outage_is_logged_once_not_every_tick(tmp_path, prefix, caplog):
    """While Redis is away the heartbeat and every partition's acquisition fail at each
    tick: each is a warning once while it lasts, not a line per partition per tick."""
    import logging
    import shutil

    from tests.apps.harness import PrivateRedis
    from wakeful import Registry, Runtime, Settings

    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    server = PrivateRedis(tmp_path / "redis")
    server.start()
    reg = Registry()

    @reg.entity("noop")
    async def noop(ctx) -> None:
        pass

    settings = Settings(
        redis_url=server.url, prefix=prefix, partitions=16, lease_ttl_ms=600, socket_timeout_s=1
    )
    rt = Runtime(reg, settings=settings, run_worker=True)
    await rt.start()
    try:
        caplog.set_level(logging.DEBUG, logger="wakeful.leases")
        server.kill()

        def failed_ticks() -> int:
            return sum("heartbeat failed" in r.getMessage() for r in caplog.records)

        await until(lambda: _true(failed_ticks() >= 8), 60, "eight ticks without Redis")
        warnings = [
            r.getMessage()
            for r in caplog.records
            if r.levelno >= logging.WARNING and r.name == "wakeful.leases"
        ]
        # once per kind of failure (a closed connection, then a refused one, are one kind)
        assert sum("heartbeat failed" in w for w in warnings) <= 2, warnings
        assert sum("acquiring partition" in w for w in warnings) <= 2, warnings
        assert len(warnings) < 8 + 16, warnings  # the 16 "lost partition" lines, and a few
    finally:
        server.start()
        await rt.close()
        server.stop()


async def _true(value: bool) -> bool:
    return value


async def test_an_acquisition_redis_refuses_says_why(cluster, caplog):
    """A partition whose fencing epoch was written over with text: Redis refuses its
    acquisition, and the worker's warning names Redis's reason (redis-py 8's ``repr`` of
    the error, ``server:ResponseError``, said nothing)."""
    if cluster.backend == "cluster":
        pytest.skip("one partition's keys; the single-Redis backends show it")
    caplog.set_level(logging.WARNING, logger="wakeful.leases")
    client = await cluster.runtime(Registry(), run_worker=False)
    assert client.store is not None
    await client.store.redis.set(client.store.keys.epoch(1), "garbage")
    reg = Registry()

    @reg.entity("noop")
    async def noop(ctx) -> None:
        pass

    await cluster.runtime(reg)

    def said() -> list[str]:
        return [r.getMessage() for r in caplog.records if "acquiring partition" in r.getMessage()]

    await until(lambda: _true(bool(said())), 30, "the refused acquisition's warning")
    assert "partition(s) 1 failed" in said()[0] and "ResponseError: " in said()[0]
    assert "not an integer" in said()[0]
