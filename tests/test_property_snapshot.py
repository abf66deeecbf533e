"""State rebuilt from a snapshot plus the log tail equals state folded from the whole log.

The worker snapshots the state *after* a wake's writes, while the snapshot's
read position (``snap_upto``) is the last entry the wake read, so a later load
reads the wake's own state events again. ``EntityState.fold`` skips outputs at
or before the snapshot's ``applied`` id; beneath that, every op sets or deletes
a whole row, so even re-applying any suffix of the log must leave the state
(values and row order) unchanged. The property tests below check both, together
with the plain snapshot + tail equivalence.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from wakeful import Collection, HandlerContext, Message, Registry, StateChanged
from wakeful.database import Database
from wakeful.errors import DuplicateKeyError, MissingKeyError
from wakeful.events import decode_event, encode_event
from wakeful.state import EntityState


class Note(msgspec.Struct):
    key: str
    value: int
    tags: list[str] = []


SPECS = {
    "notes": Collection(primary_key="key", row=Note),
    "free": Collection(primary_key="id"),
}

KEYS = {"notes": ["a", "b", "c", "d", "e"], "free": [1, 2, 40]}


def make_row(collection: str, key: Any, value: int) -> Any:
    if collection == "notes":
        return Note(key, value, [str(value)] if value % 2 else [])
    return {"id": key, "value": value, "nested": {"v": [value]}}


def _updater(value: int) -> Any:
    def updater(r: Any) -> Any:
        if isinstance(r, Note):
            r.value = value  # edit the draft in place
            return None
        return {**r, "value": value}  # or return a new row

    return updater


def run_ops(
    draw: Any, noise: bool, max_ops: int = 40
) -> tuple[EntityState, list[bytes], dict[str, dict[Any, Any]]]:
    """Drive Actions on a live state with random writes, committing at random points.

    Writes are drawn against a plain-dict model, so most are valid (deletes and
    re-inserts of the same key within one commit are common) and a few are not
    (they must raise and change nothing). Returns the live state, the encoded
    log and the model (a Python dict keeps insertion order like a collection).
    """
    live = EntityState(SPECS)
    db = Database(live, SPECS)
    model: dict[str, dict[Any, Any]] = {name: {} for name in SPECS}
    log: list[bytes] = [encode_event(Message(payload="start"))]

    def commit() -> None:
        pending = db.actions.take_pending()
        if pending:
            log.append(encode_event(StateChanged(ops=pending)))

    n_ops = draw(st.integers(0, max_ops), label="number of writes")
    for i in range(n_ops):
        collection = draw(st.sampled_from(sorted(SPECS)))
        key = draw(st.sampled_from(KEYS[collection]))
        value = draw(st.integers(-1000, 1000))
        table = model[collection]
        present = key in table
        invalid = draw(st.integers(0, 9)) == 0
        if present:
            kind = "insert" if invalid else draw(st.sampled_from(["update", "delete"]))
        else:
            kind = draw(st.sampled_from(["update", "delete"])) if invalid else "insert"
        action = getattr(db.actions, f"{collection}_{kind}")
        before = dict(live.rows[collection])
        if kind == "insert":
            row = make_row(collection, key, value)
            if invalid:
                with pytest.raises(DuplicateKeyError):
                    action(row=row)
            else:
                action(row=row)
                table[key] = msgspec.to_builtins(row)
        elif kind == "update":
            if invalid:
                with pytest.raises(MissingKeyError):
                    action(key=key, updater=_updater(value))
            else:
                action(key=key, updater=_updater(value))
                table[key] = {**table[key], "value": value}
        else:
            if invalid:
                with pytest.raises(MissingKeyError):
                    action(key=key)
            else:
                action(key=key)
                del table[key]
        if invalid:
            assert live.rows[collection] == before
        if draw(st.integers(0, 3)) == 0:  # commit point: several writes per commit, mostly
            commit()
            if noise and i % 3 == 0:  # inputs interleave with state events in a real log
                log.append(encode_event(Message(payload={"i": i})))
    commit()
    return live, log, model


def entry_id(n: int) -> str:
    return f"1-{n}"


def fold(log: list[bytes], state: EntityState | None = None) -> EntityState:
    """Apply every event, with no skipping (what re-applying a suffix does)."""
    state = state if state is not None else EntityState(SPECS)
    for n, data in enumerate(log):
        state.apply_event(decode_event(data, stream_id=entry_id(n)))
    return state


def exact_fold(log: list[bytes], start: int, state: EntityState) -> EntityState:
    """Fold entries ``start..`` by id, the way the worker reads a log tail."""
    for n in range(start, len(log)):
        state.fold(entry_id(n), decode_event(log[n], stream_id=entry_id(n)))
    return state


def view(state: EntityState) -> dict[str, list[Any]]:
    """Rows in collection order, as plain data: what ``to_list`` shows a handler."""
    return state.to_builtins()


def model_view(model: dict[str, dict[Any, Any]]) -> dict[str, list[Any]]:
    return {name: list(table.values()) for name, table in model.items()}


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(noise=st.booleans(), data=st.data())
def test_snapshot_plus_tail_equals_full_fold(noise, data) -> None:
    live, log, model = run_ops(data.draw, noise)
    full = fold(log)

    # Folding the whole log gives the live in-memory state and the model.
    assert full.rows == live.rows
    assert view(full) == view(live) == model_view(model)

    # A snapshot taken at any point, plus the tail after it, gives the same state.
    k = data.draw(st.integers(0, len(log)), label="snapshot after entry")
    snap = fold(log[:k]).snapshot()
    rebuilt = fold(log[k:], EntityState.from_snapshot(snap, SPECS))
    assert rebuilt.rows == full.rows
    assert view(rebuilt) == view(full)

    # The snapshot bytes themselves are stable under a roundtrip.
    assert EntityState.from_snapshot(snap, SPECS).snapshot() == snap


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_reapplying_any_suffix_is_idempotent(data) -> None:
    _, log, _ = run_ops(data.draw, noise=True)
    full = fold(log)

    # Folding a suffix again on top of the full state changes nothing.
    j = data.draw(st.integers(0, len(log)), label="replay from")
    again = fold(log[j:], fold(log))
    assert again.rows == full.rows
    assert view(again) == view(full)

    # A snapshot that already holds entries j..k-1 (it was taken after a wake's
    # writes but records the wake's read position) plus the log from j.
    k = data.draw(st.integers(j, len(log)), label="snapshot after entry")
    snap = fold(log[:k]).snapshot()
    rebuilt = fold(log[j:], EntityState.from_snapshot(snap, SPECS))
    assert rebuilt.rows == full.rows
    assert view(rebuilt) == view(full)

    # The worker's exact fold: the snapshot records the last output it holds and
    # outputs at or before it are skipped when the tail from j is read again.
    outputs = [n for n in range(k) if decode_event(log[n]).is_output]
    applied = entry_id(outputs[-1]) if outputs else "0-0"
    exact = exact_fold(log, j, EntityState.from_snapshot(snap, SPECS, applied))
    assert exact.rows == full.rows
    assert view(exact) == view(full)
    all_outputs = [n for n in range(len(log)) if decode_event(log[n]).is_output]
    assert exact.applied == (entry_id(all_outputs[-1]) if all_outputs else "0-0")


# --- end to end ----------------------------------------------------------------


def ledger_registry(observed: list[dict[str, list[Any]]]) -> Registry:
    reg = Registry()

    @reg.entity("ledger", state=SPECS)
    async def ledger(ctx: HandlerContext) -> None:
        notes = ctx.db.collections.notes
        act = ctx.db.actions
        for msg in ctx.wake.messages:
            cmd = msg.payload
            if cmd == "observe":
                observed.append(
                    {
                        "notes": [msgspec.to_builtins(n) for n in notes],
                        "free": ctx.db.collections.free.to_list(),
                    }
                )
                continue
            key, value = cmd["key"], cmd["value"]
            if value < 0:
                if key in notes:
                    act.notes_delete(key=key)
            elif key in notes:
                act.notes_update(key=key, updater=lambda n, v=value: setattr(n, "value", v))
            else:
                act.notes_insert(row=Note(key, value))
            counter = ctx.db.collections.free.get(1)
            if counter is None:
                act.free_insert(row={"id": 1, "count": 1})
            else:
                act.free_update(key=1, updater=lambda r: {**r, "count": r["count"] + 1})

    return reg


@pytest.mark.anyio
async def test_fresh_worker_rebuilds_identical_state_from_snapshot(cluster) -> None:
    observed: list[dict[str, list[Any]]] = []
    reg = ledger_registry(observed)
    rt = await cluster.runtime(reg, snapshot_every=3)
    url = "/ledger/l1"
    commands = [
        {"key": k, "value": v}
        for k, v in [
            ("a", 1), ("b", 2), ("c", 3), ("a", 4), ("b", -1), ("d", 5), ("b", 6),
            ("e", 7), ("c", -1), ("a", 8), ("c", 9), ("f", 10), ("d", -1), ("g", 11),
            ("h", 12), ("a", -1), ("a", 13), ("i", 14), ("j", 15), ("e", 16),
        ]
    ]  # fmt: skip
    for i, cmd in enumerate(commands):
        await rt.send(url, cmd)
        if i % 4 == 3:  # several wakes, some with several messages
            await rt.wait_idle(url, timeout=10)
    await rt.send(url, "observe")
    assert (await rt.wait_idle(url, timeout=10)).status == "idle"
    before = await rt.state(url)
    assert await rt.store.snapshot(url) is not None
    meta = await rt.store.meta(url)
    assert "snap_upto" in meta

    expected: dict[str, int] = {}
    for cmd in commands:
        if cmd["value"] < 0:
            expected.pop(cmd["key"], None)
        else:
            expected[cmd["key"]] = cmd["value"]
    assert {n["key"]: n["value"] for n in before["notes"]} == expected
    assert before["free"] == [{"id": 1, "count": len(commands)}]
    assert observed == [before]

    # A new worker with a cold cache rebuilds from the snapshot and the log tail.
    await rt.close()
    rt2 = await cluster.runtime(reg, snapshot_every=3)
    assert rt2.worker is not None and rt2.worker is not rt.worker
    await rt2.send(url, "observe")
    assert (await rt2.wait_idle(url, timeout=10)).status == "idle"
    assert observed == [before, before]  # the handler saw identical state, in the same order
    assert await rt2.state(url) == before

    # Folding the entire log from the start (no snapshot) gives the same state too.
    full = EntityState(SPECS)
    async for record in rt2.events(url):
        full.apply_event(record.event)
    assert full.to_builtins() == before

    # And it keeps working from there.
    await rt2.send(url, {"key": "z", "value": 99})
    await rt2.wait_idle(url, timeout=10)
    after = await rt2.state(url)
    assert after["notes"][-1] == {"key": "z", "value": 99, "tags": []}
    assert after["free"] == [{"id": 1, "count": len(commands) + 1}]
