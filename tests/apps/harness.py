"""Helpers of the crash tests: real worker subprocesses, polling, exactly-once checks."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

from wakeful import EntityFailed, HandlerFailed, Runtime, Settings, StateChanged
from wakeful.keys import Keyspace

ROOT = Path(__file__).resolve().parents[2]
PARTITIONS = 4
LEASE_TTL_MS = 1000


async def until(
    check: Callable[[], Awaitable[Any]], timeout: float, what: str, interval: float = 0.02
) -> Any:
    """Poll ``check`` until it returns something truthy; fail with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        result = await check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for: {what}")
        await asyncio.sleep(interval)


class WorkerProc:
    def __init__(self, popen: subprocess.Popen[bytes], log_path: Path) -> None:
        self.popen = popen
        self.log_path = log_path
        self.id: str | None = None

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        """kill -9: no cleanup runs, leases and pending wake pointers stay behind."""
        self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(timeout=10)

    def terminate(self, timeout: float = 15) -> int:
        """SIGTERM and wait for the graceful exit; returns the exit code."""
        self.popen.send_signal(signal.SIGTERM)
        return self.popen.wait(timeout=timeout)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


class Workers:
    """Starts ``wakeful worker`` subprocesses and kills whatever is left at the end."""

    def __init__(self, redis_url: str, prefix: str, log_dir: Path, app: str) -> None:
        self.redis_url = redis_url
        self.prefix = prefix
        self.log_dir = log_dir
        self.app = app
        self.procs: list[WorkerProc] = []
        self.keys = Keyspace(prefix, PARTITIONS)

    def env(self, **extra: Any) -> dict[str, str]:
        env = dict(os.environ)
        env.pop("WAKEFUL_REDIS_URL", None)
        env.update(
            WAKEFUL_PREFIX=self.prefix,
            WAKEFUL_PARTITIONS=str(PARTITIONS),
            WAKEFUL_LEASE_TTL_MS=str(LEASE_TTL_MS),
            WAKEFUL_BLOCK_MS="100",
            WAKEFUL_RETRY_BASE_MS="20",
            WAKEFUL_RETRY_MAX_MS="200",
            WAKEFUL_SHUTDOWN_GRACE_S="10",
            CRASHY_REDIS_URL=self.redis_url,
            PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])),
            PYTHONUNBUFFERED="1",
        )
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def start(self, **env: Any) -> WorkerProc:
        log_path = self.log_dir / f"worker-{len(self.procs)}.log"
        with open(log_path, "wb") as out:
            popen = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "wakeful.cli",
                    "-v",
                    "worker",
                    self.app,
                    "--redis",
                    self.redis_url,
                ],
                cwd=ROOT,
                env=self.env(**env),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        proc = WorkerProc(popen, log_path)
        self.procs.append(proc)
        return proc

    async def registered(self, redis: Redis, proc: WorkerProc, timeout: float = 15) -> str:
        """Wait until the process heartbeats into the worker set; returns its worker id."""

        async def check() -> str | None:
            if not proc.alive():
                raise AssertionError(f"worker exited with {proc.popen.returncode}:\n{proc.log()}")
            for member in await redis.zrange(self.keys.workers, 0, -1):
                if f"-{proc.pid}-" in member.decode():
                    return member.decode()
            return None

        proc.id = await until(check, timeout, f"worker pid {proc.pid} to register")
        return proc.id

    async def owners(self, redis: Redis) -> list[str | None]:
        """The worker id holding each partition's lease (None when free)."""
        values = await redis.mget([self.keys.lease(p) for p in range(PARTITIONS)])
        return [v.decode().rsplit(":", 1)[0] if v else None for v in values]

    def cleanup(self) -> None:
        for proc in self.procs:
            if proc.alive():
                proc.popen.kill()
                proc.popen.wait(timeout=10)

    def dump_logs(self) -> None:
        for proc in self.procs:
            print(f"----- worker pid {proc.pid} ({proc.log_path.name}) -----")
            print(proc.log()[-20_000:])


