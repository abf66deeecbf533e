"""Recurring schedules: cron expressions in a time zone, fired exactly once per occurrence.

Time is a clock the test moves (``Runtime.clock``, which the in-process worker reads),
so an occurrence comes when the test says so and never by waiting for the wall clock.
Exactly once is checked on the log itself: the occurrence messages (``sender``
``schedule:<id>``, ``idempotency_key`` ``<id>@<ms>``) an entity's log holds.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from typing import Any
from zoneinfo import ZoneInfo

import httpx
import msgspec
import pytest
from redis.exceptions import ConnectionError as RedisConnectionError

from tests.apps.harness import until
from tests.faults import arm_crash, lapse_soon
from tests.test_cli import run
from wakeful import Collection, HandlerContext, Registry, Runtime, ScriptedModel, Settings
from wakeful.errors import EntityNotFoundError, InvalidScheduleError
from wakeful.events import LogRecord, Message, ToolOutcome
from wakeful.gateway import create_app
from wakeful.models import ModelResponse
from wakeful.schedules import next_occurrence_ms

pytestmark = pytest.mark.anyio
UTC = dt.UTC


def ms(when: dt.datetime) -> int:
    return int(when.timestamp() * 1000)


class Clock:
    """A clock the test moves: epoch seconds, like ``time.time``."""

    def __init__(self, when: dt.datetime) -> None:
        self.now = when.timestamp()

    def __call__(self) -> float:
        return self.now

    def set(self, when: dt.datetime) -> None:
        self.now = when.timestamp()


class Seen(msgspec.Struct):
    key: str  # the occurrence id
    payload: Any


def recorder() -> Registry:
    """``/clock/<id>``: records every occurrence it is woken by, once per occurrence id."""
    reg = Registry()

    @reg.entity("clock", state={"seen": Collection(row=Seen)})
    async def clock(ctx: HandlerContext) -> None:
        for m in ctx.wake.messages:
            if (m.sender or "").startswith("schedule:"):
                ctx.db.actions.seen_insert(row=Seen(m.idempotency_key or "", m.payload))

    return reg


async def clocked(cluster: Any, registry: Registry, clock: Clock, **overrides: Any) -> Runtime:
    """A runtime of ``cluster`` (with a worker unless ``run_worker=False``) on ``clock``."""
    run_worker = overrides.pop("run_worker", True)
    rt = Runtime(
        registry,
        settings=cluster.settings(**overrides),
        run_worker=run_worker,
        redis=cluster.redis(),
    )
    rt.clock = clock
    await rt.start()
    cluster.runtimes.append(rt)
    return rt


async def occurrences(rt: Runtime, url: str) -> list[str]:
    """The occurrence ids in the log of ``url``, in log order."""
    out = []
    async for record in rt.events(url):
        event = record.event if isinstance(record, LogRecord) else None
        if isinstance(event, Message) and (event.sender or "").startswith("schedule:"):
            out.append(event.idempotency_key or "")
    return out


async def until_occurrences(rt: Runtime, url: str, count: int, timeout: float = 15) -> list[str]:
    async def enough() -> list[str] | None:
        found = await occurrences(rt, url)
        assert len(found) <= count, f"more occurrences than expected: {found}"
        return found if len(found) == count else None

    found = await until(enough, timeout, f"{count} occurrence(s) of a schedule of {url}")
    await rt.wait_idle(url, timeout=timeout)
    return found


async def handled(rt: Runtime, url: str) -> list[str]:
    return [row["key"] for row in (await rt.state(url))["seen"]]


MORNING = dt.datetime(2030, 6, 3, 8, 59, tzinfo=UTC)  # a Monday; later than any real now
NINE = dt.datetime(2030, 6, 3, 9, 0, tzinfo=UTC)
NEXT_NINE = NINE + dt.timedelta(days=1)


async def test_each_occurrence_fires_exactly_once_at_its_time(cluster):
    clock = Clock(MORNING)
    rt = await clocked(cluster, recorder(), clock)
    url = "/clock/daily"
    await rt.send(url, "hello")
    schedule = await rt.upsert_cron_schedule(url, "standup", "0 9 * * *", payload="stand up")
    assert schedule.next_ms == ms(NINE) and schedule.next_at == NINE
    assert [s.id for s in await rt.cron_schedules(url)] == ["standup"]
    assert (await rt.wait_idle(url)).status == "idle"  # a schedule does not keep it waiting

    clock.set(NINE + dt.timedelta(seconds=5))
    assert await until_occurrences(rt, url, 1) == [f"standup@{ms(NINE)}"]
    assert (await rt.cron_schedules(url))[0].next_ms == ms(NEXT_NINE)

    clock.set(NEXT_NINE + dt.timedelta(seconds=1))
    expected = [f"standup@{ms(NINE)}", f"standup@{ms(NEXT_NINE)}"]
    assert await until_occurrences(rt, url, 2) == expected
    assert await handled(rt, url) == expected
    assert [row["payload"] for row in (await rt.state(url))["seen"]] == ["stand up"] * 2


async def test_missed_occurrences_fire_once_when_a_worker_is_back(cluster):
    """Upserted while a worker ran, due five times while none did: one occurrence fires
    (the first one missed), and the next is the first after now."""
    clock = Clock(MORNING)
    first = await clocked(cluster, recorder(), clock)
    url = "/clock/hourly"
    await first.send(url, "hello")
    await first.upsert_cron_schedule(url, "hourly", "0 * * * *", payload="tick")
    await first.wait_idle(url)
    await first.close()  # every worker is gone while the occurrences pass
    cluster.runtimes.remove(first)

    clock.set(NINE + dt.timedelta(hours=4, minutes=30))  # 09:00 ... 13:00 missed
    second = await clocked(cluster, recorder(), clock)
    assert await until_occurrences(second, url, 1) == [f"hourly@{ms(NINE)}"]
    (listed,) = await second.cron_schedules(url)
    assert listed.next_ms == ms(NINE + dt.timedelta(hours=5))  # 14:00: nothing else is due
    assert await handled(second, url) == [f"hourly@{ms(NINE)}"]


@pytest.mark.parametrize("point", ["schedule:before-fire", "schedule:after-fire"])
async def test_a_worker_killed_at_the_fire_step_leaves_each_occurrence_fired_once(cluster, point):
    """Killed right before the fire script (nothing written) or right after it (the
    message is in the log and the schedule on its next occurrence): the next worker fires
    the occurrence once in the first case, and not again in the second."""
    clock = Clock(MORNING)
    reg = recorder()
    first = await clocked(cluster, reg, clock)
    url = "/clock/crash"
    await first.send(url, "hello")
    await first.upsert_cron_schedule(url, "standup", "0 9 * * *", payload="stand up")
    await first.wait_idle(url)
    assert first.worker is not None
    crashed = arm_crash(first, point)
    clock.set(NINE + dt.timedelta(seconds=5))
    await asyncio.wait_for(crashed.wait(), 15)
    await lapse_soon(first)
    await first.close()
    cluster.runtimes.remove(first)

    second = await clocked(cluster, reg, clock)
    assert await until_occurrences(second, url, 1) == [f"standup@{ms(NINE)}"]
    clock.set(NEXT_NINE + dt.timedelta(seconds=5))  # the next one still comes, once
    expected = [f"standup@{ms(NINE)}", f"standup@{ms(NEXT_NINE)}"]
    assert await until_occurrences(second, url, 2) == expected
    assert await handled(second, url) == expected


@pytest.mark.redis_only
async def test_a_schedule_survives_a_redis_kill9_and_restart_with_aof(private_redis, prefix):
    """Fired once, then Redis is killed (-9) and restarted from its AOF: the schedule is
    still there on its next occurrence, which fires once, and the first never again."""
    clock = Clock(MORNING)
    settings = Settings(
        redis_url=private_redis.url, prefix=prefix, partitions=4, lease_ttl_ms=1000, block_ms=100
    )
    rt = Runtime(recorder(), settings=settings, run_worker=True)
    rt.clock = clock
    await rt.start()
    url = "/clock/aof"
    try:
        await rt.send(url, "hello")
        await rt.upsert_cron_schedule(url, "standup", "0 9 * * *", payload="stand up")
        clock.set(NINE + dt.timedelta(seconds=5))
        assert await until_occurrences(rt, url, 1) == [f"standup@{ms(NINE)}"]

        private_redis.kill()
        private_redis.start()

        async def listed() -> list[Any] | None:
            try:
                return await rt.cron_schedules(url)
            except (RedisConnectionError, OSError):  # a pooled connection from before
                return None

        (schedule,) = await until(listed, 20, "Redis to answer again")
        assert schedule.next_ms == ms(NEXT_NINE)
        clock.set(NEXT_NINE + dt.timedelta(seconds=5))
        expected = [f"standup@{ms(NINE)}", f"standup@{ms(NEXT_NINE)}"]
        assert await until_occurrences(rt, url, 2, timeout=30) == expected
        assert await handled(rt, url) == expected
    finally:
        await rt.close()


async def test_invalid_schedules_are_refused_naming_what_is_wrong(cluster):
    rt = await clocked(cluster, recorder(), Clock(MORNING))
    url = "/clock/bad"
    await rt.send(url, "hello")
    cases = [
        ({"expression": "61 * * * *"}, "expression", "61 * * * *"),
        ({"expression": "every day"}, "expression", "5 fields"),
        ({"expression": "0 9 * * * 30"}, "expression", "5 fields"),  # croniter's seconds
        ({"expression": "0 0 30 2 *"}, "expression", "never matches"),
        ({"expression": "@sometimes"}, "expression", "@sometimes"),
        ({"timezone": "Mars/Olympus_Mons"}, "timezone", "Mars/Olympus_Mons"),
        ({"timezone": "../../etc/passwd"}, "timezone", "IANA"),
        ({"schedule_id": "two words"}, "id", "two words"),
        ({"schedule_id": ""}, "id", "1-100"),
        ({"payload": object()}, "payload", "cannot be sent"),
    ]
    for change, field, named in cases:
        args: dict[str, Any] = {"schedule_id": "s", "expression": "0 9 * * *", "timezone": "UTC"}
        args.update(change)
        with pytest.raises(InvalidScheduleError) as caught:
            await rt.upsert_cron_schedule(url, **args)
        assert caught.value.field == field, (change, caught.value)
        assert named in str(caught.value), (change, str(caught.value))
    assert await rt.cron_schedules(url) == []  # nothing was written
    with pytest.raises(EntityNotFoundError):
        await rt.upsert_cron_schedule("/clock/nobody", "s", "0 9 * * *")


async def test_the_client_api_upserts_lists_and_deletes(cluster):
    clock = Clock(MORNING)
    rt = await clocked(cluster, recorder(), clock, run_worker=False)
    url = "/clock/api"
    await rt.send(url, "hello")
    a = await rt.upsert_cron_schedule(url, "a", "30 11 * * *", timezone="Europe/Berlin")
    b = await rt.upsert_cron_schedule(url, "b", "0 9 * * *", payload={"text": "report"})
    assert a.next_at == dt.datetime(2030, 6, 3, 11, 30, tzinfo=ZoneInfo("Europe/Berlin"))
    assert a.next_ms == ms(NINE + dt.timedelta(minutes=30))  # 09:30 UTC
    assert [s.id for s in await rt.cron_schedules(url)] == ["b", "a"]  # soonest first
    clock.set(MORNING + dt.timedelta(days=3))
    again = await rt.upsert_cron_schedule(url, "b", "0 9 * * *", payload={"text": "report"})
    assert again == b  # unchanged: the next occurrence is kept (a retry changes nothing)
    moved = await rt.upsert_cron_schedule(url, "b", "0 10 * * *", payload={"text": "report"})
    assert moved.next_ms == ms(dt.datetime(2030, 6, 6, 10, 0, tzinfo=UTC))
    assert await rt.delete_cron_schedule(url, "a") is True
    assert await rt.delete_cron_schedule(url, "a") is False
    assert [(s.id, s.expression, s.payload) for s in await rt.cron_schedules(url)] == [
        ("b", "0 10 * * *", {"text": "report"})
    ]


async def test_the_handler_api_upserts_lists_and_deletes(cluster):
    reg = Registry()
    seen: list[Any] = []

    @reg.entity("planner")
    async def planner(ctx: HandlerContext) -> None:
        for m in ctx.wake.messages:
            if m.payload == "plan":
                await ctx.upsert_cron_schedule("weekly", "0 8 * * 1", timezone="Europe/Paris")
                await ctx.upsert_cron_schedule("daily", "0 7 * * *", payload="coffee")
            elif m.payload == "list":
                seen.append([(s.id, s.expression, s.timezone) for s in await ctx.cron_schedules()])
            elif m.payload == "drop":
                seen.append(await ctx.delete_cron_schedule("weekly"))
                seen.append(await ctx.delete_cron_schedule("weekly"))
            elif m.payload == "bad":
                try:
                    await ctx.upsert_cron_schedule("x", "0 25 * * *")
                except InvalidScheduleError as exc:
                    seen.append(exc.field)

    rt = await clocked(cluster, reg, Clock(MORNING))
    url = "/planner/p"
    for text in ("plan", "list", "drop", "list", "bad"):
        await rt.send(url, text)
        await rt.wait_idle(url)
    assert seen == [
        [("daily", "0 7 * * *", "UTC"), ("weekly", "0 8 * * 1", "Europe/Paris")],
        True,
        False,
        [("daily", "0 7 * * *", "UTC")],
        "expression",
    ]
    assert [s.id for s in await rt.cron_schedules(url)] == ["daily"]


def use(call_id: str, name: str, **arguments: Any) -> dict[str, Any]:
    return {"type": "tool_use", "id": call_id, "name": name, "input": arguments}


def step(*calls: dict[str, Any]) -> ModelResponse:
    return ModelResponse(content=list(calls), stop_reason="tool_use")


async def test_an_agent_schedules_lists_and_deletes_with_the_runtime_tools(cluster):
    """The agent sets a schedule with ``upsert_cron_schedule``, is woken by its occurrence
    (the model reads it as a message from the schedule), lists it and deletes it."""
    model = ScriptedModel(
        [
            step(
                use(
                    "u1",
                    "upsert_cron_schedule",
                    id="standup",
                    expression="0 9 * * 1-5",
                    timezone="Europe/Berlin",
                    payload="time for the stand-up",
                ),
                use("u2", "upsert_cron_schedule", id="bad", expression="0 9 * *"),
                use("t1", "schedule_message", url="/bot/b", text="later", delay_seconds=3600),
            ),
            "set",
            step(use("l1", "list_schedules")),
            step(use("d1", "delete_schedule", id="standup"), use("d2", "delete_schedule", id="x")),
            "deleted",
        ]
    )
    reg = Registry()

    @reg.entity("bot")
    async def bot(ctx: HandlerContext) -> None:
        ctx.use_agent("You keep schedules.", model=model, tools=ctx.runtime_tools)
        await ctx.agent.run()

    clock = Clock(MORNING)
    rt = await clocked(cluster, reg, clock)
    url = "/bot/b"

    async def answered(requests: int) -> bool:
        # The timer schedule_message set keeps the bot "waiting" (not idle) for an hour.
        status = await rt.status(url, runs=True)
        return (
            len(model.requests) == requests
            and status.cursor == status.last_input
            and (status.run is None)
        )

    await rt.send(url, "remind me of the stand-up on weekdays at nine")
    await until(lambda: answered(2), 15, "the run that sets the schedule")
    berlin_nine = dt.datetime(2030, 6, 4, 9, 0, tzinfo=ZoneInfo("Europe/Berlin"))  # Tuesday
    assert [s.next_ms for s in await rt.cron_schedules(url)] == [ms(berlin_nine)]

    clock.set(berlin_nine + dt.timedelta(seconds=1))
    await until(lambda: answered(5), 15, "the run the occurrence wakes")
    done = {e.tool_call_id: e for e in await rt.history(url) if isinstance(e, ToolOutcome)}
    assert not done["u1"].is_error and done["u1"].details["id"] == "standup"
    assert "2030-06-04T09:00+02:00" in done["u1"].content[0]["text"]
    assert done["u2"].is_error and "'0 9 * *'" in done["u2"].content[0]["text"]
    listing = done["l1"].details["schedules"]
    assert (listing[0]["id"], listing[0]["kind"]) == ("standup", "recurring")
    assert listing[0]["next"] == "2030-06-05T09:00+02:00"  # the one after the one fired
    assert [s["kind"] for s in listing[1:]] == ["message"]  # the pending schedule_message
    assert not done["d1"].is_error and done["d2"].is_error
    assert await rt.cron_schedules(url) == []
    woken_by = json.dumps(model.requests[2].messages[-1])
    assert "[message from schedule:standup]\\ntime for the stand-up" in woken_by


async def test_deleting_an_entity_removes_its_schedules(cluster):
    clock = Clock(MORNING)
    rt = await clocked(cluster, recorder(), clock)
    url = "/clock/doomed"
    await rt.send(url, "hello")
    await rt.upsert_cron_schedule(url, "standup", "0 9 * * *")
    store = rt.store
    assert store is not None
    keys = store.keys
    due_key = keys.crondue(keys.partition(url))
    assert await store.redis.zscore(due_key, f"{url}|standup") is not None
    await rt.delete(url)
    assert await store.redis.zscore(due_key, f"{url}|standup") is None
    assert await store.redis.exists(keys.crons(url)) == 0
    await rt.send(url, "hello again")  # a new incarnation starts without them
    assert await rt.cron_schedules(url) == []


async def test_a_leftover_schedule_of_another_incarnation_is_removed_not_fired(cluster):
    """A schedule whose entity was deleted and re-created without it being purged (say a
    client upsert raced the delete) is removed when it comes due, and never fires into
    the new incarnation."""
    clock = Clock(MORNING)
    rt = await clocked(cluster, recorder(), clock)
    url = "/clock/reborn"
    await rt.send(url, "hello")
    await rt.upsert_cron_schedule(url, "standup", "0 9 * * *")
    store = rt.store
    assert store is not None
    await store.redis.hset(store.keys.meta(url), "created", "1-0")  # another incarnation
    due_key = store.keys.crondue(store.keys.partition(url))
    clock.set(NINE + dt.timedelta(seconds=5))

    async def removed() -> bool:
        return await store.redis.zscore(due_key, f"{url}|standup") is None

    await until(removed, 15, "the leftover schedule to be removed")
    assert await store.redis.hexists(store.keys.crons(url), "standup") == 0
    assert await occurrences(rt, url) == []


async def test_a_schedule_member_the_worker_cannot_use_is_moved_aside(cluster):
    clock = Clock(MORNING)
    rt = await clocked(cluster, recorder(), clock)
    store = rt.store
    assert store is not None
    partition = 0
    await store.redis.zadd(store.keys.crondue(partition), {"no-separator": 1})

    async def moved() -> list[dict[str, str]]:
        return [b for b in await rt.bad_items() if b.get("kind") == "schedule"]

    (bad,) = await until(moved, 15, "the bad member to be moved aside")
    assert bad["item"] == "no-separator" and "<url>|<schedule id>" in bad["reason"]
    assert await store.redis.zcard(store.keys.crondue(partition)) == 0


BERLIN = ZoneInfo("Europe/Berlin")


def _next(expression: str, after: dt.datetime, count: int) -> list[dt.datetime]:
    out, at = [], ms(after)
    for _ in range(count):
        at = next_occurrence_ms(expression, "Europe/Berlin", at)
        out.append(dt.datetime.fromtimestamp(at / 1000, BERLIN))
    return out


def test_a_skipped_local_hour_fires_at_the_end_of_the_gap():
    """2030-03-31 02:00 CET jumps to 03:00 CEST: a daily 02:30 fires at 03:00 that day,
    and an hourly schedule has no 02:00 (croniter's behaviour, documented in README)."""
    eve = dt.datetime(2030, 3, 30, 23, 0, tzinfo=BERLIN)
    daily = _next("30 2 * * *", eve, 2)
    assert [d.isoformat() for d in daily] == [
        "2030-03-31T03:00:00+02:00",
        "2030-04-01T02:30:00+02:00",
    ]
    hourly = [d.isoformat() for d in _next("0 * * * *", eve + dt.timedelta(hours=1), 3)]
    assert hourly == [
        "2030-03-31T01:00:00+01:00",
        "2030-03-31T03:00:00+02:00",
        "2030-03-31T04:00:00+02:00",
    ]


def test_a_repeated_local_hour_fires_at_both_instants():
    """2030-10-27 03:00 CEST falls back to 02:00 CET: a daily 02:30 fires at 02:30 CEST
    and again at 02:30 CET (an hour later), then daily again."""
    eve = dt.datetime(2030, 10, 26, 23, 0, tzinfo=BERLIN)
    daily = [d.isoformat() for d in _next("30 2 * * *", eve, 3)]
    assert daily == [
        "2030-10-27T02:30:00+02:00",
        "2030-10-27T02:30:00+01:00",
        "2030-10-28T02:30:00+01:00",
    ]


async def test_the_cli_sets_lists_and_deletes_schedules(server_url, prefix):
    settings = Settings(redis_url=server_url, prefix=prefix, partitions=4)
    rt = Runtime(recorder(), settings=settings, run_worker=False)
    await rt.start()
    url = "/clock/cli"
    try:
        await rt.send(url, "hello")
        set_ = await run(
            server_url, prefix, "schedules", url, "--set", "standup", "0 9 * * 1-5",
            "--timezone", "Europe/Berlin", "--payload", "stand up", "--json",
        )  # fmt: skip
        assert set_.returncode == 0, set_.stderr
        [row] = json.loads(set_.stdout)
        assert (row["id"], row["expression"], row["payload"]) == (
            "standup",
            "0 9 * * 1-5",
            "stand up",
        )
        assert row["next"].endswith("09:00:00+02:00") or row["next"].endswith("09:00:00+01:00")
        listed = await run(server_url, prefix, "schedules", url)
        assert listed.stdout.startswith("standup\t0 9 * * 1-5\tEurope/Berlin\t")
        bad = await run(server_url, prefix, "schedules", url, "--set", "x", "0 9 * *")
        assert bad.returncode == 1 and "'0 9 * *'" in bad.stderr
        zone = await run(
            server_url, prefix, "schedules", url, "--set", "x", "@daily", "--timezone", "Nowhere"
        )
        assert zone.returncode == 1 and "'Nowhere'" in zone.stderr
        alone = await run(server_url, prefix, "schedules", url, "--timezone", "UTC")
        assert alone.returncode == 1 and "describe the schedule of --set" in alone.stderr
        gone = await run(server_url, prefix, "schedules", url, "--delete", "standup")
        assert gone.returncode == 0 and "has no recurring schedules" in gone.stdout
        again = await run(server_url, prefix, "schedules", url, "--delete", "standup")
        assert again.returncode == 1 and "no schedule 'standup'" in again.stderr
        missing = await run(server_url, prefix, "schedules", "/clock/nobody")
        assert missing.returncode == 1
    finally:
        await rt.close()


async def test_schedules_over_http(cluster):
    rt = await clocked(cluster, recorder(), Clock(MORNING), run_worker=False)
    app = create_app(rt)
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://gw")
    url = "/clock/http"
    base = f"/entities{url}/schedules"
    async with http:
        assert (await http.get(base)).status_code == 404  # no such entity yet
        await rt.send(url, "hello")
        put = await http.post(
            base, json={"id": "standup", "expression": "0 9 * * *", "payload": "stand up"}
        )
        assert put.status_code == 200, put.text
        assert put.json()["next_ms"] == ms(NINE) and put.json()["next"] == NINE.isoformat()
        bad = await http.post(base, json={"id": "x", "expression": "0 9 * * *", "timezone": "Moon"})
        assert bad.status_code == 422 and "'Moon'" in bad.json()["error"]["message"]
        assert bad.json()["error"]["type"] == "InvalidScheduleError"
        missing = await http.post(base, json={"id": "x"})
        assert missing.status_code == 400
        assert [s["id"] for s in (await http.get(base)).json()] == ["standup"]
        assert (await http.delete(f"{base}/standup")).status_code == 200
        assert (await http.delete(f"{base}/standup")).status_code == 404
        assert (await http.get(base)).json() == []
