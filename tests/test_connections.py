"""Connections and timeouts (issue 12, items 1, 9 and 11).

* Followers wait through a quiet entity: ``ask``, ``tail -f`` and the gateway's event
  stream across a handler that writes nothing for 12 s (longer than redis-py's default
  socket timeout of 5 s, which a blocking read used to outlast).
* Client calls queue for a connection instead of failing; a worker started while Redis
  loads its dataset waits, saying so.
* The gateway caps its event streams (503 + Retry-After) and its worker keeps its leases
  on connections of its own while the streams are at the cap.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import shutil
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis as sync_redis
import uvicorn

from tests.apps import quiet
from tests.apps.harness import free_port, until
from wakeful import ConfigError, Registry, Runtime, Settings
from wakeful.authorization import allow_all
from wakeful.gateway import bearer_tokens, create_app

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[1]


def cli(server_url: str, prefix: str, *args: str) -> list[str]:
    return [sys.executable, "-m", "wakeful.cli", *args, "--redis", server_url]


def cli_env(prefix: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WAKEFUL_")}
    return {**env, "WAKEFUL_PREFIX": prefix, "WAKEFUL_PARTITIONS": "4"}


def worker_process(server_url: str, prefix: str, log_path: Path) -> subprocess.Popen[bytes]:
    """``wakeful worker tests.apps.quiet:registry`` on ``server_url``, its output (stdout
    and stderr) written to ``log_path``."""
    with open(log_path, "wb") as log_file:
        return subprocess.Popen(
            cli(server_url, prefix, "worker", "tests.apps.quiet:registry"),
            cwd=ROOT,
            env=cli_env(prefix),
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )


def settings(server_url: str, prefix: str, **overrides: object) -> Settings:
    base: dict[str, object] = {
        "redis_url": server_url,
        "prefix": prefix,
        "partitions": 4,
        "lease_ttl_ms": 1000,
        "retry_base_ms": 20,
    }
    base.update(overrides)
    return Settings(**base)  # type: ignore[arg-type]


@pytest.fixture
async def quiet_worker(server_url: str, prefix: str) -> AsyncIterator[Runtime]:
    rt = Runtime(quiet.registry, settings=settings(server_url, prefix), run_worker=True)
    await rt.start()
    yield rt
    await rt.close()


def test_a_blocking_read_never_outlasts_its_socket_timeout():
    from wakeful.connection import block_ms, connect

    client = connect("redis://127.0.0.1:1/0", socket_timeout_s=4)
    assert block_ms(client, 500) == 500
    assert block_ms(client, 5000) == 2000
    assert block_ms(client, 0) == 2000  # "block for ever" is a block of at most 2 s, repeated
    no_timeout = connect("redis://127.0.0.1:1/0", socket_timeout_s=None)  # type: ignore[arg-type]
    assert block_ms(no_timeout, 5000) == 5000


async def test_the_workers_inbox_reads_stay_within_the_socket_timeout(server_url, prefix):
    """``block_ms`` above the socket timeout: each XREADGROUP still returns in time (it
    blocks at most half the socket timeout), so an idle worker's reads never time out."""
    s = settings(server_url, prefix, socket_timeout_s=1.0, block_ms=30_000)
    rt = Runtime(quiet.registry, settings=s, run_worker=True)
    async with rt:
        assert rt.worker is not None
        store = rt.worker.store
        read = store.read_inbox
        outcomes: list[str] = []

        async def counted(*args, **kwargs):
            try:
                pointers = await read(*args, **kwargs)
            except Exception as exc:
                outcomes.append(repr(exc))
                raise
            outcomes.append("read")
            return pointers

        store.read_inbox = counted  # type: ignore[method-assign]

        async def idle_reads_returned() -> bool:
            return outcomes.count("read") >= 2 or any(o != "read" for o in outcomes)

        await until(idle_reads_returned, 30, "two idle inbox reads to return")
        assert set(outcomes) == {"read"}, outcomes
        assert await rt.ask("/echo/idle", "still there?") == "echo still there?"


# -- item 1: quiet streams -----------------------------------------------------------


