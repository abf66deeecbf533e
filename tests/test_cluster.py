"""Redis Cluster: URLs, the key layout, and a real local 6-node cluster (3 masters,
3 replicas; ``tests/cluster_helpers.py``) for routing, spread, failover and the replica
wait. The tests that start a cluster are marked ``cluster``; they skip when
redis-server or redis-cli is missing."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from redis.crc import key_slot
from redis.exceptions import ClusterDownError, MasterDownError, MovedError, TryAgainError

from tests.cluster_helpers import LocalCluster, SlotCheck
from wakeful import HandlerContext, Registry, Runtime, Settings, cli
from wakeful.connection import connect, is_cluster, parse_cluster_url
from wakeful.errors import ConfigError, ReplicaWaitError
from wakeful.events import Message, decode_event
from wakeful.keys import Keyspace
from wakeful.script_runner import SEND
from wakeful.store import Store

HAVE_CLUSTER_TOOLS = bool(shutil.which("redis-server") and shutil.which("redis-cli"))
pytestmark = pytest.mark.anyio
needs_cluster = pytest.mark.skipif(not HAVE_CLUSTER_TOOLS, reason="redis-server/cli missing")

# -- URLs and keys (no cluster needed) -------------------------------------------------


def test_a_cluster_url_names_its_seeds_and_keeps_auth_and_tls() -> None:
    seeds, options = parse_cluster_url(
        "rediss+cluster://alice:s3cret@10.0.0.1:7000,10.0.0.2:7001?ssl_cert_reqs=none"
    )
    assert seeds == [("10.0.0.1", 7000), ("10.0.0.2", 7001)]
    assert options["username"] == "alice" and options["password"] == "s3cret"
    assert options["ssl"] is True and options["ssl_cert_reqs"] == "none"
    seeds, options = parse_cluster_url("redis+cluster://h:1")
    assert seeds == [("h", 1)] and "ssl" not in options


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("redis+cluster://", "names no node"),
        ("redis+cluster://alice:s3cret@h1", "is not host:port"),
        ("redis+cluster://h1:7000,h2:x", "is not host:port"),
        ("redis+cluster://h1:7000/3", "database 0 only"),
    ],
)
def test_a_malformed_cluster_url_says_why_without_its_password(url: str, why: str) -> None:
    with pytest.raises(ConfigError, match=why) as caught:
        connect(url)
    assert "s3cret" not in str(caught.value)


def test_the_prefix_is_inside_the_hash_tag_of_every_partition_key() -> None:
    a, b = Keyspace("alpha", 16), Keyspace("beta", 16)
    url = "/echo/x"
    p = a.partition(url)
    keys = [a.log(url), a.meta(url), a.snap(url), a.inbox(p), a.lease(p), a.idem(url, "k")]
    assert all(k.startswith("alpha:{alpha:p") for k in keys)
    assert len({key_slot(k.encode()) for k in keys}) == 1
    # partition N of two keyspaces: two slots (the tag {pN} alone made it one)
    assert key_slot(a.inbox(3).encode()) != key_slot(b.inbox(3).encode())


def test_a_prefix_with_a_brace_is_refused() -> None:
    with pytest.raises(ConfigError, match="must not contain"):
        Keyspace("w{k}", 16)


async def test_a_keyspace_of_the_old_layout_is_refused_with_what_to_do(cluster: Any) -> None:
    redis = cluster.redis()
    await redis.hset(f"{cluster.prefix}:config", "partitions", 4)  # written before layouts
    store = Store(redis, Keyspace(cluster.prefix, 4), idempotency_ttl_ms=1000)
    with pytest.raises(ConfigError, match="another key layout") as caught:
        await store.setup()
    assert "WAKEFUL_PREFIX" in str(caught.value)
    await redis.aclose()


async def test_a_new_keyspace_records_its_layout(cluster: Any) -> None:
    rt = await cluster.runtime(run_worker=False)
    assert await rt.store.redis.hget(f"{cluster.prefix}:config", "layout") == b"2"


def test_the_cli_exits_6_when_no_cluster_node_answers() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = subprocess.run(
        [sys.executable, "-m", "wakeful.cli", "inspect", "/echo/x"],
        env={"WAKEFUL_REDIS_URL": f"redis+cluster://127.0.0.1:{port}", "PATH": ""},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 6, result.stderr
    assert "Traceback" not in result.stderr
    assert "Redis Cluster" in result.stderr or "cannot reach" in result.stderr


# -- a real cluster -----------------------------------------------------------------


@pytest.fixture
def local_cluster() -> Iterator[LocalCluster]:
    if not HAVE_CLUSTER_TOOLS:
        pytest.skip("redis-server or redis-cli is missing")
    cluster = LocalCluster().start()
    try:
        yield cluster
    finally:
        cluster.stop()


class Recorder:
    """What the handler saw: every message payload, with how often."""

    def __init__(self) -> None:
        self.seen: Counter[int] = Counter()
        self.changed = asyncio.Event()

    def registry(self) -> Registry:
        registry = Registry()

        @registry.entity("echo", description="records its messages")
        async def echo(ctx: HandlerContext) -> None:
            for m in ctx.wake.messages:
                self.seen[int(m.payload)] += 1
            self.changed.set()

        return registry

    async def until(self, done: Any, timeout: float) -> None:
        async with asyncio.timeout(timeout):
            while not done():
                self.changed.clear()
                await self.changed.wait()


def settings(url: str, **overrides: Any) -> Settings:
    base: dict[str, Any] = {
        "redis_url": url,
        "prefix": "wkc",
        "partitions": 16,
        "lease_ttl_ms": 3000,
        "block_ms": 100,
        "retry_base_ms": 20,
        "retry_max_ms": 200,
        "shutdown_grace_s": 5,
    }
    return Settings(**{**base, **overrides})


@pytest.fixture
async def runtimes() -> AsyncIterator[list[Runtime]]:
    made: list[Runtime] = []
    yield made
    for rt in reversed(made):
        await rt.close()


def url_in(keys: Keyspace, partition: int, n: int = 0) -> str:
    """The ``n``-th entity url (of /echo/e<i>) that lives in ``partition``."""
    found = [u for i in range(10_000) if keys.partition(u := f"/echo/e{i}") == partition]
    return found[n]


@pytest.mark.cluster
@needs_cluster
async def test_partitions_spread_over_every_master_and_wakes_run(
    local_cluster: LocalCluster, runtimes: list[Runtime]
) -> None:
    recorder = Recorder()
    s = settings(local_cluster.url)
    rt = await Runtime(recorder.registry(), settings=s, run_worker=True).start()
    runtimes.append(rt)
    assert rt.store is not None and is_cluster(rt.store.redis)
    keys = rt.store.keys
    masters = Counter(
        local_cluster.node_of_slot(key_slot(keys.inbox(p).encode())).port for p in range(16)
    )
    assert len(masters) == 3, masters  # every master holds partitions
    urls = [url_in(keys, p) for p in range(16)]
    for i, url in enumerate(urls):
        await rt.send(url, i, idempotency_key=f"m{i}")
    await recorder.until(lambda: len(recorder.seen) == 16, 30)
    assert set(recorder.seen.values()) == {1}
    # a waiting client hears the commit's idle notice (not only its re-checks)
    notices = rt._notices
    assert notices is not None
    channel = keys.idle_channel(urls[0])
    heard = await notices.watch(channel)
    await rt.send(urls[0], 99)
    await asyncio.wait_for(heard.wait(), 10)
    await notices.unwatch(channel, heard)
    assert (await rt.status(urls[0])).status == "idle"
    assert sorted(rt.worker.leases) == list(range(16))  # type: ignore[union-attr]


@pytest.mark.cluster
@needs_cluster
async def test_failover_loses_no_acknowledged_send_and_healthy_partitions_go_on(
    local_cluster: LocalCluster, runtimes: list[Runtime]
) -> None:
    """kill -9 a master while a client sends with idempotency keys and the replica wait
    on: every acknowledged message is handled exactly once, the partitions of the
    healthy masters keep their leases and keep waking while the failover runs, and the
    promoted replica gets the scripts it never had."""
    recorder = Recorder()
    s = settings(local_cluster.url, replica_wait=1, replica_wait_ms=2000)
    worker_rt = await Runtime(recorder.registry(), settings=s, run_worker=True).start()
    runtimes.append(worker_rt)
    client = await Runtime(recorder.registry(), settings=s, run_worker=False).start()
    runtimes.append(client)
    assert worker_rt.worker is not None and client.store is not None
    keys = client.store.keys
    slot_of = {p: key_slot(keys.inbox(p).encode()) for p in range(16)}
    victim = local_cluster.node_of_slot(slot_of[0])
    doomed = {p for p in range(16) if local_cluster.node_of_slot(slot_of[p]) is victim}
    healthy = [p for p in range(16) if p not in doomed]
    replica = local_cluster.replica_of(victim)
    assert replica.client().script_exists(SEND.cluster_sha) == [
        False
    ]  # SCRIPT LOAD is not replicated
    tokens = {p: worker_rt.worker.leases[p].token for p in healthy}

    acknowledged: set[int] = set()
    sent_to: dict[int, str] = {}

    async def send(n: int, url: str) -> None:
        sent_to[n] = url
        while True:  # a send that failed may have been applied: the key makes a retry safe
            try:
                await client.send(url, n, idempotency_key=f"m{n}")
                acknowledged.add(n)
                return
            except Exception:
                await asyncio.sleep(0.05)

    urls = [url_in(keys, p, i) for i in range(2) for p in range(16)]
    for n in range(64):  # before the kill
        await send(n, urls[n % len(urls)])
    await recorder.until(lambda: acknowledged <= set(recorder.seen), 30)

    local_cluster.kill(victim)
    doomed_sends = asyncio.gather(*(send(n, url_in(keys, 0, n % 2)) for n in range(64, 96)))
    # Healthy partitions wake while the dead master's replica has not taken over yet.
    healthy_urls = [url_in(keys, p) for p in healthy]
    for j, url in enumerate(healthy_urls):
        await send(1000 + j, url)
    await recorder.until(
        lambda: all(1000 + j in recorder.seen for j in range(len(healthy_urls))), 30
    )
    assert local_cluster.role(replica) == "slave", "the healthy partitions waited for the failover"

    # in a thread: the worker runs in this event loop and must go on renewing its leases
    await asyncio.to_thread(local_cluster.wait_promoted, replica)
    # The promoted replica has no replica of its own: sends there wait (ReplicaWaitError,
    # retried) until the killed node is back as its replica.
    await asyncio.to_thread(local_cluster.restart, victim)
    await asyncio.wait_for(doomed_sends, 60)
    for n in range(96, 160):
        await send(n, urls[n % len(urls)])
    await recorder.until(lambda: acknowledged <= set(recorder.seen), 60)

    assert acknowledged <= set(recorder.seen), sorted(acknowledged - set(recorder.seen))
    # Each message is in its entity's log once (a wake may run again after a lost lease:
    # wakes are at least once, what they commit is fenced).
    in_logs: Counter[Any] = Counter()
    for url in set(sent_to.values()):
        in_logs.update(await payloads(client.store, url))
    assert {n: in_logs[n] for n in acknowledged if in_logs[n] != 1} == {}
    assert {p: worker_rt.worker.leases[p].token for p in healthy} == tokens
    assert local_cluster.role(replica) == "master"
    assert replica.client().script_exists(SEND.cluster_sha) == [True]


async def payloads(store: Store, url: str) -> list[Any]:
    entries = await store.read_log(url)
    events = [decode_event(fields[b"e"]) for _, fields in entries]
    return [e.payload for e in events if isinstance(e, Message)]


@pytest.mark.cluster
@needs_cluster
async def test_with_the_replica_wait_an_acknowledged_send_survives_kill_9_of_its_master(
    local_cluster: LocalCluster, runtimes: list[Runtime]
) -> None:
    """A send is acknowledged only once its replica has it (WAIT). Its replica stopped,
    a send is refused (ReplicaWaitError) instead of acknowledged; then the master is
    killed and the stale replica promoted: every acknowledged send is there. Without
    the wait the second send is acknowledged, and lost with its master."""
    s = settings(local_cluster.url, replica_wait=1, replica_wait_ms=500)
    client = await Runtime(Recorder().registry(), settings=s, run_worker=False).start()
    runtimes.append(client)
    assert client.store is not None
    url = url_in(client.store.keys, 5)
    master = local_cluster.node_of_slot(key_slot(client.store.keys.log(url).encode()))
    replica = local_cluster.replica_of(master)
    acknowledged = []
    # The replicas are healthy here, but on a loaded machine one may confirm after the
    # 500 ms: the send is then written and unconfirmed, and retried with its key, as the
    # error says (it failed once so under a CPU hog).
    for attempt in range(20):
        try:
            await client.send(url, 1, idempotency_key="m1")
            break
        except ReplicaWaitError:
            if attempt == 19:
                raise
    acknowledged.append(1)
    # Replication stalls: the replica stopped, and its link cut, so that nothing written
    # from now on reaches it (even into its socket buffer).
    os.kill(replica.proc.pid, signal.SIGSTOP)
    try:
        master.client().client_kill_filter(_type="replica")
        try:
            await client.send(url, 2, idempotency_key="m2")
            acknowledged.append(2)
        except ReplicaWaitError as exc:
            assert exc.confirmed == 0
        local_cluster.kill(master)
    finally:
        os.kill(replica.proc.pid, signal.SIGCONT)
    await asyncio.to_thread(local_cluster.wait_promoted, replica)
    found: list[Any] = []
    for _ in range(100):  # the client finds the promoted replica
        try:
            found = await payloads(client.store, url)
            break
        except Exception:
            await asyncio.sleep(0.1)
    assert set(acknowledged) <= set(found), (acknowledged, found)


async def test_the_same_slot_check_catches_keys_of_one_script_in_two_slots(
    cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check every fakeredis test runs under (conftest ``same_slot_check``) is live:
    without the hash tag, one send's keys spread over several slots, and it says so."""
    if cluster.backend != "fake":
        pytest.skip("the check watches fakeredis")
    monkeypatch.setattr(Keyspace, "tag", lambda self, p: f"{self.prefix}:p{p}")
    rt = await cluster.runtime(Recorder().registry(), run_worker=False)
    await rt.send("/echo/a", 1)
    seen = SlotCheck.reset()
    assert any("EVALSHA" in v and "slots" in v for v in seen), seen


