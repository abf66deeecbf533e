"""The HTTP gateway: every endpoint, error classes, SSE resume, auth and authoriser."""

from __future__ import annotations

import json
from typing import Any

import httpx
import msgspec
import pytest

from tests.gateway_apps import ALICE, BOB, TOKENS, http_for, register_echo
from wakeful import HandlerContext, Registry, ScriptedModel, define_agent, define_tool
from wakeful.authorization import EntityAccess
from wakeful.errors import InvalidIdempotencyKeyError
from wakeful.gateway import bearer_tokens
from wakeful.keys import MAX_IDEMPOTENCY_KEY
from wakeful.models import ModelResponse

pytestmark = pytest.mark.anyio


class NoArgs(msgspec.Struct):
    pass


class Selection(msgspec.Struct):
    text: str


def app_registry() -> Registry:
    reg = Registry()

    register_echo(reg)

    @reg.entity("parent")
    async def parent(ctx: HandlerContext) -> None:
        for m in ctx.wake.messages:
            await ctx.spawn("echo", f"kid-{m.payload}", initial_message=m.payload)

    selected = define_tool(
        id="browser.getSelectedText/v1", description="selection", input=NoArgs, output=Selection
    )
    model = ScriptedModel(
        [
            ModelResponse(
                content=[{"type": "tool_use", "id": "s1", "name": "getSelectedText", "input": {}}],
                stop_reason="tool_use",
            ),
            "Done.",
        ]
    )
    agent = define_agent(
        name="page", instructions="", model=model, tools={"getSelectedText": selected}
    )

    @reg.entity("page")
    async def page(ctx: HandlerContext) -> None:
        ctx.use_agent(agent)
        await ctx.agent.run()

    return reg


def only_own(request: EntityAccess) -> bool:
    """Entities named after a user belong to that user; others are open."""
    owner = request.url.rsplit("/", 1)[-1]
    return owner not in ("alice", "bob") or (request.identity or {}).get("user") == owner


async def client_for(cluster: Any) -> tuple[httpx.AsyncClient, Any]:
    rt = await cluster.runtime(app_registry())
    authenticate = bearer_tokens(TOKENS)
    return http_for(rt, authenticate=authenticate, authorize=only_own, max_body_bytes=10_000), rt


def sse_events(text: str) -> list[tuple[str, str, dict[str, Any]]]:
    out = []
    for block in text.strip().split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines())
        out.append((fields["id"], fields["event"], json.loads(fields["data"])))
    return out


async def test_an_idempotency_key_too_long_to_keep_is_a_400_and_writes_nothing(cluster):
    """The key becomes part of a Redis key name kept for a day: a 10 KB one was taken.
    Refused over HTTP (messages and create) and in the client, naming the limit."""
    http, rt = await client_for(cluster)
    long_key = "k" * (MAX_IDEMPOTENCY_KEY + 1)
    async with http:
        for path, body in (
            ("/entities/echo/i1/messages", {"payload": "hi"}),
            ("/entities/echo/i2", {"initial_message": "hi"}),
        ):
            refused = await http.post(
                path, json=body, headers={**ALICE, "Idempotency-Key": long_key}
            )
            assert refused.status_code == 400, refused.text
            error = refused.json()["error"]
            assert error["type"] == "InvalidIdempotencyKeyError"
            assert f"at most {MAX_IDEMPOTENCY_KEY}" in error["message"]
        fits = await http.post(
            "/entities/echo/i1/messages",
            json={"payload": "hi"},
            headers={**ALICE, "Idempotency-Key": long_key[1:]},
        )
        assert fits.status_code == 202, fits.text
    assert await rt.list("echo") == ["/echo/i1"]  # the refused ones wrote nothing
    with pytest.raises(InvalidIdempotencyKeyError, match="must be text"):
        await rt.send("/echo/i1", "hi", idempotency_key=12)  # type: ignore[arg-type]


