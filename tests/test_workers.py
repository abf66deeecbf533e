"""Saying whether a worker runs: the worker registry read by the client, the CLI
(``wakeful workers``, ``serve``'s banner, ``inspect``, ``ask`` timeouts) and the unknown-type
hint on a fresh keyspace; and the keyspace-wide waits (``wait_all_idle``, ``list()``)."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys

import pytest
from test_cli import ROOT, cli_env, run, worker_registry

from tests.apps.harness import until
from wakeful import HandlerContext, Registry, Runtime, Settings, UnknownEntityTypeError, Wake
from wakeful.entities import notes

pytestmark = pytest.mark.anyio


def notes_registry() -> Registry:
    registry = Registry()
    notes.register(registry)
    return registry


def cli_settings(server_url: str, prefix: str) -> Settings:
    return Settings(redis_url=server_url, prefix=prefix, partitions=4, lease_ttl_ms=1000)


async def test_runtime_lists_live_workers_and_partition_owners(cluster):
    client = await cluster.runtime(run_worker=False)
    assert await client.workers() == []
    assert set((await client.partition_owners()).values()) == {None}
    rt = await cluster.runtime(notes_registry())
    assert rt.worker is not None
    [info] = await client.workers()
    assert info.id == rt.worker.id
    assert info.partitions == list(range(rt.settings.partitions))
    assert info.expires_in_ms > 0 and info.last_heartbeat_ms >= 0
    assert set((await client.partition_owners()).values()) == {rt.worker.id}
    await rt.close()  # a graceful stop leaves the registry and hands the leases back
    assert await client.workers() == []
    assert set((await client.partition_owners()).values()) == {None}


async def test_unknown_type_on_a_fresh_keyspace_says_no_worker_runs(cluster):
    client = await cluster.runtime(run_worker=False)
    with pytest.raises(UnknownEntityTypeError) as refused:
        await client.send("/assistant/a1", "hello")
    assert "unknown entity type 'assistant'" in str(refused.value)
    assert "no worker has registered its types" in str(refused.value)
    registry = Registry()
    notes.register(registry)
    await cluster.runtime(registry)  # a worker publishes its types: a plain error again
    with pytest.raises(UnknownEntityTypeError) as refused:
        await client.send("/assistant/a1", "hello")
    assert "no worker" not in str(refused.value)


async def test_a_worker_puts_its_types_back_after_redis_lost_its_data(cluster):
    """A Redis restarted without persistence (or failed over to an empty replica) comes
    back empty: the worker re-acquires its leases, and its types must come back with
    them, or every client refuses the types it runs ("unknown entity type")."""
    rt = await cluster.runtime(notes_registry())
    await rt.send("/notes/before", "add milk")
    await rt.wait_idle("/notes/before", timeout=30)
    side = cluster.redis()
    async for key in side.scan_iter(match=f"{cluster.prefix}:*", count=1000):
        await side.delete(key)  # every key of the keyspace: what an empty restart leaves
    await side.aclose()

    client = await cluster.runtime(run_worker=False)  # a new client (a new CLI process)

    async def accepted() -> bool:
        try:
            await client.send("/notes/after", "add eggs")
        except UnknownEntityTypeError:
            return False
        return True

    await until(accepted, 30, "the worker to publish its types again")
    status = await client.wait_idle("/notes/after", timeout=30)
    assert status.status == "idle"


async def test_a_worker_without_a_type_another_worker_runs_says_so(cluster, caplog):
    """Two apps on one keyspace: an entity whose partition the other app's worker owns
    fails there; the worker warns at start, and the entity's error says why."""
    alpha = Registry()

    @alpha.entity("alpha")
    async def handle(ctx: HandlerContext) -> None:
        pass

    notes.register(alpha)
    first = await cluster.runtime(alpha)
    await first.close()  # its types stay published
    caplog.set_level(logging.WARNING, logger="wakeful.worker")
    other = await cluster.runtime(notes_registry())  # owns every partition now
    assert any("does not run the entity types alpha" in r.getMessage() for r in caplog.records), (
        "the worker should warn at start"
    )
    await other.send("/alpha/a1", "hello")
    status = await other.wait_idle("/alpha/a1", timeout=30)
    assert status.status == "failed"
    assert "unknown entity type 'alpha'" in (status.error or "")
    assert "every worker on a keyspace must run the same app" in (status.error or "")


async def test_wait_idle_timeout_says_no_worker_runs(cluster):
    registry = Registry()
    notes.register(registry)
    client = await cluster.runtime(registry, run_worker=False)
    await client.send("/notes/n1", "add milk")
    with pytest.raises(Exception) as timed_out:
        await client.wait_idle("/notes/n1", timeout=0.2)
    assert "no worker runs" in str(timed_out.value)


