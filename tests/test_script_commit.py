"""The fenced scripts (COMMIT, FIRE, CANCEL_TIMER, DELETE), one group each, driven through
the Store's methods and judged by their exact answers and the exact Redis keys they leave,
on both backends. (The lease scripts: test_script_leases.py.)"""

from __future__ import annotations

import asyncio

import anyio
import pytest

from tests.script_helpers import (
    create,
    emptied_log,
    inbox_entries,
    lease,
    log,
    meta,
    partition_keys,
    read_pointer,
    state,
    take_over,
    unacked,
)
from wakeful import FencedError
from wakeful.errors import NotSentError
from wakeful.store import ChainedMark, EntityGoneError
from wakeful.streamids import id_gt

pytestmark = pytest.mark.anyio

URL = "/t/a"


async def woken(store, url: str = URL, *events: bytes) -> tuple[str, list[str], str, str]:
    """A new entity whose pointer a worker holding the lease has read:
    (created, input ids, pointer id, token)."""
    created, ids = await create(store, url, *(events or (b"m1",)))
    pointer = await read_pointer(store, url)
    _, token = await lease(store, url)
    return created, ids, pointer, token


async def next_message(pubsub) -> bytes:
    """The next message published on the subscribed channel (waits up to 5 s)."""
    with anyio.fail_after(5):
        while True:
            message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=1)
            if message is not None:
                return message["data"]


# -- COMMIT ----------------------------------------------------------------------------


def a_commit_of_everything(created: str, cursor: str, pointer: str, member: str) -> dict:
    return {
        "events": [("e", b"E"), ("i", b"I"), ("o", b"O")],
        "cursor": cursor,
        "acks": [pointer],
        "fields": {"attempts": 3},
        "created": created,
        "snapshot": b"SNAP",
        "snapshot_seen": cursor,
        "timers": [(member, 5, b"T")],
        "actions": ["call1"],
    }


async def test_a_commit_under_a_taken_over_lease_is_fenced_and_changes_nothing(store):
    created, [m1], pointer, old = await woken(store)
    p = store.keys.partition(URL)
    new = await take_over(store, p, old)
    commit = a_commit_of_everything(created, m1, pointer, f"{URL}|{created}|t1")
    before = await state(store, URL)
    with pytest.raises(FencedError):
        await store.commit(URL, old, **commit)
    assert await state(store, URL) == before
    # The same commit under the heir's token goes through: the refusal was the fence.
    assert len(await store.commit(URL, new, **commit)) == 3


async def test_a_commit_after_the_lease_expired_is_fenced_before_anyone_takes_over(store):
    created, [m1], pointer, token = await woken(store)
    await store.redis.delete(store.keys.lease(store.keys.partition(URL)))  # the TTL ran out
    commit = a_commit_of_everything(created, m1, pointer, f"{URL}|{created}|t1")
    before = await state(store, URL)
    with pytest.raises(FencedError):
        await store.commit(URL, token, **commit)
    assert await state(store, URL) == before


async def test_a_commit_for_another_incarnation_is_gone_and_changes_nothing(store):
    created, [m1], pointer, token = await woken(store)
    commit = a_commit_of_everything("1-1", m1, pointer, f"{URL}|{created}|t1")
    before = await state(store, URL)
    with pytest.raises(EntityGoneError):
        await store.commit(URL, token, **commit)
    assert await state(store, URL) == before


async def test_a_commit_appends_its_events_in_order_and_answers_their_ids(store):
    created, [m1], _, token = await woken(store)
    before = await meta(store, URL)
    ids = await store.commit(
        URL, token, events=[("e", b"E1"), ("i", b"I"), ("e", b"E2")], created=created
    )
    assert await log(store, URL) == [
        (created, b"C"),
        (m1, b"m1"),
        *zip(ids, [b"E1", b"I", b"E2"], strict=True),
    ]
    # An input moves last_in; plain events move nothing (no outbox: no out_last).
    assert await meta(store, URL) == {**before, "last_in": ids[1]}