@pytest.mark.cluster
@needs_cluster
async def test_resharding_while_messages_flow_loses_and_duplicates_nothing(
    local_cluster: LocalCluster, runtimes: list[Runtime]
) -> None:
    """Two partitions' slots move to another master, key by key, while a client sends
    to their entities (ASK, TRYAGAIN, then MOVED): every message is in its entity's log
    once, and each is handled."""
    recorder = Recorder()
    s = settings(local_cluster.url)
    worker_rt = await Runtime(recorder.registry(), settings=s, run_worker=True).start()
    runtimes.append(worker_rt)
    client = await Runtime(recorder.registry(), settings=s, run_worker=False).start()
    runtimes.append(client)
    assert client.store is not None
    keys = client.store.keys
    moving = [1, 2]
    urls = [url_in(keys, p, i) for p in moving for i in range(3)]
    sent_to: dict[int, str] = {}
    acknowledged: set[int] = set()
    stop = asyncio.Event()

    async def sender() -> None:
        n = 0
        while not stop.is_set() or n < 40:
            url = sent_to[n] = urls[n % len(urls)]
            while True:
                try:
                    await client.send(url, n, idempotency_key=f"m{n}")
                    break
                except Exception:
                    await asyncio.sleep(0.02)
            acknowledged.add(n)
            n += 1
            await asyncio.sleep(0.005)

    sending = asyncio.create_task(sender())
    for p in moving:
        slot = key_slot(keys.inbox(p).encode())
        source = local_cluster.node_of_slot(slot)
        target = next(n for n in local_cluster.primaries() if n is not source)
        await asyncio.to_thread(local_cluster.move_slot, slot, target)
        assert local_cluster.node_of_slot(slot) is target
    stop.set()
    await asyncio.wait_for(sending, 60)
    await recorder.until(lambda: acknowledged <= set(recorder.seen), 60)
    in_logs: Counter[Any] = Counter()
    for url in set(sent_to.values()):
        in_logs.update(await payloads(client.store, url))
    assert {n: in_logs[n] for n in acknowledged if in_logs[n] != 1} == {}


