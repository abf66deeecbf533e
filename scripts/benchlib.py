"""Helpers shared by the benchmark scripts (``bench_wakes.py``, ``bench_coordination.py``,
``bench_agent.py``).

- the machine: :func:`describe_machine` prints one line with the CPU model, cores,
  Python, redis-py, hiredis, msgspec, the Redis server version and AOF, and how
  busy the CPUs were before the run (other work skews the figures, latency most);
- figures: :func:`percentiles` (p50/p90/p99/max in ms), :func:`median_of`, :func:`fmt`;
- keys: :func:`unique_prefix` and :func:`delete_prefix` (every benchmark key lives
  under one unique prefix and is deleted at the end);
- output: :func:`emit` writes one JSON line (the last line of every benchmark's
  output, and how consumer subprocesses report to the driver);
- Redis round trips: :func:`counting_redis` counts what a client sends (one
  command or one pipeline = one round trip);
- subprocesses: :class:`Child` runs a script in another role and reads its JSON lines;
- the raw baseline: :func:`raw_consume` is the raw redis-py consume loop of
  PERF-REFERENCE (XREADGROUP COUNT 100 over the partition streams, decode, one
  pipeline of XADD per message + XACK per stream), :func:`raw_add` the producer
  side, and :func:`run_raw_throughput` drives one consumer process over a
  preloaded backlog.

The scripts run as ``python scripts/<name>.py``, so this module is importable as
``benchlib`` from them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import secrets
import statistics
import subprocess
import sys
import time
from importlib import metadata
from typing import Any

import msgspec
import redis
from redis.asyncio import Connection, Redis

from wakeful.events import Message, decode_event, encode_event
from wakeful.keys import Keyspace

RAW_GROUP = "bench"
RAW_COUNT = 100
STARTUP_TIMEOUT_S = 60.0

# -- output and figures ----------------------------------------------------------


def emit(**data: Any) -> None:
    print(json.dumps(data), flush=True)


def percentiles(samples_s: list[float]) -> dict[str, float | int]:
    """p50/p90/p99/max in milliseconds (nearest rank)."""
    if not samples_s:
        return {"n": 0}
    ordered = sorted(samples_s)

    def rank(q: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, round(q * len(ordered)) - 1))] * 1000

    return {
        "n": len(ordered),
        "p50": round(rank(0.50), 3),
        "p90": round(rank(0.90), 3),
        "p99": round(rank(0.99), 3),
        "max": round(ordered[-1] * 1000, 3),
    }


def median_of(rounds: list[dict[str, Any]], *path: str) -> float:
    values = []
    for item in rounds:
        for part in path:
            item = item[part]
        values.append(item)
    return statistics.median(values)


def fmt(value: float, digits: int = 0) -> str:
    return f"{value:,.{digits}f}"


# -- keys ---------------------------------------------------------------------------


def unique_prefix(tag: str = "wkbench") -> str:
    """A key prefix no other run uses: ``<tag>-<pid>-<random>``."""
    return f"{tag}-{os.getpid()}-{secrets.token_hex(3)}"


async def delete_prefix(r: Redis, prefix: str) -> int:
    deleted = 0
    batch: list[bytes] = []
    async for key in r.scan_iter(match=f"{prefix}:*", count=2000):
        batch.append(key)
        if len(batch) >= 1000:
            deleted += await r.unlink(*batch)
            batch = []
    if batch:
        deleted += await r.unlink(*batch)
    return deleted


# -- the machine ----------------------------------------------------------------------


def _cpu_times() -> tuple[int, int] | None:
    try:
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return sum(values), values[3] + (values[4] if len(values) > 4 else 0)  # total, idle+iowait


async def background_load(seconds: float = 1.0) -> float | None:
    """Share of all CPUs busy (with anything) during ``seconds`` before the benchmark."""
    before = _cpu_times()
    await asyncio.sleep(seconds)
    after = _cpu_times()
    if before is None or after is None or after[0] == before[0]:
        return None
    return 1 - (after[1] - before[1]) / (after[0] - before[0])


def machine_info(server: dict[str, Any]) -> dict[str, Any]:
    cpu = platform.processor() or "?"
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 0
    hiredis_version = None
    with contextlib.suppress(metadata.PackageNotFoundError):
        hiredis_version = metadata.version("hiredis")
    from redis.utils import HIREDIS_AVAILABLE

    return {
        "platform": platform.platform(),
        "cpu": cpu,
        "cores": cores,
        "python": platform.python_version(),
        "redis_py": redis.__version__,
        "hiredis": hiredis_version if HIREDIS_AVAILABLE else None,
        "msgspec": msgspec.__version__,
        "redis_server": server.get("redis_version"),
        "appendonly": server.get("aof_enabled"),
    }


async def describe_machine(r: Redis, *, busy_warning: str | None = None) -> dict[str, Any]:
    """Collect :func:`machine_info` and the CPU load before the run, and print both."""
    info = await r.info("server")
    info.update(await r.info("persistence"))
    machine = machine_info(info)
    machine["busy_before"] = await background_load()
    print(
        f"machine: {machine['platform']} | {machine['cpu']} | {machine['cores']} cores | "
        f"Python {machine['python']} | redis-py {machine['redis_py']} "
        f"(hiredis {machine['hiredis'] or 'NOT available'}) | msgspec {machine['msgspec']} | "
        f"Redis {machine['redis_server']} (AOF {'on' if machine['appendonly'] else 'off'})"
    )
    busy = machine["busy_before"]
    if busy is not None:
        print(f"CPU busy before the run (other processes): {busy:.0%}")
        if busy > 0.15:
            print(
                busy_warning
                or "  WARNING: the machine is not idle; producer, consumer and Redis compete "
                "with other work, so the figures (latency most of all) are pessimistic"
            )
    return machine


def code_version() -> str:
    """The commit the runtime is imported from (``git describe --always``), plus a note
    when ``runtime/`` has uncommitted changes (other files do not count)."""
    import wakeful

    package = os.path.dirname(os.path.abspath(wakeful.__file__))

    def git(*argv: str) -> str:
        try:
            out = subprocess.run(
                ["git", *argv], cwd=package, capture_output=True, text=True, timeout=10
            )
        except (OSError, subprocess.SubprocessError):
            return ""
        return out.stdout.strip()

    commit = git("describe", "--always") or "?"
    if git("status", "--porcelain", "--", "."):
        commit += " + uncommitted runtime/ changes"
    return commit


# -- Redis round trips -------------------------------------------------------------------


class RoundTrips:
    """How many times a client wrote to Redis (see :func:`counting_redis`)."""

    def __init__(self) -> None:
        self.n = 0


def runtime_connection_class(url: str) -> type[Connection]:
    """The connection class the runtime's own client uses for ``url`` (see
    ``wakeful.connection.connect``), so a benchmark's clients pack commands the same way."""
    try:
        from wakeful.connection import HiredisPackingConnection
    except ImportError:  # a runtime without it
        return Connection
    return HiredisPackingConnection if url.startswith("redis://") else Connection


