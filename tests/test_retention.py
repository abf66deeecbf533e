"""Log retention: a snapshot lets the log before it go, and nothing a guarantee needs goes.

The TRIM script is judged by the exact entries it leaves (what the snapshot, the
cursor, an undelivered outbox, the retention window and a parked entity keep); the
worker's trims by what survives them (state, a parked entity, an open run with a
pending action, a pending timer, crashes at the trim) and by what readers of a
trimmed range get: a marker, never a silent jump (client API, SSE, CLI).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import sys
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from tests.apps.harness import until
from tests.faults import arm_crash, lapse_soon
from tests.script_helpers import create, lease, log
from tests.test_actions import app, get_selected, use
from wakeful import (
    HandlerContext,
    JsonlExporter,
    LogRecord,
    Registration,
    Registry,
    Runtime,
    Settings,
    TrimmedRecord,
)
from wakeful.agent import RunResult
from wakeful.entities import notes
from wakeful.gateway import create_app
from wakeful.retention import entry_record
from wakeful.streamids import id_gt

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[1]
URL = "/notes/n1"
# Trim everything a snapshot covers, at every wake.
TRIM_ALL = {"snapshot_every": 1, "retention_s": 0, "retention_entries": 0}


def notes_registry() -> Registry:
    registry = Registry()
    notes.register(registry)
    return registry


async def note_texts(rt: Runtime, url: str = URL) -> list[str]:
    return [n["text"] for n in (await rt.state(url))["notes"]]


async def log_ids(rt: Runtime, url: str = URL) -> list[str]:
    assert rt.store is not None
    return [i for i, _ in await rt.store.read_log(url, count=100_000)]


async def add_notes(rt: Runtime, texts: list[str], url: str = URL) -> None:
    """One wake per note, so every note is a snapshot (and a trim)."""
    for text in texts:
        await rt.send(url, f"add {text}")
        assert (await rt.wait_idle(url, timeout=20)).status == "idle"


# -- the TRIM script ---------------------------------------------------------------------


async def script_entity(store: Any, n: int = 6) -> tuple[list[str], str]:
    """An entity of ``n`` entries (the created event and n-1 inputs) and a held lease."""
    created, inputs = await create(store, URL, *(f"m{i}".encode() for i in range(n - 1)))
    _, token = await lease(store, URL)
    return [created, *inputs], token


async def trim(store: Any, token: str, **kwargs: Any) -> Any:
    return await store.trim_log(
        URL, token, retention_ms=kwargs.pop("retention_ms", 0), keep=kwargs.pop("keep", 0), **kwargs
    )


async def test_without_a_snapshot_nothing_is_trimmed(store):
    ids, token = await script_entity(store)
    await store.redis.hset(store.keys.meta(URL), "cursor", ids[-1])
    assert (await trim(store, token)).count == 0
    assert [i for i, _ in await log(store, URL)] == ids


async def test_the_snapshot_and_the_cursor_bound_the_trim(store):
    ids, token = await script_entity(store)
    meta = store.keys.meta(URL)
    await store.redis.hset(meta, mapping={"snap_upto": ids[3], "cursor": ids[2]})
    done = await trim(store, token)
    assert (done.count, done.last) == (3, ids[2])  # up to the cursor, the earlier bound
    assert [i for i, _ in await log(store, URL)] == ids[3:]
    assert (await store.meta(URL))["trimmed"] == ids[2].encode()
    await store.redis.hset(meta, "cursor", ids[5])
    done = await trim(store, token)
    assert (done.count, done.last) == (1, ids[3])  # now up to the snapshot's position
    assert [i for i, _ in await log(store, URL)] == ids[4:]


async def test_an_undelivered_outbox_is_kept(store):
    ids, token = await script_entity(store)
    fields = {"snap_upto": ids[5], "cursor": ids[5], "out_done": ids[1], "out_last": ids[4]}
    await store.redis.hset(store.keys.meta(URL), mapping=fields)
    assert (await trim(store, token)).count == 2  # the outboxes after out_done stay
    assert [i for i, _ in await log(store, URL)] == ids[2:]


async def test_a_parked_entity_keeps_its_whole_log(store):
    ids, token = await script_entity(store)
    fields = {"snap_upto": ids[5], "cursor": ids[5], "status": "failed"}
    await store.redis.hset(store.keys.meta(URL), mapping=fields)
    assert (await trim(store, token)).count == 0
    assert [i for i, _ in await log(store, URL)] == ids


async def test_the_retention_window_keeps_recent_and_newest_entries(store):
    ids, token = await script_entity(store)
    await store.redis.hset(store.keys.meta(URL), mapping={"snap_upto": ids[5], "cursor": ids[5]})
    assert (await trim(store, token, retention_ms=3_600_000)).count == 0  # all younger
    assert (await trim(store, token, keep=10)).count == 0  # fewer than 10 entries
    assert (await trim(store, token, keep=2)).count == 4  # the newest 2 stay
    assert [i for i, _ in await log(store, URL)] == ids[4:]


async def test_a_dry_trim_says_what_would_go_and_a_cap_keeps_the_rest(store):
    ids, token = await script_entity(store)
    await store.redis.hset(store.keys.meta(URL), mapping={"snap_upto": ids[3], "cursor": ids[5]})
    plan = await trim(store, token, dry=True)
    assert (plan.count, plan.last) == (0, ids[3])
    assert [i for i, _ in await log(store, URL)] == ids  # nothing went
    await store.redis.hset(store.keys.meta(URL), "snap_upto", ids[5])  # a later snapshot
    done = await trim(store, token, cap=plan.before)
    assert (done.count, done.last) == (4, ids[3])  # only what the plan (the exporter) had


async def test_a_trim_by_a_lost_lease_is_refused(store):
    ids, token = await script_entity(store)
    await store.redis.hset(store.keys.meta(URL), mapping={"snap_upto": ids[5], "cursor": ids[5]})
    with pytest.raises(Exception, match="lease"):
        await trim(store, token + "x")
    assert [i for i, _ in await log(store, URL)] == ids


# -- the worker's trims ------------------------------------------------------------------


async def test_snapshots_trim_the_log_and_the_state_survives(cluster):
    rt = await cluster.runtime(notes_registry(), **TRIM_ALL)
    texts = [f"t{i}" for i in range(12)]
    await add_notes(rt, texts)
    assert await note_texts(rt) == texts
    ids = await log_ids(rt)
    assert len(ids) < 12  # 12 wakes wrote about 40 entries; the snapshot covers most
    trimmed = (await rt.store.meta(URL))["trimmed"].decode()
    assert id_gt(ids[0], trimmed)
    # A fresh worker (cold cache) folds the snapshot and the rest, and goes on.
    await rt.close()
    cluster.runtimes.remove(rt)
    rt2 = await cluster.runtime(notes_registry(), **TRIM_ALL)
    await add_notes(rt2, ["last"])
    assert await note_texts(rt2) == [*texts, "last"]


async def test_the_default_retention_keeps_the_log(cluster):
    rt = await cluster.runtime(notes_registry(), snapshot_every=1)  # a day, newest 100
    await add_notes(rt, ["a", "b", "c"])
    ids = await log_ids(rt)
    assert len(ids) >= 6 and "trimmed" not in await rt.store.meta(URL)


async def test_a_parked_entity_survives_trims(cluster):
    registry = notes_registry()

    @registry.entity("picky")
    async def picky(ctx: HandlerContext) -> None:
        if any(m.payload == "bad" for m in ctx.wake.messages):
            raise RuntimeError("bad input")

    rt = await cluster.runtime(registry, max_attempts=1, **TRIM_ALL)
    url = "/picky/p"
    for payload in ("ok1", "ok2"):
        await rt.send(url, payload)
        await rt.wait_idle(url)
    await rt.send(url, "bad")
    assert (await rt.wait_idle(url)).status == "failed"
    before = await log_ids(rt, url)
    await rt.send(url, "more")  # a wake of the parked entity: nothing runs, nothing goes
    await until(lambda: _acked(rt, url), 10, "the parked entity's wake")
    assert (await log_ids(rt, url))[: len(before)] == before
    assert await rt.resume(url, skip_failed=True)
    assert (await rt.wait_idle(url)).status == "idle"


async def _acked(rt: Runtime, url: str) -> bool:
    return "woke" not in await rt.store.meta(url)


async def test_an_open_run_with_a_pending_action_survives_trims(cluster):
    runs: list[RunResult] = []
    base = app(
        {"getSelectedText": Registration(get_selected)}, [use("s1", "getSelectedText", {})], runs
    )
    page = base.get("page").handler
    registry = Registry()

    @registry.entity("page")
    async def busy_page(ctx: HandlerContext) -> None:
        if ctx.wake.messages and all(m.payload == "noise" for m in ctx.wake.messages):
            return  # other work while the run waits for its action
        await page(ctx)

    rt = await cluster.runtime(registry, **TRIM_ALL)
    url = "/page/p"
    await rt.send(url, "summarise my selection", identity={"user": "u1"})
    assert (await rt.wait_idle(url)).status == "suspended"
    for _ in range(3):  # wakes after the run's journal: their snapshots cover it
        await rt.send(url, "noise")
        assert (await rt.wait_idle(url)).status == "suspended"
    kinds = [type(r.event).__name__ async for r in rt.events(url) if isinstance(r, LogRecord)]
    assert "ActionRequested" not in kinds and "UserTurn" not in kinds  # trimmed
    assert [a.tool_call_id for a in await rt.pending_actions(url)] == ["s1"]
    assert (await rt.status(url, runs=True)).run is not None  # the run is still open
    await rt.submit_tool_result(url, "s1", {"text": "hello world"}, identity={"user": "u1"})
    assert (await rt.wait_idle(url)).status == "idle"
    assert runs[-1].status == "completed" and "hello world" in (runs[-1].response or "")
    assert runs[-1].run_id == runs[0].run_id
    conversation = await rt.conversation(url)
    assert "summarise my selection" in json.dumps(conversation[0])


async def test_a_pending_timer_survives_trims(cluster):
    registry = notes_registry()

    @registry.entity("alarm")
    async def alarm(ctx: HandlerContext) -> None:
        for m in ctx.wake.messages:
            if m.payload == "arm":
                far = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
                await ctx.send("/notes/rung", "add rang", after=far)

    rt = await cluster.runtime(registry, **TRIM_ALL)
    url = "/alarm/a"
    await rt.send(url, "arm")
    await until(lambda: _timers(rt, url), 10, "the timer to be set")
    for _ in range(3):
        await rt.send(url, "noise")
        await until(lambda: _handled(rt, url), 10, "the noise to be handled")
    assert "trimmed" in await rt.store.meta(url)
    # The timer comes due now: it fires, and its message is delivered once.
    keys = rt.store.keys
    p = keys.partition(url)
    [(member, _)] = await rt.store.redis.zrange(keys.timers(p), 0, -1, withscores=True)
    await rt.store.redis.zadd(keys.timers(p), {member: 0}, xx=True)
    await until(lambda: _has_notes(rt, "/notes/rung"), 20, "the timer's message")
    await rt.wait_idle(url)
    assert await note_texts(rt, "/notes/rung") == ["rang"]


async def _timers(rt: Runtime, url: str) -> bool:
    return (await rt.store.meta(url)).get("timers") == b"1"


async def _handled(rt: Runtime, url: str) -> bool:
    meta = await rt.store.meta(url)
    return meta.get("cursor") == meta.get("last_in") and "woke" not in meta


async def _has_notes(rt: Runtime, url: str) -> bool:
    return await rt.store.entity_meta(url) is not None and bool(await note_texts(rt, url))


class Collecting:
    """An exporter that keeps what it gets (and may refuse)."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.refuse = False

    async def __call__(self, url: str, records: list[dict[str, Any]]) -> None:
        if self.refuse:
            raise OSError("the archive is down")
        self.records.extend(records)