def client(redis_url: str, prefix: str, registry: Any) -> Runtime:
    return Runtime(
        registry,
        settings=Settings(redis_url=redis_url, prefix=prefix, partitions=PARTITIONS),
        run_worker=False,
    )


async def entity_report(rt: Runtime, url: str) -> dict[str, Any]:
    """What the log says happened to ``url``: inserts per key, failures, and the state."""
    inserts: Counter[Any] = Counter()
    failures: list[Any] = []
    async for record in rt.events(url):
        event = getattr(record, "event", None)
        if isinstance(event, StateChanged):
            inserts.update(
                op.key for op in event.ops if op.collection == "seen" and op.op == "insert"
            )
        elif isinstance(event, HandlerFailed | EntityFailed):
            failures.append(event)
        elif event is None:
            failures.append(record)
    state = await rt.state(url)
    totals = {row["key"]: row["n"] for row in state.get("counts", [])}
    return {
        "inserts": inserts,
        "failures": failures,
        "seen": {row["id"]: row for row in state.get("seen", [])},
        "total": totals.get("total", 0),
        "status": await rt.status(url),
    }


async def assert_exactly_once(rt: Runtime, sent: dict[str, list[str]]) -> dict[str, Any]:
    """Every sent message id is in state once, applied by exactly one committed insert."""
    reports = {}
    for url, ids in sent.items():
        report = await entity_report(rt, url)
        assert report["status"].status == "idle", (url, report["status"])
        twice = {k: n for k, n in report["inserts"].items() if n != 1}
        assert not twice, f"{url}: messages applied more than once: {twice}"
        assert set(report["seen"]) == set(ids), (
            f"{url}: lost {sorted(set(ids) - set(report['seen']))}, "
            f"unexpected {sorted(set(report['seen']) - set(ids))}"
        )
        assert report["total"] == len(ids), f"{url}: total {report['total']} != {len(ids)} sent"
        reports[url] = report
    return reports


async def wait_all_idle(rt: Runtime, urls: list[str], timeout: float) -> None:
    async def idle() -> bool:
        for url in urls:
            status = await rt.status(url)
            assert status.status != "failed", status
            if status.status != "idle":
                return False
        return True

    await until(idle, timeout, f"all of {urls} to process their input", interval=0.05)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving_embedded(*flags: str, stdout: Any = subprocess.PIPE) -> Iterator[tuple[Any, str]]:
    """``wakeful serve wakeful.entities:registry --port <free> *flags`` on the embedded
    Redis (no WAKEFUL_REDIS_URL), its stderr into ``stdout``: yields the process and
    its base URL once it answers HTTP, and stops it at the end."""
    import httpx

    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "WAKEFUL_REDIS_URL"}
    command = ["wakeful.cli", "serve", "wakeful.entities:registry", "--port", str(port), *flags]
    proc = subprocess.Popen(
        [sys.executable, "-m", *command],
        cwd=ROOT,
        env=env,
        stdout=stdout,
        stderr=subprocess.STDOUT,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"{base}/openapi.json", timeout=1)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "serve did not answer HTTP in 30 s"
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(0.05)  # returns at once if it exited
                assert proc.poll() is None, "serve exited"
        yield proc, base
    finally:
        proc.terminate()
        proc.wait(timeout=10)


class PrivateRedis:
    """A redis-server of our own, with AOF fsynced on every write, that a test may kill."""

    def __init__(self, data_dir: Path, binary: str = "redis-server") -> None:
        self.binary = binary
        self.data_dir = data_dir
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.popen: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self, timeout: float = 10) -> None:
        import redis as sync_redis

        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        self.popen = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
                "--dir",
                str(self.data_dir),
                "--daemonize",
                "no",
                "--logfile",
                str(self.data_dir / f"redis-{self.starts}.log"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout
        probe = sync_redis.Redis(port=self.port, socket_connect_timeout=0.2)
        try:
            while True:
                try:
                    if probe.ping():
                        return
                except sync_redis.RedisError:
                    pass
                if self.popen.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"redis-server did not start on port {self.port}")
                time.sleep(0.02)
        finally:
            probe.close()

    def kill(self) -> None:
        assert self.popen is not None
        self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(timeout=10)

    def stop(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.kill()
