"""The short chaos run: real workers killed and paused, Redis killed and restarted.

A few hundred messages with idempotency keys, children, durable timers and agent
runs, while two workers are killed with ``kill -9``, two are paused past their
lease and resumed, and the private Redis (AOF, ``appendfsync always``) is killed
and restarted twice. At the end the state of every entity must equal the reference
computed from the acknowledged messages (``tests/apps/chaos_run.py``). The long
run is ``scripts/chaos.py``.
"""

from __future__ import annotations

import shutil

import pytest

from tests.apps.chaos_run import Config, Result, build_workload, compare, run_chaos


@pytest.mark.anyio
@pytest.mark.redis_only
@pytest.mark.timeout(150)
async def test_short_chaos_run_applies_everything_exactly_once(tmp_path):
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed")
    cfg = Config(seed=12, messages=300, seconds=15, kills=2, zombies=2, redis_restarts=2)
    cfg.keep_dir = tmp_path
    result = await run_chaos(cfg)
    print(result.row())
    if not result.ok:
        print(result.worker_logs)
    assert result.ok, "\n".join(result.problems)
    assert (result.kills, result.zombies, result.redis_restarts) == (2, 2, 2)
    assert result.children > 0 and result.timers > 0 and result.agent_runs > 0


def test_the_reference_check_counts_lost_duplicated_and_wrong_rows():
    """The check itself: a reference of the workload, and a state that misses one
    message, applied another twice, and holds a wrong total."""
    workload = build_workload(Config(seed=3, messages=50), "r")
    tallies = [u for u in sorted(workload.expected) if u.startswith("/tally/")]
    url = max(tallies, key=lambda u: len(workload.expected[u]["seen"]))
    want = workload.expected[url]
    assert len(want["seen"]) >= 2
    got = {name: [dict(row) for row in rows] for name, rows in want.items()}
    lost = got["seen"].pop()
    got["seen"][0]["n"] = 2
    got["totals"][0]["sum"] += 1
    result = Result(Config())
    compare(url, want, got, result)
    assert (result.lost, result.duplicated, result.state_mismatches) == (1, 1, 1)
    assert any(lost["key"] in p and "lost" in p for p in result.problems), result.problems
    assert any("totals: differs" in p for p in result.problems), result.problems

    clean = Result(Config())
    compare(url, want, want, clean)
    assert clean.ok and (clean.lost, clean.duplicated) == (0, 0)
