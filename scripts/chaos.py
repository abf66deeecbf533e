#!/usr/bin/env python
"""The long chaos run: real workers killed and paused, Redis killed and restarted.

    .venv/bin/python scripts/chaos.py                      # seed 1, 3000 messages, 90 s
    .venv/bin/python scripts/chaos.py --seed 1 2 3         # one table row per seed
    .venv/bin/python scripts/chaos.py --messages 300 --seconds 15 --kill-rate 8

Each seed starts its own ``redis-server`` (AOF, ``appendfsync always``, a random
port, a temporary directory) and ``--workers`` ``wakeful worker
tests.apps.chaos:registry`` processes, sends ``--messages`` messages with
idempotency keys spread over ``--seconds`` (the client retries a failed send with
the same key), and meanwhile, at seeded random times in that window, kills a worker
with ``kill -9`` (and starts another), pauses one with SIGSTOP past its lease and
resumes it, and kills Redis with ``kill -9`` and restarts it. Rates are per minute
of the window. The workload (seeded): ``tally`` counters (15% of their messages set
a durable timer), parents that spawn 1-3 children with ``run_finished``, and agent
runs of a ``ScriptedModel`` calling a tool. See ``tests/apps/chaos_run.py`` for what
is checked at the end; ``tests/test_chaos.py`` is the short variant.

The table: the faults injected, what the workload made (children, timers fired,
agent runs), and what went wrong: acknowledged items lost, applied more than once,
entities parked as failed, workers that died without being killed; ``fenced commits``
counts the commits of paused workers that the lease check refused. The last line is
the rows as JSON. Exit status 1 if any seed failed.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

from redis.asyncio import Redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # tests.apps.* (the app the workers load, and the run)

from benchlib import code_version, describe_machine, emit  # noqa: E402

from tests.apps.chaos_run import Config, Result, run_chaos  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("--seed", type=int, nargs="+", default=[1], help="one run per seed")
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--seconds", type=float, default=90.0, help="the send and fault window")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument(
        "--kill-rate", type=float, default=8.0, help="kill -9 of a worker, per minute"
    )
    parser.add_argument(
        "--zombie-rate", type=float, default=4.0, help="SIGSTOP past the lease, per minute"
    )
    parser.add_argument(
        "--redis-rate", type=float, default=3.0, help="kill -9 and restart of Redis, per minute"
    )
    parser.add_argument("--settle-timeout", type=float, default=180.0)
    parser.add_argument(
        "--keep", type=Path, help="keep Redis data and worker logs under this directory"
    )
    return parser.parse_args(argv)


COLUMNS = [
    "seed", "messages", "kills", "zombies", "redis restarts", "children", "timers",
    "agent runs", "lost", "duplicated", "failed entities", "worker deaths", "fenced commits",
    "wall s", "result",
]  # fmt: skip


def table(results: list[Result]) -> str:
    rows = [[str(r.row()[c]) for c in COLUMNS] for r in results]
    widths = [max(len(c), *(len(row[i]) for row in rows)) for i, c in enumerate(COLUMNS)]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    return "\n".join(
        [line(COLUMNS), "|" + "|".join("-" * (w + 2) for w in widths) + "|", *map(line, rows)]
    )


async def main_async(args: argparse.Namespace) -> int:
    described = False

    async def describe(url: str) -> None:
        nonlocal described
        if not described:
            described = True
            r = Redis.from_url(url)
            try:
                await describe_machine(
                    r,
                    busy_warning="  WARNING: the machine is not idle; workers, Redis and the "
                    "client compete with other work, so the wall time is longer",
                )
            finally:
                await r.aclose()
            print(f"code: {code_version()}")

    per_min = args.seconds / 60
    results = []
    for seed in args.seed:
        cfg = Config(
            seed=seed,
            messages=args.messages,
            seconds=args.seconds,
            workers=args.workers,
            kills=round(args.kill_rate * per_min),
            zombies=round(args.zombie_rate * per_min),
            redis_restarts=round(args.redis_rate * per_min),
            settle_timeout=args.settle_timeout,
            keep_dir=args.keep / f"seed-{seed}" if args.keep else None,
        )
        result = await run_chaos(cfg, describe)
        results.append(result)
        print(f"seed {seed}: {'ok' if result.ok else 'FAIL'} in {result.wall_s:.1f} s "
              f"({result.send_retries} send retries)", flush=True)  # fmt: skip
        for problem in result.problems[:30]:
            print(f"  problem: {problem}")
    print()
    print(table(results))
    emit(chaos=[r.row() for r in results])
    return 0 if all(r.ok for r in results) else 1


async def main_stoppable(args: argparse.Namespace) -> int:
    """SIGTERM cancels the run, which stops its workers and its Redis on the way out."""
    task = asyncio.current_task()
    assert task is not None
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        return await main_async(args)
    except asyncio.CancelledError:
        print("stopped by SIGTERM", file=sys.stderr)
        return 143


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(main_stoppable(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