@pytest.mark.cluster
@needs_cluster
async def test_a_cancel_reaches_the_running_wake_over_the_partition_shard_channel(
    local_cluster: LocalCluster, runtimes: list[Runtime]
) -> None:
    """``rt.cancel`` is relayed to the worker running the entity over the partition's
    shard channel, while the wake runs (not only at its next wake)."""
    started = asyncio.Event()
    registry = Registry()

    @registry.entity("slow", description="runs a while")
    async def slow(ctx: HandlerContext) -> None:
        started.set()
        await asyncio.sleep(5)

    rt = await Runtime(registry, settings=settings(local_cluster.url), run_worker=True).start()
    runtimes.append(rt)
    assert rt.worker is not None
    relayed: asyncio.Queue[tuple[str, str]] = asyncio.Queue()
    relay = rt.worker.runners.cancel
    rt.worker.runners.cancel = lambda url, reason: (
        relayed.put_nowait((url, reason)),
        relay(url, reason),
    )  # type: ignore[method-assign]
    await rt.send("/slow/a", "go")
    await asyncio.wait_for(started.wait(), 30)
    await rt.cancel("/slow/a", "enough")
    assert await asyncio.wait_for(relayed.get(), 10) == ("/slow/a", "enough")


@pytest.mark.cluster
@needs_cluster
async def test_a_plain_url_of_a_cluster_node_is_refused_with_the_url_to_use(
    local_cluster: LocalCluster,
) -> None:
    keys = Keyspace("wkc", 16)
    serving = local_cluster.node_of_slot(key_slot(keys.config.encode()))
    other = next(n for n in local_cluster.primaries() if n is not serving)
    redis = connect(f"redis://127.0.0.1:{other.port}/0")
    store = Store(redis, keys, idempotency_ttl_ms=1000)
    with pytest.raises(ConfigError, match=r"redis\+cluster://"):
        await store.setup()
    await redis.aclose()


