"""Crash injection at every commit point of the spawn, send, notify and timer paths.

A worker is killed (no cleanup, leases kept until they expire) at the N-th time
it reaches a named commit point; a fresh worker recovers. Afterwards every child
exists once, every message arrived once, and the parent was woken once per
child run.
"""

from __future__ import annotations

import pytest

from runtime import (
    ChildRunFinished,
    Created,
    HandlerContext,
    Message,
    Registry,
    RunFinished,
    Wake,
)
from tests.faults import crash_and_recover

pytestmark = pytest.mark.anyio


def app() -> Registry:
    reg = Registry()

    @reg.entity("lead")
    async def lead(ctx: HandlerContext) -> None:
        for m in ctx.wake.messages:
            if m.payload == "go":
                ctx.record_run()
                for n in range(3):
                    await ctx.spawn(
                        "helper", f"h{n}", {"n": n}, initial_message=n, wake=Wake.run_finished()
                    )
                await ctx.send("/sink/s", "hello")
                await ctx.send(ctx.entity_url, "tick", after=0.2)
        kids = ctx.children
        if ctx.current_run and kids and not any(k.pending for k in kids):
            ctx.reply(",".join(k.response or "" for k in sorted(kids, key=lambda k: k.url)))

    @reg.entity("helper")
    async def helper(ctx: HandlerContext) -> None:
        for m in ctx.wake.messages:
            ctx.reply(f"r{m.payload}")

    @reg.entity("sink")
    async def sink(ctx: HandlerContext) -> None:
        pass

    return reg


CRASH_POINTS = [
    ("wake:before-commit", 1),  # the parent's first wake, before its commit
    ("wake:before-commit", 2),  # usually a child's wake
    ("wake:before-commit", 5),  # a later wake (a notification or the timer)
    ("wake:after-commit", 1),  # committed, outbox not yet delivered
    ("wake:after-commit", 2),
    ("wake:after-commit", 5),
    ("deliver:after-spawn", 1),  # one child created, the others not yet
    ("deliver:after-spawn", 3),
    ("deliver:after-send", 1),
    ("deliver:after-notify", 1),  # a run_finished wake delivered, not yet marked
    ("deliver:after-notify", 2),
    ("deliver:before-mark", 1),  # every effect delivered, out_done not moved
    ("deliver:before-mark", 3),
    ("timer:before-fire", 1),
    ("timer:after-fire", 1),
]


async def _events(rt, url: str) -> list[object]:
    return [r.event async for r in rt.events(url)]


@pytest.mark.parametrize(("point", "hit"), CRASH_POINTS, ids=[f"{p}#{n}" for p, n in CRASH_POINTS])
async def test_crash_at_commit_point_recovers_exactly_once(cluster, point: str, hit: int):
    second = await crash_and_recover(cluster, app(), "/lead/x", "go", point, hit)

    lead = await _events(second, "/lead/x")
    notices = [e for e in lead if isinstance(e, ChildRunFinished)]
    assert sorted(n.child for n in notices) == ["/helper/h0", "/helper/h1", "/helper/h2"]
    ticks = [e for e in lead if isinstance(e, Message) and e.payload == "tick"]
    assert len(ticks) == 1
    runs = [e for e in lead if isinstance(e, RunFinished)]
    assert [(r.status, r.response) for r in runs] == [("completed", "r0,r1,r2")]

    for n in range(3):
        child = await _events(second, f"/helper/h{n}")
        assert len([e for e in child if isinstance(e, Created)]) == 1
        assert [e.payload for e in child if isinstance(e, Message)] == [n]
        assert len([e for e in child if isinstance(e, RunFinished)]) == 1
    await second.wait_idle("/sink/s", timeout=10)
    sink = await _events(second, "/sink/s")
    assert [e.payload for e in sink if isinstance(e, Message)] == ["hello"]
    assert len(await second.list("helper")) == 3
