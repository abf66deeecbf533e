"""Commit points inside a wake (``ctx.flush()``, agent steps): what a retried wake sees.

A flush makes the writes so far durable without moving the cursor. If the wake
then crashes or fails, the next attempt runs the handler again from the top, on
top of those writes, and says so with ``ctx.wake.resumed``: work before a commit
point is redone unless the handler skips it. These tests pin that contract down
at the fault points.
"""

from __future__ import annotations

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
