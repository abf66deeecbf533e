#!/usr/bin/env python
"""Coordination latency of Wakeful: a parent spawns a child, the child finishes a run,
the parent is woken with the response; next to the same causal path in raw redis-py.

    .venv/bin/python scripts/bench_coordination.py            # full size (under a minute)
    .venv/bin/python scripts/bench_coordination.py --quick    # smoke run, a few seconds

What it measures, in one run on one Redis (the issue: "spawn a child, the child
records a run, the parent is woken -- round trip p50/p99 on a local Redis, and
1,000 children fanned out and collected. Target: p50 at most 3 ms per round
trip."):

**Round trip.** ``--roundtrips`` sequential round trips (after ``--warmup``
unmeasured ones) to one long-lived parent entity ``/parent/p``. The client
(``rt.ask``) sends ``{"i", "ts"}``; the parent handler opens a run and
``ctx.spawn("child", ctx.derive_id("c"), initial_message=..., wake=Wake.run_finished())``;
the child opens a run and ``ctx.reply``s; the parent is woken with
``ctx.wake.runs_finished`` and replies, which ends the client's ``ask``. Three
figures per round trip:

- *send -> parent woken with the response* (the headline): ``time.time()`` in the
  payload at send, and ``time.time()`` when the parent's handler starts the wake
  that carries the child's response (client and worker share the machine's clock);
- *parent wake -> parent woken with the response*: ``time.perf_counter()`` at the
  start of the parent's first wake and of its response wake (one process), i.e.
  without the client's send and the first inbox read;
- *rt.ask*: the client's wall time for the whole ``ask`` (send, wait for idle
  through the idle notice, read the run's response back), i.e. what a caller sees.

The headline runs ONE worker in a separate process (a real ``Runtime`` with its
worker, as in ``bench_wakes.py``, its garbage collector settled as the ``wakeful
worker`` CLI does, ``wakeful.heap``; ``--no-gc-freeze`` leaves that out), the
client in this one. The same is then
measured with client and worker in one process (``Runtime(run_worker=True)``;
skip with ``--no-inprocess``): they share one event loop, so every figure there
includes the client's own work.

**Raw baseline.** The minimum chain of Redis round trips for the same causal
path, with redis-py: the client XADDs a request to stream A; ONE consumer
process reads A and B with XREADGROUP (BLOCK, as a worker reads its partitions),
relays the request to B (XADD + XACK in one pipeline), reads it from B and
relays the response back to A (the child), reads the response from A (the
parent is "woken": timed here, like the headline) and XADDs a done notice the
client waits for with XREAD BLOCK (the client's figure is the analog of
``rt.ask``). Three XADD -> XREADGROUP hops, every payload a msgpack ``Message``
event as Wakeful writes.

**Redis round trips.** Each process counts what it sends to Redis (one command
or one pipeline = one round trip, counted at the connection), so the table shows
how many round trips a coordination round trip costs in the worker (and in the
client's ``ask``) against the raw consumer. Lease heartbeats and idle blocking
reads are included (a few per second).

**Fan-out.** ``--fanout-rounds`` times, a fresh ``/fan/f<k>`` parent spawns
``--children`` children in ONE wake (initial message each, ``run_finished``
subscriptions) and replies when every child has reported back. Timed with
``rt.ask`` from send to the parent's final reply; children/s = children / that.
Also: how many parent wakes it took and the notices each carried (notices that
arrive while the parent is busy queue up and reach the next wake together), how
long the first wake's loop of awaited ``ctx.spawn`` calls took, and the time
from the parent's first wake to its last, in the worker.

Every key lives under a unique prefix (``wkcoord-...``) and is deleted at the
end. ``WAKEFUL_*`` variables tune the runtime; the worker process inherits them.
``--profile-worker FILE`` runs cProfile in the worker process during one phase
(``--profile-phase roundtrip|fanout``) and prints its top functions to stderr.
The last line of output is every figure as one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import statistics
import sys
import time
from typing import Any

from benchlib import (
    RAW_COUNT,
    RAW_GROUP,
    STARTUP_TIMEOUT_S,
    Child,
    add_gc_freeze_argument,
    add_profiling_arguments,
    add_redis_argument,
    code_version,
    counting_redis,
    delete_prefix,
    describe_machine,
    emit,
    fmt,
    percentiles,
    print_profile,
    unique_prefix,
)
from redis.asyncio import Redis
from redis.exceptions import ResponseError

from wakeful import HandlerContext, Registry, Runtime, Settings, Wake
from wakeful.events import Message, decode_event, encode_event
from wakeful.heap import settle_for_long_run

PARENT = "/parent/p"
TARGET_P50_MS = 3.0
TARGET_RATIO = 2.0  # issue 19: spawn round trip p50 over the raw relay's

# -- the benchmark entities (run in the worker) -----------------------------------------


class Probe:
    """What the handlers saw; lives in the process that runs the worker."""

    def __init__(self) -> None:
        self.reset(0)

    def reset(self, expect: int) -> None:
        self.expect = expect
        self.counter: Any = None  # the worker's round-trip counter (benchlib.counting_redis)
        self.started: dict[int, tuple[float, float]] = {}  # round -> (send ts, wake perf)
        self.send_to_wake: list[float] = []
        self.wake_to_wake: list[float] = []
        self.mark: tuple[float, int, int] | None = None  # perf, round trips, handler calls
        self.handler_calls = 0
        self.fan_wakes: dict[str, int] = {}
        self.fan_notices: dict[str, list[int]] = {}  # notices per wake
        self.fan_first_wake: dict[str, float] = {}
        self.fan_spawn_s: dict[str, float] = {}  # the spawning wake's handler time
        self.reports: asyncio.Queue[dict[str, Any]] = asyncio.Queue()

    def round_trips(self) -> int:
        return self.counter.n if self.counter is not None else 0


PROBE = Probe()
registry = Registry()


@registry.entity("parent", description="spawns a child per message, replies with its response")
async def parent(ctx: HandlerContext) -> None:
    now, wall = time.perf_counter(), time.time()
    PROBE.handler_calls += 1
    for message in ctx.wake.messages:
        payload = message.payload
        if not payload["warm"]:
            if PROBE.mark is None:
                PROBE.mark = (now, PROBE.round_trips(), PROBE.handler_calls - 1)
            PROBE.started[payload["i"]] = (payload["ts"], now)
        ctx.record_run()
        await ctx.spawn(
            "child", ctx.derive_id("c"), initial_message=payload, wake=Wake.run_finished()
        )
    for finished in ctx.wake.runs_finished:
        start = PROBE.started.pop(int(finished.response or -1), None)
        if start is not None:
            PROBE.send_to_wake.append(wall - start[0])
            PROBE.wake_to_wake.append(now - start[1])
            if len(PROBE.send_to_wake) == PROBE.expect and PROBE.mark is not None:
                t0, rtt0, calls0 = PROBE.mark
                n = PROBE.expect
                PROBE.reports.put_nowait(
                    {
                        "event": "roundtrip",
                        "send_to_wake": percentiles(PROBE.send_to_wake),
                        "wake_to_wake": percentiles(PROBE.wake_to_wake),
                        "mean_wake_to_wake_ms": statistics.fmean(PROBE.wake_to_wake) * 1000,
                        "redis_round_trips_per_rt": (PROBE.round_trips() - rtt0) / n,
                        "parent_wakes_per_rt": (PROBE.handler_calls - calls0) / n,
                        "seconds": now - t0,
                    }
                )
        ctx.reply(finished.response or "")


@registry.entity("child", description="finishes a run with the round number")
async def child(ctx: HandlerContext) -> None:
    for message in ctx.wake.messages:
        ctx.record_run()
        ctx.reply(str(message.payload["i"]))


@registry.entity("fan", description="spawns N children in one wake, replies when all reported")
async def fan(ctx: HandlerContext) -> None:
    now = time.perf_counter()
    url = ctx.entity_url
    PROBE.fan_wakes[url] = PROBE.fan_wakes.get(url, 0) + 1
    PROBE.fan_notices.setdefault(url, []).append(len(ctx.wake.runs_finished))
    for message in ctx.wake.messages:
        PROBE.fan_first_wake[url] = now
        ctx.record_run()
        for n in range(message.payload["children"]):
            await ctx.spawn(
                "child", ctx.derive_id("c"), initial_message={"i": n}, wake=Wake.run_finished()
            )
        PROBE.fan_spawn_s[url] = time.perf_counter() - now
    if not ctx.wake.runs_finished:
        return
    kids = ctx.children
    if ctx.current_run and kids and not any(k.pending for k in kids):
        ctx.reply(str(len(kids)))
        PROBE.reports.put_nowait(
            {
                "event": "fanout",
                "url": url,
                "children": len(kids),
                "parent_wakes": PROBE.fan_wakes[url],
                "notices": PROBE.fan_notices[url],
                "first_wake_to_last_s": now - PROBE.fan_first_wake.get(url, now),
                "spawn_handler_s": PROBE.fan_spawn_s.get(url, 0.0),
            }
        )


# -- the worker process ---------------------------------------------------------------------


def settings_for(args: argparse.Namespace, prefix: str) -> Settings:
    return Settings.from_env(redis_url=args.redis, prefix=prefix, partitions=args.partitions)


async def worker_main(args: argparse.Namespace) -> None:
    PROBE.reset(args.expect)
    conn, PROBE.counter = counting_redis(args.redis)
    rt = await Runtime(
        registry, settings=settings_for(args, args.prefix), run_worker=True, redis=conn
    ).start()
    if args.gc_freeze:
        settle_for_long_run()  # as the `wakeful worker` CLI does
    emit(event="ready")
    profiler = cProfile.Profile() if args.profile else None
    try:
        phases = ["roundtrip"] + ["fanout"] * args.fanout_rounds
        for n, phase in enumerate(phases):
            profiled = profiler is not None and phase == args.profile_phase
            if profiled and (phase == "roundtrip" or n == 1):
                profiler.enable()  # type: ignore[union-attr]
            report = await PROBE.reports.get()
            if profiled:
                profiler.disable()  # type: ignore[union-attr]
            assert rt.worker is not None
            report["worker_stats"] = dict(rt.worker.stats)
            emit(**report)
    finally:
        if profiler is not None:
            profiler.dump_stats(args.profile)
        await rt.close()


# -- the raw relay -------------------------------------------------------------------------


def relay_keys(prefix: str) -> tuple[str, str, str]:
    """Streams A (the parent's inbox), B (the child's) and the client's done notices."""
    return f"{prefix}:relay:{{a}}", f"{prefix}:relay:{{b}}", f"{prefix}:relay:done"


