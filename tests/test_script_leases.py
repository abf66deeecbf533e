"""The lease scripts (ACQUIRE, RENEW, RELEASE) and HEARTBEAT, one group each, driven
through the Store's methods and judged by their exact answers and the exact Redis keys
they leave, on both backends."""

from __future__ import annotations

import asyncio

import pytest

from tests.script_helpers import take_over

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