@pytest.mark.parametrize("point", ["trim:after-export", "trim:before", "trim:after"])
async def test_a_crash_at_the_trim_loses_nothing(cluster, point):
    exporter = Collecting()
    registry = notes_registry()
    texts = [f"t{i}" for i in range(8)]

    async def runtime() -> Runtime:
        rt = Runtime(
            registry,
            settings=cluster.settings(**TRIM_ALL),
            redis=cluster.redis(),
            archive=exporter,
            run_worker=True,
        )
        await rt.start()
        cluster.runtimes.append(rt)
        return rt

    first = await runtime()
    await add_notes(first, texts[:3])
    # The log first: an entry trimmed meanwhile was exported before it went.
    seen_before = set(await log_ids(first))
    seen_before |= {r["id"] for r in exporter.records}
    crashed = arm_crash(first, point)
    await first.send(URL, f"add {texts[3]}")
    await asyncio.wait_for(crashed.wait(), 15)
    await lapse_soon(first)
    await first.close()
    cluster.runtimes.remove(first)
    second = await runtime()
    assert (await second.wait_idle(URL, timeout=20)).status == "idle"
    await add_notes(second, texts[4:])
    assert await note_texts(second) == texts  # each once, in order
    # Every entry that left the log reached the exporter first.
    remaining = set(await log_ids(second))
    exported = {r["id"] for r in exporter.records}
    assert seen_before <= exported | remaining
    assert exported and all(r["url"] == URL for r in exporter.records)


