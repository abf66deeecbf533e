"""What an idle worker costs Redis (issue 19): commands a second with nothing to do.

A private redis-server on a free port (so nothing else talks to it) runs one worker
(in this process) of a type with a pending timer an hour away. Once the worker holds
every partition and has settled (past its acquisitions' follow-up sweep), ``MONITOR``
counts, for ``--seconds``, the commands the worker's clients send (a script's own
calls, shown by MONITOR as ``lua``, are listed apart: one script is one command, one
round trip and at most one fsync) and ``INFO`` the keys it changed (writes: what
``appendfsync always`` must fsync). The same window is measured for the raw redis-py
baseline of an idle stream consumer: one ``XREADGROUP BLOCK <block_ms>`` over the
partition streams, again and again. Targets: at most 10 commands a second with 16
partitions, and not growing with the partition count (64).

    python scripts/bench_idle.py --idle [--seconds 10] [--partitions 16,64]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import datetime as dt
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

from benchlib import code_version, describe_machine, emit, unique_prefix
from redis.asyncio import Redis

from wakeful.client import Runtime
from wakeful.config import Settings
from wakeful.context import HandlerContext
from wakeful.registry import Registry

TARGET_PER_S = 10.0  # issue 19: an idle worker with 16 partitions, at most
SETTLE_S = 2.0  # after the acquisitions' follow-up sweep (a lease period)


def registry() -> Registry:
    reg = Registry()

    @reg.entity("alarm")
    async def alarm(ctx: HandlerContext) -> None:
        for m in ctx.wake.messages:
            if m.payload == "arm":
                far = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
                await ctx.send("/alarm/rung", "rang", after=far)

    return reg


@contextlib.contextmanager
def private_redis() -> Any:
    """A redis-server of its own on a free port (AOF on, ``appendfsync always``)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    folder = tempfile.mkdtemp(prefix="wkidle")
    server = subprocess.Popen(
        [
            shutil.which("redis-server") or "redis-server",
            *("--port", str(port), "--bind", "127.0.0.1", "--dir", folder),
            *("--save", "", "--appendonly", "yes", "--appendfsync", "always"),
        ],
        stdout=subprocess.DEVNULL,
    )
    try:
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        server.terminate()
        server.wait(10)
        shutil.rmtree(folder, ignore_errors=True)


async def until_up(url: str) -> None:
    r = Redis.from_url(url)
    try:
        for _ in range(200):
            with contextlib.suppress(Exception):
                await r.ping()
                return
            await asyncio.sleep(0.05)
        raise SystemExit(f"redis-server at {url} did not start")
    finally:
        await r.aclose()


async def count(url: str, seconds: float, exclude: set[int]) -> dict[str, Any]:
    """Commands seen by MONITOR over ``seconds`` (clients other than ``exclude`` ports),
    and the keys changed (``rdb_changes_since_last_save``) meanwhile."""
    r = Redis.from_url(url)
    info = Redis.from_url(url)
    top: collections.Counter[str] = collections.Counter()
    lua: collections.Counter[str] = collections.Counter()
    try:
        before = (await info.info("persistence"))["rdb_changes_since_last_save"]
        async with r.monitor() as monitor:
            deadline = time.monotonic() + seconds
            while (left := deadline - time.monotonic()) > 0:
                try:
                    seen = await asyncio.wait_for(monitor.next_command(), left)
                except TimeoutError:
                    break
                name = seen["command"].split(" ", 1)[0].upper()
                if seen.get("client_type") == "lua":
                    lua[name] += 1
                elif int(seen.get("client_port") or 0) not in exclude:
                    top[name] += 1
        after = (await info.info("persistence"))["rdb_changes_since_last_save"]
    finally:
        await r.aclose()
        await info.aclose()
    return {"commands": top, "lua": lua, "writes": after - before}


async def local_port(r: Redis) -> int:
    """The local port of ``r``'s connection (to leave the bench's own calls out)."""
    for client in await r.client_list():
        if client.get("name") == "wkidle-bench":
            return int(client["addr"].rsplit(":", 1)[1])
    return 0


