"""The lease scripts (ACQUIRE, RENEW, RELEASE) and HEARTBEAT, one group each, driven
through the Store's methods and judged by their exact answers and the exact Redis keys
they leave, on both backends."""

from __future__ import annotations

import asyncio
import logging

import pytest

from tests.script_helpers import take_over
from wakeful.lease_store import Renewal

pytestmark = pytest.mark.anyio


@pytest.fixture
async def store(cluster):
    rt = await cluster.runtime(run_worker=False)
    return rt.store


# -- ACQUIRE, RENEW, RELEASE -----------------------------------------------------------


async def test_acquire_grants_a_free_lease_with_the_next_epoch_and_the_ttl(store):
    k = store.keys
    assert await store.acquire(0, "w1", 5000) == "w1:1"
    assert await store.redis.get(k.lease(0)) == b"w1:1"
    assert await store.redis.get(k.epoch(0)) == b"1"
    assert 0 < await store.redis.pttl(k.lease(0)) <= 5000
    assert await store.lease_owner(0) == "w1:1"
    assert await store.lease_owner(1) is None


async def test_acquire_by_the_holder_keeps_the_token_and_extends_the_ttl(store):
    k = store.keys
    assert await store.acquire(0, "w1", 1000) == "w1:1"
    assert await store.acquire(0, "w1", 60_000) == "w1:1"
    assert 1000 < await store.redis.pttl(k.lease(0)) <= 60_000
    assert await store.redis.get(k.epoch(0)) == b"1"


async def test_acquire_of_a_lease_held_by_another_worker_is_refused(store):
    k = store.keys
    assert await store.acquire(0, "w1", 60_000) == "w1:1"
    assert await store.acquire(0, "w2", 60_000) is None
    assert await store.acquire(0, "w", 60_000) is None  # a prefix of the holder's id
    assert await store.redis.get(k.lease(0)) == b"w1:1"
    assert await store.redis.get(k.epoch(0)) == b"1"


async def test_of_workers_acquiring_a_free_lease_at_once_exactly_one_gets_it(store):
    tokens = await asyncio.gather(*(store.acquire(1, f"w{n}", 60_000) for n in range(5)))
    [token] = [t for t in tokens if t is not None]
    assert token.endswith(":1")
    assert await store.lease_owner(1) == token
    assert await store.redis.get(store.keys.epoch(1)) == b"1"


async def test_every_new_lease_of_a_partition_has_a_greater_epoch(store):
    tokens = [await store.acquire(2, "w1", 60_000)]
    tokens.append(await take_over(store, 2, tokens[-1], "w2"))
    tokens.append(await take_over(store, 2, tokens[-1], "w1"))  # the first worker returns
    assert tokens == ["w1:1", "w2:2", "w1:3"]
    assert await store.acquire(3, "w1", 60_000) == "w1:1"  # epochs are per partition


async def test_renew_extends_only_the_current_token(store):
    k = store.keys
    old = await store.acquire(0, "w1", 60_000)
    new = await take_over(store, 0, old, "w2")
    await store.redis.pexpire(k.lease(0), 1000)
    assert await store.renew(0, old, 60_000) is False
    assert 0 < await store.redis.pttl(k.lease(0)) <= 1000
    assert await store.redis.get(k.lease(0)) == new.encode()
    assert await store.renew(0, new, 60_000) is True
    assert 1000 < await store.redis.pttl(k.lease(0)) <= 60_000
    assert await store.renew(1, new, 60_000) is False  # no lease there
    assert await store.redis.exists(k.lease(1)) == 0


async def test_release_frees_only_the_current_token(store):
    k = store.keys
    old = await store.acquire(0, "w1", 60_000)
    new = await take_over(store, 0, old, "w2")
    assert await store.release(0, old) is False
    assert await store.redis.get(k.lease(0)) == new.encode()
    assert await store.release(0, new) is True
    assert await store.redis.exists(k.lease(0)) == 0
    assert await store.release(0, new) is False
    assert await store.acquire(0, "w1", 60_000) == "w1:3"