async def test_the_final_commit_advances_the_cursor_acknowledges_and_leaves_no_pointer(store):
    created, [_, m2], pointer, token = await woken(store, URL, b"m1", b"m2")
    before = await meta(store, URL)
    assert await store.commit(URL, token, cursor=m2, acks=[pointer], created=created) == []
    after = await meta(store, URL)
    assert "woke" not in after
    assert after == {**{f: v for f, v in before.items() if f != "woke"}, "cursor": m2}
    assert await unacked(store, URL) == []
    assert await inbox_entries(store, URL) == []  # an acknowledged pointer leaves the inbox


async def test_an_acknowledging_commit_with_inputs_after_the_cursor_points_again(store):
    created, [m1, _], pointer, token = await woken(store, URL, b"m1", b"m2")
    await store.commit(URL, token, cursor=m1, acks=[pointer], created=created)
    [again] = await unacked(store, URL)
    assert again != pointer
    assert (await meta(store, URL))["woke"] == "1"
    # Keeping the cursor ('' = keep) with input after it points again too.
    second = await read_pointer(store, URL)
    await store.commit(URL, token, acks=[second], created=created)
    assert len(await unacked(store, URL)) == 1
    assert (await meta(store, URL))["cursor"] == m1


async def test_an_acknowledging_commit_with_undelivered_outbox_points_again(store):
    created, [m1], pointer, token = await woken(store)
    [out] = await store.commit(
        URL, token, events=[("o", b"OUT")], cursor=m1, acks=[pointer], created=created
    )
    m = await meta(store, URL)
    assert (m["out_last"], m["woke"]) == (out, "1")
    [again] = await unacked(store, URL)
    assert [i for i, _ in await inbox_entries(store, URL)] == [again]
    # Delivered (out_done = out_last): the acknowledging commit leaves no pointer.
    await read_pointer(store, URL)
    await store.commit(URL, token, acks=[again], fields={"out_done": out}, created=created)
    assert await unacked(store, URL) == []
    assert "woke" not in await meta(store, URL)


async def test_an_outbox_event_adds_a_pointer_when_none_is_pending(store):
    created, [m1], pointer, token = await woken(store)
    await store.commit(URL, token, cursor=m1, acks=[pointer], created=created)
    assert await unacked(store, URL) == []
    [out] = await store.commit(URL, token, events=[("o", b"OUT")], created=created)
    [again] = await unacked(store, URL)
    assert again == (await inbox_entries(store, URL))[-1][0]
    m = await meta(store, URL)
    assert (m["out_last"], m["woke"]) == (out, "1")


async def test_a_failed_entity_gets_no_pointer_from_its_acknowledging_commit(store):
    created, [_, m2], pointer, token = await woken(store, URL, b"m1", b"m2")
    await store.commit(
        URL,
        token,
        events=[("o", b"OUT")],
        acks=[pointer],
        fields={"status": "failed"},
        created=created,
    )
    assert await unacked(store, URL) == []
    m = await meta(store, URL)
    assert (m["status"], m["cursor"], m["last_in"]) == ("failed", "0-0", m2)
    assert "woke" not in m


async def test_a_commit_acknowledges_every_pointer_it_is_given(store):
    created, _ = await create(store, URL, b"m1")
    [p1] = await unacked(store, URL)
    _, token = await lease(store, URL)
    assert await store.delete(URL, token, created, [])  # p1 left unacknowledged
    again = await store.append_input(URL, "t", created=b"C", events=[("i", b"m2")])
    [_, p2] = await unacked(store, URL)
    assert [i for i, _ in await inbox_entries(store, URL)] == [p1, p2]
    read = await store.read_inbox([store.keys.partition(URL)], "w1", 100, 100)
    assert [(x.entry_id, x.url) for x in read] == [(p1, URL), (p2, URL)]
    await store.commit(URL, token, cursor=again.id, acks=[p1, p2], created=again.created_id)
    assert await unacked(store, URL) == []
    assert "woke" not in await meta(store, URL)


