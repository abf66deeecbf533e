"""The console's operator reads over HTTP (console_api.py): every entity across types
with its status and lag, an entity's journal, its tree of children, its partition's
worker; authorised as the gateway's other reads."""

from __future__ import annotations

import pytest

from tests.gateway_apps import ALICE, BOB, TOKENS, http_for, ops_registry
from wakeful import MetadataError, console_api
from wakeful.events import HandlerFailed
from wakeful.gateway import bearer_tokens

pytestmark = pytest.mark.anyio


async def test_every_entity_across_types_filtered_by_status_and_id(cluster):
    rt = await cluster.runtime(ops_registry(), max_attempts=2)
    await rt.send("/echo/e1", "hi")
    await rt.send("/echo/e2", "hi")
    await rt.send("/broken/b1", "go")
    await rt.send("/notes/n1", "add milk")
    await rt.wait_all_idle()
    async with http_for(rt) as http:
        every = (await http.get("/entities")).json()
        urls = [row["url"] for row in every["entities"]]
        assert urls == ["/broken/b1", "/echo/e1", "/echo/e2", "/notes/n1"]
        assert every["next"] is None and "failed" in every["statuses"]
        [failed] = (await http.get("/entities?status=failed")).json()["entities"]
        assert failed["url"] == "/broken/b1" and failed["attempts"] == 2
        assert "boom" in failed["error"] and failed["lag"]["inputs"] == 2  # created, msg: parked
        idle = (await http.get("/entities?status=idle,waiting")).json()["entities"]
        assert {row["status"] for row in idle} == {"idle"} and len(idle) == 3
        found = (await http.get("/entities?q=e2")).json()["entities"]
        assert [row["url"] for row in found] == ["/echo/e2"]
        typed = (await http.get("/entities?type=echo")).json()["entities"]
        assert [row["url"] for row in typed] == ["/echo/e1", "/echo/e2"]
        # Paging: ?after= the last url of a page is the next page.
        first = (await http.get("/entities?limit=2")).json()
        assert [row["url"] for row in first["entities"]] == ["/broken/b1", "/echo/e1"]
        second = (await http.get(f"/entities?limit=2&after={first['next']}")).json()
        assert [row["url"] for row in second["entities"]] == ["/echo/e2", "/notes/n1"]
        # Bad input is named.
        bad = await http.get("/entities?status=broke")
        assert (
            bad.status_code == 400 and "'broke' is not a status" in bad.json()["error"]["message"]
        )
        assert (await http.get("/entities?type=Nope")).status_code == 400
        assert (await http.get("/entities?type=nope")).status_code == 404
        assert (await http.get("/entities?limit=0")).status_code == 400


async def test_lag_of_inputs_no_worker_handled(cluster):
    rt = await cluster.runtime(ops_registry(), run_worker=False)
    await rt.send("/echo/late", "one")
    await rt.send("/echo/late", "two")
    async with http_for(rt) as http:
        [row] = (await http.get("/entities?status=pending")).json()["entities"]
        assert row["url"] == "/echo/late" and row["lag"]["inputs"] == 3  # created + 2 messages
        view = (await http.get("/entities/echo/late/overview")).json()
        assert view["status"] == "pending" and view["lag"]["inputs"] == 3
        assert view["served_by"] is None and view["live_workers"] == 0
        assert view["partition"] == rt.store.keys.partition("/echo/late")


async def test_a_listing_holds_only_the_callers_entities(cluster):
    rt = await cluster.runtime(ops_registry())
    async with http_for(rt, authenticate=bearer_tokens(TOKENS)) as http:
        await http.post("/entities/echo/mine/messages", json={"payload": "a"}, headers=ALICE)
        await http.post("/entities/echo/yours/messages", json={"payload": "b"}, headers=BOB)
        await rt.wait_all_idle()
        alice = (await http.get("/entities", headers=ALICE)).json()["entities"]
        assert [row["url"] for row in alice] == ["/echo/mine"]
        assert (await http.get("/entities")).status_code == 401
        # Her views of bob's entity are refused like any read of it.
        for view in ("overview", "journal", "tree"):
            refused = await http.get(f"/entities/echo/yours/{view}", headers=ALICE)
            assert refused.status_code == 403, view