async def test_a_damaged_log_is_a_500_naming_the_entry_not_the_callers_400(cluster, caplog):
    """An entry no one can decode was written into the log by hand: reading the state
    fails on the server's data, not on the request."""
    http, rt = await client_for(cluster)
    await rt.send("/echo/d1", "hi")
    await rt.wait_idle("/echo/d1")
    await rt.store.redis.xadd(rt.store.keys.log("/echo/d1"), {"x": "1"})
    async with http:
        state = await http.get("/entities/echo/d1/state", headers=ALICE)
    assert state.status_code == 500, state.text
    error = state.json()["error"]
    assert error["type"] == "EventDecodeError" and "could not be decoded" in error["message"]
    assert "/echo/d1" in caplog.text  # the operator is told, in one line


async def test_send_status_state_events_and_resume(cluster):
    http, rt = await client_for(cluster)
    async with http:
        sent = await http.post("/entities/echo/e1/messages", json={"payload": "hi"}, headers=ALICE)
        assert sent.status_code == 202
        event_id = sent.json()["event_id"]
        again = await http.post(
            "/entities/echo/e1/messages",
            json={"payload": "hi"},
            headers={**ALICE, "Idempotency-Key": "k1"},
        )
        dup = await http.post(
            "/entities/echo/e1/messages",
            json={"payload": "hi"},
            headers={**ALICE, "Idempotency-Key": "k1"},
        )
        assert again.json()["event_id"] == dup.json()["event_id"] != event_id
        await rt.wait_idle("/echo/e1")
        status = await http.get("/entities/echo/e1", headers=ALICE)
        assert status.status_code == 200 and status.json()["status"] == "idle"
        state = await http.get("/entities/echo/e1/state", headers=ALICE)
        assert state.status_code == 200 and state.json() == {}
        stream = await http.get("/entities/echo/e1/events?follow=0", headers=ALICE)
        assert stream.headers["content-type"].startswith("text/event-stream")
        events = sse_events(stream.text)
        kinds = [kind for _, kind, _ in events]
        assert kinds[:2] == ["created", "msg"] and "run_finished" in kinds
        # A first look at the last two entries only; a bad tail is refused.
        tail = await http.get("/entities/echo/e1/events?follow=0&tail=2", headers=ALICE)
        assert sse_events(tail.text) == events[-2:]
        everything = await http.get("/entities/echo/e1/events?follow=0&tail=999", headers=ALICE)
        assert sse_events(everything.text) == events
        bad_tail = await http.get("/entities/echo/e1/events?tail=0", headers=ALICE)
        assert bad_tail.status_code == 400 and "tail" in bad_tail.text
        # Resume after the second event: only what came later.
        cursor = events[1][0]
        resumed = await http.get(
            "/entities/echo/e1/events?follow=0", headers={**ALICE, "Last-Event-ID": cursor}
        )
        assert sse_events(resumed.text) == events[2:]


async def test_create_and_error_classes(cluster):
    http, _ = await client_for(cluster)
    async with http:
        created = await http.post("/entities/echo/c1", json={"args": {"a": 1}}, headers=ALICE)
        assert created.status_code == 201
        conflict = await http.post("/entities/echo/c1", json={"args": {"a": 2}}, headers=ALICE)
        assert (
            conflict.status_code == 409 and conflict.json()["error"]["type"] == "ArgsConflictError"
        )
        no_auth = await http.get("/entities/echo/c1")
        assert no_auth.status_code == 401
        bad_token = await http.get("/entities/echo/c1", headers={"authorization": "Bearer nope"})
        assert bad_token.status_code == 401
        forbidden = await http.get("/entities/echo/alice", headers=BOB)
        assert forbidden.status_code == 403 and "not allowed to read /echo/alice" in forbidden.text
        unknown_type = await http.post(
            "/entities/nobody/x/messages", json={"payload": 1}, headers=ALICE
        )
        assert (
            unknown_type.status_code == 404 and "unknown entity type 'nobody'" in unknown_type.text
        )
        missing = await http.get("/entities/echo/none", headers=ALICE)
        assert missing.status_code == 404 and "does not exist" in missing.text
        bad_id = await http.get("/entities/echo/{bad}", headers=ALICE)
        assert bad_id.status_code == 400 and "invalid entity id" in bad_id.text
        json_type = {**ALICE, "content-type": "application/json"}
        malformed = await http.post(
            "/entities/echo/c1/messages", content=b"{not json", headers=json_type
        )
        assert malformed.status_code == 400 and malformed.json()["error"]["type"] == "MalformedJSON"
        not_utf8 = await http.post(
            "/entities/echo/c1/messages", content=b"\xfe\x9f{", headers=json_type
        )
        assert not_utf8.status_code == 400 and "not UTF-8" in not_utf8.text
        # A form or text/plain POST (what a cross-site page can send unasked) is refused.
        as_text = await http.post(
            "/entities/echo/c1/messages",
            content=b'{"payload": "x"}',
            headers={**ALICE, "content-type": "text/plain"},
        )
        assert as_text.status_code == 415 and "application/json" in as_text.text
        no_payload = await http.post("/entities/echo/c1/messages", json={}, headers=ALICE)
        assert no_payload.status_code == 400
        too_big = await http.post(
            "/entities/echo/c1/messages", json={"payload": "x" * 20_000}, headers=ALICE
        )
        assert too_big.status_code == 413
        bad_tools = await http.post(
            "/entities/echo/c1/messages",
            json={
                "payload": "x",
                "client_tools": [{"name": "spawn_agent", "input_schema": {"type": "object"}}],
            },
            headers=ALICE,
        )
        assert bad_tools.status_code == 422 and "reserved" in bad_tools.text
        # Nothing was half-written by the failed requests: one created event only.
        events = sse_events(
            (await http.get("/entities/echo/c1/events?follow=0", headers=ALICE)).text
        )
        assert [kind for _, kind, _ in events] == ["created"]