async def relay_setup(r: Redis, prefix: str) -> None:
    a, b, _ = relay_keys(prefix)
    for key in (a, b):
        await r.xgroup_create(key, RAW_GROUP, id="0", mkstream=True)


async def relay_consume(redis_url: str, prefix: str, expect: int, warmup: int) -> dict[str, Any]:
    """One consumer for A and B: A/req -> B, B -> A/resp, A/resp -> done (timed)."""
    r, counter = counting_redis(redis_url)
    a, b, done = relay_keys(prefix)
    a_b = a.encode()
    streams = {a: ">", b: ">"}
    send_to_wake: list[float] = []
    wake_to_wake: list[float] = []
    first: dict[int, float] = {}
    mark: tuple[float, int] | None = None
    finished = 0
    try:
        while finished < warmup + expect:
            reply = await r.xreadgroup(RAW_GROUP, "c1", streams, count=RAW_COUNT, block=100)
            if not reply:
                continue
            now, wall = time.perf_counter(), time.time()
            pipe = r.pipeline(transaction=False)
            for stream, entries in reply:
                ids = []
                for entry_id, fields in entries:
                    payload = decode_event(fields[b"e"]).payload  # type: ignore[attr-defined]
                    if stream != a_b:  # the child: answer the parent
                        out = encode_event(Message(payload={**payload, "k": "resp"}))
                        pipe.xadd(a, {"e": out})
                    elif payload["k"] == "req":  # the parent: spawn the child
                        if not payload["warm"]:
                            mark = mark or (now, counter.n)
                            first[payload["i"]] = now
                        out = encode_event(Message(payload={**payload, "k": "work"}))
                        pipe.xadd(b, {"e": out})
                    else:  # the parent, woken with the response
                        if not payload["warm"]:
                            send_to_wake.append(wall - payload["ts"])
                            wake_to_wake.append(now - first.pop(payload["i"]))
                        pipe.xadd(done, {"i": payload["i"]})
                        finished += 1
                    ids.append(entry_id)
                pipe.xack(stream, RAW_GROUP, *ids)
            await pipe.execute()
        t0, rtt0 = mark or (time.perf_counter(), counter.n)
        return {
            "event": "relay",
            "send_to_wake": percentiles(send_to_wake),
            "wake_to_wake": percentiles(wake_to_wake),
            "redis_round_trips_per_rt": (counter.n - rtt0) / max(1, expect),
            "seconds": time.perf_counter() - t0,
        }
    finally:
        await r.aclose()