async def test_ask_tail_and_sse_wait_through_a_quiet_handler(quiet_worker, server_url, prefix):
    """One quiet run of 12 s, followed at once by ``wakeful ask``, ``wakeful tail -f`` and
    the event stream of a ``wakeful serve``: each gets the reply, none is cut off."""
    url = "/quiet/q1"
    await quiet_worker.create("quiet", "q1")
    await quiet_worker.wait_idle(url)
    env = cli_env(prefix)
    port = free_port()
    serve = subprocess.Popen(
        cli(server_url, prefix, "serve", "tests.apps.quiet:registry", "--port", str(port)),
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    tail = subprocess.Popen(
        cli(server_url, prefix, "tail", url, "-f", "--json"),
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        tail_lines: list[dict] = []

        def read_tail(until_kind: str) -> None:
            assert tail.stdout is not None
            for line in tail.stdout:
                tail_lines.append(json.loads(line))
                if tail_lines[-1].get("event", {}).get("t") == until_kind:
                    return

        await asyncio.wait_for(asyncio.to_thread(read_tail, "created"), 30)  # tail is following
        base = f"http://127.0.0.1:{port}"

        async def serving() -> bool:
            if serve.poll() is not None:
                raise AssertionError(f"serve exited: {serve.stderr.read()}")  # type: ignore[union-attr]
            try:
                async with httpx.AsyncClient() as http:
                    return (await http.get(base + "/openapi.json")).status_code == 200
            except httpx.TransportError:
                return False

        await until(serving, 30, "wakeful serve to answer", interval=0.1)
        sse_kinds: list[str] = []
        async with (
            httpx.AsyncClient(timeout=httpx.Timeout(60)) as http,
            http.stream("GET", f"{base}/entities/quiet/q1/events") as stream,
        ):
            assert stream.status_code == 200
            lines = stream.aiter_lines()

            async def read_sse(until_kind: str) -> None:
                async for line in lines:
                    if line.startswith("event: "):
                        sse_kinds.append(line.removeprefix("event: "))
                        if sse_kinds[-1] == until_kind:
                            return

            await asyncio.wait_for(read_sse("created"), 30)  # the stream is following
            asked = await asyncio.to_thread(
                subprocess.run,
                cli(server_url, prefix, "ask", url, "hello", "--timeout", "60"),
                cwd=ROOT,
                env=env,
                capture_output=True,
                text=True,
                timeout=90,
            )
            problems = []
            if asked.returncode != 0 or asked.stdout != "after a silence: hello\n":
                problems.append(f"ask exited {asked.returncode}: {asked.stdout!r} {asked.stderr}")
            try:  # the same stream, never cut
                await asyncio.wait_for(read_sse("run_finished"), 30)
            except (httpx.HTTPError, TimeoutError) as exc:
                problems.append(f"the event stream was cut: {exc!r}")
            if sse_kinds[-1:] != ["run_finished"]:
                problems.append(f"the event stream ended at {sse_kinds}")
        await asyncio.wait_for(asyncio.to_thread(read_tail, "run_finished"), 30)
        if tail.poll() is not None:
            problems.append(f"tail -f exited {tail.returncode}")
        if [r["event"]["t"] for r in tail_lines if "event" in r][-1:] != ["run_finished"]:
            problems.append(f"tail -f stopped at {tail_lines[-1:]}")
        assert not problems, problems
    finally:
        for proc in (tail, serve):
            proc.terminate()
            proc.wait(timeout=10)
    serve_err = serve.stderr.read()  # type: ignore[union-attr]
    tail_err = tail.stderr.read()  # type: ignore[union-attr]
    assert "Traceback" not in serve_err, serve_err
    assert "Traceback" not in tail_err and "Timeout" not in tail_err, tail_err


# -- item 11: client calls in parallel, a Redis that loads ------------------------------


async def test_500_concurrent_reads_queue_for_a_connection(quiet_worker, server_url, prefix):
    url = "/echo/many"
    await quiet_worker.send(url, "hi")
    await quiet_worker.wait_idle(url)
    client = Runtime(Registry(), settings=settings(server_url, prefix), run_worker=False)
    async with client:
        states = await asyncio.gather(*(client.state(url) for _ in range(500)))
        statuses = await asyncio.gather(*(client.status(url) for _ in range(500)))
    assert all(s == states[0] for s in states)
    assert {s.status for s in statuses} == {"idle"}


async def test_500_concurrent_reads_on_the_embedded_default():
    async with Runtime(quiet.registry) as rt:
        await rt.send("/echo/e", "hi")
        await rt.wait_idle("/echo/e")
        statuses = await asyncio.gather(*(rt.status("/echo/e") for _ in range(500)))
    assert {s.status for s in statuses} == {"idle"}


async def test_a_follower_resumes_after_a_lost_connection(quiet_worker):
    """A connection lost (or timed out) under ``events(follow=True)`` is read again from the
    last entry yielded: nothing is lost, nothing repeats, the caller sees no error."""
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    url = "/echo/lost"
    await quiet_worker.send(url, "one")
    await quiet_worker.wait_idle(url)
    store = quiet_worker.store
    assert store is not None
    read = store.read_entity
    faults = [RedisConnectionError("Connection reset by peer"), RedisTimeoutError("Timeout")]

    async def flaky(*args, **kwargs):
        if faults and args[1] != "0-0":  # after the first entries: fail twice, then read
            raise faults.pop(0)
        return await read(*args, **kwargs)

    store.read_entity = flaky  # type: ignore[method-assign]
    seen: list[str] = []
    finished = 0
    async with contextlib.aclosing(quiet_worker.events(url, follow=True)) as records:
        async for record in records:
            seen.append(record.id)
            if getattr(record.event, "status", None) == "completed":
                finished += 1
                if finished == 1:
                    await quiet_worker.send(url, "two")
                if finished == 2:
                    break
    assert not faults  # both faults were met
    assert len(seen) == len(set(seen))
    assert seen == [entry_id for entry_id, _ in await store.read_log(url)][: len(seen)]


async def serves_then_stops(
    worker: subprocess.Popen[bytes], url: str, prefix: str, entity: str, log_path: Path
) -> None:
    """The worker process publishes its types and answers, then stops cleanly."""
    client = Runtime(Registry(), settings=settings(url, prefix), run_worker=False)
    async with client:

        async def published() -> bool:
            return "echo" in await client.types()

        await until(published, 60, "the worker to start serving", interval=0.1)
        assert await asyncio.wait_for(client.ask(entity, "hi"), 60) == "echo hi"
    assert worker.poll() is None
    worker.terminate()
    assert worker.wait(timeout=30) == 0, log_path.read_text()


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server")
async def test_a_worker_started_while_redis_loads_waits_and_says_so(tmp_path, prefix):
    """Redis answers LOADING while it reads its dataset after a restart. ``key-load-delay``
    (a Redis debug setting) makes the load last until the test lifts it."""
    port, data = free_port(), tmp_path / "redis"
    data.mkdir()
    url = f"redis://127.0.0.1:{port}/0"
    base = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data)]
    base += ["--save", "", "--appendonly", "no", "--rdbcompression", "no"]
    probe = sync_redis.Redis(port=port, socket_timeout=5)

    def answers() -> bool:
        try:
            return bool(probe.ping())
        except sync_redis.BusyLoadingError:
            return True
        except sync_redis.ConnectionError:
            return False

    first = subprocess.Popen(base, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    worker = None
    second = None
    try:
        await until(lambda: asyncio.to_thread(answers), 10, "redis-server to start")
        pipe = probe.pipeline(transaction=False)
        for n in range(300):  # a dataset of 300 keys; each takes 0.1 s to load below
            pipe.set(f"filler:{n}", "x" * 2000)
        pipe.execute()
        probe.save()
        with contextlib.suppress(sync_redis.ConnectionError):
            probe.shutdown(nosave=True)
        first.wait(timeout=10)
        slow_load = [
            "--key-load-delay",
            "100000",
            "--loading-process-events-interval-bytes",
            "1024",
        ]
        second = subprocess.Popen(base + slow_load, stdout=subprocess.DEVNULL)

        def loading() -> bool:
            try:
                probe.ping()
            except sync_redis.BusyLoadingError:
                return True
            except sync_redis.ConnectionError:
                pass
            return False

        await until(lambda: asyncio.to_thread(loading), 10, "redis-server to be loading")
        log_path = tmp_path / "worker.log"
        worker = worker_process(url, prefix, log_path)

        async def said_loading() -> bool:
            if worker.poll() is not None:
                raise AssertionError(f"worker exited {worker.returncode}: {log_path.read_text()}")
            return "loading its dataset" in log_path.read_text()

        await until(said_loading, 60, "the worker to say that Redis is loading", interval=0.1)
        assert loading()  # it said so while Redis was still loading, and it is waiting
        probe.config_set("key-load-delay", 0)  # let the load finish
        await serves_then_stops(worker, url, prefix, "/echo/after", log_path)
    finally:
        for proc in (worker, second, first):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        probe.close()


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="needs redis-server")
async def test_a_worker_started_before_redis_answers_waits_and_says_so(tmp_path, prefix):
    """A worker is a daemon: started while Redis is down (a restart, a boot order), it
    waits with a visible message instead of exiting, and serves once Redis is up."""
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    log_path = tmp_path / "worker.log"
    server = None
    worker = worker_process(url, prefix, log_path)
    try:

        async def said_unreachable() -> bool:
            if worker.poll() is not None:
                raise AssertionError(f"worker exited {worker.returncode}: {log_path.read_text()}")
            return "cannot reach Redis" in log_path.read_text()

        await until(said_unreachable, 60, "the worker to say that Redis is down", interval=0.1)
        server = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""],
            stdout=subprocess.DEVNULL,
        )
        probe = sync_redis.Redis(port=port, socket_timeout=5)

        def answers() -> bool:
            with contextlib.suppress(sync_redis.ConnectionError):
                return bool(probe.ping())
            return False

        await until(lambda: asyncio.to_thread(answers), 10, "redis-server to start")
        probe.close()
        await serves_then_stops(worker, url, prefix, "/echo/late", log_path)
    finally:
        for proc in (worker, server):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)


