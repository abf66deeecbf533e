#!/usr/bin/env python
"""Redis memory of Wakeful: bytes per entity, per message, and over a long run.

    .venv/bin/python scripts/bench_memory.py             # 200,000 messages to 1,000 entities
    .venv/bin/python scripts/bench_memory.py --quick     # 20,000 messages to 200 entities
    .venv/bin/python scripts/bench_memory.py --no-compare  # only the run with retention on

It starts a private redis-server (no persistence, on a free port), so that
``used_memory`` counts Wakeful's keys only (``--redis URL`` uses another server;
its other keys then count too). A worker runs in this process, with a counter
entity type whose every wake updates one row (so every message costs an input
and a ``state`` event in the log).

1. **Per entity**: one message to each of ``--entities`` entities; the growth of
   ``used_memory`` divided by the number of entities.
2. **Long run**: ``--messages`` messages round-robin over those entities, in
   ``--samples`` steps; after each step (everything idle) the bytes of each kind of
   key (``MEMORY USAGE``: logs, metadata, snapshots, inboxes, the rest; the figures
   are computed from their sum) and ``used_memory`` (which also counts client
   buffers and allocator slack, so it is noisier) are sampled. A stream frees
   memory by whole nodes (``stream-node-max-entries``, 100 by default), so a log's
   bytes move in steps. With retention on (``--snapshot-every``,
   ``--retention-s``, ``--retention-entries``) the logs stop growing once every
   entity has a snapshot: memory follows the entities and the retention window.
3. **Without retention** (skip with ``--no-compare``): the same run on a keyspace
   whose retention keeps everything, for the bytes per message it would cost.

It prints the machine, the curve, the figures and the steady state; the last line
is every figure as one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
from redis.asyncio import Redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import delete_prefix, describe_machine, emit, fmt, unique_prefix

from wakeful import Collection, HandlerContext, Registry, Runtime, Settings

SEND_CHUNK = 500  # concurrent sends at a time
KINDS = ("log", "meta", "snap", "inbox")


class Count(msgspec.Struct):
    key: str
    value: int


def counter_registry() -> Registry:
    registry = Registry()

    @registry.entity("counter", state={"count": Collection(row=Count)})
    async def counter(ctx: HandlerContext) -> None:
        count = ctx.db.collection("count", Count)
        n = len(ctx.wake.messages)
        if "n" not in count:
            count.insert(Count("n", n))
            return

        def add(row: Count) -> None:
            row.value += n

        count.update("n", add)

    return registry


def start_private_redis(data: Path) -> tuple[subprocess.Popen[bytes], str]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no", "--dir", str(data), "--maxmemory-policy", "noeviction"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    return proc, f"redis://127.0.0.1:{port}/0"


async def wait_for(r: Redis, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            await r.ping()
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


async def used_memory(r: Redis) -> int:
    return int((await r.info("memory"))["used_memory"])


async def key_bytes(r: Redis, prefix: str) -> dict[str, int]:
    """Bytes of the keyspace's keys by kind (``MEMORY USAGE ... SAMPLES 0``)."""
    keys = [k async for k in r.scan_iter(match=f"{prefix}:*", count=2000)]
    pipe = r.pipeline(transaction=False)
    for key in keys:
        pipe.memory_usage(key, samples=0)
    sizes = await pipe.execute()
    out = dict.fromkeys((*KINDS, "other"), 0)
    for key, size in zip(keys, sizes, strict=True):
        name = key.decode()
        kind = next((k for k in KINDS if f":{k}:" in name or name.endswith(f":{k}")), "other")
        out[kind] += int(size or 0)
    return out


async def log_entries(r: Redis, rt: Runtime, urls: list[str]) -> int:
    assert rt.store is not None
    pipe = r.pipeline(transaction=False)
    for url in urls:
        pipe.xlen(rt.store.keys.log(url))
    return sum(await pipe.execute())


