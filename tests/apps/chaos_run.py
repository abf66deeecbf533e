"""The chaos run: a seeded workload on real worker processes while faults are injected.

Used by ``tests/test_chaos.py`` (the short variant) and ``scripts/chaos.py`` (the long
one). One run:

1. starts a private ``redis-server`` (AOF, ``appendfsync always``, its own port and
   directory) and ``workers`` ``wakeful worker tests.apps.chaos:registry`` processes;
2. sends ``messages`` messages, spread over ``seconds``, each with an idempotency key;
   a send that fails (Redis is away) is retried with the same key until it is
   acknowledged. The mix (seeded): ``tally`` messages (some set a durable timer, a few are slow),
   ``parent`` messages that spawn 1-3 children with ``run_finished``, and ``agent``
   messages that start runs of a ``ScriptedModel`` calling a tool;
3. meanwhile injects, at seeded random times in the window, ``kill -9`` of a worker
   (a new one is started), SIGSTOP of a worker held past the lease then SIGCONT, and
   ``kill -9`` of Redis restarted after a short outage;
4. waits until every entity is idle, then checks against the reference computed from
   the acknowledged messages: each message applied once, each timer fired once, each
   child exists once and reported once, each note taken once, every agent run
   completed, no entity failed, no worker died on its own, and the state of every
   entity equals the reference.
"""

from __future__ import annotations

import asyncio
import random
import signal
import socket
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from redis.asyncio import Redis

from tests.apps import chaos
from tests.apps.harness import LEASE_TTL_MS, PrivateRedis, WorkerProc, Workers, client
from wakeful import RunFinished, Runtime

APP = "tests.apps.chaos:registry"
TALLIES, PARENTS, AGENTS = 12, 4, 4
SEND_CONCURRENCY = 16
SEND_TIMEOUT_S = 60.0


@dataclass
class Config:
    seed: int = 1
    messages: int = 300
    seconds: float = 15.0  # the window in which messages are sent and faults injected
    workers: int = 3
    kills: int = 2
    zombies: int = 2
    redis_restarts: int = 2
    settle_timeout: float = 90.0
    keep_dir: Path | None = None  # where the Redis data and worker logs go (a temp dir if None)


@dataclass
class Result:
    config: Config
    sent: int = 0
    send_retries: int = 0
    kills: int = 0
    zombies: int = 0
    redis_restarts: int = 0
    children: int = 0
    timers: int = 0
    agent_runs: int = 0
    lost: int = 0
    duplicated: int = 0
    unexpected: int = 0
    failed_entities: int = 0
    state_mismatches: int = 0
    worker_deaths: int = 0
    fenced: int = 0  # commits of zombies the lease check refused (from the worker logs)
    wall_s: float = 0.0
    problems: list[str] = field(default_factory=list)
    worker_logs: str = ""

    @property
    def ok(self) -> bool:
        return not self.problems

    def row(self) -> dict[str, Any]:
        return {
            "seed": self.config.seed,
            "messages": self.sent,
            "kills": self.kills,
            "zombies": self.zombies,
            "redis restarts": self.redis_restarts,
            "children": self.children,
            "timers": self.timers,
            "agent runs": self.agent_runs,
            "lost": self.lost,
            "duplicated": self.duplicated,
            "failed entities": self.failed_entities,
            "worker deaths": self.worker_deaths,
            "fenced commits": self.fenced,
            "wall s": round(self.wall_s, 1),
            "result": "ok" if self.ok else "FAIL",
        }


# -- the workload and its reference ---------------------------------------------


@dataclass
class Workload:
    """The messages to send (url, payload, idempotency key) and the state they must give."""

    messages: list[tuple[str, Any, str]]
    expected: dict[str, dict[str, list[dict[str, Any]]]]  # url -> collection -> rows
    kids: set[str]
    timers: int
    agent_messages: int