async def test_a_worker_with_no_entity_types_refuses_to_start(server_url, prefix):
    """It would lease partitions and park every entity there as of an unknown type."""
    rt = Runtime(Registry(), settings=settings(server_url, prefix), run_worker=True)
    with pytest.raises(ConfigError, match="no entity types"):
        async with rt:
            pass


async def test_lease_renewal_never_waits_behind_the_workers_other_commands(server_url, prefix):
    """Every connection of the worker's pool taken (runners busy with long commands):
    the lease loop has connections of its own and renews on time. Of the pool's five,
    the subscription and the auto-pipeline keep one each, the inbox reader's blocking
    read holds one, and the hog takes the other two."""
    rt = Runtime(
        quiet.registry,
        settings=settings(server_url, prefix, max_connections=5, max_event_streams=2),
        run_worker=True,
    )
    async with rt:
        await rt.ask("/echo/warm", "first")
        worker = rt.worker
        assert worker is not None
        pool = worker.store.redis.connection_pool
        taken: list[object] = []

        async def take_every_connection() -> None:
            """Hold each connection as it comes free (the inbox reader's once its blocking
            read returns); the cancel listener's subscription keeps its own."""
            while True:
                with contextlib.suppress(sync_redis.ConnectionError):
                    taken.append(await pool.get_connection())

        hog = asyncio.create_task(take_every_connection())
        try:
            await until(lambda: _true(len(taken) >= 2), 30, "the hog to hold connections")
            before = {p: lease.valid_until for p, lease in worker.leases.items()}
            assert before

            async def renewed() -> bool:
                now = worker.leases
                return now.keys() == before.keys() and all(
                    now[p].valid_until > before[p] for p in before
                )

            await until(renewed, 30, "the worker to renew every lease", interval=0.05)
        finally:
            hog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await hog
            for connection in taken:
                await pool.release(connection)
        assert await rt.ask("/echo/warm", "second") == "echo second"