async def test_pending_actions_over_http(cluster):
    http, rt = await client_for(cluster)
    async with http:
        await http.post("/entities/page/p1/messages", json={"payload": "read it"}, headers=ALICE)
        await rt.wait_idle("/page/p1")
        pending = await http.get("/entities/page/p1/actions", headers=ALICE)
        assert [a["tool_call_id"] for a in pending.json()] == ["s1"]
        assert pending.json()[0]["authorized"] == {"user": "alice"}
        invalid = await http.post(
            "/entities/page/p1/actions/s1/submit", json={"output": {"text": 5}}, headers=ALICE
        )
        assert invalid.status_code == 422
        wrong_user = await http.post(
            "/entities/page/p1/actions/s1/submit", json={"output": {"text": "x"}}, headers=BOB
        )
        assert wrong_user.status_code == 403
        wrong_verb = await http.post("/entities/page/p1/actions/s1/approve", json={}, headers=ALICE)
        assert wrong_verb.status_code == 409
        ok = await http.post(
            "/entities/page/p1/actions/s1/submit", json={"output": {"text": "hello"}}, headers=ALICE
        )
        assert ok.status_code == 200
        twice = await http.post(
            "/entities/page/p1/actions/s1/submit", json={"output": {"text": "hello"}}, headers=ALICE
        )
        assert twice.status_code == 409
        await rt.wait_idle("/page/p1")
        assert (await http.get("/entities/page/p1/actions", headers=ALICE)).json() == []


async def test_manifest_openapi_and_cancel(cluster):
    http, _ = await client_for(cluster)
    async with http:
        manifest = await http.get("/manifest", headers=ALICE)
        assert {t["name"] for t in manifest.json()["types"]} == {"echo", "page", "parent"}
        spec = (await http.get("/openapi.json")).json()
        # Every answer verb is its own documented operation, with its body.
        answers = [p for p in spec["paths"] if "/actions/{call}/" in p]
        assert sorted(p.rsplit("/", 1)[1] for p in answers) == [
            "approve",
            "cancel",
            "data",
            "deny",
            "fail",
            "skip",
            "submit",
        ]
        submit = spec["paths"]["/entities/{type}/{id}/actions/{call}/submit"]["post"]
        assert submit["requestBody"]["content"]["application/json"]["schema"]["required"] == [
            "output"
        ]
        assert (
            spec["openapi"].startswith("3.") and "/entities/{type}/{id}/messages" in spec["paths"]
        )
        await http.post("/entities/echo/x/messages", json={"payload": 1}, headers=ALICE)
        cancelled = await http.post("/entities/echo/x/cancel", json={}, headers=ALICE)
        assert cancelled.status_code == 202
        gone = await http.post("/entities/echo/nobody/cancel", json={}, headers=ALICE)
        assert gone.status_code == 404