def counting_redis(url: str, max_connections: int | None = None) -> tuple[Redis, RoundTrips]:
    """A client like the runtime's (:func:`runtime_connection_class`) whose connections
    count every write to the socket: one command, or one whole pipeline, is one round
    trip (a blocking read that times out counts too; so does a connection's
    handshake). ``max_connections`` sizes the pool (redis-py's asyncio default is 100)."""
    counter = RoundTrips()

    class CountingConnection(runtime_connection_class(url)):  # type: ignore[misc]
        async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
            counter.n += 1
            await super().send_packed_command(command, check_health)

    options: dict[str, Any] = {"connection_class": CountingConnection}
    if max_connections is not None:
        options["max_connections"] = max_connections
    return Redis.from_url(url, decode_responses=False, **options), counter


# -- consumer subprocesses ---------------------------------------------------------------


class Child:
    """A consumer subprocess (a benchmark script in another role) speaking JSON lines."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(
        cls, script: str, role: str, redis_url: str, prefix: str, **extra: Any
    ) -> Child:
        """Run ``script --role ROLE --redis URL --prefix P`` plus ``--name value`` per
        ``extra`` item (``True`` is a bare flag; ``None`` and ``False`` are left out)."""
        argv = [
            sys.executable,
            os.path.abspath(script),
            "--role",
            role,
            "--redis",
            redis_url,
            "--prefix",
            prefix,
        ]
        for name, value in extra.items():
            if value is True:
                argv.append(f"--{name.replace('_', '-')}")
            elif value not in (None, False):
                argv += [f"--{name.replace('_', '-')}", str(value)]
        proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE)
        return cls(proc)

    async def expect(self, event: str, timeout: float) -> dict[str, Any]:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no {event!r} from the {self.proc.pid} child in {timeout}s")
            line = await asyncio.wait_for(self.proc.stdout.readline(), remaining)
            if not line:
                raise RuntimeError(f"child {self.proc.pid} exited before reporting {event!r}")
            with contextlib.suppress(ValueError):
                data = json.loads(line)
                if isinstance(data, dict) and data.get("event") == event:
                    return data

    async def finish(self) -> None:
        try:
            await asyncio.wait_for(self.proc.wait(), 30)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()

    def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()


# -- the raw redis-py baseline ------------------------------------------------------------


def raw_inbox(prefix: str, partition: int) -> str:
    return f"{prefix}:raw:{{p{partition}}}:in"


def raw_log(prefix: str, partition: int, url: str) -> str:
    return f"{prefix}:raw:{{p{partition}}}:log:{url}"


async def raw_setup(r: Redis, prefix: str, partitions: int) -> None:
    """Create the raw loop's partition streams and their consumer group."""
    for p in range(partitions):
        await r.xgroup_create(raw_inbox(prefix, p), RAW_GROUP, id="0", mkstream=True)


