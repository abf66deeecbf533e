"""Frontend-defined client tools: a snapshot sent with a message, offered for that run."""

from __future__ import annotations

import re
from typing import Any

import pytest

from wakeful import (
    AgentTool,
    HandlerContext,
    Message,
    Registry,
    RunFailedError,
    RunSuspendedError,
    ScriptedModel,
    ToolResult,
)
from wakeful.actions import ActionValidationError, ClientToolsError
from wakeful.models import ModelResponse

pytestmark = pytest.mark.anyio

LOCATION = {
    "name": "getLocation",
    "description": "Where the user is",
    "input_schema": {"type": "object", "properties": {"precise": {"type": "boolean"}}},
    "output_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


def app(model: ScriptedModel, *, backend_tool: str | None = None) -> Registry:
    reg = Registry()

    async def noop(call_id: str, params: Any, signal: Any, on_update: Any) -> ToolResult:
        return ToolResult("ok")

    @reg.entity("bot")
    async def bot(ctx: HandlerContext) -> None:
        tools = [AgentTool(backend_tool, "", {"type": "object"}, noop)] if backend_tool else []
        ctx.use_agent(system_prompt="", model=model, tools=tools)
        await ctx.agent.run()

    return reg


def asks_location() -> ScriptedModel:
    call = {"type": "tool_use", "id": "g1", "name": "getLocation", "input": {"precise": True}}
    return ScriptedModel(
        [ModelResponse(content=[call], stop_reason="tool_use"), "You are in Oslo."]
    )


@pytest.mark.parametrize(
    ("snapshot", "message"),
    [
        ("nope", "client_tools must be a list"),
        ([42], "client_tools[0] must be an object"),
        ([{"name": "a b", "input_schema": {"type": "object"}}], "name 'a b' must be"),
        (
            [{"name": "spawn_agent", "input_schema": {"type": "object"}}],
            "'spawn_agent' is reserved",
        ),
        ([{"name": "wakeful_x", "input_schema": {"type": "object"}}], "'wakeful_x' is reserved"),
        ([{"name": "x", "input_schema": {"type": 5}}], "input_schema is not a valid JSON Schema"),
        ([{"name": "x", "input_schema": {"type": "string"}}], "must have type 'object'"),
        ([{"name": "x", "input_schema": {"type": "object"}, "extra": 1}], "unknown fields: extra"),
        ([LOCATION, LOCATION], "two client tools are named 'getLocation'"),
    ],
)
async def test_a_bad_snapshot_is_refused_at_send_and_nothing_is_written(cluster, snapshot, message):
    rt = await cluster.runtime(app(asks_location()))
    with pytest.raises(ClientToolsError, match=re.escape(message)):
        await rt.send("/bot/b", "hi", client_tools=snapshot)
    assert not await rt.store.meta("/bot/b")


async def test_client_tools_are_offered_for_the_run_and_answered_by_the_client(cluster):
    model = asks_location()
    rt = await cluster.runtime(app(model))
    await rt.send("/bot/b", "where am I?", client_tools=[LOCATION])
    await rt.wait_idle("/bot/b")
    assert [t["name"] for t in model.requests[0].tools] == ["getLocation"]
    [action] = await rt.pending_actions("/bot/b")
    assert (action.tool, action.kind, action.input) == ("getLocation", "client", {"precise": True})
    with pytest.raises(ActionValidationError, match='"city" is a required property'):
        await rt.submit_tool_result("/bot/b", "g1", {"town": "Oslo"})
    assert len(await rt.pending_actions("/bot/b")) == 1  # still pending
    await rt.submit_tool_result("/bot/b", "g1", {"city": "Oslo"})
    status = await rt.wait_idle("/bot/b")
    assert (status.status, status.pending_actions) == ("idle", 0)
    result = model.requests[1].messages[-1]["content"][0]
    assert result == {
        "type": "tool_result",
        "tool_use_id": "g1",
        "content": [{"type": "text", "text": '{"city": "Oslo"}'}],
    }
    messages = [r.event async for r in rt.events("/bot/b") if isinstance(r.event, Message)]
    assert messages[0].client_tools == [LOCATION]


async def test_a_client_tool_colliding_with_a_backend_tool_fails_the_run(cluster):
    model = asks_location()
    rt = await cluster.runtime(app(model, backend_tool="getLocation"))
    with pytest.raises(RunFailedError, match="collides with a backend tool"):
        await rt.ask("/bot/b", "where am I?", client_tools=[LOCATION], timeout=10)
    assert model.requests == []  # no model call saw the clash


async def test_ask_says_when_the_run_is_suspended(cluster):
    rt = await cluster.runtime(app(asks_location()))
    with pytest.raises(RunSuspendedError, match="waiting for actions on tool calls g1"):
        await rt.ask("/bot/b", "where am I?", client_tools=[LOCATION], timeout=10)
