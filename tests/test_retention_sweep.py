"""The retention sweep: an entity that never wakes again still loses what aged out.

A wake trims its log right after a snapshot, but only what is older than the
retention window; the worker's sweep trims the rest later, with no wake. Judged
by what it trims (an idle entity's old entries), what it keeps (a parked entity,
a pending timer, a pending action: they all work afterwards), crashes inside it
(every entry that left the log reached the exporter first, the state is intact),
and bad members of its set (logged, moved to the dead-letter stream, the loop
goes on).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from typing import Any

import pytest

from tests.apps.harness import until
from tests.faults import arm_crash, lapse_soon
from tests.test_actions import app, get_selected, use
from tests.test_retention import (
    Collecting,
    _handled,
    _has_notes,
    _timers,
    log_ids,
    note_texts,
    notes_registry,
)
from wakeful import HandlerContext, Registration, Runtime
from wakeful.agent import RunResult
from wakeful.entities import notes
from wakeful.streamids import id_gt

pytestmark = pytest.mark.anyio
URL = "/notes/idle"
WINDOW_S = 3.0  # the retention window: a wake's own trim keeps what it just wrote
# A snapshot at every wake, entries kept only for the window, the sweep ticking fast.
SWEEPING = {
    "snapshot_every": 1,
    "retention_s": WINDOW_S,
    "retention_entries": 0,
    "retention_sweep_s": 0.1,
}


async def worker(cluster: Any, archive: Any = None, **overrides: Any) -> Runtime:
    """A worker that sweeps, and whose wakes do not trim after their snapshots (as if each died right after its commit, which filed the entity for the
    sweep): what leaves a log is the sweep's doing, however slow the machine (a wake
    slower than the window would otherwise trim its entries itself)."""
    rt = Runtime(
        overrides.pop("registry", None) or notes_registry(),
        settings=cluster.settings(**{**SWEEPING, **overrides}),
        redis=cluster.redis(),
        archive=archive,
        run_worker=True,
    )
    await rt.start()
    cluster.runtimes.append(rt)
    assert rt.worker is not None

    async def no_trim(ticket: Any) -> int:
        return 0

    rt.worker.retention.after_snapshot = no_trim  # type: ignore[method-assign]
    return rt


async def trimmed(rt: Runtime, url: str) -> bool:
    assert rt.store is not None
    return "trimmed" in await rt.store.meta(url)


async def due(rt: Runtime, url: str) -> float | None:
    """The entity's due time in its partition's sweep set (None: not in it)."""
    assert rt.store is not None
    keys = rt.store.keys
    score = await rt.store.redis.zscore(keys.trimdue(keys.partition(url)), url)
    return None if score is None else float(score)


async def test_the_sweep_trims_an_idle_entity_without_a_wake(cluster):
    rt = await worker(cluster)
    assert rt.worker is not None and rt.store is not None
    await rt.send(URL, "add a")
    assert (await rt.wait_idle(URL)).status == "idle"
    whole = await log_ids(rt, URL)
    activations = rt.worker.stats["activations"]
    await until(lambda: trimmed(rt, URL), 30, "the sweep to trim the idle entity")
    assert rt.worker.stats["activations"] == activations  # no wake did it
    assert rt.worker.stats["swept"] >= 1
    snap_upto = (await rt.store.meta(URL))["snap_upto"].decode()
    kept = await log_ids(rt, URL)
    assert kept == [i for i in whole if id_gt(i, snap_upto)]  # all the snapshot covers went
    assert await due(rt, URL) is None  # nothing more can go without a new snapshot
    assert await note_texts(rt, URL) == ["a"]
    await rt.send(URL, "add b")  # and it goes on from its snapshot
    assert (await rt.wait_idle(URL)).status == "idle"
    assert await note_texts(rt, URL) == ["a", "b"]


async def test_the_sweep_keeps_a_parked_entity_whole(cluster):
    registry = notes_registry()

    @registry.entity("picky")
    async def picky(ctx: HandlerContext) -> None:
        if any(m.payload == "bad" for m in ctx.wake.messages):
            raise RuntimeError("bad input")

    rt = await worker(cluster, registry=registry, max_attempts=1)
    url = "/picky/p"
    await rt.send(url, "ok")
    await rt.wait_idle(url)
    await rt.send(url, "bad")
    assert (await rt.wait_idle(url)).status == "failed"
    whole = await log_ids(rt, url)
    # Filed now (due at once): the sweep looks at it and files it for much later.
    assert rt.store is not None
    keys = rt.store.keys
    await rt.store.redis.zadd(keys.trimdue(keys.partition(url)), {url: 0})
    await until(lambda: _later(rt, url, 50), 30, "the sweep to look at the parked entity")
    assert await log_ids(rt, url) == whole
    assert not await trimmed(rt, url)
    assert await rt.resume(url, skip_failed=True)
    assert (await rt.wait_idle(url)).status == "idle"


async def _later(rt: Runtime, url: str, seconds: float) -> bool:
    score = await due(rt, url)
    return score is not None and score > time.time() * 1000 + seconds * 1000


async def test_a_pending_timer_and_a_pending_action_survive_the_sweep(cluster):
    runs: list[RunResult] = []
    registry = app(
        {"getSelectedText": Registration(get_selected)}, [use("s1", "getSelectedText", {})], runs
    )
    notes.register(registry)

    @registry.entity("alarm")
    async def alarm(ctx: HandlerContext) -> None:
        for m in ctx.wake.messages:
            if m.payload == "arm":
                far = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
                await ctx.send("/notes/rung", "add rang", after=far)

    rt = await worker(cluster, registry=registry)
    page, clock = "/page/p", "/alarm/a"
    await rt.send(page, "summarise my selection", identity={"user": "u1"})
    assert (await rt.wait_idle(page)).status == "suspended"
    await rt.send(clock, "arm")
    await until(lambda: _timers(rt, clock), 20, "the timer to be set")
    await until(lambda: _handled(rt, clock), 20, "the arming to be handled")
    await until(lambda: trimmed(rt, page), 30, "the sweep to trim the suspended run's log")
    await until(lambda: trimmed(rt, clock), 30, "the sweep to trim the alarm's log")
    # The action is still pending and its answer resumes the same run.
    assert [a.tool_call_id for a in await rt.pending_actions(page)] == ["s1"]
    await rt.submit_tool_result(page, "s1", {"text": "hello world"}, identity={"user": "u1"})
    assert (await rt.wait_idle(page)).status == "idle"
    assert runs[-1].status == "completed" and "hello world" in (runs[-1].response or "")
    assert runs[-1].run_id == runs[0].run_id
    # The timer comes due now: it fires once.
    assert rt.store is not None
    keys = rt.store.keys
    p = keys.partition(clock)
    [(member, _)] = await rt.store.redis.zrange(keys.timers(p), 0, -1, withscores=True)
    await rt.store.redis.zadd(keys.timers(p), {member: 0}, xx=True)
    await until(lambda: _has_notes(rt, "/notes/rung"), 20, "the timer's message")
    await rt.wait_idle(clock)
    assert await note_texts(rt, "/notes/rung") == ["rang"]


@pytest.mark.parametrize("point", ["trim:after-export", "trim:before", "trim:after"])
async def test_a_crash_in_the_sweep_loses_nothing(cluster, point):
    exporter = Collecting()
    texts = ["a", "b", "c"]
    first = await worker(cluster, exporter)
    assert first.worker is not None
    for text in texts:
        await first.send(URL, f"add {text}")
        assert (await first.wait_idle(URL)).status == "idle"
    whole = set(await log_ids(first, URL))
    activations = first.worker.stats["activations"]
    crashed = arm_crash(first, point)
    await asyncio.wait_for(crashed.wait(), 30)  # the sweep, not a wake, reached it
    assert first.worker.stats["activations"] == activations
    await lapse_soon(first)
    await first.close()
    cluster.runtimes.remove(first)
    second = await worker(cluster, exporter)
    await until(lambda: _swept(second, URL), 30, "the next owner's sweep to finish the trim")
    remaining = set(await log_ids(second, URL))
    exported = {r["id"] for r in exporter.records}
    assert whole <= exported | remaining  # every entry that left the log was exported
    assert remaining < whole
    assert await note_texts(second, URL) == texts


async def _swept(rt: Runtime, url: str) -> bool:
    return await trimmed(rt, url) and await due(rt, url) is None


class RefusingOne(Collecting):
    """An exporter that refuses the entries of one entity."""

    def __init__(self, url: str) -> None:
        super().__init__()
        self.url = url

    async def __call__(self, url: str, records: list[dict[str, Any]]) -> None:
        if url == self.url:
            raise OSError(f"the archive refuses {url}")
        await super().__call__(url, records)


async def test_bad_members_and_failing_trims_do_not_stop_the_sweep(cluster, caplog):
    refused = "/notes/refused"
    exporter = RefusingOne(refused)
    rt = await worker(cluster, exporter, partitions=1)
    assert rt.store is not None
    keys = rt.store.keys
    await rt.send(refused, "add r")
    await rt.wait_idle(refused)
    # Bad members, due before anything else, in the one partition's sweep set.
    bad = {b"\xff\xfe": "not UTF-8", b"not a url": "not an entity url", b"/no/such": None}
    await rt.store.redis.zadd(keys.trimdue(0), {m: 0 for m in bad})
    await rt.send(URL, "add a")
    await rt.wait_idle(URL)
    await until(lambda: trimmed(rt, URL), 30, "the sweep to trim the good entity")
    await until(lambda: _later(rt, refused, 50), 30, "the refused trim to be postponed")
    assert not await trimmed(rt, refused)  # the exporter refused: nothing went
    members = set(await rt.store.redis.zrange(keys.trimdue(0), 0, -1))
    assert not members & set(bad)  # the bad ones moved, the unknown entity dropped
    moved = {row["item"]: row for row in await rt.store.bad_items()}
    assert set(moved) == {"\\xff\\xfe", "not a url"}  # bytes shown escaped
    assert all(row["kind"] == "sweep" and row["key"] == keys.trimdue(0) for row in moved.values())
    assert "not UTF-8" in moved["\\xff\\xfe"]["reason"]
    assert "not an entity url" in moved["not a url"]["reason"]
    assert any("the archive refuses" in r.getMessage() or r.exc_info for r in caplog.records)