def raw_add(pipe: Any, keys: Keyspace, url: str, payload: Any) -> None:
    """Queue one message for ``url`` on ``pipe``: the bytes Wakeful would write (a
    msgpack ``Message`` event) to the partition stream of ``url``."""
    data = encode_event(Message(payload=payload))
    pipe.xadd(raw_inbox(keys.prefix, keys.partition(url)), {"u": url, "e": data})


async def raw_preload(r: Redis, keys: Keyspace, urls: list[str], messages: int) -> None:
    """Preload ``messages`` messages ``{"n": i}``, round-robin over ``urls``."""
    for start in range(0, messages, 1000):
        pipe = r.pipeline(transaction=False)
        for i in range(start, min(messages, start + 1000)):
            raw_add(pipe, keys, urls[i % len(urls)], {"n": i})
        await pipe.execute()


async def raw_consume(
    redis_url: str, prefix: str, partitions: int, expect: int, expect_latency: int = 0
) -> None:
    """The raw consume loop, run in a consumer process; reports with :func:`emit`.

    XREADGROUP COUNT 100 over all partition streams (BLOCK), decode every message,
    and one pipeline per read with one XADD per message to a per-entity log stream
    plus one XACK per stream. Every message is one "handler call". Emits ``ready``,
    ``throughput`` once ``expect`` unstamped messages are done (with ``cpu_s``, the
    process CPU time it took), and ``latency`` once ``expect_latency`` messages
    carrying a send time ``ts`` are done.
    """
    r = Redis.from_url(redis_url, decode_responses=False)
    await r.ping()
    streams = {raw_inbox(prefix, p): ">" for p in range(partitions)}
    keys = Keyspace(prefix, partitions)
    log_keys: dict[bytes, str] = {}
    handler_lat: list[float] = []
    commit_lat: list[float] = []
    done = 0
    stamped = 0
    emit(event="ready", startup_s=0.0, partitions=partitions)
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    throughput_reported = False
    while True:
        reply = await r.xreadgroup(RAW_GROUP, "c1", streams, count=RAW_COUNT, block=100)
        if not reply:
            continue
        now = time.time()
        stamps: list[float] = []
        pipe = r.pipeline(transaction=False)
        for stream, entries in reply:
            ids = []
            for entry_id, fields in entries:
                data = fields[b"e"]
                event = decode_event(data)
                url_b = fields[b"u"]
                key = log_keys.get(url_b)
                if key is None:
                    url = url_b.decode()
                    key = log_keys[url_b] = raw_log(prefix, keys.partition(url), url)
                pipe.xadd(key, {"e": data})
                payload = event.payload  # type: ignore[attr-defined]
                if isinstance(payload, dict) and "ts" in payload:
                    stamps.append(payload["ts"])
                ids.append(entry_id)
            pipe.xack(stream, RAW_GROUP, *ids)
        await pipe.execute()
        committed_at = time.time()
        handler_lat.extend(now - ts for ts in stamps)
        commit_lat.extend(committed_at - ts for ts in stamps)
        done += sum(len(entries) for _, entries in reply) - len(stamps)
        stamped += len(stamps)
        if not throughput_reported and done >= expect:
            throughput_reported = True
            elapsed = time.perf_counter() - t0
            emit(
                event="throughput",
                seconds=elapsed,
                seconds_committed=elapsed,
                messages=done,
                handler_calls=done,
                activations=done,
                cpu_s=time.process_time() - cpu0,
            )
            if not expect_latency:
                break
        if expect_latency and stamped >= expect_latency:
            emit(
                event="latency", handler=percentiles(handler_lat), committed=percentiles(commit_lat)
            )
            break
    await r.aclose()


