#!/usr/bin/env python
"""The HTTP gateway's cost: the same operations over HTTP and through the client API.

    .venv/bin/python scripts/bench_gateway.py            # full size (about 20 s)
    .venv/bin/python scripts/bench_gateway.py --quick    # smoke run, a few seconds

``wakeful serve wakeful.entities:registry --worker`` runs in a subprocess (uvicorn on a
real port, a worker in the same process; ``--separate-worker`` puts the worker
in a process of its own) on the local Redis; this process is the
HTTP client (httpx) and, for the baseline, a ``Runtime`` client of the same
keyspace. Figures:

- **send**: ``POST /entities/notes/n<k>/messages`` one at a time (latency p50/p99)
  and ``--concurrency`` at a time (throughput), next to ``rt.send`` of the same
  messages from this process (the baseline: what HTTP, JSON and the ASGI stack add).
  The throughput is measured twice: from httpx in this process (which is itself
  the limit, about 1k requests/s) and with ``wrk`` (Debian's package) if installed;
- **first token**: with ``GET .../events?live=1`` open, the time from posting a
  message to the assistant until the first live text delta arrives over SSE, and
  until its ``run_finished``; next to the same through ``rt.stream_until_idle``.

The scripted assistant answers at once, so the figures are the runtime's and the
gateway's, not a model's. Every key lives under one unique prefix, deleted at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from benchlib import delete_prefix, describe_machine, emit, fmt, percentiles, unique_prefix

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from wakeful import Runtime, Settings  # noqa: E402
from wakeful.connection import connect  # noqa: E402
from wakeful.live import LiveRecord  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def sends(http: httpx.AsyncClient, n: int, tag: str) -> list[float]:
    samples = []
    for i in range(n):
        start = time.perf_counter()
        response = await http.post(
            f"/entities/notes/{tag}{i % 50}/messages", json={"payload": f"add item {i}"}
        )
        samples.append(time.perf_counter() - start)
        response.raise_for_status()
    return samples


async def concurrent(n: int, concurrency: int, send: Any) -> float:
    """Messages per second with ``concurrency`` sends in flight."""
    queue = iter(range(n))

    async def lane() -> None:
        for i in queue:
            await send(i)

    start = time.perf_counter()
    await asyncio.gather(*(lane() for _ in range(concurrency)))
    return n / (time.perf_counter() - start)


WRK_SCRIPT = """
counter = 0
request = function()
  counter = counter + 1
  local body = '{"payload": "add item ' .. counter .. '"}'
  return wrk.format("POST", "/entities/notes/w" .. (counter % 200) .. "/messages",
                    {["Content-Type"] = "application/json"}, body)