async def _true(value: bool) -> bool:
    return value


# -- item 9: the gateway's event streams and its worker ---------------------------------


@contextlib.asynccontextmanager
async def serving(app) -> AsyncIterator[str]:
    """``app`` on a real HTTP server in this event loop (streams need one)."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    task = asyncio.create_task(server.serve())

    async def started() -> bool:
        if task.done():
            task.result()
        return server.started

    await until(started, 30, "the gateway to serve")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task


async def test_event_streams_are_capped_and_the_worker_keeps_its_leases(server_url, prefix):
    tokens = {"t-alice": {"user": "alice"}, "t-bob": {"user": "bob"}}
    alice, bob = {"authorization": "Bearer t-alice"}, {"authorization": "Bearer t-bob"}
    # The client pool has room for the capped streams and a few calls; the worker's own.
    caps = {"max_connections": 8, "max_event_streams": 5, "max_event_streams_per_identity": 3}
    rt = Runtime(quiet.registry, settings=settings(server_url, prefix, **caps), run_worker=True)
    async with rt:
        await rt.ask("/echo/watched", "first")
        # Both watch one entity: every caller may read every entity here.
        app = create_app(rt, authenticate=bearer_tokens(tokens), authorize=allow_all)
        path = "/entities/echo/watched/events?live=1"
        async with (
            serving(app) as base,
            httpx.AsyncClient(base_url=base, timeout=httpx.Timeout(30)) as http,
            contextlib.AsyncExitStack() as streams,
        ):

            async def open_stream(headers: dict[str, str]) -> httpx.Response:
                return await streams.enter_async_context(http.stream("GET", path, headers=headers))

            alices = [await open_stream(alice) for _ in range(3)]
            assert [s.status_code for s in alices] == [200, 200, 200]
            refused = await http.get(path, headers=alice)  # over alice's cap
            assert refused.status_code == 503 and int(refused.headers["retry-after"]) > 0
            assert refused.json()["error"]["type"] == "TooManyStreams"
            bobs = [await open_stream(bob) for _ in range(2)]
            assert [s.status_code for s in bobs] == [200, 200]
            full = await http.get(path, headers=bob)  # over the total
            assert full.status_code == 503 and "retry-after" in full.headers
            # A stream that is not held open is no stream: still served.
            finite = await http.get("/entities/echo/watched/events?follow=0", headers=bob)
            assert finite.status_code == 200 and "run_finished" in finite.text

            # With every stream open, the worker renews its leases and handles messages.
            assert rt.worker is not None
            held = dict(rt.worker.leases)
            assert len(held) == 4
            before = {p: lease.valid_until for p, lease in held.items()}

            async def renewed() -> bool:
                now = rt.worker.leases  # type: ignore[union-attr]
                return now.keys() == before.keys() and all(
                    now[p].valid_until > before[p] for p in before
                )

            await until(renewed, 30, "the worker to renew every lease")
            sent = await http.post(
                "/entities/echo/other/messages", json={"payload": "hi"}, headers=bob
            )
            assert sent.status_code == 202
            status = await rt.wait_idle("/echo/other", timeout=30)
            assert status.status == "idle" and (await rt.lease_owner("/echo/other"))

            # A closed stream gives its place back.
            await alices[0].aclose()

            async def reopened() -> bool:
                response = await open_stream(alice)
                if response.status_code == 200:
                    return True
                await response.aclose()
                return False

            await until(reopened, 30, "a closed stream's place to be free again")


async def test_a_wait_goes_on_through_a_lost_connection(cluster, monkeypatch):
    """A status read that fails on a lost connection (a pooled connection from before a
    Redis restart) is a check that found nothing yet: ``wait_idle`` (and so ``ask``)
    waits on instead of raising redis-py's ConnectionError at the caller."""
    from redis.exceptions import ConnectionError as RedisConnectionError

    reg = Registry()

    @reg.entity("echo")
    async def echo(ctx: Any) -> None:
        for _m in ctx.wake.messages:
            pass

    rt = await cluster.runtime(reg)
    status = rt.status
    failures: list[str] = []

    async def flaky_status(url: str, **kwargs: Any) -> Any:
        if len(failures) < 2:
            failures.append(url)
            raise RedisConnectionError("Connection closed by server.")
        return await status(url, **kwargs)

    monkeypatch.setattr(rt, "status", flaky_status)
    await rt.send("/echo/e", "hello")
    assert (await rt.wait_idle("/echo/e", timeout=20)).status == "idle"
    assert failures == ["/echo/e", "/echo/e"]


