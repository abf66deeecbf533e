"""Bad items written straight into Redis: every loop handles them one by one.

A wake pointer without its url, a malformed timer member, a corrupted cursor: each
is logged, moved where an operator sees it (the partition's dead-letter stream, or
the entity's status), and the worker goes on serving every other entity of the
same partition, keeping its leases.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys

import pytest
from redis.exceptions import ResponseError

from tests.apps.harness import until
from wakeful import (
    EntityFailed,
    HandlerContext,
    Registry,
    Runtime,
    Settings,
    SnapshotError,
    WakefulError,
)
from wakeful.connection import connect
from wakeful.keys import GROUP
from wakeful.leases import rendezvous_owner

pytestmark = pytest.mark.anyio


def app(seen: list[object]) -> Registry:
    reg = Registry()

    @reg.entity("sink")
    async def sink(ctx: HandlerContext) -> None:
        for m in ctx.wake.messages:
            if m.payload == "arm":
                await ctx.send(ctx.entity_url, "fired", after=0.05)
            seen.append(m.payload)

    return reg


def url_in(rt, partition: int, n: int = 0) -> str:
    urls = (f"/sink/e{i}" for i in range(1000))
    return [u for u in urls if rt.store.keys.partition(u) == partition][n]


async def served(rt, url: str, payload: object, seen: list[object]) -> None:
    await rt.send(url, payload)
    await until(lambda: _true(payload in seen), 10, f"{url} to get {payload!r}")


async def _true(value: bool) -> bool:
    return value


async def assert_lease_kept(rt, partition: int) -> None:
    worker = rt.worker
    lease = worker.leases[partition]
    first = lease.valid_until
    await until(lambda: _true(lease.valid_until > first), 10, "the lease to be renewed")
    assert worker.leases.get(partition) is lease and lease.valid()
    assert not rt._worker_task.done()


async def test_a_pointer_without_its_url_is_moved_aside_and_the_reader_goes_on(
    cluster, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.ERROR, logger="wakeful")
    seen: list[object] = []
    rt = await cluster.runtime(app(seen))
    p = 1
    inbox = rt.store.keys.inbox(p)
    bad_id = (await rt.store.redis.xadd(inbox, {"x": "1"})).decode()
    await served(rt, url_in(rt, p), "after the bad pointer", seen)
    await served(rt, url_in(rt, p, 1), "and again", seen)

    [bad] = await until(rt.store.bad_items, 10, "the bad pointer in the dead-letter stream")
    assert bad["kind"] == "pointer" and bad["item"] == bad_id and bad["key"] == inbox
    assert "no 'u' field" in bad["reason"] and "'x'" in bad["detail"]
    assert bad["partition"] == str(p)
    assert not await rt.store.redis.xrange(inbox, bad_id, bad_id)  # out of the inbox
    assert (await rt.store.redis.xpending(inbox, GROUP))["pending"] == 0
    assert any(bad_id in r.getMessage() and inbox in r.getMessage() for r in caplog.records)
    await assert_lease_kept(rt, p)


async def test_a_bad_pending_pointer_does_not_break_the_lease_tick(cluster):
    seen: list[object] = []
    client = await cluster.runtime(app(seen), run_worker=False)
    p = 2
    keys = client.store.keys
    url = url_in(client, p)
    await client.store.ensure_group(p)
    await client.store.redis.xadd(keys.inbox(p), {"u": b"\xff\xfe"})  # not UTF-8
    await client.send(url, "pending behind it")
    # A worker that died read both and acknowledged neither: the next owner claims them.
    await client.store.redis.xreadgroup(GROUP, "dead", {keys.inbox(p): ">"}, count=10)

    rt = await cluster.runtime(app(seen))
    await until(lambda: _true("pending behind it" in seen), 10, "the claimed pointer's wake")
    [bad] = await until(rt.store.bad_items, 10, "the bad pointer in the dead-letter stream")
    assert "not UTF-8" in bad["reason"]
    await served(rt, url_in(rt, p, 1), "later", seen)
    await assert_lease_kept(rt, p)


async def test_a_pointer_of_another_partition_is_moved_aside(cluster):
    seen: list[object] = []
    rt = await cluster.runtime(app(seen))
    foreign = url_in(rt, 0)
    await rt.store.redis.xadd(rt.store.keys.inbox(3), {"u": foreign})
    [bad] = await until(rt.store.bad_items, 10, "the misplaced pointer in the dead-letter stream")
    assert "belongs to partition 0" in bad["reason"]
    await served(rt, url_in(rt, 3), "still served", seen)


async def test_a_pointer_whose_url_is_not_an_entity_url_is_moved_aside(cluster):
    """A pointer's ``u`` that is text of the right partition but no entity url was
    acknowledged as a deleted entity's, silently: it goes to the dead-letter stream,
    named, like the pointers without a url."""
    seen: list[object] = []
    rt = await cluster.runtime(app(seen))
    junk = next(f"junk{n}" for n in range(1000) if rt.store.keys.partition(f"junk{n}") == 3)
    bad_id = (await rt.store.redis.xadd(rt.store.keys.inbox(3), {"u": junk})).decode()
    [bad] = await until(rt.store.bad_items, 10, "the pointer in the dead-letter stream")
    assert bad["item"] == bad_id and "is not an entity url" in bad["reason"]
    assert junk in bad["reason"]
    await served(rt, url_in(rt, 3), "still served", seen)


async def test_a_malformed_timer_member_is_moved_aside_and_timers_still_fire(
    cluster, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.ERROR, logger="wakeful")
    seen: list[object] = []
    rt = await cluster.runtime(app(seen))
    p = 1
    timers = rt.store.keys.timers(p)
    await rt.store.redis.zadd(timers, {"garbage": 0})
    await rt.store.redis.hset(rt.store.keys.timerdata(p), "garbage", b"data")
    await served(rt, url_in(rt, p), "arm", seen)
    await until(lambda: _true("fired" in seen), 10, "the good timer to fire")

    [bad] = await until(rt.store.bad_items, 10, "the bad timer in the dead-letter stream")
    assert bad["kind"] == "timer" and bad["item"] == "garbage" and bad["key"] == timers
    assert "<url>|<incarnation>|<id>" in bad["reason"] and bad["detail"] == "data"
    assert await rt.store.redis.zscore(timers, "garbage") is None
    assert not await rt.store.redis.hexists(rt.store.keys.timerdata(p), "garbage")
    assert any("garbage" in r.getMessage() and timers in r.getMessage() for r in caplog.records)
    await assert_lease_kept(rt, p)


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("cursor", "garbage", "'cursor' is 'garbage'"),
        ("attempts", "x", "'attempts' is b'x'"),
        ("partial", "garbage", "'partial' is 'garbage'"),
    ],
)
async def test_corrupted_metadata_parks_the_entity_with_the_error_in_its_status(
    cluster, field, value, named
):
    seen: list[object] = []
    rt = await cluster.runtime(app(seen))
    p = 1
    url, other = url_in(rt, p), url_in(rt, p, 1)
    await served(rt, url, "first", seen)
    await rt.wait_idle(url)
    await rt.store.redis.hset(rt.store.keys.meta(url), field, value)

    status = await rt.status(url)  # reported, not raised
    assert status.status == "failed" and named in status.error

    await rt.send(url, "second")  # the worker meets the corrupted field and parks it

    async def parked() -> bool:
        return (await rt.store.meta(url)).get("status") == b"failed"

    await until(parked, 10, f"{url} to be parked")
    status = await rt.status(url)
    assert status.status == "failed"
    assert "the runtime failed on this entity" in status.error and named in status.error
    assert "second" not in seen
    await served(rt, other, "the partition goes on", seen)
    await rt.send(url, "third")  # a parked entity is not parked again

    async def acknowledged() -> bool:
        return "woke" not in await rt.store.meta(url)

    await until(acknowledged, 10, "the parked entity's pointer to be acknowledged")
    failed = [r async for r in rt.events(url) if isinstance(r.event, EntityFailed)]
    assert len(failed) == 1
    await assert_lease_kept(rt, p)


@pytest.mark.parametrize("field", ["cursor", "out_done", "partial"])
async def test_resume_refuses_an_entity_whose_positions_are_corrupted(cluster, field):
    """The cursor says which inputs were handled: resume must not guess it (and the
    script must not fail half-way on it)."""
    seen: list[object] = []
    rt = await cluster.runtime(app(seen))
    url = url_in(rt, 1)
    await served(rt, url, "first", seen)
    await rt.wait_idle(url)
    await rt.store.redis.hset(rt.store.keys.meta(url), field, "garbage")
    await rt.send(url, "second")
    await until(lambda: _status_is(rt, url, "failed"), 10, f"{url} to be parked")
    log_length = await rt.store.redis.xlen(rt.store.keys.log(url))
    with pytest.raises(WakefulError, match=f"cannot resume {url}: .*'{field}' is 'garbage'"):
        await rt.resume(url)
    assert await rt.store.redis.xlen(rt.store.keys.log(url)) == log_length  # nothing written
    assert (await rt.status(url)).status == "failed"


async def test_resume_repairs_a_corrupted_attempt_count(cluster):
    seen: list[object] = []
    rt = await cluster.runtime(app(seen))
    url = url_in(rt, 1)
    await served(rt, url, "first", seen)
    await rt.wait_idle(url)
    await rt.store.redis.hset(rt.store.keys.meta(url), "attempts", "x")
    await rt.send(url, "second")
    await until(lambda: _status_is(rt, url, "failed"), 10, f"{url} to be parked")
    await rt.resume(url)
    await served(rt, url, "third", seen)
    assert seen[-2:] == ["second", "third"]


async def _status_is(rt: Runtime, url: str, status: str) -> bool:
    return (await rt.store.meta(url)).get("status") == status.encode()


async def test_a_timer_that_keeps_failing_to_fire_is_moved_aside(cluster):
    seen: list[object] = []
    rt = await cluster.runtime(app(seen))
    p = 1
    timers = rt.store.keys.timers(p)
    member = f"{url_in(rt, p, 1)}|1-0|t1"
    await rt.store.redis.zadd(timers, {member: 0})
    fire = rt.store.fire_timer

    async def failing_fire(partition: int, token: str, timer: str) -> int:
        if timer == member:
            raise ResponseError("WRONGTYPE Operation against a key holding the wrong kind")
        return await fire(partition, token, timer)

    rt.store.fire_timer = failing_fire
    await served(rt, url_in(rt, p), "arm", seen)
    await until(lambda: _true("fired" in seen), 10, "the good timer to fire")
    [bad] = await until(rt.store.bad_items, 10, "the failing timer in the dead-letter stream")
    assert bad["item"] == member and "firing it failed 3 times" in bad["reason"]
    assert "WRONGTYPE" in bad["reason"]
    await assert_lease_kept(rt, p)


async def test_wakeful_bad_lists_what_was_moved_aside(server_url, prefix):
    settings = Settings(redis_url=server_url, prefix=prefix, partitions=4, block_ms=100)
    rt = Runtime(app([]), settings=settings, run_worker=True)
    await rt.start()
    try:
        inbox = rt.store.keys.inbox(0)
        bad_id = (await rt.store.redis.xadd(inbox, {"x": "1"})).decode()
        await until(rt.bad_items, 10, "the bad pointer in the dead-letter stream")
        command = [sys.executable, "-m", "wakeful.cli", "bad", "--redis", server_url]
        env = {**os.environ, "WAKEFUL_PREFIX": prefix, "WAKEFUL_PARTITIONS": "4"}
        listed = await asyncio.to_thread(
            subprocess.run, [*command, "--json"], env=env, capture_output=True, text=True
        )
        assert listed.returncode == 0, listed.stderr
        [item] = json.loads(listed.stdout)
        assert item["item"] == bad_id and "no 'u' field" in item["reason"]
        plain = await asyncio.to_thread(
            subprocess.run, command, env=env, capture_output=True, text=True
        )
        assert plain.returncode == 0
        assert f"{inbox}\tpointer\t{bad_id}\tit has no 'u' field" in plain.stdout
    finally:
        await rt.close()
        redis = connect(server_url)  # a cluster URL too
        async for key in redis.scan_iter(match=f"{prefix}:*"):
            await redis.delete(key)
        await redis.aclose()


async def test_a_cancel_request_that_is_not_utf8_does_not_stop_the_cancel_relay(cluster):
    seen: list[object] = []
    rt = await cluster.runtime(app(seen))
    keys, url = rt.store.keys, url_in(rt, 1)

    async def delivered() -> bool:  # once the worker's subscription is listening
        channel = keys.cancel_channel(keys.partition(url))  # the partition's shard channel
        return bool(await rt.store.redis.execute_command("SPUBLISH", channel, b"\xff\xfe"))

    await until(delivered, 10, "the worker's cancel listener to get the request")
    await served(rt, url_in(rt, 1), "still served", seen)
    assert not rt._worker_task.done()


async def test_a_registry_member_that_is_not_utf8_does_not_stop_the_lease_tick(cluster):
    """The lease tick reads the worker registry at each heartbeat: one member written by
    hand that is not UTF-8 had failed every tick, so every lease lapsed."""
    seen: list[object] = []
    rt = await cluster.runtime(app(seen))
    ghost = "\\xff\\xfe"  # how the member is listed
    me = rt.worker.id
    p = next(p for p in range(4) if rendezvous_owner(p, [me, ghost]) == me)
    seconds, _ = await rt.store.redis.time()  # an expiry a worker could set: kept
    await rt.store.redis.zadd(rt.store.keys.workers, {b"\xff\xfe": seconds * 1000 + 60_000})

    async def listed() -> bool:
        return ghost in {w.id for w in await rt.workers()}

    await until(listed, 10, "the member to be listed")
    await served(rt, url_in(rt, p), "still served", seen)
    await assert_lease_kept(rt, p)
    assert await rt.partition_owner(p) == me


async def test_a_registry_member_far_ahead_is_removed_and_its_partitions_served(cluster):
    """A member written by hand with an expiry no worker sets (years ahead) got its
    share of the partitions, which no one served, for ever: the heartbeat removes it."""
    seen: list[object] = []
    rt = await cluster.runtime(app(seen))
    me = rt.worker.id
    p = next(p for p in range(4) if rendezvous_owner(p, [me, "ghost"]) == "ghost")
    workers = rt.store.keys.workers
    await rt.store.redis.zadd(workers, {b"ghost": 2**50})

    async def removed() -> bool:
        return await rt.store.redis.zscore(workers, b"ghost") is None

    await until(removed, 10, "the heartbeat to remove the member")
    await served(rt, url_in(rt, p), "served by the live worker", seen)
    await assert_lease_kept(rt, p)
    assert "ghost" not in {w.id for w in await rt.workers()}


async def test_a_garbage_snapshot_is_named_parks_its_entity_and_resume_repairs_it(cluster):
    seen: list[object] = []
    rt = await cluster.runtime(app(seen), snapshot_every=1)
    p = 1
    url, other = url_in(rt, p), url_in(rt, p, 1)
    await served(rt, url, "first", seen)
    await rt.wait_idle(url)
    keys = rt.store.keys
    assert await rt.store.redis.exists(keys.snap(url))
    await rt.store.redis.set(keys.snap(url), b"garbage")

    with pytest.raises(SnapshotError, match=f"{url} cannot be read: its snapshot cannot be"):
        await rt.state(url)
    status = await rt.status(url, runs=True)  # reported, not raised
    assert status.status == "failed" and "its snapshot cannot be decoded" in status.error

    rt.worker.cache.forget(url)  # a cold load reads the snapshot
    await rt.send(url, "second")
    await until(lambda: _status_is(rt, url, "failed"), 10, f"{url} to be parked")
    status = await rt.status(url, runs=True)
    assert status.status == "failed" and "its snapshot cannot be decoded" in status.error
    await served(rt, other, "the partition goes on", seen)
    await assert_lease_kept(rt, p)

    # The operator drops the snapshot (the log is whole): resume folds the log.
    await rt.store.redis.delete(keys.snap(url))
    await rt.store.redis.hdel(keys.meta(url), "snap_upto", "snap_out")
    await rt.resume(url)
    await served(rt, url, "third", seen)
    assert seen[-3:] == ["the partition goes on", "second", "third"]


async def test_a_metadata_key_of_the_wrong_type_fails_only_its_entity_in_a_listing(cluster):
    seen: list[object] = []
    rt = await cluster.runtime(app(seen))
    url, other = url_in(rt, 1), url_in(rt, 1, 1)
    await served(rt, url, "first", seen)
    await served(rt, other, "first too", seen)
    meta = rt.store.keys.meta(url)
    await rt.store.redis.delete(meta)
    await rt.store.redis.set(meta, b"garbage")  # a string where a hash belongs

    found = await rt.statuses([url, other])
    assert found[url] is not None and found[url].status == "failed"
    assert "its metadata key is not a hash" in (found[url].error or "")
    assert "WRONGTYPE" in (found[url].error or "")
    assert found[other] is not None and found[other].status == "idle"
    await served(rt, other, "the partition goes on", seen)


async def test_a_lease_without_an_expiry_is_taken_over(cluster):
    """Wakeful writes every lease with an expiry; one set by hand without (or restored
    without its TTL) had kept its partition from every worker forever."""
    seen: list[object] = []
    client = await cluster.runtime(app(seen), run_worker=False)
    p = 2
    await client.store.redis.set(client.store.keys.lease(p), "garbage")
    rt = await cluster.runtime(app(seen))
    await served(rt, url_in(rt, p), "served", seen)
    await assert_lease_kept(rt, p)
    assert await rt.store.redis.pttl(rt.store.keys.lease(p)) > 0


async def test_a_dead_letter_entry_wakeful_did_not_write_is_listed_as_what_it_holds(cluster):
    """``wakeful bad`` lists the dead-letter streams; an entry written there by hand
    (no kind, bytes that are not UTF-8) was a row of empty columns."""
    rt = await cluster.runtime(app([]), run_worker=False)
    await rt.store.redis.xadd(rt.store.keys.bad(2), {b"x": b"\xff1"})
    [row] = await rt.store.bad_items()
    assert row["partition"] == "2" and row["kind"] == "unknown"
    assert row["reason"] == "an entry Wakeful did not write"
    assert row["detail"] == "x=\\xff1"