def build_workload(cfg: Config, run_id: str) -> Workload:
    rng = random.Random(cfg.seed)
    messages: list[tuple[str, Any, str]] = []
    seen: dict[str, list[dict[str, Any]]] = {}
    fired: dict[str, list[dict[str, Any]]] = {}
    reports: dict[str, list[dict[str, Any]]] = {}
    notes: dict[str, list[dict[str, Any]]] = {}
    kids: set[str] = set()
    timers = agent_messages = 0
    for i in range(cfg.messages):
        key = f"m{i}"
        idem = f"{run_id}-{key}"
        kind = rng.choices(["tally", "parent", "agent"], weights=[70, 15, 15])[0]
        if kind == "tally":
            url = f"/tally/t{rng.randrange(TALLIES)}"
            payload: Any = {"k": key, "v": rng.randrange(1000)}
            if rng.random() < 0.05:
                payload["sleep"] = 0.3
            seen.setdefault(url, []).append({"key": key, "v": payload["v"], "n": 1})
            if rng.random() < 0.15:
                payload["timer"] = {"tag": f"x{i}", "after": round(rng.uniform(0.2, 2.5), 2)}
                fired.setdefault(url, []).append({"tag": f"x{i}", "n": 1})
                timers += 1
        elif kind == "parent":
            pid = f"p{rng.randrange(PARENTS)}"
            url = f"/parent/{pid}"
            payload = {"k": key, "kids": rng.randint(1, 3)}
            for j in range(payload["kids"]):
                child = f"/kid/{pid}.{key}.{j}"
                kids.add(child)
                row = {"child": child, "response": f"done {key}.{j}", "n": 1}
                reports.setdefault(url, []).append(row)
        else:
            url = f"/agent/a{rng.randrange(AGENTS)}"
            a, b = rng.randrange(100), rng.randrange(100)
            payload = f"please note:{key}:{a}:{b}"
            notes.setdefault(url, []).append({"key": key, "result": str(a + b), "n": 1})
            agent_messages += 1
        messages.append((url, payload, idem))

    expected: dict[str, dict[str, list[dict[str, Any]]]] = {}
    for url in {u for u, _, _ in messages}:
        kind = url.split("/")[1]
        if kind == "tally":
            rows = seen.get(url, [])
            total = [{"key": "all", "n": len(rows), "sum": sum(r["v"] for r in rows)}]
            expected[url] = {"seen": rows, "totals": total, "fired": fired.get(url, [])}
        elif kind == "parent":
            expected[url] = {"reports": reports.get(url, [])}
        else:
            expected[url] = {"notes": notes.get(url, [])}
    for child in kids:
        expected[child] = {}
    return Workload(messages, expected, kids, timers, agent_messages)


PRIMARY = {"seen": "key", "totals": "key", "fired": "tag", "reports": "child", "notes": "key"}


def compare(
    url: str, want: dict[str, list[dict[str, Any]]], got: dict[str, list[Any]], res: Result
):
    """Count lost, duplicated and unexpected rows, and any other difference."""

    def normal(state: dict[str, list[Any]]) -> dict[str, list[Any]]:
        return {k: sorted(v, key=lambda r: r[PRIMARY[k]]) for k, v in state.items() if v}

    if normal(got) != normal(want):
        res.state_mismatches += 1
        res.problems.append(f"{url}: state {normal(got)} != reference {normal(want)}"[:1500])
    for name, rows in want.items():
        pk = PRIMARY[name]
        have = {row[pk]: row for row in got.get(name, [])}
        wanted = {row[pk]: row for row in rows}
        lost = sorted(set(wanted) - set(have))
        extra = sorted(set(have) - set(wanted))
        dups = sorted(k for k, row in have.items() if row.get("n", 1) > 1 and name != "totals")
        wrong = sorted(k for k in set(have) & set(wanted) if have[k] != wanted[k])
        res.lost += len(lost) if name != "totals" else 0
        res.duplicated += len(dups)
        res.unexpected += len(extra)
        for what, keys in [("lost", lost), ("duplicated", dups), ("unexpected", extra)]:
            if keys:
                res.problems.append(f"{url} {name}: {what} {keys[:10]}")
        if wrong and set(wrong) - set(dups):
            bad = sorted(set(wrong) - set(dups))[:5]
            res.problems.append(
                f"{url} {name}: differs from the reference at {bad}: "
                f"{[have[k] for k in bad]} != {[wanted[k] for k in bad]}"
            )


# -- the run --------------------------------------------------------------------


def free_port_between(low: int, high: int) -> int:
    """A random port in [low, high) that nothing listens on right now."""
    for _ in range(100):
        port = random.randrange(low, high)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {low}-{high}")