async def test_a_commit_writes_its_fields(store):
    created, _, _, token = await woken(store)
    before = await meta(store, URL)
    await store.commit(URL, token, fields={"attempts": 2, "error": "boom"}, created=created)
    assert await meta(store, URL) == {**before, "attempts": "2", "error": "boom"}


async def test_a_commit_adds_each_timer_once_and_counts_it(store):
    created, _, _, token = await woken(store)
    k = store.keys
    p = k.partition(URL)
    t1, t2 = f"{URL}|{created}|t1", f"{URL}|{created}|t2"
    await store.commit(URL, token, timers=[(t1, 100, b"T1"), (t2, 50, b"T2")], created=created)
    await store.commit(URL, token, timers=[(t1, 999, b"AGAIN")], created=created)
    assert await store.redis.zrange(k.timers(p), 0, -1, withscores=True) == [
        (t2.encode(), 50.0),
        (t1.encode(), 100.0),
    ]
    assert await store.redis.hgetall(k.timerdata(p)) == {t1.encode(): b"T1", t2.encode(): b"T2"}
    assert (await meta(store, URL))["timers"] == "2"
    assert await store.timers_of(URL, created) == [(t2, 50, b"T2"), (t1, 100, b"T1")]


async def test_a_commit_marks_each_action_pending_once_and_counts_it(store):
    created, _, _, token = await woken(store)
    await store.commit(URL, token, actions=["a", "b"], created=created)
    await store.commit(URL, token, actions=["a"], created=created)
    assert await store.redis.hgetall(store.keys.actions(URL)) == {
        b"a": b"pending",
        b"b": b"pending",
    }
    assert (await meta(store, URL))["actions"] == "2"


async def test_a_commit_reopens_a_settled_action_but_never_a_closed_one(store):
    created, _, _, token = await woken(store)
    await store.commit(URL, token, actions=["a", "b"], created=created)
    assert await store.settle_action(URL, "a", b"answer") is not None  # a: settled
    await store.commit(URL, token, closed_actions=[("b", "cancelled")], created=created)
    assert (await meta(store, URL))["actions"] == "0"
    # The run refused a's answer and requested it again; b's run had ended.
    await store.commit(URL, token, actions=["a", "b"], created=created)
    assert await store.redis.hgetall(store.keys.actions(URL)) == {
        b"a": b"pending",
        b"b": b"cancelled",
    }
    assert (await meta(store, URL))["actions"] == "1"


async def test_a_snapshot_covers_the_last_output_of_its_commit(store):
    created, [m1], _, token = await woken(store)
    ids = await store.commit(
        URL,
        token,
        events=[("e", b"E"), ("o", b"O"), ("i", b"I")],
        snapshot=b"S1",
        snapshot_seen=m1,
        snapshot_out="1-1",
        created=created,
    )
    m = await meta(store, URL)
    assert (m["snap_upto"], m["snap_out"]) == (m1, ids[1])  # the input is not an output
    assert await store.snapshot(URL) == b"S1"
    # A commit without outputs keeps the snapshot_out it is given.
    await store.commit(
        URL, token, snapshot=b"S2", snapshot_seen=ids[2], snapshot_out=ids[0], created=created
    )
    m = await meta(store, URL)
    assert (m["snap_upto"], m["snap_out"]) == (ids[2], ids[0])
    assert await store.snapshot(URL) == b"S2"


async def test_a_commit_without_a_snapshot_leaves_the_snapshot_alone(store):
    created, [m1], _, token = await woken(store)
    await store.commit(URL, token, snapshot=b"S1", snapshot_seen=m1, created=created)
    before = await meta(store, URL)
    await store.commit(URL, token, events=[("e", b"E")], created=created)
    assert await store.snapshot(URL) == b"S1"
    m = await meta(store, URL)
    assert (m["snap_upto"], m["snap_out"]) == (before["snap_upto"], before["snap_out"])