async def test_a_failing_exporter_keeps_the_log(cluster):
    exporter = Collecting()
    exporter.refuse = True
    rt = Runtime(
        notes_registry(),
        settings=cluster.settings(**TRIM_ALL),
        redis=cluster.redis(),
        archive=exporter,
        run_worker=True,
    )
    await rt.start()
    cluster.runtimes.append(rt)
    await add_notes(rt, ["a", "b", "c"])
    assert "trimmed" not in await rt.store.meta(URL)
    whole = await log_ids(rt)
    exporter.refuse = False
    await add_notes(rt, ["d"])
    await until(lambda: _exported(exporter), 10, "the trim after the exporter is back")
    remaining = set(await log_ids(rt))
    assert {r["id"] for r in exporter.records} >= set(whole) - remaining
    assert [r["kind"] for r in exporter.records][:2] == ["created", "msg"]


async def _exported(exporter: Collecting) -> bool:
    return bool(exporter.records)


async def test_the_jsonl_exporter_appends_one_file_per_entity(cluster, tmp_path):
    rt = await cluster.runtime(notes_registry(), archive_dir=str(tmp_path), **TRIM_ALL)
    await add_notes(rt, ["a", "b", "c"])
    await rt.close()  # its last trim is done
    cluster.runtimes.remove(rt)
    meta = await cluster.redis().hgetall(rt.store.keys.meta(URL))
    path = JsonlExporter(tmp_path).path(URL)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines[0]["kind"] == "created" and lines[0]["url"] == URL
    assert lines[1]["event"]["payload"] == "add a"
    assert meta[b"trimmed"].decode() in {line["id"] for line in lines}