def slope(xs: list[int], ys: list[int]) -> float:
    """The least-squares slope of ys over xs."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0


async def send_all(rt: Runtime, sends: list[str]) -> None:
    for start in range(0, len(sends), SEND_CHUNK):
        chunk = sends[start : start + SEND_CHUNK]
        await asyncio.gather(*(rt.send(url, "tick") for url in chunk))


async def run_keyspace(
    r: Redis, url: str, args: argparse.Namespace, *, retention: bool
) -> dict[str, Any]:
    prefix = unique_prefix("wkmem")
    settings = Settings(
        redis_url=url,
        prefix=prefix,
        partitions=args.partitions,
        snapshot_every=args.snapshot_every,
        # "keep everything": a retention far longer than the run
        retention_s=args.retention_s if retention else 10.0**9,
        retention_entries=args.retention_entries,
    )
    label = "retention on" if retention else "retention off (keeps every entry)"
    print(f"\n== {label}: snapshot every {settings.snapshot_every} entries, keep entries "
          f"younger than {fmt(settings.retention_s, 1)} s and the newest "
          f"{settings.retention_entries} ==")  # fmt: skip
    rt = Runtime(counter_registry(), settings=settings, run_worker=True)
    await rt.start()
    try:
        urls = [f"/counter/c{i}" for i in range(args.entities)]
        base = await used_memory(r)
        started = time.monotonic()
        await send_all(rt, urls)
        await rt.wait_all_idle(["counter"], timeout=600)
        per_entity = sum((await key_bytes(r, prefix)).values()) / args.entities
        print(f"{args.entities} entities, one message each: {fmt(per_entity)} bytes of keys "
              f"per entity ({fmt((await used_memory(r) - base) / args.entities)} of used_memory)")  # fmt: skip
        curve: list[dict[str, Any]] = []
        step = args.messages // args.samples
        sent = 0
        print(f"{'messages':>10} {'used_memory':>12} {'keys':>10} {'log entries':>12} "
              + " ".join(f"{k:>10}" for k in (*KINDS, "other")))  # fmt: skip
        for _ in range(args.samples):
            await send_all(rt, [urls[(sent + i) % len(urls)] for i in range(step)])
            sent += step
            await rt.wait_all_idle(["counter"], timeout=600)
            sizes = await key_bytes(r, prefix)
            point = {
                "messages": sent,
                "used_memory": await used_memory(r) - base,
                "key_bytes": sum(sizes.values()),
                "log_entries": await log_entries(r, rt, urls),
                "bytes": sizes,
            }
            curve.append(point)
            print(f"{sent:>10,} {point['used_memory']:>12,} {point['key_bytes']:>10,} "
                  f"{point['log_entries']:>12,} "
                  + " ".join(f"{point['bytes'][k]:>10,}" for k in (*KINDS, "other")))  # fmt: skip
        elapsed = time.monotonic() - started
        last = curve[-1]
        second = curve[len(curve) // 2 :]  # fitted, not two points: logs move by whole nodes
        per_message = slope([p["messages"] for p in second], [p["key_bytes"] for p in second])
        growth = {
            kind: slope([p["messages"] for p in second], [p["bytes"][kind] for p in second])
            for kind in KINDS
        }
        print(f"second half of the run: {fmt(per_message, 1)} bytes of keys per message ("
              + ", ".join(f"{kind} {fmt(v, 1)}" for kind, v in growth.items())
              + f"); {fmt(sent / elapsed)} messages/s")  # fmt: skip
        return {
            "retention": retention,
            "settings": {
                "snapshot_every": settings.snapshot_every,
                "retention_s": settings.retention_s,
                "retention_entries": settings.retention_entries,
                "partitions": settings.partitions,
            },
            "entities": args.entities,
            "bytes_per_entity_first_message": round(per_entity),
            "curve": curve,
            "bytes_per_message_second_half": round(per_message, 1),
            "bytes_per_message_second_half_by_kind": {k: round(v, 1) for k, v in growth.items()},
            "final_bytes_per_entity": round(last["key_bytes"] / args.entities),
            "final_used_memory_per_entity": round(last["used_memory"] / args.entities),
            "final_log_entries_per_entity": round(last["log_entries"] / args.entities, 1),
            "messages_per_s": round(sent / elapsed),
        }
    finally:
        await rt.close()
        await delete_prefix(r, prefix)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="20,000 messages to 200 entities")
    parser.add_argument("--entities", type=int, default=None)
    parser.add_argument("--messages", type=int, default=None)
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--snapshot-every", type=int, default=50)
    parser.add_argument("--retention-s", type=float, default=0.0)
    parser.add_argument("--retention-entries", type=int, default=20)
    parser.add_argument("--no-compare", action="store_true", help="skip the run without retention")
    parser.add_argument("--redis", help="use this Redis instead of a private redis-server")
    args = parser.parse_args()
    args.entities = args.entities or (200 if args.quick else 1000)
    args.messages = args.messages or (20_000 if args.quick else 200_000)
    args.samples = max(2, args.samples)

    proc = None
    tmp = tempfile.TemporaryDirectory()
    if args.redis:
        url = args.redis
    else:
        if shutil.which("redis-server") is None:
            sys.exit("redis-server is not installed (or pass --redis URL)")
        proc, url = start_private_redis(Path(tmp.name))
    r = Redis.from_url(url)
    try:
        await wait_for(r)
        machine = await describe_machine(r)
        if args.redis:
            print("  note: a shared Redis; used_memory counts its other keys' changes too")
        runs = [await run_keyspace(r, url, args, retention=True)]
        if not args.no_compare:
            runs.append(await run_keyspace(r, url, args, retention=False))
        on = runs[0]
        print("\n== steady state ==")
        print(f"with retention: {fmt(on['final_bytes_per_entity'])} bytes of keys per entity "
              f"({fmt(on['final_log_entries_per_entity'], 1)} log entries) after "
              f"{fmt(args.messages / args.entities)} messages each; "
              f"{fmt(on['bytes_per_message_second_half'], 1)} bytes per further message "
              f"(inboxes {fmt(on['bytes_per_message_second_half_by_kind']['inbox'], 1)}: "
              "acknowledged wake pointers, unless they are deleted at acknowledgement)")  # fmt: skip
        if len(runs) > 1:
            off = runs[1]
            print(f"without retention: {fmt(off['final_bytes_per_entity'])} bytes of keys per "
                  f"entity ({fmt(off['final_log_entries_per_entity'], 1)} log entries); "
                  f"{fmt(off['bytes_per_message_second_half'], 1)} bytes per further message")  # fmt: skip
        emit(machine=machine, entities=args.entities, messages=args.messages, runs=runs)
    finally:
        await r.aclose()
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=10)
        tmp.cleanup()


if __name__ == "__main__":
    asyncio.run(main())