async def run_raw_throughput(
    script: str,
    r: Redis,
    redis_url: str,
    prefix: str,
    *,
    partitions: int,
    entities: int,
    messages: int,
    timeout: float = 120.0,
) -> dict[str, Any]:
    """Preload a backlog and drain it with ONE raw consumer process.

    ``script`` must run :func:`raw_consume` for ``--role raw`` (with ``--partitions``
    and ``--expect``). Returns the consumer's ``throughput`` report plus
    ``msgs_per_s`` and ``cpu_us_per_msg``.
    """
    keys = Keyspace(prefix, partitions)
    urls = [f"/raw/e{i:05d}" for i in range(entities)]
    await raw_setup(r, prefix, partitions)
    await raw_preload(r, keys, urls, messages)
    child = await Child.start(
        script, "raw", redis_url, prefix, partitions=partitions, expect=messages
    )
    try:
        await child.expect("ready", STARTUP_TIMEOUT_S)
        tp = await child.expect("throughput", timeout)
        await child.finish()
    finally:
        child.kill()
    tp["msgs_per_s"] = tp["messages"] / tp["seconds"]
    tp["cpu_us_per_msg"] = tp["cpu_s"] / tp["messages"] * 1e6
    return tp


def print_profile(path: str, top_cumulative: int = 40) -> None:
    """Print a worker's cProfile dump to stderr: the top functions by own time and cumulative."""
    import io
    import pstats

    stream = io.StringIO()
    stats = pstats.Stats(path, stream=stream)
    stats.sort_stats("tottime").print_stats(30)
    stats.sort_stats("cumulative").print_stats(top_cumulative)
    print(stream.getvalue(), file=sys.stderr)


def add_redis_argument(parser: Any) -> None:
    parser.add_argument(
        "--redis", default=os.environ.get("WAKEFUL_REDIS_URL") or "redis://127.0.0.1:6379/0"
    )


def add_profiling_arguments(parser: Any, phases: list[str], help_phase: str) -> None:
    """``--profile-worker FILE`` and ``--profile-phase``, shared by the benchmarks."""
    parser.add_argument(
        "--profile-worker", metavar="FILE", help="cProfile the worker, write pstats to FILE"
    )
    parser.add_argument("--profile-phase", choices=phases, default=phases[0], help=help_phase)


def add_gc_freeze_argument(parser: Any) -> None:
    parser.add_argument(
        "--no-gc-freeze",
        dest="gc_freeze",
        action="store_false",
        help=(
            "leave the worker's garbage collector as started (the `wakeful worker` CLI "
            "freezes start-up objects and collects rarely: wakeful.heap)"
        ),
    )
