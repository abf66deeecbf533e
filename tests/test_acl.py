"""Redis ACLs: the README's users suffice, and a user missing a channel right costs
speed, never a half-applied commit or a dead worker.

Each test starts a redis-server of its own, creates users there and runs an
in-process worker and a client as those users."""

from __future__ import annotations

import asyncio
import logging
import re
import shlex
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis as sync_redis

from tests.apps.harness import PrivateRedis, until
from wakeful import (
    EntityFailed,
    HandlerContext,
    LogRecord,
    Registry,
    RunFinished,
    Runtime,
    Settings,
)

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[1]
PASSWORDS = {"WORKER-PASSWORD": "worker-pw-5s", "CLIENT-PASSWORD": "client-pw-8k"}
ALL_BUT_CHANNELS = ["on", ">pw", "resetkeys", "~wk:*", "resetchannels", "+@all"]

registry = Registry()


@registry.entity("echo")
async def echo(ctx: HandlerContext) -> None:
    for message in ctx.wake.messages:
        ctx.reply(f"echo {message.payload}")


@registry.entity("patient")
async def patient(ctx: HandlerContext) -> None:
    """Waits in its wake until something stops it, and says what did."""
    if ctx.wake.messages:
        ctx.record_run()
        await ctx.signal.wait()
        ctx.reply(f"stopped by {ctx.signal.kind}")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[PrivateRedis]:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    private = PrivateRedis(tmp_path / "redis")
    private.start()
    try:
        yield private
    finally:
        private.stop()


def admin(server: PrivateRedis) -> sync_redis.Redis:
    return sync_redis.Redis(port=server.port, decode_responses=True)


def readme_acl_lines() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = re.search(r"### Redis ACLs\n(.*?)\n## ", readme, re.S)
    assert section is not None
    return re.findall(r"^redis-cli ACL SETUSER .*$", section.group(1), re.M)


def set_user(server: PrivateRedis, name: str, *rules: str) -> str:
    """Create ``name`` with ``rules``; its URL (password ``pw``)."""
    with admin(server) as r:
        r.execute_command("ACL", "SETUSER", name, *rules)
    return f"redis://{name}:pw@127.0.0.1:{server.port}/0"


@pytest.fixture
async def runtimes() -> AsyncIterator[list[Runtime]]:
    started: list[Runtime] = []
    yield started
    for rt in reversed(started):
        await rt.close()


async def start(runtimes: list[Runtime], url: str, *, worker: bool) -> Runtime:
    settings = Settings(
        redis_url=url, partitions=2, lease_ttl_ms=1000, block_ms=100, shutdown_grace_s=1
    )
    rt = Runtime(registry, settings=settings, run_worker=worker)
    await rt.start()
    runtimes.append(rt)
    return rt


async def logged(caplog: pytest.LogCaptureFixture, text: str) -> str:
    async def found() -> str | None:
        return next((r.getMessage() for r in caplog.records if text in r.getMessage()), None)

    return await until(found, 30, f"a log line with {text!r}")


async def last_run(rt: Runtime, url: str) -> RunFinished:
    finished = [
        r.event
        async for r in rt.events(url)
        if isinstance(r, LogRecord) and isinstance(r.event, RunFinished)
    ]
    return finished[-1]


async def test_the_readme_users_run_a_worker_and_a_client(server, runtimes):
    lines = readme_acl_lines()
    assert [shlex.split(line)[3] for line in lines] == ["wakeful-worker", "wakeful-client"]
    for line in lines:  # as written, but on this server and with real passwords
        for placeholder, password in PASSWORDS.items():
            line = line.replace(placeholder, password)
        words = shlex.split(line)
        subprocess.run([words[0], "-p", str(server.port), *words[1:]], check=True, timeout=10)
    with admin(server) as r:
        r.execute_command("ACL", "LOG", "RESET")
    base = f"127.0.0.1:{server.port}/0"
    worker_url = f"redis://wakeful-worker:{PASSWORDS['WORKER-PASSWORD']}@{base}"
    worker = await start(runtimes, worker_url, worker=True)
    client = await start(
        runtimes, f"redis://wakeful-client:{PASSWORDS['CLIENT-PASSWORD']}@{base}", worker=False
    )
    with admin(server) as r:  # the worker's cancel relay listens on both partitions
        await until(lambda: asyncio.to_thread(cancel_channels, r, 2), 30, "two SSUBSCRIBEs")

    assert await client.ask("/echo/e1", "hi") == "echo hi"
    # A cancel reaches the running wake through the worker's cancel listener.
    await client.send("/patient/p1", "wait")

    async def running() -> bool:
        assert worker.worker is not None
        return worker.worker.runners.running("/patient/p1")

    await until(running, 30, "the patient wake to run")
    await client.cancel("/patient/p1")
    await client.wait_idle("/patient/p1", timeout=30)
    assert (await last_run(client, "/patient/p1")).response == "stopped by cancel"
    await client.delete("/echo/e1", timeout=30)
    assert "/echo/e1" not in await client.list("echo")
    with admin(server) as r:
        refused = [_acl_entry(e) for e in r.execute_command("ACL", "LOG")]
    # Nothing was refused but the worker's start-up look at maxmemory-policy (CONFIG GET
    # is @dangerous, and could read the password; without it the check is skipped).
    assert {e.get("object") for e in refused} <= {"config|get"}, refused