async def test_a_commit_that_changes_the_entity_publishes_its_cursor(store):
    created, [m1], pointer, token = await woken(store)
    pubsub = store.redis.pubsub()
    await pubsub.ssubscribe(store.keys.idle_channel(URL))
    try:
        await store.commit(URL, token, events=[("e", b"E")], created=created)  # no change
        await store.commit(URL, token, cursor=m1, acks=[pointer], created=created)
        assert await next_message(pubsub) == m1.encode()
        await store.commit(URL, token, fields={"attempts": 1}, created=created)
        assert await next_message(pubsub) == b""  # changed, cursor kept
    finally:
        await pubsub.aclose()


async def test_an_acknowledging_commit_for_a_deleted_entity_writes_no_metadata(store):
    created, _, pointer, token = await woken(store)
    assert await store.delete(URL, token, created, [])
    await store.commit(URL, token, acks=[pointer])
    assert await unacked(store, URL) == []
    assert await store.meta(URL) == {}
    inbox = store.keys.inbox(store.keys.partition(URL))
    assert await partition_keys(store, URL) == {inbox, await emptied_log(store, URL)}


# -- FIRE and CANCEL_TIMER -------------------------------------------------------------


async def with_timer(store, due: int = 0) -> tuple[str, str, int, str, str]:
    """An idle entity with one timer: (created, last input, partition, token, member)."""
    created, [m1], pointer, token = await woken(store)
    member = f"{URL}|{created}|t1"
    await store.commit(
        URL, token, cursor=m1, acks=[pointer], timers=[(member, due, b"FIRED")], created=created
    )
    assert await unacked(store, URL) == []
    return created, m1, store.keys.partition(URL), token, member


async def test_a_due_timer_fires_once_into_the_log_as_outbox_and_wakes_the_entity(store):
    _, _, p, token, member = await with_timer(store)
    k = store.keys
    assert await store.due_timers([p], 0) == [(p, member)]
    before = await meta(store, URL)
    assert await store.fire_timer(p, token, member) == 1
    [*_, (fired, data)] = await log(store, URL)
    assert data == b"FIRED"
    assert await meta(store, URL) == {**before, "timers": "0", "out_last": fired, "woke": "1"}
    assert await store.redis.zrange(k.timers(p), 0, -1) == []
    assert await store.redis.hgetall(k.timerdata(p)) == {}
    assert await unacked(store, URL) == [(await inbox_entries(store, URL))[-1][0]]
    assert await store.due_timers([p], 0) == []
    after = await state(store, URL)
    assert await store.fire_timer(p, token, member) == 0  # fired already
    assert await state(store, URL) == after


async def test_concurrent_fires_of_one_timer_fire_it_once(store):
    _, _, p, token, member = await with_timer(store)
    before = await log(store, URL)
    answers = await asyncio.gather(*(store.fire_timer(p, token, member) for _ in range(4)))
    assert sorted(answers) == [0, 0, 0, 1]
    assert [e for _, e in await log(store, URL)] == [e for _, e in before] + [b"FIRED"]
    assert (await meta(store, URL))["timers"] == "0"


async def test_a_timer_fired_under_a_taken_over_lease_is_fenced_and_stays(store):
    _, _, p, old, member = await with_timer(store)
    new = await take_over(store, p, old)
    before = await state(store, URL)
    assert await store.fire_timer(p, old, member) == -1
    assert await state(store, URL) == before
    assert await store.fire_timer(p, new, member) == 1


async def test_a_timer_of_a_deleted_entity_fires_as_nothing_and_is_removed(store):
    created, _, p, token, member = await with_timer(store)
    k = store.keys
    assert await store.delete(URL, token, created, [])
    assert await store.fire_timer(p, token, member) == 0
    assert await store.redis.zrange(k.timers(p), 0, -1) == []
    assert await store.redis.hgetall(k.timerdata(p)) == {}
    assert await store.meta(URL) == {}
    assert await partition_keys(store, URL) == {k.inbox(p), await emptied_log(store, URL)}