FLOAT_SETTINGS = [f.name for f in dataclasses.fields(Settings) if isinstance(f.default, float)]


@pytest.mark.parametrize("name", FLOAT_SETTINGS)
@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_a_setting_that_is_not_a_finite_number_is_refused_naming_it(name: str, value: str) -> None:
    """NaN passes every bound (``nan <= 0`` is false): WAKEFUL_SOCKET_TIMEOUT_S=nan made
    every command say Redis could not be reached; inf passed and was an OverflowError
    in ``tail -f`` (int(inf)). Both are refused at once, named."""
    message = f"setting {name} must be a finite number, got {float(value)}"
    with pytest.raises(ConfigError, match=message):
        Settings(**{name: float(value)})  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=message):
        Settings.from_env({f"WAKEFUL_{name.upper()}": value})


def test_an_empty_prefix_is_a_config_error_not_a_traceback() -> None:
    """``WAKEFUL_PREFIX=`` was read as None (the empty value of a setting whose None
    means "not set", like redis_url), and every command failed with a TypeError."""
    with pytest.raises(ConfigError, match="setting prefix must be a non-empty string, got ''"):
        Settings.from_env({"WAKEFUL_PREFIX": ""})
    with pytest.raises(ConfigError, match="setting prefix must be a non-empty string"):
        Settings(prefix="")
    assert Settings.from_env({"WAKEFUL_REDIS_URL": ""}).redis_url is None  # still "not set"