def cancel_channels(r: sync_redis.Redis, count: int) -> bool:
    """Whether ``count`` cancel channels are subscribed (``PUBSUB SHARDCHANNELS``)."""
    return len(r.execute_command("PUBSUB", "SHARDCHANNELS", "wk:*:cancel")) == count


def _acl_entry(entry: object) -> dict[str, object]:
    """An ACL LOG entry as a dict (RESP2 gives a flat list of name, value)."""
    if isinstance(entry, dict):
        return {str(k): v for k, v in entry.items()}
    assert isinstance(entry, list)
    pairs = zip(entry[::2], entry[1::2], strict=True)
    return {
        (k.decode() if isinstance(k, bytes) else str(k)): (
            v.decode() if isinstance(v, bytes) else v
        )
        for k, v in pairs
    }


async def test_a_worker_that_may_not_subscribe_to_cancels_says_the_rule_and_goes_on(
    server, runtimes, caplog
):
    """It may publish idle notices, not listen for cancels: an error line with the rule,
    and the worker serves on (the cancel reaches the run at its next wake)."""
    url = set_user(server, "nocancel", *ALL_BUT_CHANNELS, "&wk:*:idle:*")
    with caplog.at_level(logging.WARNING, logger="wakeful"):
        rt = await start(runtimes, url, worker=True)
        line = await logged(caplog, "Redis refused to subscribe to wk:{wk:p")
        assert ":cancel: the Redis user needs the channel right &wk:*" in line
        assert "trying again every 30 s" in line
        assert await rt.ask("/echo/e2", "still here", timeout=30) == "echo still here"
    assert rt.worker is not None and not rt.worker.stopped.is_set()


async def test_a_refused_notice_leaves_the_commit_whole(server, runtimes, caplog):
    """No channel rights at all: every commit's PUBLISH is refused, after its writes."""
    url = set_user(server, "deaf", *ALL_BUT_CHANNELS)
    with caplog.at_level(logging.ERROR, logger="wakeful"):
        rt = await start(runtimes, url, worker=True)
        await rt.send("/echo/e3", "one")
        line = await logged(caplog, "Redis refused to publish the idle notice of /echo/e3")
        assert "needs the channel right &wk:*" in line and "the commit is applied" in line
        status = await rt.wait_idle("/echo/e3", timeout=30)
        assert status.status == "idle" and status.error is None
        assert (await last_run(rt, "/echo/e3")).status == "completed"
        assert await rt.ask("/echo/e3", "two", timeout=30) == "echo two"
        events = [r.event async for r in rt.events("/echo/e3") if isinstance(r, LogRecord)]
        assert not any(isinstance(e, EntityFailed) for e in events)
        await rt.delete("/echo/e3", timeout=30)  # DELETE's notice is refused too
        assert "/echo/e3" not in await rt.list("echo")


async def test_a_client_that_may_not_publish_a_cancel_still_records_it(server, runtimes, caplog):
    worker = await start(runtimes, set_user(server, "w", *ALL_BUT_CHANNELS, "&*"), worker=True)
    client = await start(
        runtimes, set_user(server, "c", *ALL_BUT_CHANNELS, "&wk:*:idle:*"), worker=False
    )
    await worker.ask("/echo/e4", "hi", timeout=30)
    with caplog.at_level(logging.WARNING, logger="wakeful"):
        event_id = await client.cancel("/echo/e4")
        line = await logged(caplog, "Redis refused to publish the cancel request of /echo/e4")
    assert "needs the channel right &wk:*" in line
    assert event_id in [r.id async for r in client.events("/echo/e4")]


async def test_a_client_that_may_not_subscribe_to_notices_still_waits(server, runtimes, caplog):
    await start(runtimes, set_user(server, "w2", *ALL_BUT_CHANNELS, "&*"), worker=True)
    client = await start(
        runtimes, set_user(server, "c2", *ALL_BUT_CHANNELS, "&wk:*:cancel"), worker=False
    )
    with caplog.at_level(logging.WARNING, logger="wakeful"):
        assert await client.ask("/echo/e5", "hi", timeout=30) == "echo hi"
        line = await logged(caplog, ":idle:/echo/e5: the Redis user needs the channel right")
    assert "Redis refused to subscribe to wk:{wk:p" in line and "&wk:*" in line