async def test_a_timer_of_an_old_incarnation_does_not_fire_into_the_new_one(store):
    created, _, p, token, member = await with_timer(store)
    assert await store.delete(URL, token, created, [])
    result = await store.append_input(URL, "t", created=b"C", events=[("i", b"new")])
    assert result.created_id != created
    before = await state(store, URL)
    assert await store.fire_timer(p, token, member) == 0
    after = await state(store, URL)
    assert after[1:7] == before[1:7]  # log, meta, snapshot, actions, inbox, pointers
    assert after[7:9] == ([], {})  # the timer is gone
    k = store.keys
    assert set(after[0]) == set(before[0]) - {k.timers(p), k.timerdata(p)}


async def test_cancelling_a_timer_removes_it_once(store):
    _, _, p, token, member = await with_timer(store)
    k = store.keys
    before = await meta(store, URL)
    assert await store.cancel_timer(URL, token, member) is True
    assert await meta(store, URL) == {**before, "timers": "0"}
    assert await store.redis.zrange(k.timers(p), 0, -1) == []
    assert await store.redis.hgetall(k.timerdata(p)) == {}
    after = await state(store, URL)
    assert await store.cancel_timer(URL, token, member) is False
    assert await store.fire_timer(p, token, member) == 0
    assert await state(store, URL) == after


async def test_cancelling_a_timer_under_a_taken_over_lease_is_fenced_and_it_stays(store):
    _, _, p, old, member = await with_timer(store)
    new = await take_over(store, p, old)
    before = await state(store, URL)
    with pytest.raises(FencedError):
        await store.cancel_timer(URL, old, member)
    assert await state(store, URL) == before
    assert await store.cancel_timer(URL, new, member) is True


# -- DELETE ----------------------------------------------------------------------------


async def test_delete_removes_the_entity_and_acknowledges_its_pointers(store):
    k = store.keys
    p = k.partition(URL)
    other = next(f"/t/o{n}" for n in range(100) if k.partition(f"/t/o{n}") == p)
    await create(store, other, b"x")
    created, [m1], pointer, token = await woken(store)
    await store.commit(
        URL,
        token,
        snapshot=b"S",
        snapshot_seen=m1,
        actions=["call1"],
        timers=[(f"{URL}|{created}|t1", 10**15, b"T")],
        created=created,
    )
    await store.append_input(URL, "t", created=b"C", events=[("i", b"m")], idempotency_key="key")
    keys_before = await partition_keys(store, URL)
    assert {k.log(URL), k.meta(URL), k.snap(URL), k.actions(URL)} <= keys_before
    assert await store.delete(URL, token, created, [pointer]) is True
    # Gone: metadata, snapshot, actions and the type set membership; the pointer is acked.
    # Left: the emptied log and the idempotency key (until their TTLs) and the timer (it
    # fires as nothing).
    assert await partition_keys(store, URL) == {
        await emptied_log(store, URL),
        k.inbox(p),
        k.typeset(p, "t"),
        k.log(other),
        k.meta(other),
        k.idem(URL, "key"),
        k.timers(p),
        k.timerdata(p),
    }
    assert await store.redis.smembers(k.typeset(p, "t")) == {other.encode()}
    assert await unacked(store, URL) == []
    loaded = await store.load(URL, None)
    assert (loaded.meta, loaded.snapshot, loaded.entries) == ({}, None, [])
    assert [e for _, e in await log(store, other)] == [b"C", b"x"]


async def test_delete_of_the_last_entity_of_a_type_leaves_no_type_set(store):
    created, _, pointer, token = await woken(store)
    assert await store.delete(URL, token, created, [pointer]) is True
    inbox = store.keys.inbox(store.keys.partition(URL))
    assert await partition_keys(store, URL) == {inbox, await emptied_log(store, URL)}
    assert await store.entity_urls("t") == []


async def test_delete_publishes_deleted_on_the_entity_channel(store):
    created, _, pointer, token = await woken(store)
    pubsub = store.redis.pubsub()
    await pubsub.ssubscribe(store.keys.idle_channel(URL))
    try:
        assert await store.delete(URL, token, created, [pointer]) is True
        assert await next_message(pubsub) == b"deleted"
    finally:
        await pubsub.aclose()