# -- readers of a trimmed range ----------------------------------------------------------


async def trimmed_notes(cluster: Any) -> tuple[Runtime, str, list[str]]:
    """A trimmed log, and a client (no worker: no trim moves under the readers)."""
    worker = await cluster.runtime(notes_registry(), **TRIM_ALL)
    first = await worker.send(URL, "add a")
    await worker.wait_idle(URL)
    await add_notes(worker, ["b", "c", "d"])
    await worker.close()  # a graceful stop: its last trim is done
    cluster.runtimes.remove(worker)
    rt = await cluster.runtime(notes_registry(), run_worker=False)
    trimmed = (await rt.store.meta(URL))["trimmed"].decode()
    assert not id_gt(first, trimmed)  # the first message is gone
    return rt, trimmed, [first]


async def test_readers_before_a_trimmed_range_get_a_marker(cluster):
    rt, trimmed, (first,) = await trimmed_notes(cluster)
    kept = await log_ids(rt)
    for after in (None, "0-0", first):
        records = [r async for r in rt.events(URL, after=after)]
        assert records[0] == TrimmedRecord(trimmed, after or "0-0")
        assert [r.id for r in records[1:]] == kept
    records = [r async for r in rt.events(URL, after=trimmed)]  # at the trim: no marker
    assert [r.id for r in records] == kept
    # A follower too, and stream_until_idle.
    followed = rt.events(URL, after=first, follow=True)
    assert isinstance(await anext(followed), TrimmedRecord)
    await followed.aclose()
    streamed = [r async for r in rt.stream_until_idle(URL, after=first, timeout=10)]
    assert isinstance(streamed[0], TrimmedRecord)


async def test_sse_before_a_trimmed_range_gets_a_trimmed_event(cluster):
    rt, trimmed, (first,) = await trimmed_notes(cluster)
    http = httpx.AsyncClient(transport=httpx.ASGITransport(create_app(rt)), base_url="http://gw")
    async with http:
        for headers in ({}, {"Last-Event-ID": f"{first}|"}):
            reply = await http.get(f"/entities{URL}/events?follow=0", headers=headers)
            blocks = reply.text.strip().split("\n\n")
            fields = dict(line.split(": ", 1) for line in blocks[0].splitlines())
            assert fields["event"] == "trimmed"
            assert fields["id"].startswith(f"{trimmed}|")
            assert json.loads(fields["data"])["event"]["upto"] == trimmed


