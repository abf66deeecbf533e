"""Commit points inside a wake (``ctx.flush()``, agent steps): what a retried wake sees.

A flush makes the writes so far durable without moving the cursor. If the wake
then crashes or fails, the next attempt runs the handler again from the top, on
top of those writes, and says so with ``ctx.wake.resumed``: work before a commit
point is redone unless the handler skips it. These tests pin that contract down
at the fault points.
"""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from tests.faults import crash_and_recover
from wakeful import Collection, HandlerContext, Message, Registry

pytestmark = pytest.mark.anyio


class Count(msgspec.Struct):
    key: str
    n: int


def tally_app(*, careful: bool, fail_after_flush: list[int], seen: list[bool]) -> Registry:
    """+1 per message, then a commit point; ``careful`` skips the +1 for a message an
    earlier attempt had already counted (``ctx.wake.attempted``)."""
    reg = Registry()

    @reg.entity("tally", state={"counts": Collection(primary_key="key", row=Count)})
    async def tally(ctx: HandlerContext) -> None:
        seen.append(ctx.wake.resumed)
        for record in (r for r in ctx.wake.events if isinstance(r.event, Message)):
            if careful and ctx.wake.attempted(record):
                continue
            counts = ctx.db.collections.counts
            if "total" in counts:
                ctx.db.actions.counts_update(
                    key="total", updater=lambda r: setattr(r, "n", r.n + 1)
                )
            else:
                ctx.db.actions.counts_insert(row=Count("total", 1))
        await ctx.flush()
        if fail_after_flush and fail_after_flush[0] > 0:
            fail_after_flush[0] -= 1
            raise RuntimeError("after the flush")

    return reg


async def total(rt, url: str) -> int:
    return (await rt.state(url))["counts"][0]["n"]


@pytest.mark.parametrize("careful", [True, False])
async def test_a_crash_after_a_flush_reruns_the_handler_on_top_of_its_writes(cluster, careful):
    seen: list[bool] = []
    app = tally_app(careful=careful, fail_after_flush=[], seen=seen)
    rt = await crash_and_recover(cluster, app, "/tally/t", "one", "flush:after-commit", 1)
    assert seen == [False, True]  # the second attempt knows it is resumed
    # The careful handler applied its +1 once; the naive one redid the work before the flush.
    assert await total(rt, "/tally/t") == (1 if careful else 2)
    # Later wakes are not resumed ones, and count normally.
    await rt.send("/tally/t", "two")
    await rt.wait_idle("/tally/t")
    assert seen[-1] is False
    assert await total(rt, "/tally/t") == (2 if careful else 3)


async def test_a_crash_before_the_flush_commits_redoes_nothing_twice(cluster):
    seen: list[bool] = []
    app = tally_app(careful=False, fail_after_flush=[], seen=seen)
    rt = await crash_and_recover(cluster, app, "/tally/b", "one", "flush:before-commit", 1)
    assert seen == [False, False]  # nothing was committed: a plain retry
    assert await total(rt, "/tally/b") == 1


async def test_a_handler_error_after_a_flush_retries_as_resumed(cluster):
    seen: list[bool] = []
    app = tally_app(careful=True, fail_after_flush=[1], seen=seen)
    rt = await cluster.runtime(app)
    await rt.send("/tally/f", "one")
    status = await rt.wait_idle("/tally/f")
    assert status.status == "idle" and seen == [False, True]
    assert await total(rt, "/tally/f") == 1


async def test_inputs_that_arrive_between_attempts_are_not_taken_for_attempted(cluster):
    """The retry also takes what arrived after the crash: only the attempted inputs are
    marked, so a careful handler skips those and counts the new one."""
    seen: list[bool] = []
    app = tally_app(careful=True, fail_after_flush=[], seen=seen)
    rt = await crash_and_recover(
        cluster,
        app,
        "/tally/m",
        "one",
        "flush:after-commit",
        1,
        before_restart=lambda first: first.send("/tally/m", "two"),
    )
    assert seen == [False, True]
    assert await total(rt, "/tally/m") == 2


