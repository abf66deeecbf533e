"""A full Redis (``maxmemory`` reached, ``noeviction``) is a clear error, not corruption.

A private redis-server of the test's own (on another port) whose ``maxmemory`` the
test lowers under the runtime's feet: a send is refused with :class:`RedisFullError`
(and 507 over HTTP, a clear message at the CLI), a wake whose commit does not fit
leaves nothing half-written and is retried, and once memory is freed every entity
goes on where it stopped. A worker warns at start about an eviction policy.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis as sync_redis

from tests.apps.harness import PrivateRedis, until
from wakeful import RedisFullError, Registry, Runtime, Settings
from wakeful.entities import notes
from wakeful.gateway import create_app

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server"),
]
ROOT = Path(__file__).resolve().parents[1]
URL = "/notes/full"
PREFIX = "wkfull"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[PrivateRedis]:
    private = PrivateRedis(tmp_path / "redis")
    private.start()
    try:
        yield private
    finally:
        private.stop()


@pytest.fixture
def admin(server: PrivateRedis) -> Iterator[sync_redis.Redis]:
    r = sync_redis.Redis.from_url(server.url)
    yield r
    r.close()


def registry() -> Registry:
    reg = Registry()
    notes.register(reg)
    return reg


@pytest.fixture
async def rt(server: PrivateRedis) -> AsyncIterator[Runtime]:
    settings = Settings(
        redis_url=server.url,
        prefix=PREFIX,
        partitions=4,
        lease_ttl_ms=2000,
        retry_base_ms=20,
        retry_max_ms=200,
        shutdown_grace_s=2,
    )
    runtime = Runtime(registry(), settings=settings, run_worker=True)
    await runtime.start()
    try:
        yield runtime
    finally:
        await runtime.close()


def everything(admin: sync_redis.Redis) -> dict[bytes, Any]:
    """Every key of the keyspace and its value, to prove nothing changed."""
    out: dict[bytes, Any] = {}
    for key in admin.scan_iter(match=f"{PREFIX}:*"):
        kind = admin.type(key)
        if key.endswith(b":workers") or key.endswith(b":lease"):
            continue  # heartbeats and leases move on their own
        if kind == b"stream":
            out[key] = admin.xrange(key)
        elif kind == b"hash":
            out[key] = admin.hgetall(key)
        elif kind == b"string":
            out[key] = admin.get(key)
        elif kind == b"set":
            out[key] = admin.smembers(key)
        elif kind == b"zset":
            out[key] = admin.zrange(key, 0, -1, withscores=True)
    return out


def fill(admin: sync_redis.Redis) -> None:
    """Redis is full now: its maxmemory is below what it uses."""
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", 1)


def free(admin: sync_redis.Redis) -> None:
    admin.config_set("maxmemory", 0)


async def texts(rt: Runtime) -> list[str]:
    return [n["text"] for n in (await rt.state(URL))["notes"]]


async def test_a_send_to_a_full_redis_is_refused_and_nothing_is_written(rt, admin, server):
    await rt.send(URL, "add a")
    await rt.wait_idle(URL)
    before = everything(admin)
    fill(admin)
    try:
        with pytest.raises(RedisFullError, match="Redis is full"):
            await rt.send(URL, "add b")
        with pytest.raises(RedisFullError):
            await rt.send("/notes/new", "add x")  # a new entity: not even half created
        app = create_app(rt)
        http = httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://gw")
        async with http:
            reply = await http.post(f"/entities{URL}/messages", json={"payload": "add c"})
        assert reply.status_code == 507
        assert reply.json()["error"]["type"] == "RedisFullError"
        assert "Redis is full" in reply.json()["error"]["message"]
        env = {**os.environ, "WAKEFUL_PREFIX": PREFIX, "WAKEFUL_PARTITIONS": "4"}
        cli = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "wakeful.cli", "send", URL, "add d", "--redis", server.url],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert cli.returncode != 0 and "Redis is full" in cli.stderr, cli.stderr
        assert everything(admin) == before  # nothing of any refused send was written
        assert await texts(rt) == ["a"]  # reads still work
    finally:
        free(admin)
    await rt.send(URL, "add b")
    assert (await rt.wait_idle(URL)).status == "idle"
    assert await texts(rt) == ["a", "b"]


async def test_a_wake_whose_commit_does_not_fit_resumes_once_memory_is_freed(rt, admin):
    await rt.send(URL, "add a")
    await rt.wait_idle(URL)
    reached = 0

    def hook(point: str) -> None:
        nonlocal reached
        if point == "wake:before-commit":
            reached += 1
            if reached == 1:
                fill(admin)  # Redis fills up between the handler and its commit

    assert rt.worker is not None
    rt.worker.fault_hook = hook
    sent = await rt.send(URL, "add b")
    await until(lambda: _reached(lambda: reached, 3), 20, "the commit to be retried")
    assert rt.store is not None
    # Refused whole: the log ends with the message, no state event, the cursor before it.
    [(last_id, _)] = await rt.store.newest_log_entries(URL, 1)
    assert last_id == sent
    status = await rt.status(URL)
    assert status.status == "pending" and status.cursor != sent
    free(admin)
    assert (await rt.wait_idle(URL, timeout=20)).status == "idle"
    assert await texts(rt) == ["a", "b"]  # handled once, nothing parked
    assert (await rt.status(URL)).error is None


async def _reached(count: Any, n: int) -> bool:
    return bool(count() >= n)


async def test_a_worker_warns_about_an_eviction_policy(server, admin, caplog):
    admin.config_set("maxmemory-policy", "allkeys-lru")
    settings = Settings(redis_url=server.url, prefix=PREFIX, partitions=4)
    runtime = Runtime(registry(), settings=settings, run_worker=True)
    with caplog.at_level(logging.WARNING, logger="wakeful.worker"):
        await runtime.start()
        await runtime.close()
    assert any("allkeys-lru" in r.getMessage() for r in caplog.records)
    caplog.clear()
    admin.config_set("maxmemory-policy", "noeviction")
    runtime = Runtime(registry(), settings=settings, run_worker=True)
    with caplog.at_level(logging.WARNING, logger="wakeful.worker"):
        await runtime.start()
        await runtime.close()
    assert not any("maxmemory-policy" in r.getMessage() for r in caplog.records)


async def test_a_full_redis_keeps_the_leases_and_the_log_says_it_is_full(server, admin, caplog):
    """A full Redis refuses the heartbeat's ZADD but not a renewal's PEXPIRE (checked on
    Redis 7.0): the worker keeps its partitions past their lease, and its log names the
    cause (Redis is full), never "unreachable"."""
    settings = Settings(
        redis_url=server.url,
        prefix=PREFIX,
        partitions=4,
        lease_ttl_ms=3000,  # short, so that the test outlasts it soon
        heartbeat_interval_ms=300,
        retry_base_ms=20,
        retry_max_ms=200,
        shutdown_grace_s=2,
    )
    runtime = Runtime(registry(), settings=settings, run_worker=True)
    await runtime.start()
    try:
        worker = runtime.worker
        assert worker is not None
        await asyncio.wait_for(worker.ready.wait(), 20)
        await until(lambda: _holds_all(worker, 4), 20, "the worker to hold every partition")
        held = {p: lease.token for p, lease in worker.leases.items()}
        ttl_s = settings.lease_ttl_ms / 1000
        with caplog.at_level(logging.INFO, logger="wakeful.leases"):
            fill(admin)
            try:
                filled = time.monotonic()

                async def renewed_past_their_lapse() -> bool:
                    now_held = {p: lease.token for p, lease in worker.leases.items()}
                    assert now_held == held, "a lease was lost while Redis was full"
                    # Renewed after the lease taken before the fill would have lapsed.
                    ends = [lease.valid_until for lease in worker.leases.values()]
                    return min(ends) > filled + 2 * ttl_s

                await until(renewed_past_their_lapse, 30, "the leases to be renewed while full")
            finally:
                free(admin)
        messages = [r.getMessage() for r in caplog.records if r.name == "wakeful.leases"]
        assert any("Redis is full" in m for m in messages), messages
        assert not any("unreachable" in m or "lost partition" in m for m in messages), messages
        await runtime.send(URL, "add a")  # and once memory is freed, it goes on
        assert (await runtime.wait_idle(URL, timeout=20)).status == "idle"
        assert await texts(runtime) == ["a"]
    finally:
        await runtime.close()


async def _holds_all(worker: Any, n: int) -> bool:
    return len(worker.leases) == n
