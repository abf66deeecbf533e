#!/usr/bin/env python
"""Reading back many entities: one call per entity against the bulk reads, next to a
raw redis-py pipeline in the same run.

    .venv/bin/python scripts/bench_reads.py            # 10,000 entities
    .venv/bin/python scripts/bench_reads.py --quick    # 1,000, a few seconds

The issue (19): "Reading many entities' state is one call per entity: reading back
10,000 entities took 1.4-2.8 s. Add a bulk read (many urls in one call, pipelined
per partition)."

``--entities`` counter entities are created through the runtime (one message each,
handled by a worker in this process; ``wait_all_idle`` waits for them). Then, with
the worker stopped, each way of reading them back is timed ``--rounds`` times (the
median is printed):

- ``rt.status(url)`` / ``rt.state(url)`` for every url, all at once (``asyncio.gather``,
  as ``wakeful ls`` read them before): one call, one round trip each;
- ``rt.statuses(urls)`` / ``rt.states(urls)``: one call, pipelined per partition;
- raw redis-py: one pipeline (``transaction=False``) of ``HGETALL`` of every metadata
  hash (for statuses) and of ``HGETALL`` + ``GET`` + ``XRANGE`` of every entity (for
  states), replies decoded by hiredis and nothing else.

The bulk reads are printed with their ratio to the raw pipeline and PASS or MISS
against at most ``TARGET`` times the raw pipeline's time. Every key lives under a
unique prefix (``wkreads-...``), deleted at the end. The last line is every figure as
one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from benchlib import (
    add_redis_argument,
    code_version,
    delete_prefix,
    describe_machine,
    fmt,
    unique_prefix,
)
from redis.asyncio import Redis

from wakeful import Collection, HandlerContext, Registry, Runtime, Settings

TARGET = 2.0  # the bulk read's time: at most this many times the raw pipeline's


class Counter(msgspec.Struct):
    key: str
    n: int


registry = Registry()


@registry.entity("counter", state={"counts": Collection(row=Counter)})
async def counter(ctx: HandlerContext) -> None:
    for _ in ctx.wake.messages:
        if "total" in ctx.db.collections.counts:
            ctx.db.actions.counts_update(key="total", updater=lambda r: setattr(r, "n", r.n + 1))
        else:
            ctx.db.actions.counts_insert(row=Counter("total", 1))


async def timed(rounds: int, work: Callable[[], Awaitable[Any]]) -> tuple[float, Any]:
    """The median wall time of ``rounds`` calls of ``work`` (s), and its last result."""
    times, result = [], None
    for _ in range(rounds):
        t = time.perf_counter()
        result = await work()
        times.append(time.perf_counter() - t)
    return statistics.median(times), result


async def main_async(args: argparse.Namespace) -> int:
    r = Redis.from_url(args.redis, decode_responses=False)
    machine = await describe_machine(r)
    machine["code"] = code_version()
    prefix = unique_prefix("wkreads")
    settings = Settings.from_env(redis_url=args.redis, prefix=prefix, partitions=args.partitions)
    urls = [f"/counter/c{i:05d}" for i in range(args.entities)]
    print(
        f"workload: {args.entities:,} counter entities (one message each), {args.partitions} "
        f"partitions, median of {args.rounds} rounds; runtime at {machine['code']}",
        flush=True,
    )
    try:
        rt = await Runtime(registry, settings=settings, run_worker=True).start()
        try:
            t = time.perf_counter()
            for start in range(0, len(urls), 200):  # small batches: the worker keeps up
                await asyncio.gather(*(rt.send(url, {"n": 1}) for url in urls[start : start + 200]))
            await rt.wait_all_idle(timeout=600)
            print(f"  created in {time.perf_counter() - t:.1f} s", flush=True)
        finally:
            await rt.close()
        client = await Runtime(registry, settings=settings, run_worker=False).start()
        try:
            figures = await measure(args, client, r, urls)
        finally:
            await client.close()
    finally:
        await delete_prefix(r, prefix)
        await r.aclose()

    n = args.entities
    print()
    print(f"reading back {n:,} entities (median wall time; Redis on the same machine)")
    print(f"  {'':<48}{'s':>8}{'entities/s':>12}{'ratio to raw':>14}")
    rows = (
        ("raw redis-py pipeline: HGETALL meta", "raw_meta", "raw_meta"),
        ("rt.status(url) each, all at once", "status_each", "raw_meta"),
        ("rt.statuses(urls), bulk", "statuses", "raw_meta"),
        ("raw redis-py pipeline: meta + snapshot + log", "raw_state", "raw_state"),
        ("rt.state(url) each, all at once", "state_each", "raw_state"),
        ("rt.states(urls), bulk", "states", "raw_state"),
    )
    for label, key, base in rows:
        s = figures[key]
        ratio = s / figures[base]
        print(f"  {label:<48}{s:>8.3f}{fmt(n / s):>12}{ratio:>14.2f}")
    verdicts = {}
    print()
    for bulk, each, base in (
        ("statuses", "status_each", "raw_meta"),
        ("states", "state_each", "raw_state"),
    ):
        ratio = figures[bulk] / figures[base]
        verdicts[bulk] = "PASS" if ratio <= TARGET else "MISS"
        print(
            f"  rt.{bulk}: {ratio:.2f}x the raw pipeline (target <= {TARGET}x): "
            f"{verdicts[bulk]}; {figures[each] / figures[bulk]:.1f}x faster than one call "
            "per entity"
        )
    print()
    print(
        json.dumps(
            {
                "machine": machine,
                "workload": {
                    "entities": n,
                    "partitions": args.partitions,
                    "rounds": args.rounds,
                },
                "seconds": figures,
                "target": TARGET,
                "verdicts": verdicts,
            }
        )
    )
    return 0


async def measure(
    args: argparse.Namespace, rt: Runtime, r: Redis, urls: list[str]
) -> dict[str, float]:
    keys = rt.store.keys
    rounds = args.rounds

    async def raw_meta() -> list[Any]:
        pipe = r.pipeline(transaction=False)
        for url in urls:
            pipe.hgetall(keys.meta(url))
        return await pipe.execute()

    async def raw_state() -> list[Any]:
        pipe = r.pipeline(transaction=False)
        for url in urls:
            pipe.hgetall(keys.meta(url))
            pipe.get(keys.snap(url))
            pipe.xrange(keys.log(url), "-", "+", count=1000)
        return await pipe.execute()

    async def status_each() -> list[Any]:
        return await asyncio.gather(*(rt.status(url) for url in urls))

    async def state_each() -> list[Any]:
        return await asyncio.gather(*(rt.state(url) for url in urls))

    figures: dict[str, float] = {}
    figures["raw_meta"], _ = await timed(rounds, raw_meta)
    figures["status_each"], singles = await timed(rounds, status_each)
    figures["statuses"], bulk = await timed(rounds, lambda: rt.statuses(urls))
    if list(bulk.values()) != singles:
        raise RuntimeError("rt.statuses differs from rt.status")
    figures["raw_state"], _ = await timed(rounds, raw_state)
    figures["state_each"], states_each = await timed(rounds, state_each)
    figures["states"], states = await timed(rounds, lambda: rt.states(urls))
    if list(states.values()) != states_each:
        raise RuntimeError("rt.states differs from rt.state")
    return figures


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--entities", type=int, default=10_000)
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="1,000 entities")
    add_redis_argument(parser)
    args = parser.parse_args(argv)
    if args.quick:
        args.entities = min(args.entities, 1000)
    return args


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(main_async(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
