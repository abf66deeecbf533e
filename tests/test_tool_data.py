"""Tool data (issue 14, item 8): durable public per-call state that renderers read, written
by the tool during ``execute`` and by a client for a pending call, with ``enabled``
rechecked on every client write."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import msgspec
import pytest

from tests.test_actions import (
    U1,
    U2,
    URL,
    app,
    get_selected,
    log,
    of_type,
    outcome,
    settled_run,
    suspended,
    use,
)
from wakeful import Registration, ToolContext, tool
from wakeful.actions import ActionNotAuthorizedError, ActionNotPendingError
from wakeful.agent import RunResult
from wakeful.errors import ToolDisabledError
from wakeful.events import ActionSettled, ToolData, ToolOutcome
from wakeful.gateway import bearer_tokens, create_app
from wakeful.live import LiveRecord

pytestmark = pytest.mark.anyio


class Job(msgspec.Struct):
    name: str


class Done(msgspec.Struct):
    ok: bool


@tool(id="acme.job/v1", description="Run a job", input=Job, output=Done)
async def job(ctx: ToolContext[Job, None]) -> Done:
    ctx.set_data({"stage": "started", "job": ctx.input.name})
    ctx.set_data({"stage": "finished", "job": ctx.input.name})
    return Done(True)


def gateway_client(rt: Any) -> httpx.AsyncClient:
    gateway = create_app(rt, authenticate=bearer_tokens({"t1": U1}))
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(gateway),
        base_url="http://gw",
        headers={"Authorization": "Bearer t1"},
    )


async def test_a_tool_writes_its_call_data_during_execute_durably_and_visibly(cluster: Any) -> None:
    runs: list[RunResult] = []
    rt = await cluster.runtime(app({"job": job}, [use("j1", "job", {"name": "build"})], runs))
    await rt.send(URL, "go", identity=U1)
    finished = await settled_run(rt)
    assert finished.status == "completed"
    events = await log(rt)
    writes = [e for e in events if isinstance(e, ToolData)]
    assert [(w.tool_call_id, w.data["stage"], w.by) for w in writes] == [
        ("j1", "started", None),
        ("j1", "finished", None),
    ]
    # Committed with the call's result, before it.
    kinds = [type(e) for e in events]
    assert kinds.index(ToolData) < kinds.index(ToolOutcome)
    assert await rt.tool_data(URL) == {"j1": {"stage": "finished", "job": "build"}}
    async with gateway_client(rt) as http:
        stream = await http.get("/entities/page/p/events?follow=0")
    assert "event: tool_data" in stream.text and '"finished"' in stream.text


async def test_followers_see_a_tools_data_live_while_it_runs(cluster: Any) -> None:
    release = asyncio.Event()

    @tool(id="acme.slow/v1", description=".", input=Job, output=Done)
    async def slow(ctx: ToolContext[Job, None]) -> Done:
        ctx.set_data({"stage": "waiting"})
        await release.wait()  # runs until the test has seen the live tool data
        return Done(True)

    runs: list[RunResult] = []
    rt = await cluster.runtime(app({"slow": slow}, [use("s1", "slow", {"name": "x"})], runs))
    live_after = await rt.live_position(URL)
    await rt.send(URL, "go", identity=U1)
    async with asyncio.timeout(30):  # a guard: the loop ends on the live event
        async for record in rt.events(URL, live=True, live_after=live_after):
            if isinstance(record, LiveRecord) and record.event.kind == "tool_data":
                assert (record.event.tool_call_id, record.event.data) == (
                    "s1",
                    {"stage": "waiting"},
                )
                break
            assert not isinstance(getattr(record, "event", None), ToolOutcome)
    release.set()
    assert (await settled_run(rt)).status == "completed"
    assert await rt.tool_data(URL) == {"s1": {"stage": "waiting"}}


async def test_a_client_writes_the_data_of_a_pending_call_without_answering_it(
    cluster: Any,
) -> None:
    runs: list[RunResult] = []
    rt = await cluster.runtime(app({"t": get_selected}, [use("c1", "t", {})], runs))
    await rt.send(URL, "go", identity=U1)
    await suspended(rt)
    await rt.set_tool_data(URL, "c1", {"draft": "half a selection"}, identity=U1)
    with pytest.raises(ActionNotAuthorizedError):
        await rt.set_tool_data(URL, "c1", {"draft": "not mine"}, identity=U2)
    async with gateway_client(rt) as http:
        written = await http.post("/entities/page/p/actions/c1/data", json={"data": {"n": 2}})
        missing = await http.post("/entities/page/p/actions/c1/data", json={})
    assert written.status_code == 200, written.text
    assert missing.status_code == 400
    await suspended(rt)  # the call still waits: tool data answers nothing
    assert not await of_type(rt, ActionSettled)
    writes = await of_type(rt, ToolData)
    assert [(w.data, w.by) for w in writes] == [({"draft": "half a selection"}, U1), ({"n": 2}, U1)]
    assert await rt.tool_data(URL) == {"c1": {"n": 2}}
    await rt.submit_tool_result(URL, "c1", {"text": "all of it"}, identity=U1)
    assert (await settled_run(rt)).status == "completed"
    assert not (await outcome(rt, "c1")).is_error
    with pytest.raises(ActionNotPendingError):
        await rt.set_tool_data(URL, "c1", {"late": True}, identity=U1)


async def test_enabled_is_rechecked_on_every_client_write(cluster: Any) -> None:
    enabled = {"on": True}
    runs: list[RunResult] = []
    tools = {"t": Registration(get_selected, enabled=lambda _info: enabled["on"])}
    rt = await cluster.runtime(app(tools, [use("c1", "t", {})], runs, register=True))
    await rt.send(URL, "go", identity=U1)
    await suspended(rt)
    await rt.set_tool_data(URL, "c1", {"n": 1}, identity=U1)
    enabled["on"] = False
    with pytest.raises(ToolDisabledError):
        await rt.set_tool_data(URL, "c1", {"n": 2}, identity=U1)
    async with gateway_client(rt) as http:
        refused = await http.post("/entities/page/p/actions/c1/data", json={"data": {"n": 3}})
    assert refused.status_code == 409
    enabled["on"] = True
    await rt.set_tool_data(URL, "c1", {"n": 4}, identity=U1)
    assert [w.data["n"] for w in await of_type(rt, ToolData)] == [1, 4]
