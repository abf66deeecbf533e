"""Entity state collections: reads, the three writes, validation, and persistence across wakes."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from wakeful import (
    Collection,
    CollectionError,
    DuplicateKeyError,
    HandlerContext,
    MissingKeyError,
    Registry,
    RowValidationError,
    UnknownCollectionError,
)
from wakeful.database import Database
from wakeful.events import StateChanged
from wakeful.state import EntityState

pytestmark = pytest.mark.anyio


class Note(msgspec.Struct):
    key: str
    value: str
    tags: list[str] = []


class Task(msgspec.Struct):
    id: int
    title: str
    done: bool = False


SPECS = {
    "notes": Collection(primary_key="key", row=Note),
    "tasks": Collection(primary_key="id", row=Task),
    "free": Collection(primary_key="name"),
}


def fresh() -> tuple[EntityState, Database]:
    state = EntityState(SPECS)
    return state, Database(state, SPECS)


def committed(db: Database, state: EntityState) -> EntityState:
    """Fold the pending ops into a fresh state, the way a worker rebuilds from the log."""
    rebuilt = EntityState(SPECS)
    rebuilt.apply(db.actions.take_pending())
    assert rebuilt.rows == state.rows
    return rebuilt


# --- reads -------------------------------------------------------------------


def test_empty_collections() -> None:
    _, db = fresh()
    notes = db.collections.notes
    assert notes.get("a") is None
    assert notes.get("a", "dflt") == "dflt"
    assert notes.to_list() == []
    assert len(notes) == 0
    assert list(notes) == []
    assert "a" not in notes
    assert list(db.collections) == ["notes", "tasks", "free"]


def test_reads_after_writes() -> None:
    state, db = fresh()
    a = db.actions
    assert a.notes_insert(row=Note("a", "1")) == Note("a", "1")
    a.notes_insert(row={"key": "b", "value": "2", "tags": ["x"]})
    a.tasks_insert(row=Task(1, "one"))
    a.free_insert(row={"name": "n", "anything": [1, 2]})

    notes = db.collections.notes
    assert notes.get("a") == Note("a", "1")
    assert notes.get("b") == Note("b", "2", ["x"])  # a dict row comes back as the row type
    assert isinstance(notes.get("b"), Note)
    assert notes.to_list() == [Note("a", "1"), Note("b", "2", ["x"])]
    assert list(notes) == notes.to_list()
    assert len(notes) == 2
    assert "a" in notes and "b" in notes and "c" not in notes
    assert notes.keys() == ["a", "b"]
    assert db.collections["tasks"].get(1) == Task(1, "one")
    assert 1 in db.collections.tasks and "1" not in db.collections.tasks
    assert db.collections.free.get("n") == {"name": "n", "anything": [1, 2]}
    assert state.to_builtins() == {
        "notes": [
            {"key": "a", "value": "1", "tags": []},
            {"key": "b", "value": "2", "tags": ["x"]},
        ],
        "tasks": [{"id": 1, "title": "one", "done": False}],
        "free": [{"name": "n", "anything": [1, 2]}],
    }
    committed(db, state)


def test_rows_returned_by_reads_are_copies() -> None:
    state, db = fresh()
    db.actions.notes_insert(row=Note("a", "1", ["t"]))
    before = {k: dict(v) for k, v in state.rows.items()}
    row = db.collections.notes.get("a")
    row.value = "changed"
    row.tags.append("u")
    for r in db.collections.notes:
        r.value = "changed too"
    db.collections.notes.to_list()[0].tags.clear()
    assert db.collections.notes.get("a") == Note("a", "1", ["t"])
    assert state.rows == before


def test_inserted_object_is_not_aliased() -> None:
    _, db = fresh()
    row = Note("a", "1", ["t"])
    db.actions.notes_insert(row=row)
    row.value = "mutated after insert"
    row.tags.append("late")
    assert db.collections.notes.get("a") == Note("a", "1", ["t"])


# --- writes ------------------------------------------------------------------


def test_insert_duplicate_key() -> None:
    _, db = fresh()
    db.actions.notes_insert(row=Note("a", "1"))
    with pytest.raises(DuplicateKeyError) as info:
        db.actions.notes_insert(row=Note("a", "2"))
    assert info.value.collection == "notes"
    assert info.value.key == "a"
    assert "collection 'notes' already has a row with key 'a'" in str(info.value)
    assert db.collections.notes.get("a") == Note("a", "1")
    ops = db.actions.take_pending()
    assert [(o.op, o.key) for o in ops] == [("insert", "a")]


def test_update_and_delete_missing_key() -> None:
    _, db = fresh()
    calls: list[Any] = []
    with pytest.raises(MissingKeyError) as info:
        db.actions.notes_update(key="nope", updater=calls.append)
    assert (info.value.collection, info.value.key) == ("notes", "nope")
    assert "has no row with key 'nope'" in str(info.value)
    assert calls == []  # the updater never ran
    with pytest.raises(MissingKeyError) as info:
        db.actions.tasks_delete(key=3)
    assert (info.value.collection, info.value.key) == ("tasks", 3)
    assert db.actions.take_pending() == []


def test_update_in_place_or_by_return_value() -> None:
    state, db = fresh()
    db.actions.tasks_insert(row=Task(1, "one"))
    db.actions.tasks_insert(row=Task(2, "two"))

    def mark_done(t: Task) -> None:
        t.done = True

    assert db.actions.tasks_update(key=1, updater=mark_done) == Task(1, "one", True)
    db.actions.tasks_update(key=2, updater=lambda t: Task(2, "TWO"))
    db.actions.free_insert(row={"name": "n", "count": 1})
    db.actions.free_update(key="n", updater=lambda r: {**r, "count": r["count"] + 1})
    assert db.collections.tasks.to_list() == [Task(1, "one", True), Task(2, "TWO")]
    assert db.collections.free.get("n") == {"name": "n", "count": 2}
    rebuilt = committed(db, state)
    assert Database(rebuilt, SPECS).collections.tasks.get(1) == Task(1, "one", True)


def test_repeated_updates_coalesce_into_the_first_write() -> None:
    state, db = fresh()
    db.actions.notes_insert(row=Note("a", "1"))
    db.actions.notes_insert(row=Note("b", "1"))
    for text in ("2", "3"):
        db.actions.notes_update(key="a", updater=lambda n, t=text: setattr(n, "value", t))
    ops = db.actions.take_pending()
    assert [(o.op, o.key) for o in ops] == [("insert", "a"), ("insert", "b")]
    rebuilt = EntityState(SPECS)
    rebuilt.apply(ops)
    assert rebuilt.rows == state.rows
    assert Database(rebuilt, SPECS).collections.notes.get("a") == Note("a", "3")


def test_delete() -> None:
    state, db = fresh()
    db.actions.notes_insert(row=Note("a", "1"))
    db.actions.notes_insert(row=Note("b", "2"))
    assert db.actions.notes_delete(key="a") is None
    assert "a" not in db.collections.notes
    assert len(db.collections.notes) == 1
    # A deleted key can be inserted again.
    db.actions.notes_insert(row=Note("a", "again"))
    assert db.collections.notes.get("a") == Note("a", "again")
    ops = db.actions.take_pending()
    # Deletes and inserts are kept in order (they move rows); only updates coalesce.
    assert [(o.op, o.key) for o in ops] == [
        ("insert", "a"),
        ("insert", "b"),
        ("delete", "a"),
        ("insert", "a"),
    ]
    assert db.actions.take_pending() == []
    rebuilt = EntityState(SPECS)
    rebuilt.apply(ops)
    assert rebuilt.rows == state.rows
    assert list(rebuilt.rows["notes"]) == list(state.rows["notes"]) == ["b", "a"]
    assert Database(rebuilt, SPECS).collections.notes.get("a") == Note("a", "again")


def test_delete_after_update_reaches_the_log() -> None:
    state, db = fresh()
    db.actions.notes_insert(row=Note("a", "1"))
    base = EntityState(SPECS)
    base.apply(db.actions.take_pending())
    db.actions.notes_update(key="a", updater=lambda n: setattr(n, "value", "2"))
    db.actions.notes_delete(key="a")
    ops = db.actions.take_pending()
    assert [(o.op, o.key) for o in ops] == [("update", "a"), ("delete", "a")]
    base.apply(ops)
    assert base.rows == state.rows
    assert base.rows["notes"] == {}


def test_updater_edits_a_copy_and_a_raising_updater_changes_nothing() -> None:
    state, db = fresh()
    db.actions.notes_insert(row=Note("a", "1", ["t"]))
    db.actions.take_pending()
    before = {k: dict(v) for k, v in state.rows.items()}

    def bad(n: Note) -> None:
        n.value = "half-done"
        n.tags.append("half")
        raise RuntimeError("updater failed")

    with pytest.raises(RuntimeError, match="updater failed"):
        db.actions.notes_update(key="a", updater=bad)
    assert db.collections.notes.get("a") == Note("a", "1", ["t"])
    assert state.rows == before
    assert db.actions.take_pending() == []

    # The draft handed to the updater is not the row a reader holds.
    held = db.collections.notes.get("a")
    db.actions.notes_update(key="a", updater=lambda n: setattr(n, "value", "2"))
    assert held.value == "1"
    assert db.collections.notes.get("a").value == "2"


def test_update_may_not_change_the_primary_key() -> None:
    state, db = fresh()
    db.actions.notes_insert(row=Note("a", "1"))
    db.actions.free_insert(row={"name": "n"})
    db.actions.take_pending()
    before = {k: dict(v) for k, v in state.rows.items()}
    with pytest.raises(RowValidationError, match=r"may not change the primary key \('a' -> 'b'\)"):
        db.actions.notes_update(key="a", updater=lambda n: setattr(n, "key", "b"))
    with pytest.raises(RowValidationError, match="primary key"):
        db.actions.free_update(key="n", updater=lambda r: {"name": "m"})
    assert state.rows == before
    assert "b" not in db.collections.notes
    assert db.actions.take_pending() == []


@pytest.mark.parametrize(
    ("collection", "row", "fragment"),
    [
        ("notes", {"key": "a", "value": 3}, "Expected `str`, got `int` - at `$.value`"),
        ("notes", {"key": "a"}, "missing required field `value`"),
        ("notes", Note("a", 5), "Expected `str`, got `int`"),  # type: ignore[arg-type]
        ("notes", "just a string", "Expected `object`, got `str`"),
        ("tasks", {"id": "one", "title": "t"}, "Expected `int`, got `str`"),
        ("notes", {"key": "a", "value": "v", "obj": object()}, "cannot be encoded"),
        ("free", {"value": 1}, "must be a map with the primary key field 'name'"),
        ("free", ["name", "x"], "must be a map with the primary key field 'name'"),
        ("free", {"name": 1.5}, "must be a str or int"),
        ("free", {"name": None}, "must be a str or int"),
        ("free", {"name": True}, "must be a str or int"),
        ("free", {"name": ["a"]}, "must be a str or int"),
    ],
)
def test_row_validation_names_the_collection(collection: str, row: Any, fragment: str) -> None:
    state, db = fresh()
    with pytest.raises(RowValidationError) as info:
        getattr(db.actions, f"{collection}_insert")(row=row)
    assert info.value.collection == collection
    assert f"row rejected by collection {collection!r}" in str(info.value)
    assert fragment in str(info.value)
    assert isinstance(info.value, CollectionError)
    assert all(not table for table in state.rows.values())
    assert db.actions.take_pending() == []


def test_update_result_is_validated() -> None:
    _, db = fresh()
    db.actions.tasks_insert(row=Task(1, "one"))
    with pytest.raises(RowValidationError, match="Expected `bool`"):
        db.actions.tasks_update(key=1, updater=lambda t: setattr(t, "done", "yes"))
    assert db.collections.tasks.get(1) == Task(1, "one")


def test_dict_rows_with_int_keys() -> None:
    state, db = fresh()
    db.actions.free_insert(row={"name": 7, "x": 1})
    assert 7 in db.collections.free
    assert "7" not in db.collections.free
    db.actions.free_delete(key=7)
    assert len(db.collections.free) == 0
    committed(db, state)


def test_unknown_collection_and_bad_action_names() -> None:
    _, db = fresh()
    with pytest.raises(UnknownCollectionError) as info:
        db.collections.nope  # noqa: B018
    assert "no collection named 'nope'" in str(info.value)
    assert "collections: free, notes, tasks" in str(info.value)
    with pytest.raises(UnknownCollectionError, match="no collection named 'nope'"):
        db.collections["nope"]
    assert not hasattr(db.collections, "nope")

    with pytest.raises(UnknownCollectionError) as info:
        db.actions.nope_insert(row={})
    assert "no action 'nope_insert'" in str(info.value)
    assert "no collection named 'nope'" in str(info.value)
    for bad in ("notes_upsert", "notes", "insert", "notes_get"):
        with pytest.raises(UnknownCollectionError, match=f"no action '{bad}'"):
            getattr(db.actions, bad)
    assert isinstance(info.value, AttributeError)

    empty = Database(EntityState({}), {})
    with pytest.raises(UnknownCollectionError, match="none declared"):
        empty.collections.kv  # noqa: B018


def test_a_typed_handle_reads_and_writes_like_the_dynamic_api() -> None:
    _, db = fresh()
    notes = db.collection("notes", Note)
    inserted = notes.insert(Note("a", "alpha"))
    assert inserted == Note("a", "alpha") and notes.get("a") == Note("a", "alpha")
    assert db.collections.notes.get("a") == Note("a", "alpha"), "one state, two views"

    def retag(note: Note) -> None:
        note.tags = ["x"]

    assert notes.update("a", retag) == Note("a", "alpha", ["x"])
    notes.insert(Note("b", "beta"))
    notes.delete("a")
    assert notes.keys() == ["b"] and len(notes) == 1 and "b" in notes
    assert [n.key for n in notes] == ["b"] and notes.get("a", "none") == "none"
    with pytest.raises(DuplicateKeyError):
        notes.insert(Note("b", "again"))
    with pytest.raises(MissingKeyError):
        notes.delete("a")
    # The same ops reach the log as through ctx.db.actions.
    assert [(op.op, op.key) for op in db.actions.take_pending()] == [
        ("insert", "a"),
        ("insert", "b"),
        ("delete", "a"),
    ]
    assert db.collection("free").keys() == []


def test_a_typed_handle_must_name_the_declared_row_type() -> None:
    _, db = fresh()
    with pytest.raises(CollectionError, match="holds rows of Note, not Task"):
        db.collection("notes", Task)
    with pytest.raises(CollectionError, match="free-form maps, not Note"):
        db.collection("free", Note)
    with pytest.raises(UnknownCollectionError):
        db.collection("nothing", Note)


def test_snapshot_roundtrip() -> None:
    state, db = fresh()
    db.actions.notes_insert(row=Note("a", "1", ["x"]))
    db.actions.tasks_insert(row=Task(3, "three"))
    db.actions.free_insert(row={"name": 9, "v": {"deep": [1]}})
    restored = EntityState.from_snapshot(state.snapshot(), SPECS)
    assert restored.rows == state.rows
    rdb = Database(restored, SPECS)
    assert rdb.collections.notes.get("a") == Note("a", "1", ["x"])
    assert rdb.collections.tasks.get(3) == Task(3, "three")
    assert rdb.collections.free.get(9) == {"name": 9, "v": {"deep": [1]}}


# --- through handlers -----------------------------------------------------------


def notes_registry(outcomes: list[Any]) -> Registry:
    """A handler that runs one instruction per message and records what it observed."""
    reg = Registry()

    @reg.entity("notebook", state=SPECS)
    async def notebook(ctx: HandlerContext) -> None:
        col = ctx.db.collections
        act = ctx.db.actions
        for msg in ctx.wake.messages:
            cmd = msg.payload
            try:
                if cmd["op"] == "put":
                    if cmd["key"] in col.notes:
                        act.notes_update(
                            key=cmd["key"], updater=lambda n, v=cmd["value"]: setattr(n, "value", v)
                        )
                    else:
                        act.notes_insert(row=Note(cmd["key"], cmd["value"]))
                    # Reads see the write at once, before any commit.
                    outcomes.append(("read", col.notes.get(cmd["key"]).value, len(col.notes)))
                elif cmd["op"] == "insert":
                    act.notes_insert(row=cmd["row"])
                    outcomes.append(("ok",))
                elif cmd["op"] == "delete":
                    act.notes_delete(key=cmd["key"])
                    outcomes.append(("deleted", cmd["key"] in col.notes))
                elif cmd["op"] == "update_bad":
                    act.notes_update(key=cmd["key"], updater=_failing_updater)
                elif cmd["op"] == "collection":
                    getattr(col, cmd["name"])
                elif cmd["op"] == "action":
                    getattr(act, cmd["name"])(row={})
                elif cmd["op"] == "list":
                    outcomes.append(("list", sorted(n.key for n in col.notes)))
            except (CollectionError, RuntimeError) as exc:
                outcomes.append((type(exc).__name__, str(exc)))

    return reg


def _failing_updater(n: Note) -> None:
    n.value = "should not stick"
    raise RuntimeError("updater gave up")


async def test_collections_through_handlers(cluster) -> None:
    outcomes: list[Any] = []
    rt = await cluster.runtime(notes_registry(outcomes))
    url = "/notebook/n1"

    await rt.send(url, {"op": "put", "key": "a", "value": "1"})
    await rt.send(url, {"op": "put", "key": "b", "value": "2"})
    assert (await rt.wait_idle(url, timeout=10)).status == "idle"
    await rt.send(url, {"op": "put", "key": "a", "value": "1b"})
    await rt.send(url, {"op": "insert", "row": {"key": "b", "value": "dup"}})
    await rt.send(url, {"op": "insert", "row": {"key": "c", "value": 3}})
    await rt.send(url, {"op": "delete", "key": "zz"})
    await rt.send(url, {"op": "update_bad", "key": "a"})
    await rt.send(url, {"op": "collection", "name": "nope"})
    await rt.send(url, {"op": "action", "name": "notes_upsert"})
    await rt.send(url, {"op": "delete", "key": "b"})
    await rt.send(url, {"op": "list"})
    assert (await rt.wait_idle(url, timeout=10)).status == "idle"

    assert outcomes == [
        ("read", "1", 1),
        ("read", "2", 2),
        ("read", "1b", 2),
        ("DuplicateKeyError", "collection 'notes' already has a row with key 'b'"),
        (
            "RowValidationError",
            "row rejected by collection 'notes': Expected `str`, got `int` - at `$.value`",
        ),
        ("MissingKeyError", "collection 'notes' has no row with key 'zz'"),
        ("RuntimeError", "updater gave up"),
        (
            "UnknownCollectionError",
            "no collection named 'nope' (collections: free, notes, tasks)",
        ),
        (
            "UnknownCollectionError",
            "no action 'notes_upsert': actions are <collection>_insert, _update and _delete; "
            "no collection named 'notes' (collections: free, notes, tasks)",
        ),
        ("deleted", False),
        ("list", ["a"]),
    ]
    # Only the successful writes are durable.
    assert await rt.state(url) == {
        "notes": [{"key": "a", "value": "1b", "tags": []}],
        "tasks": [],
        "free": [],
    }
    ops = [
        (op.op, op.key)
        async for r in rt.events(url)
        if isinstance(r.event, StateChanged)
        for op in r.event.ops
    ]
    assert ops == [("insert", "a"), ("insert", "b"), ("update", "a"), ("delete", "b")]


async def test_state_persists_across_wakes(cluster) -> None:
    reg = Registry()
    seen: list[list[str]] = []

    @reg.entity("tally", state={"tasks": Collection("id", Task)})
    async def tally(ctx: HandlerContext) -> None:
        seen.append([t.title for t in ctx.db.collections.tasks])
        for msg in ctx.wake.messages:
            n = len(ctx.db.collections.tasks) + 1
            ctx.db.actions.tasks_insert(row=Task(n, msg.payload))
            if n % 2 == 0:
                ctx.db.actions.tasks_update(key=n - 1, updater=lambda t: setattr(t, "done", True))

    rt = await cluster.runtime(reg)
    url = "/tally/t"
    for word in ["one", "two", "three", "four", "five"]:
        await rt.send(url, word)
        await rt.wait_idle(url, timeout=10)

    # Each wake saw everything the earlier wakes committed.
    assert seen == [
        [],
        ["one"],
        ["one", "two"],
        ["one", "two", "three"],
        ["one", "two", "three", "four"],
    ]
    assert await rt.state(url) == {
        "tasks": [
            {"id": 1, "title": "one", "done": True},
            {"id": 2, "title": "two", "done": False},
            {"id": 3, "title": "three", "done": True},
            {"id": 4, "title": "four", "done": False},
            {"id": 5, "title": "five", "done": False},
        ]
    }

    # A different worker (cold cache) sees the same state.
    await rt.close()
    rt2 = await cluster.runtime(reg)
    seen.clear()
    await rt2.send(url, "six")
    await rt2.wait_idle(url, timeout=10)
    assert seen == [["one", "two", "three", "four", "five"]]
    assert len((await rt2.state(url))["tasks"]) == 6