class Chaos:
    def __init__(self, cfg: Config, data_dir: Path) -> None:
        self.cfg = cfg
        self.rng = random.Random(cfg.seed * 7919 + 1)
        self.run_id = f"c{cfg.seed}x{random.randrange(16**6):06x}"
        self.prefix = f"chaos{self.run_id}"
        self.redis = PrivateRedis(data_dir / "redis")
        self.redis.port = free_port_between(20000, 40000)
        self.redis.url = f"redis://127.0.0.1:{self.redis.port}/0"
        self.workers = Workers("", self.prefix, data_dir, APP)
        self.res = Result(cfg)
        self.killed: set[int] = set()

    # workers

    def start_worker(self) -> WorkerProc:
        return self.workers.start()

    async def start_registered(self) -> None:
        """Start a worker and wait until it heartbeats, so the next fault (perhaps a Redis
        kill) does not meet it half started (a worker that cannot reach Redis at start
        exits with 6, as documented)."""
        proc = self.start_worker()
        side = Redis.from_url(self.redis.url)
        try:
            await self.workers.registered(side, proc, timeout=30)
        finally:
            await side.aclose()

    def live_workers(self) -> list[WorkerProc]:
        return [p for p in self.workers.procs if p.alive()]

    def replace_dead(self) -> None:
        """Start a worker for each one that exited although nobody killed it."""
        for proc in list(self.workers.procs):
            if not proc.alive() and proc.pid not in self.killed:
                self.killed.add(proc.pid)
                self.res.worker_deaths += 1
                tail = proc.log()[-3000:]
                self.res.problems.append(
                    f"worker pid {proc.pid} exited with {proc.popen.returncode} on its own:\n{tail}"
                )
                self.start_worker()

    # faults

    async def kill_worker(self) -> None:
        victims = self.live_workers()
        if not victims:
            return
        proc = self.rng.choice(victims)
        self.killed.add(proc.pid)
        proc.kill()
        self.res.kills += 1
        await self.start_registered()

    async def zombie(self) -> None:
        victims = self.live_workers()
        if not victims:
            return
        proc = self.rng.choice(victims)
        proc.popen.send_signal(signal.SIGSTOP)
        self.res.zombies += 1
        try:
            # held past its lease: the others take its partitions over meanwhile
            await asyncio.sleep(LEASE_TTL_MS / 1000 * self.rng.uniform(1.5, 3.0))
        finally:
            proc.popen.send_signal(signal.SIGCONT)

    async def restart_redis(self) -> None:
        self.redis.kill()
        self.res.redis_restarts += 1
        await asyncio.sleep(self.rng.uniform(0.2, 2.0))  # the outage
        await asyncio.to_thread(self.redis.start, 30)

    async def inject(self, t0: float) -> None:
        cfg = self.cfg
        plan = (
            [("kill", self.kill_worker)] * cfg.kills
            + [("zombie", self.zombie)] * cfg.zombies
            + [("redis", self.restart_redis)] * cfg.redis_restarts
        )
        at = sorted(self.rng.uniform(0.1, 0.9) * cfg.seconds for _ in plan)
        self.rng.shuffle(plan)
        for when, (_name, fault) in zip(at, plan, strict=True):
            delay = t0 + when - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)  # a fault at a random time, not a wait for something
            await fault()
            self.replace_dead()

    # messages

    async def send_all(self, rt: Runtime, workload: Workload, t0: float) -> None:
        gate = asyncio.Semaphore(SEND_CONCURRENCY)
        pace = self.cfg.seconds / max(1, len(workload.messages))

        async def send(i: int, url: str, payload: Any, key: str) -> None:
            delay = t0 + i * pace - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)  # spread the sends over the window
            async with gate:
                deadline = time.monotonic() + SEND_TIMEOUT_S
                while True:
                    try:
                        await rt.send(url, payload, idempotency_key=key)
                        self.res.sent += 1
                        return
                    except Exception as exc:  # Redis away: retry with the same key
                        if time.monotonic() > deadline:
                            self.res.problems.append(f"send {key} to {url} never accepted: {exc!r}")
                            return
                        self.res.send_retries += 1
                        await asyncio.sleep(0.05)

        await asyncio.gather(*(send(i, *message) for i, message in enumerate(workload.messages)))

    # the end

    async def settle(self, rt: Runtime, urls: list[str]) -> dict[str, Any]:
        """Wait until every entity is idle (or failed); returns the last statuses."""
        gate = asyncio.Semaphore(32)
        statuses: dict[str, Any] = {}

        async def one(url: str) -> None:
            async with gate:
                try:
                    statuses[url] = await rt.status(url)
                except Exception as exc:  # not created yet, or a connection from before
                    statuses[url] = exc

        deadline = time.monotonic() + self.cfg.settle_timeout
        while True:
            self.replace_dead()
            await asyncio.gather(*(one(u) for u in urls))
            busy = [
                u
                for u, s in statuses.items()
                if isinstance(s, Exception) or s.status not in {"idle", "failed"}
            ]
            if not busy:
                return statuses
            if time.monotonic() > deadline:
                sample = {u: statuses[u] for u in busy[:5]}
                self.res.problems.append(f"{len(busy)} entities never became idle: {sample}")
                return statuses
            await asyncio.sleep(0.2)

    async def check(self, rt: Runtime, workload: Workload) -> None:
        res = self.res
        urls = sorted(workload.expected)
        statuses = await self.settle(rt, urls)
        failed = [
            u for u, s in statuses.items() if not isinstance(s, Exception) and s.status == "failed"
        ]
        res.failed_entities = len(failed)
        for url in failed[:10]:
            res.problems.append(f"{url} failed: {statuses[url].error}")
        for url in urls:
            try:
                state = await rt.state(url)
            except Exception as exc:  # e.g. never created: everything it should hold is lost
                res.problems.append(f"{url}: no state: {exc!r}")
                state = {}
            compare(url, workload.expected[url], state, res)
        listed = await rt.list("kid")
        kids = set(listed)
        res.children = len(listed)
        if len(listed) != len(kids):
            res.problems.append(f"children listed more than once: {sorted(listed)[:20]}")
        if kids != workload.kids:
            res.problems.append(
                f"children: missing {sorted(workload.kids - kids)[:10]}, "
                f"unexpected {sorted(kids - workload.kids)[:10]}"
            )
        for url in sorted(u for u in urls if u.startswith("/parent/")):
            children = Counter(c.url for c in await rt.children(url))
            twice = [c for c, n in children.items() if n > 1]
            if twice:
                res.problems.append(f"{url}: children listed twice: {twice}")
        res.timers = sum(len(workload.expected[u].get("fired", [])) for u in urls)
        for url in sorted(u for u in urls if u.startswith("/agent/")):
            async for record in rt.events(url):
                event = getattr(record, "event", None)
                if isinstance(event, RunFinished):
                    res.agent_runs += 1
                    if event.status != "completed":
                        res.problems.append(
                            f"{url}: run {event.run_id} {event.status}: {event.error}"
                        )
        if res.state_mismatches:
            res.problems.append(f"{res.state_mismatches} entities differ from the reference state")
        if res.sent != len(workload.messages):
            res.problems.append(f"only {res.sent} of {len(workload.messages)} sends acknowledged")

    async def run(self, on_redis: Callable[[str], Awaitable[None]] | None = None) -> Result:
        started = time.monotonic()
        cfg = self.cfg
        self.redis.start()
        if on_redis is not None:
            await on_redis(self.redis.url)
        self.workers.redis_url = self.redis.url
        workload = build_workload(cfg, self.run_id)
        rt = client(self.redis.url, self.prefix, chaos.registry)
        await rt.start()
        side = Redis.from_url(self.redis.url)
        try:
            for _ in range(cfg.workers):
                self.start_worker()
            for proc in list(self.workers.procs):
                await self.workers.registered(side, proc)
            t0 = time.monotonic()
            await asyncio.gather(self.inject(t0), self.send_all(rt, workload, t0))
            await self.check(rt, workload)
        finally:
            for proc in self.workers.procs:
                if proc.alive():
                    proc.popen.send_signal(signal.SIGCONT)
            self.res.wall_s = time.monotonic() - started
            self.res.fenced = sum(p.log().count("refused: lease") for p in self.workers.procs)
            if not self.res.ok:
                self.res.worker_logs = "\n".join(
                    f"----- worker pid {p.pid} -----\n{p.log()[-6000:]}" for p in self.workers.procs
                )
            self.workers.cleanup()
            await rt.close()
            await side.aclose()
            self.redis.stop()
        return self.res


async def run_chaos(
    cfg: Config, on_redis: Callable[[str], Awaitable[None]] | None = None
) -> Result:
    """Run once; ``on_redis`` is called with the private Redis's URL once it is up."""
    if cfg.keep_dir is not None:
        cfg.keep_dir.mkdir(parents=True, exist_ok=True)
        return await Chaos(cfg, cfg.keep_dir).run(on_redis)
    with tempfile.TemporaryDirectory(prefix="wakeful-chaos-") as tmp:
        return await Chaos(cfg, Path(tmp)).run(on_redis)
