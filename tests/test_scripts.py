"""The SEND, LOAD and SETTLE scripts, one group each, and the one-pointer invariant across
every script that adds a wake pointer. The scripts are driven through the Store's methods
and judged by their exact answers and the exact Redis keys they leave, on both backends.
(COMMIT, FIRE, CANCEL_TIMER, DELETE: test_script_commit.py; leases: test_script_leases.py.)"""

from __future__ import annotations

import asyncio
import random

import pytest

from tests.script_helpers import (
    create,
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
from wakeful import ArgsConflictError
from wakeful.keys import GROUP
from wakeful.store import Pointer, ReadAs, SendResult, TargetMissingError
from wakeful.streamids import id_gt

pytestmark = pytest.mark.anyio

URL = "/t/a"


def entity_keys(store, url: str, *extra: str) -> set[str]:
    k = store.keys
    p = k.partition(url)
    return {k.inbox(p), k.log(url), k.meta(url), k.typeset(p, url.split("/")[1]), *extra}


# -- SEND ------------------------------------------------------------------------------


async def test_send_to_a_new_entity_creates_it_appends_the_events_and_adds_one_pointer(store):
    k = store.keys
    result = await store.append_input(
        URL, "t", created=b"C", events=[("i", b"m1"), ("e", b"x"), ("i", b"m2"), ("e", b"y")]
    )
    entries = await log(store, URL)
    assert [e for _, e in entries] == [b"C", b"m1", b"x", b"m2", b"y"]
    ids = [i for i, _ in entries]
    assert result == SendResult(id=ids[4], created_id=ids[0], appended=True)
    assert await meta(store, URL) == {
        "type": "t",
        "status": "active",
        "cursor": "0-0",
        "args": "",
        "parent": "",
        "created": ids[0],
        "last_in": ids[3],  # the last input, not the last event
        "woke": "1",
    }
    assert await store.redis.smembers(k.typeset(k.partition(URL), "t")) == {URL.encode()}
    [(pointer, fields)] = await inbox_entries(store, URL)
    assert fields == {b"u": URL.encode()}
    assert await unacked(store, URL) == [pointer]
    assert await partition_keys(store, URL) == entity_keys(store, URL)  # no idempotency key


async def test_send_without_input_events_leaves_last_in_at_the_creation(store):
    result = await store.append_input(URL, "t", created=b"C", events=[("e", b"x")])
    ids = [i for i, _ in await log(store, URL)]
    assert result == SendResult(ids[1], ids[0], True)
    assert (await meta(store, URL))["last_in"] == ids[0]


async def test_send_to_an_existing_entity_appends_without_a_second_creation_or_pointer(store):
    created, _ = await create(store, URL, b"m1")
    result = await store.append_input(URL, "t", created=b"C2", events=[("i", b"m2")])
    entries = await log(store, URL)
    assert [e for _, e in entries] == [b"C", b"m1", b"m2"]
    assert result == SendResult(entries[2][0], created, True)
    m = await meta(store, URL)
    assert (m["created"], m["last_in"], m["woke"]) == (created, entries[2][0], "1")
    assert len(await unacked(store, URL)) == 1
    assert len(await inbox_entries(store, URL)) == 1


async def test_a_new_idempotency_key_is_stored_with_the_event_id_and_the_ttl(store):
    k = store.keys
    result = await store.append_input(
        URL, "t", created=b"C", events=[("i", b"m1")], idempotency_key="key1"
    )
    assert result.appended
    assert await store.redis.get(k.idem(URL, "key1")) == result.id.encode()
    ttl = await store.redis.pttl(k.idem(URL, "key1"))
    assert 0 < ttl <= store.idempotency_ttl_ms
    assert await partition_keys(store, URL) == entity_keys(store, URL, k.idem(URL, "key1"))


async def test_a_duplicate_idempotency_key_is_answered_with_the_original_id_and_writes_nothing(
    store,
):
    first = await store.append_input(
        URL, "t", created=b"C", events=[("i", b"m1")], idempotency_key="key1"
    )
    before = await state(store, URL)
    again = await store.append_input(
        URL, "t", created=b"C", events=[("i", b"other payload")], idempotency_key="key1"
    )
    assert again == SendResult(first.id, first.created_id, appended=False)
    assert await state(store, URL) == before
    # Another key (or none) is a new message.
    third = await store.append_input(URL, "t", created=b"C", events=[("i", b"m3")])
    assert third.appended and third.id != first.id
    assert [e for _, e in await log(store, URL)] == [b"C", b"m1", b"m3"]


async def test_concurrent_sends_with_one_idempotency_key_append_once(store):
    results = await asyncio.gather(
        *(
            store.append_input(URL, "t", created=b"C", events=[("i", b"m")], idempotency_key="k")
            for _ in range(5)
        )
    )
    [first] = [r for r in results if r.appended]
    assert results == [
        first if r.appended else SendResult(first.id, first.created_id, False) for r in results
    ]
    assert [e for _, e in await log(store, URL)] == [b"C", b"m"]
    assert len(await unacked(store, URL)) == 1


async def test_a_retried_create_with_its_idempotency_key_is_a_duplicate_even_with_other_args(
    store,
):
    """The idempotency key is checked before the args: the retry gets the original's answer."""
    first = await store.append_input(
        URL,
        "t",
        created=b"C",
        events=[("i", b"m")],
        args=b"A1",
        mode="create",
        idempotency_key="k",
    )
    before = await state(store, URL)
    again = await store.append_input(
        URL,
        "t",
        created=b"C",
        events=[("i", b"m")],
        args=b"A2",
        mode="create",
        idempotency_key="k",
    )
    assert again == SendResult(first.id, first.created_id, appended=False)
    assert await state(store, URL) == before


async def test_an_idempotency_key_of_one_entity_does_not_dedupe_another(store):
    a = await store.append_input(
        "/t/a", "t", created=b"C", events=[("i", b"m")], idempotency_key="k"
    )
    b = await store.append_input(
        "/t/b", "t", created=b"C", events=[("i", b"m")], idempotency_key="k"
    )
    assert a.appended and b.appended
    assert [e for _, e in await log(store, "/t/b")] == [b"C", b"m"]


@pytest.mark.parametrize("identity", [None, {"user": "alice"}])
async def test_a_key_with_a_colon_does_not_dedupe_an_entity_whose_id_continues_the_url(
    store, identity
):
    """``idem:<url>:<key>`` was one string for /t/k + key ``x:y`` and /t/k:x + key ``y``
    (an id may hold ':'): in one partition, the second send was answered with the
    first entity's event id and dropped, and /t/k:x was never created."""
    k = store.keys
    first, second = next(
        (f"/t/k{i}", f"/t/k{i}:x")
        for i in range(1000)
        if k.partition(f"/t/k{i}") == k.partition(f"/t/k{i}:x")
    )
    a = await store.append_input(
        first,
        "t",
        created=b"C",
        events=[("i", b"a")],
        idempotency_key="x:y",
        idempotency_identity=identity,
    )
    b = await store.append_input(
        second,
        "t",
        created=b"C",
        events=[("i", b"b")],
        idempotency_key="y",
        idempotency_identity=identity,
    )
    assert a.appended and b.appended
    assert [e for _, e in await log(store, second)] == [b"C", b"b"]


async def test_an_idempotency_key_holding_no_event_id_does_not_drop_the_send(store):
    """A key whose value is not an event id (written by hand, a damaged restore) was
    taken for an earlier send: the message was dropped and ``garbage`` answered as its
    id. Only an event id counts; the send goes through and the key is set right."""
    k = store.keys
    await store.redis.set(k.idem("/t/g", "k1"), b"garbage")
    sent = await store.append_input(
        "/t/g", "t", created=b"C", events=[("i", b"m")], idempotency_key="k1"
    )
    assert sent.appended
    assert [e for _, e in await log(store, "/t/g")] == [b"C", b"m"]
    assert await store.redis.get(k.idem("/t/g", "k1")) == sent.id.encode()
    again = await store.append_input(
        "/t/g", "t", created=b"C", events=[("i", b"m")], idempotency_key="k1"
    )
    assert not again.appended and again.id == sent.id


async def test_create_makes_the_entity_with_its_args_and_parent(store):
    result = await store.append_input(
        URL, "t", created=b"C", events=[], args=b"A1", parent="/p/x", mode="create"
    )
    [(created, event)] = await log(store, URL)
    assert (event, result) == (b"C", SendResult(created, created, True))
    m = await meta(store, URL)
    assert (m["args"], m["parent"], m["last_in"], m["woke"]) == ("A1", "/p/x", created, "1")
    assert len(await unacked(store, URL)) == 1


async def test_create_with_the_same_args_delivers_its_events_like_a_send(store):
    created, _ = await create(store, URL, args=b"A1", mode="create")
    result = await store.append_input(
        URL, "t", created=b"C", events=[("i", b"hello")], args=b"A1", mode="create"
    )
    entries = await log(store, URL)
    assert [e for _, e in entries] == [b"C", b"hello"]
    assert result == SendResult(entries[1][0], created, True)
    assert len(await unacked(store, URL)) == 1


async def test_create_with_other_args_is_a_conflict_and_writes_nothing(store):
    await create(store, URL, args=b"A1", mode="create")
    before = await state(store, URL)
    with pytest.raises(ArgsConflictError):
        await store.append_input(
            URL, "t", created=b"C", events=[("i", b"hello")], args=b"A2", mode="create"
        )
    assert await state(store, URL) == before


async def test_a_send_that_is_not_a_create_ignores_the_args_of_an_existing_entity(store):
    created, _ = await create(store, URL, args=b"A1", mode="create")
    result = await store.append_input(URL, "t", created=b"C", events=[("i", b"m")], args=b"A2")
    assert result.appended and result.created_id == created
    assert (await meta(store, URL))["args"] == "A1"


async def test_an_existing_only_send_to_a_missing_entity_raises_and_creates_no_key(store):
    before = await partition_keys(store, URL)
    with pytest.raises(TargetMissingError):
        await store.append_input(URL, "t", created=b"C", events=[("i", b"m")], mode="existing")
    assert (
        await partition_keys(store, URL) == before == {store.keys.inbox(store.keys.partition(URL))}
    )


async def test_an_existing_only_send_to_an_entity_appends(store):
    created, _ = await create(store, URL)
    result = await store.append_input(URL, "t", created=b"C", events=[("i", b"m")], mode="existing")
    assert result == SendResult((await log(store, URL))[-1][0], created, True)


async def test_a_send_to_a_deleted_entity_creates_a_new_incarnation(store):
    old, _ = await create(store, URL, b"m1")
    ptr = await read_pointer(store, URL)
    _, token = await lease(store, URL)
    assert await store.delete(URL, token, old, [ptr])
    with pytest.raises(TargetMissingError):
        await store.append_input(URL, "t", created=b"C", events=[("i", b"m")], mode="existing")
    result = await store.append_input(URL, "t", created=b"C", events=[("i", b"m2")])
    entries = await log(store, URL)
    assert [e for _, e in entries] == [b"C", b"m2"]  # nothing of the old log
    assert result == SendResult(entries[1][0], entries[0][0], True)
    assert result.created_id != old
    m = await meta(store, URL)
    assert (m["created"], m["cursor"], m["woke"]) == (entries[0][0], "0-0", "1")
    assert await unacked(store, URL) == [(await inbox_entries(store, URL))[-1][0]]


async def test_an_idempotency_key_outlives_a_delete_so_a_retried_send_does_not_recreate(store):
    """A retry of a message the deleted entity already had is answered as a duplicate (with
    the old id and no incarnation) and does not bring the entity back."""
    first = await store.append_input(
        URL, "t", created=b"C", events=[("i", b"m1")], idempotency_key="key1"
    )
    ptr = await read_pointer(store, URL)
    _, token = await lease(store, URL)
    assert await store.delete(URL, token, first.created_id, [ptr])
    before = await state(store, URL)
    again = await store.append_input(
        URL, "t", created=b"C", events=[("i", b"m1")], idempotency_key="key1"
    )
    assert again == SendResult(first.id, "", appended=False)
    assert await state(store, URL) == before
    assert await store.meta(URL) == {}


# -- SEND_WAKE: a send that reads its partition's new pointers for the lease holder ----


def one_redis(store) -> None:
    if store.router is not None:
        pytest.skip("on a cluster a send never reads (the doorbell wakes the reader)")


async def test_a_send_read_as_the_lease_holder_brings_back_its_pointer_with_the_entity(store):
    one_redis(store)
    p, token = await lease(store, URL)
    read_as = ReadAs(token, "w1", 32)
    await store.append_input(URL, "t", created=b"C", events=[("i", b"m1")], read_as=read_as)
    assert read_as.replied
    [pointer] = read_as.read
    assert isinstance(pointer, Pointer) and pointer.url == URL and pointer.preload is not None
    assert pointer.preload.loaded.meta["woke"] == b"1"
    assert [f[b"e"] for _, f in pointer.preload.loaded.entries] == [b"C", b"m1"]
    assert await unacked(store, URL) == [pointer.entry_id]  # pending for w1 until a commit
    assert await store.read_inbox([p], "w2", 100, 1) == []  # and no other reader gets it


async def test_a_send_read_as_a_lease_no_longer_held_reads_nothing(store):
    one_redis(store)
    p, token = await lease(store, URL)
    await take_over(store, p, token)
    read_as = ReadAs(token, "w1", 32)
    result = await store.append_input(
        URL, "t", created=b"C", events=[("i", b"m1")], read_as=read_as
    )
    assert result.appended and read_as.replied and read_as.read == []
    assert await read_pointer(store, URL, "heir")  # the new owner reads it


async def test_a_refused_send_read_as_the_lease_holder_reads_nothing(store):
    one_redis(store)
    p = store.keys.partition(URL)
    other = next(f"/t/b{n}" for n in range(1000) if store.keys.partition(f"/t/b{n}") == p)
    await create(store, other, b"m")
    _, token = await lease(store, URL)
    read_as = ReadAs(token, "w1", 32)
    with pytest.raises(TargetMissingError):
        await store.append_input(URL, "t", created=b"C", mode="existing", read_as=read_as)
    assert read_as.replied and read_as.read == []
    assert await read_pointer(store, other)  # the neighbour's pointer is still new


async def test_a_send_read_as_the_lease_holder_without_the_inbox_group_still_sends(store):
    """The read fails (the group is gone: a Redis that lost it); the send stands, its
    pointer is left to the worker's inbox read, which makes the group again."""
    one_redis(store)
    p, token = await lease(store, URL)
    await store.redis.xgroup_destroy(store.keys.inbox(p), GROUP)
    read_as = ReadAs(token, "w1", 32)
    result = await store.append_input(
        URL, "t", created=b"C", events=[("i", b"m1")], read_as=read_as
    )
    assert result.appended and read_as.replied and read_as.read == []
    assert [e for _, e in await log(store, URL)] == [b"C", b"m1"]
    read = await store.read_wake_pointers([p], "w1", 100, 1)  # makes the group again
    read = read or await store.read_wake_pointers([p], "w1", 100, 1)
    assert [ptr.url for ptr in read] == [URL]


# -- LOAD ------------------------------------------------------------------------------


async def test_load_of_a_missing_entity_is_empty(store):
    loaded = await store.load(URL, None)
    assert (loaded.meta, loaded.snapshot, loaded.entries) == ({}, None, [])


async def test_a_cold_load_without_a_snapshot_reads_the_whole_log(store):
    created, [m1, m2] = await create(store, URL, b"m1", b"m2")
    loaded = await store.load(URL, None)
    assert {f: v.decode() for f, v in loaded.meta.items()} == await meta(store, URL)
    assert loaded.snapshot is None
    assert loaded.entries == [(created, {b"e": b"C"}), (m1, {b"e": b"m1"}), (m2, {b"e": b"m2"})]


async def test_a_cold_load_reads_the_snapshot_and_the_log_after_it(store):
    created, [_m1, m2, m3] = await create(store, URL, b"m1", b"m2", b"m3")
    _, token = await lease(store, URL)
    [done] = await store.commit(
        URL, token, events=[("e", b"state")], snapshot=b"SNAP", snapshot_seen=m2, created=created
    )
    loaded = await store.load(URL, None)
    assert loaded.snapshot == b"SNAP"
    assert loaded.meta["snap_upto"] == m2.encode()
    assert loaded.entries == [(m3, {b"e": b"m3"}), (done, {b"e": b"state"})]


async def test_a_warm_load_reads_after_its_position_and_not_the_snapshot(store):
    created, [m1, m2, m3] = await create(store, URL, b"m1", b"m2", b"m3")
    _, token = await lease(store, URL)
    await store.commit(URL, token, snapshot=b"SNAP", snapshot_seen=m3, created=created)
    loaded = await store.load(URL, m1)
    assert loaded.snapshot is None
    assert loaded.entries == [(m2, {b"e": b"m2"}), (m3, {b"e": b"m3"})]
    assert (await store.load(URL, m3)).entries == []


async def test_a_load_longer_than_a_page_returns_every_entry_in_order(store):
    created, ids = await create(store, URL, *(f"m{i}".encode() for i in range(7)))
    loaded = await store.load(URL, None, page=3)
    assert [i for i, _ in loaded.entries] == [created, *ids]
    assert [f[b"e"] for _, f in loaded.entries] == [b"C", *(f"m{i}".encode() for i in range(7))]
    assert [i for i, _ in (await store.load(URL, created, page=2)).entries] == ids


# -- SETTLE ----------------------------------------------------------------------------


async def pending_action(store, url: str, call: str = "call1") -> str:
    """An entity whose wake left a pending action and acknowledged its pointer."""
    created, [m1] = await create(store, url, b"m1")
    ptr = await read_pointer(store, url)
    _, token = await lease(store, url)
    await store.commit(url, token, cursor=m1, acks=[ptr], actions=[call], created=created)
    assert await unacked(store, url) == []
    return created


async def test_settling_a_pending_action_appends_the_answer_as_input_and_wakes_the_entity(store):
    created = await pending_action(store, URL)
    assert await store.redis.hgetall(store.keys.actions(URL)) == {b"call1": b"pending"}
    assert (await meta(store, URL))["actions"] == "1"
    answer = await store.settle_action(URL, "call1", b"ANSWER")
    assert answer == (await log(store, URL))[-1][0]
    assert (await log(store, URL))[-1] == (answer, b"ANSWER")
    assert await store.redis.hgetall(store.keys.actions(URL)) == {b"call1": b"settled"}
    m = await meta(store, URL)
    assert (m["actions"], m["last_in"], m["woke"], m["created"]) == ("0", answer, "1", created)
    assert await unacked(store, URL) == [(await inbox_entries(store, URL))[-1][0]]


async def test_a_second_settle_of_the_same_action_is_refused_and_writes_nothing(store):
    await pending_action(store, URL)
    first = await store.settle_action(URL, "call1", b"ANSWER")
    assert first is not None
    before = await state(store, URL)
    assert await store.settle_action(URL, "call1", b"LATE ANSWER") is None
    assert await state(store, URL) == before
    assert (await meta(store, URL))["actions"] == "0"


async def test_of_concurrent_settles_of_one_action_exactly_one_wins(store):
    await pending_action(store, URL)
    answers = await asyncio.gather(
        *(store.settle_action(URL, "call1", f"A{n}".encode()) for n in range(4))
    )
    [winner] = [a for a in answers if a is not None]
    assert answers.count(None) == 3
    [*_, last] = await log(store, URL)
    assert last[0] == winner and last[1] in {b"A0", b"A1", b"A2", b"A3"}
    assert len(await log(store, URL)) == 3  # created, m1, the one answer
    assert (await meta(store, URL))["actions"] == "0"


async def test_settling_an_unknown_action_is_refused_and_writes_nothing(store):
    await pending_action(store, URL)
    before = await state(store, URL)
    assert await store.settle_action(URL, "no-such-call", b"ANSWER") is None
    assert await store.settle_action("/t/missing", "call1", b"ANSWER") is None
    assert await state(store, URL) == before
    assert await store.meta("/t/missing") == {}


async def test_settling_an_action_of_a_deleted_entity_is_refused_and_recreates_nothing(store):
    created = await pending_action(store, URL)
    _, token = await lease(store, URL)
    assert await store.delete(URL, token, created, [])
    before = await state(store, URL)
    assert await store.settle_action(URL, "call1", b"ANSWER") is None
    assert await state(store, URL) == before
    assert await store.meta(URL) == {}


# -- the one-pointer invariant ------------------------------------------------------------


async def test_every_script_that_points_adds_no_second_pointer_while_one_is_unacknowledged(
    store,
):
    """Sends, creates, settles, outbox commits and fired timers each add a pointer only if
    there is none: while the first is unread, and while it is read but not acknowledged."""
    created, _ = await create(store, URL, b"m1")
    [first] = await unacked(store, URL)
    p, token = await lease(store, URL)
    member = f"{URL}|{created}|t1"
    await store.commit(URL, token, actions=["call1", "call2"], created=created)
    await store.commit(URL, token, timers=[(member, 0, b"FIRED")], created=created)

    async def every_pointing_script(n: int) -> None:
        await store.append_input(URL, "t", created=b"C", events=[("i", b"s")])
        await store.append_input(
            URL, "t", created=b"C", events=[("i", b"k")], idempotency_key=f"k{n}"
        )
        await store.append_input(URL, "t", created=b"C", events=[("i", b"c")], mode="create")
        await store.append_input(URL, "t", created=b"C", events=[("i", b"x")], mode="existing")
        await store.commit(URL, token, events=[("o", b"OUT")], created=created)
        assert await store.settle_action(URL, f"call{n}", b"ANSWER") is not None

    await every_pointing_script(1)
    assert await store.fire_timer(p, token, member) == 1
    assert await unacked(store, URL) == [first]  # unread
    assert await read_pointer(store, URL) == first
    await every_pointing_script(2)
    assert await unacked(store, URL) == [first]  # read, not acknowledged
    assert len(await inbox_entries(store, URL)) == 1
    assert (await meta(store, URL))["woke"] == "1"


async def test_the_commit_that_acknowledges_the_pointer_adds_exactly_one_for_work_left(store):
    created, [m1] = await create(store, URL, b"m1")
    first = await read_pointer(store, URL)
    _, token = await lease(store, URL)
    for n in range(5):  # inputs that arrive during the wake: no pointer yet
        await store.append_input(URL, "t", created=b"C", events=[("i", f"late{n}".encode())])
    await store.commit(URL, token, cursor=m1, acks=[first], created=created)
    [second] = await unacked(store, URL)
    assert second != first
    assert [i for i, _ in await inbox_entries(store, URL)] == [second]  # first acknowledged: gone
    assert (await meta(store, URL))["woke"] == "1"


async def test_resume_of_a_failed_entity_adds_a_pointer(client, store):
    created, _ = await create(store, URL, b"m1")
    ptr = await read_pointer(store, URL)
    _, token = await lease(store, URL)
    await store.commit(URL, token, acks=[ptr], fields={"status": "failed"}, created=created)
    assert await unacked(store, URL) == []
    await client.resume(URL)
    [pointer] = await unacked(store, URL)
    m = await meta(store, URL)
    assert (m["status"], m["cursor"], m["woke"], m["attempts"]) == ("active", "0-0", "1", "0")
    assert pointer == (await inbox_entries(store, URL))[-1][0]


async def test_resume_adds_no_second_pointer_while_one_is_unacknowledged(client, store):
    created, _ = await create(store, URL, b"m1")
    ptr = await read_pointer(store, URL)
    _, token = await lease(store, URL)
    await store.commit(URL, token, acks=[ptr], fields={"status": "failed"}, created=created)
    await store.append_input(URL, "t", created=b"C", events=[("i", b"while failed")])
    [pending] = await unacked(store, URL)
    await client.resume(URL)
    assert await unacked(store, URL) == [pending]


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_any_mix_of_pointing_scripts_keeps_at_most_one_pointer_and_one_while_work_is_left(
    store, seed
):
    """A seeded random run of what senders, a worker and its timers do to one entity. After
    every step: at most one unacknowledged pointer, marked by woke; and one whenever input is
    after the cursor or outbox is undelivered."""
    rng = random.Random(seed)
    created, _ = await create(store, URL, b"m0")
    p, token = await lease(store, URL)
    held: list[str] = []  # pointers the worker has read and not acknowledged
    seen_in = ""  # the last input the worker's wake saw
    calls = timers = 0
    steps: list[str] = []
    for _ in range(60):
        step = rng.choice(
            ["send", "dup", "create", "read", "ack", "outbox", "deliver", "timer", "settle"]
        )
        steps.append(step)
        if step == "send":
            await store.append_input(URL, "t", created=b"C", events=[("i", b"m")])
        elif step == "dup":
            key = f"k{rng.randrange(3)}"
            await store.append_input(
                URL, "t", created=b"C", events=[("i", b"d")], idempotency_key=key
            )
        elif step == "create":
            await store.append_input(URL, "t", created=b"C", events=[("i", b"c")], mode="create")
        elif step == "read":
            held += [x.entry_id for x in await store.read_inbox([p], "w1", 10, 100)]
            seen_in = (await meta(store, URL))["last_in"]
        elif step == "ack" and held:
            out = [("o", b"OUT")] if rng.random() < 0.3 else []
            await store.commit(URL, token, events=out, cursor=seen_in, acks=held, created=created)
            held = []
        elif step == "outbox":
            await store.commit(URL, token, events=[("o", b"OUT")], created=created)
        elif step == "deliver":
            out_last = (await meta(store, URL)).get("out_last")
            if out_last:
                await store.commit(URL, token, fields={"out_done": out_last}, created=created)
        elif step == "timer":
            timers += 1
            member = f"{URL}|{created}|t{timers}"
            await store.commit(URL, token, timers=[(member, 0, b"T")], created=created)
            assert await store.fire_timer(p, token, member) == 1
        elif step == "settle":
            calls += 1
            await store.commit(URL, token, actions=[f"c{calls}"], created=created)
            assert await store.settle_action(URL, f"c{calls}", b"A") is not None
        m = await meta(store, URL)
        pointers = await unacked(store, URL)
        work = id_gt(m["last_in"], m["cursor"]) or id_gt(
            m.get("out_last", "0-0"), m.get("out_done", "0-0")
        )
        assert len(pointers) <= 1, steps
        assert ("woke" in m) == (len(pointers) == 1), steps
        assert not work or len(pointers) == 1, steps
