"""Entities that talk: send, spawn, run_finished wakes, observe, timers, lifecycle."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from tests.apps.harness import until
from wakeful import (
    ArgsConflictError,
    Collection,
    HandlerContext,
    Message,
    Registry,
    RunFinished,
    RunStarted,
    UnknownEntityTypeError,
    Wake,
)

pytestmark = pytest.mark.anyio


class Row(msgspec.Struct):
    key: str
    value: str


def team_registry(calls: dict[str, int] | None = None) -> Registry:
    """A lead spawns three workers and answers with their combined replies."""
    reg = Registry()
    calls = calls if calls is not None else {}

    @reg.entity("lead", state={"notes": Collection(row=Row)})
    async def lead(ctx: HandlerContext) -> None:
        calls["lead"] = calls.get("lead", 0) + 1
        for message in ctx.wake.messages:
            ctx.record_run()
            for n in range(3):
                await ctx.spawn(
                    "helper",
                    f"{ctx.entity_id}-h{n}",
                    {"n": n},
                    initial_message=f"{message.payload} part {n}",
                    wake=Wake.run_finished(include_response=True),
                )
        for finished in ctx.wake.runs_finished:
            ctx.db.actions.notes_insert(row=Row(finished.child, finished.response or ""))
        children = ctx.children
        if children and not any(c.pending for c in children) and ctx.current_run:
            ctx.reply(" + ".join(c.response or "" for c in sorted(children, key=lambda c: c.url)))

    @reg.entity("helper")
    async def helper(ctx: HandlerContext) -> None:
        calls["helper"] = calls.get("helper", 0) + 1
        for message in ctx.wake.messages:
            ctx.reply(f"done({message.payload})")

    return reg


async def test_parent_spawns_three_children_and_combines_their_replies(cluster):
    rt = await cluster.runtime(team_registry())
    answer = await rt.ask("/lead/a", "task", timeout=20)
    assert answer == "done(task part 0) + done(task part 1) + done(task part 2)"
    children = await rt.children("/lead/a")
    assert sorted(c.url for c in children) == ["/helper/a-h0", "/helper/a-h1", "/helper/a-h2"]
    assert all(c.status == "completed" and not c.pending for c in children)
    state = await rt.state("/lead/a")
    assert len(state["notes"]) == 3
    child = await rt.status("/helper/a-h1")
    assert child.parent == "/lead/a" and child.args == {"n": 1}
    lead = await rt.status("/lead/a")
    assert lead.status == "idle" and lead.awaited_children == 0


async def test_parent_keeps_taking_messages_while_children_run(cluster):
    reg = Registry()
    release = asyncio.Event()
    seen: list[object] = []

    @reg.entity("parent")
    async def parent(ctx: HandlerContext) -> None:
        for m in ctx.wake.messages:
            seen.append(m.payload)
            if m.payload == "start":
                await ctx.spawn("slow", "s1", wake=Wake.run_finished(), initial_message="go")
        for f in ctx.wake.runs_finished:
            seen.append(("finished", f.response))

    @reg.entity("slow")
    async def slow(ctx: HandlerContext) -> None:
        await release.wait()
        ctx.reply("slow result")

    rt = await cluster.runtime(reg)
    await rt.send("/parent/p", "start")
    for i in range(3):
        await rt.send("/parent/p", f"more {i}")

    # Handled and committed (the handler runs before its commit): the parent waits on the
    # child with every message taken, not blocked by it.
    async def all_taken() -> bool:
        status = await rt.status("/parent/p")
        return status.status == "waiting" and status.cursor == status.last_input

    await until(all_taken, 30, "the parent took every message while its child runs")
    assert seen == ["start", "more 0", "more 1", "more 2"]  # not blocked by the child
    release.set()
    status = await rt.wait_idle("/parent/p", timeout=10)
    assert status.status == "idle"
    assert seen[-1] == ("finished", "slow result")


async def test_spawn_is_get_or_create_and_rejects_other_args(cluster):
    reg = Registry()
    results: list[str] = []

    @reg.entity("maker")
    async def maker(ctx: HandlerContext) -> None:
        for m in ctx.wake.messages:
            try:
                handle = await ctx.spawn("kid", "k", {"x": m.payload["x"]})
                results.append(handle.entity_url)
            except ArgsConflictError as exc:
                results.append(f"conflict: {exc}")

    @reg.entity("kid")
    async def kid(ctx: HandlerContext) -> None:
        pass

    rt = await cluster.runtime(reg)
    await rt.send("/maker/m", {"x": 1})
    await rt.wait_idle("/maker/m")
    await rt.send("/maker/m", {"x": 1})
    await rt.wait_idle("/maker/m")
    await rt.send("/maker/m", {"x": 2})
    await rt.wait_idle("/maker/m")
    assert results[:2] == ["/kid/k", "/kid/k"]
    assert results[2].startswith("conflict: entity /kid/k already exists with different args")
    created = [r async for r in rt.events("/kid/k") if type(r.event).__name__ == "Created"]
    assert len(created) == 1
    assert (await rt.status("/kid/k")).args == {"x": 1}


async def test_send_and_spawn_to_unknown_types_fail_in_the_handler(cluster):
    reg = Registry()
    errors: list[str] = []

    @reg.entity("caller")
    async def caller(ctx: HandlerContext) -> None:
        for call in (
            lambda: ctx.send("/nobody/x", "hi"),
            lambda: ctx.spawn("nobody", "x"),
        ):
            try:
                await call()
            except UnknownEntityTypeError as exc:
                errors.append(str(exc))

    rt = await cluster.runtime(reg)
    await rt.send("/caller/c", "go")
    await rt.wait_idle("/caller/c")
    assert len(errors) == 2 and all("unknown entity type 'nobody'" in e for e in errors)


async def test_a_cycle_of_messages_completes(cluster):
    reg = Registry()

    @reg.entity("ping", state={"seen": Collection(row=Row)})
    async def ping(ctx: HandlerContext) -> None:
        for m in ctx.wake.messages:
            n = m.payload
            ctx.db.actions.seen_insert(row=Row(str(n), m.sender or "client"))
            if n < 10:
                other = "/ping/b" if ctx.entity_id == "a" else "/ping/a"
                await ctx.send(other, n + 1)

    rt = await cluster.runtime(reg)
    await rt.send("/ping/a", 0)
    await _until(lambda: _exists(rt, "/ping/b"))
    for _ in range(12):  # each hop makes the other side pending; settle both
        await rt.wait_idle("/ping/a")
        await rt.wait_idle("/ping/b")
    a_seen = sorted(int(r["key"]) for r in (await rt.state("/ping/a"))["seen"])
    b_seen = sorted(int(r["key"]) for r in (await rt.state("/ping/b"))["seen"])
    assert a_seen == [0, 2, 4, 6, 8, 10] and b_seen == [1, 3, 5, 7, 9]


async def _has_timer(rt, url: str) -> bool:
    return (await rt.status(url)).timers == 1


async def _exists(rt, url: str) -> bool:
    return bool(await rt.store.meta(url))


async def test_fan_out_to_200_children(cluster):
    reg = Registry()

    @reg.entity("boss")
    async def boss(ctx: HandlerContext) -> None:
        for _ in ctx.wake.messages:
            ctx.record_run()
            for n in range(200):
                await ctx.spawn("worker", f"w{n}", initial_message=n, wake=Wake.run_finished())
        kids = ctx.children
        if ctx.current_run and kids and all(not k.pending for k in kids):
            ctx.reply(str(sum(int(k.response or 0) for k in kids)))

    @reg.entity("worker")
    async def worker(ctx: HandlerContext) -> None:
        for m in ctx.wake.messages:
            ctx.reply(str(m.payload * 2))

    rt = await cluster.runtime(reg)
    assert await rt.ask("/boss/b", "go", timeout=60) == str(2 * sum(range(200)))
    assert len(await rt.list("worker")) == 200


async def test_timer_fires_once_after_all_workers_restart(cluster):
    reg = Registry()

    @reg.entity("alarm", state={"rings": Collection(row=Row)})
    async def alarm(ctx: HandlerContext) -> None:
        for m in ctx.wake.messages:
            if m.payload == "set":
                await ctx.send(ctx.entity_url, "ring", after=1.0)
            elif m.payload == "ring":
                ctx.db.actions.rings_insert(row=Row(str(len(ctx.db.collections.rings)), "ring"))

    first = await cluster.runtime(reg)
    await first.send("/alarm/a", "set")
    await _until(lambda: _has_timer(first, "/alarm/a"))
    assert (await first.state("/alarm/a"))["rings"] == []
    await first.close()  # every worker is gone while the timer is pending
    cluster.runtimes.remove(first)
    second = await cluster.runtime(reg)
    assert (await second.status("/alarm/a")).timers == 1
    status = await second.wait_idle("/alarm/a", timeout=10)
    assert status.status == "idle" and status.timers == 0
    await asyncio.sleep(0.3)  # nothing fires a second time
    assert (await second.state("/alarm/a"))["rings"] == [{"key": "0", "value": "ring"}]


async def test_observe_with_debounce_wakes_once_per_burst(cluster):
    reg = Registry()
    woken: list[list[str]] = []
    burst_sent = asyncio.Event()

    @reg.entity("source", state={"items": Collection(row=Row), "other": Collection(row=Row)})
    async def source(ctx: HandlerContext) -> None:
        for m in ctx.wake.messages:
            if m.payload.get("gate"):
                # Held until the whole burst is in the log, so that the burst is one
                # wake's commit: a burst sent by a loaded client may take longer than
                # the debounce, which is then two bursts, rightly.
                await burst_sent.wait()
                continue
            coll = m.payload.get("coll", "items")
            getattr(ctx.db.actions, f"{coll}_insert")(row=Row(m.payload["k"], "v"))

    @reg.entity("watcher")
    async def watcher(ctx: HandlerContext) -> None:
        for m in ctx.wake.messages:
            await ctx.observe(m.payload, wake=Wake.change(collections=["items"], debounce=0.3))
        for change in ctx.wake.changes:
            woken.append(change.collections)

    rt = await cluster.runtime(reg)
    await rt.send("/source/s", {"k": "0"})
    await rt.wait_idle("/source/s")
    await rt.send("/watcher/w", "/source/s")
    await rt.wait_idle("/watcher/w")
    await rt.send("/source/s", {"gate": True})
    for k in range(1, 6):  # a burst
        await rt.send("/source/s", {"k": str(k)})
    await rt.send("/source/s", {"k": "x", "coll": "other"})  # not observed
    burst_sent.set()
    await rt.wait_idle("/source/s", timeout=10)
    await rt.wait_idle("/watcher/w", timeout=10)
    assert woken == [["items"]]
    await rt.send("/source/s", {"k": "later"})  # a second burst
    await rt.wait_idle("/source/s", timeout=10)
    await rt.wait_idle("/watcher/w", timeout=10)
    assert woken == [["items"], ["items"]]


async def test_cancel_finishes_the_run_and_cancels_children_per_policy(cluster):
    reg = Registry()

    @reg.entity("mgr")
    async def mgr(ctx: HandlerContext) -> None:
        for _m in ctx.wake.messages:
            ctx.record_run()
            await ctx.spawn("sub", "c1", initial_message="x", wake=Wake.run_finished())
            await ctx.spawn("sub", "k1", initial_message="x", on_parent_close="keep")

    @reg.entity("sub")
    async def sub(ctx: HandlerContext) -> None:
        if ctx.wake.messages:
            ctx.record_run()  # stays open until cancelled

    rt = await cluster.runtime(reg)
    await rt.send("/mgr/m", "go")
    await _until(lambda: _open(rt, "/sub/c1"))
    await _until(lambda: _open(rt, "/sub/k1"))
    await rt.cancel("/mgr/m")
    status = await rt.wait_idle("/mgr/m", timeout=10)
    assert status.status == "idle"
    runs = [r.event async for r in rt.events("/mgr/m") if isinstance(r.event, RunFinished)]
    assert [r.status for r in runs] == ["cancelled"]
    c1 = [r.event async for r in rt.events("/sub/c1") if isinstance(r.event, RunFinished)]
    assert [r.status for r in c1] == ["cancelled"]
    k1 = [r.event async for r in rt.events("/sub/k1") if isinstance(r.event, RunFinished)]
    assert k1 == []
    kids = {c.url: c for c in await rt.children("/mgr/m")}
    assert kids["/sub/c1"].status == "cancelled"


async def test_delete_removes_keys_and_applies_parent_close_policy(cluster):
    reg = Registry()

    @reg.entity("owner", state={"rows": Collection(row=Row)})
    async def owner(ctx: HandlerContext) -> None:
        for _m in ctx.wake.messages:
            ctx.db.actions.rows_insert(row=Row("a", "b"))
            await ctx.spawn("pet", "cancelled", initial_message="x")
            await ctx.spawn("pet", "kept", initial_message="x", on_parent_close="keep")

    @reg.entity("pet")
    async def pet(ctx: HandlerContext) -> None:
        if ctx.wake.messages:
            ctx.record_run()

    rt = await cluster.runtime(reg)
    await rt.send("/owner/o", "go")
    await rt.wait_idle("/owner/o")
    await rt.wait_idle("/pet/cancelled")
    await rt.wait_idle("/pet/kept")
    await rt.delete("/owner/o")
    assert not await rt.store.meta("/owner/o")
    # The log is emptied (it keeps its last id for a re-create) and expires.
    assert await rt.store.redis.xlen(rt.store.keys.log("/owner/o")) == 0
    assert await rt.store.redis.pttl(rt.store.keys.log("/owner/o")) > 0
    assert await rt.list("owner") == []
    await rt.wait_idle("/pet/cancelled")
    assert [
        r.event.status
        async for r in rt.events("/pet/cancelled")
        if isinstance(r.event, RunFinished)
    ] == ["cancelled"]
    assert [r async for r in rt.events("/pet/kept") if isinstance(r.event, RunFinished)] == []
    # The URL can be used again: a fresh entity with an empty state.
    await rt.send("/owner/o", "go")
    await rt.wait_idle("/owner/o")
    assert (await rt.state("/owner/o"))["rows"] == [{"key": "a", "value": "b"}]


async def test_derived_child_ids_are_stable_within_a_wake(cluster):
    reg = Registry()
    ids: list[str] = []

    @reg.entity("deriver")
    async def deriver(ctx: HandlerContext) -> None:
        ids.append(ctx.derive_id("dispatch"))
        ids.append(ctx.derive_id("dispatch"))
        if len(ids) == 2:
            raise RuntimeError("crash once; the retry must derive the same ids")

    rt = await cluster.runtime(reg)
    await rt.send("/deriver/d", "go")
    await rt.wait_idle("/deriver/d")
    assert ids[0] != ids[1]
    assert ids[:2] == ids[2:4]
    assert ids[0].startswith("dispatch-")


async def _open(rt, url: str) -> bool:
    if not await rt.store.meta(url):
        return False
    return any([isinstance(r.event, RunStarted) async for r in rt.events(url)])


async def _until(check, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await check():
        assert loop.time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def test_spawning_an_existing_child_from_another_parent_subscribes_and_delivers(cluster):
    reg = Registry()

    @reg.entity("lead")
    async def lead(ctx: HandlerContext) -> None:
        for m in ctx.wake.messages:
            ctx.record_run()
            await ctx.spawn("helper", "shared", initial_message=m.payload, wake=Wake.run_finished())
        for finished in ctx.wake.runs_finished:
            ctx.reply(f"{ctx.entity_id} got {finished.response}")

    @reg.entity("helper")
    async def helper(ctx: HandlerContext) -> None:
        for m in ctx.wake.messages:
            ctx.reply(f"answer to {m.payload}")

    rt = await cluster.runtime(reg)
    assert await rt.ask("/lead/a", "a's task", timeout=10) == "a got answer to a's task"
    # The child exists already: b's spawn is a get, and still delivers b's message and
    # subscription, so b is woken too (it does not wait forever).
    assert await rt.ask("/lead/b", "b's task", timeout=10) == "b got answer to b's task"
    messages = [
        r.event.payload async for r in rt.events("/helper/shared") if isinstance(r.event, Message)
    ]
    assert messages == ["a's task", "b's task"]


async def test_many_concurrent_asks_share_one_notice_connection(cluster):
    reg = Registry()

    @reg.entity("echo")
    async def echo(ctx: HandlerContext) -> None:
        for m in ctx.wake.messages:
            ctx.reply(f"echo {m.payload}")

    rt = await cluster.runtime(reg)
    # More waits than the connection pool's default of 100 connections.
    answers = await asyncio.wait_for(
        asyncio.gather(*(rt.ask(f"/echo/e{i}", i, timeout=30) for i in range(150))), 60
    )
    assert answers == [f"echo {i}" for i in range(150)]


async def test_a_handler_lists_and_cancels_its_timers(cluster):
    reg = Registry()
    listed: list[list[tuple[str, object]]] = []
    cancelled: list[bool] = []

    @reg.entity("planner", state={"rings": Collection(row=Row)})
    async def planner(ctx: HandlerContext) -> None:
        for m in ctx.wake.messages:
            if m.payload == "plan":
                await ctx.send(ctx.entity_url, "ring a", after=30)
                await ctx.send("/planner/other", "ring b", after=60)
            elif m.payload == "review":
                schedules = await ctx.schedules()
                listed.append([(s.target, s.payload) for s in schedules])
                cancelled.append(await ctx.cancel_schedule(schedules[0].id))
                cancelled.append(await ctx.cancel_schedule(schedules[0].id))  # already gone

    rt = await cluster.runtime(reg)
    await rt.send("/planner/p", "plan")
    await _until(lambda: _has_timers(rt, "/planner/p", 2))
    await rt.send("/planner/p", "review")
    await _until(lambda: _has_timers(rt, "/planner/p", 1))

    async def reviewed() -> bool:  # the timer count drops before the handler goes on
        return len(cancelled) == 2

    await _until(reviewed)
    assert listed == [[("/planner/p", "ring a"), ("/planner/other", "ring b")]]
    assert cancelled == [True, False]


async def _has_timers(rt, url: str, n: int) -> bool:
    return (await rt.status(url)).timers == n
