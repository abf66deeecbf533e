"""Following an entity: stream_until_idle, the merge of log and live output, step tags
on deltas, live_position and lag."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest

from tests.test_agent import adding_app, adding_model
from wakeful import (
    AssistantStep,
    HandlerContext,
    LiveRecord,
    LogRecord,
    Registry,
    RunFinished,
    ScriptedModel,
)
from wakeful.errors import EntityNotFoundError, WaitTimeoutError, WakefulError
from wakeful.following import _merged
from wakeful.models import ModelResponse
from wakeful.streamids import id_gt

pytestmark = pytest.mark.anyio


def entry(entry_id: str) -> tuple[str, dict[bytes, bytes]]:
    return entry_id, {b"e": entry_id.encode()}


def test_merged_orders_by_millisecond_with_live_first_within_one():
    batches = {
        "log": [entry("100-0"), entry("105-0"), entry("105-1"), entry("107-0")],
        "live": [entry("99-0"), entry("105-0"), entry("106-0"), entry("106-1")],
    }
    order = [(key, entry_id) for key, entry_id, _ in _merged(batches, "live", 1000)]
    assert order == [
        ("live", "99-0"),
        ("log", "100-0"),
        ("live", "105-0"),
        ("log", "105-0"),
        ("log", "105-1"),
        ("live", "106-0"),
        ("live", "106-1"),
        ("log", "107-0"),
    ]


def test_merged_leaves_what_is_past_a_cut_batch_for_the_next_read():
    # The log batch is full (count 2): it may go on past 105, so the live entries after
    # that millisecond must wait, or they would come before log entries still unread.
    batches = {"log": [entry("100-0"), entry("105-0")], "live": [entry("101-0"), entry("106-0")]}
    order = [(key, entry_id) for key, entry_id, _ in _merged(batches, "live", 2)]
    assert order == [("log", "100-0"), ("live", "101-0"), ("log", "105-0")]


async def test_stream_until_idle_ends_after_the_run_with_every_event(cluster):
    rt = await cluster.runtime(adding_app(adding_model(), []))
    live_after = await rt.live_position("/bot/s")
    sent = await rt.send("/bot/s", "add things")
    records = [r async for r in rt.stream_until_idle("/bot/s", after=sent, live_after=live_after)]
    durable = [r for r in records if isinstance(r, LogRecord)]
    # Every log entry after the message, in order, up to and including the run's end.
    everything = [r async for r in rt.events("/bot/s", after=sent)]
    assert [r.id for r in durable] == [r.id for r in everything]
    assert isinstance(durable[-1].event, RunFinished)
    # The deltas carry the run and step they belong to, matching the durable steps.
    steps = {
        (r.event.run_id, r.event.step): r.event
        for r in durable
        if isinstance(r.event, AssistantStep)
    }
    texts: dict[tuple[str | None, int | None], str] = {}
    for r in records:
        if isinstance(r, LiveRecord) and r.event.kind == "text":
            key = (r.event.run_id, r.event.step)
            texts[key] = texts.get(key, "") + r.event.data
    assert texts, "no live text was streamed"
    for key, text in texts.items():
        step = steps[key]
        assert text == "".join(b["text"] for b in step.content if b["type"] == "text")


async def test_stream_until_idle_on_an_idle_entity_replays_and_ends(cluster):
    rt = await cluster.runtime(adding_app(adding_model(), []))
    await rt.ask("/bot/i", "add things")
    records = [r async for r in rt.stream_until_idle("/bot/i")]
    assert [r.id for r in records] == [r.id async for r in rt.events("/bot/i")]


async def test_stream_until_idle_errors(cluster):
    reg = Registry()

    @reg.entity("slow")
    async def slow(ctx: HandlerContext) -> None:
        await asyncio.sleep(2)

    @reg.entity("broken")
    async def broken(ctx: HandlerContext) -> None:
        raise RuntimeError("always")

    rt = await cluster.runtime(reg, max_attempts=1)
    with pytest.raises(EntityNotFoundError):
        async for _ in rt.stream_until_idle("/slow/nobody"):
            pass
    sent = await rt.send("/slow/s", "x")
    seen: list[Any] = []
    with pytest.raises(WaitTimeoutError):
        async for record in rt.stream_until_idle("/slow/s", after=sent, timeout=0.3):
            seen.append(record)
    # A failed entity is as far as it goes: the stream ends with the failure.
    await rt.send("/broken/b", "x")
    kinds = [type(r.event).__name__ async for r in rt.stream_until_idle("/broken/b")]
    assert kinds[-1] == "EntityFailed"


@pytest.mark.parametrize(
    ("name", "position"),
    [
        ("after", "99999999999999999999-0"),  # digits, but past 64 bits
        ("after", "1-18446744073709551616"),
        ("after", "abc"),
        ("live_after", "1-x"),
    ],
)
async def test_a_position_that_is_no_event_id_is_refused_naming_it(cluster, name, position):
    """Redis refused such a read with "Invalid stream ID", an error of the server that
    named neither the argument nor the value."""
    rt = await cluster.runtime(adding_app(adding_model(), []))
    await rt.send("/bot/p", "hello")
    with pytest.raises(WakefulError, match=f"{name} '{position}' is not an event id"):
        async for _ in rt.events("/bot/p", live=True, **{name: position}):
            pass
    assert [r.id async for r in rt.events("/bot/p", after="18446744073709551615-0")] == []


async def test_live_position_and_lag(cluster):
    reg = Registry()

    @reg.entity("talker")
    async def talker(ctx: HandlerContext) -> None:
        model = ScriptedModel(
            [ModelResponse(content=[{"type": "text", "text": "hi there"}], stop_reason="end_turn")]
        )
        ctx.use_agent(system_prompt="", model=model, tools=[])
        await ctx.agent.run()

    client = await cluster.runtime(reg, run_worker=False)
    assert await client.live_position("/talker/t") == "0-0"
    await client.send("/talker/t", "one")
    await client.send("/talker/t", "two")
    inputs, age_ms = await client.lag("/talker/t")
    assert inputs == 3 and age_ms >= 0  # created + two messages, none handled yet
    await cluster.runtime(reg)  # a worker
    await client.wait_idle("/talker/t")
    assert await client.lag("/talker/t") == (0, 0)
    position = await client.live_position("/talker/t")
    assert position != "0-0"
    # Following from that position shows only what comes next.
    await client.send("/talker/t", "three")
    records = [r async for r in client.stream_until_idle("/talker/t", live_after=position)]
    live = [r for r in records if isinstance(r, LiveRecord)]
    assert live and all(id_gt(r.id, position) for r in live)


async def test_a_follower_whose_read_swallows_the_cancel_still_stops():
    """redis-py on Python 3.11 can return a reply instead of raising a cancellation: the
    follower must stop at its next read anyway, or whoever cancelled it waits for ever."""
    from wakeful.following import follow_entity

    reading = asyncio.Event()

    class SwallowingStore:
        async def newest_live_id(self, url: str) -> str:
            return "0-0"

        async def trimmed_upto(self, url: str) -> None:
            return None

        async def read_entity(self, *args: object) -> None:
            reading.set()
            # What a swallowed cancellation looks like: the read returns normally.
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(3600)

    async def follow() -> None:
        async for _ in follow_entity(
            SwallowingStore(),  # type: ignore[arg-type]
            "/t/a",
            after=None,
            follow=True,
            live=False,
            live_after=None,
            block_ms=1000,
        ):
            pass

    task = asyncio.create_task(follow())
    await reading.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 5)