# -- the auto-pipeline's kept connection --------------------------------------------------


async def test_the_auto_pipelines_kept_connection_closed_by_the_server_is_made_again(
    real_redis_url,
):
    """The auto-pipeline keeps a connection between sends: one the server closed (a
    Redis restarted, a client killed) is connected again before the next send, as a
    pooled one is (``CheckedPool``), so the next command does not fail on it."""
    from wakeful.batching import AutoPipeline, Commands
    from wakeful.connection import connect

    redis = connect(real_redis_url)
    try:
        batch = AutoPipeline(redis)
        first = await batch.execute(Commands(("CLIENT", "ID")))
        assert await batch.execute(Commands(("CLIENT", "ID"))) == first  # kept
        async with sync_redis.asyncio.Redis.from_url(real_redis_url) as admin:
            assert await admin.client_kill_filter(_id=first) == 1
        await until(lambda: _true(batch._kept is not None and closed(batch._kept)), 10, "EOF")
        again = await batch.execute(Commands(("CLIENT", "ID")))
        assert again != first  # a new connection, and the command went through
        errors = await batch.execute(Commands(("PING",), ("NOSUCHCOMMAND",), keep_errors=True))
        assert errors[0] in (b"PONG", True) and isinstance(errors[1], sync_redis.ResponseError)
    finally:
        await redis.aclose()


async def test_each_reply_of_a_batch_gets_the_socket_timeout_after_the_one_before(
    real_redis_url,
):
    """The auto-pipeline reads a batch's replies under one timer, moved on as replies
    come apart in time: with the replica wait on, every durable call is a script and a
    WAIT, and Redis serves a batch's WAITs one after another. Four WAITs of 0.3 s on a
    connection that gives up on a reply after 0.5 s: each reply comes within its
    timeout, so the batch (1.2 s) answers, and no caller gets a timeout."""
    from wakeful.batching import AutoPipeline, Commands
    from wakeful.connection import connect

    redis = connect(real_redis_url, socket_timeout_s=0.5)
    try:
        batch = AutoPipeline(redis)
        stage = Commands(("PING",), ("WAIT", 1, 300))  # no replica: each WAIT takes 0.3 s
        replies = await asyncio.gather(*(batch.execute(stage) for _ in range(4)))
        assert [reply[1] for reply in replies] == [0, 0, 0, 0]  # no replica confirmed
    finally:
        await redis.aclose()


def closed(connection: Any) -> bool:
    from wakeful.connection import closed_by_server

    return closed_by_server(connection)


def test_event_streams_leave_a_connection_for_calls_and_one_for_the_scripts():
    """Each open event stream holds a pooled connection and the auto-pipeline keeps one:
    a cap on streams that would leave no connection for other calls is refused."""
    with pytest.raises(ConfigError, match=r"max_event_streams \(7\) must be below"):
        Settings(max_connections=8, max_event_streams=7)
    with pytest.raises(ConfigError, match=r"max_connections - 1 \(7\)"):
        Settings(max_connections=8, max_event_streams=7)
    Settings(max_connections=8, max_event_streams=6)