async def test_a_lease_without_an_expiry_is_taken_with_a_new_epoch_that_fences_its_holder(
    store,
):
    """ACQUIRE takes a lease that has no expiry (never written so by Wakeful) like a
    missing one: the epoch moves on, so whoever held the old value renews nothing."""
    k = store.keys
    await store.redis.set(k.lease(0), "w1:1")  # no TTL: held by no one, for ever
    token = await store.acquire(0, "w2", 60_000)
    assert token is not None and token.startswith("w2:") and token != "w1:1"
    assert 0 < await store.redis.pttl(k.lease(0)) <= 60_000
    assert await store.renew(0, "w1:1", 60_000) is False
    assert await store.redis.get(k.lease(0)) == token.encode()


# -- HEARTBEAT -------------------------------------------------------------------------


async def test_heartbeat_registers_a_worker_and_answers_the_live_ones(store):
    k = store.keys
    assert await store.heartbeat("w1", 60_000) == ["w1"]
    assert sorted(await store.heartbeat("w2", 60_000)) == ["w1", "w2"]
    [(_, score)] = await store.redis.zrange(k.workers, 0, 0, withscores=True)
    assert score > 60_000  # an expiry time, not a ttl


async def test_heartbeat_deregisters_and_drops_expired_workers(store):
    k = store.keys
    await store.heartbeat("w1", 60_000)
    await store.heartbeat("w2", 60_000)
    await store.redis.zadd(k.workers, {"dead": 1})  # expired long ago
    assert sorted(await store.heartbeat("w3", 60_000)) == ["w1", "w2", "w3"]
    assert await store.heartbeat("w2", None) == ["w1", "w3"]
    assert await store.redis.zrange(k.workers, 0, -1) == [b"w1", b"w3"]


async def test_heartbeat_removes_a_member_further_ahead_than_any_worker_registers(store, caplog):
    """A member written by hand to expire far ahead would get its share of the
    partitions, served by no one, for ever: it is removed, named in a warning."""
    k = store.keys
    seconds, _ = await store.redis.time()
    near = seconds * 1000 + 5 * 60_000  # inside the ten-minute horizon: a worker's
    await store.redis.zadd(k.workers, {"ghost": 2**50, "slow": near})
    with caplog.at_level(logging.WARNING, logger="wakeful.store"):
        assert sorted(await store.heartbeat("w1", 60_000)) == ["slow", "w1"]
    assert await store.redis.zscore(k.workers, "ghost") is None
    assert "removed 'ghost' from the worker registry" in caplog.text
    assert "'slow'" not in caplog.text


# -- RENEW_ALL, FIRST_DUE, REQUEUE: the idle worker's calls (lease_store.py) --------------


async def test_renew_all_renews_each_lease_on_its_own_in_one_call(store):
    k = store.keys
    mine = [await store.acquire(p, "w1", 1000) for p in (0, 1)]
    theirs = await store.acquire(2, "w2", 1000)
    assert None not in mine and theirs is not None
    leases = [(0, mine[0]), (1, "w1:999"), (2, "w1:1"), (3, "w1:1")]
    assert [bool(a) for a in await store.renew_all(leases, 60_000)] == [True, False, False, False]
    assert 1000 < await store.redis.pttl(k.lease(0)) <= 60_000
    assert 0 < await store.redis.pttl(k.lease(1)) <= 1000  # a stale token renews nothing
    assert 0 < await store.redis.pttl(k.lease(2)) <= 1000  # nor another worker's lease
    assert await store.redis.get(k.lease(2)) == theirs.encode()
    assert await store.redis.exists(k.lease(3)) == 0  # no lease is made
    assert await store.renew_all([], 60_000) == []


async def test_renew_all_counts_each_held_inbox_pending_pointers_by_consumer(store):
    """With the renewing worker named, each renewed lease answers how many pointers of
    its inbox are pending for that worker and for the others (an inbox without a group
    holds none); a lease it lost answers nothing more."""
    k = store.keys
    tokens = [await store.acquire(p, "w1", 1000) for p in (0, 1, 2)]
    assert None not in tokens
    for p in (0, 1):
        await store.ensure_group(p)
        for n in range(3):
            await store.redis.xadd(k.inbox(p), {"u": f"/a/{p}{n}"})
    assert len(await store.read_inbox([0], "w2", 2, 10)) == 2  # another worker's read
    assert len(await store.read_inbox([0], "w3", 1, 10)) == 1  # and a third's
    assert len(await store.read_inbox([1], "w1", 2, 10)) == 2  # its own
    leases = [(0, tokens[0]), (1, tokens[1]), (2, tokens[2]), (3, "w1:1")]
    answers = await store.renew_all(leases, 60_000, "w1")
    assert answers == [
        Renewal(True, 0, 3),
        Renewal(True, 2, 0),
        Renewal(True, 0, 0),
        Renewal(False),
    ]
    for p in (0, 1, 2):
        assert 1000 < await store.redis.pttl(k.lease(p)) <= 60_000
    # Without a consumer it only renews.
    assert [bool(a) for a in await store.renew_all(leases, 60_000)] == [True, True, True, False]


