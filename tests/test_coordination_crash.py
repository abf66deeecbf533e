"""Crash injection at every commit point of the spawn, send, notify, timer, subscribe and
cancel paths.

A worker is killed (no cleanup, leases kept until they expire) at the N-th time
it reaches a named commit point; a fresh worker recovers. Afterwards every child
exists once, every message arrived once, and the parent was woken once per
child run.
"""

from __future__ import annotations

import msgspec
import pytest

from tests.faults import crash_and_recover
from wakeful import (
    CancelRequested,
    Changed,
    ChildRunFinished,
    Collection,
    Created,
    HandlerContext,
    Message,
    Registry,
    RunFinished,
    Subscribed,
    Wake,
)

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
    ("deliver:read-here", 1),  # a child created and its pointer read here, not scheduled
    ("deliver:read-here", 4),  # a send or a run_finished notice read here
    ("deliver:before-mark", 1),  # every effect delivered (on one Redis, marked too)
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


# -- the subscribe, cancel and expire paths -------------------------------------------------


class Row(msgspec.Struct):
    key: str


def observing_app() -> Registry:
    """``watcher`` observes ``/data/d``; ``data`` stores rows; ``boss`` spawns idle workers."""
    reg = Registry()

    @reg.entity("watcher")
    async def watcher(ctx: HandlerContext) -> None:
        for m in ctx.wake.messages:
            if m.payload == "watch":
                await ctx.observe("/data/d", wake=Wake.change(collections=["rows"]))

    @reg.entity("data", state={"rows": Collection(primary_key="key", row=Row)})
    async def data(ctx: HandlerContext) -> None:
        for m in ctx.wake.messages:
            ctx.db.actions.rows_insert(row=Row(m.payload))

    @reg.entity("boss")
    async def boss(ctx: HandlerContext) -> None:
        for m in ctx.wake.messages:
            if m.payload == "hire":
                ctx.record_run()
                for n in range(2):
                    await ctx.spawn("idler", f"i{n}", initial_message="wait")

    @reg.entity("idler")
    async def idler(ctx: HandlerContext) -> None:
        if ctx.wake.messages:
            ctx.record_run()  # a run that stays open until it is cancelled

    return reg


async def test_crash_after_a_subscription_is_delivered_subscribes_once(cluster):
    async def setup(rt):
        await rt.send("/data/d", "first")
        await rt.wait_idle("/data/d")

    second = await crash_and_recover(
        cluster, observing_app(), "/watcher/w", "watch", "deliver:after-subscribe", 1, setup=setup
    )
    subscribed = [e for e in await _events(second, "/data/d") if isinstance(e, Subscribed)]
    assert [s.subscriber for s in subscribed] == ["/watcher/w"]
    await second.send("/data/d", "second")
    await second.wait_idle("/data/d")
    await second.wait_idle("/watcher/w")
    changes = [e for e in await _events(second, "/watcher/w") if isinstance(e, Changed)]
    assert len(changes) == 1 and changes[0].entity == "/data/d"


async def test_crash_while_cancelling_children_cancels_each_once(cluster):
    async def setup(rt):
        await rt.send("/boss/b", "hire")
        await rt.wait_idle("/boss/b")  # its spawns are delivered
        for n in range(2):
            await rt.wait_idle(f"/idler/i{n}")

    second = await crash_and_recover(
        cluster,
        observing_app(),
        "/boss/b",
        None,
        "deliver:after-cancel",
        1,
        setup=setup,
        trigger=lambda rt: rt.cancel("/boss/b", "enough"),
    )
    for n in range(2):
        await second.wait_idle(f"/idler/i{n}")
        events = await _events(second, f"/idler/i{n}")
        cancels = [e for e in events if isinstance(e, CancelRequested)]
        assert len(cancels) == 1 and cancels[0].by == "/boss/b"
        runs = [e for e in events if isinstance(e, RunFinished)]
        assert [r.status for r in runs] == ["cancelled"]
    boss_runs = [e for e in await _events(second, "/boss/b") if isinstance(e, RunFinished)]
    assert [r.status for r in boss_runs] == ["cancelled"]
