"""A zombie does not pay for model calls: the lease is checked before each one.

A worker paused past its lease (a frozen VM, SIGSTOP) wakes up with no timer fired
yet: its wake must see that the lease's local deadline passed right before it asks
the model for a step or runs a tool, and stop there (nothing committed; the next
owner resumes the run from its journal).
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
import pytest

from tests.apps.harness import until
from wakeful import AgentTool, AssistantStep, HandlerContext, Registry, ScriptedModel, ToolResult
from wakeful.models import ModelRequest, ModelResponse

pytestmark = pytest.mark.anyio

URL = "/bot/z"


class Note(msgspec.Struct):
    text: str


@pytest.mark.parametrize("lapse_before", ["model", "tool"])
async def test_a_lapsed_lease_stops_the_wake_before_a_model_call_or_a_tool(cluster, lapse_before):
    rt: Any = None
    calls_while_lapsed: list[str] = []
    model_calls: list[int] = []
    tool_calls: list[str] = []
    armed: list[bool] = []  # the next commit point (of the kind below) lets the lease lapse
    lapsed_at: list[int] = []

    def lapsed() -> bool:
        return rt.worker.lease_keeper.token(rt.store.keys.partition(URL)) is None

    def respond(request: ModelRequest) -> ModelResponse:
        model_calls.append(len(model_calls))
        if lapsed():
            calls_while_lapsed.append("model")
        if not any(m["role"] == "assistant" for m in request.messages):
            if lapse_before == "tool":
                armed.append(True)  # after the commit of the step with its intent
            call = {"type": "tool_use", "id": "n1", "name": "note", "input": {"text": "hi"}}
            return ModelResponse(content=[call], stop_reason="tool_use")
        return ModelResponse(content=[{"type": "text", "text": "done"}], stop_reason="end_turn")

    model = ScriptedModel(respond)
    reg = Registry()

    @reg.entity("bot")
    async def bot(ctx: HandlerContext) -> None:
        async def note(call_id: str, p: Note, signal: Any, on_update: Any) -> ToolResult:
            tool_calls.append(call_id)
            if lapsed():
                calls_while_lapsed.append("tool")
            if lapse_before == "model":
                armed.append(True)  # after this call's result is committed
            return ToolResult("noted")

        ctx.use_agent("You note.", model=model, tools=[AgentTool("note", "Notes.", Note, note)])
        await ctx.agent.run()

    # A short lease: the test lets it lapse, and the run resumes once it is taken again
    # (a lease renewed in time would leave the stopped wake to the pending sweep).
    rt = await cluster.runtime(reg, lease_ttl_ms=1000)
    worker = rt.worker
    renewals = asyncio.Event()  # renewals wait: the process is "paused", no timer fires
    renewals.set()
    renew = rt.store.renew

    async def paused_renew(*args: Any) -> bool:
        await renewals.wait()
        return await renew(*args)

    rt.store.renew = paused_renew
    commit = rt.store.commit
    commits_after_lapse: list[str] = []

    async def counted_commit(url: str, *args: Any, **kwargs: Any) -> list[str]:
        if lapsed_at and not renewals.is_set():
            commits_after_lapse.append(url)
        return await commit(url, *args, **kwargs)

    rt.store.commit = counted_commit

    def fault(point: str) -> None:
        if point == "flush:after-commit" and armed:
            armed.pop()
            if not armed:
                renewals.clear()
                worker.leases[rt.store.keys.partition(URL)].valid_until = 0.0
                lapsed_at.append(1)

    worker.fault_hook = fault
    await rt.send(URL, "note something")
    await until(lambda: _true(bool(lapsed_at)), 10, "the lease to lapse")
    await until(lambda: _true(not worker.runners.running(URL)), 10, "the wake to stop")
    log_after_lapse = await rt.store.read_log(URL)

    assert calls_while_lapsed == [] and commits_after_lapse == []
    assert model_calls == [0]  # the second step was not asked for
    assert tool_calls == (["n1"] if lapse_before == "model" else [])
    steps = [e for e in await rt.history(URL) if isinstance(e, AssistantStep)]
    assert len(steps) == 1

    renewals.set()  # the process goes on: the lease is renewed or taken over, the run resumes
    status = await rt.wait_idle(URL, timeout=20)
    assert status.status == "idle"
    assert len(await rt.store.read_log(URL)) > len(log_after_lapse)
    assert model_calls == [0, 1] and tool_calls == ["n1"]
    assert calls_while_lapsed == []


async def _true(value: bool) -> bool:
    return value