async def test_delete_of_another_incarnation_answers_gone_and_changes_nothing(store):
    _, _, pointer, token = await woken(store)
    before = await state(store, URL)
    assert await store.delete(URL, token, "1-1", [pointer]) is False
    assert await state(store, URL) == before


async def test_delete_under_a_taken_over_lease_is_fenced_and_changes_nothing(store):
    created, _, pointer, old = await woken(store)
    new = await take_over(store, store.keys.partition(URL), old)
    before = await state(store, URL)
    with pytest.raises(FencedError):
        await store.delete(URL, old, created, [pointer])
    assert await state(store, URL) == before
    assert await store.delete(URL, new, created, [pointer]) is True


async def test_a_recreated_entity_is_a_later_incarnation(store):
    created, _, pointer, token = await woken(store)
    assert await store.delete(URL, token, created, [pointer])
    result = await store.append_input(URL, "t", created=b"C", events=[("i", b"again")])
    assert result.appended
    assert id_gt(result.created_id, created)
    # The old incarnation's writers are refused.
    with pytest.raises(EntityGoneError):
        await store.commit(URL, token, events=[("e", b"E")], created=created)
    assert await store.delete(URL, token, created, []) is False


async def test_delete_removes_the_live_output_too(store):
    created, _, pointer, token = await woken(store)
    await store.append_live(URL, [b"delta"])
    assert await store.delete(URL, token, created, [pointer]) is True
    assert await store.redis.exists(store.keys.live(URL)) == 0


async def test_a_recreated_entity_never_reuses_the_deleted_incarnation(store):
    """Created ids are the incarnation: a stale commit, a stale delete and an old timer are
    refused by it. A delete and a re-create within the millisecond of the creation must not
    give the new entity the old id (up to 1000 quick cycles make that millisecond happen)."""
    reused = []
    for n in range(1000):
        url = f"/t/r{n}"
        old = (await store.append_input(url, "t", created=b"C", events=[("i", b"m")])).created_id
        _, token = await lease(store, url)
        assert await store.delete(url, token, old, [])
        new = (await store.append_input(url, "t", created=b"C", events=[("i", b"m")])).created_id
        if new == old:
            reused.append(url)
            # What the reuse lets through: a writer of the old incarnation is not refused.
            with pytest.raises(EntityGoneError):
                await store.commit(url, token, events=[("e", b"STALE")], created=old)
            break
    assert reused == []


async def test_cancelling_a_timer_of_a_deleted_entity_writes_no_metadata(store):
    created, _, p, token, member = await with_timer(store)
    assert await store.delete(URL, token, created, [])
    assert await store.cancel_timer(URL, token, member) is True
    assert await store.redis.zrange(store.keys.timers(p), 0, -1) == []
    assert await store.meta(URL) == {}


# -- COMMIT with its outbox's sends (SEND_AFTER, SEND_WAKE_AFTER) -----------------------


def sends_to(store, *targets: str):
    """One send of a message to each target (a new entity), as a delivery makes them."""
    return [
        store.send_call(
            target, target.split("/")[1], created=b"C", events=[("i", f"to {target}".encode())]
        )
        for target in targets
    ]


async def test_the_sends_of_a_commit_go_with_it_and_each_answers(store):
    if store.router is not None:
        pytest.skip("on a cluster the sends go after the commit")
    created, _, _, token = await woken(store)
    calls = sends_to(store, "/t/b", "/t/c")
    ids = await store.commit(URL, token, events=[("o", b"O")], created=created, sends=calls)
    assert len(ids) == 1
    for call, target in zip(calls, ("/t/b", "/t/c"), strict=True):
        result = store.send_result(call, call.reply)
        assert result.appended
        assert [e for _, e in await log(store, target)] == [b"C", f"to {target}".encode()]


