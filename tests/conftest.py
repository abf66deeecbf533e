"""Test fixtures: every test that takes ``backend`` runs on fakeredis and on a real Redis.

The real Redis is ``WAKEFUL_TEST_REDIS_URL`` (default ``redis://127.0.0.1:6379/0``);
``.ci/run`` starts one when none answers. Each test gets its own key prefix, so
tests never see each other's data, and its keys are deleted afterwards.
"""

from __future__ import annotations

import importlib.abc
import os
import secrets
import shutil
import sys
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import fakeredis
import pytest
import redis
from redis.asyncio import Redis

from tests.apps.harness import PrivateRedis
from tests.cluster_helpers import SlotCheck
from wakeful import Registry, Runtime, Settings
from wakeful.connection import connect


class _SourceFoldersAreNotPackages(importlib.abc.MetaPathFinder):
    """The checkout's folders ``runtime/``, ``tools/`` and ``entities/`` install as
    ``wakeful``, ``wakeful.tools`` and ``wakeful.entities``. The repository root is on
    sys.path for ``tests.*``, which would let a stale ``import runtime`` load a second copy
    of the package; this finder turns that into an ImportError instead."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> None:
        if fullname.partition(".")[0] in {"runtime", "tools", "entities"}:
            raise ImportError(f"import {fullname!r} as wakeful.* (the installed name)")


sys.meta_path.insert(0, _SourceFoldersAreNotPackages())


@pytest.fixture(autouse=True)
def same_slot_check() -> Iterator[None]:
    """Every command that reaches a fakeredis server (the fake backend, the embedded
    runtime) must name keys of one cluster slot only, and every script may touch its
    own slot only: what a Redis Cluster refuses (CROSSSLOT) fails the test here."""
    SlotCheck.install()
    SlotCheck.reset()
    yield
    if seen := SlotCheck.reset():
        pytest.fail(f"commands over several cluster slots: {seen[:5]}")


REAL_REDIS_URL = os.environ.get("WAKEFUL_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
# WAKEFUL_TEST_CLUSTER=1 (scripts/test.sh --cluster) adds a third backend: a local Redis
# Cluster of 3 masters and 3 replicas (tests/cluster_helpers.py), started once per session.
BACKENDS = ["fake", "redis", *(["cluster"] if os.environ.get("WAKEFUL_TEST_CLUSTER") else [])]
TEST_LEASE_TTL_MS = 15_000
TEST_HEARTBEAT_MS = 333


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _real_redis_available() -> bool:
    try:
        return bool(redis.Redis.from_url(REAL_REDIS_URL, socket_connect_timeout=1).ping())
    except redis.RedisError:
        return False


@pytest.fixture(scope="session")
def real_redis_url() -> str:
    if not _real_redis_available():
        if os.environ.get("CI"):
            pytest.fail(f"no Redis answers at {REAL_REDIS_URL}; .ci/run should have started one")
        pytest.skip(f"no Redis at {REAL_REDIS_URL}")
    return REAL_REDIS_URL


@pytest.fixture(scope="session")
def tcp_fake_url() -> Iterator[str]:
    """A fakeredis server on a TCP port, so other processes can use the fake backend too."""
    server = fakeredis.TcpFakeServer(("127.0.0.1", 0), server_type="redis")
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"redis://127.0.0.1:{server.server_address[1]}/0"
    server.shutdown()


@pytest.fixture(scope="session")
def cluster_url() -> Iterator[str]:
    """A local Redis Cluster for the ``cluster`` backend (see BACKENDS)."""
    from tests.cluster_helpers import LocalCluster

    local = LocalCluster().start()
    try:
        yield local.url
    finally:
        local.stop()


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    if request.param == "redis":
        request.getfixturevalue("real_redis_url")
    if request.param == "cluster":
        global CLUSTER_URL
        CLUSTER_URL = request.getfixturevalue("cluster_url")
    return request.param


CLUSTER_URL = ""  # of the cluster backend, once a test asked for it


@pytest.fixture
def prefix() -> str:
    return f"t{secrets.token_hex(4)}"


@pytest.fixture
def server_url(backend: str, request: pytest.FixtureRequest) -> str:
    """A Redis URL reachable from other processes, for the current backend."""
    if backend == "cluster":
        return CLUSTER_URL
    return request.getfixturevalue("real_redis_url" if backend == "redis" else "tcp_fake_url")


class Cluster:
    """Builds runtimes (clients and in-process workers) that share one keyspace."""

    def __init__(self, backend: str, prefix: str) -> None:
        self.backend = backend
        self.prefix = prefix
        self.fake_server = fakeredis.FakeServer() if backend == "fake" else None
        self.runtimes: list[Runtime] = []

    def redis(self) -> Redis:
        if self.fake_server is not None:
            return fakeredis.aioredis.FakeRedis(server=self.fake_server)
        if self.backend == "cluster":
            return connect(CLUSTER_URL)
        return connect(REAL_REDIS_URL)  # the connection the runtime itself makes

    def settings(self, **overrides: Any) -> Settings:
        base: dict[str, Any] = {
            "prefix": self.prefix,
            "partitions": 4,
            # A lease long enough to outlast the stalls of a loaded machine (a lapse between
            # a tool call's intent and its execution leaves the call in doubt, never re-run),
            # renewed as often as a short one, so that joins, hand-overs and releases are
            # seen as fast. Tests about lapses (kills, zombies) ask for a short lease.
            "lease_ttl_ms": TEST_LEASE_TTL_MS,
            "heartbeat_interval_ms": TEST_HEARTBEAT_MS,
            "block_ms": 100,
            # Tests write timers and move the schedules' clock by hand (no hint tells the
            # worker): its safety-net read looks as often as the old poll did.
            "timer_poll_ms": 250,
            "retry_base_ms": 20,
            "retry_max_ms": 200,
            "shutdown_grace_s": 5,
        }
        if "lease_ttl_ms" in overrides:  # a short lease (a test about lapses): its own pace
            base["heartbeat_interval_ms"] = 0
        base.update(overrides)
        return Settings(**base)

    async def runtime(
        self, registry: Registry | None = None, *, run_worker: bool = True, **overrides: Any
    ) -> Runtime:
        rt = Runtime(
            registry or Registry(),
            settings=self.settings(**overrides),
            run_worker=run_worker,
            redis=self.redis(),
        )
        await rt.start()
        self.runtimes.append(rt)
        return rt

    async def close(self) -> None:
        for rt in reversed(self.runtimes):
            await rt.close()
        if self.backend == "redis":
            r = Redis.from_url(REAL_REDIS_URL)
            keys = [k async for k in r.scan_iter(match=f"{self.prefix}:*", count=1000)]
            if keys:
                await r.delete(*keys)
            await r.aclose()
        if self.backend == "cluster":  # SCAN on every master; DEL key by key (slots differ)
            c = connect(CLUSTER_URL)
            async for key in c.scan_iter(match=f"{self.prefix}:*", count=1000):
                await c.delete(key)
            await c.aclose()


@pytest.fixture
async def cluster(backend: str, prefix: str) -> AsyncIterator[Cluster]:
    c = Cluster(backend, prefix)
    try:
        yield c
    finally:
        await c.close()


MakeRuntime = Callable[..., Any]


@pytest.fixture
async def client(cluster: Cluster) -> Runtime:
    """A client without a worker whose partition inboxes have their consumer group, so a
    test can play the worker's part by hand (the script tests)."""
    rt = await cluster.runtime(run_worker=False)
    for p in range(rt.settings.partitions):
        await rt.store.ensure_group(p)
    return rt


@pytest.fixture
def store(client: Runtime) -> Any:
    """The store of :func:`client`."""
    return client.store


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    """A redis-server of the test's own, on a free port, that the test may kill and start
    again (AOF fsynced on every write); skipped where redis-server is not installed."""
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    server = PrivateRedis(tmp_path / "redis")
    server.start()
    try:
        yield server
    finally:
        server.stop()