async def test_the_journal_decodes_every_event_without_tracebacks(cluster):
    rt = await cluster.runtime(ops_registry(), max_attempts=2)
    await rt.send("/broken/j1", "go")
    await rt.wait_idle("/broken/j1")
    async with http_for(rt) as http:
        journal = (await http.get("/entities/broken/j1/journal")).json()
        kinds = [e["kind"] for e in journal["entries"]]
        assert kinds[:2] == ["created", "msg"] and kinds.count("handler_error") == 2
        assert kinds[-1] == "failed" and journal["status"] == "failed"
        retry = next(e for e in journal["entries"] if e["kind"] == "handler_error")
        assert retry["event"]["error"] and retry["event"]["attempt"] == 1
        assert retry["event"]["traceback"] == "" and retry["traceback_withheld"] is True
        assert all(e["at_ms"] == int(e["id"].split("-")[0]) for e in journal["entries"])
        # The traceback is in the log, for operators (the client API, `wakeful tail`).
        stored = [r.event async for r in rt.events("/broken/j1")]
        assert all(e.traceback for e in stored if isinstance(e, HandlerFailed))
        # Paging.
        page = (await http.get("/entities/broken/j1/journal?limit=2")).json()
        assert [e["kind"] for e in page["entries"]] == ["created", "msg"]
        rest = (await http.get(f"/entities/broken/j1/journal?after={page['next']}")).json()
        assert [e["kind"] for e in rest["entries"]] == kinds[2:] and rest["next"] is None
        assert (await http.get("/entities/broken/j1/journal?after=x")).status_code == 400
        assert (await http.get("/entities/broken/none/journal")).status_code == 404


async def test_the_journal_marks_trimmed_history(cluster):
    rt = await cluster.runtime(ops_registry(), snapshot_every=1, retention_s=0, retention_entries=0)
    for text in ("a", "b", "c"):
        await rt.send("/notes/t1", f"add {text}")
        await rt.wait_idle("/notes/t1")
    trimmed = (await rt.store.meta("/notes/t1"))["trimmed"].decode()
    async with http_for(rt) as http:
        journal = (await http.get("/entities/notes/t1/journal")).json()
        first = journal["entries"][0]
        assert first["kind"] == "trimmed" and first["event"]["upto"] == trimmed


async def test_the_tree_goes_down_every_level_with_each_status(cluster):
    rt = await cluster.runtime(ops_registry())
    await rt.send("/tree/root", "2")
    await rt.wait_all_idle()
    async with http_for(rt) as http:
        tree = (await http.get("/entities/tree/root/tree")).json()
        assert tree["status"] == "idle" and tree["truncated"] is False
        level1 = tree["children"]
        assert [c["url"] for c in level1] == ["/tree/root.0", "/tree/root.1"]
        level2 = level1[0]["children"]
        assert [c["url"] for c in level2] == ["/tree/root.0.0", "/tree/root.0.1"]
        assert all(c["status"] == "idle" and c["children"] == [] for c in level2)
        assert level2[0]["response"] == "depth 0" and level2[0]["run"]["status"] == "completed"
        shallow = (await http.get("/entities/tree/root/tree?depth=1")).json()
        assert shallow["truncated"] is True and shallow["children"][0]["more"] is True
        assert "children" not in shallow["children"][0]


async def test_a_listing_reads_a_bounded_number_of_statuses(cluster, monkeypatch):
    """A rare status is found page by page: one request reads at most SCAN_LIMIT
    statuses and says where the next one starts, even with nothing found yet."""
    monkeypatch.setattr(console_api, "SCAN_LIMIT", 2)
    rt = await cluster.runtime(ops_registry())
    for n in range(3):
        await rt.send(f"/echo/e{n}", "hi")
    await rt.wait_all_idle()
    async with http_for(rt) as http:
        first = (await http.get("/entities?status=failed")).json()
        assert first["entities"] == [] and first["next"] == "/echo/e1"
        last = (await http.get("/entities?status=failed&after=/echo/e1")).json()
        assert last == {**last, "entities": [], "next": None}


@pytest.mark.parametrize("field", ["cursor", "last_in"])
async def test_an_entity_with_a_corrupted_position_is_a_failed_row_not_a_failed_listing(
    cluster, field
):
    """A position in one entity's metadata written over with garbage: the listing and
    the entity's overview still answer, the entity failed with the field named, and its
    state is refused naming it (``MetadataError``), never a parser's ValueError."""
    rt = await cluster.runtime(ops_registry(), run_worker=False)
    await rt.send("/echo/good", "hi")
    await rt.send("/echo/bad", "hi")
    assert rt.store is not None
    await rt.store.redis.hset(rt.store.keys.meta("/echo/bad"), field, "garbage")
    named = f"'{field}' is 'garbage'"
    async with http_for(rt) as http:
        listing = await http.get("/entities")
        assert listing.status_code == 200
        rows = {row["url"]: row for row in listing.json()["entities"]}
        assert rows["/echo/good"]["lag"]["inputs"] == 2  # created, message
        assert rows["/echo/bad"]["status"] == "failed" and named in rows["/echo/bad"]["error"]
        overview = await http.get("/entities/echo/bad/overview")
        assert overview.status_code == 200 and named in overview.json()["error"]
    status = await rt.status("/echo/bad", runs=True)
    assert status.status == "failed" and named in status.error
    with pytest.raises(MetadataError, match=named):
        await rt.state("/echo/bad")
    with pytest.raises(MetadataError, match=named):
        await rt.history("/echo/bad")