async def test_cli_workers_without_and_with_a_worker(server_url, prefix):
    none = await run(server_url, prefix, "workers")
    assert none.returncode == 0, none.stderr
    assert "no worker runs" in none.stderr and "4 partition(s) without a worker" in none.stdout
    rt = Runtime(notes_registry(), settings=cli_settings(server_url, prefix), run_worker=True)
    await rt.start()
    try:
        assert rt.worker is not None
        listed = await run(server_url, prefix, "workers", "--json")
        assert listed.returncode == 0, listed.stderr
        info = json.loads(listed.stdout)
        assert info["unserved"] == []
        [worker] = info["workers"]
        assert worker["id"] == rt.worker.id and worker["partitions"] == [0, 1, 2, 3]
        table = await run(server_url, prefix, "workers")
        assert rt.worker.id in table.stdout and "every partition (4) has a worker" in table.stdout
    finally:
        await rt.close()


async def test_cli_ask_timeout_and_inspect_say_no_worker(server_url, prefix):
    asked = await run(server_url, prefix, "ask", "/notes/n1", "add milk", "--timeout", "0.3")
    assert asked.returncode == 1 and "no worker has registered its types" in asked.stderr
    # Types published by a worker that has stopped since: the message is stored, nobody runs it.
    rt = Runtime(worker_registry(), settings=cli_settings(server_url, prefix), run_worker=True)
    await rt.start()
    await rt.close()
    asked = await run(server_url, prefix, "ask", "/notes/n1", "add milk", "--timeout", "0.3")
    assert asked.returncode == 5, asked.stderr
    assert "no worker runs on this keyspace" in asked.stderr
    inspected = json.loads((await run(server_url, prefix, "inspect", "/notes/n1", "--json")).stdout)
    assert inspected["worker"].startswith("none: no worker runs")


def _serve_banner(server_url: str, prefix: str, *extra: str) -> str:
    """The first two lines ``wakeful serve`` prints (port 0: any free port)."""
    command = [sys.executable, "-m", "wakeful.cli", "serve", "wakeful.entities:registry"]
    proc = subprocess.Popen(
        [*command, "--port", "0", "--redis", server_url, *extra],
        cwd=ROOT,
        env=cli_env(prefix),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        return proc.stdout.readline() + proc.stdout.readline()
    finally:
        proc.terminate()
        proc.wait(timeout=30)


async def test_serve_banner_says_when_no_worker_runs(server_url, prefix):
    banner = await asyncio.to_thread(_serve_banner, server_url, prefix)
    assert "serving" in banner and "no worker runs on" in banner
    rt = Runtime(notes_registry(), settings=cli_settings(server_url, prefix), run_worker=True)
    await rt.start()
    try:
        banner = await asyncio.to_thread(_serve_banner, server_url, prefix)
        assert "1 live worker(s)" in banner
    finally:
        await rt.close()


# -- keyspace-wide waits --------------------------------------------------------


def fan_out_registry() -> Registry:
    registry = Registry()

    @registry.entity("boss")
    async def boss(ctx: HandlerContext) -> None:
        for message in ctx.wake.messages:
            for n in range(int(message.payload)):
                await ctx.spawn(
                    "hand", f"{ctx.entity_id}-{n}", initial_message="work", wake=Wake.run_finished()
                )

    @registry.entity("hand")
    async def hand(ctx: HandlerContext) -> None:
        for _ in ctx.wake.messages:
            ctx.record_run()
            await ctx.send("/tally/t", "done")
            ctx.reply("done")

    @registry.entity("tally")
    async def tally(ctx: HandlerContext) -> None:
        await asyncio.sleep(0)

    return registry


async def test_wait_all_idle_and_list_every_entity(cluster):
    rt = await cluster.runtime(fan_out_registry())
    assert await rt.list() == []
    assert await rt.wait_all_idle(timeout=5) == {}
    await rt.send("/boss/b1", "3")
    await rt.send("/boss/b2", "2")
    statuses = await rt.wait_all_idle(timeout=30)
    # The children spawned and the entity they message were waited for as well.
    expected = sorted(
        ["/boss/b1", "/boss/b2", "/tally/t"]
        + [f"/hand/b1-{n}" for n in range(3)]
        + [f"/hand/b2-{n}" for n in range(2)]
    )
    assert sorted(statuses) == expected == await rt.list()
    assert {s.status for s in statuses.values()} == {"idle"}
    tally = [r async for r in rt.events("/tally/t") if type(r.event).__name__ == "Message"]
    assert len(tally) == 5
    only = await rt.wait_all_idle(types=["boss"], timeout=5)
    assert sorted(only) == ["/boss/b1", "/boss/b2"]


async def test_wait_all_idle_times_out_naming_a_busy_entity(cluster):
    registry = fan_out_registry()
    client = await cluster.runtime(registry, run_worker=False)
    await client.send("/tally/t", "x")
    with pytest.raises(Exception) as timed_out:
        await client.wait_all_idle(types=["tally"], timeout=0.3)
    assert "/tally/t is still pending" in str(timed_out.value)


async def test_gateway_workers_endpoint(cluster):
    import httpx

    from wakeful.gateway import create_app

    client = await cluster.runtime(notes_registry(), run_worker=False)
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(create_app(client)), base_url="http://gw"
    ) as http:
        none = (await http.get("/workers")).json()
        assert none["workers"] == [] and none["unserved"] == list(range(none["partitions"]))
        rt = await cluster.runtime(notes_registry())
        assert rt.worker is not None
        served = (await http.get("/workers")).json()
        assert [w["id"] for w in served["workers"]] == [rt.worker.id]
        assert served["unserved"] == []