async def test_a_fenced_commit_runs_none_of_its_sends(store):
    """The sends check the chain the commit starts: a commit refused (its lease taken
    over) leaves them nothing to find, and they write nothing."""
    if store.router is not None:
        pytest.skip("on a cluster the sends go after the commit")
    created, _, _, old = await woken(store)
    await take_over(store, store.keys.partition(URL), old)
    calls = sends_to(store, "/t/b", "/t/c")
    before = await state(store, URL)
    with pytest.raises(FencedError):
        await store.commit(URL, old, events=[("o", b"O")], created=created, sends=calls)
    assert await state(store, URL) == before
    for call in calls:
        assert int(call.reply[0]) == -4  # not sent
        with pytest.raises(NotSentError):
            store.send_result(call, call.reply)
    assert await log(store, "/t/b") == [] and await log(store, "/t/c") == []


async def test_a_send_that_errors_stops_the_sends_after_it(store):
    """A send whose script errors (here its target's log is not a stream) breaks the
    chain: the sends after it write nothing and say so, so the worker can make them
    itself, in order; those before it stand."""
    if store.router is not None:
        pytest.skip("on a cluster the sends go after the commit")
    created, _, _, token = await woken(store)
    await store.redis.set(store.keys.log("/t/c"), "not a stream")
    first, broken, after = calls = sends_to(store, "/t/b", "/t/c", "/t/d")
    await store.commit(URL, token, events=[("o", b"O")], created=created, sends=calls)
    assert store.send_result(first, first.reply).appended
    assert isinstance(broken.reply, Exception)
    with pytest.raises(NotSentError):
        store.send_result(after, after.reply)
    assert await log(store, "/t/d") == []
    assert [e for _, e in await log(store, "/t/b")] == [b"C", b"to /t/b"]


# -- the delivery's mark at the chain's end (a COMMIT with a guard) -----------------------


async def test_the_mark_behind_the_sends_records_the_outbox_delivered_and_acknowledges(store):
    """Every send ran and none was refused: the mark behind them records the outbox the
    commit wrote as delivered and acknowledges the wake's pointer, which leaves no new
    one (nothing is left to do)."""
    if store.router is not None:
        pytest.skip("on a cluster the sends go after the commit")
    created, ids, pointer, token = await woken(store)
    mark = ChainedMark([pointer])
    outbox = await store.commit(
        URL,
        token,
        events=[("o", b"O")],
        cursor=ids[-1],
        created=created,
        sends=sends_to(store, "/t/b", "/t/c"),
        mark=mark,
    )
    assert mark.done
    fields = await meta(store, URL)
    assert fields["out_done"] == fields["out_last"] == outbox[0]
    assert await unacked(store, URL) == []
    assert "woke" not in fields
    assert [f for _, f in await inbox_entries(store, URL) if f == {b"u": URL.encode()}] == []


async def test_a_refused_send_leaves_the_mark_to_the_worker(store):
    """A send the target refuses (other args) passes the chain on, so the sends after it
    run, but the mark does not: the worker marks the outbox with the refusal as the
    sender's input."""
    if store.router is not None:
        pytest.skip("on a cluster the sends go after the commit")
    created, ids, pointer, token = await woken(store)
    await store.append_input("/t/b", "t", created=b"C", args=b"A", mode="create")
    refused = store.send_call("/t/b", "t", created=b"C", args=b"other", mode="create")
    after = sends_to(store, "/t/c")
    mark = ChainedMark([pointer])
    await store.commit(
        URL,
        token,
        events=[("o", b"O")],
        cursor=ids[-1],
        created=created,
        sends=[refused, *after],
        mark=mark,
    )
    assert int(refused.reply[0]) == -1
    assert store.send_result(after[0], after[0].reply).appended
    assert not mark.done
    fields = await meta(store, URL)
    assert "out_done" not in fields
    assert await unacked(store, URL) == [pointer]