end
"""


async def wrk_posts(base: str, connections: int, seconds: float) -> float:
    """POST /messages with wrk (a C load generator, Debian's ``wrk``): the gateway's
    own rate, which one Python client cannot reach. NaN without wrk."""
    if shutil.which("wrk") is None:
        print("(wrk is not installed: apt-get install wrk; its row is left empty)")
        return float("nan")
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(WRK_SCRIPT)
    command = [
        "wrk",
        "-t1",
        f"-c{connections}",
        f"-d{max(1, round(seconds))}s",
        "-s",
        script.name,
        base,
    ]
    done = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True)
    os.unlink(script.name)
    match = re.search(r"Requests/sec:\s+([\d.]+)", done.stdout)
    if done.returncode != 0 or match is None or "Non-2xx" in done.stdout:
        raise RuntimeError(f"wrk failed: {done.stdout} {done.stderr}")
    return float(match.group(1))


async def first_token_http(http: httpx.AsyncClient, url_id: str) -> tuple[float, float]:
    path = f"/entities/assistant/{url_id}"
    await http.post(path, json={})
    async with http.stream("GET", f"{path}/events?live=1") as stream:
        lines = stream.aiter_lines()
        start = time.perf_counter()
        await http.post(f"{path}/messages", json={"payload": "hello"})
        first = None
        async for line in lines:
            if line == "event: live" and first is None:
                first = time.perf_counter() - start
            if line == "event: run_finished":
                return first or float("nan"), time.perf_counter() - start
    raise RuntimeError("the event stream ended before the run finished")


async def first_token_client(rt: Runtime, url: str) -> tuple[float, float]:
    live_after = await rt.live_position(url)
    start = time.perf_counter()
    sent = await rt.send(url, "hello")
    first = None
    async for record in rt.stream_until_idle(url, after=sent, live_after=live_after):
        if isinstance(record, LiveRecord) and first is None:
            first = time.perf_counter() - start
    return first or float("nan"), time.perf_counter() - start


async def main_async(args: argparse.Namespace) -> int:
    redis_url = args.redis
    prefix = unique_prefix("wkgw")
    r = connect(redis_url)
    machine = await describe_machine(r)
    port = free_port()
    env = {**os.environ, "WAKEFUL_PREFIX": prefix, "WAKEFUL_PARTITIONS": "8"}
    env.pop("ANTHROPIC_API_KEY", None)
    cli = [sys.executable, "-m", "wakeful.cli"]
    where = ["--redis", redis_url]
    serve = [*cli, "serve", "wakeful.entities:registry", *where, "--port", str(port)]
    processes = [
        subprocess.Popen(
            serve if args.separate_worker else [*serve, "--worker"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
        )
    ]
    if args.separate_worker:
        processes.append(
            subprocess.Popen(
                [*cli, "worker", "wakeful.entities:registry", *where],
                cwd=ROOT,
                env=env,
                stdout=subprocess.DEVNULL,
            )
        )
    base = f"http://127.0.0.1:{port}"
    settings = Settings(redis_url=redis_url, prefix=prefix, partitions=8)
    rt = await Runtime(settings=settings, run_worker=False).start()
    results: dict[str, Any] = {"machine": machine}
    try:
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            for _ in range(300):
                try:
                    await http.get("/openapi.json")
                    break
                except httpx.TransportError:
                    await asyncio.sleep(0.05)
            await sends(http, args.warmup, "warm")  # connections, caches, the worker's leases
            http_lat = percentiles(await sends(http, args.n, "h"))
            client_samples = []
            for i in range(args.n):
                start = time.perf_counter()
                await rt.send(f"/notes/c{i % 50}", f"add item {i}")
                client_samples.append(time.perf_counter() - start)
            client_lat = percentiles(client_samples)

            async def http_send(i: int) -> None:
                response = await http.post(
                    f"/entities/notes/t{i % 200}/messages", json={"payload": f"add {i}"}
                )
                response.raise_for_status()

            async def client_send(i: int) -> None:
                await rt.send(f"/notes/u{i % 200}", f"add {i}")

            http_rate = await concurrent(args.n * 2, args.concurrency, http_send)
            wrk_rate = await wrk_posts(base, args.concurrency, args.wrk_seconds)
            client_rate = await concurrent(args.n * 2, args.concurrency, client_send)

            http_first, http_done, client_first, client_done = [], [], [], []
            for i in range(args.asks):
                first, done = await first_token_http(http, f"h{i}")
                http_first.append(first)
                http_done.append(done)
                first, done = await first_token_client(rt, f"/assistant/c{i}")
                client_first.append(first)
                client_done.append(done)
    finally:
        await rt.close()
        for process in processes:
            process.terminate()
            process.wait(timeout=30)
        await delete_prefix(r, prefix)
        await r.aclose()

    rows = [
        ("send, one at a time: p50 ms", http_lat["p50"], client_lat["p50"]),
        ("send, one at a time: p99 ms", http_lat["p99"], client_lat["p99"]),
        (f"send, {args.concurrency} in flight (httpx): msg/s", http_rate, client_rate),
        (f"send, {args.concurrency} in flight (wrk): msg/s", wrk_rate, client_rate),
        ("post -> first live token: p50 ms", _p50(http_first), _p50(client_first)),
        ("post -> run_finished: p50 ms", _p50(http_done), _p50(client_done)),
    ]
    print(f"{'':40} {'gateway (HTTP)':>16} {'client API':>12}")
    for name, over_http, direct in rows:
        print(f"{name:40} {fmt(over_http, 2):>16} {fmt(direct, 2):>12}")
    results.update(
        send_http=http_lat,
        send_client=client_lat,
        rate_http=round(http_rate),
        rate_wrk=round(wrk_rate) if wrk_rate == wrk_rate else None,
        rate_client=round(client_rate),
        first_token_http_p50_ms=_p50(http_first),
        first_token_client_p50_ms=_p50(client_first),
        run_finished_http_p50_ms=_p50(http_done),
        run_finished_client_p50_ms=_p50(client_done),
    )
    emit(**{k: v for k, v in results.items() if k != "machine"})
    return 0


def _p50(samples: list[float]) -> float:
    return percentiles(samples)["p50"] if samples else float("nan")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--redis", default=os.environ.get("WAKEFUL_REDIS_URL", "redis://127.0.0.1:6379/0")
    )
    parser.add_argument("--n", type=int, default=2000, help="sends per latency series")
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--asks", type=int, default=100, help="first-token measurements")
    parser.add_argument(
        "--separate-worker",
        action="store_true",
        help="run the worker in its own process instead of in the gateway's (serve --worker)",
    )
    parser.add_argument("--wrk-seconds", type=float, default=5.0)
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few seconds")
    args = parser.parse_args(argv)
    if args.quick:
        args.n, args.warmup, args.asks, args.wrk_seconds = 200, 20, 10, 1.0
    return args


if __name__ == "__main__":
    sys.exit(asyncio.run(main_async(parse_args())))