async def test_listing_children_and_console(cluster):
    http, rt = await client_for(cluster)
    async with http:
        for name in ("alice", "bob", "shared"):
            await http.post(
                f"/entities/echo/{name}", json={}, headers=ALICE if name != "bob" else BOB
            )
        listed = await http.get("/entities/echo", headers=ALICE)
        # The authoriser filters the listing: alice does not see bob's entity.
        assert listed.status_code == 200 and sorted(listed.json()) == [
            "/echo/alice",
            "/echo/shared",
        ]
        first = await http.get("/entities/echo?limit=1", headers=ALICE)
        assert first.json() == ["/echo/alice"]
        rest = await http.get("/entities/echo?limit=1&after=/echo/alice", headers=ALICE)
        assert rest.json() == ["/echo/shared"]
        bad_limit = await http.get("/entities/echo?limit=0", headers=ALICE)
        assert bad_limit.status_code == 400 and "limit" in bad_limit.text
        unknown = await http.get("/entities/nobody", headers=ALICE)
        assert unknown.status_code == 404
        assert (await http.get("/entities/echo")).status_code == 401
        children = await http.get("/entities/echo/shared/children", headers=ALICE)
        assert children.status_code == 200 and children.json() == []
        await http.post("/entities/parent/p/messages", json={"payload": "x"}, headers=ALICE)
        await rt.wait_idle("/parent/p")
        kids = (await http.get("/entities/parent/p/children", headers=ALICE)).json()
        assert [(k["url"], k["type"]) for k in kids] == [("/echo/kid-x", "echo")]
        missing = await http.get("/entities/echo/gone/children", headers=ALICE)
        assert missing.status_code == 404
        not_hers = await http.get("/entities/echo/bob/children", headers=ALICE)
        assert not_hers.status_code == 403
        root = await http.get("/")
        assert root.status_code == 307 and root.headers["location"] == "/console/"
        page = await http.get("/console/")
        assert page.status_code == 200 and "console.js" in page.text
        script = await http.get("/console/console.js")
        assert "getSelectedText" in script.text


async def test_a_run_started_by_create_belongs_to_its_caller(cluster):
    """The initial message of a create carries the caller's identity like a send, so
    only that caller may answer the run's pending actions."""
    http, rt = await client_for(cluster)
    async with http:
        created = await http.post(
            "/entities/page/p2",
            json={"message": "read it", "client_data": {"tab": 1}},
            headers=ALICE,
        )
        assert created.status_code == 201
        await rt.wait_idle("/page/p2")
        [action] = (await http.get("/entities/page/p2/actions", headers=ALICE)).json()
        assert action["authorized"] == {"user": "alice"}
        by_bob = await http.post(
            f"/entities/page/p2/actions/{action['tool_call_id']}/submit",
            json={"output": {"text": "x"}},
            headers=BOB,
        )
        assert by_bob.status_code == 403


async def test_a_401_says_how_to_authenticate(cluster):
    http, _ = await client_for(cluster)
    async with http:
        for headers in ({}, {"authorization": "Bearer nope"}):
            refused = await http.get("/entities/echo/c1", headers=headers)
            assert refused.status_code == 401
            assert refused.headers["www-authenticate"] == "Bearer"


async def test_bad_input_is_refused_naming_what_is_wrong(cluster):
    http, _ = await client_for(cluster)
    async with http:
        # A listing's ?after= is an entity url (the last one of the previous page).
        for path in ("/entities/echo?after=%25%25%25", "/entities?after=%25%25%25"):
            refused = await http.get(path, headers=ALICE)
            assert refused.status_code == 400, (path, refused.text)
            error = refused.json()["error"]
            assert error["type"] == "BadQuery" and "after '%%%'" in error["message"]
        # A string escape of half a surrogate pair is not a character.
        lone = await http.post(
            "/entities/echo/c1/messages",
            content=rb'{"payload": "add \ud800"}',
            headers={**ALICE, "content-type": "application/json"},
        )
        assert lone.status_code == 400 and lone.json()["error"]["type"] == "MalformedJSON"
        message = lone.json()["error"]["message"]
        assert "\\ud800" in message and "surrogate pair" in message
        assert "truncated" not in message
        assert (await http.get("/entities/echo/c1", headers=ALICE)).status_code == 404
