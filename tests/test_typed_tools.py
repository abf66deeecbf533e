"""The ready-made tools as typed contracts (tools/typed.py), end to end, and the CLI manifest."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from tests.agent_apps import step, use
from tests.apps.harness import until
from wakeful import HandlerContext, Registry, ScriptedModel, define_agent
from wakeful.events import ToolOutcome
from wakeful.models import ModelResponse
from wakeful.tools.memory import MEMORY_COLLECTION
from wakeful.tools.typed import typed_tools

pytestmark = pytest.mark.anyio


async def test_the_typed_ready_made_tools_work_end_to_end(cluster):
    model = ScriptedModel(
        [
            step(
                use("m1", "memory", action="set", key="color", value="blue"),
                use("c1", "calculator", expression="2 + 3 * 4"),
                use("c2", "calculator", expression="__import__('os')"),
                use("s1", "send_message", url="/sink/s", text="hello"),
                use("t1", "schedule_message", url="/sink/s", text="later", delay_seconds=0.1),
                use("d1", "dispatch", agent="helper", task="help me"),
            ),
            step(
                use("m2", "memory", action="get", key="color"), use("m3", "memory", action="list")
            ),
            "done",
            "noted",  # the run the child's result wakes
        ]
    )
    received: list[Any] = []
    ids: dict[str, str] = {}
    reg = Registry()

    @reg.entity("bot", state={"kv": MEMORY_COLLECTION})
    async def bot(ctx: HandlerContext) -> None:
        tools = typed_tools(ctx)
        ids.update({key: t.id for key, t in tools.items()})
        ctx.use_agent(define_agent(name="typed", instructions=".", model=model, tools=tools))
        await ctx.agent.run()

    @reg.entity("sink")
    async def sink(ctx: HandlerContext) -> None:
        received.extend(m.payload for m in ctx.wake.messages)

    @reg.entity("helper")
    async def helper(ctx: HandlerContext) -> None:
        ctx.reply("helped")

    rt = await cluster.runtime(reg)
    # ask waits for the awaited child too: the last run is the one its result woke
    assert await rt.ask("/bot/b", "go") == "noted"
    assert ids["memory"] == "wakeful.memory/v1" and ids["dispatch"] == "wakeful.dispatch/v1"

    async def settled() -> bool:  # the durable timer (0.1 s) may fire late on a busy machine
        return "later" in received and len(model.requests) >= 4

    await until(settled, 30, "the scheduled message and the run the child's result wakes")
    await rt.wait_idle("/bot/b")
    done = {e.tool_call_id: e for e in await rt.history("/bot/b") if isinstance(e, ToolOutcome)}
    assert done["m1"].details == {"output": {"action": "set", "key": "color"}}
    assert done["c1"].details["output"]["result"] == 14
    assert done["c1"].content[0]["text"] == "2 + 3 * 4 = 14"
    assert done["c2"].is_error and not done["c2"].details.get("output")
    assert done["s1"].details == {"output": {"url": "/sink/s", "after_seconds": None}}
    child = done["d1"].details["output"]["child"]
    assert child.startswith("/helper/helper-")
    assert done["m2"].details["output"] == {
        "action": "get",
        "key": "color",
        "found": True,
        "value": "blue",
    }
    assert done["m3"].details["output"]["keys"] == ["color"]
    assert (await rt.state("/bot/b"))["kv"] == [{"key": "color", "value": "blue"}]
    assert received == ["hello", "later"]
    assert "[" + child + " finished its run]\nhelped" in json.dumps(
        model.requests[3].messages[-1]
    ).replace("\\n", "\n")


def test_the_cli_prints_the_manifest_with_types_and_agents():
    out = subprocess.run(
        [sys.executable, "-m", "wakeful.cli", "manifest", "wakeful.entities:registry"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    manifest = json.loads(out)
    assert {"types", "agents"} <= set(manifest)
    assert {t["name"] for t in manifest["types"]} >= {"assistant"}
    assert isinstance(manifest["agents"], list)


async def test_schedule_tools_list_and_cancel_pending_messages(cluster):
    def respond(request: Any) -> ModelResponse | str:
        steps = sum(1 for m in request.messages if m["role"] == "assistant")
        if steps == 0:
            return step(
                use("t1", "schedule_message", url="/bot/b", text="in a minute", delay_seconds=60),
                use("t2", "schedule_message", url="/bot/b", text="in two", delay_seconds=120),
            )
        if steps == 1:
            return step(use("l1", "list_schedules"))
        if steps == 2:
            listed = json.loads(request.messages[-1]["content"][0]["content"][0]["text"])
            first = listed["schedules"][0]["id"]
            return step(
                use("x1", "cancel_schedule", id=first), use("x2", "cancel_schedule", id=first)
            )
        return "done"

    reg = Registry()

    @reg.entity("bot", state={"kv": MEMORY_COLLECTION})
    async def bot(ctx: HandlerContext) -> None:
        agent = define_agent(
            name="s", instructions=".", model=ScriptedModel(respond), tools=typed_tools(ctx)
        )
        ctx.use_agent(agent)
        await ctx.agent.run()

    rt = await cluster.runtime(reg)
    await rt.send("/bot/b", "plan")

    async def outcomes() -> dict[str, ToolOutcome] | None:  # not wait_idle: a timer remains
        done = {e.tool_call_id: e for e in await rt.history("/bot/b") if isinstance(e, ToolOutcome)}
        return done if "x2" in done else None

    done = await until(outcomes, 30, "the outcome of the last cancel_schedule call (x2)")
    schedules = done["l1"].details["output"]["schedules"]
    assert [(s["url"], s["text"]) for s in schedules] == [
        ("/bot/b", "in a minute"),
        ("/bot/b", "in two"),
    ]
    assert 0 < schedules[0]["due_in_seconds"] <= 60
    assert done["x1"].details == {"output": {"id": schedules[0]["id"], "cancelled": True}}
    assert done["x2"].is_error and "No pending schedule" in done["x2"].content[0]["text"]
    assert (await rt.status("/bot/b")).timers == 1