async def test_claim_others_takes_every_other_consumers_pointers_and_forgets_them(store):
    """The owner takes over what other consumers hold in its inbox, whatever their idle
    time, keeps its own as they are, and the consumers left with nothing are removed
    (XPENDING's summary walks every consumer of the group)."""
    k = store.keys
    p = 0
    await store.ensure_group(p)
    urls = [u for u in (f"/a/{n}" for n in range(100)) if k.partition(u) == p][:4]
    assert await store.read_inbox([p], "idle", 10, 10) == []  # a consumer with nothing
    for url in urls:
        await store.redis.xadd(k.inbox(p), {"u": url})
    await store.read_inbox([p], "gone", 2, 10)
    await store.read_inbox([p], "owner", 1, 10)
    taken = await store.claim_others(p, "owner")
    assert sorted(x.url for x in taken) == sorted(urls[:2])
    pending = await store.redis.xpending_range(k.inbox(p), "workers", "-", "+", 10)
    assert sorted(e["consumer"] for e in pending) == [b"owner"] * 3
    consumers = await store.redis.xinfo_consumers(k.inbox(p), "workers")
    assert [c["name"] for c in consumers] == [b"owner"]
    assert await store.claim_others(p, "owner") == []
    assert await store.claim_others(5, "owner") == []  # no inbox, no group


async def test_first_due_answers_the_earliest_timer_and_schedule_of_each_partition(store):
    k = store.keys
    await store.redis.zadd(k.timers(0), {"a": 300, "b": 100})
    await store.redis.zadd(k.crondue(0), {"c": 250})
    await store.redis.zadd(k.crondue(2), {"d": 7})
    assert await store.first_due([0, 1, 2]) == {0: (100, 250), 1: (None, None), 2: (None, 7)}
    assert await store.first_due([]) == {}


async def test_requeue_puts_back_only_the_pointers_still_pending_for_the_reader(store):
    k = store.keys
    p = 0
    await store.ensure_group(p)
    first = await store.redis.xadd(k.inbox(p), {"u": "/a/1"})
    second = await store.redis.xadd(k.inbox(p), {"u": "/a/2"})
    assert len(await store.read_inbox([p], "w1", 10, 10)) == 2
    # the new owner claimed the second one meanwhile: it stays where it is
    await store.redis.xclaim(k.inbox(p), "workers", "w2", 0, [second])
    assert await store.requeue(p, "w1", [first.decode(), second.decode()]) == 1
    [again] = await store.read_inbox([p], "w2", 10, 10)
    assert again.url == "/a/1" and again.entry_id != first.decode()
    pending = await store.redis.xpending_range(k.inbox(p), "workers", "-", "+", 10)
    assert sorted(e["consumer"] for e in pending) == [b"w2", b"w2"]
    entries = await store.redis.xrange(k.inbox(p))
    assert [e[0] for e in entries] == [second, again.entry_id.encode()]  # the copy replaced it
    assert await store.requeue(p, "w1", [first.decode()]) == 0  # gone: nothing twice


async def test_first_due_reads_infinite_scores_as_never_and_now(store):
    k = store.keys
    await store.redis.zadd(k.timers(0), {"never": float("inf")})
    await store.redis.zadd(k.crondue(0), {"long ago": float("-inf")})
    assert await store.first_due([0]) == {0: (None, 0)}


async def test_heartbeat_writes_the_expiry_only_once_half_of_it_is_left(store):
    k = store.keys
    await store.heartbeat("w1", 60_000)
    [(_, first)] = await store.redis.zrange(k.workers, 0, 0, withscores=True)
    await store.heartbeat("w1", 60_000)  # most of it is left: nothing written
    assert await store.redis.zscore(k.workers, "w1") == first
    await store.redis.zadd(k.workers, {"w1": first - 40_000})  # less than half left
    assert await store.heartbeat("w1", 60_000) == ["w1"]
    assert await store.redis.zscore(k.workers, "w1") > first - 40_000