async def relay_main(args: argparse.Namespace) -> None:
    emit(event="ready")
    emit(**await relay_consume(args.redis, args.prefix, args.expect, args.warmup))


async def relay_client(r: Redis, prefix: str, n: int, warmup: int) -> list[float]:
    """Send a request, wait for its done notice; returns the measured wall times."""
    a, _, done = relay_keys(prefix)
    last = "0-0"
    walls: list[float] = []
    for i in range(warmup + n):
        t = time.perf_counter()
        data = encode_event(
            Message(payload={"k": "req", "i": i, "ts": time.time(), "warm": i < warmup})
        )
        await r.xadd(a, {"e": data})
        reply = await r.xread({done: last}, count=1, block=10_000)
        if not reply:
            raise TimeoutError(f"relay round trip {i} got no done notice in 10 s")
        last = reply[0][1][-1][0].decode()
        if i >= warmup:
            walls.append(time.perf_counter() - t)
    return walls


async def run_relay(
    args: argparse.Namespace, r: Redis, prefix: str, *, inprocess: bool
) -> dict[str, Any]:
    await relay_setup(r, prefix)
    client, counter = counting_redis(args.redis)
    n, warmup = args.roundtrips, args.warmup
    try:
        if inprocess:
            consumer = asyncio.create_task(relay_consume(args.redis, prefix, n, warmup))
            before = counter.n
            walls = await relay_client(client, prefix, n, warmup)
            report = await asyncio.wait_for(consumer, 30)
        else:
            child = await Child.start(
                __file__, "relay", args.redis, prefix, expect=n, warmup=warmup
            )
            try:
                await child.expect("ready", STARTUP_TIMEOUT_S)
                before = counter.n
                walls = await relay_client(client, prefix, n, warmup)
                report = await child.expect("relay", 30)
                await child.finish()
            finally:
                child.kill()
        report["client"] = percentiles(walls)
        report["client_round_trips_per_rt"] = (counter.n - before) / (n + warmup)
        return report
    finally:
        await client.aclose()


