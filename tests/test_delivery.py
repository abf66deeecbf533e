"""Sending and creating: idempotency, type checks at the sender, get-or-create, what
handlers see, listing, status, following the log, and undecodable log entries."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import msgspec
import pytest

from wakeful import (
    ArgsConflictError,
    Collection,
    Created,
    EntityFailed,
    EntityNotFoundError,
    EventDecodeError,
    HandlerContext,
    InvalidArgsError,
    LogRecord,
    Message,
    Registry,
    Resumed,
    StateChanged,
    UndecodableRecord,
    UnknownEntityTypeError,
)

pytestmark = pytest.mark.anyio


class Profile(msgspec.Struct):
    name: str
    level: int = 1


class Seen(msgspec.Struct):
    key: str
    payload: Any = None


def make_registry(calls: list[dict[str, Any]]) -> Registry:
    """``echo`` records every wake; ``agent`` takes typed args and keeps the messages."""
    reg = Registry()

    @reg.entity("echo", state={"seen": Collection(row=Seen)})
    async def echo(ctx: HandlerContext) -> None:
        calls.append(
            {
                "url": ctx.entity_url,
                "messages": [m.payload for m in ctx.wake.messages],
                "keys": [m.idempotency_key for m in ctx.wake.messages],
            }
        )
        for record in ctx.wake.events:
            if isinstance(record.event, Message):
                ctx.db.actions.seen_insert(row=Seen(record.id, record.event.payload))

    @reg.entity("agent", args=Profile, description="typed args")
    async def agent(ctx: HandlerContext) -> None:
        created = ctx.wake.created
        calls.append(
            {
                "url": ctx.entity_url,
                "type": ctx.entity_type,
                "id": ctx.entity_id,
                "args": ctx.args,
                "first_wake": ctx.first_wake,
                "messages": [m.payload for m in ctx.wake.messages],
                "created": (created.type, created.args, created.parent) if created else None,
                "kinds": ctx.wake.kinds,
            }
        )

    return reg


async def log_events(rt, url: str) -> list[Any]:
    """The decoded events of the log (undecodable entries left out)."""
    return [r.event async for r in rt.events(url) if isinstance(r, LogRecord)]


# --- idempotency -----------------------------------------------------------------


async def test_idempotent_send(cluster) -> None:
    calls: list[dict[str, Any]] = []
    rt = await cluster.runtime(make_registry(calls))
    url = "/echo/idem"

    first = await rt.send(url, "hello", idempotency_key="k1")
    again = await rt.send(url, "hello (retried)", idempotency_key="k1")
    assert again == first
    await rt.wait_idle(url, timeout=10)
    # Still the same after the first one was processed.
    assert await rt.send(url, "hello (late retry)", idempotency_key="k1") == first
    other = await rt.send(url, "other", idempotency_key="k2")
    assert other != first
    await rt.wait_idle(url, timeout=10)

    messages = [e for e in await log_events(rt, url) if isinstance(e, Message)]
    assert [(m.payload, m.idempotency_key) for m in messages] == [("hello", "k1"), ("other", "k2")]
    seen = [p for c in calls for p in c["messages"]]
    assert seen == ["hello", "other"]
    state = await rt.state(url)
    assert [row["key"] for row in state["seen"]] == [first, other]

    # Keys are scoped per entity: the same key for another entity is a new message.
    elsewhere = await rt.send("/echo/idem2", "hello", idempotency_key="k1")
    assert elsewhere != first
    await rt.wait_idle("/echo/idem2", timeout=10)
    assert [c["messages"] for c in calls if c["url"] == "/echo/idem2"] == [["hello"]]


async def test_concurrent_sends_with_one_key_append_once(cluster) -> None:
    calls: list[dict[str, Any]] = []
    rt = await cluster.runtime(make_registry(calls))
    client = await cluster.runtime(run_worker=False)
    url = "/echo/race"
    ids = await asyncio.gather(
        *(
            (rt if i % 2 else client).send(url, f"try {i}", idempotency_key="once")
            for i in range(10)
        )
    )
    assert len(set(ids)) == 1
    await rt.wait_idle(url, timeout=10)
    assert len([e for e in await log_events(rt, url) if isinstance(e, Message)]) == 1
    assert len([p for c in calls for p in c["messages"]]) == 1


# --- entity types at the sender ----------------------------------------------------------


async def test_unknown_type_fails_at_the_sender(cluster) -> None:
    rt = await cluster.runtime(make_registry([]))
    with pytest.raises(UnknownEntityTypeError) as info:
        await rt.send("/nope/x", "hi")
    assert info.value.type_name == "nope"
    assert "agent, echo" in str(info.value)
    with pytest.raises(UnknownEntityTypeError):
        await rt.create("nope", "x")
    with pytest.raises(UnknownEntityTypeError):
        await rt.list("nope")
    with pytest.raises(EntityNotFoundError):
        await rt.status("/nope/x")
    assert await rt.store.redis.xlen(rt.store.keys.log("/nope/x")) == 0


async def test_pure_client_relies_on_types_published_by_workers(cluster) -> None:
    client = await cluster.runtime(run_worker=False)
    assert client.worker is None
    # No worker has published anything yet.
    with pytest.raises(UnknownEntityTypeError):
        await client.send("/echo/a", "too early")

    calls: list[dict[str, Any]] = []
    worker_rt = await cluster.runtime(make_registry(calls))
    # Now the type is known through the worker's published manifest.
    await client.send("/echo/a", "hi")
    await client.wait_idle("/echo/a", timeout=10)
    assert calls[-1]["messages"] == ["hi"]
    with pytest.raises(UnknownEntityTypeError) as info:
        await client.send("/nope/a", "hi")
    assert "agent, echo" in str(info.value)
    assert await client.list("echo") == ["/echo/a"]
    await worker_rt.close()


async def test_pure_client_caches_published_types(cluster, monkeypatch) -> None:
    await cluster.runtime(make_registry([]))
    client = await cluster.runtime(run_worker=False)
    redis = client.store.redis
    real_hgetall = redis.hgetall
    reads: list[str] = []

    async def counting_hgetall(key: str) -> Any:
        reads.append(key)
        return await real_hgetall(key)

    monkeypatch.setattr(redis, "hgetall", counting_hgetall)
    await client.send("/echo/c1", "one")
    await client.send("/echo/c2", "two")
    await client.send("/echo/c3", "three")
    assert reads.count(client.store.keys.types) == 1


# --- create ------------------------------------------------------------------------


async def test_create_is_get_or_create(cluster) -> None:
    calls: list[dict[str, Any]] = []
    rt = await cluster.runtime(make_registry(calls))
    url = await rt.create("agent", "a1", {"name": "Ann"}, initial_message="hello")
    assert url == "/agent/a1"
    await rt.wait_idle(url, timeout=10)
    log_before = await log_events(rt, url)

    # Same args (in any form that validates to the same value): no second `created`;
    # without a message nothing is appended, and a message is delivered like a send.
    assert await rt.create("agent", "a1", {"name": "Ann", "level": 1}) == url
    assert await log_events(rt, url) == log_before
    assert await rt.create("agent", "a1", Profile("Ann"), initial_message="again") == url
    await rt.wait_idle(url, timeout=10)
    log_before = await log_events(rt, url)
    assert [e.payload for e in log_before if isinstance(e, Message)] == ["hello", "again"]
    assert len([e for e in log_before if isinstance(e, Created)]) == 1

    with pytest.raises(ArgsConflictError) as info:
        await rt.create("agent", "a1", {"name": "Bob"})
    assert info.value.url == url
    with pytest.raises(ArgsConflictError):
        await rt.create("agent", "a1", {"name": "Ann", "level": 2}, initial_message="x")
    assert await log_events(rt, url) == log_before
    assert (await rt.status(url)).args == {"name": "Ann", "level": 1}
    assert len(calls) == 2


async def test_create_without_args_type_compares_args_by_value(cluster) -> None:
    rt = await cluster.runtime(make_registry([]))
    url = await rt.create("echo", "e1", {"a": 1, "b": {"x": 1, "y": 2}})
    # Equal args whose maps are written in another order are the same args.
    assert await rt.create("echo", "e1", {"b": {"y": 2, "x": 1}, "a": 1}) == url
    with pytest.raises(ArgsConflictError):
        await rt.create("echo", "e1", {"a": 2, "b": {"x": 1, "y": 2}})
    created = [e for e in await log_events(rt, url) if isinstance(e, Created)]
    assert len(created) == 1


async def test_args_are_validated_against_the_args_struct(cluster) -> None:
    rt = await cluster.runtime(make_registry([]))
    with pytest.raises(InvalidArgsError, match=r"args rejected by entity type 'agent'"):
        await rt.create("agent", "bad", {"level": 3})
    with pytest.raises(InvalidArgsError, match=r"Expected `int`, got `str`"):
        await rt.create("agent", "bad", {"name": "x", "level": "high"})
    with pytest.raises(InvalidArgsError):
        await rt.create("agent", "bad", "not a map")
    with pytest.raises(EntityNotFoundError):
        await rt.status("/agent/bad")
    assert await rt.list("agent") == []


# --- what a handler sees ------------------------------------------------------------


async def test_handler_context(cluster) -> None:
    calls: list[dict[str, Any]] = []
    rt = await cluster.runtime(make_registry(calls))
    url = await rt.create(
        "agent", "a-1.x", {"name": "Ann", "level": 4}, initial_message="hello", parent="/echo/p"
    )
    await rt.wait_idle(url, timeout=10)
    await rt.send(url, {"text": "second"})
    await rt.wait_idle(url, timeout=10)

    assert calls == [
        {
            "url": "/agent/a-1.x",
            "type": "agent",
            "id": "a-1.x",
            "args": Profile("Ann", 4),
            "first_wake": True,
            "messages": ["hello"],
            "created": ("agent", {"name": "Ann", "level": 4}, "/echo/p"),
            "kinds": ["created", "msg"],
        },
        {
            "url": "/agent/a-1.x",
            "type": "agent",
            "id": "a-1.x",
            "args": Profile("Ann", 4),
            "first_wake": False,
            "messages": [{"text": "second"}],
            "created": None,
            "kinds": ["msg"],
        },
    ]


async def test_first_wake_by_send_has_no_args(cluster) -> None:
    calls: list[dict[str, Any]] = []
    rt = await cluster.runtime(make_registry(calls))
    await rt.send("/agent/plain", "hi")
    await rt.wait_idle("/agent/plain", timeout=10)
    assert calls[0]["first_wake"] is True
    assert calls[0]["args"] is None
    assert calls[0]["created"] == ("agent", None, None)
    assert calls[0]["messages"] == ["hi"]


# --- list and status --------------------------------------------------------------------


async def test_list_and_status(cluster) -> None:
    rt = await cluster.runtime(make_registry([]))
    for name in ["b", "a", "c-3"]:
        await rt.send(f"/echo/{name}", name)
    await rt.create("agent", "solo", {"name": "S"}, parent="/echo/a")
    assert await rt.list("echo") == ["/echo/a", "/echo/b", "/echo/c-3"]
    assert await rt.list("agent") == ["/agent/solo"]

    url = "/echo/a"
    await rt.wait_idle(url, timeout=10)
    last = await rt.send(url, "more")
    status = await rt.wait_idle(url, timeout=10)
    records = [r async for r in rt.events(url)]
    assert status.url == url
    assert status.type == "echo"
    assert status.status == "idle"
    assert status.idle
    assert status.cursor == status.last_input == last
    assert status.created_id == records[0].id
    assert isinstance(records[0].event, Created)
    assert status.attempts == 0
    assert status.error is None
    assert status.parent is None
    assert status.args is None

    agent = await rt.wait_idle("/agent/solo", timeout=10)
    assert agent.type == "agent"
    assert agent.parent == "/echo/a"
    assert agent.args == {"name": "S", "level": 1}
    assert agent.cursor == agent.last_input == agent.created_id

    with pytest.raises(EntityNotFoundError):
        await rt.status("/echo/missing")


async def test_status_is_pending_until_processed(cluster) -> None:
    client = await cluster.runtime(run_worker=False, registry=make_registry([]))
    url = "/echo/later"
    sent = await client.send(url, "queued")
    status = await client.status(url)
    assert status.status == "pending"
    assert status.last_input == sent
    assert status.cursor == "0-0"
    await cluster.runtime(make_registry([]))  # a worker arrives
    status = await client.wait_idle(url, timeout=10)
    assert status.status == "idle"
    assert status.cursor == sent


# --- following the log --------------------------------------------------------------------


async def test_events_follow_yields_new_events(cluster) -> None:
    rt = await cluster.runtime(make_registry([]))
    reader = await cluster.runtime(run_worker=False)
    url = "/echo/f"
    first = await rt.send(url, "before")
    await rt.wait_idle(url, timeout=10)

    got: list[LogRecord] = []
    found = asyncio.Event()

    async def follow() -> None:
        async with contextlib.aclosing(
            reader.events(url, after=first, follow=True, block_ms=200)
        ) as stream:
            async for record in stream:
                got.append(record)
                payloads = [r.event.payload for r in got if isinstance(r.event, Message)]
                if payloads == ["one", "two"]:
                    found.set()
                    return

    task = asyncio.create_task(follow())
    await asyncio.sleep(0)  # the reader may start before or after the sends: both must work
    one = await rt.send(url, "one")
    two = await rt.send(url, "two")
    async with asyncio.timeout(10):
        await found.wait()
        await task
    ids = [r.id for r in got]
    assert ids == sorted(ids, key=lambda i: tuple(map(int, i.split("-"))))
    assert first not in ids  # strictly after
    assert one in ids and two in ids
    assert all(isinstance(r, LogRecord) for r in got)

    # Without follow, the iterator ends at the end of the log.
    tail = [r async for r in reader.events(url, after=two)]
    assert all(not isinstance(r.event, Message) for r in tail)


# --- undecodable entries ------------------------------------------------------------------


async def test_undecodable_entry_parks_the_entity_and_loses_nothing(cluster) -> None:
    calls: list[dict[str, Any]] = []
    rt = await cluster.runtime(make_registry(calls))
    url = "/echo/poisoned"
    await rt.send(url, "m1")
    await rt.wait_idle(url, timeout=10)

    garbage_id = (
        await rt.store.redis.xadd(rt.store.keys.log(url), {b"e": b"\xc1 not msgpack"})
    ).decode()
    after = await rt.send(url, "m2")  # wakes the entity, which must read past the garbage

    status = await rt.wait_idle(url, timeout=10)
    assert status.status == "failed"
    assert garbage_id in status.error
    assert "could not be decoded" in status.error
    assert [c["messages"] for c in calls if c["url"] == url] == [["m1"]]

    records = [r async for r in rt.events(url)]
    bad = [r for r in records if isinstance(r, UndecodableRecord)]
    assert len(bad) == 1
    assert bad[0].id == garbage_id
    assert bad[0].raw == b"\xc1 not msgpack"
    assert bad[0].error
    failed = [
        r.event for r in records if isinstance(r, LogRecord) and isinstance(r.event, EntityFailed)
    ]
    assert len(failed) == 1
    assert failed[0].inputs == [garbage_id]
    assert garbage_id in failed[0].error

    # The worker keeps serving other entities.
    await rt.send("/echo/healthy", "still here")
    assert (await rt.wait_idle("/echo/healthy", timeout=10)).status == "idle"
    assert [c["messages"] for c in calls if c["url"] == "/echo/healthy"] == [["still here"]]

    # A message sent while the entity is parked stays in the log, unprocessed.
    while_failed = await rt.send(url, "m3")
    status = await rt.wait_idle(url, timeout=10)
    assert status.status == "failed"
    assert status.last_input == while_failed
    assert [c["messages"] for c in calls if c["url"] == url] == [["m1"]]

    # Dead-letter the garbage; everything after it is processed, in order.
    await rt.resume(url, skip_failed=True)
    status = await rt.wait_idle(url, timeout=10)
    assert status.status == "idle"
    assert status.cursor == while_failed
    seen = [p for c in calls if c["url"] == url for p in c["messages"]]
    assert seen == ["m1", "m2", "m3"]
    state = await rt.state(url)
    assert [row["payload"] for row in state["seen"]] == ["m1", "m2", "m3"]
    assert [row["key"] for row in state["seen"]][1] == after
    resumed = [e for e in await log_events(rt, url) if isinstance(e, Resumed)]
    assert resumed == [Resumed(skipped=[garbage_id])]

    await rt.send(url, "m4")
    await rt.wait_idle(url, timeout=10)
    assert [p for c in calls if c["url"] == url for p in c["messages"]][-1] == "m4"


async def rewrite_entry(rt: Any, url: str, target: str, data: bytes) -> None:
    """Replace the stored bytes of log entry ``target``, keeping every id (as a newer
    version writing an event kind this one cannot read would leave it)."""
    key = rt.store.keys.log(url)
    entries = await rt.store.read_log(url)
    await rt.store.redis.delete(key)
    for entry_id, fields in entries:
        await rt.store.redis.xadd(
            key, {b"e": data if entry_id == target else fields[b"e"]}, id=entry_id
        )


async def handled_with_state_events(rt: Any, url: str) -> list[str]:
    """Have ``url`` handle three messages, one at a time; the ids of its state events."""
    for payload in ("a", "b", "c"):
        await rt.send(url, payload)
        await rt.wait_idle(url, timeout=10)
    return [
        r.id
        async for r in rt.events(url)
        if isinstance(r, LogRecord) and isinstance(r.event, StateChanged)
    ]


async def test_an_unreadable_state_event_before_the_cursor_parks_the_entity(cluster) -> None:
    """Old entries are re-read by a cold worker: one it cannot decode leaves the state
    unknown, so the entity is parked naming it, never rebuilt without it."""
    calls: list[dict[str, Any]] = []
    app = make_registry(calls)
    rt = await cluster.runtime(app)
    url = "/echo/skewed"
    first_state = (await handled_with_state_events(rt, url))[0]
    await rewrite_entry(rt, url, first_state, b"\xc1 from a newer version")
    await rt.close()
    cluster.runtimes.remove(rt)
    cold = await cluster.runtime(app)  # no warm state: it folds the whole log
    await cold.send(url, "d")
    status = await cold.wait_idle(url, timeout=10)
    assert status.status == "failed"
    assert first_state in status.error and "could not be decoded" in status.error
    assert [c["messages"] for c in calls if c["url"] == url] == [["a"], ["b"], ["c"]]
    with pytest.raises(EventDecodeError, match=first_state):
        await cold.state(url)


async def test_a_dead_lettered_entry_is_skipped_by_a_cold_worker_too(cluster) -> None:
    calls: list[dict[str, Any]] = []
    app = make_registry(calls)
    rt = await cluster.runtime(app)
    url = "/echo/dead-letter"
    await rt.send(url, "m1")
    await rt.wait_idle(url, timeout=10)
    garbage = (await rt.store.redis.xadd(rt.store.keys.log(url), {b"e": b"\xc1"})).decode()
    await rt.send(url, "m2")
    assert (await rt.wait_idle(url, timeout=10)).status == "failed"
    await rt.resume(url, skip_failed=True)
    assert (await rt.wait_idle(url, timeout=10)).status == "idle"
    await rt.close()
    cluster.runtimes.remove(rt)
    cold = await cluster.runtime(app)
    await cold.send(url, "m3")
    assert (await cold.wait_idle(url, timeout=10)).status == "idle"
    assert [row["payload"] for row in (await cold.state(url))["seen"]] == ["m1", "m2", "m3"]
    assert garbage not in [row["key"] for row in (await cold.state(url))["seen"]]


async def test_inputs_before_an_unreadable_entry_are_handled_before_it_parks(cluster) -> None:
    """Skipping the unreadable entry later must skip nothing else: the readable inputs
    that came before it are handled first, then the entity parks on it."""
    calls: list[dict[str, Any]] = []
    app = make_registry(calls)
    client = await cluster.runtime(app, run_worker=False)
    url = "/echo/mixed"
    await client.send(url, "A")
    garbage = (await client.store.redis.xadd(client.store.keys.log(url), {b"e": b"\xc1"})).decode()
    await client.send(url, "B")
    worker = await cluster.runtime(app)
    status = await worker.wait_idle(url, timeout=10)
    assert status.status == "failed" and garbage in status.error
    assert [c["messages"] for c in calls if c["url"] == url] == [["A"]]
    await worker.resume(url, skip_failed=True)
    assert (await worker.wait_idle(url, timeout=10)).status == "idle"
    assert [p for c in calls if c["url"] == url for p in c["messages"]] == ["A", "B"]
    resumed = [e for e in await log_events(worker, url) if isinstance(e, Resumed)]
    assert resumed == [Resumed(skipped=[garbage])]


async def test_unreadable_history_parks_once_naming_every_entry(cluster) -> None:
    calls: list[dict[str, Any]] = []
    app = make_registry(calls)
    rt = await cluster.runtime(app)
    url = "/echo/two-bad"
    states = await handled_with_state_events(rt, url)
    await rewrite_entry(rt, url, states[0], b"\xc1")
    await rewrite_entry(rt, url, states[1], b"\xc1")
    await rt.close()
    cluster.runtimes.remove(rt)
    cold = await cluster.runtime(app)
    for payload in ("d", "e"):  # the second message meets an entity parked already
        await cold.send(url, payload)
        status = await cold.wait_idle(url, timeout=10)
    assert status.status == "failed"
    assert states[0] in status.error and states[1] in status.error
    failed = [e for e in await log_events(cold, url) if isinstance(e, EntityFailed)]
    assert len(failed) == 1 and failed[0].inputs == states[:2]
