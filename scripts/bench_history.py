"""Does a wake cost more as an entity's history grows? (It should not: snapshots.)

For histories of increasing length on one entity, measure a *cold* wake (a
worker that has never seen the entity: it loads the snapshot and the log tail)
and a *warm* wake (the worker has the state cached). Each is timed from
``send`` to ``wait_idle`` returning, over several wakes, median reported. The
baseline, measured in the same run, is the cost of reading the whole history
with XRANGE, which is what a runtime without snapshots would pay per cold wake.

    python scripts/bench_history.py [--redis URL] [--sizes 1000,10000,50000] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time

import msgspec
from benchlib import add_redis_argument, delete_prefix, describe_machine, emit, unique_prefix

from wakeful import Collection, HandlerContext, Registry, Runtime, Settings
from wakeful.connection import connect


class Row(msgspec.Struct):
    key: str
    n: int


registry = Registry()


@registry.entity("ledger", state={"rows": Collection(row=Row)})
async def ledger(ctx: HandlerContext) -> None:
    rows = ctx.db.collections.rows
    for message in ctx.wake.messages:
        key = str(message.payload % 100)  # 100 rows, updated over and over
        if key in rows:
            ctx.db.actions.rows_update(key=key, updater=lambda r: setattr(r, "n", r.n + 1))
        else:
            ctx.db.actions.rows_insert(row=Row(key, 1))


async def grow(rt: Runtime, url: str, start: int, stop: int) -> None:
    """Send one message at a time, so every message is a wake with a state event."""
    for i in range(start, stop):
        await rt.send(url, i)
        if i % 200 == 199:
            await rt.wait_idle(url, timeout=120)
    await rt.wait_idle(url, timeout=120)


async def timed_wakes(rt: Runtime, url: str, n: int) -> float:
    samples = []
    for i in range(n):
        started = time.perf_counter()
        await rt.send(url, 10_000_000 + i)
        await rt.wait_idle(url, timeout=60)
        samples.append(time.perf_counter() - started)
    return statistics.median(samples) * 1000


async def main_async(args: argparse.Namespace) -> int:
    sizes = [int(s) for s in args.sizes.split(",")]
    prefix = unique_prefix("wkhist")
    redis = connect(args.redis)
    machine = await describe_machine(redis)
    settings = Settings(redis_url=args.redis, prefix=prefix, partitions=4, snapshot_every=1000)
    url = "/ledger/l"
    results = []
    grown = 0
    try:
        print(
            f"\nhistory of one entity, snapshot every {settings.snapshot_every} entries; ms per wake"
        )
        print(f"  {'log entries':>11}  {'warm wake':>9}  {'cold wake':>9}  {'XRANGE all':>10}")
        for size in sizes:
            async with Runtime(registry, settings=settings, run_worker=True) as rt:
                await grow(rt, url, grown, size)
                grown = size
                warm = await timed_wakes(rt, url, args.wakes)
            entries = await redis.xlen(rt.store.keys.log(url))
            cold_samples = []
            for i in range(args.wakes):  # a fresh worker each time: nothing cached
                async with Runtime(registry, settings=settings, run_worker=True) as fresh:
                    started = time.perf_counter()
                    await fresh.send(url, 20_000_000 + i)
                    await fresh.wait_idle(url, timeout=60)
                    cold_samples.append(time.perf_counter() - started)
            cold = statistics.median(cold_samples) * 1000
            started = time.perf_counter()
            await redis.xrange(rt.store.keys.log(url))
            read_all = (time.perf_counter() - started) * 1000
            print(f"  {entries:>11,}  {warm:>9.2f}  {cold:>9.2f}  {read_all:>10.2f}")
            results.append(
                {"entries": entries, "warm_ms": warm, "cold_ms": cold, "xrange_all_ms": read_all}
            )
        print(
            "\n(cold: a new worker loads the snapshot and the log after it; its cost stays flat "
            "while reading the whole history grows with it)"
        )
        emit(machine=machine, snapshot_every=settings.snapshot_every, results=results)
    finally:
        await delete_prefix(redis, prefix)
        await redis.aclose()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_redis_argument(parser)
    parser.add_argument("--sizes", default="1000,10000,40000", help="log sizes to measure at")
    parser.add_argument("--wakes", type=int, default=7, help="timed wakes per size and kind")
    parser.add_argument("--quick", action="store_true", help="sizes 200,2000 and 3 wakes")
    args = parser.parse_args(argv)
    if args.quick:
        args.sizes, args.wakes = "200,2000", 3
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
