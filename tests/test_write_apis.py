"""Write APIs append only what can be read back; cancelling a suspended run settles its
actions; one status word for a suspended run everywhere (issue 12, items 3, 7 and 8)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import msgspec
import pytest

from tests.gateway_apps import http_for, register_echo
from wakeful import (
    HandlerContext,
    InvalidEventError,
    LogRecord,
    Registration,
    Registry,
    Runtime,
    ScriptedModel,
    define_agent,
    tool,
)
from wakeful.actions import ActionNotPendingError
from wakeful.events import (
    ActionSettled,
    CancelRequested,
    Message,
    RunFinished,
    UndecodableRecord,
    encode_event,
)
from wakeful.models import ModelRequest, ModelResponse

pytestmark = pytest.mark.anyio
URL = "/page/p"
ME = {"user": "me"}


class Delete(msgspec.Struct):
    path: str


class Done(msgspec.Struct):
    deleted: str


def registry(executions: list[str]) -> Registry:
    @tool(id="fs.delete/v1", description="Delete a file", input=Delete, output=Done)
    async def delete(ctx: Any) -> Done:
        executions.append(ctx.input.path)
        return Done(ctx.input.path)

    def respond(request: ModelRequest) -> ModelResponse:
        """A new user message: call ``delete`` (``d1``, then ``d<n>``); a result: answer."""
        content = request.messages[-1]["content"]
        blocks = content if isinstance(content, list) else []
        if isinstance(content, str) or any(b.get("type") == "text" for b in blocks):
            n = len(request.messages)
            call = {"type": "tool_use", "id": f"d{n}", "name": "delete", "input": {"path": "/a"}}
            return ModelResponse(content=[call], stop_reason="tool_use")
        return ModelResponse(content=[{"type": "text", "text": "ok"}], stop_reason="end_turn")

    agent = define_agent(
        name="page",
        instructions=".",
        model=ScriptedModel(respond),
        tools={"delete": Registration(delete, needs_approval=True)},
    )
    reg = Registry()

    @reg.entity("page")
    async def page(ctx: HandlerContext) -> None:
        ctx.use_agent(agent)
        await ctx.agent.run()

    register_echo(reg)

    return reg


async def entries(rt: Runtime, url: str) -> list[Any]:
    return [r async for r in rt.events(url)]


async def readable(rt: Runtime, url: str) -> list[Any]:
    """Every entry of the log, asserting that each one decodes."""
    records = await entries(rt, url)
    assert not [r for r in records if isinstance(r, UndecodableRecord)], records
    return [r.event for r in records if isinstance(r, LogRecord)]


# -- item 3: nothing undecodable is appended -----------------------------------------------


def test_the_encoder_refuses_an_event_that_would_not_decode() -> None:
    for event, field in [
        (CancelRequested(reason=12345), "reason"),  # type: ignore[arg-type]
        (CancelRequested(reason={"x": 1}), "reason"),  # type: ignore[arg-type]
        (Message(payload="hi", identity={"user": 1}), "identity"),  # type: ignore[dict-item]
        (Message(payload="hi", idempotency_key=7), "idempotency_key"),  # type: ignore[arg-type]
        (ActionSettled(tool_call_id="c", decision="maybe"), "decision"),  # type: ignore[arg-type]
    ]:
        with pytest.raises(InvalidEventError) as raised:
            encode_event(event, what="the test's event")
        assert raised.value.field.startswith(field)
        assert f"field {raised.value.field!r}" in str(raised.value)
        assert str(raised.value).startswith("the test's event: ")
    # Free-form fields take any msgpack value, and such an event reads back.
    assert encode_event(Message(payload={"a": [1, 2.5, None]}, client_data={"k": {1: 2}}))


async def test_the_client_refuses_hostile_values_and_writes_nothing(cluster: Any) -> None:
    executions: list[str] = []
    rt = await cluster.runtime(registry(executions))
    await rt.send("/echo/e", "hello")
    await rt.wait_idle("/echo/e")
    before = await entries(rt, "/echo/e")
    hostile = [
        lambda: rt.cancel("/echo/e", reason=12345),  # type: ignore[arg-type]
        lambda: rt.cancel("/echo/e", reason={"x": 1}),  # type: ignore[arg-type]
        lambda: rt.send("/echo/e", "x", identity={"user": 1}),  # type: ignore[dict-item]
        lambda: rt.send("/echo/e", "x", identity="alice"),  # type: ignore[arg-type]
        lambda: rt.send("/echo/e", "x", idempotency_key=5),  # type: ignore[arg-type]
        lambda: rt.create("echo", "e", initial_message="x", parent=5),  # type: ignore[arg-type]
        lambda: rt.create("echo", "e", initial_message="x", identity={"a": []}),  # type: ignore[dict-item]
    ]
    for call in hostile:
        with pytest.raises(InvalidEventError):
            await call()
    assert await entries(rt, "/echo/e") == before
    # Answers to a pending action: a reason or an error must be text.
    await rt.send(URL, "clean up", identity=ME)
    await rt.wait_idle(URL)
    for answer in (
        lambda: rt.deny(URL, "d1", 404, identity=ME),  # type: ignore[arg-type]
        lambda: rt.deny(URL, "d1", ["no"], identity=ME),  # type: ignore[arg-type]
    ):
        with pytest.raises(InvalidEventError, match="field 'error'"):
            await answer()
    assert [a.tool_call_id for a in await rt.pending_actions(URL)] == ["d1"]
    assert not [e for e in await readable(rt, URL) if isinstance(e, ActionSettled)]
    # The entity still works: nothing unreadable was appended.
    await rt.send("/echo/e", "again")
    assert (await rt.wait_idle("/echo/e")).status == "idle"
    await readable(rt, "/echo/e")


async def test_the_gateway_answers_400_to_hostile_values_and_writes_nothing(cluster: Any) -> None:
    executions: list[str] = []
    rt = await cluster.runtime(registry(executions))
    async with http_for(rt) as http:
        assert (await http.post("/entities/echo/e/messages", json={"payload": "hi"})).is_success
        await rt.wait_idle("/echo/e")
        for reason in (12345, {"x": 1}, ["a"], True, 1.5):
            before = await entries(rt, "/echo/e")
            answer = await http.post("/entities/echo/e/cancel", json={"reason": reason})
            assert answer.status_code == 400, answer.text
            error = answer.json()["error"]
            assert error["type"] == "InvalidEventError"
            assert "field 'reason'" in error["message"] and "/echo/e" in error["message"]
            assert await entries(rt, "/echo/e") == before
        # Every other write takes hostile JSON values without writing anything unreadable.
        await http.post("/entities/page/p/messages", json={"payload": "go"})
        await rt.wait_idle(URL)
        hostile: Any = {"x": [1, {"y": None}], "n": 10**30 // 10**12, "f": 1.5, "b": True}
        writes = [
            ("/entities/echo/e/messages", {"payload": hostile, "client_data": hostile}),
            ("/entities/echo/e2", {"args": hostile, "message": hostile, "client_data": hostile}),
            ("/entities/echo/e/messages", {"payload": 1, "client_tools": hostile}),
            ("/entities/page/p/actions/d1/deny", {"reason": hostile}),
            ("/entities/page/p/actions/d1/approve", {"edited_input": hostile}),
            ("/entities/page/p/actions/d1/fail", {"error": hostile}),
            ("/entities/page/p/actions/d1/submit", {"output": hostile}),
            ("/entities/echo/e/cancel", {"reason": "".join(["x"] * 3)}),
        ]
        for path, body in writes:
            answer = await http.post(path, json=body)
            assert answer.status_code < 500, (path, answer.text)
        for url in ("/echo/e", "/echo/e2", URL):
            status = await rt.wait_idle(url)
            assert status.status != "failed", status
            await readable(rt, url)


async def test_a_reason_or_an_error_that_is_not_text_is_a_400_for_every_answer(
    cluster: Any,
) -> None:
    """``deny``, ``skip`` and ``fail`` refuse a non-string ``reason`` / ``error`` as
    ``cancel`` does, naming the field, and write nothing; null is no reason."""
    executions: list[str] = []
    rt = await cluster.runtime(registry(executions))
    async with http_for(rt) as http:
        await http.post("/entities/page/p/messages", json={"payload": "go"})
        await rt.wait_idle(URL)
        for verb, field in (("deny", "reason"), ("skip", "reason"), ("fail", "error")):
            for value in (123, {"x": 1}, ["a"], True, 1.5):
                answer = await http.post(f"/entities/page/p/actions/d1/{verb}", json={field: value})
                assert answer.status_code == 400, (verb, value, answer.text)
                error = answer.json()["error"]
                assert error["type"] == "InvalidEventError"
                assert f"field {field!r}" in error["message"] and URL in error["message"]
        assert [a.tool_call_id for a in await rt.pending_actions(URL)] == ["d1"]
        assert not [e for e in await readable(rt, URL) if isinstance(e, ActionSettled)]
        denied = await http.post("/entities/page/p/actions/d1/deny", json={"reason": None})
        assert denied.status_code == 200, denied.text
    [settled] = [e for e in await readable(rt, URL) if isinstance(e, ActionSettled)]
    assert (settled.decision, settled.error) == ("denied", "denied")  # not "None"
    assert executions == []


# -- item 7: cancelling a suspended run settles its actions --------------------------------


async def test_cancelling_a_suspended_run_settles_its_approval(cluster: Any) -> None:
    executions: list[str] = []
    rt = await cluster.runtime(registry(executions))
    await rt.send(URL, "clean up", identity=ME)
    assert (await rt.wait_idle(URL)).pending_actions == 1
    await rt.cancel(URL, reason="changed my mind")
    status = await rt.wait_idle(URL)
    assert (status.status, status.pending_actions) == ("idle", 0)
    assert await rt.pending_actions(URL) == []
    assert await rt.store.action_state(URL, "d1") == "cancelled"
    [finished] = [e for e in await readable(rt, URL) if isinstance(e, RunFinished)]
    assert (finished.status, finished.error) == ("cancelled", "changed my mind")
    for answer in (
        lambda: rt.approve(URL, "d1", identity=ME),
        lambda: rt.deny(URL, "d1", "no", identity=ME),
        lambda: rt.cancel_action(URL, "d1", identity=ME),
    ):
        with pytest.raises(ActionNotPendingError, match="the run was cancelled"):
            await answer()
    assert not [e for e in await readable(rt, URL) if isinstance(e, ActionSettled)]
    assert executions == []
    # The entity takes a new run, which waits for its own approval and runs once approved.
    await rt.send(URL, "clean up again", identity=ME)
    assert (await rt.wait_idle(URL)).status == "suspended"
    [again] = await rt.pending_actions(URL)
    assert again.run_id != finished.run_id
    await rt.approve(URL, again.tool_call_id, identity=ME)
    assert (await rt.wait_idle(URL)).status == "idle"
    assert executions == ["/a"]


async def test_a_cancelled_runs_approval_is_refused_over_http_with_409(cluster: Any) -> None:
    executions: list[str] = []
    rt = await cluster.runtime(registry(executions))
    async with http_for(rt) as http:
        await http.post("/entities/page/p/messages", json={"payload": "go"})
        await rt.wait_idle(URL)
        assert [a["tool_call_id"] for a in (await http.get("/entities/page/p/actions")).json()] == [
            "d1"
        ]
        assert (await http.post("/entities/page/p/cancel", json={})).status_code == 202
        await rt.wait_idle(URL)
        assert (await http.get("/entities/page/p/actions")).json() == []
        late = await http.post("/entities/page/p/actions/d1/approve", json={})
        assert late.status_code == 409
        assert late.json()["error"]["type"] == "ActionNotPendingError"
        assert "the run was cancelled" in late.json()["error"]["message"]
    assert executions == []


# -- item 8: one status word ---------------------------------------------------------------


async def test_a_suspended_run_is_suspended_in_the_status_and_over_http(cluster: Any) -> None:
    executions: list[str] = []
    rt = await cluster.runtime(registry(executions))
    await rt.send(URL, "clean up", identity=ME)
    status = await rt.wait_idle(URL)
    assert status.status == "suspended" and status.at_rest and not status.idle
    full = await rt.status(URL, runs=True)
    assert full.run is not None and full.last_run is None
    assert (full.run.status, full.run.id) == (
        "suspended",
        (await rt.pending_actions(URL))[0].run_id,
    )
    assert full.run.at_ms > 0
    async with http_for(rt) as http:
        body = (await http.get("/entities/page/p")).json()
        assert body["status"] == "suspended"
        assert body["run"] == dataclasses.asdict(full.run)
    await rt.approve(URL, "d1", identity=ME)
    status = await rt.wait_idle(URL)
    assert status.status == "idle"
    done = await rt.status(URL, runs=True)
    assert done.run is None and done.last_run is not None
    assert (done.last_run.id, done.last_run.status) == (full.run.id, "completed")
    assert done.last_run.at_ms >= full.run.at_ms
    json.dumps(dataclasses.asdict(done))  # plain data, as HTTP and `inspect --json` show it