# -- Wakeful -----------------------------------------------------------------------------


async def run_wakeful(
    args: argparse.Namespace, prefix: str, *, inprocess: bool, fanout_rounds: int
) -> dict[str, Any]:
    n, warmup = args.roundtrips, args.warmup
    conn, counter = counting_redis(args.redis)
    child: Child | None = None
    if inprocess:
        PROBE.reset(n)
        PROBE.counter = counter
        rt = await Runtime(
            registry, settings=settings_for(args, prefix), run_worker=True, redis=conn
        ).start()
    else:
        rt = await Runtime(
            registry, settings=settings_for(args, prefix), run_worker=False, redis=conn
        ).start()
        child = await Child.start(
            __file__,
            "worker",
            args.redis,
            prefix,
            partitions=args.partitions,
            expect=n,
            fanout_rounds=fanout_rounds,
            no_gc_freeze=not args.gc_freeze,
            profile=args.profile_worker,
            profile_phase=args.profile_phase,
        )

    async def report(kind: str, timeout: float) -> dict[str, Any]:
        if child is not None:
            return await child.expect(kind, timeout)
        item = await asyncio.wait_for(PROBE.reports.get(), timeout)
        assert rt.worker is not None
        item["worker_stats"] = dict(rt.worker.stats)
        return item

    try:
        if child is not None:
            await child.expect("ready", STARTUP_TIMEOUT_S)
        asks: list[float] = []
        before = 0
        for i in range(warmup + n):
            if i == warmup:
                before = counter.n
            t = time.perf_counter()
            answer = await rt.ask(
                PARENT, {"i": i, "ts": time.time(), "warm": i < warmup}, timeout=30
            )
            if i >= warmup:
                asks.append(time.perf_counter() - t)
            if answer != str(i):
                raise RuntimeError(f"round trip {i} answered {answer!r}")
        client_rtt = (counter.n - before) / n
        result = await report("roundtrip", 30)
        result["ask"] = percentiles(asks)
        if not inprocess:
            result["client_round_trips_per_rt"] = client_rtt
        fans = []
        for k in range(fanout_rounds):
            url = f"/fan/f{k}"
            t = time.perf_counter()
            answer = await rt.ask(url, {"children": args.children}, timeout=600)
            wall = time.perf_counter() - t
            if answer != str(args.children):
                raise RuntimeError(f"{url} answered {answer!r}, expected {args.children}")
            fan_report = await report("fanout", 30)
            fan_report["seconds"] = wall
            fan_report["children_per_s"] = args.children / wall
            fans.append(fan_report)
        result["fanout"] = fans
        if child is not None:
            await child.finish()
        return result
    finally:
        if child is not None:
            child.kill()
        await rt.close()