async def test_an_input_taken_after_two_failed_attempts_is_still_known_as_attempted(cluster):
    """Attempt 1 flushes "one" and crashes; attempt 2 also takes "two" (it arrived
    meanwhile), counts it, flushes and fails; attempt 3 (a retry takes one input)
    and the wake after it must know that "two" was attempted too: counted once."""
    seen: list[bool] = []
    app = tally_app(careful=True, fail_after_flush=[1], seen=seen)
    rt = await crash_and_recover(
        cluster,
        app,
        "/tally/three",
        "one",
        "flush:after-commit",
        1,
        before_restart=lambda first: first.send("/tally/three", "two"),
    )
    assert len(seen) >= 3 and all(seen[1:])  # every attempt after the first is resumed
    assert await total(rt, "/tally/three") == 2
    # The mark is gone once the cursor passed it: the next wake counts normally.
    await rt.send("/tally/three", "three")
    await rt.wait_idle("/tally/three")
    assert seen[-1] is False
    assert await total(rt, "/tally/three") == 3


def relay_app(mode: str) -> Registry:
    """Forwards each message to ``/sink/s``, then flushes. ``skip``: skips the messages an
    earlier attempt had (the careful pattern); ``redo``: asks, but sends again anyway;
    ``naive``: never asks and sends again."""
    reg = Registry()

    @reg.entity("relay")
    async def relay(ctx: HandlerContext) -> None:
        for record in ctx.wake.events:
            if not isinstance(record.event, Message):
                continue
            attempted = mode != "naive" and ctx.wake.attempted(record)
            if attempted and mode == "skip":
                continue
            await ctx.send("/sink/s", record.event.payload)
        await ctx.flush()

    @reg.entity("sink")
    async def sink(ctx: HandlerContext) -> None:
        pass

    return reg


@pytest.mark.parametrize("mode", ["skip", "redo", "naive"])
async def test_skipping_a_flushed_input_does_not_shift_the_next_effect_key(cluster, mode):
    """Attempt 1 sends "one" and crashes after its flush; the retry also has "two".
    Whether it skips "one" or sends it again, the sink gets each message once: a send
    skipped or redone cannot give "two" the key of "one"."""
    rt = await crash_and_recover(
        cluster,
        relay_app(mode),
        "/relay/r",
        "one",
        "flush:after-commit",
        1,
        before_restart=lambda first: first.send("/relay/r", "two"),
    )
    await rt.wait_idle("/sink/s")
    sink = [r.event async for r in rt.events("/sink/s")]
    assert [e.payload for e in sink if isinstance(e, Message)] == ["one", "two"]


def stepwise_app(started: asyncio.Event, gate: asyncio.Event) -> Registry:
    """+1 per message "one"/"two" with a commit point after each (the careful pattern
    with one flush per input); "hold" waits for ``gate``, so what is sent meanwhile
    reaches the next wake together."""
    reg = Registry()

    @reg.entity("steps", state={"counts": Collection(primary_key="key", row=Count)})
    async def steps(ctx: HandlerContext) -> None:
        for record in ctx.wake.events:
            if not isinstance(record.event, Message) or ctx.wake.attempted(record):
                continue
            if record.event.payload == "hold":
                started.set()
                await gate.wait()
                continue
            if "total" in ctx.db.collections.counts:
                ctx.db.actions.counts_update(
                    key="total", updater=lambda r: setattr(r, "n", r.n + 1)
                )
            else:
                ctx.db.actions.counts_insert(row=Count("total", 1))
            await ctx.flush()

    return reg


async def test_a_flush_per_input_marks_only_the_inputs_handled_before_it(cluster):
    """A wake of "one" and "two" flushes after "one" and crashes before the flush after
    "two" commits: the retry must not take "two" for attempted, or it is never counted."""
    started, gate = asyncio.Event(), asyncio.Event()

    async def trigger(rt) -> None:
        await rt.send("/steps/s", "hold")
        await started.wait()  # the entity is busy: the next two are one wake
        await rt.send("/steps/s", "one")
        await rt.send("/steps/s", "two")
        gate.set()

    rt = await crash_and_recover(
        cluster,
        stepwise_app(started, gate),
        "/steps/s",
        None,
        "flush:before-commit",
        2,
        trigger=trigger,
    )
    assert await total(rt, "/steps/s") == 2
