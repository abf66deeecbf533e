"""Crash safety with real faults: kill -9 of worker processes, SIGTERM, zombies, races.

Workers run as real ``wakeful worker`` subprocesses (``tests.apps.crashy``)
against ``server_url``: the real Redis, or a fakeredis TCP server for the fake
backend. Exactly-once is checked on the log itself: every message id must be
inserted by exactly one committed ``state`` event, and the counter must equal
the number of messages sent.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import msgspec
import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from tests.apps import crashy
from tests.apps.harness import (
    PARTITIONS,
    Workers,
    assert_exactly_once,
    client,
    entity_report,
    until,
    wait_all_idle,
)
from wakeful import Collection, HandlerContext, HandlerFailed, Message, Registry, Runtime
from wakeful.streamids import id_gt

pytestmark = pytest.mark.anyio
APP = "tests.apps.crashy:registry"


@pytest.fixture
async def side(server_url: str, prefix: str) -> AsyncIterator[Redis]:
    """A plain Redis client on the test's server: side-effect keys, raw lease keys."""
    r = Redis.from_url(server_url)
    try:
        yield r
    finally:
        keys = [k async for k in r.scan_iter(match=f"{prefix}:*", count=1000)]
        if keys:
            await r.delete(*keys)
        await r.aclose()


@pytest.fixture
def workers(server_url: str, prefix: str, tmp_path: Path) -> Iterator[Workers]:
    procs = Workers(server_url, prefix, tmp_path, APP)
    try:
        yield procs
    finally:
        procs.cleanup()
        procs.dump_logs()  # shown by pytest only when the test failed


@pytest.fixture
async def rt(server_url: str, prefix: str) -> AsyncIterator[Runtime]:
    runtime = client(server_url, prefix, crashy.registry)
    await runtime.start()
    try:
        yield runtime
    finally:
        await runtime.close()


async def starts(side: Redis, prefix: str, url: str, event_id: str) -> int:
    """How many times a handler started on the message ``event_id`` of ``url``."""
    return int(await side.hget(crashy.side_key(prefix, "starts"), f"{url} {event_id}") or 0)


async def delivered(side: Redis, workers: Workers, url: str) -> bool:
    """Every wake pointer of ``url`` was read by a worker, and one is still unacknowledged."""
    inbox = workers.keys.inbox(workers.keys.partition(url))
    [group] = await side.xinfo_groups(inbox)
    last = _s(group["last-delivered-id"])
    ids = [_s(i) for i, f in await side.xrange(inbox) if f[b"u"] == url.encode()]
    pending = {
        _s(p["message_id"]) for p in await side.xpending_range(inbox, "workers", "-", "+", 10_000)
    }
    return bool(ids) and not any(id_gt(i, last) for i in ids) and bool(pending & set(ids))