@pytest.mark.parametrize("broken", ["fenced", "a send errors"])
async def test_a_chain_that_broke_runs_no_mark(store, broken):
    if store.router is not None:
        pytest.skip("on a cluster the sends go after the commit")
    created, _, pointer, token = await woken(store)
    if broken == "fenced":
        await take_over(store, store.keys.partition(URL), token)
    else:
        await store.redis.set(store.keys.log("/t/c"), "not a stream")
    mark = ChainedMark([pointer])
    before = await state(store, URL)
    try:
        await store.commit(
            URL,
            token,
            events=[("o", b"O")],
            created=created,
            sends=sends_to(store, "/t/b", "/t/c"),
            mark=mark,
        )
    except FencedError:
        assert broken == "fenced"
        assert await state(store, URL) == before
    assert not mark.done
    assert "out_done" not in await meta(store, URL)
    assert await unacked(store, URL) == [pointer]


@pytest.mark.parametrize("chained", [False, True], ids=["separate-mark", "chained-mark"])
async def test_a_mark_never_moves_out_done_past_an_outbox_still_undelivered(store, chained):
    """A timer fires while a wake runs (its outbox T is undelivered), and the wake then
    commits an outbox X and delivers it: X's mark must not move out_done past T, or T
    would never be delivered. It points the entity again; the next wake delivers T and
    X (again: the keys make it a no-op) in order, and the marks then move out_done."""
    if chained and store.router is not None:
        pytest.skip("on a cluster the sends go after the commit")
    created, ids, pointer, token = await woken(store)
    p = store.keys.partition(URL)
    member = f"{URL}|{created}|t1"
    await store.commit(URL, token, timers=[(member, 0, b"FIRED")], created=created)
    assert await store.fire_timer(p, token, member) == 1  # the wake still runs
    fired = (await meta(store, URL))["out_last"]
    commit = {"events": [("o", b"O")], "cursor": ids[-1], "created": created}
    if chained:
        mark = ChainedMark([pointer])
        [outbox] = await store.commit(
            URL, token, **commit, sends=sends_to(store, "/t/b"), mark=mark
        )
        assert mark.done  # it ran, and left out_done alone
    else:
        [outbox] = await store.commit(URL, token, **commit)
        await store.commit(URL, token, acks=[pointer], created=created, delivered=outbox)
    assert "out_done" not in await meta(store, URL)
    [again] = await unacked(store, URL)  # pointed again: out_last is past out_done
    assert again != pointer
    await store.commit(URL, token, created=created, delivered=fired)
    assert (await meta(store, URL))["out_done"] == fired
    await store.commit(URL, token, acks=[again], created=created, delivered=outbox)
    fields = await meta(store, URL)
    assert fields["out_done"] == fields["out_last"] == outbox
    assert await unacked(store, URL) == []


async def test_a_mark_never_moves_out_done_back(store):
    created, _, _, token = await woken(store)
    [first] = await store.commit(URL, token, events=[("o", b"1")], created=created)
    [second] = await store.commit(URL, token, events=[("o", b"2")], created=created)
    await store.commit(URL, token, created=created, delivered=first)
    await store.commit(URL, token, created=created, delivered=second)
    await store.commit(URL, token, created=created, delivered=first)  # late, or repeated
    assert (await meta(store, URL))["out_done"] == second


@pytest.mark.parametrize("garbage", ["", "junk", "1-0", "a-b c-d", "\xff\xfe", "<it> junk"])
async def test_a_mark_reads_a_corrupted_out_wait_as_no_wait(store, garbage):
    """``out_wait`` written over by hand (or by a bug) with something that is not
    "<id> <id>" (or names the outbox, and then no id): the mark does not fail on it,
    and moves out_done as without it."""
    created, _, _, token = await woken(store)
    [outbox] = await store.commit(URL, token, events=[("o", b"O")], created=created)
    garbage = garbage.replace("<it>", outbox)
    await store.redis.hset(store.keys.meta(URL), "out_wait", garbage)
    await store.commit(URL, token, created=created, delivered=outbox)
    assert (await meta(store, URL))["out_done"] == outbox