def _cli(server_url: str, prefix: str, *args: str) -> Any:
    import os
    import subprocess

    env = {**os.environ, "WAKEFUL_PREFIX": prefix, "WAKEFUL_PARTITIONS": "4"}
    return subprocess.run(
        [sys.executable, "-m", "wakeful.cli", *args, "--redis", server_url],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


async def test_tail_and_export_of_a_trimmed_log(server_url, prefix, tmp_path):
    settings = Settings(redis_url=server_url, prefix=prefix, partitions=4, **TRIM_ALL)
    rt = Runtime(notes_registry(), settings=settings, run_worker=True)
    await rt.start()
    try:
        first = await rt.send(URL, "add a")
        await rt.wait_idle(URL)
        await add_notes(rt, ["b", "c"])
    finally:
        await rt.close()  # a graceful stop: its last trim is done
    reader = Runtime(notes_registry(), settings=settings, run_worker=False)
    await reader.start()
    try:
        trimmed = (await reader.store.meta(URL))["trimmed"].decode()
        kept = await log_ids(reader)
    finally:
        await reader.close()
    tail = await asyncio.to_thread(_cli, server_url, prefix, "tail", URL, "--after", first)
    assert tail.returncode == 0, tail.stderr
    lines = tail.stdout.splitlines()
    assert "TRIMMED" in lines[0] and f"history up to {trimmed} was trimmed" in lines[0]
    as_json = await asyncio.to_thread(_cli, server_url, prefix, "tail", URL, "--json")
    first_record = json.loads(as_json.stdout.splitlines()[0])
    assert first_record["id"] == trimmed and "trimmed" in first_record["trimmed"]
    # export: the entity's current log as JSON Lines, to stdout or a file.
    exported = await asyncio.to_thread(_cli, server_url, prefix, "export", URL)
    assert exported.returncode == 0, exported.stderr
    records = [json.loads(line) for line in exported.stdout.splitlines()]
    assert records[0] == {"url": URL, "id": trimmed, "kind": "trimmed", "after": "0-0"}
    assert [r["id"] for r in records[1:]] == kept
    assert records[-1]["kind"] == "state"
    out = tmp_path / "n1.jsonl"
    to_file = await asyncio.to_thread(_cli, server_url, prefix, "export", URL, "-o", str(out))
    assert to_file.returncode == 0, to_file.stderr
    assert out.read_text() == exported.stdout
    missing = await asyncio.to_thread(_cli, server_url, prefix, "export", "/notes/none")
    assert missing.returncode != 0 and "/notes/none" in missing.stderr


def test_entry_records_are_json_and_keep_undecodable_bytes():
    record = entry_record(URL, "1-0", {b"e": b"\xc1"})
    assert record["kind"] == "undecodable" and record["raw"] == "c1"
    json.dumps(record)
    assert msgspec.json.encode(record)


async def test_a_warm_state_behind_a_trim_is_not_folded_across_the_gap(cluster):
    """A worker keeps an entity's state warm when its partition moves away; the next
    owner writes snapshots and trims the log behind them. When the partition comes
    back, the log after the warm state's position is gone: the worker must start from
    the snapshot, not fold the remaining tail onto its stale state (which lost every
    message the other owner handled: the chaos run with retention on found this)."""
    # Partitions move here, with the suite's long lease: a pointer read in flight across a
    # hand-over goes back to the inbox at once (test_idle_worker.py), no pending sweep.
    moving = TRIM_ALL
    first = await cluster.runtime(notes_registry(), **moving)
    assert first.worker is not None and first.store is not None
    keys = first.store.keys
    urls = {
        p: next(f"/notes/w{p}-{i}" for i in range(1000) if keys.partition(f"/notes/w{p}-{i}") == p)
        for p in range(keys.partitions)
    }
    for url in urls.values():  # warm in the first worker, in every partition
        await add_notes(first, ["a"], url)
    second = await cluster.runtime(notes_registry(), **moving)
    assert second.worker is not None
    await until(lambda: _moved(first, second), 20, "a partition to move to the second worker")
    p = next(iter(second.worker.leases))
    url = urls[p]
    await add_notes(second, ["b1", "b2", "b3"], url)  # snapshots, and trims behind them
    assert "trimmed" in await second.store.meta(url)
    await second.close()
    cluster.runtimes.remove(second)
    await until(lambda: _holds(first, p), 20, "the partition to come back")
    await add_notes(first, ["c"], url)
    assert await note_texts(first, url) == ["a", "b1", "b2", "b3", "c"]
    # And a cold start agrees (the snapshot the first worker wrote holds it all).
    await first.close()
    cluster.runtimes.remove(first)
    third = await cluster.runtime(notes_registry(), **TRIM_ALL)
    await add_notes(third, ["d"], url)
    assert await note_texts(third, url) == ["a", "b1", "b2", "b3", "c", "d"]


async def _moved(first: Runtime, second: Runtime) -> bool:
    assert first.worker is not None and second.worker is not None
    mine = set(second.worker.leases)
    return bool(mine) and not mine & set(first.worker.leases)


async def _holds(rt: Runtime, partition: int) -> bool:
    assert rt.worker is not None
    return partition in rt.worker.leases and not rt.worker.leases[partition].draining