def _s(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


async def all_owned_by(workers: Workers, side: Redis, worker_id: str) -> bool:
    return await workers.owners(side) == [worker_id] * PARTITIONS


# -- 1. kill -9 mid-handler -------------------------------------------------------


@pytest.mark.parametrize(
    ("b_starts", "snapshot_every"),
    [("before_kill", 1000), ("after_kill", 1000), ("after_kill", 2)],
    ids=["before_kill", "after_kill", "after_kill-snapshots"],
)
async def test_kill9_mid_handler_next_worker_finishes_exactly_once(
    workers, rt, side, prefix, b_starts, snapshot_every
):
    """With ``snapshot_every=2`` both workers write and load snapshots all along, so the
    crash meets them: B rebuilds from A's snapshots plus the log after them."""
    workers_env = {"WAKEFUL_SNAPSHOT_EVERY": snapshot_every}
    a = workers.start(**workers_env)
    await workers.registered(side, a)
    await until(lambda: all_owned_by(workers, side, a.id), 10, "worker A to own every partition")

    urls = [f"/counter/k{i}" for i in range(3)]
    slow_url = urls[0]
    sent: dict[str, list[str]] = {u: [] for u in urls}
    for n in range(5):
        for u in urls:
            sent[u].append(await rt.send(u, {"i": n}))
    await wait_all_idle(rt, urls, 10)
    slow = await rt.send(slow_url, {"i": "slow", "sleep": 60})
    sent[slow_url].append(slow)
    for n in range(5, 10):  # queued behind the slow one, or for other entities
        for u in urls:
            sent[u].append(await rt.send(u, {"i": n}))
    await until(lambda: starts(side, prefix, slow_url, slow), 10, "A to start the slow handler")
    await until(lambda: delivered(side, workers, slow_url), 10, "A to read every pointer")

    if b_starts == "before_kill":
        b = workers.start(**workers_env)
        await workers.registered(side, b)
    a.kill()
    assert a.popen.returncode == -9
    if b_starts == "after_kill":
        b = workers.start(**workers_env)
        await workers.registered(side, b)
    for n in range(10, 15):  # nothing more for slow_url: only its orphaned pointers wake it
        for u in urls[1:]:
            sent[u].append(await rt.send(u, {"i": n}))

    await wait_all_idle(rt, urls, 15)
    reports = await assert_exactly_once(rt, sent)
    for url, report in reports.items():
        assert not report["failures"], (url, report["failures"])
    slow_row = reports[slow_url]["seen"][slow]
    assert slow_row["starts"] == 2, "the slow wake should have been interrupted once, then re-run"
    assert slow_row["pid"] == b.pid, "the interrupted wake must be finished by worker B"
    assert await starts(side, prefix, slow_url, slow) == 2
    pids = {row["pid"] for r in reports.values() for row in r["seen"].values()}
    assert pids == {a.pid, b.pid}, "A's committed work must survive its death"
    await until(lambda: all_owned_by(workers, side, b.id), 10, "B to own every partition")
    if snapshot_every == 2:
        for url in urls:
            assert "snap_upto" in await rt.store.meta(url), f"{url} was never snapshotted"


async def test_kill9_during_retry_backoff_keeps_attempt_count(workers, rt, side, prefix):
    # A waits 20 s before its second attempt: it is killed during that backoff.
    a = workers.start(WAKEFUL_RETRY_BASE_MS=20_000, WAKEFUL_RETRY_MAX_MS=20_000)
    await workers.registered(side, a)
    await until(lambda: all_owned_by(workers, side, a.id), 10, "worker A to own every partition")
    url = "/counter/flaky"
    msg = await rt.send(url, {"i": 1, "fail": 2})

    async def first_attempt_failed() -> bool:
        return (await rt.status(url)).attempts == 1

    await until(first_attempt_failed, 10, "A's first attempt to fail and be recorded")
    a.kill()
    assert await starts(side, prefix, url, msg) == 1, "A must have been killed during its backoff"

    b = workers.start()
    await workers.registered(side, b)
    await wait_all_idle(rt, [url], 15)
    report = (await assert_exactly_once(rt, {url: [msg]}))[url]
    attempts = [f.attempt for f in report["failures"] if isinstance(f, HandlerFailed)]
    assert attempts == [1, 2], f"attempt count not carried over from A to B: {attempts}"
    inputs = [f.inputs for f in report["failures"]]
    assert inputs[0] == inputs[1] and msg in inputs[0], inputs  # the same wake, retried
    assert report["seen"][msg]["starts"] == 3
    assert report["seen"][msg]["pid"] == b.pid
    assert report["status"].attempts == 0


# -- 2. graceful stop, then a second process continues ------------------------------


async def test_sigterm_drains_releases_leases_and_next_worker_continues(workers, rt, side, prefix):
    a = workers.start()
    await workers.registered(side, a)
    await until(lambda: all_owned_by(workers, side, a.id), 10, "worker A to own every partition")
    urls = [f"/counter/g{i}" for i in range(3)]
    sent: dict[str, list[str]] = {u: [] for u in urls}
    for n in range(5):
        for u in urls:
            sent[u].append(await rt.send(u, {"i": n}))
    await wait_all_idle(rt, urls, 10)
    slow = await rt.send(urls[1], {"i": "slow", "sleep": 1.0})
    sent[urls[1]].append(slow)
    await until(lambda: starts(side, prefix, urls[1], slow), 10, "A to start the slow handler")

    assert a.terminate() == 0, f"graceful stop should exit 0:\n{a.log()}"
    # Released on the way out, not left to expire: a successor can start at once.
    assert await workers.owners(side) == [None] * PARTITIONS
    members = [m.decode() for m in await side.zrange(workers.keys.workers, 0, -1)]
    assert a.id not in members, "A should have deregistered"
    assert (await rt.status(urls[1])).status == "idle", "A should finish the running wake"

    b = workers.start()
    await workers.registered(side, b)
    for n in range(5, 10):
        for u in urls:
            sent[u].append(await rt.send(u, {"i": n}))
    await wait_all_idle(rt, urls, 10)
    reports = await assert_exactly_once(rt, sent)
    for url, report in reports.items():
        assert not report["failures"], (url, report["failures"])
        for event_id, row in report["seen"].items():
            assert row["starts"] == 1, f"{event_id} re-ran after a graceful stop"
            first_batch = sent[url].index(event_id) < (6 if url == urls[1] else 5)
            assert row["pid"] == (a.pid if first_batch else b.pid), (url, event_id, row)


# -- 3. a zombie worker writes nothing -----------------------------------------------


class GatedRow(msgspec.Struct):
    id: str
    call: int


def gated_registry(gate: asyncio.Event, started: asyncio.Event, calls: list[str]) -> Registry:
    reg = Registry()

    @reg.entity("gated", state={"seen": Collection(primary_key="id", row=GatedRow)})
    async def gated(ctx: HandlerContext) -> None:
        for record in ctx.wake.events:
            if not isinstance(record.event, Message):
                continue
            calls.append(record.id)
            ctx.db.actions.seen_insert(row=GatedRow(record.id, len(calls)))
            if record.event.payload.get("block") and len(calls) == 1:
                started.set()
                await gate.wait()
            if record.event.payload.get("flush"):
                await ctx.flush()

    return reg


@pytest.mark.parametrize("commit_point", ["handler_end", "flush"])
async def test_zombie_worker_cannot_commit_and_owner_processes_once(cluster, commit_point):
    gate, started, calls = asyncio.Event(), asyncio.Event(), []
    rt = await cluster.runtime(gated_registry(gate, started, calls))
    worker, store = rt.worker, rt.store
    url = "/gated/z"
    p = store.keys.partition(url)
    lease_key = store.keys.lease(p)
    event_id = await rt.send(url, {"block": True, "flush": commit_point == "flush"})
    await asyncio.wait_for(started.wait(), 10)
    token = worker.leases[p].token

    # Another owner takes the partition while the handler runs: the worker is a zombie.
    await store.redis.set(lease_key, "thief:999999", px=60_000)

    async def lost() -> bool:
        return p not in worker.leases

    await until(lost, 5, "the worker to notice it lost the lease")
    log_before = await store.read_log(url)
    gate.set()

    async def fenced() -> bool:
        return worker.stats["commits_fenced"] >= 1

    await until(fenced, 5, "the zombie's commit to be refused")
    assert await store.read_log(url) == log_before, "a zombie wrote to the log"
    status = await rt.status(url)
    assert status.status == "pending" and status.cursor == "0-0"
    pending = await store.redis.xpending(store.keys.inbox(p), "workers")
    assert pending["pending"] == 1, "the wake pointer must stay unacknowledged"
    assert await store.redis.get(lease_key) == b"thief:999999"

    # The thief goes away; the rightful owner (a new epoch) processes the message once.
    await store.redis.delete(lease_key)
    assert (await rt.wait_idle(url, timeout=10)).status == "idle"
    assert worker.leases[p].token != token
    assert calls == [event_id, event_id]
    assert await rt.state(url) == {"seen": [{"id": event_id, "call": 2}]}
    report = await entity_report(rt, url)
    assert report["inserts"] == {event_id: 1}


async def test_paused_worker_process_wakes_up_as_a_zombie_and_writes_nothing(
    workers, rt, side, prefix
):
    """SIGSTOP stands in for a long GC pause or a frozen VM: the lease runs out."""
    a = workers.start()
    await workers.registered(side, a)
    await until(lambda: all_owned_by(workers, side, a.id), 10, "worker A to own every partition")
    url = "/counter/paused"
    first = await rt.send(url, {"i": 0})
    await wait_all_idle(rt, [url], 10)
    slow = await rt.send(url, {"i": 1, "sleep": 1.0})
    await until(lambda: starts(side, prefix, url, slow), 10, "A to start the slow handler")

    a.popen.send_signal(signal.SIGSTOP)
    try:
        b = workers.start()
        await workers.registered(side, b)

        async def done_by_b() -> bool:
            seen = {row["id"]: row for row in (await rt.state(url))["seen"]}
            return slow in seen and seen[slow]["pid"] == b.pid

        await until(done_by_b, 15, "B to take over from the paused A and finish the wake")
    finally:
        a.popen.send_signal(signal.SIGCONT)

    # A resumes mid-handler: its sleep is over, it commits with its old lease token.
    async def a_was_fenced() -> bool:
        return f"commit for {url} refused" in a.log()

    await until(a_was_fenced, 10, "the resumed A to try its commit and be refused")

    async def a_rejoined() -> bool:
        live = [m.decode() for m in await side.zrange(workers.keys.workers, 0, -1)]
        return a.id in live and None not in await workers.owners(side)

    await until(a_rejoined, 10, "A to rejoin the workers")
    more = [await rt.send(url, {"i": n}) for n in range(2, 6)]
    await wait_all_idle(rt, [url], 10)
    report = (await assert_exactly_once(rt, {url: [first, slow, *more]}))[url]
    assert not report["failures"], report["failures"]
    assert report["seen"][slow]["pid"] == b.pid
    assert a.alive(), "the zombie should recover, not crash"


async def test_a_worker_resumed_after_a_pause_asks_the_model_nothing(
    workers, rt, side, prefix, tmp_path
):
    """A pause between a commit and the next model request: once resumed, the zombie
    sees its lease's deadline passed and stops before paying for the step."""
    stop_file = tmp_path / "stopped"
    a = workers.start(CRASHY_STOP_ONCE=stop_file)
    await workers.registered(side, a)
    await until(lambda: all_owned_by(workers, side, a.id), 10, "worker A to own every partition")
    url = "/agent/paused"
    calls_key = f"{prefix}:crashy:model_calls:{url}"
    await rt.send(url, "note something")

    async def a_paused() -> bool:
        stat = Path(f"/proc/{a.pid}/stat")
        return stop_file.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "T"

    await until(a_paused, 15, "A to pause itself before its second model request")
    try:
        b = workers.start()
        await workers.registered(side, b)
        assert (await rt.wait_idle(url, timeout=20)).status == "idle"  # B finished the run
    finally:
        a.popen.send_signal(signal.SIGCONT)

    async def a_stopped_its_wake() -> bool:
        return f"wake of {url} interrupted" in a.log() or f"commit for {url} refused" in a.log()

    await until(a_stopped_its_wake, 15, "the resumed A to give its wake up")
    calls = [c.decode() for c in await side.lrange(calls_key, 0, -1)]
    assert calls == [f"{a.pid} 0", f"{b.pid} 1"], calls  # A asked for step 1 only
    assert f"wake of {url} interrupted" in a.log()
    assert a.alive()


# -- 4. single writer ---------------------------------------------------------------


async def send_many(rt: Runtime, urls: list[str], start: int, count: int) -> dict[str, list[str]]:
    """Send ``count`` messages round-robin over ``urls``, 25 at a time concurrently."""
    sent: dict[str, list[str]] = {u: [] for u in urls}
    for base in range(start, start + count, 25):
        batch = [(urls[n % len(urls)], n) for n in range(base, min(base + 25, start + count))]
        ids = await asyncio.gather(*(rt.send(u, {"i": n}) for u, n in batch))
        for (u, _), event_id in zip(batch, ids, strict=True):
            sent[u].append(event_id)
    return sent


def merge(total: dict[str, list[str]], more: dict[str, list[str]]) -> None:
    for url, ids in more.items():
        total.setdefault(url, []).extend(ids)


async def assert_no_overlap(side: Redis, prefix: str, lapsed: bool = False) -> None:
    """No two handlers of one entity ran at once, unless a lease ran out (``lapsed``):
    then the old owner's handler may still run as a zombie (its writes are fenced, which
    the exactly-once check covers), as on a machine too loaded to renew in time."""
    overlaps = int(await side.get(crashy.side_key(prefix, "overlaps")) or 0)
    log = await side.lrange(crashy.side_key(prefix, "overlap_log"), 0, -1)
    assert overlaps == 0 or lapsed, f"two wakes of one entity ran at once: {log}"


def leases_lapsed(caplog: pytest.LogCaptureFixture) -> bool:
    """Whether an in-process worker lost a lease it could not renew in time."""
    return any(
        "lost partition" in r.getMessage() and "handed over" not in r.getMessage()
        for r in caplog.records
    )


async def test_single_writer_across_worker_processes(workers, rt, side, prefix):
    urls = [f"/counter/s{i}" for i in range(5)]
    sent: dict[str, list[str]] = {}
    a = workers.start()
    await workers.registered(side, a)
    merge(sent, await send_many(rt, urls, 0, 100))
    b = workers.start()  # partitions move while messages flow
    c = workers.start()
    merge(sent, await send_many(rt, urls, 100, 100))
    await workers.registered(side, b)
    await workers.registered(side, c)
    merge(sent, await send_many(rt, urls, 200, 50))
    assert a.terminate() == 0  # and move back again
    merge(sent, await send_many(rt, urls, 250, 50))

    await wait_all_idle(rt, urls, 20)
    assert sum(len(ids) for ids in sent.values()) == 300
    reports = await assert_exactly_once(rt, sent)
    await assert_no_overlap(side, prefix)
    pids = {row["pid"] for r in reports.values() for row in r["seen"].values()}
    assert a.pid in pids and len(pids) >= 2, f"work should have moved between processes: {pids}"
    for url, report in reports.items():
        assert not report["failures"], (url, report["failures"])


async def test_single_writer_in_process_runtimes(cluster, prefix, caplog):
    side = cluster.redis()
    try:
        reg = crashy.build_registry(lambda: side, prefix)
        sender = await cluster.runtime(reg, run_worker=False)
        urls = [f"/counter/p{i}" for i in range(5)]
        sent: dict[str, list[str]] = {}
        first = await cluster.runtime(reg)
        await cluster.runtime(reg)
        merge(sent, await send_many(sender, urls, 0, 150))
        await cluster.runtime(reg)
        merge(sent, await send_many(sender, urls, 150, 75))
        await first.close()
        merge(sent, await send_many(sender, urls, 225, 75))
        await wait_all_idle(sender, urls, 20)
        await assert_exactly_once(sender, sent)
        await assert_no_overlap(side, prefix, lapsed=leases_lapsed(caplog))
    finally:
        await side.aclose()


# -- 6. Redis restart with AOF ------------------------------------------------------


async def send_until_accepted(rt: Runtime, url: str, n: int, timeout: float = 15) -> str:
    """Send with an idempotency key, retrying while Redis is away: each message lands once."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await rt.send(url, {"i": n}, idempotency_key=f"m{n}")
        except (RedisConnectionError, RedisTimeoutError, OSError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


@pytest.mark.redis_only
@pytest.mark.parametrize("outage_s", [0.5, 2.5], ids=["shorter-than-lease", "longer-than-lease"])
async def test_worker_survives_redis_kill9_and_restart_with_aof(
    private_redis, prefix, tmp_path, outage_s
):
    workers = Workers(private_redis.url, prefix, tmp_path, APP)
    side = Redis.from_url(private_redis.url)
    rt = client(private_redis.url, prefix, crashy.registry)
    await rt.start()
    try:
        w = workers.start()
        await workers.registered(side, w)
        urls = [f"/counter/aof{i}" for i in range(4)]
        sent: dict[str, list[str]] = {u: [] for u in urls}
        for n in range(20):
            sent[urls[n % 4]].append(await send_until_accepted(rt, urls[n % 4], n))
        await wait_all_idle(rt, urls, 10)
        for n in range(20, 40):  # acknowledged (fsynced), and still being processed...
            sent[urls[n % 4]].append(await send_until_accepted(rt, urls[n % 4], n))
        private_redis.kill()  # ...when Redis dies
        await asyncio.sleep(outage_s)  # the worker meets a dead Redis (its leases expire)
        private_redis.start()
        for n in range(40, 60):
            sent[urls[n % 4]].append(await send_until_accepted(rt, urls[n % 4], n))

        await wait_all_idle(rt, urls, 15)
        assert w.alive(), f"the worker died with Redis:\n{w.log()}"
        reports = await assert_exactly_once(rt, sent)
        late = [r["seen"][i] for u, r in reports.items() for i in sent[u][-5:]]
        assert all(row["pid"] == w.pid for row in late)
        assert w.terminate() == 0, "the worker should still stop gracefully"
    finally:
        workers.cleanup()
        workers.dump_logs()
        await rt.close()
        await side.aclose()


@pytest.mark.redis_only
async def test_a_pending_timer_survives_kill9_of_the_worker_and_a_redis_restart(
    private_redis, prefix, tmp_path
):
    """A timer set by a committed wake fires once, after the worker that set it was
    killed and Redis was killed and restarted (AOF) while it was pending."""
    workers = Workers(private_redis.url, prefix, tmp_path, APP)
    side = Redis.from_url(private_redis.url)
    rt = client(private_redis.url, prefix, crashy.registry)
    await rt.start()
    url = "/counter/timer"
    try:
        first = workers.start()
        await workers.registered(side, first)
        await rt.send(url, {"i": 0, "later": {"i": 100, "after": 2.0}})

        async def timer_pending() -> bool:
            status = await rt.status(url)
            return status.timers == 1 and status.cursor == status.last_input

        await until(timer_pending, 10, "the wake that sets the timer to commit")
        first.kill()
        private_redis.kill()
        await asyncio.sleep(0.3)
        private_redis.start()
        await side.aclose()
        side = Redis.from_url(private_redis.url)  # the old connections died with the server
        second = workers.start()
        await workers.registered(side, second)

        async def fired() -> bool:
            try:
                status = await rt.status(url)
            except (RedisConnectionError, OSError):  # a pooled connection from before
                return False
            return status.timers == 0 and status.status == "idle"

        await until(fired, 20, "the timer to fire and its message to be handled")
        report = await entity_report(rt, url)
        assert sorted(row["i"] for row in report["seen"].values()) == [0, 100]
        assert report["total"] == 2
        assert all(n == 1 for n in report["inserts"].values()), report["inserts"]
        assert [row["pid"] for row in report["seen"].values() if row["i"] == 100] == [second.pid]
    finally:
        workers.cleanup()
        workers.dump_logs()
        await rt.close()
        await side.aclose()