async def measure_worker(url: str, partitions: int, seconds: float) -> dict[str, Any]:
    settings = Settings(redis_url=url, prefix=unique_prefix("wkidle"), partitions=partitions)
    rt = Runtime(registry(), settings=settings, run_worker=True)
    await rt.start()
    try:
        assert rt.worker is not None
        await rt.send("/alarm/a", "arm")
        while (await rt.store.meta("/alarm/a")).get("timers") != b"1":  # the timer is set
            await asyncio.sleep(0.05)
        while len(rt.worker.leases) < partitions:
            await asyncio.sleep(0.05)
        await asyncio.sleep(settings.lease_ttl_ms / 1000 + SETTLE_S)
        probe = Redis.from_url(url, client_name="wkidle-bench")
        try:
            own = {await local_port(probe)}
        finally:
            await probe.aclose()
        return await count(url, seconds, own)
    finally:
        await rt.close()


async def measure_raw(url: str, partitions: int, seconds: float, block_ms: int) -> dict[str, Any]:
    """The raw redis-py idle consumer: XREADGROUP BLOCK over ``partitions`` streams."""
    r = Redis.from_url(url, client_name="wkidle-raw")
    streams = {f"rawidle:{p}": ">" for p in range(partitions)}
    for key in streams:
        with contextlib.suppress(Exception):
            await r.xgroup_create(key, "g", "0", mkstream=True)

    async def consume() -> None:
        while True:
            await r.xreadgroup("g", "c", streams, count=100, block=block_ms)

    task = asyncio.create_task(consume())
    try:
        await asyncio.sleep(0.2)
        return await count(url, seconds, set())
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await r.delete(*streams)
        await r.aclose()


def show(label: str, seen: dict[str, Any], seconds: float) -> float:
    total = sum(seen["commands"].values())
    rate = total / seconds
    which = ", ".join(f"{n} {c / seconds:.2f}/s" for n, c in seen["commands"].most_common())
    inner = ", ".join(f"{n} {c / seconds:.1f}/s" for n, c in seen["lua"].most_common())
    print(f"  {label}: {rate:.2f} commands/s ({which or 'none'})")
    print(
        f"  {'':{len(label)}}  keys written {seen['writes'] / seconds:.2f}/s; inside scripts: {inner or 'none'}"
    )
    return rate


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--idle", action="store_true", help="measure an idle worker (the mode)")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--partitions", default="16,64")
    args = parser.parse_args()
    print(f"load: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    print(f"code: {code_version()}")
    counts = [int(p) for p in args.partitions.split(",")]
    results: dict[str, Any] = {}
    with private_redis() as url:
        await until_up(url)
        r = Redis.from_url(url)
        await describe_machine(r)
        await r.aclose()
        block_ms = Settings().block_ms
        for partitions in counts:
            print(f"{partitions} partitions, {args.seconds:.0f} s idle:")
            raw = show(
                "raw redis-py",
                await measure_raw(url, partitions, args.seconds, block_ms),
                args.seconds,
            )
            worker = show(
                "worker", await measure_worker(url, partitions, args.seconds), args.seconds
            )
            verdict = "PASS" if worker <= TARGET_PER_S else "MISS"
            ratio = worker / raw if raw else float("inf")
            print(
                f"  {verdict}: {worker:.2f} commands/s <= {TARGET_PER_S:.0f}/s "
                f"({ratio:.1f}x the raw idle consumer's {raw:.2f}/s)"
            )
            results[str(partitions)] = {"worker_per_s": worker, "raw_per_s": raw, "pass": verdict}
    if len(counts) > 1:
        first, last = results[str(counts[0])], results[str(counts[-1])]
        grows = last["worker_per_s"] > first["worker_per_s"] * 1.5 + 1
        print(
            f"{'MISS' if grows else 'PASS'}: idle cost does not grow with partitions "
            f"({first['worker_per_s']:.2f}/s at {counts[0]}, {last['worker_per_s']:.2f}/s at {counts[-1]})"
        )
    emit(bench="idle", load=os.getloadavg()[0], results=results)


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
