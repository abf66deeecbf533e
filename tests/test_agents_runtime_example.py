"""The agents-runtime example, transcribed to Python, runs as written (issue 14, item 16).

A coordinator wires ``tools=[*ctx.runtime_tools, memory_tool, dispatch_tool,
calculator_tool]``, its own tools named ``memory_store``, ``dispatch`` and
``calculator``: none of them clashes with a runtime tool. What it remembers persists
across wakes, and the child it dispatches answers in the coordinator's later wake."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest

from tests.agent_apps import use
from wakeful import (
    AgentTool,
    Collection,
    HandlerContext,
    Registry,
    RunFinished,
    ScriptedModel,
    ToolResult,
    Wake,
)
from wakeful.actions import RESERVED_NAMES
from wakeful.events import ToolOutcome, UserTurn
from wakeful.models import ModelRequest, ModelResponse
from wakeful.runtime_tools import Dispatch
from wakeful.tools.calculator import calculator as calculator_tool

pytestmark = pytest.mark.anyio

COORDINATOR = "/coordinator/c1"
POEM = "An old silent pond / a frog jumps in / splash"


class Fact(msgspec.Struct):
    key: str
    value: str


class MemoryArgs(msgspec.Struct):
    key: str
    value: str | None = None  # set when given, else get


def coordinator_model(request: ModelRequest) -> ModelResponse | str:
    """Wake 1: remember, calculate, dispatch, say it is on it. Wake 2 (the child's
    answer): recall the fact, then answer with both."""
    last = request.messages[-1]["content"]
    results = {b["tool_use_id"]: b for b in last if b.get("type") == "tool_result"}
    notes = " ".join(b.get("text", "") for b in last if b.get("type") == "text")
    if "d1" in results:
        return "Working on it."
    if "m2" in results:
        city = results["m2"]["content"][0]["text"]
        return f"For {city}: {POEM}"
    if POEM in notes:
        return ModelResponse(
            content=[use("m2", "memory_store", key="city")], stop_reason="tool_use"
        )
    calls = [
        use("m1", "memory_store", key="city", value="Oslo"),
        use("c1", "calculator", expression="6 * 7"),
        use("d1", "dispatch", agent="poet", task="Write a haiku about a pond."),
    ]
    return ModelResponse(content=calls, stop_reason="tool_use")


def example_app(model: ScriptedModel) -> Registry:
    registry = Registry()

    @registry.entity("coordinator", state={"memory": Collection(row=Fact)})
    async def coordinator(ctx: HandlerContext) -> None:
        async def memory_store(call_id: str, p: MemoryArgs, signal: Any, on_update: Any) -> str:
            memory = ctx.db.collections["memory"]
            if p.value is None:
                fact = memory.get(p.key)
                return fact.value if fact is not None else "(nothing stored)"
            if memory.get(p.key) is None:
                ctx.db.actions.memory_insert(row=Fact(p.key, p.value))
            return f"Stored {p.key}."

        async def dispatch(call_id: str, p: Dispatch, signal: Any, on_update: Any) -> ToolResult:
            child = await ctx.spawn(
                p.agent,
                ctx.derive_id(p.agent),
                initial_message=p.task,
                wake=Wake.run_finished(include_response=True),
            )
            return ToolResult(f"Dispatched to {child.entity_url}.", {"child": child.entity_url})

        memory_tool = AgentTool("memory_store", "Store or recall a fact.", MemoryArgs, memory_store)
        dispatch_tool = AgentTool("dispatch", "Hand a task to a child agent.", Dispatch, dispatch)
        ctx.use_agent(
            system_prompt="You coordinate.",
            model=model,
            tools=[*ctx.runtime_tools, memory_tool, dispatch_tool, calculator_tool],
        )
        await ctx.agent.run()

    @registry.entity("poet")
    async def poet(ctx: HandlerContext) -> None:
        for _ in ctx.wake.messages:
            ctx.reply(POEM)

    return registry


async def test_the_agents_runtime_example_runs_as_written(cluster):
    model = ScriptedModel(coordinator_model)
    rt = await cluster.runtime(example_app(model))
    # ask waits for the children too: the answer is the coordinator's second run
    answer = await rt.ask(COORDINATOR, "Remember I live in Oslo; 6 * 7? And a haiku.")
    assert answer == f"For Oslo: {POEM}"  # remembered in wake 1, recalled in wake 2
    runs = [r.event async for r in rt.events(COORDINATOR) if isinstance(r.event, RunFinished)]
    assert [(r.status, r.response) for r in runs] == [
        ("completed", "Working on it."),
        ("completed", answer),
    ]
    turns = [e for e in await rt.history(COORDINATOR) if isinstance(e, UserTurn)]
    assert len(turns) == 2 and POEM in turns[1].content[0]["text"]  # the child's answer
    offered = [t["name"] for t in model.requests[0].tools]
    runtime_names = sorted(RESERVED_NAMES)  # the runtime's own tools, then the example's
    assert sorted(offered) == sorted([*runtime_names, "memory_store", "dispatch", "calculator"])
    assert "dispatch" not in runtime_names
    outcomes = {
        o.tool_call_id: o for o in await rt.history(COORDINATOR) if isinstance(o, ToolOutcome)
    }
    assert outcomes["c1"].content[0]["text"] == "6 * 7 = 42"
    [child] = await rt.list("poet")
    assert outcomes["d1"].details == {"child": child}  # the user's dispatch ran, not a runtime tool
    assert (await rt.state(COORDINATOR))["memory"] == [{"key": "city", "value": "Oslo"}]


async def test_a_call_journaled_under_the_old_runtime_tool_name_still_runs(cluster):
    """Logs written before the rename hold calls to the runtime's ``dispatch``. The first
    worker plays the old runtime: its ``dispatch`` (no id, like every call of an old log)
    is stopped mid-call. Resumed with today's runtime tools, the call in doubt finds
    ``spawn_agent`` and runs again with the same id."""
    started = asyncio.Event()
    old_runtime = {"on": True}
    model = ScriptedModel(
        [ScriptedModel.tool_calls(("dispatch", {"agent": "poet", "task": "A haiku."})), "Sent."]
    )
    registry = Registry()

    async def old_dispatch(call_id: str, p: Dispatch, signal: Any, on_update: Any) -> str:
        started.set()
        await asyncio.Event().wait()  # until the worker stops
        raise AssertionError("never finishes")

    @registry.entity("boss")
    async def boss(ctx: HandlerContext) -> None:
        if old_runtime["on"]:
            tools = [AgentTool("dispatch", "Hand a task to a child.", Dispatch, old_dispatch)]
        else:
            tools = ctx.runtime_tools
        ctx.use_agent(system_prompt=".", model=model, tools=tools)
        await ctx.agent.run()

    @registry.entity("poet")
    async def poet(ctx: HandlerContext) -> None:
        for _ in ctx.wake.messages:
            ctx.reply(POEM)

    first = await cluster.runtime(registry, shutdown_grace_s=0)
    await first.send("/boss/b1", "delegate")
    await asyncio.wait_for(started.wait(), 15)
    await first.close()
    cluster.runtimes.remove(first)
    old_runtime["on"] = False
    rt = await cluster.runtime(registry)
    assert (await rt.wait_idle("/boss/b1", timeout=20)).status == "idle"
    [child] = await rt.list("poet")
    [outcome] = [o for o in await rt.history("/boss/b1") if isinstance(o, ToolOutcome)]
    assert (outcome.name, outcome.is_error) == ("dispatch", False)
    assert outcome.details == {"child": child}
    assert outcome.tool_id == "wakeful.runtime.spawn_agent/v1"
