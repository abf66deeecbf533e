"""The demo's worker processes: real ``wakeful worker`` subprocesses it starts and kills.

Each runs :mod:`wakeful.entities.demo_worker` on the demo's shared embedded
Redis, with the demo's settings passed as ``WAKEFUL_*`` variables. Its output
goes to a log file, shown when it dies unexpectedly; the demo finds a process
through Redis (the worker id holds the pid), not through its output.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from wakeful import Runtime, WakefulError

from .demo_worker import STALL_VAR, WATCH_VAR

APP = "wakeful.entities.demo_worker:registry"
T = TypeVar("T")


async def until(check: Callable[[], Awaitable[T | None]], timeout: float, what: str) -> T:
    """Poll ``check`` until it gives a value; a :class:`WakefulError` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while (found := await check()) is None:
        if time.monotonic() > deadline:
            raise WakefulError(f"the demo gave up after {timeout:.0f} s waiting for {what}")
        await asyncio.sleep(0.05)
    return found


class WorkerProcess:
    """One ``wakeful worker`` subprocess; ``id`` is its worker id once it registered."""

    def __init__(self, name: str, proc: asyncio.subprocess.Process, log: Path) -> None:
        self.name = name
        self.proc = proc
        self.log = log
        self.id = ""

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.returncode is None

    def output(self) -> str:
        """The end of what the process printed (its log lines included)."""
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return text[-4000:]

    async def kill(self) -> None:
        """``kill -9``: nothing runs in the process after it, no lease is handed back."""
        self.proc.send_signal(signal.SIGKILL)
        await self.proc.wait()

    async def stop(self, timeout: float) -> int:
        """SIGTERM: it finishes its wakes and hands its leases back; killed after
        ``timeout`` seconds. Returns its exit code."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), timeout)
            except TimeoutError:
                await self.kill()
        return await self.proc.wait()


class WorkerProcesses:
    """Starts the demo's workers; every one still running is stopped on exit."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.procs: list[WorkerProcess] = []
        self._logs = tempfile.TemporaryDirectory(prefix="wakeful-demo-")

    def _env(self, stall: str | None) -> dict[str, str]:
        s = self.rt.settings
        env = {k: v for k, v in os.environ.items() if not k.startswith("WAKEFUL_")}
        env.update(
            WAKEFUL_REDIS_URL=s.redis_url or "",
            WAKEFUL_PREFIX=s.prefix,
            WAKEFUL_PARTITIONS=str(s.partitions),
            WAKEFUL_LEASE_TTL_MS=str(s.lease_ttl_ms),
            WAKEFUL_SNAPSHOT_EVERY=str(s.snapshot_every),
            WAKEFUL_SHUTDOWN_GRACE_S=str(s.shutdown_grace_s),
            PYTHONUNBUFFERED="1",
        )
        env[WATCH_VAR] = "1"  # its stdin is a pipe from here: it exits when we are gone
        if stall is not None:
            env[STALL_VAR] = stall
        return env

    async def start(self, name: str, *, stall: str | None = None) -> WorkerProcess:
        """Start worker ``name`` and return once it is in the worker set."""
        log = Path(self._logs.name) / f"worker-{name}.log"
        with open(log, "wb") as out:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "wakeful.cli",
                "worker",
                APP,
                env=self._env(stall),
                stdin=asyncio.subprocess.PIPE,
                stdout=out,
                stderr=asyncio.subprocess.STDOUT,
            )
        worker = WorkerProcess(name, proc, log)
        self.procs.append(worker)
        worker.id = await until(lambda: self._registered(worker), 60, f"worker {name} to start")
        return worker

    async def _registered(self, worker: WorkerProcess) -> str | None:
        if not worker.alive():
            raise WakefulError(
                f"worker process {worker.name} (pid {worker.pid}) exited with code "
                f"{worker.proc.returncode}:\n{worker.output()}"
            )
        for info in await self.rt.workers():
            if f"-{worker.pid}-" in info.id:
                return info.id
        return None

    async def __aenter__(self) -> WorkerProcesses:
        return self

    async def __aexit__(self, *exc: object) -> None:
        """A clean exit stops each worker gracefully; after an error they are killed."""
        try:
            for worker in self.procs:
                if exc[0] is None:
                    await worker.stop(self.rt.settings.shutdown_grace_s + 5)
                elif worker.alive():
                    await worker.kill()
        finally:
            for worker in self.procs:  # interrupted above: leave no process behind
                if worker.alive():
                    worker.proc.kill()
            self._logs.cleanup()