# -- orchestration -----------------------------------------------------------------------


def q_row(label: str, q: dict[str, Any], extra: str = "") -> None:
    print(f"  {label:<48}{q['p50']:>8.2f}{q['p90']:>8.2f}{q['p99']:>8.2f}{q['max']:>8.2f}  {extra}")


async def main_async(args: argparse.Namespace) -> int:
    r = Redis.from_url(args.redis, decode_responses=False)
    machine = await describe_machine(r)
    machine["code"] = code_version()
    print(
        f"workload: {args.roundtrips:,} sequential round trips (+{args.warmup} warm-up) to one "
        f"parent; fan-out of {args.children:,} children x {args.fanout_rounds} round(s); "
        f"{args.partitions} partitions; runtime at {machine['code']}",
        flush=True,
    )
    base = unique_prefix("wkcoord")
    modes = [False, True] if args.inprocess else [False]
    raw: dict[str, Any] = {}
    wakeful: dict[str, Any] = {}
    try:
        for inprocess in modes:
            name = "inprocess" if inprocess else "process"
            raw[name] = await run_relay(args, r, f"{base}-r{name[0]}", inprocess=inprocess)
            print(f"  raw relay ({name}) done", flush=True)
            wakeful[name] = await run_wakeful(
                args,
                f"{base}-w{name[0]}",
                inprocess=inprocess,
                fanout_rounds=0 if inprocess else args.fanout_rounds,
            )
            print(f"  wakeful ({name}) done", flush=True)
    finally:
        for side in ("rp", "ri", "wp", "wi"):
            await delete_prefix(r, f"{base}-{side}")
        await r.aclose()

    head = wakeful["process"]
    p50 = head["send_to_wake"]["p50"]
    ok = p50 <= TARGET_P50_MS
    raw_p50 = raw["process"]["send_to_wake"]["p50"]
    ratio = p50 / raw_p50
    ratio_ok = ratio <= TARGET_RATIO  # issue 19: against the raw relay of the same run
    print()
    print(
        f"round trip: client -> parent spawns child -> child replies -> parent woken with the "
        f"response; {args.roundtrips} sequential, in ms"
    )
    print(f"  {'':<48}{'p50':>8}{'p90':>8}{'p99':>8}{'max':>8}  Redis round trips per RT")
    for name in ("process", "inprocess"):
        if name not in raw:
            continue
        where = "worker in its own process" if name == "process" else "client+worker in one process"
        rr, wk = raw[name], wakeful[name]
        print(f" {where}:")
        q_row(
            "raw relay: send -> parent woken with response",
            rr["send_to_wake"],
            f"consumer {rr['redis_round_trips_per_rt']:.1f}",
        )
        q_row("raw relay: parent read -> response read", rr["wake_to_wake"])
        q_row(
            "raw relay: client send -> done notice read",
            rr["client"],
            f"client {rr['client_round_trips_per_rt']:.1f}",
        )
        q_row(
            "wakeful: send -> parent woken with response",
            wk["send_to_wake"],
            f"worker {wk['redis_round_trips_per_rt']:.1f}"
            + (" (+ client)" if name == "inprocess" else ""),
        )
        q_row("wakeful: parent wake -> parent woken w/ response", wk["wake_to_wake"])
        q_row(
            "wakeful: rt.ask (client wall time)",
            wk["ask"],
            f"client {wk['client_round_trips_per_rt']:.1f}" if name == "process" else "",
        )
        print(
            f"  ratio wakeful/raw, send -> parent woken, p50: "
            f"{wk['send_to_wake']['p50'] / rr['send_to_wake']['p50']:.1f}x; "
            f"parent wakes per round trip {wk['parent_wakes_per_rt']:.2f}"
        )
    print(
        f"  headline (worker in its own process) p50 {p50:.2f} ms, p99 "
        f"{head['send_to_wake']['p99']:.2f} ms; target p50 <= {TARGET_P50_MS:g} ms: "
        f"{'PASS' if ok else 'MISS'}"
    )
    print(
        f"  issue 19: spawn round trip p50 {p50:.2f} ms / raw three-hop relay {raw_p50:.2f} ms"
        f" = {ratio:.2f}x; target <= {TARGET_RATIO:g}x: {'PASS' if ratio_ok else 'MISS'}"
    )
    fans = head["fanout"]
    if fans:
        print()
        print(
            f"fan-out: one parent spawns {args.children:,} children in one wake and replies when "
            "all reported back (worker in its own process; rt.ask wall time)"
        )
        print(
            f"  {'round':<8}{'seconds':>10}{'children/s':>12}{'spawn loop (s)':>16}"
            f"{'1st wake -> last (s)':>22}{'parent wakes':>14}  notices per wake"
        )
        for k, f in enumerate(fans):
            notices = ", ".join(str(n) for n in f["notices"])
            print(
                f"  {k + 1:<8}{f['seconds']:>10.3f}{fmt(f['children_per_s']):>12}"
                f"{f['spawn_handler_s']:>16.3f}{f['first_wake_to_last_s']:>22.3f}"
                f"{f['parent_wakes']:>14}  {notices}"
            )
        med = statistics.median(f["children_per_s"] for f in fans)
        print(
            f"  median {fmt(med)} children/s; spawn loop = the handler's {args.children:,} "
            "awaited ctx.spawn calls in the first wake; a later parent wake carries every\n"
            "  notice that arrived while the previous wake ran"
        )
    print()
    print(
        json.dumps(
            {
                "machine": machine,
                "workload": {
                    "roundtrips": args.roundtrips,
                    "warmup": args.warmup,
                    "children": args.children,
                    "fanout_rounds": args.fanout_rounds,
                    "partitions": args.partitions,
                },
                "raw_relay": raw,
                "wakeful": wakeful,
                "headline": {
                    "send_to_parent_woken_p50_ms": p50,
                    "send_to_parent_woken_p99_ms": head["send_to_wake"]["p99"],
                    "fanout_children_per_s_median": (
                        statistics.median(f["children_per_s"] for f in fans) if fans else None
                    ),
                },
                "targets": {"p50_le_3ms": ok, "ratio_le_2x": ratio_ok},
                "ratio_p50": ratio,
            }
        )
    )
    if args.profile_worker:
        print_profile(args.profile_worker, 40)
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Wakeful parent/child round trip and fan-out next to a raw redis-py relay.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_redis_argument(parser)
    parser.add_argument("--roundtrips", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=10, help="unmeasured round trips first")
    parser.add_argument("--children", type=int, default=1000, help="fan-out size")
    parser.add_argument("--fanout-rounds", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 30 round trips, 200 children, 1 round"
    )
    parser.add_argument(
        "--no-inprocess",
        dest="inprocess",
        action="store_false",
        help="skip the client-and-worker-in-one-process measurements",
    )
    add_gc_freeze_argument(parser)
    add_profiling_arguments(
        parser,
        ["roundtrip", "fanout"],
        "which phase --profile-worker covers (fanout: the first round)",
    )
    # internal: the consumer processes
    parser.add_argument(
        "--role", choices=["main", "worker", "relay"], default="main", help=argparse.SUPPRESS
    )
    parser.add_argument("--prefix", help=argparse.SUPPRESS)
    parser.add_argument("--expect", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--profile", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.roundtrips, args.warmup, args.children, args.fanout_rounds = 30, 3, 200, 1
    if min(args.roundtrips, args.children, args.partitions) < 1 or args.warmup < 0:
        parser.error("--roundtrips, --children and --partitions must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.role == "worker":
            asyncio.run(worker_main(args))
            return 0
        if args.role == "relay":
            asyncio.run(relay_main(args))
            return 0
        return asyncio.run(main_async(args))
    except ResponseError as exc:
        print(f"bench_coordination: Redis error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
