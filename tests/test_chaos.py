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

from tests.apps.chaos_run import Config, run_chaos

pytestmark = [pytest.mark.anyio, pytest.mark.redis_only]


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