@pytest.mark.parametrize(
    "error",
    [
        ClusterDownError("The cluster is down"),
        MasterDownError("Link with MASTER is down"),
        TryAgainError("Multiple keys request during rehashing of slot"),
        MovedError("1694 127.0.0.1:7001"),
        ReplicaWaitError("SEND", 0, 1, 1000),
    ],
    ids=lambda e: type(e).__name__,
)
def test_the_cli_exits_6_on_a_cluster_failing_over(
    error: Exception, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A failover or a slot migration under way is "try again", like Redis being down:
    exit code 6 and one line, not a traceback."""

    async def failing(args: Any) -> int:
        raise error

    monkeypatch.setitem(cli.COMMANDS, "inspect", failing)
    monkeypatch.setenv("WAKEFUL_REDIS_URL", "redis+cluster://127.0.0.1:7000")
    assert cli.main(["inspect", "/echo/x"]) == 6
    stderr = capsys.readouterr().err
    assert "Traceback" not in stderr and "error:" in stderr


@pytest.mark.cluster
@needs_cluster
async def test_reads_over_every_partition_work_on_a_cluster(
    local_cluster: LocalCluster, runtimes: list[Runtime]
) -> None:
    """The reads that span partitions (so slots and masters) go one pipeline per master,
    never CROSSSLOT: ``rt.workers()`` and partition owners (lease holders), the metrics'
    partition counts, the dead-letter streams, ``rt.list``, ``rt.statuses``,
    ``rt.states``, the console's listing and ``wakeful workers``."""
    import httpx

    from tests.apps.harness import until
    from wakeful.gateway import create_app
    from wakeful.health import keyspace_view

    recorder = Recorder()
    rt = await Runtime(
        recorder.registry(), settings=settings(local_cluster.url), run_worker=True
    ).start()
    runtimes.append(rt)
    assert rt.store is not None and rt.worker is not None
    keys = rt.store.keys
    urls = [url_in(keys, p) for p in range(16)]
    for i, url in enumerate(urls):
        await rt.send(url, i)
    await rt.wait_all_idle(timeout=60)
    assert sorted(await rt.list("echo")) == sorted(urls)
    statuses = await rt.statuses(urls)
    assert {url: s.status if s else None for url, s in statuses.items()} == dict.fromkeys(
        urls, "idle"
    )
    states = await rt.states(urls)
    assert set(states) == set(urls) and all(state is not None for state in states.values())
    # lease holders, through rt.workers() and the partition owners
    [listed] = await rt.workers()
    assert listed.id == rt.worker.id and listed.partitions == list(range(16))
    assert set((await rt.partition_owners()).values()) == {rt.worker.id}
    # partition counts (the metrics' gauges)
    view = await keyspace_view(rt)
    assert [p.partition for p in view.partitions] == list(range(16))
    # the dead-letter streams of partitions on two masters
    far = next(
        p
        for p in range(16)
        if local_cluster.node_of_slot(key_slot(keys.inbox(p).encode())).port
        != local_cluster.node_of_slot(key_slot(keys.inbox(0).encode())).port
    )
    for p in (0, far):
        await rt.store.redis.xadd(keys.inbox(p), {"x": "no url"})

    async def both_moved_aside() -> list[dict[str, str]] | None:
        items = await rt.bad_items()
        return items if {i["partition"] for i in items} == {"0", str(far)} else None

    items = await until(both_moved_aside, 30, "both bad pointers moved aside")
    assert {i["kind"] for i in items} == {"pointer"}
    # the console's listing (its rows are bulk reads)
    transport = httpx.ASGITransport(create_app(rt))
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as http:
        listing = (await http.get("/entities?limit=100")).json()
    assert sorted(row["url"] for row in listing["entities"]) == sorted(urls)
    # ``wakeful workers`` (a process of its own, a client of the cluster)
    env = {**os.environ, "WAKEFUL_REDIS_URL": local_cluster.url, "WAKEFUL_PREFIX": "wkc"}
    done = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "wakeful.cli", "workers", "--json"],
        env={**env, "WAKEFUL_PARTITIONS": "16"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert rt.worker.id in done.stdout and '"unserved": []' in done.stdout


@pytest.mark.cluster
@needs_cluster
async def test_an_idle_wait_hears_its_entity_master_and_its_successor_after_failover(
    local_cluster: LocalCluster, runtimes: list[Runtime]
) -> None:
    """A waiting client's idle channel is a shard channel subscribed on the master of
    the entity's slot; kill -9 that master and the subscription is made again on the
    promoted replica, where the next commit's notice is heard."""
    from tests.apps.harness import until

    recorder = Recorder()
    rt = await Runtime(
        recorder.registry(), settings=settings(local_cluster.url), run_worker=True
    ).start()
    runtimes.append(rt)
    assert rt.store is not None and rt._notices is not None
    keys, channels = rt.store.keys, rt.store.channels
    url = url_in(keys, 5)
    victim = local_cluster.node_of_slot(key_slot(keys.inbox(5).encode()))
    replica = local_cluster.replica_of(victim)
    channel = keys.idle_channel(url)
    assert key_slot(channel.encode()) == key_slot(keys.meta(url).encode())
    heard = await rt._notices.watch(channel)
    await rt.send(url, 1)
    await asyncio.wait_for(heard.wait(), 30)
    with victim.client() as node:
        assert node.execute_command("PUBSUB", "SHARDNUMSUB", channel)[1] == 1

    local_cluster.kill(victim)
    await asyncio.to_thread(local_cluster.wait_promoted, replica)

    def on_replica() -> bool:
        with replica.client() as node:
            return bool(node.execute_command("PUBSUB", "SHARDNUMSUB", channel)[1] == 1)

    await until(lambda: asyncio.to_thread(on_replica), 30, "the SSUBSCRIBE on the replica")
    assert channels.subscribed(channel)
    heard.clear()
    await rt.send(url, 2)  # once the worker holds the partition again, its commit notifies
    await asyncio.wait_for(heard.wait(), 60)
    await recorder.until(lambda: recorder.seen[2] == 1, 30)
    await rt._notices.unwatch(channel, heard)
