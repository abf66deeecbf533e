"""Handler failures: retries with attempt numbers, parking, resume, dead-lettering."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import msgspec
import pytest

from wakeful import (
    Collection,
    EntityFailed,
    HandlerContext,
    HandlerFailed,
    LogRecord,
    Message,
    Registry,
    Resumed,
    StateChanged,
    WakefulError,
)

pytestmark = pytest.mark.anyio


class Hit(msgspec.Struct):
    key: str
    payload: Any = None


class Count(msgspec.Struct):
    key: str
    n: int


@dataclass
class Behaviour:
    """What the ``flaky`` handler does, per entity url; tests change it as they go."""

    broken: set[str] = field(default_factory=set)  # always raise
    fail_times: dict[str, int] = field(default_factory=dict)  # raise this many more times
    gate: dict[str, asyncio.Event] = field(default_factory=dict)  # wait for it before raising
    calls: list[tuple[str, list[Any]]] = field(default_factory=list)

    def calls_of(self, url: str) -> list[list[Any]]:
        return [payloads for u, payloads in self.calls if u == url]

    def seen_by(self, url: str) -> list[Any]:
        return [p for payloads in self.calls_of(url) for p in payloads]


def flaky_registry(b: Behaviour, done: dict[str, asyncio.Event] | None = None) -> Registry:
    reg = Registry()

    @reg.entity("flaky", state={"hits": Collection(row=Hit), "count": Collection(row=Count)})
    async def flaky(ctx: HandlerContext) -> None:
        url = ctx.entity_url
        payloads = [m.payload for m in ctx.wake.messages]
        b.calls.append((url, payloads))
        # Write first, fail afterwards: the writes of a failed attempt must be discarded.
        for record in ctx.wake.events:
            if isinstance(record.event, Message):
                ctx.db.actions.hits_insert(row=Hit(record.id, record.event.payload))
                if "total" in ctx.db.collections.count:
                    ctx.db.actions.count_update(
                        key="total", updater=lambda c: setattr(c, "n", c.n + 1)
                    )
                else:
                    ctx.db.actions.count_insert(row=Count("total", 1))
        if url in b.gate:
            await asyncio.wait_for(b.gate[url].wait(), 10)
        if url in b.broken:
            raise RuntimeError(f"boom on {payloads}")
        if b.fail_times.get(url, 0) > 0:
            b.fail_times[url] -= 1
            raise ValueError("transient trouble")
        if done is not None and url in done:
            done[url].set()

    return reg


async def records_of(rt, url: str) -> list[LogRecord]:
    return [r async for r in rt.events(url) if isinstance(r, LogRecord)]


def of_kind(records: list[LogRecord], kind: type) -> list[Any]:
    return [r.event for r in records if isinstance(r.event, kind)]


async def test_failing_handler_is_retried_then_parked_and_resumed(cluster) -> None:
    b = Behaviour()
    bad, good = "/flaky/bad", "/flaky/good"
    done = {good: asyncio.Event()}
    # The bad entity only fails once the good one was processed, so the good one is
    # handled while the bad one is still between its attempts.
    b.gate[bad] = done[good]
    b.broken.add(bad)
    rt = await cluster.runtime(flaky_registry(b, done), max_attempts=3)

    x1 = await rt.send(bad, "x1")
    await rt.send(good, "g1")

    status = await rt.wait_idle(bad, timeout=10)
    assert status.status == "failed"
    assert status.attempts == 3
    assert status.error == "RuntimeError: boom on ['x1']"
    assert status.cursor != x1  # the input is not marked handled
    assert b.calls_of(bad) == [["x1"], ["x1"], ["x1"]]

    records = await records_of(rt, bad)
    failures = of_kind(records, HandlerFailed)
    assert [f.attempt for f in failures] == [1, 2, 3]
    first_inputs = [status.created_id, x1]  # the first wake's inputs: created and the message
    for f in failures:
        assert f.error_type == "RuntimeError"
        assert f.error == "boom on ['x1']"
        assert f.inputs == first_inputs
        assert "RuntimeError: boom on ['x1']" in f.traceback
    parked = of_kind(records, EntityFailed)
    assert len(parked) == 1
    assert parked[0].error == "RuntimeError: boom on ['x1']"
    assert parked[0].attempts == 3
    assert parked[0].inputs == first_inputs
    # The failed attempts wrote rows, but none of those writes reached the log.
    assert of_kind(records, StateChanged) == []
    assert await rt.state(bad) == {"hits": [], "count": []}

    # The other entity was served meanwhile.
    good_status = await rt.wait_idle(good, timeout=10)
    assert good_status.status == "idle"
    assert b.seen_by(good) == ["g1"]
    assert (await rt.state(good))["count"] == [{"key": "total", "n": 1}]

    # Messages to a parked entity are kept in the log but not handled.
    x2 = await rt.send(bad, "x2")
    x3 = await rt.send(bad, "x3")
    status = await rt.wait_idle(bad, timeout=10)
    assert status.status == "failed"
    assert status.last_input == x3
    assert len(b.calls_of(bad)) == 3
    messages = of_kind(await records_of(rt, bad), Message)
    assert [m.payload for m in messages] == ["x1", "x2", "x3"]

    # Fix the handler and resume: everything that was kept is handled, once.
    b.broken.clear()
    await rt.resume(bad)
    status = await rt.wait_idle(bad, timeout=10)
    assert status.status == "idle"
    assert status.attempts == 0
    assert status.error is None
    assert status.cursor == x3
    assert b.seen_by(bad)[3:] == ["x1", "x2", "x3"]
    state = await rt.state(bad)
    assert [h["key"] for h in state["hits"]] == [x1, x2, x3]
    assert state["count"] == [{"key": "total", "n": 3}]
    assert of_kind(await records_of(rt, bad), Resumed) == [Resumed(skipped=[])]

    # And it keeps working.
    x4 = await rt.send(bad, "x4")
    assert (await rt.wait_idle(bad, timeout=10)).cursor == x4
    assert (await rt.state(bad))["count"] == [{"key": "total", "n": 4}]


async def test_resume_skip_failed_dead_letters_only_the_failed_inputs(cluster) -> None:
    b = Behaviour(broken={"/flaky/dl"})
    rt = await cluster.runtime(flaky_registry(b), max_attempts=2)
    url = "/flaky/dl"
    poison = await rt.send(url, "poison")
    status = await rt.wait_idle(url, timeout=10)
    assert status.status == "failed"
    first_failure = of_kind(await records_of(rt, url), EntityFailed)[-1]
    assert first_failure.inputs == [status.created_id, poison]

    # Later messages arrive while the entity is parked.
    later = [await rt.send(url, f"later-{i}") for i in range(3)]
    assert (await rt.wait_idle(url, timeout=10)).status == "failed"

    b.broken.clear()
    await rt.resume(url, skip_failed=True)
    status = await rt.wait_idle(url, timeout=10)
    assert status.status == "idle"
    assert status.cursor == later[-1]

    records = await records_of(rt, url)
    resumed = of_kind(records, Resumed)
    assert resumed == [Resumed(skipped=first_failure.inputs)]
    # Only the later messages were handled after the resume; the poison one was not
    # handled again, and it stays in the log.
    state = await rt.state(url)
    assert [h["key"] for h in state["hits"]] == later
    assert state["count"] == [{"key": "total", "n": 3}]
    assert b.seen_by(url) == ["poison", "poison", "later-0", "later-1", "later-2"]
    logged = [r.id for r in records if isinstance(r.event, Message)]
    assert logged == [poison, *later]


async def test_resume_requires_a_failed_entity(cluster) -> None:
    b = Behaviour()
    rt = await cluster.runtime(flaky_registry(b))
    await rt.send("/flaky/fine", "hi")
    await rt.wait_idle("/flaky/fine", timeout=10)
    with pytest.raises(WakefulError, match="is not failed"):
        await rt.resume("/flaky/fine")


async def test_a_handler_that_fails_once_then_succeeds(cluster) -> None:
    b = Behaviour(fail_times={"/flaky/once": 1})
    rt = await cluster.runtime(flaky_registry(b), max_attempts=3)
    url = "/flaky/once"
    m1 = await rt.send(url, "m1")
    status = await rt.wait_idle(url, timeout=10)
    assert status.status == "idle"
    assert status.attempts == 0
    assert status.error is None
    assert status.cursor == m1
    assert b.calls_of(url) == [["m1"], ["m1"]]  # the failed attempt, then the retry

    records = await records_of(rt, url)
    failures = of_kind(records, HandlerFailed)
    assert [(f.attempt, f.error_type, f.error, f.inputs) for f in failures] == [
        (1, "ValueError", "transient trouble", [status.created_id, m1])
    ]
    assert of_kind(records, EntityFailed) == []
    # Exactly the writes of the successful attempt reached the log, once.
    ops = [(op.op, op.collection) for e in of_kind(records, StateChanged) for op in e.ops]
    assert ops == [("insert", "hits"), ("insert", "count")]
    state = await rt.state(url)
    assert [h["key"] for h in state["hits"]] == [m1]
    assert state["count"] == [{"key": "total", "n": 1}]

    # The failure counter was reset: the next failure starts again at attempt 1.
    b.fail_times[url] = 1
    m2 = await rt.send(url, "m2")
    assert (await rt.wait_idle(url, timeout=10)).cursor == m2
    failures = of_kind(await records_of(rt, url), HandlerFailed)
    assert [f.attempt for f in failures] == [1, 1]
    assert (await rt.state(url))["count"] == [{"key": "total", "n": 2}]


def picky_registry(handled: list[Any]) -> Registry:
    """``picky`` fails on the message "bad" and records every other message it handles."""
    reg = Registry()

    @reg.entity("picky")
    async def picky(ctx: HandlerContext) -> None:
        payloads = [m.payload for m in ctx.wake.messages]
        if "bad" in payloads:
            raise RuntimeError("bad input")
        handled.extend(payloads)

    return reg


@pytest.mark.parametrize("snapshot_every", [1000, 1])
async def test_skip_failed_dead_letters_only_the_input_that_fails(cluster, snapshot_every) -> None:
    """A message batched into the failing wake after the bad one is not dead-lettered
    with it: retries take one input at a time, so only "bad" is parked and skipped
    (also when every commit writes a snapshot: one of a wake that left inputs for the
    next must not cover them)."""
    handled: list[Any] = []
    url = "/picky/p"
    client = await cluster.runtime(picky_registry(handled), run_worker=False)
    # Sent before any worker runs: one wake takes them all.
    hello = await client.send(url, "hello")
    bad = await client.send(url, "bad")
    good = await client.send(url, "good")
    rt = await cluster.runtime(
        picky_registry(handled), max_attempts=2, snapshot_every=snapshot_every
    )
    status = await rt.wait_idle(url, timeout=10)
    assert status.status == "failed"
    records = await records_of(rt, url)
    first = of_kind(records, HandlerFailed)[0]
    assert first.inputs == [status.created_id, hello, bad, good]  # they were one wake
    assert of_kind(records, EntityFailed)[-1].inputs == [bad]
    assert handled == ["hello"]

    skipped = await rt.resume(url, skip_failed=True)
    assert skipped == [bad]
    status = await rt.wait_idle(url, timeout=10)
    assert status.status == "idle" and status.cursor == good
    assert handled == ["hello", "good"]  # handled exactly once, "bad" never
    assert of_kind(await records_of(rt, url), Resumed) == [Resumed(skipped=[bad])]
